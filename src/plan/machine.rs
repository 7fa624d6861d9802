//! `skyport plan --stream embedded`: one machine running the all-in-one on
//! the embedded stream and store (`cargo run --release`). It sizes the
//! machine's cores, the stream's partitions and the worker's window, a
//! spike's backlog and the disk the retention window takes, from what the
//! benchmark's all-in-one phase measured, and says when a target is beyond
//! what one machine does.

use std::fmt::Write as _;
use std::path::Path;

use serde_json::Value;
use skyport_runtime::config::{MAX_PARTITIONS, StreamSettings, WorkerSettings};

use super::error::PlanError;
use super::format::{bytes, thousands};
use super::limits::{
    EMBEDDED_BYTES_PER_DELIVERY, EMBEDDED_BYTES_PER_RESERVATION, GATEWAY_UTILIZATION,
    MIN_MAX_IN_FLIGHT, ONE_MACHINE_WORKFLOWS_PER_S, WINDOW_MARGIN, WORKER_HEADROOM,
};
use super::measured::{Sourced, gateway_cpu_from_ingest, overhead_from_time_to_terminal};
use super::model::{Target, event_bytes, workflow_latency_s};
use super::report::Table;
use super::sizing::{above_zero, overhead_and_spike, whole};

/// What the all-in-one costs, each figure with its source.
#[derive(Debug, Clone, PartialEq)]
pub struct MachineCosts {
    /// The process's CPU µs per workflow, its request's intake included
    /// (gateway, worker and the simulated services in one process).
    pub workflow_cpu: Sourced,
    /// The CPU µs one accepted request costs the gateway alone.
    pub ingest_cpu: Sourced,
    /// A workflow's time beyond its service calls, ms.
    pub overhead: Sourced,
    /// The process's peak resident memory, MiB.
    pub rss: Option<Sourced>,
}

impl MachineCosts {
    /// The figures of `json` (a `BENCHMARKS.json`), the flags' where given.
    ///
    /// # Errors
    /// [`PlanError::Costs`] naming the file and the flags, when a figure is
    /// neither given nor in it.
    pub fn read(
        path: &Path,
        json: Result<&Value, &str>,
        workflow_cpu_us: Option<f64>,
        ingest_cpu_us: Option<f64>,
        overhead_ms: Option<f64>,
    ) -> Result<Self, PlanError> {
        let empty = Value::Null;
        let figures = json.unwrap_or(&empty);
        let missing = |what: &str| PlanError::Costs {
            path: path.to_owned(),
            reason: match json {
                Ok(_) => format!("holds no {what}"),
                Err(e) => e.to_owned(),
            },
            flags: "--worker-cpu-us and --gateway-cpu-us",
        };
        let flag = |value: Option<f64>, name: &str| {
            value.map(|value| Sourced {
                value,
                source: format!("--{name}"),
            })
        };
        let all_in_one = &figures["all_in_one"];
        let workflow_cpu = flag(workflow_cpu_us, "worker-cpu-us")
            .or_else(|| {
                let mut rounds: Vec<f64> = all_in_one["work"]
                    .as_array()?
                    .iter()
                    .filter_map(|round| round["cpu_us_per_workflow"].as_f64())
                    .collect();
                rounds.sort_by(f64::total_cmp);
                let median = *rounds.get(rounds.len() / 2)?;
                Some(Sourced {
                    value: median,
                    source: format!(
                        "all_in_one.work, the median of {} rounds: the whole process, intake, worker and the simulated services",
                        rounds.len()
                    ),
                })
            })
            .ok_or_else(|| missing("all-in-one CPU per workflow"))?;
        let ingest_cpu = flag(ingest_cpu_us, "gateway-cpu-us")
            .or_else(|| gateway_cpu_from_ingest(figures))
            .ok_or_else(|| missing("ingest rate"))?;
        let overhead = flag(overhead_ms, "workflow-overhead-ms")
            .or_else(|| overhead_from_time_to_terminal(figures))
            .unwrap_or_else(|| Sourced {
                value: 0.0,
                source: "not measured: 0 (pass --workflow-overhead-ms)".to_owned(),
            });
        let rss = all_in_one["peak_rss_mib"].as_f64().map(|value| Sourced {
            value,
            source: "all_in_one.peak_rss_mib".into(),
        });
        Ok(Self {
            workflow_cpu,
            ingest_cpu,
            overhead,
            rss,
        })
    }
}

