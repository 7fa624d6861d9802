//! The real binary as an operator runs it, with traces switched on by the
//! standard `OTEL_*` variables and exported to an OTLP/gRPC receiver in this
//! process (the `opentelemetry-proto` crate's `TraceService`, on 127.0.0.1:0).
//!
//! One delivery, posted with a caller's `traceparent`: a single trace id must
//! cover the gateway's request span, the publish to the stream, the worker's
//! span, the five step spans, each call to a service and the service's own
//! span (so the header really went out on every call), and the status
//! writes, each with the right parent. The same run's `/metrics` must parse
//! as Prometheus text and hold the series an operator watches.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::trace::v1::Span;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use skyport_core::status::DeliveryState;
use skyport_tests::otlp::OtlpReceiver;
use skyport_tests::{delivery_request, scrape_metrics};

use crate::spawn_skyport;

/// Every span of `exports`, with the `service.name` of its resource.
fn spans_by_service(exports: Vec<ExportTraceServiceRequest>) -> Vec<(String, Span)> {
    let mut spans = Vec::new();
    for resource_spans in exports.into_iter().flat_map(|e| e.resource_spans) {
        let service = resource_spans
            .resource
            .iter()
            .flat_map(|r| &r.attributes)
            .find(|a| a.key == "service.name")
            .and_then(|a| a.value.as_ref())
            .map(|v| format!("{:?}", v.value))
            .unwrap_or_default();
        for scope in resource_spans.scope_spans {
            spans.extend(scope.spans.into_iter().map(|s| (service.clone(), s)));
        }
    }
    spans
}

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN_ID: &str = "00f067aa0ba902b7";

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_covers_a_delivery_and_metrics_hold_every_series() {
    let receiver = OtlpReceiver::start().await;
    let data = tempfile::tempdir().unwrap();
    let env = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint.clone()),
        ("OTEL_BSP_SCHEDULE_DELAY", "100".to_owned()),
        ("RUST_LOG", "info".to_owned()),
    ];
    let app = spawn_skyport(&data, &["simulator.jitter_ms=0".to_owned()], &env).await;
    check_series_start_at_zero(&app.client.base).await;
    let client = app
        .client
        .with_header("traceparent", &format!("00-{TRACE_ID}-{CALLER_SPAN_ID}-01"));
    let accepted = client.post_delivery(&delivery_request(1)).await;
    let document = client
        .wait_for_state(
            &accepted.status_url,
            DeliveryState::Scheduled,
            Duration::from_secs(30),
        )
        .await;
    assert_eq!(document.state, DeliveryState::Scheduled);

    let families = scrape_metrics(&app.client.base).await;
    let log = app.terminate().await;
    let spans = spans_by_service(receiver.stop().await);

    check_metrics(&families);
    check_trace(&spans, &log);
}

type Families = BTreeMap<String, Vec<BTreeMap<String, String>>>;

