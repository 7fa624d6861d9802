//! `cargo bench --bench skyport`: Skyport measured the way someone choosing it
//! would, against a ceiling measured in the same run. Here, the command line,
//! the list of phases and how each runs in a process of its own; each phase
//! is a file of [`phases`], and [`report`] writes what they measured.
//!
//! 1. Ceiling: a bare axum handler that parses the same body and answers 202.
//! 2. Ingest: the gateway on the embedded store (durable, group-committed),
//!    closed loop at 64 and 256 connections, against the ceiling.
//!    Then the embedded store alone (appends through the `Publisher` port
//!    from as many tasks, no HTTP): what bounds ingest; and what naming a
//!    request (an `Idempotency-Key`, a reservation before the event) costs.
//!    Then the store's committer alone (`status-writes`: each workflow's two
//!    status writes through the `StatusStore` port, at a fixed rate and
//!    saturated): its CPU per workflow and the ceiling that sets.
//! 3. Fixed rate: open loop with coordinated-omission correction.
//! 4. Burst: a large number of requests as fast as the client sends them,
//!    then every accepted one followed to a terminal state.
//! 5. End to end: workflows Scheduled per second with the simulated services
//!    at 20 ms per call, rate limiter off, and Skyport's CPU time per
//!    workflow (this process's, over the phase; the services' and the
//!    poster's are printed beside it); then the limiter at R against R.
//!    These phases post distinct requests from another process (`--post`,
//!    [`poster`]) and run the services in a process of their own
//!    (`--simulate`).
//! 6. Memory: the peak RSS of the servers in each phase. Every phase runs in
//!    a process of its own (this binary with `--phase NAME`), so no phase
//!    inherits another's heap; the load and the services are other processes.
//! 7. All in one: the whole system as users run it (`cargo run --release`),
//!    gateway, worker and the simulated services at their defaults in one
//!    process on a fresh embedded store: closed loop against the ceiling,
//!    then open loop at the fixed rate while the worker drains behind it,
//!    every accepted request followed to a terminal state, and the peak RSS
//!    (the services' memory included, as in a user's process).
//! 8. Time to terminal: the system of (5) fed at a fixed rate (1,000/s, then
//!    2,000/s) for 30 s; each delivery's time from its acceptance to its
//!    terminal status, from the timestamps of its status document (read
//!    through the change feed once all are terminal), not by polling; then
//!    1,000/s again with every request asking for a callback to a receiver
//!    in this process, and each callback's delay after the terminal write
//!    it announces.
//! 9. Kafka: the gateway alone against the ceiling and end to end with the
//!    stream on a local tansu broker (memory engine, installed as the tests
//!    install it): Skyport's cost on Kafka, not a production broker's speed.
//! 10. The fleet on each stream (`fleet-kafka`, `fleet-eventhubs`, see
//!     [`phases::fleet`]): all in one on the stream against the embedded one, then
//!     gateways and workers as processes of their own as the Helm chart
//!     installs them, with 1, 2 and 3 workers: each process's CPU time per
//!     request or workflow and its memory, the broker's and the Cosmos DB
//!     emulator's apart, and the capacity plan's prediction beside it.
//! 11. Scale (see [`phases::scale`]): the all-in-one at its defaults, as
//!     issue 50's table measured it on whatever machine runs it: ingest with
//!     the worker on against the ceiling, the seed's spike on connections
//!     opened before it and as it starts, the backlog worked off (its tenths,
//!     the cores by thread, the serial parts' ceilings), and the seed's
//!     sustained rate with the backlog's slope.
//! 12. Cosmos cost (see [`phases::cosmos_cost`]): request units a delivery by
//!     what they were for, named and calling back, and Skyport's CPU a
//!     workflow on Cosmos DB against the embedded store's at the same rate.
//!
//! `cargo bench` passes `--bench`: the full run, which writes
//! `benches/BENCHMARKS.json` and its charts (SVG, in `benches/charts/`, see [`charts`]).
//! Without it (`cargo test` runs this target too) it is a smoke run of a few
//! seconds that proves the harness works and checks that nothing accepted
//! was lost and that every chart of the phases run is drawn, not the
//! numbers. Name phases to run only those:
//! `cargo bench --bench skyport -- ingest burst`; `-- charts` redraws the
//! charts from `BENCHMARKS.json` and runs nothing.

