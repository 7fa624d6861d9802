//! `skyport-worker`: the worker alone, calling the services at `services.base_url`.

use std::sync::Arc;

use anyhow::Context;
use skyport_shared::adapters::Backends;
use skyport_shared::config::{EXIT_CONFIG, Settings};
use skyport_shared::telemetry::Telemetry;
use skyport_worker::{Worker, ops};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let settings = Settings::from_args_or_exit(
        "skyport-worker",
        "Skyport worker: runs the delivery workflow for every accepted request.",
    );
    let telemetry = Telemetry::init_or_exit(&settings, "skyport-worker");
    let Some(services_url) = settings.services.base_url.clone() else {
        eprintln!(
            "skyport-worker: configuration error: services.base_url: must be set (the URL that serves the five services)"
        );
        std::process::exit(EXIT_CONFIG);
    };
    let backends = Backends::open(&settings)
        .await
        .context("cannot open the stream and store")?;
    let worker = Worker::new(
        backends.clone(),
        services_url,
        &settings.services,
        settings.worker.clone(),
    )?;
    let listener = TcpListener::bind(settings.worker.listen)
        .await
        .with_context(|| {
            format!(
                "cannot listen on worker.listen = {}",
                settings.worker.listen
            )
        })?;
    tracing::info!(address = %listener.local_addr()?, "The worker serves /healthz, /readyz and /metrics.");
    let shutdown = CancellationToken::new();
    let signals = tokio::spawn(skyport_shared::shutdown::cancel_on_signal(shutdown.clone()));
    let ops_shutdown = CancellationToken::new();
    let ops = tokio::spawn(ops::serve(
        listener,
        ops::router(
            Arc::clone(&backends.status),
            Arc::new(worker.intake()),
            shutdown.clone(),
        ),
        ops_shutdown.clone(),
    ));
    let result = worker.run(shutdown).await;
    backends.close().await;
    signals.abort();
    ops_shutdown.cancel();
    if let Ok(Err(e)) = ops.await {
        tracing::warn!(error = %e, "The worker's ops listener failed.");
    }
    telemetry.shutdown().await;
    result.context("the worker stopped")
}
