//! `cargo bench --bench skyport`: Skyport measured the way someone choosing it
//! would, against a ceiling measured in the same run.
//!
//! 1. Ceiling: a bare axum handler that parses the same body and answers 202.
//! 2. Ingest: the gateway on the embedded store (durable, group-committed),
//!    closed loop at 64 and 256 connections, against the ceiling.
//!    Then the embedded store alone (appends through the `Publisher` port
//!    from as many tasks, no HTTP): what bounds ingest; and what naming a
//!    request (an `Idempotency-Key`, a reservation before the event) costs.
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
//!     [`fleets`]): all in one on the stream against the embedded one, then
//!     gateways and workers as processes of their own as the Helm chart
//!     installs them, with 1, 2 and 3 workers: each process's CPU time per
//!     request or workflow and its memory, the broker's and the Cosmos DB
//!     emulator's apart, and the capacity plan's prediction beside it.
//!
//! `cargo bench` passes `--bench`: the full run, which writes
//! `BENCHMARKS.json` and its charts (SVG, in `benchmarks/`, see [`charts`]).
//! Without it (`cargo test` runs this target too) it is a smoke run of a few
//! seconds that proves the harness works and checks that nothing accepted
//! was lost and that every chart of the phases run is drawn, not the
//! numbers. Name phases to run only those:
//! `cargo bench --bench skyport -- ingest burst`; `-- charts` redraws the
//! charts from `BENCHMARKS.json` and runs nothing.

mod callbacks;
mod charts;
mod cpu;
mod fairness;
mod fleets;
// The fleet test's processes and servers; the fleet phases use part of them.
#[allow(dead_code, reason = "the fleet test uses what the fleet phases do not")]
#[path = "../../tests/fleet/harness/mod.rs"]
mod harness;
mod held;
mod load;
mod memory;
mod poster;
mod quotas;
mod report;
mod servers;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use cpu::CpuTime;
use harness::shape::Stream;
use load::{Load, Measured};
use poster::Latency;
use poster::{Naming, Schedule};
use report::{
    Burst, BurstSample, CpuSplit, DatabaseCommits, EndToEnd, FixedRate, Ingest, KafkaIngest,
    KafkaRun, Named, RateLimited, Results, Store, TimeToTerminal, WholeRound, WholeSystem,
};
use servers::{AllInOne, Ceiling, GatewayOnly, Simulated};
use skyport::Backends;
use skyport_core::event::{DeliveryRequested, Event};
use skyport_core::ports::{PublishError, StartFrom};
use skyport_core::request::DeliveryRequest;
use skyport_core::status::StatusDocument;
use skyport_runtime::config::{LogFormat, Settings, StreamBackend};
use skyport_runtime::telemetry::Telemetry;
use skyport_tests::kafka::Broker;
use time::OffsetDateTime;

/// The allocator of every Skyport binary: the phases run Skyport in this
/// process, so it allocates as `skyport` does.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The body every request carries: the README's example.
/// How long each simulated service takes to answer.
const SERVICE_LATENCY_MS: u64 = 20;

pub(crate) const BODY: &str = r#"{"ownerId":"owner-1","pickupLocation":"47.6423,-122.1368","pickupTime":"2030-01-01T10:00:00Z","deadline":"2030-01-01T12:00:00Z","dropoffLocation":"47.6101,-122.2015","packageInfo":{"packageId":"pkg-1","size":"Small","weight":2.5}}"#;

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
    /// at what rate; then the reads held beside the POSTs.
    held_deliveries: u64,
    held_rate: u32,
    held: u64,
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
            expedited_burst: 100_000,
            expedited_samples: 30,
            noisy_duration: Duration::from_secs(30),
            fleet_workers: vec![1, 2, 3],
            fleet_requests: 20_000,
            drain_timeout: Duration::from_secs(900),
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
            expedited_burst: 1_000,
            expedited_samples: 2,
            noisy_duration: Duration::from_secs(2),
            fleet_workers: vec![1],
            fleet_requests: 200,
            drain_timeout: Duration::from_secs(120),
        }
    }
}

/// The connections the open-loop phases send over (oha or the poster): at
/// 10,000 requests/s, answers may take 25 ms before a request waits for a
/// connection (its wait counts in its latency either way).
const OPEN_LOOP_CONNECTIONS: u32 = 256;

/// Partitions of the Kafka phase's topic, as many as the embedded stream's.
const KAFKA_PARTITIONS: u32 = 8;

