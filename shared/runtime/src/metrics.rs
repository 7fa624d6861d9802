//! The Prometheus metrics of a Skyport process: one registry per process
//! ([`global`]), written as text at `/metrics` by the gateway and the worker.
//!
//! Every series is named `skyport_*`; the help text of each says what it
//! counts. Latencies are in seconds; label values come from small fixed sets
//! (routes, steps, partitions, outcomes), never from request data.
//!
//! A scraper that asks for OpenMetrics (Prometheus does by default) gets it;
//! any other gets the Prometheus text format 0.0.4, which differs only in
//! naming a counter's family with its `_total` suffix and having no `# EOF`.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::Instant;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
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
    pub class: &'static str,
}

impl RouteLabels {
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
pub struct StreamLabels {
    /// `embedded` or `eventhubs`.
    pub stream: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PartitionLabels {
    pub partition: u32,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StepLabels {
    pub step: &'static str,
    /// `ok`, `transient` or `permanent`: how one call ended.
    pub result: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StepErrorLabels {
    pub step: &'static str,
    /// `transient` (retried), `permanent` (refused) or `retries_exhausted`.
    pub kind: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClosedLabels {
    /// `idle` or `head_timeout`.
    pub reason: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ServiceLabels {
    pub step: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DependencyLabels {
    /// `cosmos`, or the step whose service answered 429.
    pub dependency: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OperationLabels {
    /// What the request units were spent on: `read`, `write`, `query` or `delete`.
    pub operation: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GroupLabels {
    /// A Cosmos DB throughput control group, as configured.
    pub group: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// `scheduled`, `failed`, `cancelled`, `cancel_requested`, `already_terminal`,
    /// `dead_lettered` or `abandoned`.
    pub outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LeaseLabels {
    /// A change-feed processor's lease: `range.{min}-{max}` of its feed range.
    pub lease: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallbackLabels {
    /// `delivered`, `retried` (an attempt that will be tried again),
    /// `refused` (a permanent answer or a refused destination) or `dead_lettered`.
    pub outcome: &'static str,
}

/// A breaker's state as a number, for `skyport_breaker_state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    Closed = 0,
    HalfOpen = 1,
    Open = 2,
}

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

fn latency() -> Histogram {
    // 0.5 ms to about 16 s.
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

fn batch_size() -> Histogram {
    // 1 to 8192 events.
    Histogram::new(exponential_buckets(1.0, 2.0, 14))
}

/// Every series of a Skyport process.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    pub http_requests: Family<HttpLabels, Counter>,
    pub http_duration: Histograms<RouteLabels>,
    pub http_connections: Gauge,
    pub http_connections_closed: Family<ClosedLabels, Counter>,
    pub publish_batch_events: Histograms<StreamLabels>,
    pub publish_duration: Histograms<StreamLabels>,
    pub publish_failures: Family<StreamLabels, Counter>,
    pub consumer_lag: Family<PartitionLabels, Gauge>,
    pub events_in_flight: Family<PartitionLabels, Gauge>,
    pub consumer_rewinds: Family<PartitionLabels, Counter>,
    pub worker_window: Gauge,
    pub step_duration: Histograms<StepLabels>,
    pub step_errors: Family<StepErrorLabels, Counter>,
    pub breaker_state: Family<ServiceLabels, Gauge>,
    pub throttled: Family<DependencyLabels, Counter>,
    pub request_units: Family<OperationLabels, Counter<f64, AtomicU64>>,
    pub group_budget: Family<GroupLabels, Gauge<f64, AtomicU64>>,
    pub group_allocated: Family<GroupLabels, Gauge<f64, AtomicU64>>,
    pub group_share: Family<GroupLabels, Gauge<f64, AtomicU64>>,
    pub group_load_factor: Family<GroupLabels, Gauge<f64, AtomicU64>>,
    pub group_request_units: Family<GroupLabels, Counter<f64, AtomicU64>>,
    pub group_delayed: Family<GroupLabels, Counter>,
    pub group_throttled: Family<GroupLabels, Counter>,
    pub workflow_events: Family<OutcomeLabels, Counter>,
    pub replays: Counter,
    pub change_feed_lag: Family<LeaseLabels, Gauge>,
    pub change_feed_leases: Gauge,
    pub change_feed_handler_errors: Counter,
    pub callbacks: Family<CallbackLabels, Counter>,
    pub callback_duration: Histogram,
    checkpoints: Arc<CheckpointAges>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A registry holding every series, none recorded yet.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("skyport");
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
        let http_connections_closed = Family::default();
        registry.register(
            "http_connections_closed",
            "HTTP connections closed by the server for their client's silence: idle too long, or a request head too slow",
            http_connections_closed.clone(),
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
        let consumer_lag = Family::default();
        registry.register(
            "consumer_lag_events",
            "Events in a partition after the last one this worker completed in order",
            consumer_lag.clone(),
        );
        let events_in_flight = Family::default();
        registry.register(
            "events_in_flight",
            "Events of a partition pulled and not yet completed",
            events_in_flight.clone(),
        );
        let consumer_rewinds = Family::default();
        registry.register(
            "consumer_rewinds",
            "Times a partition was read again from an event handed back to the stream (a nack)",
            consumer_rewinds.clone(),
        );
        let worker_window = Gauge::default();
        registry.register(
            "worker_window",
            "Events each partition may have in flight now (worker.max_in_flight, narrowed while a gateway in the same process answers slower than worker.gateway_latency_goal_ms)",
            worker_window.clone(),
        );
        let step_duration = Family::new_with_constructor(latency as fn() -> Histogram);
        registry.register(
            "step_call_duration_seconds",
            "One call of a workflow step to its service, by how it ended",
            step_duration.clone(),
        );
        let step_errors = Family::default();
        registry.register(
            "step_errors",
            "Failed calls of a workflow step, by kind",
            step_errors.clone(),
        );
        let breaker_state = Family::default();
        registry.register(
            "breaker_state",
            "Circuit breaker of a step's service: 0 closed, 1 half-open (probing), 2 open",
            breaker_state.clone(),
        );
        let throttled = Family::default();
        registry.register(
            "throttled",
            "429 Too Many Requests answers received from a dependency",
            throttled.clone(),
        );
        let request_units = Family::default();
        registry.register(
            "cosmos_request_units",
            "Cosmos DB request units charged, by operation",
            request_units.clone(),
        );
        let group_budget = Family::default();
        registry.register(
            "throughput_group_budget_ru_per_s",
            "A throughput control group's budget: its target, or its fraction of the container's offer",
            group_budget.clone(),
        );
        let group_allocated = Family::default();
        registry.register(
            "throughput_group_allocated_ru_per_s",
            "The part of a group's budget this process may spend each second",
            group_allocated.clone(),
        );
        let group_share = Family::default();
        registry.register(
            "throughput_group_share",
            "This process's share of a global group's budget (1 for a local group)",
            group_share.clone(),
        );
        let group_load_factor = Family::default();
        registry.register(
            "throughput_group_load_factor",
            "How much of its allocation this process used over the last renewal (at least 0.1)",
            group_load_factor.clone(),
        );
        let group_request_units = Family::default();
        registry.register(
            "throughput_group_request_units",
            "Request units charged to a group (errors included)",
            group_request_units.clone(),
        );
        let group_delayed = Family::default();
        registry.register(
            "throughput_group_delayed",
            "Requests a group held until a later cycle had budget",
            group_delayed.clone(),
        );
        let group_throttled = Family::default();
        registry.register(
            "throughput_group_throttled",
            "Requests a group refused at once (its budget spent; not the service's own 429s)",
            group_throttled.clone(),
        );
        let workflow_events = Family::default();
        registry.register(
            "workflow_events",
            "Events the workflow finished, by outcome",
            workflow_events.clone(),
        );
        let replays = Counter::default();
        registry.register(
            "workflow_replays",
            "Delivery events read again after an earlier attempt had begun them (retries after a crash, a rebalance or a republish)",
            replays.clone(),
        );
        let change_feed_lag = Family::default();
        registry.register(
            "change_feed_lag_events",
            "Changes of a change-feed lease not handled yet (the estimator's count, from the store's sequence numbers)",
            change_feed_lag.clone(),
        );
        let change_feed_leases = Gauge::default();
        registry.register(
            "change_feed_leases_owned",
            "Change-feed leases this instance owns now",
            change_feed_leases.clone(),
        );
        let change_feed_handler_errors = Counter::default();
        registry.register(
            "change_feed_handler_errors",
            "Batches of changes a handler failed on (each handed over again from the last checkpoint)",
            change_feed_handler_errors.clone(),
        );
        let callbacks = Family::default();
        registry.register("callbacks", "Callback POSTs, by outcome", callbacks.clone());
        let callback_duration = latency();
        registry.register(
            "callback_duration_seconds",
            "Time one callback POST took, to its answer or its error",
            callback_duration.clone(),
        );
        let checkpoints = Arc::new(CheckpointAges::default());
        registry.register_collector(Box::new(Arc::clone(&checkpoints)));
        Self {
            registry,
            http_requests,
            http_duration,
            http_connections,
            http_connections_closed,
            publish_batch_events,
            publish_duration,
            publish_failures,
            consumer_lag,
            events_in_flight,
            consumer_rewinds,
            worker_window,
            step_duration,
            step_errors,
            breaker_state,
            throttled,
            request_units,
            group_budget,
            group_allocated,
            group_share,
            group_load_factor,
            group_request_units,
            group_delayed,
            group_throttled,
            workflow_events,
            replays,
            change_feed_lag,
            change_feed_leases,
            change_feed_handler_errors,
            callbacks,
            callback_duration,
            checkpoints,
        }
    }

    /// Every series as OpenMetrics text.
    pub fn render(&self) -> String {
        let mut text = String::with_capacity(16 * 1024);
        prometheus_client::encoding::text::encode(&mut text, &self.registry)
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

    /// A partition began here: its checkpoint age counts from now.
    pub fn partition_assigned(&self, partition: u32) {
        self.checkpoints.lock().insert(partition, Instant::now());
    }

    /// `partition` wrote a checkpoint.
    pub fn checkpointed(&self, partition: u32) {
        self.checkpoints.lock().insert(partition, Instant::now());
    }

    /// `partition` is no longer read here: its series go.
    pub fn partition_released(&self, partition: u32) {
        self.checkpoints.lock().remove(&partition);
        let labels = PartitionLabels { partition };
        self.consumer_lag.remove(&labels);
        self.events_in_flight.remove(&labels);
    }

    /// The state of a step's circuit breaker.
    pub fn breaker(&self, step: &'static str, state: BreakerState) {
        self.breaker_state
            .get_or_create(&ServiceLabels { step })
            .set(state as i64);
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

/// When each partition read here last checkpointed; its age is taken at scrape time, so a
/// partition whose checkpoints have stopped shows a growing age.
#[derive(Debug, Default)]
struct CheckpointAges(Mutex<BTreeMap<u32, Instant>>);

impl CheckpointAges {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u32, Instant>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Collector for CheckpointAges {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let ages: Vec<(u32, f64)> = self
            .lock()
            .iter()
            .map(|(partition, at)| (*partition, at.elapsed().as_secs_f64()))
            .collect();
        let mut metric = encoder.encode_descriptor(
            "checkpoint_age_seconds",
            "Time since a partition's last checkpoint (or since it was assigned, before its first)",
            None,
            MetricType::Gauge,
        )?;
        for (partition, age) in ages {
            let labels = PartitionLabels { partition };
            ConstGauge::new(age).encode(metric.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recorded_series_appear_in_both_formats() {
        let metrics = Metrics::new();
        metrics.published("embedded", 12, 0.004);
        metrics.partition_assigned(3);
        metrics.breaker("Account", BreakerState::Open);
        metrics.throttled_by("cosmos");
        let text = metrics.render();
        for name in [
            "skyport_publish_batch_events",
            "skyport_checkpoint_age_seconds",
            "skyport_breaker_state",
            "skyport_throttled",
            "skyport_workflow_replays",
        ] {
            assert!(
                text.contains(&format!("# TYPE {name} ")),
                "{name} in\n{text}"
            );
        }
        // A labelled family appears with its first series.
        assert!(!text.contains("skyport_http_requests"), "{text}");
        assert!(text.contains("skyport_publish_batch_events_count{stream=\"embedded\"} 1"));
        assert!(text.contains("skyport_breaker_state{step=\"Account\"} 2"));
        assert!(text.contains("skyport_throttled_total{dependency=\"cosmos\"} 1"));
        assert!(text.contains("skyport_checkpoint_age_seconds{partition=\"3\"} "));
        assert!(text.ends_with("# EOF\n"));
        let (content_type, prometheus) = metrics.exposition(Some("text/plain"));
        assert_eq!(content_type, PROMETHEUS_TEXT);
        assert!(prometheus.contains("# TYPE skyport_throttled_total counter\n"));
        assert!(prometheus.contains("# HELP skyport_throttled_total 429 Too Many"));
        assert!(prometheus.contains("# TYPE skyport_breaker_state gauge\n"));
        assert!(!prometheus.contains("# EOF"));
        let (content_type, openmetrics) = metrics.exposition(Some(
            "application/openmetrics-text;version=1.0.0,text/plain;q=0.5",
        ));
        assert_eq!(content_type, OPENMETRICS);
        assert!(openmetrics.contains("# TYPE skyport_throttled counter\n"));
        metrics.partition_released(3);
        assert!(!metrics.render().contains("partition=\"3\""));
    }
}
