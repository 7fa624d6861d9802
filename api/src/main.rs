//! `skyport-gateway`: the gateway alone, for deployments that run the worker
//! as a separate process (the embedded store belongs to one process, so that
//! takes a shared stream and store).

use anyhow::Context;
use skyport_api::AppState;
use skyport_shared::adapters::Backends;
use skyport_shared::config::Settings;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    skyport_shared::telemetry::init();
    let settings = Settings::from_args_or_exit(
        "skyport-gateway",
        "Skyport gateway: accepts delivery requests and serves their status.",
    );
    let backends = Backends::open(&settings).context("cannot open the stream and store")?;
    let state = AppState::new(&backends, &settings.gateway);
    let listener = TcpListener::bind(settings.gateway.listen)
        .await
        .with_context(|| {
            format!(
                "cannot listen on gateway.listen = {}",
                settings.gateway.listen
            )
        })?;
    tracing::info!(address = %listener.local_addr()?, "The gateway is listening.");
    let shutdown = CancellationToken::new();
    let signals = tokio::spawn(skyport_shared::shutdown::cancel_on_signal(shutdown.clone()));
    let router = skyport_api::router(state, settings.gateway.max_body_bytes);
    let result = skyport_api::serve(
        listener,
        router,
        shutdown,
        settings.gateway.shutdown_grace_period(),
    )
    .await;
    signals.abort();
    result.context("the gateway failed")
}