const PHASES: [&str; 16] = [
    "ingest",
    "store",
    "named",
    "fixed-rate",
    "burst",
    "end-to-end",
    "rate-limit",
    "all-in-one",
    "time-to-terminal",
    "held-reads",
    "quotas",
    "expedited",
    "noisy-neighbour",
    "kafka",
    "fleet-kafka",
    "fleet-eventhubs",
];

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // The fleet phases' brokers and emulator: this binary again, as a server.
    if args.first().map(String::as_str) == Some(harness::servers::ROLE) {
        return harness::servers::serve(&args[1..]);
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
        (root.join("BENCHMARKS.json"), root.join("benchmarks"))
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
        charts::write(&results, &charts_dir)?;
        return Ok(());
    }
    if let Some(unknown) = only.iter().find(|p| !PHASES.contains(p)) {
        bail!(
            "no phase {unknown:?}; the phases are {} (or `charts` alone)",
            PHASES.join(", ")
        );
    }
    if only.is_empty() {
        only = PHASES.to_vec();
    }
    let oha = load::oha()?;
    let mut results = Results::new(plan.name, &load::oha_version(&oha));
    for phase in only {
        let result = spawn_phase(full, phase)?;
        match phase {
            "ingest" => results.ingest = serde_json::from_value(result)?,
            "store" => results.store = serde_json::from_value(result)?,
            "named" => results.named = serde_json::from_value(result)?,
            "fixed-rate" => results.fixed_rate = serde_json::from_value(result)?,
            "burst" => results.burst = serde_json::from_value(result)?,
            "end-to-end" => results.end_to_end = serde_json::from_value(result)?,
            "all-in-one" => results.all_in_one = serde_json::from_value(result)?,
            "kafka" => results.kafka = serde_json::from_value(result)?,
            "time-to-terminal" => results.time_to_terminal = serde_json::from_value(result)?,
            "held-reads" => results.held_reads = serde_json::from_value(result)?,
            "quotas" => results.quotas = serde_json::from_value(result)?,
            "expedited" => results.expedited = serde_json::from_value(result)?,
            "noisy-neighbour" => results.noisy_neighbour = serde_json::from_value(result)?,
            "fleet-kafka" => results.fleet_kafka = serde_json::from_value(result)?,
            "fleet-eventhubs" => results.fleet_eventhubs = serde_json::from_value(result)?,
            _ => results.rate_limited = serde_json::from_value(result)?,
        }
    }
    std::fs::write(&json, serde_json::to_string_pretty(&results)? + "\n")
        .with_context(|| format!("cannot write {}", json.display()))?;
    println!("{}", results.table());
    println!("Results written to {}", json.display());
    let mut failures = results.failures(full);
    // A phase just run records what its chart needs.
    failures.extend(charts::write(&results, &charts_dir)?);
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
            "named" => serde_json::to_value(bench.named().await?)?,
            "fixed-rate" => serde_json::to_value(bench.fixed_rate().await?)?,
            "burst" => serde_json::to_value(bench.burst().await?)?,
            "end-to-end" => serde_json::to_value(bench.end_to_end().await?)?,
            "rate-limit" => serde_json::to_value(bench.rate_limited().await?)?,
            "all-in-one" => serde_json::to_value(bench.all_in_one().await?)?,
            "kafka" => serde_json::to_value(bench.kafka().await?)?,
            "time-to-terminal" => serde_json::to_value(bench.time_to_terminal().await?)?,
            "held-reads" => serde_json::to_value(bench.held_reads().await?)?,
            "quotas" => serde_json::to_value(bench.quota_cost().await?)?,
            "expedited" => serde_json::to_value(bench.expedited().await?)?,
            "noisy-neighbour" => serde_json::to_value(bench.noisy_neighbour().await?)?,
            "fleet-kafka" => serde_json::to_value(bench.fleet(Stream::Kafka).await?)?,
            "fleet-eventhubs" => serde_json::to_value(bench.fleet(Stream::EventHubs).await?)?,
            other => bail!("no phase {other:?}; the phases are {}", PHASES.join(", ")),
        })
    })?;
    println!("{result}");
    Ok(())
}

struct Bench {
    oha: PathBuf,
    plan: Plan,
    data: PathBuf,
}

impl Bench {
    async fn load(&self, url: &str, load: Load) -> anyhow::Result<Measured> {
        load::run(self.oha.clone(), url.to_owned(), BODY.to_owned(), load).await
    }

    fn closed_loop(&self, connections: u32) -> Load {
        Load {
            connections,
            duration: self.plan.closed_loop,
            rate: None,
        }
    }

    /// The embedded default with a fresh data directory for `phase`.
    fn settings(&self, phase: &str, keys: &[(&str, String)]) -> anyhow::Result<Settings> {
        servers::settings(&self.data.join(phase), keys)
    }

