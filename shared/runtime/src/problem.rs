//! `application/problem+json` (RFC 9457): the one shape of every error body a
//! Skyport server answers with, the gateway's API and the admin routes alike.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use skyport_core::request::FieldError;
use utoipa::ToSchema;

/// The media type of every error body.
pub const PROBLEM_JSON: &str = "application/problem+json";

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

impl Problem {
    /// A problem without field errors.
    pub fn new(
        status: StatusCode,
        title: &'static str,
        code: &'static str,
        detail: String,
    ) -> Self {
        Self {
            problem_type: "about:blank",
            title,
            status: status.as_u16(),
            detail,
            code,
            errors: Vec::new(),
        }
    }

    /// The response: this document as `application/problem+json`, with
    /// `Retry-After` when given.
    pub fn respond(self, retry_after_s: Option<u32>) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut response = (status, Json(self)).into_response();
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let Some(seconds) = retry_after_s {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}
