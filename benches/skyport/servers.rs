//! The servers under test, each on 127.0.0.1 port 0 in this process.

use std::path::Path;
use std::sync::atomic::Ordering;

use anyhow::Context;
use axum::Json;
use axum::http::StatusCode;
use axum::routing::post;
use skyport::App;
use skyport::Backends;
use skyport_core::request::DeliveryRequest;
use skyport_gateway::Gateway;
use skyport_gateway::auth::Auth;
use skyport_runtime::config::{Cli, Settings};
use skyport_runtime::metrics;
use skyport_worker::workflow::Tally;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The ceiling: a bare axum handler that parses the same body into the same
/// type and answers 202, with nothing durable behind it.
#[derive(Debug)]
pub(crate) struct Ceiling {
    pub(crate) url: String,
    shutdown: CancellationToken,
    task: JoinHandle<std::io::Result<()>>,
}

impl Ceiling {
    pub(crate) async fn start() -> anyhow::Result<Self> {
        async fn accept(Json(_request): Json<DeliveryRequest>) -> (StatusCode, &'static str) {
            (StatusCode::ACCEPTED, r#"{"status":"Accepted"}"#)
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}/api/deliveryrequests", listener.local_addr()?);
        let router = axum::Router::new().route("/api/deliveryrequests", post(accept));
        let shutdown = CancellationToken::new();
        let stop = shutdown.clone();
        let task = tokio::spawn(async move {
            axum::serve(listener, router)
                .with_graceful_shutdown(stop.cancelled_owned())
                .await
        });
        Ok(Self {
            url,
            shutdown,
            task,
        })
    }

    pub(crate) async fn stop(self) -> anyhow::Result<()> {
        self.shutdown.cancel();
        Ok(self.task.await??)
    }
}

/// The settings a single-node user runs (`cargo run --release`), with data
/// in `dir`, listeners on port 0 and the phase's own `keys`. Like the binary,
/// it takes `SKYPORT__*` variables, so a run can try another setting
/// (`SKYPORT__WORKER__MAX_IN_FLIGHT=64`).
pub(crate) fn settings(dir: &Path, keys: &[(&str, String)]) -> anyhow::Result<Settings> {
    let mut set = vec!["gateway.listen=127.0.0.1:0".to_owned()];
    set.extend(keys.iter().map(|(key, value)| format!("{key}={value}")));
    let cli = Cli {
        config: None,
        set,
        listen: None,
        data_dir: Some(dir.display().to_string()),
    };
    Settings::load(&cli).map_err(|errors| anyhow::anyhow!("bad settings: {errors}"))
}

/// The gateway alone on the embedded store: what ingest costs, with no worker
/// taking a share of the machine (on Event Hubs the gateway is its own process).
/// Built as `skyport-gateway` builds it: its credentials and the sections the
/// profile fills in from the settings.
#[derive(Debug)]
pub(crate) struct GatewayOnly {
    pub(crate) url: String,
    pub(crate) backends: Backends,
    shutdown: CancellationToken,
    task: JoinHandle<()>,
}

impl GatewayOnly {
    pub(crate) async fn start(settings: &Settings) -> anyhow::Result<Self> {
        let backends = Backends::open(settings)
            .await
            .context("cannot open the embedded store")?;
        let gateway = Gateway::bind(
            &backends.ports,
            &settings.gateway_settings(),
            skyport_runtime::destination::CallbackAcceptance::from_settings(settings),
            Auth::from_settings(settings).await?,
            Vec::new(),
        )
        .await?;
        let url = format!("http://{}/api/deliveryrequests", gateway.local_addr()?);
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(gateway.serve(shutdown.clone()));
        Ok(Self {
            url,
            backends,
            shutdown,
            task,
        })
    }

    /// Events durable in the stream.
    pub(crate) fn published(&self) -> u64 {
        published(&self.backends)
    }

    /// Durable commits of the embedded store so far, and the writes they carried.
    pub(crate) fn commits(&self) -> (u64, u64) {
        self.backends.embedded.as_ref().map_or((0, 0), |store| {
            let stats = store.commit_stats();
            (
                stats.commits.load(Ordering::Relaxed),
                stats.operations.load(Ordering::Relaxed),
            )
        })
    }

    pub(crate) async fn stop(self) -> anyhow::Result<()> {
        self.shutdown.cancel();
        self.task.await?;
        Ok(())
    }
}

/// Gateway and worker in this process, calling the services its settings
/// name (`services.base_url`); with none, [`App`] starts the simulated
/// services in this process too, at the settings' `simulator` values, as
/// `cargo run --release` does.
#[derive(Debug)]
pub(crate) struct AllInOne {
    pub(crate) url: String,
    pub(crate) app: App,
}

impl AllInOne {
    pub(crate) async fn start(settings: Settings) -> anyhow::Result<Self> {
        let app = App::start(settings, CancellationToken::new()).await?;
        let url = format!("http://{}/api/deliveryrequests", app.gateway_addr);
        Ok(Self { url, app })
    }

