//! The all-in-one process: gateway, worker and (unless real services are
//! configured) the simulated services in one process on the embedded store.
//!
//! [`App::start`] brings the parts up in dependency order and [`App::stop`]
//! takes them down in reverse: the gateway and the worker drain first, the
//! simulated services stop last so in-flight steps can finish against them.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use skyport_callbacks::change_feed::Processor;
use skyport_core::ports::Diagnostics;
use skyport_gateway::Gateway;
use skyport_gateway::auth::Auth;
use skyport_runtime::config::{ServicesProtocol, Settings, StreamBackend};
use skyport_runtime::destination::{AddressPolicy, CallbackAcceptance};
use skyport_runtime::foreground;
use skyport_runtime::http::listen;
use skyport_runtime::priority::BackgroundRuntime;
use skyport_simulator::{Simulator, SimulatorOptions};
use skyport_worker::Worker;
use skyport_worker::workflow::Tally;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use url::Url;

use crate::backends::Backends;
use crate::callbacks::{check_secrets, notifier};
use crate::listing::backfill;

/// How long a stopping process waits for the worker's runtime to end once
/// every part on it has returned (what is left on it is only dropped).
const BACKGROUND_STOP_WITHIN: Duration = Duration::from_secs(10);

/// A running all-in-one process.
#[derive(Debug)]
pub struct App {
    /// Where the gateway listens.
    pub gateway_addr: SocketAddr,
    /// Where the gateway serves its probes and metrics apart, with
    /// `gateway.internal_listen`.
    pub gateway_internal_addr: Option<SocketAddr>,
    /// Where the workflow sends its calls.
    pub services_url: Url,
    /// The in-process simulated services, when no `services.base_url` is configured.
    pub simulator: Option<Simulator>,
    pub backends: Backends,
    pub tally: Arc<Tally>,
    /// The change-feed processor delivering callbacks, when they are enabled.
    pub callbacks: Option<Arc<Processor>>,
    shutdown: CancellationToken,
    simulator_shutdown: CancellationToken,
    parts: JoinSet<anyhow::Result<()>>,
    simulator_task: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
    /// The worker's and the simulated services' threads; dropped last.
    background: BackgroundRuntime,
}

