//! The worker's Prometheus series: partitions (lag, in flight, rewinds,
//! checkpoint age, each with its lane), the intake window, each step's
//! calls and breaker, the workflow's outcomes, and each lane's time from
//! acceptance to a terminal state. Registered in the process's exposition
//! (`skyport_runtime::metrics`) the first time [`global`] is read; the
//! series whose labels are known then (every step's results and errors,
//! every outcome) start at 0.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use skyport_core::status::Step;
use skyport_runtime::metrics::{self, Histograms, latency};
use time::OffsetDateTime;

/// The worker's series, registered once per process.
pub fn global() -> &'static WorkerMetrics {
    static METRICS: LazyLock<WorkerMetrics> =
        LazyLock::new(|| WorkerMetrics::registered_in(metrics::global()));
    &METRICS
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PartitionLabels {
    /// `normal` or `expedited`.
    pub lane: &'static str,
    pub partition: u32,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LaneLabels {
    /// `normal` or `expedited`.
    pub lane: &'static str,
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
pub struct ServiceLabels {
    pub step: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// One of [`OUTCOMES`].
    pub outcome: &'static str,
}

/// How the workflow can finish an event.
pub const OUTCOMES: [&str; 10] = [
    "scheduled",
    "failed",
    "cancelled",
    "cancel_requested",
    "waiting",
    "not_due",
    "already_terminal",
    "dead_lettered",
    "abandoned",
    "nacked",
];

/// A breaker's state as a number, for `skyport_breaker_state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    Closed = 0,
    HalfOpen = 1,
    Open = 2,
}

/// 5 ms to about 3 minutes: a delivery waits out the backlog ahead of it.
fn until_terminal() -> Histogram {
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
        0.005, 2.0, 16,
    ))
}

/// Every series of the worker.
#[derive(Debug)]
pub struct WorkerMetrics {
    pub consumer_lag: Family<PartitionLabels, Gauge>,
    pub events_in_flight: Family<PartitionLabels, Gauge>,
    pub consumer_rewinds: Family<PartitionLabels, Counter>,
    pub worker_window: Gauge,
    /// Events read and not completed over the worker's partition loops
    /// (kept by the backlog guard's entries).
    pub worker_pending_events: Gauge,
    pub step_duration: Histograms<StepLabels>,
    pub time_to_terminal: Histograms<LaneLabels>,
    pub step_errors: Family<StepErrorLabels, Counter>,
    pub breaker_state: Family<ServiceLabels, Gauge>,
    pub workflow_events: Family<OutcomeLabels, Counter>,
    pub replays: Counter,
    /// Redrives read, by whether their epoch `began` (or had) or they were `skipped`.
    pub redrives: Family<OutcomeLabels, Counter>,
    /// Deliveries Waiting now, as the timer task last read them.
    pub timers_waiting: Gauge,
    pub timers_fired: Counter,
    pub timer_lateness: Histogram,
    /// The partitions read here, for their checkpoint age and their loops.
    partitions: Arc<CheckpointAges>,
}