    /// Deliveries that reached a terminal state.
    pub(crate) fn terminal(&self) -> u64 {
        terminal(&self.app.tally)
    }

    pub(crate) fn published(&self) -> u64 {
        published(&self.app.backends)
    }

    /// Partitions the worker reads now: the checkpoint-age series on `/metrics`.
    pub(crate) fn partitions_read(&self) -> usize {
        metrics::global()
            .render()
            .lines()
            .filter(|line| line.starts_with("skyport_checkpoint_age_seconds{"))
            .count()
    }

    /// Deliveries that ended Scheduled.
    pub(crate) fn scheduled(&self) -> u64 {
        self.app.tally.scheduled.load(Ordering::Relaxed)
    }

    /// The embedded database's durable commits so far, and the writes they
    /// carried; `None` when status is not kept in the embedded store.
    pub(crate) fn database_commits(&self) -> Option<(u64, u64)> {
        self.app.backends.embedded.as_ref().map(|store| {
            let stats = store.database_commit_stats();
            (
                stats.commits.load(Ordering::Relaxed),
                stats.operations.load(Ordering::Relaxed),
            )
        })
    }

    /// Deliveries that ended Failed (every request posted is valid: none should).
    pub(crate) fn failed(&self) -> u64 {
        self.app.tally.failed.load(Ordering::Relaxed)
    }

    pub(crate) async fn stop(self) -> anyhow::Result<()> {
        self.app.stop().await
    }
}

fn terminal(tally: &Tally) -> u64 {
    tally.scheduled.load(Ordering::Relaxed)
        + tally.failed.load(Ordering::Relaxed)
        + tally.cancelled.load(Ordering::Relaxed)
}

fn published(backends: &Backends) -> u64 {
    backends
        .embedded
        .as_ref()
        .map_or(0, |store| store.heads().iter().sum())
}

/// The five simulated services in a process of their own (this binary with
/// `--simulate LATENCY_MS`), as remote services would be: their memory (every
/// resource they create) is not counted as Skyport's, and their CPU is
/// another process's on the same two cores.
#[derive(Debug)]
pub(crate) struct Simulated {
    pub(crate) url: String,
    child: std::process::Child,
}

impl Simulated {
    pub(crate) async fn start(latency_ms: u64) -> anyhow::Result<Self> {
        tokio::task::spawn_blocking(move || {
            use std::io::BufRead;
            let mut child = std::process::Command::new(std::env::current_exe()?)
                .args(["--simulate", &latency_ms.to_string()])
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::inherit())
                .spawn()
                .context("cannot start the simulated services")?;
            let stdout = child.stdout.take().context("no stdout")?;
            let mut url = String::new();
            std::io::BufReader::new(stdout).read_line(&mut url)?;
            let url = url.trim().to_owned();
            anyhow::ensure!(!url.is_empty(), "the simulated services printed no address");
            Ok(Self { url, child })
        })
        .await?
    }

    /// Their process id, to read their CPU time.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Closes their stdin, which stops them, and waits.
    pub(crate) async fn stop(mut self) -> anyhow::Result<()> {
        drop(self.child.stdin.take());
        let status = tokio::task::spawn_blocking(move || self.child.wait()).await??;
        anyhow::ensure!(status.success(), "the simulated services failed: {status}");
        Ok(())
    }
}

/// The child side of [`Simulated`]: serves on 127.0.0.1, port 0, prints the
/// base URL, and stops when stdin closes.
pub(crate) fn simulate(args: &[String]) -> anyhow::Result<()> {
    use skyport_simulator::{Behaviour, Simulator, SimulatorOptions};
    let [latency_ms] = args else {
        anyhow::bail!("--simulate takes LATENCY_MS");
    };
    let latency = std::time::Duration::from_millis(latency_ms.parse().context("LATENCY_MS")?);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let simulator = Simulator::new(SimulatorOptions {
            behaviour: Behaviour {
                latency,
                jitter: std::time::Duration::ZERO,
                ..Behaviour::default()
            },
            ..SimulatorOptions::default()
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        println!("http://{}/", listener.local_addr()?);
        let shutdown = CancellationToken::new();
        let stdin_closed = shutdown.clone();
        tokio::task::spawn_blocking(move || {
            let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
            stdin_closed.cancel();
        });
        simulator.serve(listener, shutdown).await?;
        Ok(())
    })
}
