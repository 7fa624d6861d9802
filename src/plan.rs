//! `skyport plan`: the capacity planner. From a target (a sustained rate and
//! a spike), the costs the benchmark measured and the services' documented
//! limits it sizes the stream, the gateways, the workers and Cosmos DB, prints
//! each figure beside the rule that gave it, and writes Helm values that
//! realise it.
//!
//! The model is two pure functions: [`plan`] and [`predict`], the capacity of
//! a given shape of workers and partitions, which `plan` sizes the workers
//! with. The benchmark calls `predict` to hold the model to what a fleet
//! measured, so the figures the planner prints come from the same arithmetic
//! the benchmark checks. The rules, their constants and their sources:
//! `docs/capacity.md`.

use std::ffi::OsString;
use std::fmt::{self, Display, Write as _};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Parser;
use serde_json::{Value, json};
use skyport_core::event::{DeliveryRequested, Event, SCHEMA_VERSION, content_type};
use skyport_runtime::config::{EXIT_CONFIG, StoreSettings, WorkerSettings};
use skyport_worker::workflow::steps::ORDER;

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
/// The change feed: the callbacks' and the listing view's processors each
/// read every status change, about 1 RU a 1 KB item each (an estimate: the
/// emulator charges a page 1 RU whatever it holds).
pub const RU_CHANGE_FEED_PER_WRITE: f64 = 2.0;
/// A status document as Cosmos DB keeps it: 1.1 KB with the request it runs
/// (README, "Months of operation").
pub const STATUS_DOCUMENT_BYTES: f64 = 1_100.0;
/// The services' latency in the benchmark runs the fallback figures come
/// from (benches/skyport: 5 services at 20 ms a call, no jitter).
pub const BENCH_SERVICE_LATENCY_MS: f64 = 20.0;
/// The README's example request, as a client sends it (compact JSON).
pub const README_BODY: &str = r#"{"ownerId":"owner-1","pickupLocation":"47.6423,-122.1368","pickupTime":"2030-01-01T10:00:00Z","deadline":"2030-01-01T12:00:00Z","dropoffLocation":"47.6101,-122.2015","packageInfo":{"packageId":"pkg-1","size":"Small","weight":2.5}}"#;

/// The calls a workflow makes: one per step.
const STEPS: f64 = ORDER.len() as f64;

/// Which stream carries the events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StreamKind {
    /// Azure Event Hubs, sharded over `eventhubs.hubs`.
    #[value(name = "eventhubs")]
    EventHubs,
    /// Kafka (or Event Hubs' Kafka endpoint), sharded over `kafka.topics`.
    #[value(name = "kafka")]
    Kafka,
}

impl StreamKind {
    /// The config key that lists the hubs or topics.
    pub fn shards_key(self) -> &'static str {
        match self {
            Self::EventHubs => "eventhubs.hubs",
            Self::Kafka => "kafka.topics",
        }
    }

    /// What one shard of the stream is called.
    fn shard(self) -> &'static str {
        match self {
            Self::EventHubs => "hub",
            Self::Kafka => "topic",
        }
    }
}

/// What the deployment must carry, and the choices it is made of.
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    /// Requests a second, all day.
    pub sustained_per_s: f64,
    /// Requests a second at the top of a spike; accepted, never refused.
    pub spike_per_s: f64,
    /// How long a spike lasts.
    pub spike_seconds: f64,
    /// A request body's bytes (the README's example: [`README_BODY`]).
    pub request_bytes: f64,
    /// Each service call's latency.
    pub service_latency_ms: f64,
    /// RU a status write costs.
    pub ru_per_write: f64,
    /// How long the stream keeps an event.
    pub retention_hours: f64,
    /// How long after a spike its backlog may last.
    pub drain_minutes: f64,
    /// How long a settled status document is kept (`store.status_retention_s`).
    pub status_retention_days: f64,
    /// The stream.
    pub stream: StreamKind,
    /// A gateway pod's CPU request, in cores.
    pub cores_per_gateway: f64,
    /// A worker pod's CPU request, in cores.
    pub cores_per_worker: f64,
}

impl Target {
    /// `sustained_per_s` and `spike_per_s` with every other input at its
    /// default: a 60 s spike of the README's request drained within 10
    /// minutes, services at 20 ms, 8 RU a status write, 24 h of stream
    /// retention, status kept `store.status_retention_s` (7 days), on Event
    /// Hubs, one core a pod.
    pub fn new(sustained_per_s: f64, spike_per_s: f64) -> Self {
        Self {
            sustained_per_s,
            spike_per_s,
            spike_seconds: 60.0,
            request_bytes: README_BODY.len() as f64,
            service_latency_ms: 20.0,
            ru_per_write: RU_PER_STATUS_WRITE,
            retention_hours: 24.0,
            drain_minutes: 10.0,
            status_retention_days: StoreSettings::default().status_retention_s.count() as f64
                / 86_400.0,
            stream: StreamKind::EventHubs,
            cores_per_gateway: 1.0,
            cores_per_worker: 1.0,
        }
    }
}

/// What each process costs, as the benchmark measures it.
#[derive(Debug, Clone, PartialEq)]
pub struct Costs {
    /// A gateway's CPU time for one accepted request.
    pub gateway_cpu_us_per_request: f64,
    /// A worker's CPU time for one workflow.
    pub worker_cpu_us_per_workflow: f64,
    /// A workflow's time beyond its service calls (status writes, queueing).
    pub workflow_overhead_ms: f64,
    /// A gateway's resident memory, when measured.
    pub gateway_rss_mib: Option<f64>,
    /// A worker's resident memory, when measured.
    pub worker_rss_mib: Option<f64>,
}

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

/// A deployment shape whose capacity [`predict`] gives.
#[derive(Debug, Clone, PartialEq)]
pub struct Shape {
    /// Worker processes.
    pub workers: u32,
    /// Partitions of the stream, over all hubs or topics.
    pub partitions: u32,
    /// `worker.max_in_flight`: workflows at once per partition.
    pub max_in_flight: u32,
    /// Cores each worker may use.
    pub cores_per_worker: f64,
    /// Each service call's latency.
    pub service_latency_ms: f64,
    /// When every process shares this many cores (a test machine), rather
    /// than each worker having its own.
    pub shared_cores: Option<f64>,
    /// With `shared_cores`: the CPU a workflow costs in the processes other
    /// than the gateway and the workers (broker, emulator, services).
    pub other_cpu_us_per_workflow: f64,
    /// Workflows waiting in the stream, to drain with nothing arriving.
    pub backlog: f64,
}

/// What bounds a shape's throughput.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bound {
    /// The workers' CPU.
    Cpu,
    /// The in-flight windows: `partitions × max_in_flight` workflows at once,
    /// each taking the workflow's latency.
    Window,
    /// The cores every process shares.
    SharedCores,
}

impl Display for Bound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Cpu => "the workers' CPU",
            Self::Window => "the in-flight windows (latency)",
            Self::SharedCores => "the shared cores",
        })
    }
}

/// A shape's throughput, and what it would take to drain its backlog.
#[derive(Debug, Clone, PartialEq)]
pub struct Prediction {
    /// Workflows completed a second.
    pub workflows_per_s: f64,
    /// What bounds it.
    pub bound: Bound,
    /// What the workers' CPU allows (workers holding a partition only).
    pub cpu_per_s: f64,
    /// What the windows allow: each worker's partitions × `max_in_flight`
    /// over the workflow's latency.
    pub window_per_s: f64,
    /// What the shared cores allow, when they are shared.
    pub shared_per_s: Option<f64>,
    /// One workflow: the service calls and the overhead.
    pub workflow_latency_s: f64,
    /// The shape's backlog over `workflows_per_s`: 0 without one, infinite
    /// at 0/s.
    pub drain_s: f64,
}

/// The capacity of `shape` with `costs`: each worker completes the lesser of
/// what its cores allow (`cores × 1e6 / worker CPU µs`) and what its windows
/// allow (its partitions × `max_in_flight` / the workflow's latency); a
/// worker holding no partition does nothing. With `shared_cores`, the sum is
/// also at most `cores × 1e6 / (gateway + worker + other µs a workflow)`.
/// Zero workers or partitions give 0/s and an infinite drain.
pub fn predict(costs: &Costs, shape: &Shape) -> Prediction {
    let latency_s = workflow_latency_s(shape.service_latency_ms, costs.workflow_overhead_ms);
    let active = shape.workers.min(shape.partitions);
    let cpu_each = shape.cores_per_worker * 1e6 / costs.worker_cpu_us_per_workflow;
    let window =
        |partitions: u32| f64::from(partitions) * f64::from(shape.max_in_flight) / latency_s;
    // The partitions spread as evenly as they go: some workers hold one more.
    let (cpu_per_s, window_per_s, workers_per_s) = match shape.partitions.checked_div(active) {
        None => (0.0, 0.0, 0.0),
        Some(fewest) => {
            let with_one_more = shape.partitions % active;
            let holding_fewest = active - with_one_more;
            let rate = f64::from(with_one_more) * cpu_each.min(window(fewest + 1))
                + f64::from(holding_fewest) * cpu_each.min(window(fewest));
            (f64::from(active) * cpu_each, window(shape.partitions), rate)
        }
    };
    let shared_per_s = shape.shared_cores.map(|cores| {
        cores * 1e6
            / (costs.gateway_cpu_us_per_request
                + costs.worker_cpu_us_per_workflow
                + shape.other_cpu_us_per_workflow)
    });
    let (workflows_per_s, bound) = match shared_per_s {
        Some(shared) if shared < workers_per_s => (shared, Bound::SharedCores),
        _ if workers_per_s < cpu_per_s => (workers_per_s, Bound::Window),
        _ => (workers_per_s, Bound::Cpu),
    };
    Prediction {
        workflows_per_s,
        bound,
        cpu_per_s,
        window_per_s,
        shared_per_s,
        workflow_latency_s: latency_s,
        drain_s: if shape.backlog > 0.0 {
            shape.backlog / workflows_per_s
        } else {
            0.0
        },
    }
}

/// One workflow's time: its service calls one after another, and the rest.
fn workflow_latency_s(service_latency_ms: f64, overhead_ms: f64) -> f64 {
    (STEPS * service_latency_ms + overhead_ms) / 1_000.0
}

/// Why a plan cannot be made. Every one is the caller's input (exit 64),
/// but a Helm values file that cannot be written (exit 1).
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// A flag's value is out of its range.
    #[error("{flag}: {reason}")]
    Invalid {
        /// The flag (or the field, for an input no flag sets).
        flag: &'static str,
        /// What is wrong with its value.
        reason: String,
    },
    /// The costs could not be read, and no flag gave them.
    #[error("{path}: {reason}; run `cargo bench --bench skyport` to measure them, or pass {flags}")]
    Costs {
        /// The benchmark file.
        path: PathBuf,
        /// Why no figure came from it.
        reason: String,
        /// The flags that give the costs instead.
        flags: &'static str,
    },
    /// The stream would not keep the oldest event of a spike until it is read.
    #[error(
        "--retention-hours: the stream keeps events {have} h, but a spike's first events wait until its backlog is drained, {need:.2} h after it started"
    )]
    RetentionTooShort {
        /// `--retention-hours`.
        have: f64,
        /// The spike and its drain, in hours.
        need: f64,
    },
    /// The target needs an absurd number of workers.
    #[error(
        "the target needs more than {MAX_WORKERS} workers at {per_worker:.0} workflows/s each: check --worker-cpu-us and --cores-per-worker"
    )]
    TooManyWorkers {
        /// What one worker completes a second.
        per_worker: f64,
    },
    /// The README's request could not be encoded as an event (a bug).
    #[error("the README's request does not decode as a delivery request: {0}")]
    Event(String),
    /// The Helm values file could not be written.
    #[error("--helm-values {path}: {source}")]
    Write {
        /// `--helm-values`.
        path: PathBuf,
        /// Why it could not be written.
        #[source]
        source: std::io::Error,
    },
}

