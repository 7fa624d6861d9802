//! OTLP from the real binary over both protocols: spans as HTTP POSTs
//! (`http/protobuf`) and the `/metrics` registry sent over OTLP
//! (`OTEL_METRICS_EXPORTER=otlp`, a short interval) to a receiver in this
//! process: an axum server taking `/v1/traces` and `/v1/metrics` (protobuf,
//! decoded with prost), or a gRPC `MetricsService` (`opentelemetry-proto`'s).
//! Each listens on 127.0.0.1:0, takes only exports with the header
//! `OTEL_EXPORTER_OTLP_HEADERS` sets, and is stopped by its test. The spans
//! over gRPC are `telemetry.rs`'s.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{
    MetricsService, MetricsServiceServer,
};
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::{
    AggregationTemporality, Metric, metric, number_data_point,
};
use prost::Message;
use skyport_core::status::DeliveryState;
use skyport_tests::{ChildApp, delivery_request};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::spawn_skyport;

/// The header each receiver requires, as `OTEL_EXPORTER_OTLP_HEADERS` sets it
/// (percent-encoded there: `x-api-key=k%3D1`).
const API_KEY: &str = "x-api-key";
const KEY: &str = "k=1";

/// Every export a receiver took, in order.
#[derive(Debug, Clone, Default)]
struct Received {
    traces: Arc<Mutex<Vec<ExportTraceServiceRequest>>>,
    metrics: Arc<Mutex<Vec<ExportMetricsServiceRequest>>>,
}

impl Received {
    /// The last metrics export, once one satisfies `done`; panics after 30 s.
    async fn metrics_until(
        &self,
        done: impl Fn(&ExportMetricsServiceRequest) -> bool,
    ) -> ExportMetricsServiceRequest {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(last) = self.metrics.lock().unwrap().last().filter(|m| done(m)) {
                return last.clone();
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no metrics export as expected in 30 s; received {}",
                self.metrics.lock().unwrap().len()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// A receiver on 127.0.0.1:0, serving until its test stops it.
#[derive(Debug)]
struct Receiver {
    endpoint: String,
    received: Received,
    stop: CancellationToken,
    server: JoinHandle<()>,
}

impl Receiver {
    /// OTLP/HTTP: `POST /v1/traces` and `/v1/metrics` with protobuf bodies.
    async fn http() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let received = Received::default();
        let router = axum::Router::new()
            .route("/v1/traces", axum::routing::post(traces))
            .route("/v1/metrics", axum::routing::post(metrics))
            .layer(DefaultBodyLimit::max(16 << 20))
            .with_state(received.clone());
        let stop = CancellationToken::new();
        let serving =
            axum::serve(listener, router).with_graceful_shutdown(stop.clone().cancelled_owned());
        let server = tokio::spawn(async move { serving.await.unwrap() });
        Self {
            endpoint,
            received,
            stop,
            server,
        }
    }

    /// OTLP/gRPC: the `MetricsService`.
    async fn grpc() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let received = Received::default();
        let stop = CancellationToken::new();
        let serving = tonic::transport::Server::builder()
            .add_service(MetricsServiceServer::new(received.clone()))
            .serve_with_incoming_shutdown(
                tonic::transport::server::TcpIncoming::from(listener),
                stop.clone().cancelled_owned(),
            );
        let server = tokio::spawn(async move { serving.await.unwrap() });
        Self {
            endpoint,
            received,
            stop,
            server,
        }
    }

    /// Stops serving (within 10 s); returns everything received.
    async fn stop(self) -> Received {
        self.stop.cancel();
        tokio::time::timeout(Duration::from_secs(10), self.server)
            .await
            .expect("the receiver stops")
            .unwrap();
        self.received
    }
}

/// Keeps the protobuf export `M` a POST carries in `into` and answers with an empty `R`.
fn take<M, R>(into: &Mutex<Vec<M>>, headers: &HeaderMap, body: Bytes) -> Response
where
    M: Message + Default,
    R: Message + Default,
{
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    if content_type != Some("application/x-protobuf") {
        return StatusCode::UNSUPPORTED_MEDIA_TYPE.into_response();
    }
    if headers.get(API_KEY).and_then(|v| v.to_str().ok()) != Some(KEY) {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    match M::decode(body) {
        Ok(export) => {
            into.lock().unwrap().push(export);
            (
                [(header::CONTENT_TYPE, "application/x-protobuf")],
                R::default().encode_to_vec(),
            )
                .into_response()
        }
        Err(e) => (StatusCode::BAD_REQUEST, e.to_string()).into_response(),
    }
}

async fn traces(State(received): State<Received>, headers: HeaderMap, body: Bytes) -> Response {
    take::<_, ExportTraceServiceResponse>(&received.traces, &headers, body)
}

async fn metrics(State(received): State<Received>, headers: HeaderMap, body: Bytes) -> Response {
    take::<_, ExportMetricsServiceResponse>(&received.metrics, &headers, body)
}

#[tonic::async_trait]
impl MetricsService for Received {
    async fn export(
        &self,
        request: tonic::Request<ExportMetricsServiceRequest>,
    ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
        if request
            .metadata()
            .get(API_KEY)
            .and_then(|v| v.to_str().ok())
            != Some(KEY)
        {
            return Err(tonic::Status::unauthenticated("no key"));
        }
        self.metrics.lock().unwrap().push(request.into_inner());
        Ok(tonic::Response::new(ExportMetricsServiceResponse::default()))
    }
}

/// The attributes of a point, as text.
fn attributes(attributes: &[KeyValue]) -> BTreeMap<String, String> {
    attributes
        .iter()
        .filter_map(|kv| match kv.value.as_ref()?.value.as_ref()? {
            any_value::Value::StringValue(v) => Some((kv.key.clone(), v.clone())),
            _ => None,
        })
        .collect()
}

/// The metric `name` of `export`.
fn metric<'a>(export: &'a ExportMetricsServiceRequest, name: &str) -> Option<&'a Metric> {
    export
        .resource_metrics
        .iter()
        .flat_map(|r| &r.scope_metrics)
        .flat_map(|s| &s.metrics)
        .find(|m| m.name == name)
}

