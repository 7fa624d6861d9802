//! What a run measured: the JSON written to `BENCHMARKS.json`, the table
//! printed for `BENCHMARKS.md`, and the verdict on each target.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::cpu::CpuTime;
use crate::fairness::{Expedited, NoisyNeighbour};
use crate::held::HeldReads;
use crate::load::Measured;
use crate::poster::{Latency, Posted};
use crate::quotas::QuotaCost;

/// Read back to redraw the charts (`-- charts`): a phase a run did not have
/// is empty or null.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Results {
    pub(crate) plan: String,
    pub(crate) machine: Machine,
    #[serde(default)]
    pub(crate) ingest: Vec<Ingest>,
    #[serde(default)]
    pub(crate) store: Vec<Store>,
    pub(crate) named: Option<Named>,
    pub(crate) fixed_rate: Option<FixedRate>,
    pub(crate) burst: Option<Burst>,
    pub(crate) end_to_end: Option<EndToEnd>,
    pub(crate) rate_limited: Option<RateLimited>,
    pub(crate) all_in_one: Option<WholeSystem>,
    #[serde(default)]
    pub(crate) time_to_terminal: Vec<TimeToTerminal>,
    #[serde(default)]
    pub(crate) held_reads: Option<HeldReads>,
    #[serde(default)]
    pub(crate) quotas: Option<QuotaCost>,
    #[serde(default)]
    pub(crate) expedited: Option<Expedited>,
    #[serde(default)]
    pub(crate) noisy_neighbour: Option<NoisyNeighbour>,
    pub(crate) kafka: Option<KafkaRun>,
    #[serde(default)]
    pub(crate) fleet_kafka: Option<FleetPhase>,
    #[serde(default)]
    pub(crate) fleet_eventhubs: Option<FleetPhase>,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Machine {
    pub(crate) date: String,
    pub(crate) commit: String,
    pub(crate) cores: usize,
    pub(crate) memory_gib: f64,
    pub(crate) cpu: String,
    pub(crate) kernel: String,
    pub(crate) load_generator: String,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Ingest {
    pub(crate) connections: u32,
    pub(crate) ceiling: Measured,
    pub(crate) skyport: Measured,
    /// Skyport's requests/s over the ceiling's, in the round of the median ratio.
    pub(crate) ratio: f64,
    /// Every round's ratio, lowest first.
    pub(crate) ratios: Vec<f64>,
    /// 202s with no event in the stream: must be 0.
    pub(crate) accepted_not_published: u64,
    /// The embedded store's group commits: how often, and how many writes each carried.
    pub(crate) commits_per_s: f64,
    pub(crate) writes_per_commit: f64,
    pub(crate) peak_rss_mib: f64,
}

/// The embedded store alone: appends from `concurrency` tasks, no HTTP.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Store {
    pub(crate) concurrency: u32,
    pub(crate) appends: u64,
    pub(crate) appends_per_s: f64,
    pub(crate) commits_per_s: f64,
    pub(crate) appends_per_commit: f64,
}

