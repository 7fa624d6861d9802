//! `/dashboard`: a live page over this process's own metrics, for operators.
//!
//! The page (HTML, a script and a style sheet, embedded in the binary and
//! fetched from the same origin: nothing comes from elsewhere) polls
//! `/dashboard/data` every second and draws rates, percentiles and states
//! from the differences between two snapshots. A snapshot is the registry
//! `/metrics` exposes, read back from its own text, so the page shows the
//! same numbers a Prometheus scraper gets and nothing counts twice.
//!
//! The page carries no data and is served to anyone the listener serves;
//! the data route is what the gateway puts behind its credentials (read
//! scope). The page asks for an API key or a token when the data route
//! answers 401, and sends it with each poll.
//!
//! The gateway's busiest clients are not metrics (a label per client would
//! grow the registry with every client): its quotas keep their own bounded
//! summary, which the data route carries beside the metrics through
//! [`TopClients`].

mod exposition;

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Serialize;

use crate::metrics::{self, Metrics};

pub use self::exposition::{Sample, parse};

/// Everything a page may load, and nothing from elsewhere.
const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
                      connect-src 'self'; img-src 'self' data:; base-uri 'none'; \
                      form-action 'none'; frame-ancestors 'none'";

const PAGE: &str = include_str!("index.html");
const SCRIPT: &str = include_str!("dashboard.js");
const STYLE: &str = include_str!("dashboard.css");

/// The page and its assets: `/dashboard`, `/dashboard/dashboard.js`, `/dashboard/dashboard.css`.
pub fn page<S>() -> axum::Router<S>
where
    S: Clone + Send + Sync + 'static,
{
    axum::Router::new()
        .route("/dashboard", get(|| async { asset("text/html", PAGE) }))
        .route(
            "/dashboard/dashboard.js",
            get(|| async { asset("text/javascript", SCRIPT) }),
        )
        .route(
            "/dashboard/dashboard.css",
            get(|| async { asset("text/css", STYLE) }),
        )
}

/// The page's data: `/dashboard/data`, a [`Snapshot`] of the process's
/// metrics, with the busiest clients when `top_clients` counts them.
pub fn data<S>(top_clients: Option<Arc<dyn TopClients>>) -> axum::Router<S>
where
    S: Clone + Send + Sync + 'static,
{
    axum::Router::new().route(
        "/dashboard/data",
        get(move || async move { snapshot_route(top_clients.as_deref()) }),
    )
}

/// What the page's "Top clients" table is drawn from: the gateway's
/// per-client quotas, which count the requests they let through and refuse.
pub trait TopClients: Send + Sync {
    /// The clients counted now, busiest first.
    fn top_clients(&self) -> Vec<ClientCount>;
}

/// One client's metered requests, counted from its entry among the busiest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ClientCount {
    pub name: String,
    /// The number of its entry, unique in the process: a client forgotten
    /// and counted again has a new one, so the page takes rates only
    /// between two readings of the same entry (one it has not seen began
    /// after its last reading).
    pub entry: u64,
    /// Requests its quota let through since its entry.
    pub accepted: u64,
    /// Requests its quota refused (429) since its entry.
    pub refused: u64,
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_str(&format!("{content_type}; charset=utf-8")).unwrap_or_else(
                    |e| unreachable!("a fixed content type is a header value: {e}"),
                ),
            ),
            (
                header::CONTENT_SECURITY_POLICY,
                HeaderValue::from_static(POLICY),
            ),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
            (
                header::X_CONTENT_TYPE_OPTIONS,
                HeaderValue::from_static("nosniff"),
            ),
        ],
        body,
    )
        .into_response()
}

fn snapshot_route(top_clients: Option<&dyn TopClients>) -> Response {
    let mut snapshot = Snapshot::of(metrics::global());
    snapshot.top_clients = top_clients.map(TopClients::top_clients);
    (
        [(header::CACHE_CONTROL, HeaderValue::from_static("no-store"))],
        axum::Json(snapshot),
    )
        .into_response()
}

