//! The fleet phases' results: each stream's all-in-one runs, its gateway
//! alone and the fleet at each worker count, with their verdicts against
//! each other and against the capacity plan.

use serde::{Deserialize, Serialize};

use crate::phases::Verdict;
use crate::phases::cosmos_cost::{Spent, per_delivery};
use crate::phases::end_to_end::EndToEnd;

/// A fleet phase: one stream's all-in-one runs, its gateway alone, and the
/// fleet at each worker count.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct FleetPhase {
    /// `kafka` or `eventhubs`.
    pub(crate) stream: String,
    /// All in one on the embedded stream and store: the baseline.
    pub(crate) embedded: EndToEnd,
    /// The same, posted at the rate `on_stream` ran at: the baseline of
    /// Skyport's CPU per workflow.
    #[serde(default)]
    pub(crate) embedded_paced: Option<EndToEnd>,
    /// All in one on the stream, status on the embedded store.
    pub(crate) on_stream: StreamRun,
    /// All in one on the stream, status on Cosmos DB (the emulator server).
    pub(crate) on_cosmos: StreamRun,
    pub(crate) gateway_alone: GatewayAlone,
    pub(crate) runs: Vec<FleetRun>,
}

impl FleetPhase {
    /// The stream's name in the table.
    fn title(&self) -> &'static str {
        if self.stream == "kafka" {
            "Kafka (tansu)"
        } else {
            "Event Hubs (the test broker)"
        }
    }

    /// The all-in-one run on the stream against the embedded one: its rate,
    /// and Skyport's CPU per workflow against [`Self::cpu_base`].
    pub(crate) fn ratios(&self) -> (f64, f64) {
        let (on, base) = (&self.on_stream.end_to_end, &self.embedded);
        (
            on.workflows_per_s / base.workflows_per_s.max(f64::EPSILON),
            on.cpu_us_per_workflow / self.cpu_base().cpu_us_per_workflow.max(f64::EPSILON),
        )
    }

    /// The embedded run whose rate is nearer the stream's (posted closed
    /// loop, or at the stream's rate): group commit carries fewer writes a
    /// commit at a lower rate, so CPU per workflow compares at one rate.
    fn cpu_base(&self) -> &EndToEnd {
        let rate = self.on_stream.end_to_end.workflows_per_s;
        let off = |run: &EndToEnd| (run.workflows_per_s - rate).abs();
        match &self.embedded_paced {
            Some(paced) if off(paced) < off(&self.embedded) => paced,
            _ => &self.embedded,
        }
    }
}

impl FleetPhase {
    /// What Skyport's CPU per workflow on the stream is held against, and
    /// how the embedded database grouped its commits in each run.
    fn cpu_baseline(&self) -> String {
        let (on, base) = (&self.on_stream.end_to_end, &self.embedded);
        let Some(paced) = &self.embedded_paced else {
            return format!(" against {:.0} µs", base.cpu_us_per_workflow);
        };
        let runs = [
            ("the stream", on),
            ("embedded, closed loop", base),
            ("embedded, posted at the stream's rate", paced),
        ];
        let line = |(what, run): &(&str, &EndToEnd)| {
            let commits = run.database.as_ref().map_or(String::new(), |db| {
                format!(
                    ", {:.3} database commits a workflow ({:.1} writes each)",
                    db.commits_per_workflow, db.writes_per_commit
                )
            });
            format!(
                "{what}: {:.0} workflows/s, {:.0} µs{commits}",
                run.workflows_per_s, run.cpu_us_per_workflow
            )
        };
        format!(
            " against the embedded run nearer its rate ({})",
            runs.iter().map(line).collect::<Vec<_>>().join("; ")
        )
    }