impl WorkerMetrics {
    /// The worker's series, registered in `exposition`, those with known
    /// labels at 0.
    pub fn registered_in(exposition: &metrics::Metrics) -> Self {
        let mut registry = metrics::component();
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
            "Events each partition may have in flight now (worker.max_in_flight, narrowed while the 202s of a gateway in the same process are slower than gateway.latency_objective_ms at p99)",
            worker_window.clone(),
        );
        let worker_pending_events = Gauge::default();
        registry.register(
            "worker_pending_events",
            "Events read and not yet completed over the worker's partitions, as its loops last reported them: what worker.allow_backlog_of limits",
            worker_pending_events.clone(),
        );
        let step_duration = Family::new_with_constructor(latency as fn() -> Histogram);
        registry.register(
            "step_call_duration_seconds",
            "One call of a workflow step to its service, by how it ended",
            step_duration.clone(),
        );
        let time_to_terminal = Family::new_with_constructor(until_terminal as fn() -> Histogram);
        registry.register(
            "delivery_time_to_terminal_seconds",
            "From a delivery's acceptance to the worker's write of its terminal state (Scheduled or Failed), by lane",
            time_to_terminal.clone(),
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
        let redrives = Family::default();
        registry.register(
            "redrives",
            "Redrives (delivery requests of a later attempt epoch) read, by whether their epoch began or they were skipped",
            redrives.clone(),
        );
        let timers_waiting = Gauge::default();
        registry.register(
            "timers_waiting",
            "Deliveries Waiting for their time to book (worker.booking_lead_s before their pickup), as this worker's timer task last read them",
            timers_waiting.clone(),
        );
        let timers_fired = Counter::default();
        registry.register(
            "timers_fired",
            "Timers of Waiting deliveries fired: a DeliveryDue published for each (again after a restart, or after 10 minutes without its delivery starting)",
            timers_fired.clone(),
        );
        let timer_lateness = latency();
        registry.register(
            "timer_lateness_seconds",
            "From a Waiting delivery's runsAt to its timer's fire",
            timer_lateness.clone(),
        );
        let partitions = Arc::new(CheckpointAges::default());
        registry.register_collector(Box::new(Arc::clone(&partitions)));
        exposition.register(registry);
        let worker = Self {
            consumer_lag,
            events_in_flight,
            consumer_rewinds,
            worker_window,
            worker_pending_events,
            step_duration,
            time_to_terminal,
            step_errors,
            breaker_state,
            workflow_events,
            replays,
            redrives,
            timers_waiting,
            timers_fired,
            timer_lateness,
            partitions,
        };
        worker.start_at_zero();
        worker
    }

    /// Creates the series whose labels are known before anything happens.
    fn start_at_zero(&self) {
        for step in Step::ALL.map(Step::as_str) {
            for result in ["ok", "transient", "permanent"] {
                self.step_duration
                    .get_or_create_owned(&StepLabels { step, result });
            }
            for kind in ["transient", "permanent", "retries_exhausted"] {
                self.step_errors
                    .get_or_create_owned(&StepErrorLabels { step, kind });
            }
        }
        for lane in ["normal", "expedited"] {
            self.time_to_terminal
                .get_or_create_owned(&LaneLabels { lane });
        }
        for outcome in OUTCOMES {
            self.workflow_events
                .get_or_create_owned(&OutcomeLabels { outcome });
        }
        for outcome in ["began", "skipped"] {
            self.redrives
                .get_or_create_owned(&OutcomeLabels { outcome });
        }
    }

    /// A partition began here: its series exist, and its checkpoint age
    /// counts from now, until the last of its loops here lets go of what
    /// this returns. A worker that wins a partition back while the loop
    /// that lost it still drains runs two loops of it for a while; the
    /// first to end must not take the other's series with it.
    pub fn partition_read(&self, labels: &PartitionLabels) -> PartitionSeries<'_> {
        let mut partitions = self.partitions.lock();
        let read = partitions.entry(labels.partition).or_insert(Read {
            lane: labels.lane,
            at: Instant::now(),
            oldest_accepted_ms: Arc::new(AtomicI64::new(NONE_IN_FLIGHT)),
            loops: 0,
        });
        read.loops += 1;
        read.at = Instant::now();
        PartitionSeries {
            metrics: self,
            labels: labels.clone(),
            oldest_accepted_ms: Arc::clone(&read.oldest_accepted_ms),
        }
    }

    /// `partition` wrote a checkpoint.
    pub fn checkpointed(&self, partition: u32) {
        if let Some(read) = self.partitions.lock().get_mut(&partition) {
            read.at = Instant::now();
        }
    }

    /// The state of a step's circuit breaker.
    pub fn breaker(&self, step: &'static str, state: BreakerState) {
        self.breaker_state
            .get_or_create(&ServiceLabels { step })
            .set(state as i64);
    }
}