/// One reading of every series: what `/dashboard/data` answers.
#[derive(Debug, Serialize)]
pub struct Snapshot {
    /// When it was read, in milliseconds since the Unix epoch: rates divide by
    /// the difference between two of these.
    pub at: u64,
    /// The samples by their exposition name (a counter's with `_total`, a
    /// histogram's as `_bucket`, `_sum` and `_count`).
    pub metrics: BTreeMap<String, Vec<Sample>>,
    /// The busiest clients, when the process meters clients (the gateway
    /// with quotas on); absent otherwise, and the page hides their table.
    #[serde(rename = "topClients", skip_serializing_if = "Option::is_none")]
    pub top_clients: Option<Vec<ClientCount>>,
}

impl Snapshot {
    /// Reads `metrics` now.
    pub fn of(metrics: &Metrics) -> Self {
        let text = metrics.render();
        let at = time::OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000;
        let mut grouped: BTreeMap<String, Vec<Sample>> = BTreeMap::new();
        for (name, sample) in parse(&text) {
            grouped.entry(name).or_default().push(sample);
        }
        Self {
            at: u64::try_from(at).unwrap_or(0),
            metrics: grouped,
            top_clients: None,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use tower::ServiceExt;

    use super::*;
    use prometheus_client::metrics::gauge::Gauge;

    use crate::metrics::{HttpLabels, RouteLabels, component};

    fn value(snapshot: &Snapshot, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        snapshot.metrics.get(name)?.iter().find_map(|sample| {
            labels
                .iter()
                .all(|(k, v)| sample.labels.get(*k).map(String::as_str) == Some(*v))
                .then_some(sample.value)
        })
    }

    #[test]
    fn a_snapshot_holds_what_the_registry_recorded_by_name_and_labels() {
        let metrics = Metrics::new();
        let accepted = HttpLabels {
            route: "/api/deliveryrequests".into(),
            method: "POST",
            status: 202,
        };
        metrics.http_requests.get_or_create(&accepted).inc_by(7);
        let post = RouteLabels {
            route: "/api/deliveryrequests".into(),
            method: "POST",
            class: RouteLabels::class_of(202),
        };
        for seconds in [0.0004, 0.003, 0.003, 20.0] {
            metrics.http_duration.get_or_create(&post).observe(seconds);
        }
        // A component's series, as a crate registers its own.
        let mut registry = component();
        let lag: Gauge = Gauge::default();
        registry.register("consumer_lag_events", "Events not done yet", lag.clone());
        lag.set(42);
        let window: Gauge = Gauge::default();
        registry.register("worker_window", "Events in flight", window.clone());
        metrics.register(registry);

        let snapshot = Snapshot::of(&metrics);

        let route = ("route", "/api/deliveryrequests");
        assert_eq!(
            value(
                &snapshot,
                "skyport_http_requests_total",
                &[route, ("method", "POST"), ("status", "202")]
            ),
            Some(7.0)
        );
        let histogram = "skyport_http_request_duration_seconds";
        assert_eq!(
            value(
                &snapshot,
                &format!("{histogram}_count"),
                &[route, ("class", "2xx")]
            ),
            Some(4.0)
        );
        let sum = value(&snapshot, &format!("{histogram}_sum"), &[route]).unwrap();
        assert!((sum - 20.0064).abs() < 1e-9, "{sum}");
        // Buckets are cumulative, and the last one is +Inf.
        let buckets = &snapshot.metrics[&format!("{histogram}_bucket")];
        let le = |bound: &str| {
            buckets
                .iter()
                .find(|s| s.labels["le"] == bound)
                .unwrap()
                .value
        };
        assert_eq!(le("0.0005"), 1.0);
        assert_eq!(le("0.004"), 3.0);
        assert_eq!(le("+Inf"), 4.0);
        assert_eq!(
            value(&snapshot, "skyport_consumer_lag_events", &[]),
            Some(42.0)
        );
        // An unlabelled series is there with no labels.
        let window = &snapshot.metrics["skyport_worker_window"];
        assert_eq!(window.len(), 1);
        assert!(window[0].labels.is_empty());
        let now = time::OffsetDateTime::now_utc().unix_timestamp() as u64 * 1000;
        assert!(snapshot.at.abs_diff(now) < 5_000, "{}", snapshot.at);
    }

    #[test]
    fn a_snapshot_reads_every_sample_the_exposition_writes() {
        let metrics = Metrics::new();
        metrics.published("embedded", 12, 0.004);
        metrics.throttled_by("cosmos");
        let text = metrics.render();
        let samples = text
            .lines()
            .filter(|line| !line.starts_with('#') && !line.is_empty())
            .count();
        let snapshot = Snapshot::of(&metrics);
        assert_eq!(
            snapshot.metrics.values().map(Vec::len).sum::<usize>(),
            samples
        );
    }

    #[tokio::test]
    async fn the_data_route_answers_json_that_is_never_cached_and_the_page_only_loads_from_itself()
    {
        metrics::global().throttled_by("dashboard-test");
        let app = page::<()>().merge(data(None));
        let answer = app
            .clone()
            .oneshot(Request::get("/dashboard/data").body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(answer.status(), StatusCode::OK);
        assert_eq!(answer.headers()[header::CACHE_CONTROL], "no-store");
        assert_eq!(answer.headers()[header::CONTENT_TYPE], "application/json");
        let body = axum::body::to_bytes(answer.into_body(), 1 << 20)
            .await
            .unwrap();
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert!(json["at"].as_u64().unwrap() > 0, "{json}");
        let throttled = json["metrics"]["skyport_throttled_total"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["labels"]["dependency"] == "dashboard-test")
            .unwrap();
        assert!(throttled["value"].as_f64().unwrap() >= 1.0, "{throttled}");
        assert!(json.get("topClients").is_none(), "no clients are counted");

        for (path, content_type) in [
            ("/dashboard", "text/html; charset=utf-8"),
            ("/dashboard/dashboard.js", "text/javascript; charset=utf-8"),
            ("/dashboard/dashboard.css", "text/css; charset=utf-8"),
        ] {
            let answer = app
                .clone()
                .oneshot(Request::get(path).body(Body::empty()).unwrap())
                .await
                .unwrap();
            assert_eq!(answer.status(), StatusCode::OK, "{path}");
            assert_eq!(answer.headers()[header::CONTENT_TYPE], content_type);
            let policy = answer.headers()[header::CONTENT_SECURITY_POLICY]
                .to_str()
                .unwrap();
            assert!(policy.starts_with("default-src 'none'"), "{policy}");
        }
        // What the page loads, it loads from its own origin.
        for reference in ["http://", "https://", "//"] {
            let outside = format!("=\"{reference}");
            assert!(!PAGE.contains(&outside), "the page refers to {reference}");
        }
    }

    #[derive(Debug)]
    struct Counted(Vec<ClientCount>);

    impl TopClients for Counted {
        fn top_clients(&self) -> Vec<ClientCount> {
            self.0.clone()
        }
    }

    #[tokio::test]
    async fn the_data_route_carries_the_top_clients_of_a_process_that_counts_them() {
        let counted = ClientCount {
            name: "alice".into(),
            entry: 7,
            accepted: 3,
            refused: 2,
        };
        let app = data::<()>(Some(Arc::new(Counted(vec![counted]))));
        let answer = app
            .oneshot(Request::get("/dashboard/data").body(Body::empty()).unwrap())
            .await
            .unwrap();
        let body = axum::body::to_bytes(answer.into_body(), 1 << 20)
            .await
            .unwrap();
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            json["topClients"],
            serde_json::json!([{"name": "alice", "entry": 7, "accepted": 3, "refused": 2}])
        );
    }
}