    /// (1), (2) and (6): the ceiling and the gateway, each connection count in turn.
    async fn ingest(&self) -> anyhow::Result<Vec<Ingest>> {
        let mut rows = Vec::new();
        for connections in self.plan.connections {
            let mut rounds = Vec::new();
            for round in 1..=self.plan.rounds {
                rounds.push(self.ingest_round(connections, round).await?);
            }
            // The round of the median ratio stands for them all; every ratio is kept.
            rounds.sort_by(|a, b| a.ratio.total_cmp(&b.ratio));
            let ratios = rounds.iter().map(|r| r.ratio).collect();
            let peak_rss_mib = rounds.iter().map(|r| r.peak_rss_mib).fold(0.0, f64::max);
            let not_published = rounds.iter().map(|r| r.accepted_not_published).sum();
            let mut median = rounds.swap_remove(rounds.len() / 2);
            median.ratios = ratios;
            median.peak_rss_mib = peak_rss_mib;
            median.accepted_not_published = not_published;
            rows.push(median);
        }
        Ok(rows)
    }

    /// The ceiling, then the gateway on a fresh store, at `connections`.
    async fn ingest_round(&self, connections: u32, round: u32) -> anyhow::Result<Ingest> {
        eprintln!("ceiling, closed loop at {connections} connections (round {round})");
        let ceiling = Ceiling::start().await?;
        let bare = self
            .load(&ceiling.url, self.closed_loop(connections))
            .await?;
        ceiling.stop().await?;

        eprintln!("ingest, closed loop at {connections} connections (round {round})");
        memory::reset_peak()?;
        let gateway =
            GatewayOnly::start(&self.settings(&format!("ingest-{connections}-{round}"), &[])?)
                .await?;
        let skyport = self
            .load(&gateway.url, self.closed_loop(connections))
            .await?;
        let peak_rss_mib = memory::peak_mib()?;
        let published = gateway.published();
        let (commits, writes) = gateway.commits();
        gateway.stop().await?;
        Ok(Ingest {
            connections,
            ratio: skyport.requests_per_s / bare.requests_per_s,
            ratios: Vec::new(),
            accepted_not_published: skyport.status("202").saturating_sub(published),
            commits_per_s: commits as f64 / skyport.seconds,
            writes_per_commit: writes as f64 / commits.max(1) as f64,
            ceiling: bare,
            skyport,
            peak_rss_mib,
        })
    }

    /// What bounds ingest: the embedded store alone, appending encoded
    /// events from `concurrency` tasks through the `Publisher` port, no HTTP.
    async fn store(&self) -> anyhow::Result<Vec<Store>> {
        let request: DeliveryRequest = serde_json::from_str(BODY)?;
        let mut rows = Vec::new();
        for concurrency in self.plan.connections {
            eprintln!("store alone, {concurrency} concurrent appends");
            let settings = self.settings(&format!("store-{concurrency}"), &[])?;
            let backends = Backends::open(&settings).await?;
            let per_task = self.plan.store_appends / u64::from(concurrency);
            let started = Instant::now();
            let mut tasks = tokio::task::JoinSet::new();
            for task in 0..concurrency {
                let publisher = Arc::clone(&backends.ports.publisher);
                let request = request.clone();
                tasks.spawn(async move {
                    for n in 0..per_task {
                        let event = Event::DeliveryRequested(Box::new(DeliveryRequested {
                            delivery_id: format!("store-{task}-{n}"),
                            accepted_at: OffsetDateTime::now_utc(),
                            traceparent: None,
                            idempotency_key: None,
                            principal: None,
                            epoch: 0,
                            redrive: None,
                            request: request.clone(),
                        }));
                        publisher
                            .publish(event.outbound(skyport_core::ports::Lane::Normal))
                            .await?;
                    }
                    Ok::<_, PublishError>(())
                });
            }
            for appended in tasks.join_all().await {
                appended?;
            }
            let seconds = started.elapsed().as_secs_f64();
            let stats = backends
                .embedded
                .as_ref()
                .context("the embedded store is not open")?
                .commit_stats();
            let commits = stats.commits.load(Ordering::Relaxed);
            let appends = per_task * u64::from(concurrency);
            rows.push(Store {
                concurrency,
                appends,
                appends_per_s: appends as f64 / seconds,
                commits_per_s: commits as f64 / seconds,
                appends_per_commit: appends as f64 / commits.max(1) as f64,
            });
        }
        Ok(rows)
    }

    /// What naming a request costs: the gateway alone, the same distinct
    /// requests posted with no name and with an `Idempotency-Key` each (a
    /// reservation written before the event).
    async fn named(&self) -> anyhow::Result<Named> {
        let requests = self.plan.named_requests;
        let mut rates = Vec::new();
        for naming in [Naming::Unnamed, Naming::Keyed] {
            eprintln!("{naming:?} requests: {requests} at 64 connections, gateway alone");
            let gateway = GatewayOnly::start(&self.settings(&format!("{naming:?}"), &[])?).await?;
            let posted =
                poster::post(&gateway.url, Schedule::Requests(requests), 64, naming, 0).await?;
            let published = gateway.published();
            gateway.stop().await?;
            anyhow::ensure!(
                posted.status("202") == requests && published == requests,
                "{naming:?}: {} of {requests} accepted, {published} published",
                posted.status("202")
            );
            rates.push(posted.requests_per_s);
        }
        Ok(Named {
            requests,
            unnamed_per_s: rates[0],
            keyed_per_s: rates[1],
            ratio: rates[1] / rates[0],
        })
    }

