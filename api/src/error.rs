//! The gateway's one error type and its `application/problem+json` form (RFC 9457).
//!
//! Every failure, extractor rejections included, becomes an [`ApiError`]; the
//! match from error to status is exhaustive, and a 5xx's cause is logged once
//! and never shown to the client.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use skyport_shared::ports::{PublishError, StatusStoreError};
use skyport_shared::request::FieldError;
use utoipa::ToSchema;

use crate::observe;

/// The media type of every error body.
pub const PROBLEM_JSON: &str = "application/problem+json";

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
    #[error("this method is not allowed here")]
    MethodNotAllowed,
    /// The request could not be made durable now; the client should retry.
    #[error("the service cannot take requests right now")]
    Unavailable {
        retry_after_s: u32,
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// Too many requests are in flight; this one was refused without waiting.
    #[error(
        "the gateway is at its limit of requests in flight; retry after the Retry-After seconds"
    )]
    Overloaded { retry_after_s: u32 },
    #[error("an internal error occurred")]
    Internal(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// The problem document (RFC 9457) with Skyport's extension members.
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({
    "type": "about:blank",
    "title": "Validation failed",
    "status": 422,
    "detail": "the request has invalid fields",
    "code": "ValidationFailed",
    "errors": [{"field": "packageInfo.weight", "message": "must be more than 0 and at most 100 kg"}]
}))]
pub struct Problem {
    /// Always `about:blank`: `code` names the problem.
    #[serde(rename = "type")]
    #[schema(format = "uri-reference")]
    pub problem_type: &'static str,
    pub title: &'static str,
    /// The HTTP status code.
    #[schema(minimum = 400, maximum = 599)]
    pub status: u16,
    pub detail: String,
    /// A stable, machine-readable name for the problem (`ValidationFailed`, `Conflict`, …).
    pub code: &'static str,
    /// The offending fields of a 422.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<FieldError>,
}

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
            Self::Validation(_) => (
                StatusCode::UNPROCESSABLE_ENTITY,
                "Validation failed",
                "ValidationFailed",
            ),
            Self::Unauthorized { .. } => (StatusCode::UNAUTHORIZED, "Unauthorized", "Unauthorized"),
            Self::Forbidden(_) => (StatusCode::FORBIDDEN, "Forbidden", "Forbidden"),
            Self::NotFound(_) => (StatusCode::NOT_FOUND, "Not found", "NotFound"),
            Self::Conflict(_) => (StatusCode::CONFLICT, "Conflict", "Conflict"),
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
            Self::Overloaded { .. } => (
                StatusCode::SERVICE_UNAVAILABLE,
                "Service unavailable",
                "Overloaded",
            ),
            Self::Internal(_) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "Internal error",
                "Internal",
            ),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, title, code) = self.parts();
        match &self {
            Self::Unavailable {
                source: Some(source),
                ..
            } => {
                let request_id = observe::current_request_id();
                tracing::warn!(request_id, error = %source, "Refused a request: a backend is unavailable.");
            }
            Self::Internal(source) => {
                let request_id = observe::current_request_id();
                tracing::error!(request_id, error = %source, "A request failed with an internal error.");
            }
            _ => {}
        }
        let retry_after = match &self {
            Self::Unavailable { retry_after_s, .. } | Self::Overloaded { retry_after_s } => {
                Some(*retry_after_s)
            }
            _ => None,
        };
        let challenge = match &self {
            Self::Unauthorized { challenge, .. } => Some(*challenge),
            _ => None,
        };
        let errors = match self {
            Self::Validation(ref errors) => errors.clone(),
            _ => Vec::new(),
        };
        let problem = Problem {
            problem_type: "about:blank",
            title,
            status: status.as_u16(),
            detail: self.to_string(),
            code,
            errors,
        };
        let mut response = (status, Json(problem)).into_response();
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let Some(seconds) = retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        if let Some(challenge) = challenge {
            headers.insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static(challenge),
            );
        }
        response
    }
}

impl From<StatusStoreError> for ApiError {
    fn from(e: StatusStoreError) -> Self {
        match e {
            StatusStoreError::Unavailable(source) => Self::Unavailable {
                retry_after_s: 1,
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
        Self::Unavailable {
            retry_after_s: 1,
            source: Some(Box::new(e)),
        }
    }
}