mod bench;
mod callbacks;
mod charts;
mod cpu;
mod load;
mod memory;
mod phases;
mod poster;
mod report;
mod servers;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use bench::Bench;
use report::Results;
use skyport_runtime::config::LogFormat;
use skyport_runtime::telemetry::Telemetry;
use skyport_tests::fleet::shape::Stream;

/// The allocator of every Skyport binary: the phases run Skyport in this
/// process, so it allocates as `skyport` does.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// How long and how hard each phase runs.
#[derive(Debug, Clone)]
struct Plan {
    name: &'static str,
    closed_loop: Duration,
    /// Ingest and its ceiling are measured this many times, alternating.
    rounds: u32,
    connections: [u32; 2],
    fixed_rate: u32,
    fixed_duration: Duration,
    burst: u64,
    /// Events the store-alone phase appends at each concurrency.
    store_appends: u64,
    /// The status-writes phase: workflows in each of its runs, the rate of
    /// its first run, and the workflows in flight in its saturated run.
    status_workflows: u64,
    status_rate: u32,
    status_in_flight: u32,
    /// Requests posted each way in the named phase.
    named_requests: u64,
    burst_connections: u32,
    /// The rate the worker drains a burst at: what the backends sustain.
    burst_drain_rate: u32,
    end_to_end: u64,
    limited_rate: u32,
    limited_window: Duration,
    /// The fixed rates of the time-to-terminal phase, each without callbacks
    /// and then the first again with a callback per request; how long each runs.
    terminal_rates: [u32; 2],
    terminal_duration: Duration,
    /// Deliveries posted and read with waits in the held-reads phase, and
    /// at what rate (and posted with waits in the post-wait phase); then the
    /// reads held beside the POSTs.
    held_deliveries: u64,
    held_rate: u32,
    held: u64,
    /// Deliveries deferred in the timers phase, and the window their
    /// `runsAt` are spread over.
    timer_deliveries: u64,
    timer_window: Duration,
    /// Deliveries deferred on Cosmos DB, over the same window, and how long
    /// the timers run idle there first.
    timer_cosmos_deliveries: u64,
    timer_idle: Duration,
    /// The expedited phase's burst, and the expedited deliveries posted at
    /// least, one a second, while it drains (as many more as the drain takes).
    expedited_burst: u64,
    expedited_samples: u64,
    /// How long each run of the noisy-neighbour phase posts.
    noisy_duration: Duration,
    /// The fleet phases' worker counts, and the backlog each fleet drains.
    fleet_workers: Vec<usize>,
    fleet_requests: u64,
    drain_timeout: Duration,
    /// The scale phase: its closed loop's connections; the spike's rate,
    /// length and connections; the sustained rate and its length.
    scale_connections: u32,
    spike_rate: u32,
    spike_duration: Duration,
    spike_connections: u32,
    scale_rate: u32,
    scale_duration: Duration,
    /// The cosmos-cost phase's rate and how long it posts.
    cost_rate: u32,
    cost_duration: Duration,
}