/// The gateway alone, the same distinct requests posted unnamed and then
/// each with an `Idempotency-Key` (64 connections, from the poster).
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Named {
    pub(crate) requests: u64,
    pub(crate) unnamed_per_s: f64,
    pub(crate) keyed_per_s: f64,
    /// Keyed over unnamed.
    pub(crate) ratio: f64,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct FixedRate {
    pub(crate) rate: u32,
    pub(crate) seconds: f64,
    pub(crate) measured: Measured,
    pub(crate) peak_rss_mib: f64,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Burst {
    pub(crate) requests: u64,
    pub(crate) connections: u32,
    /// The worker's rate limit while the burst drains.
    pub(crate) drain_rate: u32,
    pub(crate) accepted: u64,
    /// Requests not answered 202, by what they got.
    pub(crate) not_accepted: BTreeMap<String, u64>,
    /// Events in the stream at the end.
    pub(crate) published: u64,
    /// Deliveries that reached a terminal state.
    pub(crate) terminal: u64,
    /// Of them, Failed (every request is valid: must be 0).
    pub(crate) failed: u64,
    /// Durable requests that did not reach a terminal state: must be 0.
    pub(crate) lost: u64,
    /// How long sending took.
    pub(crate) send_s: f64,
    /// From the last answer until every durable request was terminal.
    pub(crate) drain_s: f64,
    pub(crate) measured: Posted,
    pub(crate) peak_rss_mib: f64,
    /// Every half second from the first request until the drain ended
    /// (absent from runs before it was kept): the burst chart.
    #[serde(default)]
    pub(crate) timeline: Vec<BurstSample>,
}

/// The burst's counts at one moment.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct BurstSample {
    /// Since the first request.
    pub(crate) seconds: f64,
    /// Events in the stream: the requests accepted so far.
    pub(crate) published: u64,
    /// Deliveries that reached a terminal state so far.
    pub(crate) terminal: u64,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct EndToEnd {
    pub(crate) requests: u64,
    pub(crate) accepted: u64,
    /// Deliveries that reached a terminal state.
    pub(crate) completed: u64,
    /// Of them, Failed (every request is valid: must be 0).
    pub(crate) failed: u64,
    /// From the first request until the last workflow completed.
    pub(crate) seconds: f64,
    pub(crate) posting_s: f64,
    pub(crate) workflows_per_s: f64,
    /// The most workflows completed in one second.
    pub(crate) best_second: u64,
    /// Skyport's CPU time (this process: gateway and worker) per completed workflow.
    pub(crate) cpu_us_per_workflow: f64,
    pub(crate) cpu: CpuSplit,
    pub(crate) peak_rss_mib: f64,
    /// The embedded database's commits over the run, when status is kept there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) database: Option<DatabaseCommits>,
}

/// How the embedded database's group commit grouped a run's writes (status
/// documents, and the Event Hubs processor's leases when it runs on them):
/// each commit's cost is mostly fixed, so fewer writes a commit cost more a
/// workflow.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct DatabaseCommits {
    pub(crate) commits_per_workflow: f64,
    pub(crate) writes_per_commit: f64,
}

/// CPU time over a phase, by process: what shares the two cores.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct CpuSplit {
    pub(crate) seconds: f64,
    /// This process: the gateway and the worker.
    pub(crate) skyport_s: f64,
    /// The simulated services' process.
    pub(crate) services_s: f64,
    /// The poster's process (the only child waited for in the phase).
    pub(crate) poster_s: f64,
}

impl CpuSplit {
    /// What was used since `before` (this process's reading and that of the
    /// services, `services_pid`), over `elapsed`.
    pub(crate) fn between(
        before: (CpuTime, CpuTime),
        services_pid: u32,
        elapsed: std::time::Duration,
    ) -> anyhow::Result<Self> {
        let this = CpuTime::this()?.since(before.0);
        let services = CpuTime::of(services_pid)?.since(before.1);
        Ok(Self {
            seconds: elapsed.as_secs_f64(),
            skyport_s: this.own_s,
            services_s: services.own_s,
            poster_s: this.children_s,
        })
    }

    /// Cores used on average by each process, for the table.
    fn cores(&self) -> String {
        let per = |s: f64| s / self.seconds.max(f64::EPSILON);
        format!(
            "cores: Skyport {:.2}, services {:.2}, poster {:.2}",
            per(self.skyport_s),
            per(self.services_s),
            per(self.poster_s)
        )
    }
}

/// Deliveries fed at a fixed rate, and each one's time from its acceptance
/// to its terminal status (from its status document's timestamps).
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct TimeToTerminal {
    pub(crate) rate: u32,
    pub(crate) seconds: f64,
    pub(crate) accepted: u64,
    /// Every request is valid: must be 0.
    pub(crate) failed: u64,
    /// The 202's latency, from when each request was due.
    pub(crate) accept: Option<Latency>,
    /// From acceptance to the terminal status.
    pub(crate) terminal: Option<Latency>,
    /// From the terminal status's write to its callback's arrival (absent
    /// from runs before the requests asked for callbacks).
    #[serde(default)]
    pub(crate) callback: Option<Latency>,
}

/// The stream on Kafka (a local tansu broker on its memory engine: what
/// Skyport costs on Kafka, not what a production broker does).
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct KafkaRun {
    pub(crate) partitions: u32,
    pub(crate) ingest: Vec<KafkaIngest>,
    pub(crate) end_to_end: EndToEnd,
}

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

    fn verdicts(&self) -> Vec<Verdict> {
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
                 the gateway alone {:.0} accepted/s at {:.0} µs per request (broker {:.0} µs apart)",
                cosmos.end_to_end.workflows_per_s,
                cosmos.end_to_end.cpu_us_per_workflow,
                cosmos.broker_cpu_us_per_workflow,
                cosmos.emulator_cpu_us_per_workflow.unwrap_or(0.0),
                alone.accepted_per_s,
                alone.cpu_us_per_request,
                alone.broker_cpu_us_per_request
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
                     {:.0} µs; {:.0} read and not completed; a workflow alone {:.0} ms; peak RSS gateway {:.0} MiB, worker {:.0} MiB",
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
                    run.worker_rss_mib
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
}

