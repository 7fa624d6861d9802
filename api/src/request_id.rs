//! The id of the request being answered: the `x-request-id` header's name,
//! and a task-local that holds the id while a request is answered, so that an
//! error answer made anywhere below the middleware can name it. Apart from
//! the middleware that sets it, so that errors read it without importing
//! the middleware.

use axum::http::{HeaderName, HeaderValue};

/// The header that carries a request's id.
pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

tokio::task_local! {
    /// The id of the request this task is answering, for log lines outside its span.
    pub(crate) static CURRENT: HeaderValue;
}

/// The id of the request being answered, when called while answering one.
pub fn current_request_id() -> Option<String> {
    CURRENT
        .try_with(|id| id.to_str().unwrap_or_default().to_owned())
        .ok()
}
