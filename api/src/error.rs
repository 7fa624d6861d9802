//! The gateway's one error type and its `application/problem+json` form (RFC 9457).
//!
//! Every failure, extractor rejections included, becomes an [`ApiError`]; the
//! match from error to status is exhaustive, and a 5xx's cause is logged once
//! and never shown to the client.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use skyport_core::error::Throttled;
use skyport_core::ports::{PublishError, StatusStoreError};
use skyport_core::request::FieldError;
pub use skyport_runtime::problem::{PROBLEM_JSON, Problem};

use crate::request_id;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("the body is not valid JSON: {0}")]
    MalformedJson(String),
    #[error("{0}")]
    BadRequest(String),
    #[error("the body is larger than {limit} bytes")]
    PayloadTooLarge { limit: usize },
    #[error("the body must be application/json, not {0}")]
    UnsupportedMediaType(String),
    /// A `Content-Encoding` the gateway cannot decode.
    #[error("the body's Content-Encoding {0:?} is not one of {ACCEPTED_ENCODINGS}")]
    UnsupportedEncoding(String),
    /// The body did not arrive whole in time; the connection is closed.
    #[error("the body did not arrive within {timeout_ms} ms")]
    BodyTimeout { timeout_ms: u128 },
    #[error("the request has invalid fields")]
    Validation(Vec<FieldError>),
    /// Missing or invalid credentials; `challenge` is the `WWW-Authenticate` value.
    #[error("{detail}")]
    Unauthorized {
        detail: String,
        challenge: &'static str,
    },
    /// Valid credentials without the scope the request needs.
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    /// `If-Match` named a version that is not the current one.
    #[error("{0}")]
    PreconditionFailed(String),
    /// The client is over its quota (`gateway.quotas`).
    #[error("{detail}")]
    TooManyRequests {
        retry_after_s: u32,
        /// `RateLimit-Policy` and `RateLimit`.
        headers: Box<[(axum::http::HeaderName, HeaderValue); 2]>,
        detail: String,
    },
    /// The resource existed and was removed (its retention passed).
    #[error("{0}")]
    Gone(String),
    #[error("this method is not allowed here")]
    MethodNotAllowed,
    /// The request could not be made durable now; the client should retry.
    #[error("the service cannot take requests right now")]
    Unavailable {
        retry_after_s: u32,
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// The stream did not say whether it stored the request: it may run.
    /// The client learns its fate by retrying it unchanged.
    #[error(
        "the stream did not confirm whether it stored the request; it may still run. Retry it unchanged (the same deliveryId or Idempotency-Key) to learn its fate"
    )]
    PublishUnknown {
        retry_after_s: u32,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Too many requests are in flight; this one was refused without waiting.
    #[error(
        "the gateway is at its limit of requests in flight; retry after the Retry-After seconds"
    )]
    Overloaded { retry_after_s: u32 },
    #[error("an internal error occurred")]
    Internal(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// A handler panicked (the request middleware caught it; the
    /// panic hook has logged it within the request's span).
    #[error("an internal error occurred while answering request {request_id}")]
    Panicked { request_id: String },
}

/// The `Content-Encoding`s the gateway decodes, as a 415 lists them in `Accept-Encoding`.
pub const ACCEPTED_ENCODINGS: &str = "gzip, br, zstd, deflate";

impl ApiError {
    fn parts(&self) -> (StatusCode, &'static str, &'static str) {
        match self {
            Self::MalformedJson(_) => (StatusCode::BAD_REQUEST, "Malformed JSON", "MalformedJson"),
            Self::BadRequest(_) => (StatusCode::BAD_REQUEST, "Bad request", "BadRequest"),
            Self::PayloadTooLarge { .. } => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "Payload too large",
                "PayloadTooLarge",
            ),
            Self::UnsupportedMediaType(_) => (
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "Unsupported media type",
                "UnsupportedMediaType",
            ),
            Self::UnsupportedEncoding(_) => (
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "Unsupported content encoding",
                "UnsupportedEncoding",
            ),
            Self::BodyTimeout { .. } => (
                StatusCode::REQUEST_TIMEOUT,
                "Request timeout",
                "RequestTimeout",
            ),
            Self::Validation(_) => (
                StatusCode::UNPROCESSABLE_ENTITY,
                "Validation failed",
                "ValidationFailed",
            ),
            Self::Unauthorized { .. } => (StatusCode::UNAUTHORIZED, "Unauthorized", "Unauthorized"),
            Self::Forbidden(_) => (StatusCode::FORBIDDEN, "Forbidden", "Forbidden"),
            Self::NotFound(_) => (StatusCode::NOT_FOUND, "Not found", "NotFound"),
            Self::Conflict(_) => (StatusCode::CONFLICT, "Conflict", "Conflict"),
            Self::PreconditionFailed(_) => (
                StatusCode::PRECONDITION_FAILED,
                "Precondition failed",
                "PreconditionFailed",
            ),
            Self::TooManyRequests { .. } => (
                StatusCode::TOO_MANY_REQUESTS,
                "Too many requests",
                "QuotaExceeded",
            ),
            Self::Gone(_) => (StatusCode::GONE, "Gone", "Gone"),
            Self::MethodNotAllowed => (
                StatusCode::METHOD_NOT_ALLOWED,
                "Method not allowed",
                "MethodNotAllowed",
            ),
            Self::Unavailable { .. } => (
                StatusCode::SERVICE_UNAVAILABLE,
                "Service unavailable",
                "Unavailable",
            ),
            Self::PublishUnknown { .. } => (
                StatusCode::SERVICE_UNAVAILABLE,
                "Outcome unknown",
                "PublishOutcomeUnknown",
            ),
            Self::Overloaded { .. } => (
                StatusCode::SERVICE_UNAVAILABLE,
                "Service unavailable",
                "Overloaded",
            ),
            Self::Internal(_) | Self::Panicked { .. } => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "Internal error",
                "Internal",
            ),
        }
    }
}

