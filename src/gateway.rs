//! `skyport-gateway`: the gateway alone, for deployments that run the worker
//! as a separate process (the embedded store belongs to one process, so that
//! takes a shared stream and store).

use anyhow::Context;
use skyport_gateway::Gateway;
use skyport_gateway::auth::Auth;
use skyport_runtime::config::Settings;
use skyport_runtime::destination::CallbackAcceptance;
use tokio_util::sync::CancellationToken;

use crate::backends::Backends;

/// Serves the gateway until `shutdown`, then drains it and closes the backends.
///
/// # Errors
/// When no key signs receipts, a backend cannot be opened or a listener
/// cannot be bound.
pub async fn run(settings: Settings, shutdown: CancellationToken) -> anyhow::Result<()> {
    settings.check_gateway()?;
    let auth = Auth::from_settings(&settings).await?;
    let backends = Backends::open(&settings)
        .await
        .context("cannot open the stream and store")?;
    let gateway = Gateway::bind(
        &backends.ports,
        &settings.gateway_settings(),
        CallbackAcceptance::from_settings(&settings),
        auth,
        Vec::new(),
    )
    .await?;
    tracing::info!(address = %gateway.local_addr()?, "The gateway is listening.");
    if let Some(internal) = gateway.internal_addr()? {
        tracing::info!(address = %internal, "The gateway serves /healthz, /readyz and /metrics there.");
    }
    gateway.serve(shutdown).await;
    backends.close().await;
    Ok(())
}