    /// (3): open loop at a fixed rate, latency from when each request was due.
    async fn fixed_rate(&self) -> anyhow::Result<FixedRate> {
        let plan = &self.plan;
        eprintln!(
            "fixed rate: {}/s for {} s",
            plan.fixed_rate,
            plan.fixed_duration.as_secs()
        );
        memory::reset_peak()?;
        let gateway = GatewayOnly::start(&self.settings("fixed-rate", &[])?).await?;
        let measured = self
            .load(
                &gateway.url,
                Load {
                    connections: OPEN_LOOP_CONNECTIONS,
                    duration: plan.fixed_duration,
                    rate: Some(plan.fixed_rate),
                },
            )
            .await?;
        let peak_rss_mib = memory::peak_mib()?;
        gateway.stop().await?;
        Ok(FixedRate {
            rate: plan.fixed_rate,
            seconds: plan.fixed_duration.as_secs_f64(),
            measured,
            peak_rss_mib,
        })
    }

    /// Gateway and worker, with the simulated services (20 ms per call) in
    /// a process of their own; stop both with [`Bench::stop`].
    ///
    /// The calls go over HTTP/2 (`services.protocol` h2c).
    ///
    /// The worker runs at nice 0 here: the poster and the services stand in
    /// for other machines, and a worker yielding the CPU to them (as it
    /// yields to its own gateway, `worker.nice`) would measure the two cores'
    /// sharing, not the worker. The all-in-one phase keeps the default.
    async fn system(
        &self,
        phase: &str,
        rate_limit_per_s: u32,
        extra: &[(&str, String)],
    ) -> anyhow::Result<(AllInOne, Simulated)> {
        let services = Simulated::start(SERVICE_LATENCY_MS).await?;
        let mut keys = vec![
            ("services.base_url", services.url.clone()),
            ("worker.rate_limit_per_s", rate_limit_per_s.to_string()),
            ("worker.nice", "0".to_owned()),
        ];
        // The simulated services speak HTTP/2 over cleartext, so the bench
        // configures it, as an operator would for services that do; a
        // `SKYPORT__SERVICES__PROTOCOL` variable chooses otherwise.
        if std::env::var_os("SKYPORT__SERVICES__PROTOCOL").is_none() {
            keys.push(("services.protocol", "h2c".to_owned()));
        }
        keys.extend_from_slice(extra);
        let settings = self.settings(phase, &keys)?;
        Ok((AllInOne::start(settings).await?, services))
    }

    async fn stop(system: AllInOne, services: Simulated) -> anyhow::Result<()> {
        system.stop().await?;
        services.stop().await
    }