/// `skyport_http_requests_total{route="/api/deliveryrequests",method="POST",status="202"}` in `export`.
fn accepted(export: &ExportMetricsServiceRequest) -> Option<f64> {
    let Some(metric::Data::Sum(sum)) = &metric(export, "skyport_http_requests_total")?.data else {
        return None;
    };
    assert!(sum.is_monotonic);
    assert_eq!(
        sum.aggregation_temporality,
        AggregationTemporality::Cumulative as i32
    );
    sum.data_points.iter().find_map(|point| {
        let labels = attributes(&point.attributes);
        let post = labels.get("route").map(String::as_str) == Some("/api/deliveryrequests")
            && labels.get("method").map(String::as_str) == Some("POST")
            && labels.get("status").map(String::as_str) == Some("202");
        match (post, &point.value) {
            (true, Some(number_data_point::Value::AsDouble(value))) => {
                assert!(point.start_time_unix_nano > 0);
                assert!(point.start_time_unix_nano <= point.time_unix_nano);
                Some(*value)
            }
            _ => None,
        }
    })
}

/// The last export carries the one 202 once (the same count `/metrics`
/// shows), the accepted POST's latency as a histogram with its buckets, and
/// the resource names the service.
fn check_metrics(last: &ExportMetricsServiceRequest, during: &ExportMetricsServiceRequest) {
    assert_eq!(accepted(during), Some(1.0), "sent on the interval");
    assert_eq!(accepted(last), Some(1.0), "counted once");
    let service = last.resource_metrics[0]
        .resource
        .as_ref()
        .map(|r| attributes(&r.attributes))
        .unwrap_or_default();
    assert_eq!(service["service.name"], "skyport", "{service:?}");
    let Some(metric::Data::Histogram(histogram)) =
        &metric(last, "skyport_http_request_duration_seconds")
            .expect("the latency histogram")
            .data
    else {
        panic!("a histogram");
    };
    let post = histogram
        .data_points
        .iter()
        .find(|point| {
            let labels = attributes(&point.attributes);
            labels["method"] == "POST" && labels["class"] == "2xx"
        })
        .expect("the 202's latency");
    assert_eq!(post.count, 1);
    assert_eq!(post.explicit_bounds.len(), 16, "0.5 ms to about 16 s");
    assert_eq!(post.bucket_counts.len(), 17);
    assert_eq!(post.bucket_counts.iter().sum::<u64>(), 1);
    assert!(post.sum.is_some_and(|s| s > 0.0));
}