impl PlanError {
    /// The process's exit code for it.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Write { .. } | Self::Event(_) => 1,
            Self::Invalid { .. }
            | Self::Costs { .. }
            | Self::RetentionTooShort { .. }
            | Self::TooManyWorkers { .. } => EXIT_CONFIG,
        }
    }
}

/// The stream's partitions, in equal hubs or topics.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamPlan {
    /// Partitions the spike needs at the partition limits, before rounding.
    pub partitions_needed: u32,
    /// Hubs (or topics) of at most [`PARTITIONS_PER_HUB`] partitions.
    pub hubs: u32,
    /// Partitions of each hub.
    pub partitions_per_hub: u32,
    /// `hubs × partitions_per_hub`.
    pub partitions: u32,
    /// An event's bytes on the stream: payload, key and properties.
    pub event_bytes: f64,
    /// The hubs' (topics') names, as `eventhubs.hubs` (`kafka.topics`) lists them.
    pub names: Vec<String>,
}

/// The Event Hubs namespace (for Kafka: when the cluster is Event Hubs'
/// Kafka endpoint).
#[derive(Debug, Clone, PartialEq)]
pub struct Namespace {
    /// TUs for the spike's ingress: events, bytes.
    pub ingress_tus: (u32, u32),
    /// TUs for the workers' reading at their drain rate: events, bytes.
    pub egress_tus: (u32, u32),
    /// TUs for the sustained rate alone (ingress and egress).
    pub sustained_tus: u32,
    /// The tier that carries it.
    pub tier: Tier,
}

impl Namespace {
    /// Throughput units the spike needs on Standard.
    pub fn throughput_units(&self) -> u32 {
        self.ingress_tus
            .0
            .max(self.ingress_tus.1)
            .max(self.egress_tus.0)
            .max(self.egress_tus.1)
    }
}

/// An Event Hubs tier and its size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    /// Standard with auto-inflate up to `max_tus`.
    Standard { max_tus: u32 },
    /// Premium with `pus` processing units (`needed` before rounding to a size sold).
    Premium { pus: u32, needed: u32 },
    /// More than Premium's largest namespace: a Dedicated cluster.
    Dedicated { pus_needed: u32 },
}

/// Gateway replicas.
#[derive(Debug, Clone, PartialEq)]
pub struct GatewayPlan {
    /// For the sustained rate: the autoscaler's floor.
    pub min: u32,
    /// For the spike: the autoscaler's ceiling.
    pub max: u32,
    /// Cores the gateways use at the sustained rate.
    pub cores_sustained: f64,
    /// Cores the gateways use at the spike.
    pub cores_spike: f64,
    /// A pod's memory request (its limit is twice it).
    pub memory_mib: u32,
}

/// Worker replicas and their windows.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerPlan {
    /// Worker processes.
    pub replicas: u32,
    /// The capacity the target needs: headroom, and the drain goal.
    pub needed_per_s: f64,
    /// Of it, what draining a spike within the goal needs.
    pub drain_needed_per_s: f64,
    /// What one worker's cores allow.
    pub cpu_per_worker_per_s: f64,
    /// The rate a partition runs at when its worker is CPU-bound.
    pub partition_rate_per_s: f64,
    /// `worker.max_in_flight`.
    pub max_in_flight: u32,
    /// `worker.read_ahead`.
    pub read_ahead: u32,
    /// A pod's memory request (its limit is twice it).
    pub memory_mib: u32,
    /// The capacity of the shape: [`predict`]'s answer.
    pub capacity: Prediction,
}

/// A spike's backlog.
#[derive(Debug, Clone, PartialEq)]
pub struct BacklogPlan {
    /// Requests waiting in the stream when the spike ends.
    pub peak: f64,
    /// Bytes they take on the stream.
    pub bytes: f64,
    /// From the spike's end until the backlog is gone, while the sustained
    /// rate goes on arriving.
    pub drain_s: f64,
    /// The longest a request waits in the stream: the last of the spike's,
    /// behind the whole backlog.
    pub longest_wait_s: f64,
    /// The retention the stream needs: the spike and its drain.
    pub retention_needed_hours: f64,
    /// What the stream holds at the sustained rate over its retention.
    pub retained_bytes: f64,
}

/// Cosmos DB's status container.
#[derive(Debug, Clone, PartialEq)]
pub struct CosmosPlan {
    /// Status writes a workflow makes.
    pub writes_per_workflow: u32,
    /// RU/s of the workers' status writes at their drain capacity.
    pub write_ru_per_s: f64,
    /// RU/s of the change-feed processors' reads.
    pub change_feed_ru_per_s: f64,
    /// RU/s of the clients' status reads.
    pub read_ru_per_s: f64,
    /// RU/s at the sustained rate.
    pub sustained_ru_per_s: f64,
    /// The autoscale maximum.
    pub autoscale_max_ru_per_s: f64,
    /// Physical partitions the RU/s need.
    pub partitions_for_ru: u32,
    /// Settled status documents kept, in GB, at the sustained rate.
    pub storage_gb: f64,
    /// Physical partitions the storage needs.
    pub partitions_for_storage: u32,
    /// The `worker` throughput group's share (status writes, dead letters).
    pub worker_fraction: f64,
    /// The `clients` group's share (status reads, reservations).
    pub clients_fraction: f64,
}

impl CosmosPlan {
    /// Physical partitions of the status container.
    pub fn physical_partitions(&self) -> u32 {
        self.partitions_for_ru.max(self.partitions_for_storage)
    }
}

/// A deployment that meets the target: [`plan`]'s answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Deployment {
    /// The stream's partitions and hubs.
    pub stream: StreamPlan,
    /// The namespace's tier and units.
    pub namespace: Namespace,
    /// Gateway replicas.
    pub gateways: GatewayPlan,
    /// Worker replicas and windows.
    pub workers: WorkerPlan,
    /// A spike's backlog.
    pub backlog: BacklogPlan,
    /// The status container.
    pub cosmos: CosmosPlan,
    /// What the plan meets but should be looked at.
    pub warnings: Vec<String>,
}

/// Sizes a deployment for `target` with `costs` within `limits`.
///
/// # Errors
/// [`PlanError::Invalid`] naming the flag of an input out of range (a zero,
/// negative or not finite rate, a spike below the sustained rate);
/// [`PlanError::RetentionTooShort`] when the stream would drop a spike's
/// events before they are read; [`PlanError::TooManyWorkers`].
pub fn plan(target: &Target, costs: &Costs, limits: &Limits) -> Result<Deployment, PlanError> {
    validate(target, costs, limits)?;
    let mut warnings = Vec::new();
    let event_bytes = event_bytes(target.request_bytes)?;
    let latency_s = workflow_latency_s(target.service_latency_ms, costs.workflow_overhead_ms);

    // The stream must take the spike, or the gateways answer 503.
    let by_bytes = limits
        .partition_bytes_per_s
        .map_or(0.0, |limit| target.spike_per_s * event_bytes / limit);
    let partitions_needed =
        whole((target.spike_per_s / limits.partition_events_per_s).max(by_bytes));
    let mut layout = Layout::of(partitions_needed);

    // Workers: headroom over the sustained rate, and a spike's backlog gone
    // within the goal: (spike − C) × T ≤ (C − sustained) × D.
    let spike_s = target.spike_seconds;
    let drain_goal_s = target.drain_minutes * 60.0;
    let drain_needed_per_s = (target.spike_per_s * spike_s + target.sustained_per_s * drain_goal_s)
        / (spike_s + drain_goal_s);
    let needed_per_s = (target.sustained_per_s * WORKER_HEADROOM).max(drain_needed_per_s);
    let cpu_per_worker = target.cores_per_worker * 1e6 / costs.worker_cpu_us_per_workflow;
    let mut replicas = whole(needed_per_s / cpu_per_worker).max(1);
    let (partition_rate_per_s, max_in_flight, capacity) = loop {
        if replicas > MAX_WORKERS {
            return Err(PlanError::TooManyWorkers {
                per_worker: cpu_per_worker,
            });
        }
        // Never more workers than partitions: an extra one would idle.
        if replicas > layout.partitions {
            layout = Layout::of(replicas);
        }
        // Little's law on the partitions of the worker that holds fewest,
        // each at the rate that keeps its worker's cores busy.
        let partition_rate = cpu_per_worker / f64::from(layout.partitions / replicas);
        let max_in_flight =
            whole(partition_rate * latency_s * WINDOW_MARGIN).max(MIN_MAX_IN_FLIGHT);
        let capacity = predict(
            costs,
            &Shape {
                workers: replicas,
                partitions: layout.partitions,
                max_in_flight,
                cores_per_worker: target.cores_per_worker,
                service_latency_ms: target.service_latency_ms,
                shared_cores: None,
                other_cpu_us_per_workflow: 0.0,
                backlog: 0.0,
            },
        );
        if capacity.workflows_per_s >= needed_per_s * (1.0 - 1e-9) {
            break (partition_rate, max_in_flight, capacity);
        }
        replicas += 1;
    };
    let defaults = WorkerSettings::default();
    let read_ahead = max_in_flight.max(count_u32(defaults.read_ahead));
    let most_partitions = layout.partitions.div_ceil(replicas);
    let pending = u64::from(most_partitions) * u64::from(read_ahead);
    if pending > defaults.allow_backlog_of as u64 {
        warnings.push(format!(
            "a worker may hold {pending} events read ahead ({most_partitions} partitions × read_ahead {read_ahead}), more than worker.allow_backlog_of ({}): raise it",
            defaults.allow_backlog_of
        ));
    }
    let drain_per_s = capacity.workflows_per_s;

    let namespace = namespace(target, &layout, event_bytes, drain_per_s);
    let max_retention = match namespace.tier {
        Tier::Standard { .. } => STANDARD_RETENTION_HOURS,
        Tier::Premium { .. } | Tier::Dedicated { .. } => PREMIUM_RETENTION_HOURS,
    };
    if target.retention_hours > max_retention && target.stream == StreamKind::EventHubs {
        warnings.push(format!(
            "--retention-hours {} is more than the namespace's tier keeps ({max_retention} h)",
            target.retention_hours
        ));
    }

    let per_gateway = target.cores_per_gateway * GATEWAY_UTILIZATION;
    let cores_sustained = target.sustained_per_s * costs.gateway_cpu_us_per_request / 1e6;
    let cores_spike = target.spike_per_s * costs.gateway_cpu_us_per_request / 1e6;
    let gateways = GatewayPlan {
        min: whole(cores_sustained / per_gateway).max(MIN_GATEWAYS),
        max: whole(cores_spike / per_gateway).max(MIN_GATEWAYS),
        cores_sustained,
        cores_spike,
        memory_mib: memory_request(costs.gateway_rss_mib, CHART_GATEWAY_MEMORY_MIB),
    };

    let peak = ((target.spike_per_s - drain_per_s) * spike_s).max(0.0);
    let drain_s = peak / (drain_per_s - target.sustained_per_s);
    let backlog = BacklogPlan {
        peak,
        bytes: peak * event_bytes,
        drain_s,
        longest_wait_s: peak / drain_per_s,
        retention_needed_hours: (spike_s + drain_s) / 3_600.0,
        retained_bytes: target.sustained_per_s * event_bytes * target.retention_hours * 3_600.0,
    };
    if target.retention_hours < backlog.retention_needed_hours {
        return Err(PlanError::RetentionTooShort {
            have: target.retention_hours,
            need: backlog.retention_needed_hours,
        });
    }

    let cosmos = cosmos(
        target,
        drain_per_s,
        latency_s,
        defaults.processing_after_ms.count(),
    );
    Ok(Deployment {
        stream: StreamPlan {
            partitions_needed,
            hubs: layout.hubs,
            partitions_per_hub: layout.per_hub,
            partitions: layout.partitions,
            event_bytes,
            names: layout.names(),
        },
        namespace,
        gateways,
        workers: WorkerPlan {
            replicas,
            needed_per_s,
            drain_needed_per_s,
            cpu_per_worker_per_s: cpu_per_worker,
            partition_rate_per_s,
            max_in_flight,
            read_ahead,
            memory_mib: memory_request(costs.worker_rss_mib, CHART_WORKER_MEMORY_MIB),
            capacity,
        },
        backlog,
        cosmos,
        warnings,
    })
}

