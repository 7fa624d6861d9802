//! The Prometheus metrics of a Skyport process: one exposition per process
//! ([`global`]), written as text at `/metrics` by the gateway and the worker.
//!
//! Each component owns its series, as Vector's and linkerd's do: a crate
//! defines them in a `metrics` module of its own, in a registry made by
//! [`component`], and adds that registry here once ([`Metrics::register`]),
//! when the component first starts. This module keeps the series the
//! runtime itself records (HTTP connections and requests) and the few that
//! several crates record under one name: a stream write (each stream
//! adapter) and a dependency's 429 (the worker's services and Cosmos DB).
//!
//! Every series is named `skyport_*`; the help text of each says what it
//! counts. Latencies are in seconds; label values come from small fixed sets
//! (routes, steps, partitions, outcomes), never from request data. A series
//! whose label values are known when its component starts is created then,
//! at 0, so that the first burst after a start shows in `rate()` and
//! `increase()` (Prometheus' instrumentation guide: avoid missing metrics).
//!
//! A scraper that asks for OpenMetrics (Prometheus does by default) gets it;
//! any other gets the Prometheus text format 0.0.4, which differs only in
//! naming a counter's family with its `_total` suffix and having no `# EOF`.

use std::sync::{LazyLock, Mutex, PoisonError};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// The content type of OpenMetrics text.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// The content type of the Prometheus text format.
pub const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The registry every part of this process records into.
pub fn global() -> &'static Metrics {
    static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);
    &METRICS
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HttpLabels {
    /// The route's pattern (`/api/deliveryrequests/{id}`), or `unmatched`.
    pub route: String,
    pub method: &'static str,
    pub status: u16,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    pub route: String,
    pub method: &'static str,
    /// The answer's status class (`2xx`, `4xx`, `5xx`…): a POST's `2xx` is
    /// its 202, so an accepted request's latency is apart from a refusal's.
    /// A status read that was allowed to wait for a change is
    /// [`RouteLabels::HELD`] whatever its status.
    pub class: &'static str,
}

impl RouteLabels {
    /// The class of a status read held waiting for a change (`Prefer:
    /// wait`): its time is the wait it asked for, not the gateway's speed.
    pub const HELD: &'static str = "held";