/// The gateway alone on Kafka against the ceiling, at one connection count.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct KafkaIngest {
    pub(crate) connections: u32,
    pub(crate) ceiling: Measured,
    pub(crate) skyport: Measured,
    pub(crate) ratio: f64,
    pub(crate) peak_rss_mib: f64,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct RateLimited {
    pub(crate) rate: u32,
    pub(crate) seconds: f64,
    pub(crate) completed: u64,
    pub(crate) achieved_per_s: f64,
    /// Accepted requests still waiting when the window closed (the backlog was big enough).
    pub(crate) waiting_after: u64,
}

/// The whole system as users run it (`cargo run --release`): gateway, worker
/// and the simulated services at their defaults in one process on the
/// embedded store, loaded by the poster (distinct requests).
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct WholeSystem {
    /// Closed loop at this many connections: the ceiling and Skyport, both
    /// loaded by the poster, in the round of the median ratio.
    pub(crate) connections: u32,
    pub(crate) ceiling: Posted,
    pub(crate) skyport: Posted,
    /// Skyport's requests/s over the ceiling's.
    pub(crate) ratio: f64,
    /// Every round's ratio, lowest first.
    pub(crate) ratios: Vec<f64>,
    /// Each closed-loop round's workflows, from its first request until
    /// the last was terminal, in the order run.
    pub(crate) work: Vec<WholeRound>,
    /// Open loop: requests due per second, for how long, and what they got
    /// (latency from when each was due).
    pub(crate) rate: u32,
    pub(crate) seconds: f64,
    pub(crate) open_loop: Posted,
    /// 202s over the phase, every round and the open loop.
    pub(crate) accepted: u64,
    /// Events in the stream at the end.
    pub(crate) published: u64,
    /// Accepted requests not yet terminal when the open loop ended.
    pub(crate) backlog: u64,
    /// From the open loop's end until every durable request was terminal.
    pub(crate) drain_s: f64,
    /// Deliveries that reached a terminal state: Scheduled, Failed (none
    /// cancelled).
    pub(crate) terminal: u64,
    pub(crate) scheduled: u64,
    /// Every request is valid and the services fail no call: must be 0.
    pub(crate) failed: u64,
    /// Of the whole phase.
    pub(crate) peak_rss_mib: f64,
}

/// The workflows of one closed-loop round of the all-in-one.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct WholeRound {
    pub(crate) workflows: u64,
    pub(crate) seconds: f64,
    pub(crate) workflows_per_s: f64,
    /// The process's CPU time per workflow: gateway, worker and the
    /// simulated services it runs, as a user's process spends it.
    pub(crate) cpu_us_per_workflow: f64,
}

/// A target of the issue, and whether this run met it.
struct Verdict {
    what: String,
    measured: String,
    target: &'static str,
    /// `None` for a figure with no target.
    met: Option<bool>,
}

impl Results {
    pub(crate) fn new(plan: &str, load_generator: &str) -> Self {
        Self {
            plan: plan.to_owned(),
            machine: Machine::read(load_generator),
            ingest: Vec::new(),
            store: Vec::new(),
            named: None,
            fixed_rate: None,
            burst: None,
            end_to_end: None,
            rate_limited: None,
            all_in_one: None,
            time_to_terminal: Vec::new(),
            held_reads: None,
            quotas: None,
            expedited: None,
            noisy_neighbour: None,
            kafka: None,
            fleet_kafka: None,
            fleet_eventhubs: None,
        }
    }