/// Before the first request, the series whose labels are known at start are
/// there at 0 (a route's answers, each step's errors, each outcome): else the
/// first burst would be invisible to `rate()` and `increase()`.
async fn check_series_start_at_zero(base: &str) {
    let text = reqwest::get(format!("{base}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for series in [
        r#"skyport_http_requests_total{route="/api/deliveryrequests",method="POST",status="202"} 0"#,
        r#"skyport_http_requests_total{route="/api/deliveryrequests",method="POST",status="503"} 0"#,
        r#"skyport_http_requests_total{route="/api/deliveryrequests/{id}/status",method="GET",status="200"} 0"#,
        r#"skyport_step_errors_total{step="drone",kind="retries_exhausted"} 0"#,
        r#"skyport_workflow_events_total{outcome="scheduled"} 0"#,
        r#"skyport_publish_batch_failures_total{stream="embedded"} 0"#,
    ] {
        assert!(
            text.lines().any(|line| line == series),
            "{series} at start in\n{text}"
        );
    }
}

fn check_metrics(families: &Families) {
    let text = format!("{families:#?}");
    let labels = |family: &str| -> Vec<BTreeMap<String, String>> {
        families
            .get(family)
            .unwrap_or_else(|| panic!("no {family} in\n{text}"))
            .clone()
    };
    assert!(
        labels("skyport_http_requests").iter().any(|l| {
            l["route"] == "/api/deliveryrequests" && l["method"] == "POST" && l["status"] == "202"
        }),
        "the 202 is counted by route, method and status:\n{text}"
    );
    for family in [
        "skyport_http_request_duration_seconds",
        "skyport_publish_batch_events",
        "skyport_publish_batch_duration_seconds",
        "skyport_consumer_lag_events",
        "skyport_events_in_flight",
        "skyport_checkpoint_age_seconds",
        "skyport_consumer_oldest_event_age_seconds",
        "skyport_step_call_duration_seconds",
        "skyport_breaker_state",
        "skyport_workflow_events",
    ] {
        assert!(!labels(family).is_empty(), "{family} has a series:\n{text}");
    }
    let steps: Vec<String> = labels("skyport_step_call_duration_seconds")
        .iter()
        .map(|l| l["step"].clone())
        .collect();
    for step in ["account", "package", "delivery", "thirdparty", "drone"] {
        assert!(steps.iter().any(|s| s == step), "{step} is timed:\n{text}");
    }
    let lanes: Vec<String> = labels("skyport_consumer_lag_events")
        .iter()
        .map(|l| l["lane"].clone())
        .collect();
    assert_eq!(
        lanes.iter().filter(|lane| *lane == "normal").count(),
        8,
        "one per partition"
    );
    assert_eq!(
        lanes.iter().filter(|lane| *lane == "expedited").count(),
        1,
        "the expedited lane's partition"
    );
    assert!(
        labels("skyport_delivery_time_to_terminal_seconds")
            .iter()
            .any(|l| l["lane"] == "normal"),
        "time to terminal by lane:\n{text}"
    );
}

fn check_trace(spans: &[(String, Span)], log: &str) {
    let trace: Vec<&Span> = spans
        .iter()
        .map(|(_, s)| s)
        .filter(|s| hex(&s.trace_id) == TRACE_ID)
        .collect();
    let names: Vec<&str> = trace.iter().map(|s| s.name.as_str()).collect();
    let context = format!("spans of the trace: {names:?}\nlog:\n{log}");
    assert!(
        spans.iter().all(|(service, _)| service.contains("skyport")),
        "the resource names the service: {:?}",
        spans.first().map(|(s, _)| s)
    );
    let one = |name: &str| -> &Span {
        let found: Vec<&&Span> = trace.iter().filter(|s| s.name == name).collect();
        assert_eq!(found.len(), 1, "one `{name}` span; {context}");
        found[0]
    };
    let children = |parent: &Span, name_prefix: &str| -> Vec<&Span> {
        trace
            .iter()
            .copied()
            .filter(|s| s.parent_span_id == parent.span_id && s.name.starts_with(name_prefix))
            .collect()
    };

    let request = one("POST /api/deliveryrequests");
    assert_eq!(request.kind, SpanKind::Server as i32);
    assert_eq!(
        hex(&request.parent_span_id),
        CALLER_SPAN_ID,
        "the gateway continues the caller's span; {context}"
    );
    let publish = one("publish");
    assert_eq!(publish.parent_span_id, request.span_id);
    assert_eq!(publish.kind, SpanKind::Producer as i32);

    let worker = one("process DeliveryRequested");
    assert_eq!(worker.kind, SpanKind::Consumer as i32);
    assert_eq!(
        worker.parent_span_id, request.span_id,
        "the worker continues the trace the event carried; {context}"
    );
    let writes = children(worker, "status write");
    assert!(!writes.is_empty(), "the outcome is written; {context}");

    let mut calls_by_step = HashMap::new();
    for step in ["account", "package", "delivery", "thirdparty", "drone"] {
        let step_span = one(&format!("step {step}"));
        assert_eq!(
            step_span.parent_span_id, worker.span_id,
            "{step}; {context}"
        );
        let calls = children(step_span, "PUT ");
        assert!(!calls.is_empty(), "{step} made a call; {context}");
        for call in &calls {
            assert_eq!(call.kind, SpanKind::Client as i32);
            let served = children(call, "PUT /");
            assert_eq!(
                served.len(),
                1,
                "the service continued the call's traceparent ({step}); {context}"
            );
            assert_eq!(served[0].kind, SpanKind::Server as i32);
        }
        calls_by_step.insert(step, calls.len());
    }
    assert_eq!(calls_by_step.len(), 5);
}

/// `telemetry.log_format = "json"` (the Azure profile's default): every line
/// on stderr is a JSON object, and the lines of a request carry its id, which
/// the answer returns (the caller's, or a UUID made for it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_carry_the_request_id_the_answer_returns() {
    let data = tempfile::tempdir().unwrap();
    // The gateway logs each answer at debug level, inside the request's span.
    let env = [("RUST_LOG", "info,skyport_gateway=debug".to_owned())];
    let app = spawn_skyport(&data, &["telemetry.log_format=json".to_owned()], &env).await;
    let response = app
        .client
        .with_header("x-request-id", "req-json-42")
        .post_raw("application/json", delivery_request(1).to_string())
        .await;
    assert_eq!(response.status(), 202);
    assert_eq!(response.headers()["x-request-id"], "req-json-42");
    let made = app.client.status("/api/deliveryrequests/nope/status").await;
    let id = made.headers()["x-request-id"].to_str().unwrap().to_owned();
    assert_eq!(id.len(), 36, "a request without an id gets a UUID: {id}");
    let log = app.terminate().await;
    let lines: Vec<serde_json::Value> = log
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert!(lines.len() > 3, "{log}");
    assert!(
        lines
            .iter()
            .all(|l| l["level"].is_string() && l["fields"].is_object())
    );
    assert!(
        lines
            .iter()
            .any(|l| l["span"]["request_id"] == "req-json-42"),
        "a line of the request names its id:\n{log}"
    );
}