impl Plan {
    fn full() -> Self {
        Self {
            name: "full",
            closed_loop: Duration::from_secs(10),
            rounds: 3,
            connections: [64, 256],
            fixed_rate: 10_000,
            fixed_duration: Duration::from_secs(30),
            burst: 200_000,
            store_appends: 100_000,
            status_workflows: 300_000,
            status_rate: 3_000,
            status_in_flight: 1_024,
            named_requests: 50_000,
            burst_connections: 256,
            burst_drain_rate: 2_000,
            end_to_end: 50_000,
            limited_rate: 1_000,
            limited_window: Duration::from_secs(10),
            terminal_rates: [1_000, 2_000],
            terminal_duration: Duration::from_secs(30),
            held_deliveries: 1_000,
            held_rate: 200,
            held: 5_000,
            timer_deliveries: 100_000,
            timer_window: Duration::from_secs(100),
            timer_cosmos_deliveries: 10_000,
            timer_idle: Duration::from_secs(10),
            expedited_burst: 100_000,
            expedited_samples: 30,
            noisy_duration: Duration::from_secs(30),
            fleet_workers: vec![1, 2, 3],
            fleet_requests: 20_000,
            drain_timeout: Duration::from_secs(900),
            scale_connections: 256,
            spike_rate: 100_000,
            spike_duration: Duration::from_secs(10),
            spike_connections: 2_000,
            scale_rate: 10_000,
            scale_duration: Duration::from_secs(60),
            cost_rate: 300,
            cost_duration: Duration::from_secs(60),
        }
    }

    fn smoke() -> Self {
        Self {
            name: "smoke",
            closed_loop: Duration::from_millis(500),
            rounds: 1,
            connections: [8, 32],
            fixed_rate: 200,
            fixed_duration: Duration::from_secs(1),
            burst: 1_000,
            store_appends: 1_000,
            status_workflows: 500,
            status_rate: 500,
            status_in_flight: 64,
            named_requests: 300,
            burst_connections: 32,
            burst_drain_rate: 500,
            end_to_end: 300,
            limited_rate: 50,
            limited_window: Duration::from_secs(2),
            terminal_rates: [50, 100],
            terminal_duration: Duration::from_secs(2),
            held_deliveries: 50,
            held_rate: 50,
            held: 200,
            timer_deliveries: 500,
            timer_window: Duration::from_secs(2),
            timer_cosmos_deliveries: 100,
            timer_idle: Duration::from_secs(1),
            expedited_burst: 1_000,
            expedited_samples: 2,
            noisy_duration: Duration::from_secs(2),
            fleet_workers: vec![1],
            fleet_requests: 200,
            drain_timeout: Duration::from_secs(120),
            scale_connections: 32,
            spike_rate: 2_000,
            spike_duration: Duration::from_secs(1),
            spike_connections: 100,
            scale_rate: 200,
            scale_duration: Duration::from_secs(2),
            cost_rate: 50,
            cost_duration: Duration::from_secs(2),
        }
    }
}

/// The phases, by the names the command line gives them, in the order a run
/// runs them.
struct Phases;

impl Phases {
    const ALL: [&'static str; 23] = [
        "ingest",
        "store",
        "status-writes",
        "named",
        "fixed-rate",
        "burst",
        "end-to-end",
        "rate-limit",
        "all-in-one",
        "time-to-terminal",
        "held-reads",
        "post-wait",
        "batch",
        "timers",
        "timers-cosmos",
        "quotas",
        "expedited",
        "noisy-neighbour",
        "kafka",
        "fleet-kafka",
        "fleet-eventhubs",
        "scale",
        "cosmos-cost",
    ];

