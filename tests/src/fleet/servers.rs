//! The shared servers, each a process of its own: this executable run again
//! with a role (`--serve cosmos [--throttling]`, `--serve eventhubs
//! HUB:PARTITIONS…`). A server binds 127.0.0.1 port 0, prints `serving on
//! ADDRESS`, and stops on SIGTERM or when its standard input closes (so it
//! never outlives the test that started it).

use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::time::Duration;

use skyport_azure::cosmos::emulator::server;
use tokio::io::{AsyncBufReadExt, AsyncReadExt};
use tokio::process::{Child, Command};
use tokio_util::sync::CancellationToken;

use crate::eventhubs_broker::EventHubsBroker;

/// A process of the fleet, killed when the test drops it. It captures no
/// backtrace for the errors it handles: `RUST_BACKTRACE=1`, where the tests
/// run with it, is for their panics, and the Azure SDK builds an error, with
/// its backtrace, for every header it looks for and misses, which took a
/// fifth of the Cosmos DB emulator's CPU (a production process runs without).
pub fn process(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut command = Command::new(program);
    command.env("RUST_LIB_BACKTRACE", "0").kill_on_drop(true);
    command
}

/// The binary `name` of the skyport package (`skyport-gateway`,
/// `skyport-worker`, `skyport-simulator`), from the build that runs this
/// executable: cargo builds a package's binaries before its tests and
/// benches, and puts them one directory above theirs (`deps/`).
///
/// # Panics
/// When it is not there, naming the command that builds it.
pub fn binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let path = exe
        .parent()
        .and_then(Path::parent)
        .map(|profile| profile.join(name))
        .unwrap_or_else(|| panic!("{} has no build directory", exe.display()));
    assert!(
        path.exists(),
        "{} is missing: the fleet runs from the skyport package's tests and benches, \
         for which cargo builds it (`cargo build --bin {name}`)",
        path.display()
    );
    path
}

/// The argument that makes this executable a server.
pub const ROLE: &str = "--serve";

/// Runs the server `args` name; the exit code says whether it started.
pub fn serve(args: &[String]) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: &[String]) -> anyhow::Result<()> {
    let stop = stopped();
    match args.first().map(String::as_str) {
        Some("cosmos") => {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
            let throttling = args.iter().any(|a| a == "--throttling");
            let account = server::account_for(&listener, throttling)?;
            println!("serving on http://{}/", listener.local_addr()?);
            server::serve(listener, account, stop).await;
        }
        Some("eventhubs") => {
            let hubs = args[1..]
                .iter()
                .map(|hub| {
                    let (name, partitions) = hub
                        .split_once(':')
                        .ok_or_else(|| anyhow::anyhow!("{hub}: not HUB:PARTITIONS"))?;
                    Ok((name, partitions.parse::<u32>()?))
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            let broker = EventHubsBroker::start(&hubs).await?;
            println!("serving on {}", broker.endpoint());
            stop.cancelled().await;
            broker.stop().await;
        }
        other => anyhow::bail!("no server role {other:?} (cosmos, eventhubs)"),
    }
    Ok(())
}

/// Cancelled on SIGTERM or when standard input reaches its end.
fn stopped() -> CancellationToken {
    let stop = CancellationToken::new();
    let on_signal = stop.clone();
    tokio::spawn(async move {
        if let Ok(mut terminate) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        {
            terminate.recv().await;
        }
        on_signal.cancel();
    });
    let on_eof = stop.clone();
    tokio::spawn(async move {
        let mut sink = Vec::new();
        let _ = tokio::io::stdin().read_to_end(&mut sink).await;
        on_eof.cancel();
    });
    stop
}

/// What `child` prints on its standard output after `prefix` (its address),
/// within 30 s; `what` names it when it does not.
///
/// # Panics
/// When it exits or says nothing of the kind within 30 s.
pub async fn announced(child: &mut Child, prefix: &str, what: &str) -> String {
    let stdout = child.stdout.take().unwrap();
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if let Some(address) = line.strip_prefix(prefix) {
                return address.to_owned();
            }
        }
        panic!("{what} exited before saying where it listens");
    })
    .await
    .unwrap_or_else(|_| panic!("{what} did not start within 30 s"))
}

/// A server started by [`Server::start`]; killed when dropped.
#[derive(Debug)]
pub struct Server {
    /// What it printed after `serving on`.
    pub address: String,
    child: Child,
}

impl Server {
    /// This executable as the server `role` (with its arguments).
    ///
    /// # Panics
    /// When it cannot start or does not say where it serves within 30 s.
    pub async fn start(role: &[&str]) -> Self {
        let mut child = process(std::env::current_exe().unwrap())
            .arg(ROLE)
            .args(role)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let address = announced(&mut child, "serving on ", &format!("the {role:?} server")).await;
        Self { address, child }
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id().unwrap()
    }

    /// Stops it (its standard input closes) and waits for it.
    pub async fn stop(mut self) {
        drop(self.child.stdin.take());
        if tokio::time::timeout(Duration::from_secs(10), self.child.wait())
            .await
            .is_err()
        {
            self.child.kill().await.unwrap();
        }
    }
}
