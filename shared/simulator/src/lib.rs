//! The five simulated backend services (Account, Package, Delivery,
//! Third-party, Drone: one per workflow [`Step`]) behind one axum router; every PUT is idempotent per resource id, so a retried call never creates a second
//! resource and an injected failure never leaves a side effect.

mod routes;
mod state;
mod store;
#[cfg(test)]
mod tests;

use std::fmt;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, PoisonError};

use anyhow::Context;
use skyport_core::status::Step;
use skyport_runtime::config::SimulatorSettings;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use self::state::{Behaviour, ServiceStats, SimulatorOptions, SimulatorStats};
use self::state::{Inner, ServiceState};

/// The simulated services; cloning shares the same state.
#[derive(Clone)]
pub struct Simulator {
    inner: Arc<Inner>,
}

impl Simulator {
    pub fn new(options: SimulatorOptions) -> Self {
        let SimulatorOptions {
            behaviour,
            suspended_owners,
            max_resources,
        } = options;
        Self {
            inner: Arc::new(Inner {
                services: std::array::from_fn(|_| {
                    ServiceState::new(behaviour.clone(), max_resources)
                }),
                suspended_owners: suspended_owners.into_iter().collect(),
                next_drone: AtomicU64::new(1),
            }),
        }
    }

    /// All routes of the five services plus `GET /_sim/stats`.
    pub fn router(&self) -> axum::Router {
        routes::router(Arc::clone(&self.inner))
    }

    /// Serves the router until `shutdown` is cancelled, then drains in-flight requests.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: CancellationToken,
    ) -> std::io::Result<()> {
        axum::serve(listener, self.router())
            .with_graceful_shutdown(shutdown.cancelled_owned())
            .await
    }

    pub fn stats(&self) -> SimulatorStats {
        self.inner.stats()
    }

    /// Replaces one service's behaviour; calls already past their delay are not affected.
    pub fn set_behaviour(&self, service: Step, behaviour: Behaviour) {
        *self
            .inner
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
            .field("suspended_owners", &self.inner.suspended_owners.len())
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
/// `settings.listen` until `shutdown` fires.
///
/// # Errors
/// When the address cannot be bound or accepting fails.
pub async fn serve(settings: SimulatorSettings, shutdown: CancellationToken) -> anyhow::Result<()> {
    let listener = TcpListener::bind(settings.listen)
        .await
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
