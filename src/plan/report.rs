//! The plan as the command prints it: [`render`], one function a section
//! (Costs, Stream, Gateways, Workers, Backlog of a spike, Cosmos DB,
//! Warnings), each figure beside its rule.

use std::fmt::{Display, Write as _};
use std::path::Path;

use skyport_runtime::config::WorkerSettings;

use super::format::{bytes, thousands};
use super::limits::{
    AUTOSCALE_RATIO, CHART_GATEWAY_MEMORY_MIB, CHART_WORKER_MEMORY_MIB, COSMOS_GB_PER_PARTITION,
    COSMOS_RU_PER_PARTITION, GATEWAY_UTILIZATION, Limits, MIN_GATEWAYS, MIN_MAX_IN_FLIGHT,
    PARTITIONS_PER_HUB, PREMIUM_MAX_PUS, PREMIUM_PARTITIONS_PER_PU, PREMIUM_PU_SIZES,
    PU_EGRESS_BYTES_PER_S, PU_INGRESS_BYTES_PER_S, RU_CHANGE_FEED_PER_WRITE, RU_PER_STATUS_READ,
    STANDARD_MAX_TUS, WINDOW_MARGIN, WORKER_HEADROOM,
};
use super::measured::MeasuredCosts;
use super::model::{Costs, STEPS, StreamKind, Target};
use super::sizing::{
    BacklogPlan, CosmosPlan, Deployment, GatewayPlan, Namespace, StreamPlan, Tier, WorkerPlan,
};

/// The table's rows: a figure and the rule behind it, one line each.
pub(super) struct Table(pub(super) String);

impl Table {
    /// A section's title, after a blank line.
    pub(super) fn heading(&mut self, title: &str) {
        let _ = writeln!(self.0, "\n{title}");
    }

    /// A figure: its label, its value right-aligned, its rule.
    pub(super) fn row(&mut self, label: &str, value: impl Display, rule: impl Display) {
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
pub(super) fn render(
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
    let latency_ms = workers.capacity.workflow_latency_s * 1_000.0;
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
    costs_section(&mut t, target, measured, benchmarks);
    stream_section(&mut t, target, limits, stream, namespace);
    gateways_section(&mut t, target, &costs, gateways);
    workers_section(&mut t, target, &costs, stream, workers, latency_ms);
    backlog_section(&mut t, target, backlog);
    cosmos_section(&mut t, target, &costs, cosmos, latency_ms);
    warnings_section(&mut t, warnings);
    t.0
}

/// Costs: the figures the plan is made from, each with its source.
fn costs_section(t: &mut Table, target: &Target, measured: &MeasuredCosts, benchmarks: &Path) {
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
    match &measured.cosmos_ru {
        Some(ru) => t.row(
            "Cosmos DB writes",
            format!("{:.1} RU/delivery", ru.value.status_writes),
            format!(
                "{}: status writes; reservations {:.1}",
                ru.source, ru.value.reservations
            ),
        ),
        None => t.row(
            "Cosmos DB writes",
            format!("{} RU/write", target.ru_per_write),
            "--ru-per-write, or 8 RU when the file holds no cosmos_cost run",
        ),
    }
}

/// Stream: an event's bytes, the partitions and their hubs or topics, and the
/// namespace that carries them.
fn stream_section(
    t: &mut Table,
    target: &Target,
    limits: &Limits,
    stream: &StreamPlan,
    namespace: &Namespace,
) {
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
    namespace_rows(t, target, namespace);
}

/// The Stream section's throughput units and namespace tier.
fn namespace_rows(t: &mut Table, target: &Target, namespace: &Namespace) {
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
}

/// Gateways: their replicas and memory.
fn gateways_section(t: &mut Table, target: &Target, costs: &Costs, gateways: &GatewayPlan) {
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
        t,
        gateways.memory_mib,
        CHART_GATEWAY_MEMORY_MIB,
        costs.gateway_rss_mib.is_some(),
    );
}

/// Workers: a workflow's latency, the capacity needed, the replicas, their
/// windows and memory.
fn workers_section(
    t: &mut Table,
    target: &Target,
    costs: &Costs,
    stream: &StreamPlan,
    workers: &WorkerPlan,
    latency_ms: f64,
) {
    let capacity = &workers.capacity;
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
        t,
        workers.memory_mib,
        CHART_WORKER_MEMORY_MIB,
        costs.worker_rss_mib.is_some(),
    );
}

/// Backlog of a spike: its peak, its drain, the longest wait, the retention.
fn backlog_section(t: &mut Table, target: &Target, backlog: &BacklogPlan) {
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
}

/// Cosmos DB: the status container's writes, RU/s, partitions and
/// throughput groups.
fn cosmos_section(
    t: &mut Table,
    target: &Target,
    costs: &Costs,
    cosmos: &CosmosPlan,
    latency_ms: f64,
) {
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
        match &costs.cosmos_ru {
            Some(ru) => format!(
                "capacity × ({:.1} RU of status writes measured a delivery + writes × ({RU_CHANGE_FEED_PER_WRITE} change feed + {RU_PER_STATUS_READ} status read))",
                ru.status_writes
            ),
            None => format!(
                "capacity × writes × ({} write + {RU_CHANGE_FEED_PER_WRITE} change feed + {RU_PER_STATUS_READ} status read)",
                target.ru_per_write
            ),
        },
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
    if let Some(others) = &cosmos.others {
        t.heading("Cosmos DB (the reservations container, measured)");
        t.row(
            "reservations",
            format!("{} RU/s", thousands(others.reservations_ru_per_s)),
            "every request named, at the spike's rate",
        );
    }
}

/// Warnings: what the plan meets but should be looked at, when there are any.
fn warnings_section(t: &mut Table, warnings: &[String]) {
    if !warnings.is_empty() {
        t.heading("Warnings");
        for warning in warnings {
            let _ = writeln!(t.0, "  {warning}");
        }
    }
}