    fn verdicts(&self) -> Vec<Verdict> {
        let mut verdicts = Vec::new();
        for row in &self.ingest {
            verdicts.push(Verdict {
                what: format!("ingest, {} connections", row.connections),
                measured: format!(
                    "{:.0}/s against {:.0}/s: {:.2} × the ceiling (rounds: {}); p50 {:.2} ms, p99 {:.2} ms \
                     (ceiling p50 {:.2} ms, p99 {:.2} ms); {:.0} commits/s of {:.1} events",
                    row.skyport.requests_per_s,
                    row.ceiling.requests_per_s,
                    row.ratio,
                    row.ratios
                        .iter()
                        .map(|r| format!("{r:.2}"))
                        .collect::<Vec<_>>()
                        .join(", "),
                    row.skyport.p50_ms,
                    row.skyport.p99_ms,
                    row.ceiling.p50_ms,
                    row.ceiling.p99_ms,
                    row.commits_per_s,
                    row.writes_per_commit
                ),
                target: "≥ 0.6 × the ceiling",
                met: Some(row.ratio >= 0.6),
            });
        }
        for row in &self.store {
            verdicts.push(Verdict {
                what: format!("store alone, {} concurrent appends", row.concurrency),
                measured: format!(
                    "{:.0} appends/s: {:.0} commits/s of {:.1}",
                    row.appends_per_s, row.commits_per_s, row.appends_per_commit
                ),
                target: "(what bounds ingest)",
                met: None,
            });
        }
        if let Some(n) = &self.named {
            verdicts.push(Verdict {
                what: format!("{} requests with an Idempotency-Key each", n.requests),
                measured: format!(
                    "{:.0}/s against {:.0}/s unnamed: {:.2} × (one reservation before each event)",
                    n.keyed_per_s, n.unnamed_per_s, n.ratio
                ),
                target: "(what naming costs)",
                met: None,
            });
        }
        if let Some(f) = &self.fixed_rate {
            let m = &f.measured;
            let errors = m.requests - m.status("202");
            verdicts.push(Verdict {
                what: format!("fixed rate {}/s for {:.0} s", f.rate, f.seconds),
                measured: format!(
                    "{:.0}/s; p50 {:.2} ms, p99 {:.2} ms, p99.9 {:.2} ms; {errors} not 202",
                    m.requests_per_s, m.p50_ms, m.p99_ms, m.p99_9_ms
                ),
                target: "p99 ≤ 10 ms, no errors",
                met: Some(m.p99_ms <= 10.0 && errors == 0),
            });
        }
        if let Some(b) = &self.burst {
            verdicts.push(Verdict {
                what: format!(
                    "burst of {} at {} connections, drained at {}/s",
                    b.requests, b.connections, b.drain_rate
                ),
                measured: format!(
                    "{} accepted in {:.1} s ({:.0}/s), {} not ({}); {} terminal ({} Failed), {} lost; drained {:.1} s after",
                    b.accepted,
                    b.send_s,
                    b.measured.requests_per_s,
                    b.requests - b.accepted,
                    describe(&b.not_accepted),
                    b.terminal,
                    b.failed,
                    b.lost,
                    b.drain_s
                ),
                target: "0 lost",
                met: Some(b.lost == 0),
            });
        }
        if let Some(e) = &self.end_to_end {
            verdicts.push(Verdict {
                what: "end to end, 5 services at 20 ms, limiter off".into(),
                measured: format!(
                    "{:.0} workflows/s Scheduled ({} in {:.1} s, {} Failed; best second {})",
                    e.workflows_per_s,
                    e.completed - e.failed,
                    e.seconds,
                    e.failed,
                    e.best_second
                ),
                target: "≥ 5,000 workflows/s",
                met: Some(e.workflows_per_s >= 5_000.0),
            });
            verdicts.push(Verdict {
                what: "end to end: Skyport's CPU per workflow".into(),
                measured: format!(
                    "{:.0} µs ({:.1} s of CPU over {} workflows; {})",
                    e.cpu_us_per_workflow,
                    e.cpu.skyport_s,
                    e.completed,
                    e.cpu.cores()
                ),
                target: "≤ 300 µs",
                met: Some(e.cpu_us_per_workflow <= 300.0),
            });
        }
        for t in &self.time_to_terminal {
            let with = if t.callback.is_some() {
                ", a callback each"
            } else {
                ""
            };
            verdicts.push(Verdict {
                what: format!(
                    "time to terminal at {}/s for {:.0} s, 5 services at 20 ms{with}",
                    t.rate, t.seconds
                ),
                measured: format!(
                    "{} accepted ({} Failed); acceptance to terminal: {}; the 202: {}",
                    t.accepted,
                    t.failed,
                    latency(t.terminal.as_ref()),
                    latency(t.accept.as_ref())
                ),
                target: if t.rate >= 2_000 && t.callback.is_none() {
                    "p99 ≤ 200 ms"
                } else {
                    "(the time a client waits)"
                },
                met: (t.rate >= 2_000 && t.callback.is_none())
                    .then(|| t.terminal.as_ref().is_some_and(|l| l.p99_ms <= 200.0)),
            });
            if let Some(callback) = &t.callback {
                let goal = t.rate == 1_000;
                verdicts.push(Verdict {
                    what: format!(
                        "callbacks at {}/s: the terminal write to the callback's arrival",
                        t.rate
                    ),
                    measured: latency(Some(callback)),
                    target: if goal {
                        "p99 ≤ 100 ms"
                    } else {
                        "(the time a receiver waits)"
                    },
                    met: goal.then_some(callback.p99_ms <= 100.0),
                });
            }
        }
        if let Some(r) = &self.rate_limited {
            let off = (r.achieved_per_s - f64::from(r.rate)) / f64::from(r.rate) * 100.0;
            verdicts.push(Verdict {
                what: format!("rate limiter at {}/s", r.rate),
                measured: format!(
                    "{:.1}/s ({:+.2} %): {} in {:.1} s, {} still waiting",
                    r.achieved_per_s, off, r.completed, r.seconds, r.waiting_after
                ),
                target: "within 1 %",
                met: Some(off.abs() <= 1.0 && r.waiting_after > 0),
            });
        }
        if let Some(a) = &self.all_in_one {
            verdicts.push(Verdict {
                what: format!(
                    "all in one, closed loop at {} connections (both from the poster)",
                    a.connections
                ),
                measured: format!(
                    "{:.0}/s against {:.0}/s: {:.2} × the ceiling (rounds: {}); {} (ceiling {})",
                    a.skyport.requests_per_s,
                    a.ceiling.requests_per_s,
                    a.ratio,
                    a.ratios
                        .iter()
                        .map(|r| format!("{r:.2}"))
                        .collect::<Vec<_>>()
                        .join(", "),
                    latency(a.skyport.latency.as_ref()),
                    latency(a.ceiling.latency.as_ref())
                ),
                target: "(ingest beside the worker and the services)",
                met: None,
            });
            verdicts.push(Verdict {
                what: "all in one, closed-loop rounds followed to terminal".into(),
                measured: a
                    .work
                    .iter()
                    .map(|r| {
                        format!(
                            "{:.0} workflows/s at {:.0} µs of process CPU each ({} in {:.1} s)",
                            r.workflows_per_s, r.cpu_us_per_workflow, r.workflows, r.seconds
                        )
                    })
                    .collect::<Vec<_>>()
                    .join("; "),
                target: "(as users run it: the services' CPU included)",
                met: None,
            });
            verdicts.push(Verdict {
                what: format!("all in one, open loop {}/s for {:.0} s", a.rate, a.seconds),
                measured: format!(
                    "{:.0}/s (sent over {:.1} s); {}; not 202: {}; \
                     {} accepted not yet terminal at its end",
                    a.open_loop.requests_per_s,
                    a.open_loop.seconds,
                    latency(a.open_loop.latency.as_ref()),
                    describe(&a.open_loop.other_than("202")),
                    a.backlog
                ),
                target: "(the whole system)",
                met: None,
            });
            let lost = a.published.max(a.accepted).saturating_sub(a.terminal);
            verdicts.push(Verdict {
                what: "all in one, every accepted request followed".into(),
                measured: format!(
                    "{} accepted, {} in the stream: {} terminal ({} Scheduled, {} Failed), \
                     {lost} lost; drained {:.1} s after the open loop",
                    a.accepted, a.published, a.terminal, a.scheduled, a.failed, a.drain_s
                ),
                target: "0 lost, 0 Failed",
                met: Some(lost == 0 && a.failed == 0),
            });
        }
        if let Some(k) = &self.kafka {
            for row in &k.ingest {
                verdicts.push(Verdict {
                    what: format!(
                        "Kafka (tansu, memory engine, {} partitions): gateway alone at {} connections",
                        k.partitions, row.connections
                    ),
                    measured: format!(
                        "{:.0}/s against {:.0}/s: {:.2} × the ceiling; p50 {:.2} ms, p99 {:.2} ms; \
                         not 202: {}; peak RSS {:.0} MiB",
                        row.skyport.requests_per_s,
                        row.ceiling.requests_per_s,
                        row.ratio,
                        row.skyport.p50_ms,
                        row.skyport.p99_ms,
                        describe(&crate::load::other_than(
                            &row.skyport.statuses,
                            &row.skyport.errors,
                            "202"
                        )),
                        row.peak_rss_mib
                    ),
                    target: "(Skyport's cost on Kafka)",
                    met: None,
                });
            }
            let e = &k.end_to_end;
            verdicts.push(Verdict {
                what: "Kafka: end to end, 5 services at 20 ms".into(),
                measured: format!(
                    "{:.0} workflows/s Scheduled ({} in {:.1} s, {} Failed; best second {}); peak RSS {:.0} MiB",
                    e.workflows_per_s, e.completed, e.seconds, e.failed, e.best_second, e.peak_rss_mib
                ),
                target: "(Skyport's cost on Kafka)",
                met: None,
            });
        }
        let peaks: Vec<(String, f64)> = self
            .ingest
            .iter()
            .map(|i| (format!("ingest at {}", i.connections), i.peak_rss_mib))
            .chain(
                self.end_to_end
                    .iter()
                    .map(|e| ("end to end".into(), e.peak_rss_mib)),
            )
            .chain(
                self.all_in_one
                    .iter()
                    .map(|a| ("all in one (services included)".into(), a.peak_rss_mib)),
            )
            .collect();
        if !peaks.is_empty() {
            let worst = peaks.iter().map(|p| p.1).fold(0.0, f64::max);
            verdicts.push(Verdict {
                what: "peak RSS".into(),
                measured: peaks
                    .iter()
                    .map(|(what, mib)| format!("{what}: {mib:.0} MiB"))
                    .collect::<Vec<_>>()
                    .join(", "),
                target: "≤ 256 MB",
                met: Some(worst * 1024.0 * 1024.0 <= 256e6),
            });
        }
        if let Some(h) = &self.held_reads {
            verdicts.push(Verdict {
                what: format!(
                    "held reads: {} deliveries at {}/s, each read with wait=10 until terminal",
                    h.deliveries, h.rate
                ),
                measured: format!(
                    "at most {} reads each ({} took two); terminal write to answer: {}",
                    h.most_reads,
                    h.two_reads,
                    latency(h.after_write.as_ref())
                ),
                target: "≤ 2 reads; p99 ≤ 50 ms",
                met: Some(
                    h.most_reads <= 2 && h.after_write.as_ref().is_some_and(|l| l.p99_ms <= 50.0),
                ),
            });
            verdicts.push(Verdict {
                what: format!(
                    "POSTs beside {} held reads (max_in_flight {}), closed loop at 64 connections",
                    h.held, h.max_in_flight
                ),
                measured: format!(
                    "{:.0}/s against {:.0}/s alone: {:.2} ×; 503s {} beside, {} alone; p99 {:.2} ms against {:.2} ms",
                    h.posts_beside_held.requests_per_s,
                    h.posts_alone.requests_per_s,
                    h.ratio,
                    h.posts_beside_held.status("503"),
                    h.posts_alone.status("503"),
                    h.posts_beside_held.p99_ms,
                    h.posts_alone.p99_ms
                ),
                target: "within noise (≥ 0.9 ×), no 503",
                met: Some(h.ratio >= 0.9 && h.posts_beside_held.status("503") == 0),
            });
        }
        if let Some(q) = &self.quotas {
            let ratios: Vec<String> = q.ratios.iter().map(|r| format!("{r:.2}")).collect();
            verdicts.push(Verdict {
                what: format!(
                    "the gateway with quotas on (every request charged to one client), closed loop at {} connections",
                    q.connections
                ),
                measured: format!(
                    "{:.0}/s against {:.0}/s off: {:.2} × (rounds: {}); p99 {:.2} ms against {:.2} ms",
                    q.on.requests_per_s,
                    q.off.requests_per_s,
                    q.ratio,
                    ratios.join(", "),
                    q.on.p99_ms,
                    q.off.p99_ms
                ),
                target: "≥ 0.95 ×",
                met: Some(q.ratio >= 0.95),
            });
        }
        if let Some(e) = &self.expedited {
            verdicts.push(Verdict {
                what: format!(
                    "expedited: a burst of {} drained at {}/s, one expedited delivery a second meanwhile ({} posted)",
                    e.burst, e.drain_rate, e.expedited
                ),
                measured: format!(
                    "expedited time to terminal {}, {} of {} in their lane; the burst drained in {:.1} s (its time to terminal {}), which an expedited delivery would have waited without its lane",
                    latency(e.expedited_terminal.as_ref()),
                    e.in_lane,
                    e.expedited,
                    e.drain_s,
                    latency(e.normal.as_ref())
                ),
                target: "p99 ≤ 1 s",
                met: Some(
                    e.in_lane == e.expedited
                        && e.expedited_terminal.as_ref().is_some_and(|l| l.p99_ms <= 1_000.0),
                ),
            });
        }
        if let Some(n) = &self.noisy_neighbour {
            verdicts.push(Verdict {
                what: format!(
                    "noisy neighbour: A at {}/s (quota {}/s) beside B to E at {}/s each, {} s; B to E alone first",
                    n.noisy_rate, n.quota_per_s, n.quiet_rate, n.duration_s
                ),
                measured: format!(
                    "A: {} accepted, {} refused (429) of {}; B to E: {} refused beside A, {} alone; their time to terminal {} beside A against {} alone: p99 {:.2} ×",
                    n.noisy.accepted,
                    n.noisy.refused,
                    n.noisy.sent,
                    n.quiet_beside.refused,
                    n.quiet_alone.refused,
                    latency(n.quiet_beside_terminal.as_ref()),
                    latency(n.quiet_alone_terminal.as_ref()),
                    n.ratio
                ),
                target: "A refused beyond its quota; B to E: no 429, p99 ≤ 2 ×",
                met: Some(
                    n.noisy.refused > 0
                        && n.quiet_beside.refused == 0
                        && n.quiet_alone.refused == 0
                        && n.ratio <= 2.0,
                ),
            });
        }
        for f in [&self.fleet_kafka, &self.fleet_eventhubs]
            .into_iter()
            .flatten()
        {
            verdicts.extend(f.verdicts());
        }
        verdicts
    }

