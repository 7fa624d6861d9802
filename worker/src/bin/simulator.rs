//! `skyport-simulator`: serves the five simulated backend services on one address until Ctrl-C or
//! SIGTERM; bad command lines exit with 64 (EX_USAGE) before anything is bound.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use skyport_worker::simulator::{Simulator, SimulatorOptions};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

const USAGE: &str = "usage: skyport-simulator [--listen ADDR] [--latency-ms N] [--jitter-ms N] \
                     [--error-rate F] [--suspended-owner ID]...";
const EX_USAGE: u8 = 64;

#[tokio::main]
async fn main() -> anyhow::Result<ExitCode> {
    let (listen, options) = match parse(std::env::args().skip(1)) {
        Ok(parsed) => parsed,
        Err(message) => {
            eprintln!("skyport-simulator: {message}\n{USAGE}");
            return Ok(ExitCode::from(EX_USAGE));
        }
    };
    let listener = TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    println!(
        "simulated services listening on http://{}",
        listener.local_addr()?
    );
    let shutdown = CancellationToken::new();
    let signals = tokio::spawn({
        let shutdown = shutdown.clone();
        async move {
            let signalled = wait_for_signal().await;
            // Also on failure: a server that cannot be stopped by a signal must not keep running.
            shutdown.cancel();
            signalled
        }
    });
    Simulator::new(options).serve(listener, shutdown).await?;
    signals
        .await?
        .context("cannot listen for shutdown signals")?;
    Ok(ExitCode::SUCCESS)
}

fn parse(mut args: impl Iterator<Item = String>) -> Result<(SocketAddr, SimulatorOptions), String> {
    let mut listen = SocketAddr::from(([127, 0, 0, 1], 7070));
    let mut options = SimulatorOptions::default();
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--listen" => listen = parse_value(&flag, &value()?)?,
            "--latency-ms" => options.behaviour.latency = millis(&flag, &value()?)?,
            "--jitter-ms" => options.behaviour.jitter = millis(&flag, &value()?)?,
            "--error-rate" => {
                let rate: f64 = parse_value(&flag, &value()?)?;
                if !(0.0..=1.0).contains(&rate) {
                    return Err(format!("{flag} must be between 0 and 1, got {rate}"));
                }
                options.behaviour.error_rate = rate;
            }
            "--suspended-owner" => options.suspended_owners.push(value()?),
            _ => return Err(format!("unknown argument {flag:?}")),
        }
    }
    Ok((listen, options))
}

fn parse_value<T: std::str::FromStr>(flag: &str, value: &str) -> Result<T, String> {
    value
        .parse()
        .map_err(|_| format!("{flag}: invalid value {value:?}"))
}

fn millis(flag: &str, value: &str) -> Result<Duration, String> {
    parse_value(flag, value).map(Duration::from_millis)
}

/// Resolves on the first Ctrl-C or SIGTERM; `Err` when the handlers cannot be installed.
async fn wait_for_signal() -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut terminate = signal(SignalKind::terminate())?;
        tokio::select! {
            result = tokio::signal::ctrl_c() => result,
            _ = terminate.recv() => Ok(()),
        }
    }
    #[cfg(not(unix))]
    {
        tokio::signal::ctrl_c().await
    }
}