impl ApiError {
    /// The problem document of this error and the `Retry-After` it asks
    /// for, its cause logged (a 5xx's, once, never shown to the client).
    pub fn into_problem(self) -> (Problem, Option<u32>) {
        let (status, title, code) = self.parts();
        self.log();
        let retry_after = match &self {
            Self::Unavailable { retry_after_s, .. }
            | Self::PublishUnknown { retry_after_s, .. }
            | Self::Overloaded { retry_after_s }
            | Self::TooManyRequests { retry_after_s, .. } => Some(*retry_after_s),
            _ => None,
        };
        let errors = match self {
            Self::Validation(ref errors) => errors.clone(),
            _ => Vec::new(),
        };
        let problem = Problem {
            errors,
            ..Problem::new(status, title, code, self.to_string())
        };
        (problem, retry_after)
    }

    fn log(&self) {
        match self {
            Self::Unavailable {
                source: Some(source),
                ..
            } => {
                let request_id = request_id::current_request_id();
                tracing::warn!(request_id, error = %source, "Refused a request: a backend is unavailable.");
            }
            Self::PublishUnknown { source, .. } => {
                let request_id = request_id::current_request_id();
                tracing::warn!(request_id, error = %source, "The stream did not say whether it stored a request; its name stays taken.");
            }
            Self::Internal(source) => {
                let request_id = request_id::current_request_id();
                tracing::error!(request_id, error = %source, "A request failed with an internal error.");
            }
            _ => {}
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let header = match &self {
            Self::Unauthorized { challenge, .. } => Some((
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static(challenge),
            )),
            Self::UnsupportedEncoding(_) => Some((
                header::ACCEPT_ENCODING,
                HeaderValue::from_static(ACCEPTED_ENCODINGS),
            )),
            // The rest of the body may still come: the connection cannot be reused.
            Self::BodyTimeout { .. } => {
                Some((header::CONNECTION, HeaderValue::from_static("close")))
            }
            _ => None,
        };
        let quota = match &self {
            Self::TooManyRequests { headers, .. } => Some(headers.clone()),
            _ => None,
        };
        let (problem, retry_after) = self.into_problem();
        let mut response = problem.respond(retry_after);
        if let Some((name, value)) = header {
            response.headers_mut().insert(name, value);
        }
        if let Some(quota) = quota {
            response.headers_mut().extend(*quota);
        }
        response
    }
}

impl From<StatusStoreError> for ApiError {
    fn from(e: StatusStoreError) -> Self {
        match e {
            StatusStoreError::Unavailable(source) => Self::Unavailable {
                // A budget that is spent says when it has room again.
                retry_after_s: source
                    .downcast_ref::<Throttled>()
                    .map_or(1, Throttled::retry_after_s),
                source: Some(source),
            },
            StatusStoreError::PreconditionFailed | StatusStoreError::Corrupt { .. } => {
                Self::Internal(Box::new(e))
            }
        }
    }
}

impl From<PublishError> for ApiError {
    fn from(e: PublishError) -> Self {
        match e {
            PublishError::Unknown(_) => Self::PublishUnknown {
                retry_after_s: 1,
                source: Box::new(e),
            },
            PublishError::Unavailable(_) | PublishError::Closed => Self::Unavailable {
                retry_after_s: 1,
                source: Some(Box::new(e)),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn retry_after(error: StatusStoreError) -> Option<String> {
        let response = ApiError::from(error).into_response();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        response
            .headers()
            .get(header::RETRY_AFTER)
            .map(|value| value.to_str().unwrap_or_default().to_owned())
    }

    #[test]
    fn a_spent_budget_tells_the_client_when_to_come_back() {
        let throttled = Throttled {
            what: "throughput control group clients".into(),
            retry_after: Duration::from_millis(2_500),
        };
        assert_eq!(
            retry_after(StatusStoreError::Unavailable(Box::new(throttled))).as_deref(),
            Some("3")
        );
        assert_eq!(
            retry_after(StatusStoreError::Unavailable("down".into())).as_deref(),
            Some("1")
        );
    }
}