    pub(crate) fn verdicts(&self) -> Vec<Verdict> {
        let title = self.title();
        let kafka = self.stream == "kafka";
        let (rate, cpu) = self.ratios();
        let (on, base) = (&self.on_stream.end_to_end, &self.embedded);
        let paced = self.cpu_baseline();
        let mut verdicts = vec![Verdict {
            what: format!("{title}: all in one against the embedded stream, services at 20 ms"),
            measured: format!(
                "{:.0} workflows/s against {:.0}/s: **{rate:.2} ×**; Skyport's CPU {:.0} µs a \
                 workflow: **{cpu:.2} ×**{paced}; the broker's {:.0} µs apart; peak RSS {:.0} MiB",
                on.workflows_per_s,
                base.workflows_per_s,
                on.cpu_us_per_workflow,
                self.on_stream.broker_cpu_us_per_workflow,
                on.peak_rss_mib
            ),
            target: if kafka {
                "rate ≥ 0.8 ×, CPU ≤ 1.2 ×"
            } else {
                "CPU ≤ 1.2 × (the rate is the test broker's)"
            },
            met: Some(cpu <= 1.2 && (!kafka || rate >= 0.8)),
        }];
        let cosmos = &self.on_cosmos;
        let alone = &self.gateway_alone;
        verdicts.push(Verdict {
            what: format!("{title}: all in one, status on Cosmos DB (emulator); the gateway alone"),
            measured: format!(
                "{:.0} workflows/s, Skyport's CPU {:.0} µs per workflow (broker {:.0} µs, emulator {:.0} µs apart); \
                 the gateway alone {:.0} accepted/s at {:.0} µs per request (broker {:.0} µs apart); \
                 request units a workflow over the run (unnamed, no callback URL): {}",
                cosmos.end_to_end.workflows_per_s,
                cosmos.end_to_end.cpu_us_per_workflow,
                cosmos.broker_cpu_us_per_workflow,
                cosmos.emulator_cpu_us_per_workflow.unwrap_or(0.0),
                alone.accepted_per_s,
                alone.cpu_us_per_request,
                alone.broker_cpu_us_per_request,
                per_delivery(
                    &cosmos.end_to_end.request_units,
                    cosmos.end_to_end.completed as f64
                )
            ),
            target: "(the fleet's baselines)",
            met: None,
        });
        for run in &self.runs {
            let (worker, gateway, plan) = self.run_ratios(run);
            verdicts.push(Verdict {
                what: format!("{title}: fleet, 1 gateway and {} workers", run.workers),
                measured: format!(
                    "{:.0} accepted/s, the workers stopped; then {:.0} workflows/s ({} drained in {:.1} s), the plan predicts {:.0}/s \
                     ({:.1} s): **{:+.0} %**, the cores {:.0} % busy (the plan: 100 %); CPU per workflow: gateway and workers {:.0} µs against \
                     {:.0} µs all in one: **{worker:.2} ×** (idle, the gateway used {:.3} and the workers \
                     {:.3} cores: {:.0} µs a workflow net of it, {:.2} ×); gateway {:.0} µs per request \
                     while posting ({:.0} µs over the run) against {:.0} µs alone just before \
                     ({:.0} µs alone in this process): **{gateway:.2} ×**; apart: broker {:.0} µs, emulator {:.0} µs, services \
                     {:.0} µs; {:.0} read and not completed; a workflow alone {:.0} ms; peak RSS gateway {:.0} MiB, worker {:.0} MiB; \
                     request units a workflow: {}",
                    run.accepted_per_s,
                    run.workflows_per_s,
                    run.completed,
                    run.drain_s,
                    run.predicted_workflows_per_s,
                    run.predicted_seconds,
                    plan * 100.0,
                    busy(run) * 100.0,
                    fleet_cpu_per_workflow(run),
                    cosmos.end_to_end.cpu_us_per_workflow,
                    run.gateway_idle_cores,
                    run.workers_idle_cores,
                    net_cpu_per_workflow(run),
                    net_cpu_per_workflow(run)
                        / cosmos.end_to_end.cpu_us_per_workflow.max(f64::EPSILON),
                    run.gateway_posting_cpu_us_per_request
                        .unwrap_or(run.gateway_cpu_us_per_request),
                    run.gateway_cpu_us_per_request,
                    self.gateway_alone_for(run),
                    alone.cpu_us_per_request,
                    run.broker_cpu_us_per_workflow,
                    run.emulator_cpu_us_per_workflow,
                    run.services_cpu_us_per_workflow,
                    run.mean_in_flight,
                    run.workflow_latency_ms,
                    run.gateway_rss_mib,
                    run.worker_rss_mib,
                    per_delivery(&run.request_units, run.completed as f64)
                ),
                target: "CPU ≤ 1.2 × each; plan within ±15 %",
                met: Some(worker <= 1.2 && gateway <= 1.2 && plan.abs() <= 0.15),
            });
        }
        verdicts
    }