    /// Every phase's name, as errors list them.
    fn listed() -> String {
        Self::ALL.join(", ")
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // The fleet phases' brokers and emulator: this binary again, as a server.
    if args.first().map(String::as_str) == Some(skyport_tests::fleet::servers::ROLE) {
        return skyport_tests::fleet::servers::serve(&args[1..]);
    }
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("Error: {e:?}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &[String]) -> anyhow::Result<()> {
    let full = args.iter().any(|a| a == "--bench") && !args.iter().any(|a| a == "--smoke");
    let plan = if full { Plan::full() } else { Plan::smoke() };
    if let Some(i) = args.iter().position(|a| a == "--post") {
        return poster::run(&args[i + 1..]);
    }
    if let Some(i) = args.iter().position(|a| a == "--simulate") {
        return servers::simulate(&args[i + 1..]);
    }
    if let Some(phase) = args
        .iter()
        .position(|a| a == "--phase")
        .and_then(|i| args.get(i + 1))
    {
        return run_phase(&plan, phase);
    }
    let mut only: Vec<&str> = args
        .iter()
        .filter(|a| !a.starts_with("--"))
        .map(String::as_str)
        .collect();
    let (json, charts_dir) = if full {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        (
            root.join("benches/BENCHMARKS.json"),
            root.join("benches/charts"),
        )
    } else {
        let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
        (
            tmp.join("skyport-bench-smoke.json"),
            tmp.join("skyport-bench-smoke"),
        )
    };
    if only.contains(&"charts") {
        anyhow::ensure!(
            only.len() == 1,
            "`charts` redraws the charts from {} and runs no phase",
            json.display()
        );
        let text = std::fs::read_to_string(&json)
            .with_context(|| format!("cannot read {}", json.display()))?;
        let results: Results = serde_json::from_str(&text)
            .with_context(|| format!("{} is not a run's results", json.display()))?;
        report::write_charts(&results, &charts_dir)?;
        return Ok(());
    }
    if let Some(unknown) = only.iter().find(|p| !Phases::ALL.contains(p)) {
        bail!(
            "no phase {unknown:?}; the phases are {} (or `charts` alone)",
            Phases::listed()
        );
    }
    if only.is_empty() {
        only = Phases::ALL.to_vec();
    }
    let oha = load::oha()?;
    let mut results = Results::new(plan.name, &load::oha_version(&oha));
    for phase in only {
        let result = spawn_phase(full, phase)?;
        match phase {
            "ingest" => results.ingest = serde_json::from_value(result)?,
            "store" => results.store = serde_json::from_value(result)?,
            "status-writes" => results.status_writes = serde_json::from_value(result)?,
            "named" => results.named = serde_json::from_value(result)?,
            "fixed-rate" => results.fixed_rate = serde_json::from_value(result)?,
            "burst" => results.burst = serde_json::from_value(result)?,
            "end-to-end" => results.end_to_end = serde_json::from_value(result)?,
            "all-in-one" => results.all_in_one = serde_json::from_value(result)?,
            "kafka" => results.kafka = serde_json::from_value(result)?,
            "time-to-terminal" => results.time_to_terminal = serde_json::from_value(result)?,
            "held-reads" => results.held_reads = serde_json::from_value(result)?,
            "post-wait" => results.post_wait = serde_json::from_value(result)?,
            "batch" => results.batch = serde_json::from_value(result)?,
            "timers" => results.timers = serde_json::from_value(result)?,
            "timers-cosmos" => results.timers_cosmos = serde_json::from_value(result)?,
            "quotas" => results.quotas = serde_json::from_value(result)?,
            "expedited" => results.expedited = serde_json::from_value(result)?,
            "noisy-neighbour" => results.noisy_neighbour = serde_json::from_value(result)?,
            "fleet-kafka" => results.fleet_kafka = serde_json::from_value(result)?,
            "fleet-eventhubs" => results.fleet_eventhubs = serde_json::from_value(result)?,
            "scale" => results.scale = serde_json::from_value(result)?,
            "cosmos-cost" => results.cosmos_cost = serde_json::from_value(result)?,
            _ => results.rate_limited = serde_json::from_value(result)?,
        }
    }
    std::fs::write(&json, serde_json::to_string_pretty(&results)? + "\n")
        .with_context(|| format!("cannot write {}", json.display()))?;
    println!("{}", results.table());
    println!("Results written to {}", json.display());
    let mut failures = results.failures(full);
    // A phase just run records what its chart needs.
    failures.extend(report::write_charts(&results, &charts_dir)?);
    if !failures.is_empty() {
        bail!("{}", failures.join("; "));
    }
    Ok(())
}

/// Runs `phase` in a process of its own (this binary with `--phase`), so that
/// each starts on a fresh heap and its peak RSS is its own; its result comes
/// back as JSON on stdout.
fn spawn_phase(full: bool, phase: &str) -> anyhow::Result<serde_json::Value> {
    let mut args = Vec::new();
    if full {
        args.push("--bench".to_owned());
    }
    args.extend(["--phase".to_owned(), phase.to_owned()]);
    rerun(&args, &format!("the {phase} phase"))
}

/// Runs this binary again with `args` (its stderr goes to ours) and reads the
/// JSON it prints on stdout; `what` names it in errors. Errors capture no
/// backtrace there, as in production and the fleet's processes: where the
/// bench runs with `RUST_BACKTRACE=1`, each error a request's path built
/// and handled captured one (the gateway alone with API keys on Kafka cost
/// 140 µs a request so, 87 µs without).
pub(crate) fn rerun<T: serde::de::DeserializeOwned>(
    args: &[String],
    what: &str,
) -> anyhow::Result<T> {
    let out = std::process::Command::new(std::env::current_exe()?)
        .args(args)
        .env("RUST_LIB_BACKTRACE", "0")
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("cannot start {what}"))?;
    if !out.status.success() {
        bail!("{what} failed ({})", out.status);
    }
    serde_json::from_slice(&out.stdout).with_context(|| format!("{what} printed no result"))
}

/// The child side of [`spawn_phase`]; it logs as the binaries do (stderr, `RUST_LOG`).
fn run_phase(plan: &Plan, phase: &str) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let result = runtime.block_on(async {
        let _telemetry = Telemetry::init(LogFormat::Human, "skyport-bench")?;
        let data = tempfile::Builder::new()
            .prefix("skyport-bench-")
            .tempdir_in(env!("CARGO_TARGET_TMPDIR"))?;
        let bench = Bench {
            oha: load::oha()?,
            plan: plan.clone(),
            data: data.path().to_path_buf(),
        };
        Ok::<_, anyhow::Error>(match phase {
            "ingest" => serde_json::to_value(bench.ingest().await?)?,
            "store" => serde_json::to_value(bench.store().await?)?,
            "status-writes" => serde_json::to_value(bench.status_writes().await?)?,
            "named" => serde_json::to_value(bench.named().await?)?,
            "fixed-rate" => serde_json::to_value(bench.fixed_rate().await?)?,
            "burst" => serde_json::to_value(bench.burst().await?)?,
            "end-to-end" => serde_json::to_value(bench.end_to_end().await?)?,
            "rate-limit" => serde_json::to_value(bench.rate_limited().await?)?,
            "all-in-one" => serde_json::to_value(bench.all_in_one().await?)?,
            "kafka" => serde_json::to_value(bench.kafka().await?)?,
            "time-to-terminal" => serde_json::to_value(bench.time_to_terminal().await?)?,
            "held-reads" => serde_json::to_value(bench.held_reads().await?)?,
            "post-wait" => serde_json::to_value(bench.post_wait().await?)?,
            "batch" => serde_json::to_value(bench.batch().await?)?,
            "timers" => serde_json::to_value(bench.timers().await?)?,
            "timers-cosmos" => serde_json::to_value(bench.timers_on_cosmos().await?)?,
            "quotas" => serde_json::to_value(bench.quota_cost().await?)?,
            "expedited" => serde_json::to_value(bench.expedited().await?)?,
            "noisy-neighbour" => serde_json::to_value(bench.noisy_neighbour().await?)?,
            "fleet-kafka" => serde_json::to_value(bench.fleet(Stream::Kafka).await?)?,
            "fleet-eventhubs" => serde_json::to_value(bench.fleet(Stream::EventHubs).await?)?,
            "scale" => serde_json::to_value(bench.scale().await?)?,
            "cosmos-cost" => serde_json::to_value(bench.cosmos_cost().await?)?,
            other => bail!("no phase {other:?}; the phases are {}", Phases::listed()),
        })
    })?;
    println!("{result}");
    Ok(())
}