    /// A Markdown table of the run, for `BENCHMARKS.md`.
    pub(crate) fn table(&self) -> String {
        let m = &self.machine;
        let mut out = format!(
            "{} run, {} (commit {}): {} cores, {:.0} GiB, {}, Linux {}; load from {}\n\n\
             | what | measured | target | met |\n|---|---|---|---|\n",
            self.plan, m.date, m.commit, m.cores, m.memory_gib, m.cpu, m.kernel, m.load_generator
        );
        for v in self.verdicts() {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} |",
                v.what,
                v.measured,
                v.target,
                match (self.plan.as_str(), v.met) {
                    (_, None) => "",
                    ("smoke", _) => "(smoke run: not judged)",
                    (_, Some(true)) => "yes",
                    (_, Some(false)) => "**no**",
                }
            );
        }
        out
    }

    /// What makes the run fail: anything accepted and lost, or a valid request
    /// that ended Failed, always; in a
    /// smoke run also a phase that measured nothing. Missed speed targets
    /// are reported in the table, not failed on.
    pub(crate) fn failures(&self, full: bool) -> Vec<String> {
        let mut failures = Vec::new();
        for row in &self.ingest {
            if row.accepted_not_published > 0 {
                failures.push(format!(
                    "ingest at {}: {} requests answered 202 are not in the stream",
                    row.connections, row.accepted_not_published
                ));
            }
            if !full && row.skyport.status("202") == 0 {
                failures.push(format!("ingest at {}: nothing accepted", row.connections));
            }
        }
        if let Some(b) = &self.burst
            && (b.lost > 0 || b.failed > 0 || (!full && b.accepted == 0))
        {
            failures.push(format!(
                "burst: {} of {} durable requests did not reach a terminal state, {} Failed",
                b.lost, b.published, b.failed
            ));
        }
        if let Some(e) = &self.end_to_end
            && (e.completed < e.accepted || e.failed > 0 || (!full && e.completed == 0))
        {
            failures.push(format!(
                "end to end: {} of {} accepted completed, {} Failed",
                e.completed, e.accepted, e.failed
            ));
        }
        if let Some(f) = &self.fixed_rate
            && !full
            && f.measured.status("202") == 0
        {
            failures.push("fixed rate: nothing accepted".into());
        }
        if let Some(r) = &self.rate_limited
            && !full
            && r.completed == 0
        {
            failures.push("rate limiter: nothing completed".into());
        }
        for t in &self.time_to_terminal {
            if t.failed > 0 || (!full && t.accepted == 0) {
                failures.push(format!(
                    "time to terminal at {}/s: {} accepted, {} Failed",
                    t.rate, t.accepted, t.failed
                ));
            }
        }
        if let Some(h) = &self.held_reads
            && (h.most_reads > 2 || (!full && h.posts_beside_held.status("202") == 0))
        {
            failures.push(format!(
                "held reads: a delivery took {} reads, {} POSTs accepted beside them",
                h.most_reads,
                h.posts_beside_held.status("202")
            ));
        }
        if let Some(q) = &self.quotas
            && !full
            && q.on.status("202") == 0
        {
            failures.push("quotas: nothing accepted with quotas on".into());
        }
        if let Some(e) = &self.expedited
            && (e.in_lane < e.expedited || e.expedited_terminal.is_none())
        {
            failures.push(format!(
                "expedited: {} of {} expedited deliveries ran in their lane",
                e.in_lane, e.expedited
            ));
        }
        if let Some(n) = &self.noisy_neighbour
            && (n.quiet_beside.refused > 0
                || n.quiet_alone.refused > 0
                || n.noisy.refused == 0
                || n.noisy.other + n.quiet_beside.other + n.quiet_alone.other > 0)
        {
            failures.push(format!(
                "noisy neighbour: B to E refused {} and {}, A refused {}, answers neither 202 nor 429: {}",
                n.quiet_alone.refused,
                n.quiet_beside.refused,
                n.noisy.refused,
                n.noisy.other + n.quiet_beside.other + n.quiet_alone.other
            ));
        }
        if let Some(k) = &self.kafka {
            let e = &k.end_to_end;
            if e.completed < e.accepted || e.failed > 0 || (!full && e.completed == 0) {
                failures.push(format!(
                    "Kafka end to end: {} of {} accepted completed, {} Failed",
                    e.completed, e.accepted, e.failed
                ));
            }
        }
        for f in [&self.fleet_kafka, &self.fleet_eventhubs]
            .into_iter()
            .flatten()
        {
            let runs = [
                &f.embedded,
                &f.on_stream.end_to_end,
                &f.on_cosmos.end_to_end,
            ]
            .into_iter()
            .map(|e| (e.accepted, e.completed, e.failed))
            .chain(f.runs.iter().map(|r| (r.accepted, r.completed, r.failed)));
            for (accepted, completed, failed) in runs {
                if completed < accepted || failed > 0 || (!full && completed == 0) {
                    failures.push(format!(
                        "fleet on {}: {completed} of {accepted} accepted completed, {failed} Failed",
                        f.stream
                    ));
                }
            }
        }
        if let Some(a) = &self.all_in_one {
            // A request lost fails the phase itself, when its drain times out.
            if a.failed > 0 {
                failures.push(format!(
                    "all in one: {} of {} accepted requests Failed",
                    a.failed, a.accepted
                ));
            }
            if !full && (a.skyport.status("202") == 0 || a.open_loop.status("202") == 0) {
                failures.push("all in one: nothing accepted in the closed or the open loop".into());
            }
        }
        failures
    }
}

