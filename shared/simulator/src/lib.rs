//! The five simulated backend services (Account, Package, Delivery,
//! Third-party, Drone: one per workflow [`Step`]) behind one axum router; every PUT is idempotent per resource id, so a retried call never creates a second
//! resource and an injected failure never leaves a side effect.

mod routes;
mod state;
mod store;
#[cfg(test)]
mod tests;

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use anyhow::Context;
use axum::extract::Request;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use skyport_core::status::Step;
use skyport_runtime::config::SimulatorSettings;
use skyport_runtime::tasks::Task;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

pub use self::state::{Behaviour, ServiceStats, SimulatorOptions, SimulatorStats};
use self::state::{ServiceState, Services};

/// Calls one HTTP/2 connection may carry at once: enough for every workflow
/// a worker runs (hyper's default of 200 would queue the rest behind them).
pub const MAX_STREAMS: u32 = 10_000;

/// The simulated services; cloning shares the same state.
#[derive(Clone)]
pub struct Simulator {
    services: Arc<Services>,
}

impl Simulator {
    pub fn new(options: SimulatorOptions) -> Self {
        let SimulatorOptions {
            behaviour,
            suspended_owners,
            max_resources,
        } = options;
        Self {
            services: Arc::new(Services {
                services: std::array::from_fn(|_| {
                    ServiceState::new(behaviour.clone(), max_resources)
                }),
                suspended_owners: suspended_owners.into_iter().collect(),
                next_drone: AtomicU64::new(1),
                connections: AtomicU64::new(0),
            }),
        }
    }

    /// All routes of the five services plus `GET /_sim/stats`.
    pub fn router(&self) -> axum::Router {
        routes::router(Arc::clone(&self.services))
    }

    /// Serves the router until `shutdown` is cancelled, then drains in-flight
    /// requests. Each connection speaks HTTP/1.1 or, when it opens with
    /// HTTP/2's preface, HTTP/2 (cleartext, prior knowledge) with up to
    /// [`MAX_STREAMS`] calls at once.
    ///
    /// # Errors
    /// Never today; kept for callers that join it as a fallible task.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: CancellationToken,
    ) -> std::io::Result<()> {
        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder.http2().max_concurrent_streams(MAX_STREAMS);
        let graceful = GracefulShutdown::new();
        let router = self.router();
        loop {
            let (stream, peer) = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(error) => {
                        tracing::warn!(%error, "The simulated services cannot accept a connection; trying again in 100 ms.");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
                () = shutdown.cancelled() => break,
            };
            self.services.connections.fetch_add(1, Ordering::Relaxed);
            if let Err(error) = stream.set_nodelay(true) {
                tracing::debug!(%peer, %error, "Cannot set TCP_NODELAY.");
            }
            let router = router.clone();
            let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                router.clone().oneshot(request)
            });
            let connection = graceful.watch(
                builder
                    .serve_connection(TokioIo::new(stream), service)
                    .into_owned(),
            );
            tokio::spawn(Task::H2cServer.monitor().instrument(async move {
                if let Err(error) = connection.await {
                    tracing::debug!(%peer, %error, "A connection to the simulated services ended with an error.");
                }
            }));
        }
        drop(listener);
        graceful.shutdown().await;
        Ok(())
    }

    pub fn stats(&self) -> SimulatorStats {
        self.services.stats()
    }

    /// Replaces one service's behaviour; calls already past their delay are not affected.
    pub fn set_behaviour(&self, service: Step, behaviour: Behaviour) {
        *self
            .services
            .service(service)
            .behaviour
            .write()
            .unwrap_or_else(PoisonError::into_inner) = behaviour;
    }
}

impl fmt::Debug for Simulator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The stores can hold many thousands of resources; counters say what matters.
        f.debug_struct("Simulator")
            .field("stats", &self.stats())
            .field("suspended_owners", &self.services.suspended_owners.len())
            .finish()
    }
}

impl From<&SimulatorSettings> for SimulatorOptions {
    fn from(settings: &SimulatorSettings) -> Self {
        Self {
            behaviour: Behaviour {
                latency: settings.latency_ms.duration(),
                jitter: settings.jitter_ms.duration(),
                error_rate: settings.error_rate,
                ..Behaviour::default()
            },
            suspended_owners: settings.suspended_owners.clone(),
            max_resources: settings.max_resources,
        }
    }
}

/// Serves the simulated services as `settings` describe them on
/// `settings.listen`, with a listen backlog of `listen_backlog`
/// (`gateway.listen_backlog`), until `shutdown` fires.
///
/// # Errors
/// When the address cannot be bound or accepting fails.
pub async fn serve(
    settings: SimulatorSettings,
    listen_backlog: u32,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let listener = skyport_runtime::http::listen(settings.listen, listen_backlog)
        .with_context(|| format!("cannot listen on simulator.listen = {}", settings.listen))?;
    println!(
        "simulated services listening on http://{}",
        listener.local_addr()?
    );
    Simulator::new(SimulatorOptions::from(&settings))
        .serve(listener, shutdown)
        .await
        .context("the simulated services failed")
}