/// Refuses inputs the model has no answer for, naming their flag.
fn validate(target: &Target, costs: &Costs, limits: &Limits) -> Result<(), PlanError> {
    for (flag, value) in [
        ("--sustained", target.sustained_per_s),
        ("--spike", target.spike_per_s),
        ("--spike-seconds", target.spike_seconds),
        ("--request-bytes", target.request_bytes),
        ("--service-latency-ms", target.service_latency_ms),
        ("--ru-per-write", target.ru_per_write),
        ("--retention-hours", target.retention_hours),
        ("--drain-minutes", target.drain_minutes),
        ("--status-retention-days", target.status_retention_days),
        ("--cores-per-gateway", target.cores_per_gateway),
        ("--cores-per-worker", target.cores_per_worker),
        ("--gateway-cpu-us", costs.gateway_cpu_us_per_request),
        ("--worker-cpu-us", costs.worker_cpu_us_per_workflow),
        ("--kafka-partition-rate", limits.partition_events_per_s),
        (
            "Limits::partition_bytes_per_s",
            limits.partition_bytes_per_s.unwrap_or(1.0),
        ),
    ] {
        if !(value.is_finite() && value > 0.0) {
            return Err(PlanError::Invalid {
                flag,
                reason: format!("must be a number above 0, got {value}"),
            });
        }
    }
    if !(costs.workflow_overhead_ms.is_finite() && costs.workflow_overhead_ms >= 0.0) {
        return Err(PlanError::Invalid {
            flag: "--workflow-overhead-ms",
            reason: format!(
                "must be a number of 0 or more, got {}",
                costs.workflow_overhead_ms
            ),
        });
    }
    if target.spike_per_s < target.sustained_per_s {
        return Err(PlanError::Invalid {
            flag: "--spike",
            reason: format!(
                "must be at least --sustained ({}), got {}",
                target.sustained_per_s, target.spike_per_s
            ),
        });
    }
    Ok(())
}

/// Partitions in equal hubs of at most [`PARTITIONS_PER_HUB`]: a key goes to
/// hub `hash mod hubs`, so each hub takes an equal share of the load.
#[derive(Debug, Clone, Copy)]
struct Layout {
    /// Hubs (or topics).
    hubs: u32,
    /// Partitions of each.
    per_hub: u32,
    /// `hubs × per_hub`.
    partitions: u32,
}

impl Layout {
    /// The fewest equal hubs that hold `partitions`.
    fn of(partitions: u32) -> Self {
        let hubs = partitions.max(1).div_ceil(PARTITIONS_PER_HUB);
        let per_hub = partitions.max(1).div_ceil(hubs);
        Self {
            hubs,
            per_hub,
            partitions: hubs * per_hub,
        }
    }

    /// Their names: `deliveries` alone (the default), else `deliveries-N`.
    fn names(&self) -> Vec<String> {
        if self.hubs == 1 {
            return vec!["deliveries".to_owned()];
        }
        (0..self.hubs).map(|n| format!("deliveries-{n}")).collect()
    }
}

/// The namespace for the spike's ingress and the workers' egress.
fn namespace(target: &Target, layout: &Layout, event_bytes: f64, drain_per_s: f64) -> Namespace {
    let ingress_tus = (
        whole(target.spike_per_s / TU_INGRESS_EVENTS_PER_S),
        whole(target.spike_per_s * event_bytes / TU_INGRESS_BYTES_PER_S),
    );
    let egress_tus = (
        whole(drain_per_s / TU_EGRESS_EVENTS_PER_S),
        whole(drain_per_s * event_bytes / TU_EGRESS_BYTES_PER_S),
    );
    let sustained_tus = whole(
        (target.sustained_per_s / TU_INGRESS_EVENTS_PER_S)
            .max(target.sustained_per_s * event_bytes / TU_INGRESS_BYTES_PER_S),
    )
    .max(1);
    let mut namespace = Namespace {
        ingress_tus,
        egress_tus,
        sustained_tus,
        tier: Tier::Dedicated { pus_needed: 0 },
    };
    let tus = namespace.throughput_units();
    namespace.tier = if tus <= STANDARD_MAX_TUS && layout.hubs <= STANDARD_MAX_HUBS {
        Tier::Standard { max_tus: tus }
    } else {
        let needed = whole(
            (target.spike_per_s * event_bytes / PU_INGRESS_BYTES_PER_S)
                .max(drain_per_s * event_bytes / PU_EGRESS_BYTES_PER_S)
                .max(f64::from(layout.partitions) / f64::from(PREMIUM_PARTITIONS_PER_PU)),
        )
        .max(1);
        match PREMIUM_PU_SIZES.iter().find(|size| **size >= needed) {
            Some(pus) => Tier::Premium { pus: *pus, needed },
            None => Tier::Dedicated { pus_needed: needed },
        }
    };
    namespace
}

/// The status container for the workers' drain rate.
fn cosmos(
    target: &Target,
    drain_per_s: f64,
    latency_s: f64,
    processing_after_ms: u64,
) -> CosmosPlan {
    // deliver.rs: one conditional create with the outcome when the delivery
    // ends within worker.processing_after_ms, else Processing first.
    let writes_per_workflow = if latency_s * 1_000.0 < processing_after_ms as f64 {
        1
    } else {
        2
    };
    let writes = f64::from(writes_per_workflow);
    let per_workflow =
        writes * (target.ru_per_write + RU_CHANGE_FEED_PER_WRITE + RU_PER_STATUS_READ);
    let write_ru_per_s = drain_per_s * writes * target.ru_per_write;
    let change_feed_ru_per_s = drain_per_s * writes * RU_CHANGE_FEED_PER_WRITE;
    let read_ru_per_s = drain_per_s * writes * RU_PER_STATUS_READ;
    let total = write_ru_per_s + change_feed_ru_per_s + read_ru_per_s;
    // The workers' share rounded down and the clients' up, to hundredths
    // (together at most 1: the change feed's share is left between them);
    // the maximum then grows until each group's share covers its work.
    let worker_fraction = ((write_ru_per_s / total * 100.0).floor() / 100.0).max(0.01);
    let clients_fraction = (read_ru_per_s / total * 100.0).ceil() / 100.0;
    let autoscale_max_ru_per_s = (total
        .max(write_ru_per_s / worker_fraction)
        .max(read_ru_per_s / clients_fraction)
        / AUTOSCALE_STEP_RU)
        .ceil()
        * AUTOSCALE_STEP_RU;
    let storage_gb =
        target.sustained_per_s * target.status_retention_days * 86_400.0 * STATUS_DOCUMENT_BYTES
            / 1e9;
    CosmosPlan {
        writes_per_workflow,
        write_ru_per_s,
        change_feed_ru_per_s,
        read_ru_per_s,
        sustained_ru_per_s: target.sustained_per_s * per_workflow,
        autoscale_max_ru_per_s,
        partitions_for_ru: whole(autoscale_max_ru_per_s / COSMOS_RU_PER_PARTITION),
        storage_gb,
        partitions_for_storage: whole(storage_gb / COSMOS_GB_PER_PARTITION),
        worker_fraction,
        clients_fraction,
    }
}

/// `x` rounded up to a whole number, forgiving the last bits of a division
/// that should have come out whole; saturates at `u32::MAX`.
fn whole(x: f64) -> u32 {
    let up = (x - 1e-9).ceil();
    if up <= 0.0 {
        0
    } else if up >= f64::from(u32::MAX) {
        u32::MAX
    } else {
        up as u32
    }
}

/// A `usize` setting as a `u32`, saturating.
fn count_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// The bytes the stream carries for a request of `request_bytes`: the
/// README's request encoded as the gateway encodes it (a `DeliveryRequested`
/// envelope with a UUID and a nanosecond acceptance time, a trace context),
/// its key and its properties (content type, trace context), plus what
/// `request_bytes` adds to the README's body.
///
/// # Errors
/// [`PlanError::Event`] if the README's body is not a delivery request.
pub fn event_bytes(request_bytes: f64) -> Result<f64, PlanError> {
    let (payload, key, properties) = readme_event()?;
    Ok((payload + key + properties) as f64 + request_bytes - README_BODY.len() as f64)
}

/// The README's request as an event on the stream: its payload, key and
/// property bytes.
fn readme_event() -> Result<(usize, usize, usize), PlanError> {
    const ID: &str = "2ea05e51-9c1b-4c55-9d4e-7f3a0e1c2b6d";
    const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let mut request: Value =
        serde_json::from_str(README_BODY).map_err(|e| PlanError::Event(e.to_string()))?;
    request["deliveryId"] = json!(ID);
    let requested: DeliveryRequested = serde_json::from_value(json!({
        "deliveryId": ID,
        "acceptedAt": "2030-01-01T09:59:59.123456789Z",
        "traceparent": TRACEPARENT,
        "request": request,
    }))
    .map_err(|e| PlanError::Event(e.to_string()))?;
    let payload = Event::DeliveryRequested(Box::new(requested)).encode();
    Ok((
        payload.len(),
        ID.len(),
        TRACEPARENT.len() + content_type(SCHEMA_VERSION).len(),
    ))
}

// Costs from BENCHMARKS.json.

/// A cost, and where it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Sourced {
    /// The figure.
    pub value: f64,
    /// Where it came from, for the output.
    pub source: String,
}

/// [`Costs`] with the source of each figure.
#[derive(Debug, Clone, PartialEq)]
pub struct MeasuredCosts {
    /// Gateway CPU µs per request.
    pub gateway_cpu: Sourced,
    /// Worker CPU µs per workflow.
    pub worker_cpu: Sourced,
    /// Workflow overhead ms.
    pub overhead: Sourced,
    /// Gateway RSS MiB.
    pub gateway_rss: Option<Sourced>,
    /// Worker RSS MiB.
    pub worker_rss: Option<Sourced>,
}

impl MeasuredCosts {
    /// The figures alone.
    pub fn costs(&self) -> Costs {
        Costs {
            gateway_cpu_us_per_request: self.gateway_cpu.value,
            worker_cpu_us_per_workflow: self.worker_cpu.value,
            workflow_overhead_ms: self.overhead.value,
            gateway_rss_mib: self.gateway_rss.as_ref().map(|s| s.value),
            worker_rss_mib: self.worker_rss.as_ref().map(|s| s.value),
        }
    }
}