/// The percentiles of a run's answers, or that there were none.
fn latency(latency: Option<&Latency>) -> String {
    latency.map_or_else(
        || "no answers".into(),
        |l| {
            format!(
                "p50 {:.2} ms, p99 {:.2} ms, p99.9 {:.2} ms, max {:.1} ms",
                l.p50_ms, l.p99_ms, l.p99_9_ms, l.max_ms
            )
        },
    )
}

fn describe(counts: &BTreeMap<String, u64>) -> String {
    if counts.is_empty() {
        return "none".into();
    }
    counts
        .iter()
        .map(|(what, n)| format!("{n} × {what}"))
        .collect::<Vec<_>>()
        .join(", ")
}

impl Machine {
    fn read(load_generator: &str) -> Self {
        let read = |path: &str| std::fs::read_to_string(path).unwrap_or_default();
        let field = |text: &str, key: &str| {
            text.lines()
                .find(|line| line.starts_with(key))
                .and_then(|line| line.split(':').nth(1))
                .map(|v| v.trim().to_owned())
                .unwrap_or_default()
        };
        let memory_kib: f64 = field(&read("/proc/meminfo"), "MemTotal")
            .trim_end_matches("kB")
            .trim()
            .parse()
            .unwrap_or(0.0);
        let git = |args: &[&str]| {
            std::process::Command::new("git")
                .args(args)
                .current_dir(env!("CARGO_MANIFEST_DIR"))
                .output()
                .ok()
                .filter(|out| out.status.success())
                .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_owned())
        };
        let dirty =
            git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
        let commit = git(&["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "unknown".into());
        Self {
            date: OffsetDateTime::now_utc()
                .format(&Rfc3339)
                .unwrap_or_default(),
            commit: if dirty {
                format!("{commit}-dirty")
            } else {
                commit
            },
            cores: std::thread::available_parallelism().map_or(0, usize::from),
            memory_gib: memory_kib / 1024.0 / 1024.0,
            cpu: field(&read("/proc/cpuinfo"), "model name"),
            kernel: read("/proc/sys/kernel/osrelease").trim().to_owned(),
            load_generator: load_generator.to_owned(),
        }
    }
}
