//! A request's body on its way in, before it may take one of the
//! `max_in_flight` slots: its `Content-Encoding` checked, decoded
//! (tower-http's [`RequestDecompressionLayer`], in [`crate::router`]), then
//! read whole within `max_body_bytes` of *decoded* bytes and the body read
//! timeout. A client that stalls mid-body therefore holds a connection until
//! its 408, never a slot, and a decompression bomb is refused (413) after
//! `max_body_bytes` of output, never inflated in memory.
//!
//! [`RequestDecompressionLayer`]: tower_http::decompression::RequestDecompressionLayer

use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body_util::{BodyExt, LengthLimitError, Limited};

use crate::error::ApiError;

/// The content codings decoded, as their `Content-Encoding` tokens.
const DECODED: [&str; 5] = ["gzip", "br", "zstd", "deflate", "identity"];

/// How much of a body is read, and for how long.
#[derive(Debug, Clone, Copy)]
pub struct BodyLimits {
    /// Most bytes after decoding.
    pub max_bytes: usize,
    /// How long the whole body may take to arrive once the head has.
    pub timeout: Duration,
}

/// Refuses a `Content-Encoding` that is not one token the gateway decodes
/// (415, naming the ones it does), and writes the token in lower case, as the
/// decoder matches it.
pub async fn check_encoding(mut request: Request, next: Next) -> Response {
    if let Some(value) = request.headers().get(header::CONTENT_ENCODING) {
        let token = value
            .to_str()
            .unwrap_or_default()
            .trim()
            .to_ascii_lowercase();
        let Some(known) = DECODED.iter().find(|known| **known == token) else {
            let shown = String::from_utf8_lossy(value.as_bytes()).into_owned();
            return ApiError::UnsupportedEncoding(shown).into_response();
        };
        request
            .headers_mut()
            .insert(header::CONTENT_ENCODING, HeaderValue::from_static(known));
    }
    next.run(request).await
}

/// Reads the (decoded) body whole within `limits`, then passes the request on
/// with the bytes as its body: 413 past `max_bytes`, 408 past `timeout`, 400
/// when it cannot be read or decoded.
pub async fn read_whole(
    State(limits): State<BodyLimits>,
    request: Request,
    next: Next,
) -> Response {
    let (parts, body) = request.into_parts();
    let collected = tokio::time::timeout(
        limits.timeout,
        Limited::new(body, limits.max_bytes).collect(),
    )
    .await;
    let bytes = match collected {
        Ok(Ok(collected)) => collected.to_bytes(),
        Ok(Err(error)) if error.is::<LengthLimitError>() => {
            return ApiError::PayloadTooLarge {
                limit: limits.max_bytes,
            }
            .into_response();
        }
        Ok(Err(error)) => {
            return ApiError::BadRequest(format!("the body could not be read or decoded: {error}"))
                .into_response();
        }
        Err(_elapsed) => {
            return ApiError::BodyTimeout {
                timeout_ms: limits.timeout.as_millis(),
            }
            .into_response();
        }
    };
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}
