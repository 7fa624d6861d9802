//! The services' documented limits and the model's own rules, each constant
//! with its source, and [`Limits`], the stream's limits a plan is made within.

// Limits of the services, each with where it is documented.

/// Event Hubs Standard, a throughput unit's ingress: 1 MB/s or 1,000 events/s,
/// whichever comes first; egress 2 MB/s or 4,096 events/s; at most 40 TUs a
/// namespace, auto-inflate included
/// (<https://learn.microsoft.com/azure/event-hubs/event-hubs-scalability>).
pub const TU_INGRESS_EVENTS_PER_S: f64 = 1_000.0;
/// See [`TU_INGRESS_EVENTS_PER_S`].
pub const TU_INGRESS_BYTES_PER_S: f64 = 1_000_000.0;
/// See [`TU_INGRESS_EVENTS_PER_S`].
pub const TU_EGRESS_EVENTS_PER_S: f64 = 4_096.0;
/// See [`TU_INGRESS_EVENTS_PER_S`].
pub const TU_EGRESS_BYTES_PER_S: f64 = 2_000_000.0;
/// See [`TU_INGRESS_EVENTS_PER_S`].
pub const STANDARD_MAX_TUS: u32 = 40;
/// A partition takes about what one TU does, 1 MB/s or 1,000 events/s of
/// ingress (same page as [`TU_INGRESS_EVENTS_PER_S`]); also the conservative
/// default of `--kafka-partition-rate` (Event Hubs' Kafka endpoint is the
/// same service).
pub const PARTITION_EVENTS_PER_S: f64 = 1_000.0;
/// See [`PARTITION_EVENTS_PER_S`].
pub const PARTITION_BYTES_PER_S: f64 = 1_000_000.0;
/// Event Hubs quotas, Standard tier: 32 partitions an event hub, 10 event
/// hubs a namespace, 7 days of retention; Premium: 16 processing units a
/// namespace, 200 partitions a PU, 90 days
/// (<https://learn.microsoft.com/azure/event-hubs/event-hubs-quotas>). Skyport
/// shards over hubs of at most 32 partitions on either tier, so a plan can
/// move between them.
pub const PARTITIONS_PER_HUB: u32 = 32;
/// See [`PARTITIONS_PER_HUB`].
pub const STANDARD_MAX_HUBS: u32 = 10;
/// See [`PARTITIONS_PER_HUB`].
pub const STANDARD_RETENTION_HOURS: f64 = 7.0 * 24.0;
/// See [`PARTITIONS_PER_HUB`].
pub const PREMIUM_MAX_PUS: u32 = 16;
/// See [`PARTITIONS_PER_HUB`].
pub const PREMIUM_PARTITIONS_PER_PU: u32 = 200;
/// See [`PARTITIONS_PER_HUB`].
pub const PREMIUM_RETENTION_HOURS: f64 = 90.0 * 24.0;
/// The sizes a Premium namespace is bought in
/// (<https://learn.microsoft.com/azure/event-hubs/event-hubs-premium-overview>).
pub const PREMIUM_PU_SIZES: [u32; 5] = [1, 2, 4, 8, 16];
/// Premium has no throttle per unit: what a PU carries depends on the load
/// (same page as [`PREMIUM_PU_SIZES`]). The figure usually quoted is 5–10 MB/s
/// of ingress and 10–20 MB/s of egress a PU; the planner takes the low end.
pub const PU_INGRESS_BYTES_PER_S: f64 = 5_000_000.0;
/// See [`PU_INGRESS_BYTES_PER_S`].
pub const PU_EGRESS_BYTES_PER_S: f64 = 10_000_000.0;
/// Cosmos DB: a physical partition serves at most 10,000 RU/s and holds at
/// most 50 GB (<https://learn.microsoft.com/azure/cosmos-db/partitioning-overview>).
pub const COSMOS_RU_PER_PARTITION: f64 = 10_000.0;
/// See [`COSMOS_RU_PER_PARTITION`].
pub const COSMOS_GB_PER_PARTITION: f64 = 50.0;
/// Autoscale runs a container between a tenth of its maximum and the maximum,
/// set in steps of 1,000 RU/s (<https://learn.microsoft.com/azure/cosmos-db/autoscale-faq>).
pub const AUTOSCALE_RATIO: f64 = 10.0;
/// See [`AUTOSCALE_RATIO`].
pub const AUTOSCALE_STEP_RU: f64 = 1_000.0;

// The model's own rules.