/// Posts one delivery and waits for its outcome; returns the metrics export
/// that first counted it (before any shutdown).
async fn deliver_one(app: &ChildApp, received: &Received) -> ExportMetricsServiceRequest {
    let accepted_delivery = app.client.post_delivery(&delivery_request(1)).await;
    app.client
        .wait_for_state(
            &accepted_delivery.status_url,
            DeliveryState::Scheduled,
            Duration::from_secs(30),
        )
        .await;
    received
        .metrics_until(|export| accepted(export) == Some(1.0))
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_and_metrics_go_over_http_protobuf() {
    let receiver = Receiver::http().await;
    let data = tempfile::tempdir().unwrap();
    let env = [
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf".to_owned()),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint.clone()),
        ("OTEL_BSP_SCHEDULE_DELAY", "100".to_owned()),
        ("OTEL_METRICS_EXPORTER", "otlp".to_owned()),
        ("OTEL_METRIC_EXPORT_INTERVAL", "200".to_owned()),
        ("OTEL_EXPORTER_OTLP_HEADERS", "x-api-key=k%3D1".to_owned()),
    ];
    let app = spawn_skyport(&data, &["simulator.jitter_ms=0".to_owned()], &env).await;
    let during = deliver_one(&app, &receiver.received).await;
    let log = app.terminate().await;
    let received = receiver.stop().await;

    let last = received.metrics.lock().unwrap().last().cloned().unwrap();
    check_metrics(&last, &during);
    let spans: Vec<_> = received
        .traces
        .lock()
        .unwrap()
        .iter()
        .flat_map(|e| &e.resource_spans)
        .flat_map(|r| &r.scope_spans)
        .flat_map(|s| s.spans.clone())
        .collect();
    let named = |name: &str| spans.iter().find(|s| s.name == name);
    let request = named("POST /api/deliveryrequests")
        .unwrap_or_else(|| panic!("the request's span over HTTP; log:\n{log}"));
    let worker = named("process DeliveryRequested").expect("the worker's span");
    assert_eq!(worker.trace_id, request.trace_id, "one trace");
    assert_eq!(worker.parent_span_id, request.span_id);
    let steps = spans
        .iter()
        .filter(|s| s.name.starts_with("step ") && s.parent_span_id == worker.span_id)
        .count();
    assert_eq!(steps, 5, "a span per step");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_go_over_grpc_with_spans_off() {
    let receiver = Receiver::grpc().await;
    let data = tempfile::tempdir().unwrap();
    let env = [
        ("OTEL_TRACES_EXPORTER", "none".to_owned()),
        ("OTEL_METRICS_EXPORTER", "otlp".to_owned()),
        (
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
            receiver.endpoint.clone(),
        ),
        ("OTEL_METRIC_EXPORT_INTERVAL", "200".to_owned()),
        (
            "OTEL_EXPORTER_OTLP_METRICS_HEADERS",
            "x-api-key=k%3D1".to_owned(),
        ),
    ];
    let app = spawn_skyport(&data, &["simulator.jitter_ms=0".to_owned()], &env).await;
    let during = deliver_one(&app, &receiver.received).await;
    app.terminate().await;
    let received = receiver.stop().await;

    let last = received.metrics.lock().unwrap().last().cloned().unwrap();
    check_metrics(&last, &during);
    assert!(received.traces.lock().unwrap().is_empty());
}
