//! `[worker]`: the worker that runs the workflow.

use std::net::SocketAddr;

use serde::Deserialize;

use super::checks::Checks;
use super::duration::{Millis, Seconds};
use super::http::HttpSettings;

/// The worker that runs the workflow.
#[derive(Debug, Clone, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields)]
pub struct WorkerSettings {
    /// Where `skyport-worker` serves `/healthz`, `/readyz` and `/metrics`.
    pub listen: SocketAddr,
    /// Consumer group whose checkpoints this worker keeps.
    pub consumer_group: String,
    /// Delivery requests processed at once per partition (cancellations and
    /// reschedules start as they are read, within `read_ahead`).
    pub max_in_flight: usize,
    /// Events read per partition past its checkpoint before they finish:
    /// the requests among them wait for a slot of `max_in_flight` and start
    /// in turn over their clients, so that one client's burst holds another
    /// client's delivery back by at most this many events. At least
    /// `max_in_flight`.
    pub read_ahead: usize,
    /// How often each partition's checkpoint is written.
    pub checkpoint_interval_ms: Millis,
    /// How long in-flight events may take to finish after a shutdown signal.
    pub shutdown_grace_period_ms: Millis,
    /// Events started per second by this worker; 0 turns the limit off.
    pub rate_limit_per_s: u32,
    /// Redrives (deliveries of a later attempt epoch) started per second by
    /// this worker, within `rate_limit_per_s`; 0 turns the limit off.
    pub redrive_per_s: u32,
    /// Most events pending (pulled, not completed) before intake pauses.
    pub allow_backlog_of: usize,
    /// Oldest age a pending event may reach before intake pauses.
    pub allow_backlog_to_ms: Millis,
    /// How long a backlog breach may last before the worker exits to be restarted.
    pub backlog_grace_period_ms: Millis,
    /// Failures in a row of one status or dead-letter write after which the
    /// event is handed back to the stream (a nack) and read again from there
    /// (a Kafka seek), instead of waiting once more; 0 waits until the store
    /// answers.
    pub redeliver_after_failures: u32,
    /// What the admin listener allows a connection (timeouts, head size, connections).
    pub http: HttpSettings,
    /// Whether the admin listener serves the operators' page at `/dashboard`.
    /// Unset: the profile's (embedded and kafka → on, azure → off).
    pub dashboard: Option<bool>,
    /// The OS scheduling niceness (0 to 19) of the worker's threads. Above 0
    /// the worker yields the CPU to a gateway beside it (in the all-in-one,
    /// or on a shared node), so a spike is accepted at the gateway's rate and
    /// drained afterwards; with the CPU otherwise idle it costs nothing.
    pub nice: i32,
    /// Not a key any more: refused with a message naming
    /// `gateway.latency_objective_ms`, which took its place.
    #[cfg_attr(test, schemars(skip))]
    pub gateway_latency_goal_ms: Option<Millis>,
    /// A delivery still running this long after it started is marked
    /// Processing in its status document; one that ends sooner is written
    /// once, with its terminal status (one durable write instead of two).
    /// 0 marks every delivery Processing before its first step.
    pub processing_after_ms: Millis,
    /// How long before its pickup a delivery books its drone and services.
    /// A delivery whose pickup is further away is recorded Waiting, and its
    /// steps run `booking_lead_s` before its pickup, from a timer the
    /// status store keeps. Unset: every delivery books when it is read.
    pub booking_lead_s: Option<Seconds>,
    /// The timers' shards are shared out among the workers through leases
    /// (in the store's lease container): a shard whose owner has not renewed
    /// its lease for this long is taken by another worker. Renewed every
    /// quarter of it.
    pub timer_lease_expiry_ms: Millis,
    /// How often the holder of a timer shard reads its due timers: the
    /// lateness of a fire, against one read a shard each time (on Cosmos DB,
    /// a query's request units, even when nothing is due).
    pub timer_poll_ms: Millis,
}

impl Default for WorkerSettings {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 9090)),
            consumer_group: "skyport-worker".into(),
            // 1,024 at once over 8 partitions: enough for 10,000 workflows/s of
            // 100 ms, and half the memory of 256 for the same rate (BENCHMARKS.md).
            max_in_flight: 128,
            // Four windows: 4,096 events over 8 partitions, about 4 MiB.
            read_ahead: 512,
            checkpoint_interval_ms: Millis::new(5_000),
            shutdown_grace_period_ms: Millis::new(30_000),
            rate_limit_per_s: 0,
            redrive_per_s: 100,
            allow_backlog_of: 320_000,
            allow_backlog_to_ms: Millis::new(600_000),
            backlog_grace_period_ms: Millis::new(60_000),
            redeliver_after_failures: 20,
            http: HttpSettings::default(),
            dashboard: None,
            nice: 10,
            gateway_latency_goal_ms: None,
            processing_after_ms: Millis::new(1_000),
            booking_lead_s: None,
            timer_lease_expiry_ms: Millis::new(20_000),
            timer_poll_ms: Millis::new(100),
        }
    }
}

impl WorkerSettings {
    pub(super) fn validate(&self, checks: &mut Checks<'_>) {
        checks.check(
            !self.consumer_group.trim().is_empty(),
            "consumer_group",
            "must not be empty",
        );
        checks.at_least(self.max_in_flight, 1, "max_in_flight");
        checks.check(
            self.read_ahead >= self.max_in_flight,
            "read_ahead",
            "must be at least worker.max_in_flight",
        );
        checks.at_least(
            self.checkpoint_interval_ms.count(),
            10,
            "checkpoint_interval_ms",
        );
        checks.at_least(self.allow_backlog_of, 1, "allow_backlog_of");
        checks.at_least(self.allow_backlog_to_ms.count(), 1, "allow_backlog_to_ms");
        checks.check(
            (0..=19).contains(&self.nice),
            "nice",
            "must be from 0 to 19",
        );
        checks.at_least(
            self.timer_lease_expiry_ms.count(),
            1_000,
            "timer_lease_expiry_ms",
        );
        checks.at_least(self.timer_poll_ms.count(), 10, "timer_poll_ms");
        if let Some(lead) = self.booking_lead_s {
            checks.at_least(lead.count(), 1, "booking_lead_s");
        }
        self.http.validate(&mut checks.section("http"));
        if self.gateway_latency_goal_ms.is_some() {
            checks.fail(
                "gateway_latency_goal_ms",
                "was replaced by gateway.latency_objective_ms: the worker beside the gateway now \
                 narrows its window while the 202's p99 is over that objective (25 ms by default), \
                 not while one answer is slower than a goal",
            );
        }
    }
}