/// One machine sized for a target: [`plan_machine`]'s answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Machine {
    /// The rate the worker must work off: headroom over the sustained
    /// rate, or a spike's backlog gone within the drain goal.
    pub needed_per_s: f64,
    /// Cores for the sustained rate at [`GATEWAY_UTILIZATION`], for the
    /// needed rate, and for the spike's intake; the machine's is the most.
    pub cores_sustained: f64,
    pub cores_needed: f64,
    pub cores_spike: f64,
    pub cores: u32,
    /// `stream.partitions` and `worker.max_in_flight`.
    pub partitions: u32,
    pub max_in_flight: u32,
    /// Workflows in flight at the needed rate (Little's law), with margin.
    pub in_flight: f64,
    /// What the cores work off while the spike's intake takes its share.
    pub drain_during_spike_per_s: f64,
    /// Requests waiting when the spike ends, and until they are gone.
    pub backlog_peak: f64,
    pub backlog_drain_s: f64,
    /// Disk: the retention window's status documents, a day of
    /// reservations if every request is named, a spike's backlog of events.
    pub documents_bytes: f64,
    pub reservations_bytes: f64,
    pub backlog_bytes: f64,
    /// The process's peak resident memory, when measured.
    pub memory_mib: Option<f64>,
    /// What the plan meets but should be looked at.
    pub warnings: Vec<String>,
}

/// Sizes one machine for `target`.
///
/// # Errors
/// [`PlanError::Invalid`] naming the flag of an input out of range.
pub fn plan_machine(target: &Target, costs: &MachineCosts) -> Result<Machine, PlanError> {
    above_zero(&[
        ("--sustained", target.sustained_per_s),
        ("--spike", target.spike_per_s),
        ("--spike-seconds", target.spike_seconds),
        ("--request-bytes", target.request_bytes),
        ("--service-latency-ms", target.service_latency_ms),
        ("--drain-minutes", target.drain_minutes),
        ("--status-retention-days", target.status_retention_days),
        ("--worker-cpu-us", costs.workflow_cpu.value),
        ("--gateway-cpu-us", costs.ingest_cpu.value),
    ])?;
    overhead_and_spike(target, costs.overhead.value)?;
    let workflow_us = costs.workflow_cpu.value;
    let ingest_us = costs.ingest_cpu.value.min(workflow_us);
    let drain_s = target.drain_minutes * 60.0;
    let needed_per_s = (WORKER_HEADROOM * target.sustained_per_s).max(
        (target.spike_per_s * target.spike_seconds + target.sustained_per_s * drain_s)
            / (target.spike_seconds + drain_s),
    );
    let cores_sustained = target.sustained_per_s * workflow_us / 1e6 / GATEWAY_UTILIZATION;
    let cores_needed = needed_per_s * workflow_us / 1e6;
    let cores_spike = target.spike_per_s * ingest_us / 1e6 / GATEWAY_UTILIZATION;
    let cores = whole(cores_sustained.max(cores_needed).max(cores_spike)).max(1);
    let capacity = f64::from(cores) * 1e6 / workflow_us;
    // While the spike arrives its intake comes first (the worker narrows its
    // window while the 202s slow); what is left works off workflows, whose
    // cost beyond their intake it pays.
    let drain_during_spike_per_s = ((f64::from(cores) * 1e6 - target.spike_per_s * ingest_us)
        / (workflow_us - ingest_us).max(1.0))
    .clamp(0.0, capacity);
    let backlog_peak =
        ((target.spike_per_s - drain_during_spike_per_s) * target.spike_seconds).max(0.0);
    let backlog_drain_s = if backlog_peak > 0.0 {
        backlog_peak / (capacity - target.sustained_per_s).max(f64::MIN_POSITIVE)
    } else {
        0.0
    };
    let latency_s = workflow_latency_s(target.service_latency_ms, costs.overhead.value);
    let in_flight = needed_per_s * latency_s * WINDOW_MARGIN;
    let partitions = StreamSettings::default()
        .partitions
        .max(cores)
        .min(MAX_PARTITIONS);
    let max_in_flight = whole(in_flight / f64::from(partitions)).max(MIN_MAX_IN_FLIGHT);
    let event = event_bytes(target.request_bytes)?;
    let mut warnings = Vec::new();
    if needed_per_s > ONE_MACHINE_WORKFLOWS_PER_S {
        warnings.push(format!(
            "the worker must work off {}/s, where one machine has worked off at most {}/s (16 cores, bound by its serial parts, not its cores): run the fleet on Event Hubs or Kafka and Cosmos DB (--stream eventhubs or kafka)",
            thousands(needed_per_s),
            thousands(ONE_MACHINE_WORKFLOWS_PER_S)
        ));
    }
    if backlog_drain_s > drain_s {
        warnings.push(format!(
            "a spike's backlog lasts {:.1} min, beyond --drain-minutes {}",
            backlog_drain_s / 60.0,
            target.drain_minutes
        ));
    }
    let default_window = u32::try_from(WorkerSettings::default().max_in_flight).unwrap_or(u32::MAX);
    if max_in_flight > default_window.saturating_mul(8) {
        warnings.push(format!(
            "worker.max_in_flight {max_in_flight} is over 8 × its default ({default_window}): slow services; check --service-latency-ms"
        ));
    }
    Ok(Machine {
        needed_per_s,
        cores_sustained,
        cores_needed,
        cores_spike,
        cores,
        partitions,
        max_in_flight,
        in_flight,
        drain_during_spike_per_s,
        backlog_peak,
        backlog_drain_s,
        documents_bytes: target.sustained_per_s
            * 86_400.0
            * target.status_retention_days
            * EMBEDDED_BYTES_PER_DELIVERY,
        reservations_bytes: target.sustained_per_s * 86_400.0 * EMBEDDED_BYTES_PER_RESERVATION,
        backlog_bytes: backlog_peak * event,
        memory_mib: costs.rss.as_ref().map(|rss| rss.value),
        warnings,
    })
}

