//! `skyport-worker`: the worker alone, calling the services at
//! `services.base_url`, and the callbacks' change-feed processor, with its
//! probes, metrics and `/admin` reports on `worker.listen`; on Cosmos DB it
//! gives documents of an earlier version what listing needs, once.

use std::sync::Arc;

use anyhow::Context;
use skyport_core::ports::Diagnostics;
use skyport_runtime::admin::{self, Admin};
use skyport_runtime::config::{ConfigError, Settings};
use skyport_runtime::http;
use skyport_runtime::priority::BackgroundRuntime;
use skyport_worker::Worker;
use tokio_util::sync::CancellationToken;

use crate::backends::Backends;
use crate::callbacks::{check_secrets, notifier};
use crate::listing::backfill;

/// How long `/readyz` asks a prober to wait once the worker is unready.
const RETRY_AFTER_S: u32 = 1;

/// Runs the worker until `shutdown`, then drains it; its admin routes answer
/// meanwhile (unready once it drains).
///
/// # Errors
/// When `services.base_url` is unset, callbacks are enabled with no secret
/// to sign them on Cosmos DB, a backend cannot be opened, the admin
/// listener cannot be bound, or the backlog stayed over its limit.
pub async fn run(settings: Settings, shutdown: CancellationToken) -> anyhow::Result<()> {
    let services_url = settings.services.base_url.clone().ok_or_else(|| {
        ConfigError::new(
            "services.base_url",
            "must be set (the URL that serves the five services)",
        )
    })?;
    check_secrets(&settings)?;
    let backends = Backends::open(&settings)
        .await
        .context("cannot open the stream and store")?;
    let worker = Worker::new(
        &backends.worker_ports(),
        services_url,
        &settings.services,
        settings.worker.clone(),
    )?;
    let listen = settings.worker.listen;
    let listener = http::listen(listen, settings.gateway.listen_backlog)
        .with_context(|| format!("cannot listen on worker.listen = {listen}"))?;
    tracing::info!(address = %listener.local_addr()?, "The worker serves /healthz, /readyz, /metrics and /dashboard (when on).");
    let callbacks = notifier(&settings, &backends)?;
    let backfill = backfill(&backends, shutdown.clone());
    let diagnostics: Vec<Arc<dyn Diagnostics>> = callbacks
        .iter()
        .map(|processor| Arc::clone(processor) as Arc<dyn Diagnostics>)
        .collect();
    let admin = admin::router(
        Admin::new(
            Arc::new(worker.readiness(shutdown.clone(), diagnostics)),
            RETRY_AFTER_S,
        ),
        settings.worker_dashboard(),
    );
    let admin_shutdown = CancellationToken::new();
    let server = tokio::spawn({
        let http = settings.worker.http.clone();
        let admin_shutdown = admin_shutdown.clone();
        async move { admin::serve(listener, admin, &http, admin_shutdown).await }
    });
    // Below a gateway on the same node, the worker yields the CPU to it (`worker.nice`).
    let runtime = BackgroundRuntime::new("skyport-worker", settings.worker.nice)
        .context("cannot start the worker's threads")?;
    let notifying = callbacks.map(|processor| runtime.spawn(processor.run(shutdown.clone())));
    let backfilling = backfill.map(|backfill| runtime.spawn(backfill));
    let result = runtime
        .spawn(worker.run(shutdown))
        .await
        .context("the worker panicked")?;
    if let Some(notifying) = notifying {
        notifying
            .await
            .context("the change-feed processor panicked")?;
    }
    if let Some(backfilling) = backfilling {
        backfilling
            .await
            .context("the listing's backfill panicked")?;
    }
    drop(runtime);
    backends.close().await;
    admin_shutdown.cancel();
    if let Err(e) = server.await {
        tracing::warn!(error = %e, "The worker's admin listener failed.");
    }
    result.context("the worker stopped")
}