/// A partition loop's hold on its partition's series; see
/// [`WorkerMetrics::partition_read`].
#[derive(Debug)]
pub struct PartitionSeries<'a> {
    metrics: &'a WorkerMetrics,
    labels: PartitionLabels,
    /// The partition's [`Read::oldest_accepted_ms`].
    oldest_accepted_ms: Arc<AtomicI64>,
}

impl PartitionSeries<'_> {
    /// When the gateway accepted the oldest event of the partition read
    /// and not completed (Unix milliseconds), or `None` when there is none.
    pub fn oldest_accepted(&self, unix_ms: Option<i64>) {
        self.oldest_accepted_ms
            .store(unix_ms.unwrap_or(NONE_IN_FLIGHT), Ordering::Relaxed);
    }
}

/// `at` in Unix milliseconds, as [`PartitionSeries::oldest_accepted`] takes it.
pub fn unix_ms(at: OffsetDateTime) -> i64 {
    i64::try_from(at.unix_timestamp_nanos() / 1_000_000).unwrap_or(i64::MAX)
}

/// [`Read::oldest_accepted_ms`] when no event is in flight.
const NONE_IN_FLIGHT: i64 = i64::MIN;

impl Drop for PartitionSeries<'_> {
    /// The partition's last loop here ended: its series go.
    fn drop(&mut self) {
        let mut partitions = self.metrics.partitions.lock();
        let Some(read) = partitions.get_mut(&self.labels.partition) else {
            return;
        };
        read.loops -= 1;
        if read.loops == 0 {
            partitions.remove(&self.labels.partition);
            self.metrics.consumer_lag.remove(&self.labels);
            self.metrics.events_in_flight.remove(&self.labels);
        }
    }
}

/// A partition read here: its lane, when it last checkpointed (or began),
/// when the oldest event it holds was accepted, and how many of its loops
/// run here.
#[derive(Debug)]
struct Read {
    lane: &'static str,
    at: Instant,
    /// Unix milliseconds, or [`NONE_IN_FLIGHT`]; set by the partition's
    /// loop as events come and go, read at scrape time.
    oldest_accepted_ms: Arc<AtomicI64>,
    loops: usize,
}

impl Read {
    /// The age of the oldest event read and not completed, at `now_ms`
    /// (Unix milliseconds): 0 when there is none.
    fn oldest_event_age(&self, now_ms: i64) -> f64 {
        match self.oldest_accepted_ms.load(Ordering::Relaxed) {
            NONE_IN_FLIGHT => 0.0,
            accepted => (now_ms.saturating_sub(accepted).max(0) as f64) / 1_000.0,
        }
    }
}

/// When each partition read here last checkpointed, and when its oldest event in flight was
/// accepted; both ages are taken at scrape time, so a partition whose checkpoints have stopped,
/// or whose oldest event is stuck, shows a growing age.
#[derive(Debug, Default)]
struct CheckpointAges(Mutex<BTreeMap<u32, Read>>);