/// The plan as the command prints it, each figure beside its rule, and the
/// settings that realise it.
pub fn render_machine(
    target: &Target,
    costs: &MachineCosts,
    machine: &Machine,
    benchmarks: &Path,
) -> String {
    let mut t = Table(format!(
        "Skyport on one machine (embedded stream and store): {}/s sustained, spikes of {}/s for {} s, each backlog gone within {} min.\n",
        thousands(target.sustained_per_s),
        thousands(target.spike_per_s),
        target.spike_seconds,
        target.drain_minutes,
    ));
    t.heading(&format!(
        "Costs (from {} unless a flag gave them)",
        benchmarks.display()
    ));
    t.row(
        "CPU per workflow",
        format!("{:.1} µs", costs.workflow_cpu.value),
        &costs.workflow_cpu.source,
    );
    t.row(
        "CPU per request",
        format!("{:.1} µs", costs.ingest_cpu.value),
        &costs.ingest_cpu.source,
    );
    t.row(
        "workflow overhead",
        format!("{:.1} ms", costs.overhead.value),
        &costs.overhead.source,
    );
    let latency_ms = workflow_latency_s(target.service_latency_ms, costs.overhead.value) * 1e3;
    t.heading("The machine");
    t.row(
        "work off",
        format!("{}/s", thousands(machine.needed_per_s)),
        format!(
            "max({WORKER_HEADROOM} × the sustained rate, the spike and the sustained rate over the spike and the drain goal)"
        ),
    );
    t.row(
        "cores",
        machine.cores.to_string(),
        format!(
            "ceil(max(sustained {:.2} at {:.0} %, work off {:.2}, the spike's intake {:.2} at {:.0} %))",
            machine.cores_sustained,
            GATEWAY_UTILIZATION * 100.0,
            machine.cores_needed,
            machine.cores_spike,
            GATEWAY_UTILIZATION * 100.0
        ),
    );
    if let Some(rss) = machine.memory_mib {
        t.row(
            "memory",
            format!("{rss:.0} MiB"),
            "all_in_one.peak_rss_mib: the process at its peak",
        );
    }
    t.row(
        "stream.partitions",
        machine.partitions.to_string(),
        format!(
            "one a core (a partition's loop is one task), from the default 8 to {MAX_PARTITIONS}"
        ),
    );
    t.row(
        "worker.max_in_flight",
        machine.max_in_flight.to_string(),
        format!(
            "{}/s × {latency_ms:.0} ms a workflow × {WINDOW_MARGIN} = {} in flight, over the partitions, at least {MIN_MAX_IN_FLIGHT}",
            thousands(machine.needed_per_s),
            thousands(machine.in_flight)
        ),
    );
    t.heading("A spike");
    t.row(
        "worked off meanwhile",
        format!("{}/s", thousands(machine.drain_during_spike_per_s)),
        "the cores the spike's intake leaves, at a workflow's cost beyond its intake",
    );
    t.row(
        "backlog",
        thousands(machine.backlog_peak),
        format!(
            "gone {:.1} min after the spike, in {} of events on disk",
            machine.backlog_drain_s / 60.0,
            bytes(machine.backlog_bytes)
        ),
    );
    t.heading("Disk");
    t.row(
        "status documents",
        bytes(machine.documents_bytes),
        format!(
            "the sustained rate × {} days (store.status_retention_s) × {} B a delivery",
            target.status_retention_days,
            thousands(EMBEDDED_BYTES_PER_DELIVERY)
        ),
    );
    t.row(
        "reservations",
        bytes(machine.reservations_bytes),
        format!(
            "if every request is named: the sustained rate × 24 h (gateway.idempotency_retention_s) × {EMBEDDED_BYTES_PER_RESERVATION} B"
        ),
    );
    let _ = writeln!(
        t.0,
        "\nSettings (--set or a -c file):\n  stream.partitions = {}\n  worker.max_in_flight = {}",
        machine.partitions, machine.max_in_flight
    );
    if !machine.warnings.is_empty() {
        let _ = writeln!(t.0, "\nWarnings");
        for warning in &machine.warnings {
            let _ = writeln!(t.0, "  - {warning}");
        }
    }
    t.0
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