    /// A fleet run against its baselines: the fleet's gateway and workers'
    /// CPU per workflow against the all-in-one's on Cosmos DB, the gateway's
    /// per request against the gateway alone's, and the measured rate's
    /// departure from the plan's.
    pub(crate) fn run_ratios(&self, run: &FleetRun) -> (f64, f64, f64) {
        (
            fleet_cpu_per_workflow(run)
                / self
                    .on_cosmos
                    .end_to_end
                    .cpu_us_per_workflow
                    .max(f64::EPSILON),
            run.gateway_posting_cpu_us_per_request
                .unwrap_or(run.gateway_cpu_us_per_request)
                / self.gateway_alone_for(run).max(f64::EPSILON),
            run.workflows_per_s / run.predicted_workflows_per_s.max(f64::EPSILON) - 1.0,
        )
    }

    /// What a run's gateway per request is held against: the same gateway
    /// alone just before the run, else (runs before it was measured) the
    /// gateway alone in the bench's process.
    fn gateway_alone_for(&self, run: &FleetRun) -> f64 {
        run.gateway_alone_cpu_us_per_request
            .unwrap_or(self.gateway_alone.cpu_us_per_request)
    }

    /// What fails the run: an accepted request not completed in any of its
    /// runs, or one Failed; in a smoke run, a run that completed nothing.
    pub(crate) fn failures(&self, full: bool) -> Vec<String> {
        let mut failures = Vec::new();
        let runs = [
            &self.embedded,
            &self.on_stream.end_to_end,
            &self.on_cosmos.end_to_end,
        ]
        .into_iter()
        .map(|e| (e.accepted, e.completed, e.failed))
        .chain(
            self.runs
                .iter()
                .map(|r| (r.accepted, r.completed, r.failed)),
        );
        for (accepted, completed, failed) in runs {
            if completed < accepted || failed > 0 || (!full && completed == 0) {
                failures.push(format!(
                    "fleet on {}: {completed} of {accepted} accepted completed, {failed} Failed",
                    self.stream
                ));
            }
        }
        failures
    }
}

/// A fleet run's gateway and workers together, per workflow: what an
/// all-in-one process spends alone.
fn fleet_cpu_per_workflow(run: &FleetRun) -> f64 {
    run.gateway_cpu_us_per_request * run.accepted as f64 / run.completed.max(1) as f64
        + run.worker_cpu_us_per_workflow
}

/// How busy this machine's cores were over a fleet run's drain (every
/// process on it shares them): every process's CPU time (the workers', the
/// gateway's, the broker's, the emulator's and the services') over the
/// drain's seconds. The plan's model takes them as busy all the time.
fn busy(run: &FleetRun) -> f64 {
    let cores = std::thread::available_parallelism().map_or(1, usize::from) as f64;
    let per_workflow = run.worker_cpu_us_per_workflow
        + run.drain_gateway_cpu_us_per_workflow
        + run.drain_others_cpu_us_per_workflow;
    per_workflow * run.completed as f64 / 1e6 / run.drain_s.max(f64::EPSILON) / cores
}

/// [`fleet_cpu_per_workflow`] less what the gateway and the workers spend
/// idle, over the run's seconds.
fn net_cpu_per_workflow(run: &FleetRun) -> f64 {
    fleet_cpu_per_workflow(run)
        - (run.gateway_idle_cores + run.workers_idle_cores) * run.seconds * 1e6
            / run.completed.max(1) as f64
}