impl App {
    /// Opens the store and starts every part; `shutdown` stops the gateway and the worker.
    ///
    /// # Errors
    /// When no key signs receipts or callbacks are enabled with no secret to
    /// sign them on Cosmos DB, the store cannot be opened, the token issuer's keys cannot be fetched
    /// or a listener cannot be bound.
    pub async fn start(settings: Settings, shutdown: CancellationToken) -> anyhow::Result<Self> {
        settings.check_gateway()?;
        check_secrets(&settings)?;
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
        // The worker yields the CPU to the gateway: a spike is accepted first
        // and worked off behind it (`worker.nice`). The simulated services
        // stand in for the backends' machines, so their work is the
        // workflow's too and runs on the same threads.
        let runtime = BackgroundRuntime::new("skyport-worker", settings.worker.nice)
            .context("cannot start the worker's threads")?;
        let simulator_shutdown = CancellationToken::new();
        let (services_url, simulator, simulator_task) = match &settings.services.base_url {
            Some(url) => (url.clone(), None, None),
            None => {
                let simulator = Simulator::new(SimulatorOptions::from(&settings.simulator));
                let listener = listen(settings.simulator.listen, settings.gateway.listen_backlog)
                    .with_context(|| {
                    format!(
                        "cannot listen on simulator.listen = {}",
                        settings.simulator.listen
                    )
                })?;
                let url = Url::parse(&format!("http://{}/", listener.local_addr()?))?;
                let task = runtime.spawn(
                    simulator
                        .clone()
                        .serve(listener, simulator_shutdown.clone()),
                );
                (url, Some(simulator), Some(task))
            }
        };
        // The simulated services speak HTTP/2 over cleartext: under `auto`,
        // the workflow's calls to them share one connection.
        let mut services = settings.services.clone();
        if simulator.is_some() && services.protocol == ServicesProtocol::Auto {
            services.protocol = ServicesProtocol::H2c;
        }
        // The gateway's 202s wait on the worker only where both share the
        // embedded store's disk and committer; on Kafka or Event Hubs they
        // wait on the broker's round trip, which no narrower window shortens.
        if settings.stream_backend() == StreamBackend::Embedded {
            foreground::global().aim(settings.gateway.latency_objective_ms.duration());
        }
        let worker = Worker::new(
            &backends.worker_ports(),
            services_url.clone(),
            &services,
            settings.worker.clone(),
        )?;
        let tally = worker.tally();
        let callbacks = notifier(&settings, &backends)?;
        let mut diagnostics: Vec<Arc<dyn Diagnostics>> = vec![Arc::new(worker.pauses())];
        if let Some(processor) = &callbacks {
            diagnostics.push(Arc::clone(processor) as Arc<dyn Diagnostics>);
        }
        let gateway = Gateway::bind(
            &backends.ports,
            &settings.gateway_settings(),
            // The gateway takes callback URLs when this process delivers them.
            CallbackAcceptance {
                enabled: callbacks.is_some(),
                policy: AddressPolicy::new(settings.callbacks.allowed()),
            },
            auth,
            diagnostics,
        )
        .await?;
        let gateway_addr = gateway.local_addr()?;
        let gateway_internal_addr = gateway.internal_addr()?;
        let mut parts = JoinSet::new();
        let worker = runtime.spawn(worker.run(shutdown.clone()));
        parts.spawn(async move {
            worker
                .await
                .context("the worker panicked")?
                .context("the worker stopped")
        });
        if let Some(processor) = &callbacks {
            let processor = runtime.spawn(Arc::clone(processor).run(shutdown.clone()));
            parts.spawn(async move {
                processor
                    .await
                    .context("the change-feed processor panicked")
            });
        }
        if let Some(backfill) = backfill(&backends, shutdown.clone()) {
            let backfill = runtime.spawn(backfill);
            parts.spawn(async move { backfill.await.context("the listing's backfill panicked") });
        }
        let gateway_shutdown = shutdown.clone();
        parts.spawn(async move {
            gateway.serve(gateway_shutdown).await;
            Ok(())
        });
        Ok(Self {
            gateway_addr,
            gateway_internal_addr,
            services_url,
            simulator,
            backends,
            tally,
            callbacks,
            shutdown,
            simulator_shutdown,
            parts,
            simulator_task,
            background: runtime,
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
        // Every part on it has finished: stop its threads, and wait until
        // they have, so that whatever a task left on it held (the store's
        // file) is released before this returns and the data can be opened
        // again at once.
        self.background.shutdown(BACKGROUND_STOP_WITHIN).await;
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

/// `skyport`: every part on the embedded store until `shutdown`, telling the
/// user where it listens and how to try it.
///
/// # Errors
/// When a part cannot start, or one fails.
pub async fn run(settings: Settings, shutdown: CancellationToken) -> anyhow::Result<()> {
    let data_dir = settings.embedded.data_dir.clone();
    let dashboard = settings.gateway_settings().dashboard == Some(true);
    let app = App::start(settings, shutdown).await?;
    let url = format!("http://{}", app.gateway_addr);
    println!(
        "Skyport is listening on {url} (data in {}; Ctrl-C stops it)",
        data_dir.display()
    );
    println!("Simulated services: {}", app.services_url);
    println!("Try:");
    println!("  curl -si {url}/api/deliveryrequests -H 'content-type: application/json' \\");
    println!("    -d '{EXAMPLE_REQUEST}'");
    println!(
        "  then GET the statusUrl it answers with until the state is Scheduled (or open it in a browser)."
    );
    if dashboard {
        println!("Dashboard: {url}/dashboard");
    }
    app.wait().await
}

const EXAMPLE_REQUEST: &str = r#"{"ownerId":"owner-1","pickupLocation":"47.6423,-122.1368","pickupTime":"2030-01-01T10:00:00Z","deadline":"2030-01-01T12:00:00Z","dropoffLocation":"47.6101,-122.2015","packageInfo":{"packageId":"pkg-1","size":"Small","weight":2.5}}"#;
