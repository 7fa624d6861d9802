//! `skyport-worker`: the worker alone, calling the services at `services.base_url`.

use anyhow::Context;
use skyport_shared::adapters::Backends;
use skyport_shared::config::{EXIT_CONFIG, Settings};
use skyport_worker::Worker;
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    skyport_shared::telemetry::init();
    let settings = Settings::from_args_or_exit(
        "skyport-worker",
        "Skyport worker: runs the delivery workflow for every accepted request.",
    );
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
    let shutdown = CancellationToken::new();
    let signals = tokio::spawn(skyport_shared::shutdown::cancel_on_signal(shutdown.clone()));
    let result = worker.run(shutdown).await;
    backends.close().await;
    signals.abort();
    result.context("the worker stopped")
}