/// All in one on a stream whose broker (and emulator) run as processes of
/// their own; their CPU time over the run, per workflow.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct StreamRun {
    pub(crate) end_to_end: EndToEnd,
    pub(crate) broker_cpu_us_per_workflow: f64,
    pub(crate) emulator_cpu_us_per_workflow: Option<f64>,
}

/// The gateway alone on a stream, its CPU time per accepted request.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct GatewayAlone {
    pub(crate) requests: u64,
    pub(crate) accepted: u64,
    pub(crate) accepted_per_s: f64,
    pub(crate) cpu_us_per_request: f64,
    pub(crate) broker_cpu_us_per_request: f64,
    pub(crate) peak_rss_mib: f64,
}

/// One gateway and `workers` workers, processes of their own: a backlog
/// posted at once with the workers stopped, then drained.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct FleetRun {
    pub(crate) workers: usize,
    pub(crate) requests: u64,
    pub(crate) accepted: u64,
    /// Deliveries the workers brought to a terminal state.
    pub(crate) completed: u64,
    pub(crate) failed: u64,
    /// From the first request until the last workflow completed.
    pub(crate) seconds: f64,
    /// The drain: from the workers' resuming until the last workflow completed.
    #[serde(default)]
    pub(crate) drain_s: f64,
    pub(crate) posting_s: f64,
    pub(crate) accepted_per_s: f64,
    /// Over the drain.
    pub(crate) workflows_per_s: f64,
    /// The gateway's CPU time over the whole run (its idle cost while the
    /// workers drain included), a request.
    pub(crate) gateway_cpu_us_per_request: f64,
    /// The gateway's CPU time while the requests were posted (until the last
    /// was answered) with the workers stopped, a request: what the gateway
    /// alone is measured over; `None` when the posting outlasted the pause.
    #[serde(default)]
    pub(crate) gateway_posting_cpu_us_per_request: Option<f64>,
    /// The same gateway with no workers, a process of its own just before
    /// the run (the same binary, configuration and backlog), a request:
    /// what the gateway while posting is held against.
    #[serde(default)]
    pub(crate) gateway_alone_cpu_us_per_request: Option<f64>,
    /// The workers' CPU time together, per workflow.
    pub(crate) worker_cpu_us_per_workflow: f64,
    pub(crate) broker_cpu_us_per_workflow: f64,
    pub(crate) emulator_cpu_us_per_workflow: f64,
    pub(crate) services_cpu_us_per_workflow: f64,
    /// The process posting the requests: it shares the cores too.
    pub(crate) poster_cpu_us_per_workflow: f64,
    /// Over the drain, a workflow: the gateway's CPU, and the broker's, the
    /// emulator's and the services' together (what the plan's prediction
    /// of the drain and the cores' busy share take).
    #[serde(default)]
    pub(crate) drain_gateway_cpu_us_per_workflow: f64,
    #[serde(default)]
    pub(crate) drain_others_cpu_us_per_workflow: f64,
    /// Cores the gateway, and the workers together, use idle before the
    /// run: what they spend whatever the load (leases, change-feed polls,
    /// metrics), over the run's seconds in the figures per workflow.
    pub(crate) gateway_idle_cores: f64,
    pub(crate) workers_idle_cores: f64,
    pub(crate) gateway_rss_mib: f64,
    /// The largest worker's peak.
    pub(crate) worker_rss_mib: f64,
    /// Events the workers had read and not completed (their read-ahead
    /// included), on average over the run.
    pub(crate) mean_in_flight: f64,
    /// A workflow's time from its POST to its terminal state with the fleet
    /// idle, after the run, and what of it is not the five service calls.
    pub(crate) workflow_latency_ms: f64,
    pub(crate) workflow_overhead_ms: f64,
    /// The capacity plan's model for the same shape and backlog, with the
    /// costs the fewest workers measured (set once every run is measured).
    pub(crate) predicted_workflows_per_s: f64,
    pub(crate) predicted_seconds: f64,
    /// Request units the gateway and workers spent, by kind (from their
    /// `/metrics`).
    #[serde(default)]
    pub(crate) request_units: Vec<Spent>,
}