/// The figures a benchmark run (`BENCHMARKS.json`) holds for `stream`: its
/// fleet run with one worker when there is one, else what the single-process
/// phases measured, each named.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BenchmarkFigures {
    /// Gateway CPU µs per request.
    pub gateway_cpu: Option<Sourced>,
    /// Worker CPU µs per workflow.
    pub worker_cpu: Option<Sourced>,
    /// Workflow overhead ms.
    pub overhead: Option<Sourced>,
    /// Gateway RSS MiB.
    pub gateway_rss: Option<Sourced>,
    /// Worker RSS MiB.
    pub worker_rss: Option<Sourced>,
}

impl BenchmarkFigures {
    /// Reads them from `json` (a `BENCHMARKS.json`).
    pub fn from_json(json: &Value, stream: StreamKind) -> Self {
        let fleet_key = match stream {
            StreamKind::EventHubs => "fleet_eventhubs",
            StreamKind::Kafka => "fleet_kafka",
        };
        let fleet = json[fleet_key]["runs"]
            .as_array()
            .and_then(|runs| runs.iter().find(|run| run["workers"].as_u64() == Some(1)));
        let from_fleet = |key: &str| {
            let value = fleet?.get(key)?.as_f64()?;
            Some(Sourced {
                value,
                source: format!("{fleet_key}.runs[workers = 1].{key}"),
            })
        };
        let ingest = json["ingest"].as_array().and_then(|runs| {
            runs.iter()
                .filter(|run| run["skyport"]["requests_per_s"].as_f64().is_some())
                .min_by_key(|run| run["connections"].as_u64().unwrap_or(u64::MAX))
        });
        let end_to_end = match stream {
            StreamKind::Kafka if json["kafka"]["end_to_end"].is_object() => {
                ("kafka.end_to_end", &json["kafka"]["end_to_end"])
            }
            _ => ("end_to_end", &json["end_to_end"]),
        };
        Self {
            // Its CPU while it took the requests, when the run has it: over
            // the whole run it also spent what it costs idle while the
            // workers drained, which sizing by rate should not count.
            gateway_cpu: from_fleet("gateway_posting_cpu_us_per_request")
                .or_else(|| from_fleet("gateway_cpu_us_per_request"))
                .or_else(|| {
                let run = ingest?;
                let per_s = run["skyport"]["requests_per_s"].as_f64()?;
                let cores = json["machine"]["cores"].as_f64()?;
                Some(Sourced {
                    value: cores * 1e6 / per_s,
                    source: format!(
                        "ingest at {} connections: {cores} cores ÷ {} requests/s (an upper bound: the load generator shared the cores)",
                        run["connections"],
                        thousands(per_s)
                    ),
                })
            }),
            worker_cpu: from_fleet("worker_cpu_us_per_workflow").or_else(|| {
                Some(Sourced {
                    value: end_to_end.1["cpu_us_per_workflow"].as_f64()?,
                    source: format!(
                        "{}.cpu_us_per_workflow (gateway and worker in one process: an upper bound)",
                        end_to_end.0
                    ),
                })
            }),
            overhead: from_fleet("workflow_overhead_ms").or_else(|| {
                let run = json["time_to_terminal"].as_array()?.iter().min_by_key(|run| {
                    run["rate"].as_u64().unwrap_or(u64::MAX)
                })?;
                let p50 = run["terminal"]["p50_ms"].as_f64()?;
                Some(Sourced {
                    value: (p50 - STEPS * BENCH_SERVICE_LATENCY_MS).max(0.0),
                    source: format!(
                        "time_to_terminal at {}/s: p50 {p50:.1} ms − {STEPS} calls × {BENCH_SERVICE_LATENCY_MS} ms",
                        run["rate"]
                    ),
                })
            }),
            gateway_rss: from_fleet("gateway_rss_mib").or_else(|| {
                let run = ingest?;
                Some(Sourced {
                    value: run["peak_rss_mib"].as_f64()?,
                    source: format!("ingest at {} connections: peak_rss_mib", run["connections"]),
                })
            }),
            worker_rss: from_fleet("worker_rss_mib").or_else(|| {
                Some(Sourced {
                    value: end_to_end.1["peak_rss_mib"].as_f64()?,
                    source: format!("{}.peak_rss_mib (gateway included)", end_to_end.0),
                })
            }),
        }
    }
}

/// The costs: the flags' where given, else `path`'s (a `BENCHMARKS.json`).
///
/// # Errors
/// [`PlanError::Costs`] naming the file, what is wrong with it and the flags
/// to pass instead, when a CPU figure is neither given nor in the file.
pub fn measured_costs(
    path: &Path,
    stream: StreamKind,
    gateway_cpu_us: Option<f64>,
    worker_cpu_us: Option<f64>,
    workflow_overhead_ms: Option<f64>,
) -> Result<MeasuredCosts, PlanError> {
    const FLAGS: &str = "--gateway-cpu-us and --worker-cpu-us";
    let read = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot be read ({e})"))
        .and_then(|text| {
            serde_json::from_str::<Value>(&text).map_err(|e| format!("is not JSON ({e})"))
        });
    let figures = match &read {
        Ok(json) => BenchmarkFigures::from_json(json, stream),
        Err(_) => BenchmarkFigures::default(),
    };
    let flag = |value: Option<f64>, name: &str| {
        value.map(|value| Sourced {
            value,
            source: format!("--{name}"),
        })
    };
    let missing = |what: &str| PlanError::Costs {
        path: path.to_owned(),
        reason: match &read {
            Ok(_) => format!("holds no {what}"),
            Err(e) => e.clone(),
        },
        flags: FLAGS,
    };
    let gateway_cpu = flag(gateway_cpu_us, "gateway-cpu-us")
        .or(figures.gateway_cpu)
        .ok_or_else(|| missing("gateway CPU per request"))?;
    let worker_cpu = flag(worker_cpu_us, "worker-cpu-us")
        .or(figures.worker_cpu)
        .ok_or_else(|| missing("worker CPU per workflow"))?;
    let overhead = flag(workflow_overhead_ms, "workflow-overhead-ms")
        .or(figures.overhead)
        .unwrap_or_else(|| Sourced {
            value: 0.0,
            source: "not measured: 0 (pass --workflow-overhead-ms)".to_owned(),
        });
    Ok(MeasuredCosts {
        gateway_cpu,
        worker_cpu,
        overhead,
        gateway_rss: figures.gateway_rss,
        worker_rss: figures.worker_rss,
    })
}

// The command line.

/// `skyport plan`'s flags.
#[derive(Debug, Parser)]
#[command(
    name = "skyport plan",
    bin_name = "skyport plan",
    about = "Sizes a Skyport deployment for a sustained rate and a spike: the stream's partitions and tier, gateways, workers and their windows, Cosmos DB; prints each figure with its rule and writes Helm values that realise it."
)]
struct Args {
    /// Requests a second, all day.
    #[arg(long, value_name = "PER_S", allow_negative_numbers = true)]
    sustained: f64,
    /// Requests a second at the top of a spike (all accepted).
    #[arg(long, value_name = "PER_S", allow_negative_numbers = true)]
    spike: f64,
    /// How long a spike lasts.
    #[arg(
        long,
        value_name = "S",
        default_value_t = 60.0,
        allow_negative_numbers = true
    )]
    spike_seconds: f64,
    /// Each service call's latency (5 calls a workflow).
    #[arg(
        long,
        value_name = "MS",
        default_value_t = 20.0,
        allow_negative_numbers = true
    )]
    service_latency_ms: f64,
    /// RU a status write costs in Cosmos DB.
    #[arg(long, value_name = "RU", default_value_t = RU_PER_STATUS_WRITE, allow_negative_numbers = true)]
    ru_per_write: f64,
    /// A request body's bytes [default: the README's example, 230].
    #[arg(long, value_name = "BYTES", allow_negative_numbers = true)]
    request_bytes: Option<f64>,
    /// How long the stream keeps an event.
    #[arg(
        long,
        value_name = "H",
        default_value_t = 24.0,
        allow_negative_numbers = true
    )]
    retention_hours: f64,
    /// How long after a spike its backlog may last.
    #[arg(
        long,
        value_name = "MIN",
        default_value_t = 10.0,
        allow_negative_numbers = true
    )]
    drain_minutes: f64,
    /// How long settled status documents are kept (store.status_retention_s) [default: 7].
    #[arg(long, value_name = "DAYS", allow_negative_numbers = true)]
    status_retention_days: Option<f64>,
    /// The stream.
    #[arg(long, value_enum, default_value = "eventhubs")]
    stream: StreamKind,
    /// Events a second a Kafka partition takes (--stream kafka).
    #[arg(long, value_name = "PER_S", default_value_t = PARTITION_EVENTS_PER_S, allow_negative_numbers = true)]
    kafka_partition_rate: f64,
    /// A gateway pod's CPU, in cores.
    #[arg(
        long,
        value_name = "CORES",
        default_value_t = 1.0,
        allow_negative_numbers = true
    )]
    cores_per_gateway: f64,
    /// A worker pod's CPU, in cores.
    #[arg(
        long,
        value_name = "CORES",
        default_value_t = 1.0,
        allow_negative_numbers = true
    )]
    cores_per_worker: f64,
    /// The benchmark's results, where the costs come from.
    #[arg(long, value_name = "FILE", default_value = "BENCHMARKS.json")]
    benchmarks: PathBuf,
    /// A gateway's CPU µs per accepted request, instead of the benchmark's.
    #[arg(long, value_name = "US", allow_negative_numbers = true)]
    gateway_cpu_us: Option<f64>,
    /// A worker's CPU µs per workflow, instead of the benchmark's.
    #[arg(long, value_name = "US", allow_negative_numbers = true)]
    worker_cpu_us: Option<f64>,
    /// A workflow's time beyond its service calls, instead of the benchmark's.
    #[arg(long, value_name = "MS", allow_negative_numbers = true)]
    workflow_overhead_ms: Option<f64>,
    /// Write Helm values realising the plan to this file.
    #[arg(long, value_name = "FILE")]
    helm_values: Option<PathBuf>,
}

