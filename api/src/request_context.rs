//! What the gateway records of every request, in one middleware: its id
//! (`x-request-id`, the caller's or a UUID made here, returned on the
//! answer), a span that continues the caller's trace and carries that id (so
//! every log line of the request names it), the request metrics of
//! `/metrics`, the 202s' times for a worker beside the gateway
//! ([`foreground`]), and a log line for each 5xx. A handler that panics is caught
//! here too and answered with a 500 problem naming the request (the panic
//! hook has logged the panic within the request's span).
//!
//! One route layer rather than a stack of them: axum wraps every route in
//! each layer, and each costs a boxed clone per request (measured in
//! BENCHMARKS.md).

use std::panic::AssertUnwindSafe;
use std::time::Instant;

use axum::body::Body;
use axum::extract::{MatchedPath, Request};
use axum::http::{HeaderValue, Method, Response, StatusCode};
use axum::middleware::Next;
use axum::response::IntoResponse;
use futures_util::FutureExt;
use skyport_runtime::foreground;
use skyport_runtime::metrics::{self, HttpLabels, RouteLabels};
use skyport_runtime::{telemetry, trace_span};
use tracing::Instrument;

use crate::error::ApiError;
use crate::request_id::{CURRENT, REQUEST_ID};
use crate::waiting::Held;

/// A label for `method` from a fixed set, so that odd methods cannot grow the series.
fn method_label(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        Method::PATCH => "PATCH",
        _ => "other",
    }
}

/// Creates the request counter of every answer `spec` documents, at 0: each
/// route's accepted and refused counts exist from the start, so that the
/// first burst after a start shows in `rate()` and `increase()`.
pub fn count_from_zero(spec: &utoipa::openapi::OpenApi) {
    let requests = &metrics::global().http_requests;
    for (route, item) in &spec.paths.paths {
        let operations = [
            (Method::GET, &item.get),
            (Method::POST, &item.post),
            (Method::PUT, &item.put),
            (Method::DELETE, &item.delete),
            (Method::PATCH, &item.patch),
        ];
        for (method, operation) in operations {
            let Some(operation) = operation else {
                continue;
            };
            let statuses = operation.responses.responses.keys();
            for status in statuses.filter_map(|status| status.parse().ok()) {
                requests.get_or_create_owned(&HttpLabels {
                    route: route.clone(),
                    method: method_label(&method),
                    status,
                });
            }
        }
    }
}

/// The caller's request id when it is a short printable token, else a new UUID.
fn request_id(request: &Request) -> HeaderValue {
    request
        .headers()
        .get(&REQUEST_ID)
        .filter(|v| !v.is_empty() && v.len() <= 128 && v.to_str().is_ok())
        .cloned()
        .unwrap_or_else(|| {
            HeaderValue::from_str(&uuid::Uuid::new_v4().to_string())
                .unwrap_or_else(|e| unreachable!("a UUID is a valid header value: {e}"))
        })
}

/// Runs the request inside its span, then counts and times it.
pub async fn observe(mut request: Request, next: Next) -> Response<Body> {
    let started = Instant::now();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", MatchedPath::as_str)
        .to_owned();
    let method = method_label(request.method());
    let id = request_id(&request);
    request.headers_mut().insert(REQUEST_ID, id.clone());
    let span = trace_span!(
        "request",
        otel.name = %format_args!("{method} {route}"),
        otel.kind = "server",
        request_id = id.to_str().unwrap_or_default(),
        http.response.status_code = tracing::field::Empty,
    );
    let traceparent = request
        .headers()
        .get(telemetry::TRACEPARENT)
        .and_then(|v| v.to_str().ok());
    telemetry::continue_trace(&span, traceparent);
    let answered = CURRENT
        .scope(
            id.clone(),
            AssertUnwindSafe(next.run(request))
                .catch_unwind()
                .instrument(span.clone()),
        )
        .await;
    let mut response = answered.unwrap_or_else(|_panic| {
        ApiError::Panicked {
            request_id: id.to_str().unwrap_or_default().to_owned(),
        }
        .into_response()
    });
    let status = response.status();
    let elapsed = started.elapsed();
    // A read that waited for a change is slow by request, not by load.
    let held = response.extensions().get::<Held>().is_some();
    if method == "POST" && status == StatusCode::ACCEPTED && route.starts_with("/api/") {
        foreground::global().record(elapsed);
    }
    let seconds = elapsed.as_secs_f64();
    span.record("http.response.status_code", status.as_u16());
    if status.is_server_error() {
        let request_id = id.to_str().unwrap_or_default();
        span.in_scope(|| tracing::warn!(%status, %route, request_id, seconds, "Answered with a server error."));
    } else {
        span.in_scope(|| tracing::debug!(%status, seconds, "Answered."));
    }
    response.headers_mut().insert(REQUEST_ID, id);
    let metrics = metrics::global();
    metrics
        .http_requests
        .get_or_create(&HttpLabels {
            route: route.clone(),
            method,
            status: status.as_u16(),
        })
        .inc();
    metrics
        .http_duration
        .get_or_create(&RouteLabels {
            route,
            method,
            class: if held {
                RouteLabels::HELD
            } else {
                RouteLabels::class_of(status.as_u16())
            },
        })
        .observe(seconds);
    response
}
