//! The model: what a deployment must carry ([`Target`]), what each process
//! costs ([`Costs`]), [`predict`], the capacity of a [`Shape`] of workers and
//! partitions, and [`event_bytes`], what a request takes on the stream.

use std::fmt::{self, Display};

use serde_json::{Value, json};
use skyport_core::event::{DeliveryRequested, Event, SCHEMA_VERSION, content_type};
use skyport_core::status::Step;
use skyport_runtime::config::StoreSettings;

use super::error::PlanError;
use super::limits::RU_PER_STATUS_WRITE;

/// The README's example request, as a client sends it (compact JSON).
pub const README_BODY: &str = r#"{"ownerId":"owner-1","pickupLocation":"47.6423,-122.1368","pickupTime":"2030-01-01T10:00:00Z","deadline":"2030-01-01T12:00:00Z","dropoffLocation":"47.6101,-122.2015","packageInfo":{"packageId":"pkg-1","size":"Small","weight":2.5}}"#;

/// The calls a workflow makes: one per step.
pub(super) const STEPS: f64 = Step::ALL.len() as f64;

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
    pub(super) fn shard(self) -> &'static str {
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
    /// Request units a delivery spends on Cosmos DB, when measured (and
    /// `--ru-per-write` not given): they replace the modelled status writes.
    pub cosmos_ru: Option<RuPerDelivery>,
}

/// Request units a delivery spends on Cosmos DB where the benchmark's
/// `cosmos-cost` phase can measure them, by container. Change-feed pages
/// are not charged as Azure charges them, so they stay modelled; leases
/// cost by the second, not by the delivery.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RuPerDelivery {
    /// The status container's writes (the workers' group), with the reads
    /// that decide them and the callbacks' outcomes written back.
    pub status_writes: f64,
    /// The reservations container: a named request's reservation, made at
    /// the gateways' rate.
    pub reservations: f64,
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
pub(super) fn workflow_latency_s(service_latency_ms: f64, overhead_ms: f64) -> f64 {
    (STEPS * service_latency_ms + overhead_ms) / 1_000.0
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
