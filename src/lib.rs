//! The all-in-one Skyport: gateway, worker and (unless real services are
//! configured) the simulated services in one process on the embedded store.
//!
//! [`App::start`] brings the parts up in dependency order and [`App::stop`]
//! takes them down in reverse: the gateway and the worker drain first, the
//! simulated services stop last so in-flight steps can finish against them.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use skyport_api::Gateway;
use skyport_api::auth::Auth;
use skyport_shared::adapters::Backends;
use skyport_shared::config::Settings;
use skyport_worker::Worker;
use skyport_worker::simulator::{Behaviour, Simulator, SimulatorOptions};
use skyport_worker::workflow::Counters;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use url::Url;

/// A running all-in-one process.
#[derive(Debug)]
pub struct App {
    /// Where the gateway listens.
    pub gateway_addr: SocketAddr,
    /// Where the workflow sends its calls.
    pub services_url: Url,
    /// The in-process simulated services, when no `services.base_url` is configured.
    pub simulator: Option<Simulator>,
    pub backends: Backends,
    pub counters: Arc<Counters>,
    shutdown: CancellationToken,
    simulator_shutdown: CancellationToken,
    parts: JoinSet<anyhow::Result<()>>,
    simulator_task: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

impl App {
    /// Opens the store and starts every part; `shutdown` stops the gateway and the worker.
    ///
    /// # Errors
    /// When the store cannot be opened, the token issuer's keys cannot be
    /// fetched or a listener cannot be bound.
    pub async fn start(settings: Settings, shutdown: CancellationToken) -> anyhow::Result<Self> {
        let backends = Backends::open(&settings)
            .await
            .context("cannot open the stream and the store")?;
        Self::start_with(settings, backends, shutdown).await
    }

    /// Starts every part on backends already open.
    ///
    /// # Errors
    /// When the token issuer's keys cannot be fetched or a listener cannot be bound.
    pub async fn start_with(
        settings: Settings,
        backends: Backends,
        shutdown: CancellationToken,
    ) -> anyhow::Result<Self> {
        let auth = Auth::from_settings(&settings).await?;
        let simulator_shutdown = CancellationToken::new();
        let (services_url, simulator, simulator_task) = match &settings.services.base_url {
            Some(url) => (url.clone(), None, None),
            None => {
                let simulator = Simulator::new(SimulatorOptions {
                    behaviour: Behaviour {
                        latency: std::time::Duration::from_millis(settings.simulator.latency_ms),
                        jitter: std::time::Duration::from_millis(settings.simulator.jitter_ms),
                        error_rate: settings.simulator.error_rate,
                        ..Behaviour::default()
                    },
                    suspended_owners: settings.simulator.suspended_owners.clone(),
                });
                let listener = TcpListener::bind(settings.simulator.listen)
                    .await
                    .with_context(|| {
                        format!(
                            "cannot listen on simulator.listen = {}",
                            settings.simulator.listen
                        )
                    })?;
                let url = Url::parse(&format!("http://{}/", listener.local_addr()?))?;
                let task = tokio::spawn(
                    simulator
                        .clone()
                        .serve(listener, simulator_shutdown.clone()),
                );
                (url, Some(simulator), Some(task))
            }
        };
        let worker = Worker::new(
            backends.clone(),
            services_url.clone(),
            &settings.services,
            settings.worker.clone(),
        )?;
        let counters = worker.counters();
        let gateway = Gateway::bind(
            &backends,
            &settings.gateway,
            auth,
            vec![Arc::new(worker.intake())],
        )
        .await?;
        let gateway_addr = gateway.local_addr()?;
        let mut parts = JoinSet::new();
        let worker_shutdown = shutdown.clone();
        parts.spawn(async move {
            worker
                .run(worker_shutdown)
                .await
                .context("the worker stopped")
        });
        let gateway_shutdown = shutdown.clone();
        parts.spawn(async move {
            gateway
                .serve(gateway_shutdown)
                .await
                .context("the gateway failed")
        });
        Ok(Self {
            gateway_addr,
            services_url,
            simulator,
            backends,
            counters,
            shutdown,
            simulator_shutdown,
            parts,
            simulator_task,
        })
    }

    /// Waits until the shutdown token fires and every part has drained, then
    /// stops the simulated services.
    ///
    /// # Errors
    /// The first part that failed.
    pub async fn wait(mut self) -> anyhow::Result<()> {
        let mut result = Ok(());
        while let Some(joined) = self.parts.join_next().await {
            let outcome = joined
                .context("a part of the process panicked")
                .and_then(|r| r);
            if let Err(e) = outcome {
                tracing::error!(
                    error = format!("{e:#}"),
                    "A part of Skyport failed; stopping."
                );
                self.shutdown.cancel();
                if result.is_ok() {
                    result = Err(e);
                }
            }
        }
        self.backends.close().await;
        self.simulator_shutdown.cancel();
        if let Some(task) = self.simulator_task.take() {
            task.await.context("the simulated services panicked")??;
        }
        result
    }

    /// Stops the process as a signal would and waits for it to drain.
    ///
    /// # Errors
    /// The first part that failed.
    pub async fn stop(self) -> anyhow::Result<()> {
        self.shutdown.cancel();
        self.wait().await
    }
}