impl CheckpointAges {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<u32, Read>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Collector for CheckpointAges {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let now_ms = unix_ms(OffsetDateTime::now_utc());
        let ages: Vec<(PartitionLabels, f64, f64)> = self
            .lock()
            .iter()
            .map(|(partition, read)| {
                let labels = PartitionLabels {
                    lane: read.lane,
                    partition: *partition,
                };
                (
                    labels,
                    read.at.elapsed().as_secs_f64(),
                    read.oldest_event_age(now_ms),
                )
            })
            .collect();
        let mut metric = encoder.encode_descriptor(
            "checkpoint_age_seconds",
            "Time since a partition's last checkpoint (or since it was assigned, before its first)",
            None,
            MetricType::Gauge,
        )?;
        for (labels, age, _) in &ages {
            ConstGauge::new(*age).encode(metric.encode_family(labels)?)?;
        }
        let mut metric = encoder.encode_descriptor(
            "consumer_oldest_event_age_seconds",
            "Age, from its acceptance at the gateway, of the oldest event of a partition read and not yet completed (0 when none)",
            None,
            MetricType::Gauge,
        )?;
        for (labels, _, age) in &ages {
            ConstGauge::new(*age).encode(metric.encode_family(labels)?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_workers_series_are_exposed_with_known_labels_at_zero() {
        let exposition = metrics::Metrics::new();
        let worker = WorkerMetrics::registered_in(&exposition);
        let read = worker.partition_read(&PartitionLabels {
            lane: "normal",
            partition: 3,
        });
        worker.breaker("drone", BreakerState::Open);
        let text = exposition.render();
        assert!(
            text.contains("skyport_step_errors_total{step=\"drone\",kind=\"retries_exhausted\"} 0"),
            "{text}"
        );
        assert!(
            text.contains(
                "skyport_step_call_duration_seconds_count{step=\"account\",result=\"ok\"} 0"
            ),
            "{text}"
        );
        for outcome in OUTCOMES {
            assert!(
                text.contains(&format!(
                    "skyport_workflow_events_total{{outcome=\"{outcome}\"}} 0"
                )),
                "{outcome} in {text}"
            );
        }
        assert!(
            text.contains("skyport_breaker_state{step=\"drone\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("skyport_checkpoint_age_seconds{lane=\"normal\",partition=\"3\"} "),
            "{text}"
        );
        drop(read);
        assert!(!exposition.render().contains("partition=\"3\""));
    }

    /// The value of the one sample of `series` in `text`.
    fn sample(text: &str, series: &str) -> f64 {
        let line = text
            .lines()
            .find(|line| line.starts_with(series))
            .unwrap_or_else(|| panic!("no {series} in {text}"));
        line[series.len()..]
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("{line}: {e}"))
    }

    #[test]
    fn the_oldest_events_age_runs_from_its_acceptance_until_none_is_in_flight() {
        let exposition = metrics::Metrics::new();
        let worker = WorkerMetrics::registered_in(&exposition);
        let read = worker.partition_read(&PartitionLabels {
            lane: "expedited",
            partition: 5,
        });
        let series =
            "skyport_consumer_oldest_event_age_seconds{lane=\"expedited\",partition=\"5\"}";
        assert_eq!(sample(&exposition.render(), series), 0.0);
        let now_ms = unix_ms(OffsetDateTime::now_utc());
        read.oldest_accepted(Some(now_ms - 90_000));
        let age = sample(&exposition.render(), series);
        assert!((90.0..100.0).contains(&age), "{age}");
        read.oldest_accepted(Some(now_ms + 60_000));
        assert_eq!(sample(&exposition.render(), series), 0.0, "a clock ahead");
        read.oldest_accepted(None);
        assert_eq!(sample(&exposition.render(), series), 0.0);
    }

    #[test]
    fn a_partitions_series_stay_while_any_of_its_loops_runs() {
        let exposition = metrics::Metrics::new();
        let worker = WorkerMetrics::registered_in(&exposition);
        let labels = PartitionLabels {
            lane: "normal",
            partition: 5,
        };
        let draining = worker.partition_read(&labels);
        worker.events_in_flight.get_or_create(&labels).set(7);
        let won_back = worker.partition_read(&labels);
        drop(draining);
        let text = exposition.render();
        assert!(
            text.contains("skyport_events_in_flight{lane=\"normal\",partition=\"5\"} 7"),
            "{text}"
        );
        assert!(
            text.contains("skyport_checkpoint_age_seconds{lane=\"normal\",partition=\"5\"} "),
            "{text}"
        );
        drop(won_back);
        assert!(!exposition.render().contains("partition=\"5\""));
    }
}