    /// The class of `status`: `1xx` to `5xx`.
    pub fn class_of(status: u16) -> &'static str {
        match status {
            100..=199 => "1xx",
            200..=299 => "2xx",
            300..=399 => "3xx",
            400..=499 => "4xx",
            _ => "5xx",
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AcceptedLabels {
    /// How the deliveries came: [`AcceptedLabels::POST`] or [`AcceptedLabels::BATCH`].
    pub via: &'static str,
}

impl AcceptedLabels {
    /// A POST of one delivery request (answered 202, or 200 after a wait).
    pub const POST: Self = Self { via: "post" };
    /// An item of a batch.
    pub const BATCH: Self = Self { via: "batch" };
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusedLabels {
    /// The status class of the request's problem: `4xx` or `5xx`.
    pub class: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StreamLabels {
    /// `embedded` or `eventhubs`.
    pub stream: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClosedLabels {
    /// `idle` or `head_timeout`.
    pub reason: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DependencyLabels {
    /// `cosmos`, or the step whose service answered 429.
    pub dependency: &'static str,
}

/// A family of histograms, each made by the same constructor.
pub type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

/// The prefix of every series.
const PREFIX: &str = "skyport";

/// An empty registry for a component's series: its names get the process's
/// `skyport_` prefix. Hand it to [`Metrics::register`] once it holds them.
pub fn component() -> Registry {
    Registry::with_prefix(PREFIX)
}

/// A latency histogram: 0.5 ms to about 16 s.
pub fn latency() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

fn batch_size() -> Histogram {
    // 1 to 8192 events.
    Histogram::new(exponential_buckets(1.0, 2.0, 14))
}

/// What a Skyport process exposes: the runtime's own series and every
/// component's registry.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    components: Mutex<Vec<Registry>>,
    pub http_requests: Family<HttpLabels, Counter>,
    pub http_duration: Histograms<RouteLabels>,
    pub http_connections: Gauge,
    pub http_held: Gauge,
    pub http_connections_closed: Family<ClosedLabels, Counter>,
    pub deliveries_accepted: Family<AcceptedLabels, Counter>,
    pub batch_refused: Family<RefusedLabels, Counter>,
    pub publish_batch_events: Histograms<StreamLabels>,
    pub publish_duration: Histograms<StreamLabels>,
    pub publish_failures: Family<StreamLabels, Counter>,
    pub throttled: Family<DependencyLabels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// The runtime's series, none recorded yet, and no component's.
    pub fn new() -> Self {
        let mut registry = component();
        let http_requests = Family::default();
        registry.register(
            "http_requests",
            "HTTP requests answered, by route, method and status",
            http_requests.clone(),
        );
        let http_duration = Family::new_with_constructor(latency as fn() -> Histogram);
        registry.register(
            "http_request_duration_seconds",
            "Time from an HTTP request's arrival to its answer, by route, method and status class",
            http_duration.clone(),
        );
        let http_connections = Gauge::default();
        registry.register(
            "http_connections",
            "HTTP connections open now on the process's listeners",
            http_connections.clone(),
        );
        let http_held = Gauge::default();
        registry.register(
            "http_held_requests",
            "Requests held now (Prefer: wait): status reads waiting for a change of their delivery and POSTs waiting for its outcome, at most gateway.max_waiting",
            http_held.clone(),
        );
        let http_connections_closed = Family::default();
        registry.register(
            "http_connections_closed",
            "HTTP connections closed by the server for their client's silence: idle too long, or a request head too slow",
            http_connections_closed.clone(),
        );
        let deliveries_accepted = Family::default();
        registry.register(
            "deliveries_accepted",
            "New deliveries made durable by the gateway (a retry that finds its delivery is not counted), by how they came: a POST or an item of a batch",
            deliveries_accepted.clone(),
        );
        let batch_refused = Family::default();
        registry.register(
            "batch_refused",
            "Requests of batches answered with a problem (the batch itself answered 200), by the problem's status class",
            batch_refused.clone(),
        );
        let publish_batch_events = Family::new_with_constructor(batch_size as fn() -> Histogram);
        registry.register(
            "publish_batch_events",
            "Events made durable together in one stream write (group commit or batch send)",
            publish_batch_events.clone(),
        );
        let publish_duration = Family::new_with_constructor(latency as fn() -> Histogram);
        registry.register(
            "publish_batch_duration_seconds",
            "Time one stream write took to become durable",
            publish_duration.clone(),
        );
        let publish_failures = Family::default();
        registry.register(
            "publish_batch_failures",
            "Stream writes that failed (their requests were refused with 503)",
            publish_failures.clone(),
        );
        let throttled = Family::default();
        registry.register(
            "throttled",
            "429 Too Many Requests answers received from a dependency",
            throttled.clone(),
        );
        Self {
            registry,
            components: Mutex::new(Vec::new()),
            http_requests,
            http_duration,
            http_connections,
            http_held,
            http_connections_closed,
            deliveries_accepted,
            batch_refused,
            publish_batch_events,
            publish_duration,
            publish_failures,
            throttled,
        }
    }

    /// Adds a component's series (a registry from [`component`]) to what
    /// this process exposes. Called once per component: a family registered
    /// twice would be written twice.
    pub fn register(&self, registry: Registry) {
        self.components
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(registry);
    }

    /// The gateway's series, at 0 until its first delivery.
    pub fn gateway_started(&self) {
        self.deliveries_accepted
            .get_or_create_owned(&AcceptedLabels::POST);
        self.deliveries_accepted
            .get_or_create_owned(&AcceptedLabels::BATCH);
        for class in ["4xx", "5xx"] {
            self.batch_refused
                .get_or_create_owned(&RefusedLabels { class });
        }
    }

    /// A stream's write series, at 0 until its first write.
    pub fn stream_started(&self, stream: &'static str) {
        let labels = StreamLabels { stream };
        self.publish_batch_events.get_or_create_owned(&labels);
        self.publish_duration.get_or_create_owned(&labels);
        self.publish_failures.get_or_create_owned(&labels);
    }

    /// Every series as OpenMetrics text: the runtime's, then each
    /// component's in the order they were registered.
    pub fn render(&self) -> String {
        use prometheus_client::encoding::text::{encode_eof, encode_registry};
        let mut text = String::with_capacity(16 * 1024);
        let components = self
            .components
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        std::iter::once(&self.registry)
            .chain(components.iter())
            .try_for_each(|registry| encode_registry(&mut text, registry))
            .and_then(|()| encode_eof(&mut text))
            .unwrap_or_else(|e| unreachable!("writing to a String cannot fail: {e}"));
        text
    }

    /// What `/metrics` answers a scraper whose `Accept` header is `accept`:
    /// the content type and the text.
    pub fn exposition(&self, accept: Option<&str>) -> (&'static str, String) {
        let text = self.render();
        if accept.is_some_and(|a| a.contains("application/openmetrics-text")) {
            (OPENMETRICS, text)
        } else {
            (PROMETHEUS_TEXT, prometheus_text(&text))
        }
    }

    /// A dependency answered 429.
    pub fn throttled_by(&self, dependency: &'static str) {
        self.throttled
            .get_or_create(&DependencyLabels { dependency })
            .inc();
    }

    /// One stream write of `events` events that took `seconds`.
    pub fn published(&self, stream: &'static str, events: usize, seconds: f64) {
        let labels = StreamLabels { stream };
        self.publish_batch_events
            .get_or_create(&labels)
            .observe(events as f64);
        self.publish_duration
            .get_or_create(&labels)
            .observe(seconds);
    }
}

/// OpenMetrics `text` in the Prometheus text format: a counter family `x`
/// (samples `x_total`) is described as `x_total`, and `# EOF` goes.
fn prometheus_text(text: &str) -> String {
    let counters: std::collections::HashSet<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(text.len() + 16 * counters.len());
    for line in text.lines() {
        if line == "# EOF" {
            continue;
        }
        let described = ["# HELP ", "# TYPE "]
            .into_iter()
            .find_map(|prefix| Some((prefix, line.strip_prefix(prefix)?)));
        match described {
            Some((prefix, rest)) => {
                let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
                if counters.contains(name) {
                    out.push_str(&format!("{prefix}{name}_total {tail}"));
                } else {
                    out.push_str(line);
                }
            }
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recorded_series_appear_in_both_formats() {
        let metrics = Metrics::new();
        metrics.published("embedded", 12, 0.004);
        metrics.throttled_by("cosmos");
        let text = metrics.render();
        for name in [
            "skyport_publish_batch_events",
            "skyport_throttled",
            "skyport_http_connections",
        ] {
            assert!(
                text.contains(&format!("# TYPE {name} ")),
                "{name} in\n{text}"
            );
        }
        // A labelled family appears with its first series.
        assert!(!text.contains("skyport_http_requests"), "{text}");
        assert!(text.contains("skyport_publish_batch_events_count{stream=\"embedded\"} 1"));
        assert!(text.contains("skyport_throttled_total{dependency=\"cosmos\"} 1"));
        assert!(text.ends_with("# EOF\n"));
        let (content_type, prometheus) = metrics.exposition(Some("text/plain"));
        assert_eq!(content_type, PROMETHEUS_TEXT);
        assert!(prometheus.contains("# TYPE skyport_throttled_total counter\n"));
        assert!(prometheus.contains("# HELP skyport_throttled_total 429 Too Many"));
        assert!(prometheus.contains("# TYPE skyport_http_connections gauge\n"));
        assert!(!prometheus.contains("# EOF"));
        let (content_type, openmetrics) = metrics.exposition(Some(
            "application/openmetrics-text;version=1.0.0,text/plain;q=0.5",
        ));
        assert_eq!(content_type, OPENMETRICS);
        assert!(openmetrics.contains("# TYPE skyport_throttled counter\n"));
    }

    #[test]
    fn a_components_series_are_written_after_the_runtimes_with_one_eof() {
        let metrics = Metrics::new();
        let mut registry = component();
        let gauge: Gauge = Gauge::default();
        registry.register("component_gauge", "A component's own series", gauge.clone());
        gauge.set(7);
        metrics.register(registry);
        let text = metrics.render();
        assert!(
            text.contains("# TYPE skyport_component_gauge gauge\nskyport_component_gauge 7\n"),
            "{text}"
        );
        assert!(
            text.find("skyport_http_connections") < text.find("skyport_component_gauge"),
            "{text}"
        );
        assert_eq!(text.matches("# EOF").count(), 1, "{text}");
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn a_started_stream_shows_its_write_series_at_zero() {
        let metrics = Metrics::new();
        metrics.stream_started("kafka");
        let text = metrics.render();
        assert!(
            text.contains("skyport_publish_batch_events_count{stream=\"kafka\"} 0"),
            "{text}"
        );
        assert!(
            text.contains("skyport_publish_batch_failures_total{stream=\"kafka\"} 0"),
            "{text}"
        );
    }
}
