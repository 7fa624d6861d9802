//! [`plan`]: sizes the stream, the namespace, the gateways, the workers, a
//! spike's backlog and Cosmos DB's status container for a target, and the
//! [`Deployment`] it answers with.

use skyport_runtime::config::WorkerSettings;

use super::error::PlanError;
use super::limits::{
    AUTOSCALE_STEP_RU, CHART_GATEWAY_MEMORY_MIB, CHART_WORKER_MEMORY_MIB, COSMOS_GB_PER_PARTITION,
    COSMOS_RU_PER_PARTITION, GATEWAY_UTILIZATION, Limits, MAX_WORKERS, MIN_GATEWAYS,
    MIN_MAX_IN_FLIGHT, PARTITIONS_PER_HUB, PREMIUM_PARTITIONS_PER_PU, PREMIUM_PU_SIZES,
    PREMIUM_RETENTION_HOURS, PU_EGRESS_BYTES_PER_S, PU_INGRESS_BYTES_PER_S,
    RU_CHANGE_FEED_PER_WRITE, RU_PER_STATUS_READ, STANDARD_MAX_HUBS, STANDARD_MAX_TUS,
    STANDARD_RETENTION_HOURS, STATUS_DOCUMENT_BYTES, TU_EGRESS_BYTES_PER_S, TU_EGRESS_EVENTS_PER_S,
    TU_INGRESS_BYTES_PER_S, TU_INGRESS_EVENTS_PER_S, WINDOW_MARGIN, WORKER_HEADROOM,
};
use super::model::{
    Costs, Prediction, RuPerDelivery, Shape, StreamKind, Target, event_bytes, predict,
    workflow_latency_s,
};

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
    /// The other containers, when their request units were measured.
    pub others: Option<OtherContainers>,
}

/// Request units a second of the containers beside the status container,
/// each at the rate that drives it.
#[derive(Debug, Clone, PartialEq)]
pub struct OtherContainers {
    /// Every request named, at the spike's rate.
    pub reservations_ru_per_s: f64,
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
    let (replicas, partition_rate_per_s, max_in_flight, capacity) = size_workers(
        target,
        costs,
        &mut layout,
        needed_per_s,
        cpu_per_worker,
        latency_s,
    )?;
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
        costs.cosmos_ru.as_ref(),
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

/// The fewest workers at `cpu_per_worker` each whose capacity is
/// `needed_per_s`, `layout` grown so that none idles: their number, the rate a
/// partition runs at when its worker is CPU-bound, their `max_in_flight` and
/// their capacity.
fn size_workers(
    target: &Target,
    costs: &Costs,
    layout: &mut Layout,
    needed_per_s: f64,
    cpu_per_worker: f64,
    latency_s: f64,
) -> Result<(u32, f64, u32, Prediction), PlanError> {
    let mut replicas = whole(needed_per_s / cpu_per_worker).max(1);
    loop {
        if replicas > MAX_WORKERS {
            return Err(PlanError::TooManyWorkers {
                per_worker: cpu_per_worker,
            });
        }
        // Never more workers than partitions: an extra one would idle.
        if replicas > layout.partitions {
            *layout = Layout::of(replicas);
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
            return Ok((replicas, partition_rate, max_in_flight, capacity));
        }
        replicas += 1;
    }
}

/// Refuses inputs the model has no answer for, naming their flag.
fn validate(target: &Target, costs: &Costs, limits: &Limits) -> Result<(), PlanError> {
    above_zero(&[
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
    ])?;
    overhead_and_spike(target, costs.workflow_overhead_ms)
}

/// Refuses any of `inputs` that is not a number above 0, naming its flag.
pub(super) fn above_zero(inputs: &[(&'static str, f64)]) -> Result<(), PlanError> {
    for &(flag, value) in inputs {
        if !(value.is_finite() && value > 0.0) {
            return Err(PlanError::Invalid {
                flag,
                reason: format!("must be a number above 0, got {value}"),
            });
        }
    }
    Ok(())
}

/// Refuses an overhead below 0 and a spike below the sustained rate.
pub(super) fn overhead_and_spike(target: &Target, overhead_ms: f64) -> Result<(), PlanError> {
    if !(overhead_ms.is_finite() && overhead_ms >= 0.0) {
        return Err(PlanError::Invalid {
            flag: "--workflow-overhead-ms",
            reason: format!("must be a number of 0 or more, got {overhead_ms}"),
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

/// The status container for the workers' drain rate: request units a
/// delivery as `measured`, else modelled from `target.ru_per_write`.
fn cosmos(
    target: &Target,
    measured: Option<&RuPerDelivery>,
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
    // Measured, the status writes a delivery; modelled, per write. Change
    // feed and status reads stay modelled: the emulator charges a point
    // read nothing and a change-feed page 1 RU whatever it holds.
    let status_writes = measured.map_or(writes * target.ru_per_write, |ru| ru.status_writes);
    let per_workflow = status_writes + writes * (RU_CHANGE_FEED_PER_WRITE + RU_PER_STATUS_READ);
    let write_ru_per_s = drain_per_s * status_writes;
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
        // Reservations are made as requests are accepted: at the spike's rate.
        others: measured.map(|ru| OtherContainers {
            reservations_ru_per_s: target.spike_per_s * ru.reservations,
        }),
    }
}

/// `x` rounded up to a whole number, forgiving the last bits of a division
/// that should have come out whole; saturates at `u32::MAX`.
pub(super) fn whole(x: f64) -> u32 {
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

/// A memory request for a process of `rss_mib`: twice it, rounded up to
/// 64 MiB, at least the chart's request (`chart_default_mib`).
pub(super) fn memory_request(rss_mib: Option<f64>, chart_default_mib: u32) -> u32 {
    rss_mib.map_or(chart_default_mib, |rss| {
        let doubled = whole(rss * 2.0 / 64.0) * 64;
        doubled.max(chart_default_mib)
    })
}
