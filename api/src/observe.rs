//! What the gateway records of every request: a span that continues the
//! caller's trace and carries the request id (`x-request-id`, made here when
//! the caller sent none, and returned on the response), and the request
//! metrics of `/metrics`.

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{MatchedPath, Request};
use axum::http::{Method, Response};
use axum::middleware::Next;
use skyport_shared::metrics::{self, HttpLabels, RouteLabels};
use skyport_shared::telemetry;
use tracing::Span;

/// The header that carries a request's id.
pub const REQUEST_ID: &str = "x-request-id";

fn route(request: &Request) -> &str {
    request
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", MatchedPath::as_str)
}

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

/// The span of one request, a child of the caller's `traceparent` when it sent one.
pub fn span(request: &Request) -> Span {
    let route = route(request);
    let method = method_label(request.method());
    let request_id = request
        .headers()
        .get(REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let span = tracing::info_span!(
        "request",
        otel.name = %format_args!("{method} {route}"),
        otel.kind = "server",
        http.request.method = method,
        http.route = route,
        request_id,
        http.response.status_code = tracing::field::Empty,
    );
    let traceparent = request
        .headers()
        .get(telemetry::TRACEPARENT)
        .and_then(|v| v.to_str().ok());
    telemetry::continue_trace(&span, traceparent);
    span
}

/// Records the answer's status on the request's span.
pub fn on_response(response: &Response<Body>, _latency: Duration, span: &Span) {
    span.record("http.response.status_code", response.status().as_u16());
}

/// Counts the request by route, method and status, and times it.
pub async fn record(request: Request, next: Next) -> Response<Body> {
    let route = route(&request).to_owned();
    let method = method_label(request.method());
    let started = Instant::now();
    let response = next.run(request).await;
    let metrics = metrics::global();
    metrics
        .http_requests
        .get_or_create(&HttpLabels {
            route: route.clone(),
            method,
            status: response.status().as_u16(),
        })
        .inc();
    metrics
        .http_duration
        .get_or_create(&RouteLabels { route, method })
        .observe(started.elapsed().as_secs_f64());
    response
}
