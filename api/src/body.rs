//! A request's body on its way in, once its credentials are checked and
//! before it may take one of the `max_in_flight` slots: its
//! `Content-Encoding` checked, decoded when it names a coding (tower-http's
//! [`RequestDecompression`]), then read whole within `max_body_bytes` of
//! *decoded* bytes and the body read timeout. A client that stalls mid-body
//! therefore holds a connection until its 408, never a slot, and a
//! decompression bomb is refused (413) after `max_body_bytes` of output,
//! never inflated in memory. Bodies are read at most `max_bodies_reading`
//! at once (one more is refused with 503 and `Retry-After`), so the memory
//! they hold is bounded whatever the number of connections; a request that
//! announces no body takes no place among them.
//!
//! One middleware, and the decoder only for a body that names a coding, so
//! that the plain JSON of almost every request pays for no layer it does not
//! use (each costs a boxed service per request: BENCHMARKS.md).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderValue, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tower::ServiceExt;
use tower_http::decompression::{DecompressionBody, RequestDecompression};

use crate::error::ApiError;
use crate::routes::deliveries::batch::BATCH_ROUTE;

/// The content codings decoded, as their `Content-Encoding` tokens.
const DECODED: [&str; 4] = ["gzip", "br", "zstd", "deflate"];

/// How much of a body is read, for how long, and how many at once.
#[derive(Debug, Clone)]
pub struct BodyLimits {
    /// Most bytes after decoding.
    pub max_bytes: usize,
    /// Most bytes after decoding of a batch ([`BATCH_ROUTE`]).
    pub max_batch_bytes: usize,
    /// How long the whole body may take to arrive once the head has.
    pub timeout: Duration,
    /// The bodies being read, `places` in all; one more than it holds is
    /// refused. A batch's body takes one place for each `max_bytes` it may
    /// hold, so that the memory bodies hold stays bounded.
    pub reading: Arc<Semaphore>,
    pub places: u32,
    /// `Retry-After` of that refusal.
    pub retry_after_s: u32,
}

/// Reads the body whole, decoding it first when its `Content-Encoding` names
/// a coding: 415 for a coding that is not one token the gateway decodes
/// (naming the ones it does), then as [`read_whole`] says.
pub async fn read(State(limits): State<BodyLimits>, mut request: Request, next: Next) -> Response {
    if !has_body(&request) {
        return next.run(request).await;
    }
    let batch = request
        .extensions()
        .get::<MatchedPath>()
        .is_some_and(|route| route.as_str() == BATCH_ROUTE);
    let (max_bytes, places) = if batch {
        let places = limits.max_batch_bytes.div_ceil(limits.max_bytes.max(1));
        let places = u32::try_from(places).unwrap_or(u32::MAX);
        (
            limits.max_batch_bytes,
            places.clamp(1, limits.places.max(1)),
        )
    } else {
        (limits.max_bytes, 1)
    };
    let Ok(reading) = Arc::clone(&limits.reading).try_acquire_many_owned(places) else {
        return ApiError::Overloaded {
            retry_after_s: limits.retry_after_s,
        }
        .into_response();
    };
    let Some(value) = request.headers().get(header::CONTENT_ENCODING) else {
        return read_whole(request, next, (max_bytes, limits.timeout), reading).await;
    };
    let token = value
        .to_str()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    if token == "identity" {
        request.headers_mut().remove(header::CONTENT_ENCODING);
        return read_whole(request, next, (max_bytes, limits.timeout), reading).await;
    }
    let Some(known) = DECODED.iter().find(|known| **known == token) else {
        let shown = String::from_utf8_lossy(value.as_bytes()).into_owned();
        return ApiError::UnsupportedEncoding(shown).into_response();
    };
    // The decoder matches the token in lower case.
    request
        .headers_mut()
        .insert(header::CONTENT_ENCODING, HeaderValue::from_static(known));
    let mut taken = Some((next, reading));
    let decoded = RequestDecompression::new(tower::service_fn(
        move |request: Request<DecompressionBody<Body>>| {
            let (next, reading) = taken.take().expect("a oneshot service is called once");
            let limits = (max_bytes, limits.timeout);
            async move {
                Ok::<_, Infallible>(read_whole(request.map(Body::new), next, limits, reading).await)
            }
        },
    ));
    match decoded.oneshot(request).await {
        Ok(response) => response.into_response(),
        Err(never) => match never {},
    }
}

/// Whether `request` announces a body: a length above 0, or a transfer coding.
fn has_body(request: &Request) -> bool {
    let headers = request.headers();
    headers.contains_key(header::TRANSFER_ENCODING)
        || headers
            .get(header::CONTENT_LENGTH)
            .is_some_and(|length| length.as_bytes() != b"0")
}

/// Reads the (decoded) body whole within `(max_bytes, timeout)`, then gives its place
/// among the bodies being read back and passes the request on with the
/// bytes as its body: 413 past `max_bytes`, 408 past `timeout`, 400 when it
/// cannot be read or decoded.
async fn read_whole(
    request: Request,
    next: Next,
    (max_bytes, timeout): (usize, Duration),
    reading: OwnedSemaphorePermit,
) -> Response {
    let (parts, body) = request.into_parts();
    let collected = tokio::time::timeout(timeout, Limited::new(body, max_bytes).collect()).await;
    let bytes = match collected {
        Ok(Ok(collected)) => collected.to_bytes(),
        Ok(Err(error)) if error.is::<LengthLimitError>() => {
            return ApiError::PayloadTooLarge { limit: max_bytes }.into_response();
        }
        Ok(Err(error)) => {
            return ApiError::BadRequest(format!("the body could not be read or decoded: {error}"))
                .into_response();
        }
        Err(_elapsed) => {
            return ApiError::BodyTimeout {
                timeout_ms: timeout.as_millis(),
            }
            .into_response();
        }
    };
    drop(reading);
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}