/// The CPU a gateway is sized to use at most: the chart's HPA keeps the pods
/// at 70 % of their CPU request, and latency stays flat below it.
pub const GATEWAY_UTILIZATION: f64 = 0.7;
/// Gateways at least, so that one can be drained or fail.
pub const MIN_GATEWAYS: u32 = 2;
/// The workers' capacity over the sustained rate: room for a worker's
/// restart and a slower service without a backlog growing.
pub const WORKER_HEADROOM: f64 = 1.25;
/// `worker.max_in_flight` over what Little's law needs, for the variance
/// of the services' latency.
pub const WINDOW_MARGIN: f64 = 1.5;
/// The smallest `worker.max_in_flight` the planner sets.
pub const MIN_MAX_IN_FLIGHT: u32 = 16;
/// The memory requests of the chart's gateway and worker pods, in MiB
/// (helm/skyport/values.yaml): the least the plan asks for.
pub const CHART_GATEWAY_MEMORY_MIB: u32 = 256;
/// See [`CHART_GATEWAY_MEMORY_MIB`].
pub const CHART_WORKER_MEMORY_MIB: u32 = 512;
/// The most workers a plan may need before it is refused as a mistake in
/// its inputs.
pub const MAX_WORKERS: u32 = 10_000;
/// What a status write costs: 16.8 RU over 2.1 writes a delivery on the
/// Cosmos DB emulator's model of the 1 KB status document
/// (docs/operations.md, "Sizing Cosmos DB, worked"), within the published
/// 5–6 RU a 1 KB write plus its index.
pub const RU_PER_STATUS_WRITE: f64 = 8.0;
/// A client's status read: one point read of the ~1 KB document (1 RU),
/// one for each status change (README: one held read gets the outcome, two
/// when the delivery is marked Processing first).
pub const RU_PER_STATUS_READ: f64 = 1.0;
/// The change feed: the callbacks' processor reads every status change,
/// about 1 RU a 1 KB item (an estimate: the emulator charges a page 1 RU
/// whatever it holds).
pub const RU_CHANGE_FEED_PER_WRITE: f64 = 1.0;
/// A status document as Cosmos DB keeps it: 1.1 KB with the request it runs
/// (README, "Months of operation").
pub const STATUS_DOCUMENT_BYTES: f64 = 1_100.0;
/// The services' latency in the benchmark runs the fallback figures come
/// from (benches/skyport: 5 services at 20 ms a call, no jitter).
pub const BENCH_SERVICE_LATENCY_MS: f64 = 20.0;
/// What a delivery keeps in the embedded store with auth on and a
/// callback, by the file's growth (docs/operations.md, "Sizing the
/// embedded store"): an unnamed one, whose time-ordered id leaves the
/// status table's leaves half full (a named one kept 998 bytes, its
/// reservation included).
pub const EMBEDDED_BYTES_PER_DELIVERY: f64 = 1_334.0;
/// What a named request's reservation adds there, for
/// `gateway.idempotency_retention_s`: 1,337 − 1,003 bytes at 1121f16, an
/// upper bound (those runs also differed in the order of their ids).
pub const EMBEDDED_BYTES_PER_RESERVATION: f64 = 334.0;
/// The most one machine has worked off on the embedded store: about 5,800
/// workflows/s on 16 cores with 7 of them idle, bound by the serial parts
/// (the committer thread, the one HTTP/2 connection per service), not by
/// its cores (docs/capacity.md, "One machine").
pub const ONE_MACHINE_WORKFLOWS_PER_S: f64 = 5_800.0;

/// The stream's limits the plan is made within.
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    /// Ingress events a second one partition takes.
    pub partition_events_per_s: f64,
    /// Ingress bytes a second one partition takes, where the stream limits them.
    pub partition_bytes_per_s: Option<f64>,
}

impl Limits {
    /// Event Hubs' documented partition limits.
    pub fn event_hubs() -> Self {
        Self {
            partition_events_per_s: PARTITION_EVENTS_PER_S,
            partition_bytes_per_s: Some(PARTITION_BYTES_PER_S),
        }
    }

    /// Kafka at `events_per_s` a partition, bytes unlimited: a broker's
    /// partition takes far more than an event hub's 1 MB/s, and on Event
    /// Hubs' Kafka endpoint the default 1,000 events/s binds first for
    /// events under 1 KB.
    pub fn kafka(events_per_s: f64) -> Self {
        Self {
            partition_events_per_s: events_per_s,
            partition_bytes_per_s: None,
        }
    }
}