/// `skyport plan ARGS…` (`args` starts with the subcommand's name): prints
/// the plan, writes the Helm values when asked. Exits 64 on a bad flag or
/// missing costs, naming them.
pub fn main(args: impl IntoIterator<Item = OsString>) -> ExitCode {
    let args: Vec<OsString> = args.into_iter().collect();
    let command = std::iter::once("skyport".into())
        .chain(args.iter().map(|arg| arg.to_string_lossy()))
        .collect::<Vec<_>>()
        .join(" ");
    let args = match Args::try_parse_from(args) {
        Ok(args) => args,
        Err(e) => {
            let code = if e.use_stderr() { EXIT_CONFIG } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    match run(&args, &command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("skyport plan: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

/// Plans, prints, writes; `command` is the command line, for the values' header.
fn run(args: &Args, command: &str) -> Result<(), PlanError> {
    let mut target = Target::new(args.sustained, args.spike);
    target.spike_seconds = args.spike_seconds;
    target.request_bytes = args.request_bytes.unwrap_or(target.request_bytes);
    target.service_latency_ms = args.service_latency_ms;
    target.ru_per_write = args.ru_per_write;
    target.retention_hours = args.retention_hours;
    target.drain_minutes = args.drain_minutes;
    target.status_retention_days = args
        .status_retention_days
        .unwrap_or(target.status_retention_days);
    target.stream = args.stream;
    target.cores_per_gateway = args.cores_per_gateway;
    target.cores_per_worker = args.cores_per_worker;
    let limits = match args.stream {
        StreamKind::EventHubs => Limits::event_hubs(),
        StreamKind::Kafka => Limits::kafka(args.kafka_partition_rate),
    };
    let measured = measured_costs(
        &args.benchmarks,
        args.stream,
        args.gateway_cpu_us,
        args.worker_cpu_us,
        args.workflow_overhead_ms,
    )?;
    let deployment = plan(&target, &measured.costs(), &limits)?;
    print!(
        "{}",
        render(&target, &measured, &limits, &deployment, &args.benchmarks)
    );
    if let Some(path) = &args.helm_values {
        std::fs::write(path, helm_values(&target, &deployment, command)).map_err(|source| {
            PlanError::Write {
                path: path.clone(),
                source,
            }
        })?;
        println!("Helm values: {}", path.display());
    }
    Ok(())
}

// The table.

/// `x` rounded to a whole number, with thousands separated by commas:
/// 36,330 (the benchmark's charts write counts so too).
pub fn thousands(x: f64) -> String {
    let digits = format!("{:.0}", x.abs());
    let mut out = String::new();
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(digit);
    }
    if x < -0.5 {
        out.insert(0, '-');
    }
    out
}

/// Bytes in the largest unit below 1,000 of it.
fn bytes(x: f64) -> String {
    match x {
        x if x >= 1e12 => format!("{:.1} TB", x / 1e12),
        x if x >= 1e9 => format!("{:.1} GB", x / 1e9),
        x if x >= 1e6 => format!("{:.1} MB", x / 1e6),
        x if x >= 1e3 => format!("{:.1} kB", x / 1e3),
        x => format!("{x:.0} B"),
    }
}

/// The table's rows: a figure and the rule behind it, one line each.
struct Table(String);

impl Table {
    /// A section's title, after a blank line.
    fn heading(&mut self, title: &str) {
        let _ = writeln!(self.0, "\n{title}");
    }

    /// A figure: its label, its value right-aligned, its rule.
    fn row(&mut self, label: &str, value: impl Display, rule: impl Display) {
        let _ = writeln!(self.0, "  {label:<22} {:>18}  {rule}", value.to_string());
    }
}

/// A pod's memory request and limit, and their rule.
fn memory_row(t: &mut Table, memory_mib: u32, chart_mib: u32, measured: bool) {
    t.row(
        "memory",
        format!("{memory_mib}Mi, {}Mi max", memory_mib * 2),
        if measured {
            format!(
                "twice the measured memory in 64 MiB steps, at least the chart's {chart_mib}Mi; limit twice the request"
            )
        } else {
            format!("not measured: the chart's {chart_mib}Mi; limit twice the request")
        },
    );
}

/// The plan as a table, each figure beside its rule.
fn render(
    target: &Target,
    measured: &MeasuredCosts,
    limits: &Limits,
    deployment: &Deployment,
    benchmarks: &Path,
) -> String {
    let Deployment {
        stream,
        namespace,
        gateways,
        workers,
        backlog,
        cosmos,
        warnings,
    } = deployment;
    let costs = measured.costs();
    let capacity = &workers.capacity;
    let latency_ms = capacity.workflow_latency_s * 1_000.0;
    let mut t = Table(format!(
        "Skyport capacity plan: {}/s sustained, spikes of {}/s for {} s, each backlog gone within {} min, on {}.\n",
        thousands(target.sustained_per_s),
        thousands(target.spike_per_s),
        target.spike_seconds,
        target.drain_minutes,
        match target.stream {
            StreamKind::EventHubs => "Event Hubs",
            StreamKind::Kafka => "Kafka",
        }
    ));

    t.heading(&format!(
        "Costs (from {} unless a flag gave them)",
        benchmarks.display()
    ));
    t.row(
        "gateway CPU",
        format!("{:.1} µs/request", measured.gateway_cpu.value),
        &measured.gateway_cpu.source,
    );
    t.row(
        "worker CPU",
        format!("{:.1} µs/workflow", measured.worker_cpu.value),
        &measured.worker_cpu.source,
    );
    t.row(
        "workflow overhead",
        format!("{:.1} ms", measured.overhead.value),
        &measured.overhead.source,
    );
    for (label, rss) in [
        ("gateway memory", &measured.gateway_rss),
        ("worker memory", &measured.worker_rss),
    ] {
        match rss {
            Some(rss) => t.row(label, format!("{:.0} MiB", rss.value), &rss.source),
            None => t.row(
                label,
                "not measured",
                "in no fleet run or phase of the file",
            ),
        }
    }

    t.heading("Stream");
    t.row(
        "event",
        format!("{:.0} B", stream.event_bytes),
        format!(
            "a {:.0} B request as the gateway writes it: a DeliveryRequested envelope, its key and properties",
            target.request_bytes
        ),
    );
    let by_events = format!(
        "{}/s ÷ {}/s",
        thousands(target.spike_per_s),
        thousands(limits.partition_events_per_s)
    );
    t.row(
        "partitions",
        stream.partitions_needed,
        match limits.partition_bytes_per_s {
            Some(limit) => format!(
                "the spike at a partition's ingress: ceil(max({by_events}, {}/s ÷ {}/s))",
                bytes(target.spike_per_s * stream.event_bytes),
                bytes(limit)
            ),
            None => format!("the spike at a partition's ingress: ceil({by_events})"),
        },
    );
    t.row(
        &format!("{}s", target.stream.shard()),
        format!("{} × {}", stream.hubs, stream.partitions_per_hub),
        format!(
            "equal {}s of at most {PARTITIONS_PER_HUB} partitions: {} in all ({})",
            target.stream.shard(),
            stream.partitions,
            target.stream.shards_key()
        ),
    );
    let tus = namespace.throughput_units();
    t.row(
        "throughput units",
        tus,
        format!(
            "max(spike in: {} by events, {} by bytes; drain out: {} by events, {} by bytes)",
            namespace.ingress_tus.0,
            namespace.ingress_tus.1,
            namespace.egress_tus.0,
            namespace.egress_tus.1
        ),
    );
    let tier_rule = match target.stream {
        StreamKind::EventHubs => "",
        StreamKind::Kafka => " (if the cluster is Event Hubs' Kafka endpoint)",
    };
    match namespace.tier {
        Tier::Standard { max_tus } => t.row(
            "namespace",
            format!("Standard, {}–{max_tus} TUs", namespace.sustained_tus),
            format!(
                "≤ {STANDARD_MAX_TUS} TUs: auto-inflate from the sustained rate's up to the spike's{tier_rule}"
            ),
        ),
        Tier::Premium { pus, needed } => t.row(
            "namespace",
            format!("Premium, {pus} PUs"),
            format!(
                "{tus} TUs > Standard's {STANDARD_MAX_TUS}: {needed} PUs at {}/s in, {}/s out, {PREMIUM_PARTITIONS_PER_PU} partitions a PU, sold as {PREMIUM_PU_SIZES:?}{tier_rule}",
                bytes(PU_INGRESS_BYTES_PER_S),
                bytes(PU_EGRESS_BYTES_PER_S)
            ),
        ),
        Tier::Dedicated { pus_needed } => t.row(
            "namespace",
            "Dedicated",
            format!(
                "{pus_needed} PUs > Premium's {PREMIUM_MAX_PUS}: a Dedicated cluster, sized with Microsoft{tier_rule}"
            ),
        ),
    }

    t.heading("Gateways");
    t.row(
        "replicas",
        format!("{}–{}", gateways.min, gateways.max),
        format!(
            "ceil(rate × {:.1} µs ÷ ({} core × {GATEWAY_UTILIZATION})): {:.2} cores sustained, {:.2} at the spike; at least {MIN_GATEWAYS}",
            costs.gateway_cpu_us_per_request,
            target.cores_per_gateway,
            gateways.cores_sustained,
            gateways.cores_spike
        ),
    );
    memory_row(
        &mut t,
        gateways.memory_mib,
        CHART_GATEWAY_MEMORY_MIB,
        costs.gateway_rss_mib.is_some(),
    );

    t.heading("Workers");
    t.row(
        "workflow",
        format!("{latency_ms:.1} ms"),
        format!(
            "{STEPS} calls × {} ms + {:.1} ms overhead",
            target.service_latency_ms, costs.workflow_overhead_ms
        ),
    );
    t.row(
        "needed",
        format!("{}/s", thousands(workers.needed_per_s)),
        format!(
            "max({} × sustained, drain: (spike × {} s + sustained × {} s) ÷ ({} s + {} s) = {}/s)",
            WORKER_HEADROOM,
            target.spike_seconds,
            target.drain_minutes * 60.0,
            target.spike_seconds,
            target.drain_minutes * 60.0,
            thousands(workers.drain_needed_per_s)
        ),
    );
    t.row(
        "per worker",
        format!("{}/s", thousands(workers.cpu_per_worker_per_s)),
        format!(
            "{} core × 1e6 ÷ {:.1} µs",
            target.cores_per_worker, costs.worker_cpu_us_per_workflow
        ),
    );
    t.row(
        "replicas",
        workers.replicas,
        format!(
            "the fewest whose capacity ≥ needed, never more than the partitions ({} to {} each)",
            stream.partitions / workers.replicas,
            stream.partitions.div_ceil(workers.replicas)
        ),
    );
    t.row(
        "max_in_flight",
        workers.max_in_flight,
        format!(
            "Little's law: ceil({:.0}/s a partition × {latency_ms:.1} ms × {WINDOW_MARGIN}), at least {MIN_MAX_IN_FLIGHT}",
            workers.partition_rate_per_s
        ),
    );
    t.row(
        "read_ahead",
        workers.read_ahead,
        format!(
            "max(the default {}, max_in_flight): worker.read_ahead ≥ max_in_flight",
            WorkerSettings::default().read_ahead
        ),
    );
    t.row(
        "capacity",
        format!("{}/s", thousands(capacity.workflows_per_s)),
        format!(
            "bound by {}: CPU {}/s, windows {}/s (partitions × max_in_flight ÷ workflow)",
            capacity.bound,
            thousands(capacity.cpu_per_s),
            thousands(capacity.window_per_s)
        ),
    );
    memory_row(
        &mut t,
        workers.memory_mib,
        CHART_WORKER_MEMORY_MIB,
        costs.worker_rss_mib.is_some(),
    );

    t.heading("Backlog of a spike");
    t.row(
        "peak",
        thousands(backlog.peak),
        format!(
            "(spike − capacity) × {} s, {} on the stream",
            target.spike_seconds,
            bytes(backlog.bytes)
        ),
    );
    t.row(
        "drained",
        format!("{:.1} min", backlog.drain_s / 60.0),
        "after the spike: peak ÷ (capacity − sustained)",
    );
    t.row(
        "longest wait",
        format!("{:.1} min", backlog.longest_wait_s / 60.0),
        "the spike's last request, behind the peak: peak ÷ capacity",
    );
    t.row(
        "retention",
        format!("{} h", target.retention_hours),
        format!(
            "covers the spike and its drain ({:.2} h); holds {} at the sustained rate",
            backlog.retention_needed_hours,
            bytes(backlog.retained_bytes)
        ),
    );

    t.heading("Cosmos DB (status container)");
    t.row(
        "writes a workflow",
        cosmos.writes_per_workflow,
        format!(
            "one when the workflow ({latency_ms:.0} ms) ends within worker.processing_after_ms ({} ms), else two (worker/src/workflow/deliver.rs)",
            thousands(WorkerSettings::default().processing_after_ms.count() as f64)
        ),
    );
    t.row(
        "RU/s at capacity",
        thousands(cosmos.write_ru_per_s + cosmos.change_feed_ru_per_s + cosmos.read_ru_per_s),
        format!(
            "capacity × writes × ({} write + {RU_CHANGE_FEED_PER_WRITE} change feed + {RU_PER_STATUS_READ} status read)",
            target.ru_per_write
        ),
    );
    t.row(
        "autoscale max",
        format!("{} RU/s", thousands(cosmos.autoscale_max_ru_per_s)),
        format!(
            "rounded up to 1,000 so each group's share covers it; floor {} RU/s, sustained needs {}",
            thousands(cosmos.autoscale_max_ru_per_s / AUTOSCALE_RATIO),
            thousands(cosmos.sustained_ru_per_s)
        ),
    );
    t.row(
        "physical partitions",
        cosmos.physical_partitions(),
        format!(
            "max({} for RU/s at {} each, {} for {} GB at {COSMOS_GB_PER_PARTITION} GB: {} days at the sustained rate)",
            cosmos.partitions_for_ru,
            thousands(COSMOS_RU_PER_PARTITION),
            cosmos.partitions_for_storage,
            thousands(cosmos.storage_gb),
            target.status_retention_days
        ),
    );
    t.row(
        "group worker",
        format!("{:.2}", cosmos.worker_fraction),
        "status_writes, dead_letters; low priority, global: the writes' share, rounded down",
    );
    t.row(
        "group clients",
        format!("{:.2}", cosmos.clients_fraction),
        "status_reads, reservations; high priority, global: the reads' share, rounded up (a named POST's reservation is on top)",
    );
    if !warnings.is_empty() {
        t.heading("Warnings");
        for warning in warnings {
            let _ = writeln!(t.0, "  {warning}");
        }
    }
    t.0
}

// The Helm values.

/// YAML written by hand: nested maps, scalars and flow lists.
struct Yaml {
    /// The text so far.
    out: String,
    /// The maps open.
    depth: usize,
}

impl Yaml {
    /// Two spaces a level of nesting.
    fn indent(&mut self) {
        for _ in 0..self.depth {
            self.out.push_str("  ");
        }
    }

    /// `# text` at the current depth.
    fn comment(&mut self, text: &str) {
        self.indent();
        let _ = writeln!(self.out, "# {text}");
    }

    /// Opens map `key`; [`Yaml::close`] ends it.
    fn open(&mut self, key: &str) {
        self.indent();
        let _ = writeln!(self.out, "{key}:");
        self.depth += 1;
    }

    /// Ends the map [`Yaml::open`] opened last.
    fn close(&mut self) {
        self.depth -= 1;
    }

    /// `key: value`, the value written as it displays (numbers, booleans).
    fn plain(&mut self, key: &str, value: impl Display) {
        self.indent();
        let _ = writeln!(self.out, "{key}: {value}");
    }

    /// `key: "value"`, quoted as JSON quotes it (a YAML double-quoted scalar).
    fn text(&mut self, key: &str, value: &str) {
        self.plain(key, Value::from(value));
    }

    /// `key: ["a", "b"]`.
    fn list(&mut self, key: &str, items: &[String]) {
        self.plain(key, Value::from(items.to_vec()));
    }
}

/// A CPU quantity as Kubernetes writes it: whole cores, else millicores.
fn cpu_quantity(cores: f64) -> String {
    let millis = (cores * 1_000.0).round();
    if millis % 1_000.0 == 0.0 {
        format!("{}", millis / 1_000.0)
    } else {
        format!("{millis}m")
    }
}

/// A memory request for a process of `rss_mib`: twice it, rounded up to
/// 64 MiB, at least the chart's request (`chart_default_mib`).
fn memory_request(rss_mib: Option<f64>, chart_default_mib: u32) -> u32 {
    rss_mib.map_or(chart_default_mib, |rss| {
        let doubled = whole(rss * 2.0 / 64.0) * 64;
        doubled.max(chart_default_mib)
    })
}

/// Helm values realising `deployment`: the stream's hubs or topics, the
/// worker's windows, the throughput groups, the gateways' autoscaler and the
/// workers' replicas. Layered over a profile's values (`-f` after them).
pub fn helm_values(target: &Target, deployment: &Deployment, command: &str) -> String {
    let Deployment {
        stream,
        namespace,
        gateways,
        workers,
        cosmos,
        ..
    } = deployment;
    let mut y = Yaml {
        out: String::new(),
        depth: 0,
    };
    y.comment(&format!("Written by `{command}`."));
    y.comment(&format!(
        "{}/s sustained, spikes of {}/s for {} s gone within {} min: docs/capacity.md.",
        thousands(target.sustained_per_s),
        thousands(target.spike_per_s),
        target.spike_seconds,
        target.drain_minutes
    ));
    y.comment("Layer it over a profile's values, after them:");
    y.comment(
        "  helm install skyport helm/skyport -f helm/skyport/ci/azure-values.yaml -f THIS_FILE",
    );
    y.comment("Helm merges maps: delete config.cosmos.throughput_groups from the base file first");
    y.comment("(ci/azure-values.yaml's bulk and clients), or its groups merge into these.");
    let tier = match namespace.tier {
        Tier::Standard { max_tus } => format!("Standard, auto-inflate up to {max_tus} TUs"),
        Tier::Premium { pus, .. } => format!("Premium, {pus} PUs"),
        Tier::Dedicated { .. } => "a Dedicated cluster".to_owned(),
    };
    y.comment(&format!(
        "Create the {} {}s of {} partitions first (namespace: {tier}), and the status container at",
        stream.hubs,
        target.stream.shard(),
        stream.partitions_per_hub
    ));
    y.comment(&format!(
        "autoscale max {} RU/s ({} physical partitions).",
        thousands(cosmos.autoscale_max_ru_per_s),
        cosmos.physical_partitions()
    ));
    y.open("config");
    match target.stream {
        StreamKind::EventHubs => y.open("eventhubs"),
        StreamKind::Kafka => y.open("kafka"),
    }
    y.comment(&format!(
        "{} × {} partitions: the spike at {}/s a partition.",
        stream.hubs,
        stream.partitions_per_hub,
        thousands(target.spike_per_s / f64::from(stream.partitions))
    ));
    match target.stream {
        StreamKind::EventHubs => y.list("hubs", &stream.names),
        StreamKind::Kafka => y.list("topics", &stream.names),
    }
    y.close();
    y.open("worker");
    y.comment(&format!(
        "Little's law: {:.0}/s a partition × {:.1} ms × {WINDOW_MARGIN}.",
        workers.partition_rate_per_s,
        workers.capacity.workflow_latency_s * 1_000.0
    ));
    y.plain("max_in_flight", workers.max_in_flight);
    y.plain("read_ahead", workers.read_ahead);
    y.close();
    y.open("cosmos");
    y.open("throughput_groups");
    for (name, work, fraction, priority) in [
        (
            "worker",
            ["status_writes", "dead_letters"],
            cosmos.worker_fraction,
            "low",
        ),
        (
            "clients",
            ["status_reads", "reservations"],
            cosmos.clients_fraction,
            "high",
        ),
    ] {
        y.open(name);
        y.text("container", "status");
        y.list("work", &work.map(str::to_owned));
        y.plain("target_fraction", format!("{fraction:.2}"));
        y.text("priority", priority);
        y.text("scope", "global");
        y.close();
    }
    y.close();
    y.close();
    y.close();
    y.open("gateway");
    y.open("autoscaling");
    y.comment(&format!(
        "{:.2} cores at the sustained rate, {:.2} at the spike, each pod at {} %.",
        gateways.cores_sustained,
        gateways.cores_spike,
        GATEWAY_UTILIZATION * 100.0
    ));
    y.plain("enabled", true);
    y.plain("minReplicas", gateways.min);
    y.plain("maxReplicas", gateways.max);
    y.plain(
        "targetCPUUtilizationPercentage",
        format!("{:.0}", GATEWAY_UTILIZATION * 100.0),
    );
    y.close();
    resources(&mut y, target.cores_per_gateway, gateways.memory_mib);
    y.close();
    y.open("worker");
    y.comment(&format!(
        "{}/s in all, bound by {}.",
        thousands(workers.capacity.workflows_per_s),
        workers.capacity.bound
    ));
    y.plain("replicaCount", workers.replicas);
    y.open("autoscaling");
    y.plain("enabled", false);
    y.close();
    resources(&mut y, target.cores_per_worker, workers.memory_mib);
    y.close();
    y.out
}

/// `resources`: the CPU the plan counted on as the request (the HPA's 100 %),
/// memory requested and limited at twice it.
fn resources(y: &mut Yaml, cores: f64, memory_mib: u32) {
    y.open("resources");
    y.open("requests");
    y.text("cpu", &cpu_quantity(cores));
    y.text("memory", &format!("{memory_mib}Mi"));
    y.close();
    y.open("limits");
    y.text("memory", &format!("{}Mi", memory_mib * 2));
    y.close();
    y.close();
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// Round figures near what the benchmark measured (BENCHMARKS.json at
    /// 1f61523: 51.7 µs, 216 µs, 7.8 ms), so the arithmetic checks by hand.
    fn costs() -> Costs {
        Costs {
            gateway_cpu_us_per_request: 50.0,
            worker_cpu_us_per_workflow: 216.0,
            workflow_overhead_ms: 8.0,
            gateway_rss_mib: Some(49.0),
            worker_rss_mib: Some(132.0),
        }
    }

    fn shape(workers: u32, partitions: u32, max_in_flight: u32) -> Shape {
        Shape {
            workers,
            partitions,
            max_in_flight,
            cores_per_worker: 1.0,
            service_latency_ms: 20.0,
            shared_cores: None,
            other_cpu_us_per_workflow: 0.0,
            backlog: 0.0,
        }
    }

    fn close(actual: f64, expected: f64) {
        assert!(
            (actual - expected).abs() <= expected.abs() * 1e-6 + 1e-9,
            "{actual} is not {expected}"
        );
    }

    #[test]
    fn ten_thousand_sustained_and_a_hundred_thousand_spike_plan_as_worked_by_hand() {
        let target = Target::new(10_000.0, 100_000.0);
        let deployment = plan(&target, &costs(), &Limits::event_hubs()).unwrap();
        let Deployment {
            stream,
            namespace,
            gateways,
            workers,
            backlog,
            cosmos,
            warnings,
        } = &deployment;

        // The README's request is about 690 B on the stream: under 1,000 B,
        // so the partitions' and TUs' event limits bind before their bytes.
        assert!((600.0..1_000.0).contains(&stream.event_bytes));
        // 100,000/s ÷ 1,000/s a partition = 100; ceil(100 ÷ 32) = 4 hubs of 25.
        assert_eq!(stream.partitions_needed, 100);
        assert_eq!((stream.hubs, stream.partitions_per_hub), (4, 25));
        assert_eq!(stream.partitions, 100);
        assert_eq!(
            stream.names,
            [
                "deliveries-0",
                "deliveries-1",
                "deliveries-2",
                "deliveries-3"
            ]
        );

        // Needed: max(1.25 × 10,000 = 12,500, drain: (100,000 × 60 + 10,000 × 600)
        // ÷ (60 + 600) = 12,000,000 ÷ 660 = 18,181.8) = 18,181.8/s.
        close(workers.needed_per_s, 12_000_000.0 / 660.0);
        // A worker: 1e6 ÷ 216 µs = 4,629.6/s; ceil(18,181.8 ÷ 4,629.6) = ceil(3.93) = 4,
        // 18,518.5/s together, bound by their CPU.
        close(workers.cpu_per_worker_per_s, 1e6 / 216.0);
        assert_eq!(workers.replicas, 4);
        close(workers.capacity.workflows_per_s, 4.0 * 1e6 / 216.0);
        assert_eq!(workers.capacity.bound, Bound::Cpu);
        // A workflow: 5 × 20 ms + 8 ms = 108 ms. A worker's 25 partitions at
        // 4,629.6 ÷ 25 = 185.2/s each: 185.2 × 0.108 s × 1.5 = 30 in flight.
        close(workers.capacity.workflow_latency_s, 0.108);
        close(workers.partition_rate_per_s, 1e6 / 216.0 / 25.0);
        assert_eq!(workers.max_in_flight, 30);
        assert_eq!(workers.read_ahead, 512);
        // The windows allow 100 × 30 ÷ 0.108 s = 27,777.8/s: not the bound.
        close(workers.capacity.window_per_s, 100.0 * 30.0 / 0.108);

        // TUs: ingress 100,000 ÷ 1,000 = 100 by events (bytes: ~69); egress
        // 18,518.5 ÷ 4,096 = 4.5 → 5. 100 > 40: Premium; ~69 MB/s ÷ 5 MB/s
        // = 14 PUs, sold as 16.
        assert_eq!(namespace.ingress_tus.0, 100);
        assert!(namespace.ingress_tus.1 < 100);
        assert_eq!(namespace.egress_tus.0, 5);
        assert_eq!(namespace.throughput_units(), 100);
        assert_eq!(namespace.sustained_tus, 10);
        assert!(
            matches!(namespace.tier, Tier::Premium { pus: 16, needed } if (13..=16).contains(&needed))
        );

        // Gateways: 100,000 × 50 µs = 5 cores ÷ 0.7 = 7.1 → 8; 10,000 × 50 µs
        // = 0.5 cores ÷ 0.7 = 0.7 → 1, at least 2.
        assert_eq!((gateways.min, gateways.max), (2, 8));
        close(gateways.cores_spike, 5.0);

        // Backlog: (100,000 − 18,518.5) × 60 s = 4,888,889; drained at
        // 18,518.5 − 10,000 = 8,518.5/s in 573.9 s (9.6 min, within the 10);
        // the spike's last request waits 4,888,889 ÷ 18,518.5 = 264 s.
        let capacity = 4.0 * 1e6 / 216.0;
        close(backlog.peak, (100_000.0 - capacity) * 60.0);
        close(
            backlog.drain_s,
            (100_000.0 - capacity) * 60.0 / (capacity - 10_000.0),
        );
        assert!((573.0..575.0).contains(&backlog.drain_s));
        close(
            backlog.longest_wait_s,
            (100_000.0 - capacity) * 60.0 / capacity,
        );
        close(backlog.bytes, backlog.peak * stream.event_bytes);

        // Cosmos DB: 108 ms < 1 s, one write a workflow; 18,518.5/s × (8 + 2 + 1)
        // = 203,703.7 RU/s. Shares: 8/11 = 0.727 → 0.72, 1/11 = 0.091 → 0.10;
        // 148,148 RU/s ÷ 0.72 = 205,761 → 206,000 RU/s max, 21 partitions for it;
        // 10,000/s × 7 days × 1.1 KB = 6,653 GB → 134 partitions of 50 GB.
        assert_eq!(cosmos.writes_per_workflow, 1);
        close(cosmos.write_ru_per_s, capacity * 8.0);
        close(
            cosmos.write_ru_per_s + cosmos.change_feed_ru_per_s + cosmos.read_ru_per_s,
            capacity * 11.0,
        );
        close(cosmos.sustained_ru_per_s, 110_000.0);
        assert_eq!(cosmos.worker_fraction, 0.72);
        assert_eq!(cosmos.clients_fraction, 0.10);
        assert!(cosmos.worker_fraction + cosmos.clients_fraction <= 1.0);
        assert_eq!(cosmos.autoscale_max_ru_per_s, 206_000.0);
        assert!(cosmos.worker_fraction * cosmos.autoscale_max_ru_per_s >= cosmos.write_ru_per_s);
        assert_eq!(cosmos.partitions_for_ru, 21);
        close(cosmos.storage_gb, 6_652.8);
        assert_eq!(cosmos.partitions_for_storage, 134);
        assert_eq!(cosmos.physical_partitions(), 134);
        assert!(warnings.is_empty(), "{warnings:?}");
    }

    #[test]
    fn slow_services_widen_the_windows_so_the_workers_stay_bound_by_their_cpu() {
        // 5 × 400 ms = 2 s a workflow: past worker.processing_after_ms, so two writes.
        let mut target = Target::new(1_000.0, 5_000.0);
        target.service_latency_ms = 400.0;
        let costs = Costs {
            worker_cpu_us_per_workflow: 200.0,
            workflow_overhead_ms: 0.0,
            ..costs()
        };
        let deployment = plan(&target, &costs, &Limits::event_hubs()).unwrap();
        let workers = &deployment.workers;
        // 5 partitions in one hub; one worker at 1e6 ÷ 200 = 5,000/s covers
        // max(1,250, (5,000 × 60 + 1,000 × 600) ÷ 660 = 1,363.6).
        assert_eq!(deployment.stream.partitions, 5);
        assert_eq!(deployment.stream.names, ["deliveries"]);
        assert_eq!(workers.replicas, 1);
        // 5,000/s over 5 partitions = 1,000/s each × 2 s × 1.5 = 3,000 in flight;
        // read_ahead follows it past 512.
        assert_eq!(workers.max_in_flight, 3_000);
        assert_eq!(workers.read_ahead, 3_000);
        assert_eq!(workers.capacity.bound, Bound::Cpu);
        close(workers.capacity.workflows_per_s, 5_000.0);
        assert_eq!(deployment.cosmos.writes_per_workflow, 2);
        // The default window (128) would leave the same shape bound by the
        // latency: 5 × 128 ÷ 2 s = 320/s.
        let mut default_window = shape(1, 5, 128);
        default_window.service_latency_ms = 400.0;
        let prediction = predict(&costs, &default_window);
        assert_eq!(prediction.bound, Bound::Window);
        close(prediction.workflows_per_s, 320.0);
    }

    #[test]
    fn an_expensive_workflow_takes_many_workers_bound_by_their_cpu() {
        // 1,000 µs a workflow: 1,000/s a worker. Needed: max(12,500, (20,000 × 60
        // + 10,000 × 600) ÷ 660 = 10,909) = 12,500 → 13 workers on 20 partitions.
        let target = Target::new(10_000.0, 20_000.0);
        let costs = Costs {
            worker_cpu_us_per_workflow: 1_000.0,
            ..costs()
        };
        let deployment = plan(&target, &costs, &Limits::event_hubs()).unwrap();
        let workers = &deployment.workers;
        assert_eq!(deployment.stream.partitions, 20);
        assert_eq!(workers.replicas, 13);
        assert_eq!(workers.capacity.bound, Bound::Cpu);
        close(workers.capacity.workflows_per_s, 13_000.0);
        // The workers holding one partition run it at 1,000/s: 1,000 × 0.108 × 1.5 = 162.
        assert_eq!(workers.max_in_flight, 162);
        // (20,000 − 13,000) × 60 = 420,000, drained at 3,000/s in 140 s.
        close(deployment.backlog.peak, 420_000.0);
        close(deployment.backlog.drain_s, 140.0);
        // 20 TUs for the spike: Standard, auto-inflating from the sustained 10.
        assert_eq!(deployment.namespace.tier, Tier::Standard { max_tus: 20 });
    }

    #[test]
    fn never_more_workers_than_partitions() {
        // 100/s a worker: 1,250/s needs 13 workers, so the one partition the
        // spike needs becomes 13.
        let target = Target::new(1_000.0, 1_000.0);
        let costs = Costs {
            worker_cpu_us_per_workflow: 10_000.0,
            ..costs()
        };
        let deployment = plan(&target, &costs, &Limits::event_hubs()).unwrap();
        assert_eq!(deployment.stream.partitions_needed, 1);
        assert_eq!(deployment.workers.replicas, 13);
        assert_eq!(deployment.stream.partitions, 13);
        assert_eq!(deployment.backlog.peak, 0.0);
    }

    #[test]
    fn kafka_partitions_follow_the_partition_rate_given() {
        let mut target = Target::new(10_000.0, 100_000.0);
        target.stream = StreamKind::Kafka;
        let deployment = plan(&target, &costs(), &Limits::kafka(5_000.0)).unwrap();
        // 100,000 ÷ 5,000 = 20 partitions in one topic.
        assert_eq!(deployment.stream.partitions, 20);
        assert_eq!(deployment.stream.hubs, 1);
    }

    #[test]
    fn predict_spreads_partitions_and_idles_workers_without_one() {
        let costs = Costs {
            worker_cpu_us_per_workflow: 250.0,
            workflow_overhead_ms: 0.0,
            ..costs()
        };
        // 4,000/s a worker; windows of 128 over 100 ms: 1,280/s a partition.
        let two = predict(&costs, &shape(2, 8, 128));
        assert_eq!(two.bound, Bound::Cpu);
        close(two.workflows_per_s, 8_000.0);
        close(two.window_per_s, 10_240.0);
        // 10 workers on 4 partitions: 4 work, 6 idle.
        let idle = predict(&costs, &shape(10, 4, 128));
        close(idle.cpu_per_s, 16_000.0);
        close(idle.workflows_per_s, 4.0 * 1_280.0);
        assert_eq!(idle.bound, Bound::Window);
        // 3 workers on 8 partitions (3, 3, 2) with windows of 16: 160/s a partition.
        let uneven = predict(&costs, &shape(3, 8, 16));
        close(uneven.workflows_per_s, 8.0 * 160.0);
        let none = predict(&costs, &shape(0, 8, 16));
        assert_eq!(none.workflows_per_s, 0.0);
        let mut backlog = shape(0, 8, 16);
        backlog.backlog = 10.0;
        assert!(predict(&costs, &backlog).drain_s.is_infinite());
    }

    #[test]
    fn shared_cores_cap_predict_at_their_cpu_over_every_process() {
        // 4 workers alone: 4 × 1e6 ÷ 216 = 18,518/s. On 2 shared cores with
        // 50 + 216 + 134 = 400 µs a workflow over every process: 5,000/s.
        let mut shared = shape(4, 100, 30);
        shared.shared_cores = Some(2.0);
        shared.other_cpu_us_per_workflow = 134.0;
        shared.backlog = 100_000.0;
        let prediction = predict(&costs(), &shared);
        assert_eq!(prediction.bound, Bound::SharedCores);
        close(prediction.shared_per_s.unwrap(), 5_000.0);
        close(prediction.workflows_per_s, 5_000.0);
        close(prediction.drain_s, 20.0);
        // Apart, the same shape is bound by the workers' CPU.
        shared.shared_cores = None;
        let apart = predict(&costs(), &shared);
        assert_eq!(apart.bound, Bound::Cpu);
        close(apart.workflows_per_s, 4.0 * 1e6 / 216.0);
    }

    fn invalid_flag(target: &Target, costs: &Costs) -> &'static str {
        match plan(target, costs, &Limits::event_hubs()) {
            Err(e @ PlanError::Invalid { flag, .. }) => {
                assert_eq!(e.exit_code(), EXIT_CONFIG);
                flag
            }
            other => panic!("expected an invalid flag, got {other:?}"),
        }
    }

    #[test]
    fn bad_inputs_name_their_flag() {
        let good = Target::new(10_000.0, 100_000.0);
        assert_eq!(
            invalid_flag(&Target::new(10_000.0, 5_000.0), &costs()),
            "--spike"
        );
        assert_eq!(
            invalid_flag(&Target::new(0.0, 5_000.0), &costs()),
            "--sustained"
        );
        assert_eq!(
            invalid_flag(&Target::new(-1.0, 5_000.0), &costs()),
            "--sustained"
        );
        let mut nan = good.clone();
        nan.service_latency_ms = f64::NAN;
        assert_eq!(invalid_flag(&nan, &costs()), "--service-latency-ms");
        let mut infinite = good.clone();
        infinite.spike_seconds = f64::INFINITY;
        assert_eq!(invalid_flag(&infinite, &costs()), "--spike-seconds");
        let free = Costs {
            worker_cpu_us_per_workflow: 0.0,
            ..costs()
        };
        assert_eq!(invalid_flag(&good, &free), "--worker-cpu-us");
        let negative = Costs {
            workflow_overhead_ms: -1.0,
            ..costs()
        };
        assert_eq!(invalid_flag(&good, &negative), "--workflow-overhead-ms");
        let message = plan(&Target::new(10.0, 5.0), &costs(), &Limits::event_hubs())
            .unwrap_err()
            .to_string();
        assert_eq!(message, "--spike: must be at least --sustained (10), got 5");
    }

    #[test]
    fn a_retention_shorter_than_the_drain_is_refused() {
        // The example's spike and drain take 60 + 574 s = 0.18 h.
        let mut target = Target::new(10_000.0, 100_000.0);
        target.retention_hours = 0.1;
        let error = plan(&target, &costs(), &Limits::event_hubs()).unwrap_err();
        assert!(
            matches!(error, PlanError::RetentionTooShort { .. }),
            "{error}"
        );
        assert_eq!(error.exit_code(), EXIT_CONFIG);
        assert!(error.to_string().starts_with("--retention-hours"));
    }

    #[test]
    fn an_event_is_the_request_and_its_envelope() {
        let readme = event_bytes(README_BODY.len() as f64).unwrap();
        assert!(readme > README_BODY.len() as f64 + 36.0 + 55.0);
        close(event_bytes(1_230.0).unwrap(), readme + 1_000.0);
    }

    fn figures_json() -> Value {
        json!({
            "machine": {"cores": 2},
            "ingest": [
                {"connections": 256, "skyport": {"requests_per_s": 50_000.0}, "peak_rss_mib": 60.0},
                {"connections": 64, "skyport": {"requests_per_s": 40_000.0}, "peak_rss_mib": 50.0},
            ],
            "end_to_end": {"cpu_us_per_workflow": 216.0, "peak_rss_mib": 130.0},
            "kafka": {"end_to_end": {"cpu_us_per_workflow": 240.0, "peak_rss_mib": 140.0}},
            "time_to_terminal": [
                {"rate": 2000, "terminal": {"p50_ms": 110.0}},
                {"rate": 1000, "terminal": {"p50_ms": 107.5}},
            ],
        })
    }

    #[test]
    fn without_fleet_runs_the_costs_come_from_the_single_process_phases() {
        let figures = BenchmarkFigures::from_json(&figures_json(), StreamKind::EventHubs);
        // 2 cores ÷ 40,000/s at 64 connections = 50 µs.
        close(figures.gateway_cpu.as_ref().unwrap().value, 50.0);
        assert!(
            figures
                .gateway_cpu
                .unwrap()
                .source
                .starts_with("ingest at 64 connections")
        );
        close(figures.worker_cpu.as_ref().unwrap().value, 216.0);
        // 107.5 ms at the lowest rate less 5 calls of 20 ms.
        close(figures.overhead.unwrap().value, 7.5);
        close(figures.gateway_rss.unwrap().value, 50.0);
        close(figures.worker_rss.unwrap().value, 130.0);
        let kafka = BenchmarkFigures::from_json(&figures_json(), StreamKind::Kafka);
        close(kafka.worker_cpu.as_ref().unwrap().value, 240.0);
        assert!(
            kafka
                .worker_cpu
                .unwrap()
                .source
                .starts_with("kafka.end_to_end")
        );
    }

    #[test]
    fn a_fleet_run_with_one_worker_is_preferred() {
        let mut json = figures_json();
        json["fleet_eventhubs"] = json!({"runs": [
            {"workers": 2, "gateway_cpu_us_per_request": 1.0, "worker_cpu_us_per_workflow": 1.0},
            {"workers": 1, "gateway_cpu_us_per_request": 30.0, "worker_cpu_us_per_workflow": 150.0,
             "workflow_overhead_ms": 12.0, "gateway_rss_mib": 40.0, "worker_rss_mib": 90.0},
        ]});
        let figures = BenchmarkFigures::from_json(&json, StreamKind::EventHubs);
        close(figures.gateway_cpu.as_ref().unwrap().value, 30.0);
        assert_eq!(
            figures.gateway_cpu.unwrap().source,
            "fleet_eventhubs.runs[workers = 1].gateway_cpu_us_per_request"
        );
        close(figures.worker_cpu.unwrap().value, 150.0);
        close(figures.overhead.unwrap().value, 12.0);
        close(figures.worker_rss.unwrap().value, 90.0);
        // The Kafka plan does not take Event Hubs' fleet.
        let kafka = BenchmarkFigures::from_json(&json, StreamKind::Kafka);
        close(kafka.worker_cpu.unwrap().value, 240.0);
    }

    #[test]
    fn a_fleet_gateways_cpu_while_posting_is_preferred_to_the_whole_runs() {
        let mut json = figures_json();
        json["fleet_kafka"] = json!({"runs": [
            {"workers": 1, "gateway_cpu_us_per_request": 66.0,
             "gateway_posting_cpu_us_per_request": 48.0, "worker_cpu_us_per_workflow": 700.0},
        ]});
        let gateway = BenchmarkFigures::from_json(&json, StreamKind::Kafka)
            .gateway_cpu
            .unwrap();
        close(gateway.value, 48.0);
        assert_eq!(
            gateway.source,
            "fleet_kafka.runs[workers = 1].gateway_posting_cpu_us_per_request"
        );
    }

    #[test]
    fn a_missing_benchmark_file_names_itself_and_the_flags_unless_they_are_given() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("BENCHMARKS.json");
        let error =
            measured_costs(&path, StreamKind::EventHubs, Some(50.0), None, None).unwrap_err();
        assert_eq!(error.exit_code(), EXIT_CONFIG);
        let message = error.to_string();
        assert!(
            message.starts_with(&path.display().to_string()),
            "{message}"
        );
        assert!(
            message.contains("--gateway-cpu-us and --worker-cpu-us"),
            "{message}"
        );
        let given =
            measured_costs(&path, StreamKind::EventHubs, Some(50.0), Some(200.0), None).unwrap();
        assert_eq!(given.worker_cpu.source, "--worker-cpu-us");
        assert_eq!(given.overhead.value, 0.0);
        assert_eq!(given.costs().gateway_rss_mib, None);
        std::fs::write(&path, figures_json().to_string()).unwrap();
        let read = measured_costs(&path, StreamKind::EventHubs, None, Some(200.0), None).unwrap();
        close(read.gateway_cpu.value, 50.0);
        close(read.worker_cpu.value, 200.0);
    }

    #[test]
    fn the_command_exits_64_on_a_bad_flag() {
        let run = |args: &[&str]| {
            main(
                std::iter::once("plan")
                    .chain(args.iter().copied())
                    .map(OsString::from),
            )
        };
        let costs = ["--gateway-cpu-us", "50", "--worker-cpu-us", "216"];
        let code = ExitCode::from(EXIT_CONFIG);
        assert_eq!(
            run(&[&["--sustained", "-5", "--spike", "10"][..], &costs].concat()),
            code
        );
        assert_eq!(
            run(&[&["--sustained", "NaN", "--spike", "10"][..], &costs].concat()),
            code
        );
        assert_eq!(run(&["--sustained", "5"]), code);
        assert_eq!(
            run(&[
                &["--sustained", "5", "--spike", "10", "--stream", "pigeon"][..],
                &costs
            ]
            .concat()),
            code
        );
        assert_eq!(
            run(&[&["--sustained", "5", "--spike", "10"][..], &costs].concat()),
            ExitCode::SUCCESS
        );
    }

    #[test]
    fn the_helm_values_carry_the_plan_in_the_charts_keys() {
        let target = Target::new(10_000.0, 100_000.0);
        let deployment = plan(&target, &costs(), &Limits::event_hubs()).unwrap();
        let values = helm_values(&target, &deployment, "skyport plan …");
        for line in [
            "config:",
            "  eventhubs:",
            r#"    hubs: ["deliveries-0","deliveries-1","deliveries-2","deliveries-3"]"#,
            "  worker:\n",
            "    max_in_flight: 30\n    read_ahead: 512\n",
            "    throughput_groups:\n      worker:\n        container: \"status\"\n        work: [\"status_writes\",\"dead_letters\"]\n        target_fraction: 0.72\n        priority: \"low\"\n        scope: \"global\"\n",
            "      clients:\n        container: \"status\"\n        work: [\"status_reads\",\"reservations\"]\n        target_fraction: 0.10\n        priority: \"high\"\n",
            "gateway:\n  autoscaling:\n",
            "    enabled: true\n    minReplicas: 2\n    maxReplicas: 8\n    targetCPUUtilizationPercentage: 70\n",
            "  resources:\n    requests:\n      cpu: \"1\"\n      memory: \"256Mi\"\n    limits:\n      memory: \"512Mi\"\n",
            "worker:\n",
            "  replicaCount: 4\n  autoscaling:\n    enabled: false\n",
        ] {
            assert!(values.contains(line), "no {line:?} in\n{values}");
        }
        assert!(
            values
                .lines()
                .all(|line| !line.ends_with(' ') && !line.contains('\t'))
        );
        let mut kafka = target.clone();
        kafka.stream = StreamKind::Kafka;
        let deployment = plan(&kafka, &costs(), &Limits::kafka(1_000.0)).unwrap();
        let values = helm_values(&kafka, &deployment, "skyport plan …");
        assert!(values.contains("  kafka:\n"), "{values}");
        assert!(values.contains("    topics: [\"deliveries-0\""), "{values}");
    }

    #[test]
    fn quantities_are_written_as_kubernetes_writes_them() {
        assert_eq!(cpu_quantity(1.0), "1");
        assert_eq!(cpu_quantity(2.0), "2");
        assert_eq!(cpu_quantity(0.5), "500m");
        assert_eq!(memory_request(Some(49.0), 256), 256);
        // 300 × 2 = 600 → 640 (ten 64 MiB steps).
        assert_eq!(memory_request(Some(300.0), 512), 640);
        assert_eq!(memory_request(None, 512), 512);
        assert_eq!(thousands(18_518.6), "18,519");
        assert_eq!(thousands(999.0), "999");
        assert_eq!(thousands(1_000_000.0), "1,000,000");
    }
}
