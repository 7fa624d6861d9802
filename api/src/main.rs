//! `skyport-gateway`: the gateway alone, for deployments that run the worker
//! as a separate process (the embedded store belongs to one process, so that
//! takes a shared stream and store).

use anyhow::Context;
use skyport_api::Gateway;
use skyport_api::auth::Auth;
use skyport_shared::adapters::Backends;
use skyport_shared::config::Settings;
use skyport_shared::telemetry::Telemetry;
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let settings = Settings::from_args_or_exit(
        "skyport-gateway",
        "Skyport gateway: accepts delivery requests and serves their status.",
    );
    let telemetry = Telemetry::init_or_exit(&settings, "skyport-gateway");
    let auth = Auth::from_settings(&settings).await?;
    let backends = Backends::open(&settings)
        .await
        .context("cannot open the stream and store")?;
    let gateway = Gateway::bind(&backends, &settings.gateway, auth, Vec::new()).await?;
    tracing::info!(address = %gateway.local_addr()?, "The gateway is listening.");
    let shutdown = CancellationToken::new();
    let signals = tokio::spawn(skyport_shared::shutdown::cancel_on_signal(shutdown.clone()));
    let result = gateway.serve(shutdown).await;
    backends.close().await;
    signals.abort();
    telemetry.shutdown().await;
    result.context("the gateway failed")
}