    /// (4): the burst on the whole system, the worker limited to the rate the
    /// backends sustain (the stream levels the load), then every accepted
    /// request followed to the end.
    async fn burst(&self) -> anyhow::Result<Burst> {
        let plan = &self.plan;
        eprintln!(
            "burst: {} requests at {} connections, then the drain at {}/s",
            plan.burst, plan.burst_connections, plan.burst_drain_rate
        );
        memory::reset_peak()?;
        let (system, services) = self.system("burst", plan.burst_drain_rate, &[]).await?;
        let started = Instant::now();
        let mut timeline = Timeline::new(started, &system);
        let measured = {
            let mut posting = std::pin::pin!(poster::post(
                &system.url,
                Schedule::Requests(plan.burst),
                plan.burst_connections,
                Naming::Unnamed,
                0,
            ));
            loop {
                tokio::select! {
                    posted = &mut posting => break posted?,
                    () = tokio::time::sleep(Duration::from_millis(50)) => timeline.sample(&system),
                }
            }
        };
        let sent = started.elapsed();
        let accepted = measured.status("202");
        // Every event the stream holds (a request whose answer was lost on the
        // way still counts) must reach a terminal state.
        let durable = system.published().max(accepted);
        let deadline = started + sent + plan.drain_timeout;
        while system.terminal() < durable && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
            timeline.sample(&system);
        }
        let drained = started.elapsed();
        timeline.take(&system);
        let terminal = system.terminal();
        let failed = system.failed();
        let peak_rss_mib = memory::peak_mib()?;
        let published = system.published();
        Self::stop(system, services).await?;
        Ok(Burst {
            requests: plan.burst,
            connections: plan.burst_connections,
            drain_rate: plan.burst_drain_rate,
            accepted,
            not_accepted: measured.other_than("202"),
            published,
            terminal,
            failed,
            lost: durable.saturating_sub(terminal),
            send_s: sent.as_secs_f64(),
            drain_s: (drained - sent).as_secs_f64(),
            measured,
            peak_rss_mib,
            timeline: timeline.samples,
        })
    }

    /// (5) and (6): workflows completed per second, requests posted through the gateway.
    async fn end_to_end(&self) -> anyhow::Result<EndToEnd> {
        self.end_to_end_on("end-to-end", &[]).await
    }

    /// End to end with the settings `extra` adds (another stream).
    async fn end_to_end_on(
        &self,
        phase: &str,
        extra: &[(&str, String)],
    ) -> anyhow::Result<EndToEnd> {
        self.end_to_end_of(phase, extra, self.plan.end_to_end, None)
            .await
    }

    /// End to end on the settings `extra` adds, with `requests` requests:
    /// posted closed loop, or open loop at `paced` requests a second.
    async fn end_to_end_of(
        &self,
        phase: &str,
        extra: &[(&str, String)],
        requests: u64,
        paced: Option<u32>,
    ) -> anyhow::Result<EndToEnd> {
        let plan = &self.plan;
        eprintln!("{phase}: {requests} requests, 5 services at 20 ms per call, rate limiter off");
        memory::reset_peak()?;
        let partitions = {
            let settings = self.settings(phase, extra)?;
            match settings.stream_backend() {
                StreamBackend::Kafka => KAFKA_PARTITIONS,
                _ => settings.stream.partitions,
            }
        };
        let (system, services) = self.system(phase, 0, extra).await?;
        Self::await_partitions(phase, &system, partitions).await?;
        let started = Instant::now();
        let cpu_before = (CpuTime::this()?, CpuTime::of(services.pid())?);
        let database_before = system.database_commits();
        let schedule = paced.map_or(Schedule::Requests(requests), |per_s| {
            Schedule::paced(requests, per_s)
        });
        let post = poster::post(&system.url, schedule, 64, Naming::Unnamed, 0);
        let sample = async {
            let mut samples = vec![0];
            let deadline = started + plan.drain_timeout;
            while samples.last().copied() < Some(requests) && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(100)).await;
                samples.push(system.terminal());
            }
            samples
        };
        let (posted, samples) = tokio::join!(post, sample);
        let posted = posted?;
        let elapsed = started.elapsed();
        let cpu = CpuSplit::between(cpu_before, services.pid(), elapsed)?;
        let completed = system.terminal();
        let failed = system.failed();
        let database = system.database_commits().zip(database_before).map(
            |((commits, writes), (commits_before, writes_before))| {
                let commits = commits - commits_before;
                DatabaseCommits {
                    commits_per_workflow: commits as f64 / completed.max(1) as f64,
                    writes_per_commit: (writes - writes_before) as f64 / commits.max(1) as f64,
                }
            },
        );
        let peak_rss_mib = memory::peak_mib()?;
        Self::stop(system, services).await?;
        let best_second = samples
            .windows(11)
            .map(|w| w[10] - w[0])
            .max()
            .unwrap_or(completed);
        Ok(EndToEnd {
            requests,
            accepted: posted.status("202"),
            completed,
            failed,
            seconds: elapsed.as_secs_f64(),
            posting_s: posted.seconds,
            workflows_per_s: (completed - failed) as f64 / elapsed.as_secs_f64(),
            best_second,
            cpu_us_per_workflow: cpu.skyport_s * 1e6 / completed.max(1) as f64,
            cpu,
            peak_rss_mib,
            database,
        })
    }

    /// As users run it, the worker is up before the load comes: a phase's
    /// clock starts once it reads every partition (on Kafka, after the
    /// group's first join and rebalance).
    async fn await_partitions(
        phase: &str,
        system: &AllInOne,
        partitions: u32,
    ) -> anyhow::Result<()> {
        let joining = Instant::now();
        while system.partitions_read() < partitions as usize {
            anyhow::ensure!(
                joining.elapsed() < Duration::from_secs(120),
                "the worker read {} of {partitions} partitions after 120 s",
                system.partitions_read()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        eprintln!(
            "{phase}: the worker reads all {partitions} partitions after {:.1} s",
            joining.elapsed().as_secs_f64()
        );
        Ok(())
    }

    /// (8): the system of [`Bench::end_to_end`] fed at each fixed rate for
    /// `plan.terminal_duration`, on a fresh store each; then every delivery's
    /// time from acceptance to its terminal status, from its status document.
    /// Then the first rate again with every request asking for a callback,
    /// and each callback's delay after the terminal write it announces.
    async fn time_to_terminal(&self) -> anyhow::Result<Vec<TimeToTerminal>> {
        let plan = &self.plan;
        let runs = plan
            .terminal_rates
            .iter()
            .map(|rate| (*rate, false))
            .chain([(plan.terminal_rates[0], true)]);
        let mut rows = Vec::new();
        for (rate, calling_back) in runs {
            let phase = format!(
                "time-to-terminal-{rate}{}",
                if calling_back { "-callbacks" } else { "" }
            );
            eprintln!(
                "time to terminal: {rate}/s for {} s, 5 services at 20 ms per call{}",
                plan.terminal_duration.as_secs(),
                if calling_back {
                    ", a callback each"
                } else {
                    ""
                }
            );
            let receiver = if calling_back {
                Some(callbacks::Receiver::start().await?)
            } else {
                None
            };
            let loopback = [("callbacks.allow", "[\"127.0.0.0/8\"]".to_owned())];
            let settings = self.settings(&phase, &loopback)?;
            let (system, services) = self.system(&phase, 0, &loopback).await?;
            Self::await_partitions(&phase, &system, settings.stream.partitions).await?;
            let schedule = Schedule::Rate {
                per_s: rate,
                duration: plan.terminal_duration,
            };
            let posted = match &receiver {
                Some(receiver) => {
                    poster::post_calling_back(
                        &system.url,
                        schedule,
                        OPEN_LOOP_CONNECTIONS,
                        &receiver.url,
                    )
                    .await?
                }
                None => {
                    poster::post(
                        &system.url,
                        schedule,
                        OPEN_LOOP_CONNECTIONS,
                        Naming::Unnamed,
                        0,
                    )
                    .await?
                }
            };
            let accepted = posted.status("202");
            self.drain(&system, accepted).await?;
            let mut micros = terminal_times(&system).await?;
            let terminal = micros.len() as u64;
            let failed = system.failed();
            let mut delays = match receiver {
                Some(receiver) => Some(Self::called_back(receiver, accepted).await?),
                None => None,
            };
            Self::stop(system, services).await?;
            anyhow::ensure!(
                terminal >= accepted,
                "time to terminal at {rate}/s: {terminal} terminal documents for {accepted} accepted"
            );
            rows.push(TimeToTerminal {
                rate,
                seconds: plan.terminal_duration.as_secs_f64(),
                accepted,
                failed,
                accept: posted.latency,
                terminal: Latency::of(&mut micros),
                callback: delays.as_mut().and_then(|delays| Latency::of(delays)),
            });
        }
        Ok(rows)
    }

    /// Waits (at most a minute) until `receiver` has had `accepted`
    /// callbacks, then stops it; their delays.
    async fn called_back(receiver: callbacks::Receiver, accepted: u64) -> anyhow::Result<Vec<u32>> {
        let started = Instant::now();
        while (receiver.received() as u64) < accepted {
            anyhow::ensure!(
                started.elapsed() < Duration::from_secs(60),
                "{} callbacks for {accepted} accepted after 60 s",
                receiver.received()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        receiver.stop().await
    }

    /// The stream on Kafka: a local tansu broker (memory engine) with
    /// [`KAFKA_PARTITIONS`] partitions; the gateway alone against the ceiling
    /// at each connection count, then end to end.
    async fn kafka(&self) -> anyhow::Result<KafkaRun> {
        // A topic per measurement, so none reads what another wrote.
        let topics: Vec<String> = self
            .plan
            .connections
            .iter()
            .map(|c| format!("ingest-{c}"))
            .chain(std::iter::once("end-to-end".to_owned()))
            .collect();
        let names: Vec<&str> = topics.iter().map(String::as_str).collect();
        let broker = Broker::start(&names, KAFKA_PARTITIONS).await;
        let on_kafka = |topic: &str| -> (String, Vec<(&'static str, String)>) {
            (
                format!("kafka-{topic}"),
                vec![
                    ("stream.backend", "kafka".to_owned()),
                    ("kafka.brokers", format!("[\"{}\"]", broker.address)),
                    ("kafka.topics", format!("[\"{topic}\"]")),
                ],
            )
        };
        let mut ingest = Vec::new();
        for connections in self.plan.connections {
            eprintln!("Kafka: the ceiling, closed loop at {connections} connections");
            let ceiling = Ceiling::start().await?;
            let bare = self
                .load(&ceiling.url, self.closed_loop(connections))
                .await?;
            ceiling.stop().await?;
            eprintln!("Kafka: the gateway alone, closed loop at {connections} connections");
            memory::reset_peak()?;
            let (phase, keys) = on_kafka(&format!("ingest-{connections}"));
            let gateway = GatewayOnly::start(&self.settings(&phase, &keys)?).await?;
            let skyport = self
                .load(&gateway.url, self.closed_loop(connections))
                .await?;
            let peak_rss_mib = memory::peak_mib()?;
            gateway.stop().await?;
            ingest.push(KafkaIngest {
                connections,
                ratio: skyport.requests_per_s / bare.requests_per_s,
                ceiling: bare,
                skyport,
                peak_rss_mib,
            });
        }
        let (phase, keys) = on_kafka("end-to-end");
        let end_to_end = self.end_to_end_on(&phase, &keys).await?;
        Ok(KafkaRun {
            partitions: KAFKA_PARTITIONS,
            ingest,
            end_to_end,
        })
    }

    /// (5): the rate limiter at R with a backlog larger than R can clear.
    async fn rate_limited(&self) -> anyhow::Result<RateLimited> {
        let plan = &self.plan;
        let rate = plan.limited_rate;
        eprintln!("rate limiter at {rate}/s");
        let (system, services) = self.system("rate-limit", rate, &[]).await?;
        let window = plan.limited_window;
        let backlog = u64::from(rate) * (window.as_secs() + 4);
        let posted = poster::post(
            &system.url,
            Schedule::Requests(backlog),
            64,
            Naming::Unnamed,
            0,
        )
        .await?;
        // Let the limiter settle after the posting, then count over the window.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let before = system.terminal();
        let opened = Instant::now();
        tokio::time::sleep(window).await;
        let completed = system.terminal() - before;
        let seconds = opened.elapsed().as_secs_f64();
        let waiting = posted.status("202").saturating_sub(system.terminal());
        Self::stop(system, services).await?;
        Ok(RateLimited {
            rate,
            seconds,
            completed,
            achieved_per_s: completed as f64 / seconds,
            waiting_after: waiting,
        })
    }

    /// (7): the whole system as users run it (`cargo run --release`). No
    /// `services.base_url`, so the process starts the simulated services
    /// itself at their defaults (10 to 20 ms a call); they, the worker and the
    /// gateway share this process, and the machine with the poster. Every
    /// request has a package of its own, numbered on across the phase, since
    /// every run posts to the same store.
    ///
    /// The ceiling is loaded by the poster too (its handler takes any valid
    /// body), in rounds alternating with Skyport's as ingest's do, so that the
    /// ratio compares like with like. Each Skyport round is drained before the
    /// next ceiling round and before the open loop, which thus start on an
    /// idle machine. The peak RSS covers the whole phase, the in-process
    /// ceiling's few MiB included.
    async fn all_in_one(&self) -> anyhow::Result<WholeSystem> {
        let plan = &self.plan;
        // Ingest's first connection count, so that the ratio compares with its row.
        let connections = plan.connections[0];
        let closed_loop = Schedule::For(plan.closed_loop);
        memory::reset_peak()?;
        let system = AllInOne::start(self.settings("all-in-one", &[])?).await?;
        let (mut posted, mut accepted) = (0, 0);
        let (mut rounds, mut work) = (Vec::new(), Vec::new());
        for round in 1..=plan.rounds {
            eprintln!(
                "all in one: the ceiling, closed loop at {connections} connections (round {round})"
            );
            let ceiling = Ceiling::start().await?;
            let bare =
                poster::post(&ceiling.url, closed_loop, connections, Naming::Unnamed, 0).await?;
            ceiling.stop().await?;
            eprintln!("all in one: closed loop at {connections} connections (round {round})");
            let (cpu_before, round_started) = (CpuTime::this()?, Instant::now());
            let skyport = poster::post(
                &system.url,
                closed_loop,
                connections,
                Naming::Unnamed,
                posted,
            )
            .await?;
            posted += skyport.requests;
            accepted += skyport.status("202");
            let drained = self.drain(&system, accepted).await?;
            eprintln!(
                "all in one: round {round} drained {:.1} s after its last answer",
                drained.as_secs_f64()
            );
            let seconds = round_started.elapsed().as_secs_f64();
            let workflows = skyport.status("202");
            work.push(WholeRound {
                workflows,
                seconds,
                workflows_per_s: workflows as f64 / seconds,
                cpu_us_per_workflow: CpuTime::this()?.since(cpu_before).own_s * 1e6
                    / workflows.max(1) as f64,
            });
            rounds.push((skyport.requests_per_s / bare.requests_per_s, bare, skyport));
        }
        // The round of the median ratio stands for them all; every ratio is kept.
        rounds.sort_by(|a, b| a.0.total_cmp(&b.0));
        let ratios = rounds.iter().map(|r| r.0).collect();
        let (ratio, ceiling, skyport) = rounds.swap_remove(rounds.len() / 2);

        eprintln!(
            "all in one: open loop at {}/s for {} s, the worker draining behind it",
            plan.fixed_rate,
            plan.fixed_duration.as_secs()
        );
        let open_loop = poster::post(
            &system.url,
            Schedule::Rate {
                per_s: plan.fixed_rate,
                duration: plan.fixed_duration,
            },
            OPEN_LOOP_CONNECTIONS,
            Naming::Unnamed,
            posted,
        )
        .await?;
        accepted += open_loop.status("202");
        let backlog = accepted.saturating_sub(system.terminal());
        let drained = self.drain(&system, accepted).await?;
        let peak_rss_mib = memory::peak_mib()?;
        let result = WholeSystem {
            connections,
            ceiling,
            skyport,
            ratio,
            ratios,
            work,
            rate: plan.fixed_rate,
            seconds: plan.fixed_duration.as_secs_f64(),
            open_loop,
            accepted,
            published: system.published(),
            backlog,
            drain_s: drained.as_secs_f64(),
            terminal: system.terminal(),
            scheduled: system.scheduled(),
            failed: system.failed(),
            peak_rss_mib,
        };
        system.stop().await?;
        Ok(result)
    }

    /// Waits until every request accepted so far, and every event in the
    /// stream (a request whose answer was lost on the way still counts), is
    /// terminal; how long that took. Accepted means durable: one still not
    /// terminal after `plan.drain_timeout` counts as lost, and fails the phase.
    async fn drain(&self, system: &AllInOne, accepted: u64) -> anyhow::Result<Duration> {
        let started = Instant::now();
        loop {
            let durable = system.published().max(accepted);
            let terminal = system.terminal();
            if terminal >= durable {
                return Ok(started.elapsed());
            }
            anyhow::ensure!(
                started.elapsed() < self.plan.drain_timeout,
                "all in one: {} of {durable} accepted requests lost (not terminal after {} s; \
                 {} Scheduled, {} Failed)",
                durable - terminal,
                self.plan.drain_timeout.as_secs(),
                system.scheduled(),
                system.failed()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// The burst's counts over time, for its chart.
struct Timeline {
    started: Instant,
    /// Seconds since `started` when the next sample is due.
    next: f64,
    samples: Vec<BurstSample>,
}

impl Timeline {
    /// Twenty samples over the ten seconds of sending, a few hundred over
    /// the whole phase.
    const EVERY_S: f64 = 0.5;

    /// Starts with the counts at `started`.
    fn new(started: Instant, system: &AllInOne) -> Self {
        let mut timeline = Self {
            started,
            next: Self::EVERY_S,
            samples: Vec::new(),
        };
        timeline.take(system);
        timeline
    }

    /// Takes a sample if one is due (call it more often than [`Self::EVERY_S`]).
    fn sample(&mut self, system: &AllInOne) {
        let elapsed = self.started.elapsed().as_secs_f64();
        if elapsed >= self.next {
            self.take(system);
            self.next = ((elapsed / Self::EVERY_S).floor() + 1.0) * Self::EVERY_S;
        }
    }

    /// Takes a sample now.
    fn take(&mut self, system: &AllInOne) {
        self.samples.push(BurstSample {
            seconds: self.started.elapsed().as_secs_f64(),
            published: system.published(),
            terminal: system.terminal(),
        });
    }
}

/// Each terminal delivery's time from its acceptance (`createdAt`, the time
/// the gateway stamped on its event) to its terminal write (`updatedAt`), in
/// microseconds.
async fn terminal_times(system: &AllInOne) -> anyhow::Result<Vec<u32>> {
    Ok(terminal_documents(system)
        .await?
        .iter()
        .map(micros_to_terminal)
        .collect())
}

/// A terminal delivery's time from its acceptance to its terminal write, in microseconds.
pub(crate) fn micros_to_terminal(document: &StatusDocument) -> u32 {
    let micros = (document.updated_at - document.created_at).whole_microseconds();
    u32::try_from(micros.max(0)).unwrap_or(u32::MAX)
}

/// Every terminal delivery's status document, the last version of each, read
/// through the store's change feed.
pub(crate) async fn terminal_documents(system: &AllInOne) -> anyhow::Result<Vec<StatusDocument>> {
    let changes = system.app.backends.store.changes();
    let mut documents = HashMap::new();
    for range in changes.ranges().await? {
        let mut from: Option<String> = None;
        loop {
            let page = changes
                .read(&range, from.as_deref(), StartFrom::Beginning, 10_000)
                .await?;
            if page.changes.is_empty() && page.skipped == 0 {
                break;
            }
            for change in page.changes {
                let document: StatusDocument = serde_json::from_value(change.document)?;
                if document.state.is_terminal() {
                    documents.insert(document.id.clone(), document);
                }
            }
            from = Some(page.continuation);
        }
    }
    Ok(documents.into_values().collect())
}
