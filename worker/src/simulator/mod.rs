//! The five simulated backend services (Account, Package, Delivery, Third-party, Drone) behind one
//! axum router; every PUT is idempotent per resource id, so a retried call never creates a second
//! resource and an injected failure never leaves a side effect.

mod routes;
mod store;
#[cfg(test)]
mod tests;

use std::collections::HashSet;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use self::store::Store;

/// One of the simulated backend services; each lives under its own path prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Service {
    Account,
    Package,
    Delivery,
    ThirdParty,
    Drone,
}

impl Service {
    pub const ALL: [Service; 5] = [
        Service::Account,
        Service::Package,
        Service::Delivery,
        Service::ThirdParty,
        Service::Drone,
    ];

    /// First path segment of every route of this service.
    pub fn prefix(self) -> &'static str {
        match self {
            Service::Account => "account",
            Service::Package => "package",
            Service::Delivery => "delivery",
            Service::ThirdParty => "thirdparty",
            Service::Drone => "drone",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// How a service misbehaves: every call first waits `latency + uniform(0..=jitter)`, then fails
/// with 503 with probability `error_rate` (0.0 never, 1.0 always). A fraction `slow_rate` of calls
/// takes `slow_latency` instead. A PUT of a resource whose id is in `rejected_ids` is refused for
/// good (422, code `Rejected`), the way a real service refuses a request it cannot serve.
#[derive(Clone, Debug, Default)]
pub struct Behaviour {
    pub latency: Duration,
    pub jitter: Duration,
    pub error_rate: f64,
    pub slow_rate: f64,
    pub slow_latency: Duration,
    pub rejected_ids: Arc<HashSet<String>>,
}

impl Behaviour {
    fn delay(&self) -> Duration {
        if self.slow_rate > 0.0 && fastrand::f64() < self.slow_rate {
            return self.slow_latency;
        }
        if self.jitter.is_zero() {
            return self.latency;
        }
        let jitter_nanos = u64::try_from(self.jitter.as_nanos()).unwrap_or(u64::MAX);
        self.latency
            .saturating_add(Duration::from_nanos(fastrand::u64(0..=jitter_nanos)))
    }

    fn should_fail(&self) -> bool {
        // `fastrand::f64` is in [0, 1), so a rate of 1.0 always fails and a NaN rate never does.
        self.error_rate > 0.0 && fastrand::f64() < self.error_rate
    }
}

#[derive(Clone, Debug, Default)]
pub struct SimulatorOptions {
    /// Initial behaviour of all five services.
    pub behaviour: Behaviour,
    /// Owners whose account authorizations are refused with 403.
    pub suspended_owners: Vec<String>,
}

/// The simulated services; cloning shares the same state.
#[derive(Clone)]
pub struct Simulator {
    inner: Arc<Inner>,
}

struct Inner {
    services: [ServiceState; 5],
    suspended_owners: HashSet<String>,
    next_drone: AtomicU64,
}

struct ServiceState {
    behaviour: RwLock<Behaviour>,
    counters: Counters,
    store: Store,
}

impl Inner {
    fn service(&self, service: Service) -> &ServiceState {
        &self.services[service.index()]
    }

    fn stats(&self) -> SimulatorStats {
        let snapshot = |service| self.service(service).counters.snapshot();
        SimulatorStats {
            account: snapshot(Service::Account),
            package: snapshot(Service::Package),
            delivery: snapshot(Service::Delivery),
            third_party: snapshot(Service::ThirdParty),
            drone: snapshot(Service::Drone),
        }
    }
}

impl ServiceState {
    fn new(behaviour: Behaviour) -> Self {
        Self {
            behaviour: RwLock::new(behaviour),
            counters: Counters::default(),
            store: Store::new(),
        }
    }

    fn behaviour(&self) -> Behaviour {
        // A poisoned lock still holds a whole `Behaviour`: writers only ever assign it.
        self.behaviour
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Simulator {
    pub fn new(options: SimulatorOptions) -> Self {
        let SimulatorOptions {
            behaviour,
            suspended_owners,
        } = options;
        Self {
            inner: Arc::new(Inner {
                services: std::array::from_fn(|_| ServiceState::new(behaviour.clone())),
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
    pub fn set_behaviour(&self, service: Service, behaviour: Behaviour) {
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

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SimulatorStats {
    pub account: ServiceStats,
    pub package: ServiceStats,
    pub delivery: ServiceStats,
    pub third_party: ServiceStats,
    pub drone: ServiceStats,
}

impl SimulatorStats {
    pub fn get(&self, service: Service) -> &ServiceStats {
        match service {
            Service::Account => &self.account,
            Service::Package => &self.package,
            Service::Delivery => &self.delivery,
            Service::ThirdParty => &self.third_party,
            Service::Drone => &self.drone,
        }
    }
}

/// Side effects observed by one service since start.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceStats {
    /// Every request that reached the service, injected failures included.
    pub calls: u64,
    /// Distinct resources created.
    pub created: u64,
    /// PUTs answered with the already stored resource.
    pub replayed: u64,
    /// PUTs refused with 409 because the id exists with another key and body.
    pub conflicts: u64,
    /// Calls answered 503 because of the error rate.
    pub injected_failures: u64,
    /// DELETEs that removed an existing resource.
    pub deleted: u64,
    /// PUTs refused with 422 because the id is in `rejected_ids`.
    pub rejected: u64,
}

#[derive(Default)]
struct Counters {
    calls: AtomicU64,
    created: AtomicU64,
    replayed: AtomicU64,
    conflicts: AtomicU64,
    injected_failures: AtomicU64,
    deleted: AtomicU64,
    rejected: AtomicU64,
}

impl Counters {
    fn bump(counter: &AtomicU64) {
        // Counters are independent tallies read only for reporting, so no ordering is needed.
        counter.fetch_add(1, Ordering::Relaxed);
    }

    fn snapshot(&self) -> ServiceStats {
        let read = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        ServiceStats {
            calls: read(&self.calls),
            created: read(&self.created),
            replayed: read(&self.replayed),
            conflicts: read(&self.conflicts),
            injected_failures: read(&self.injected_failures),
            deleted: read(&self.deleted),
            rejected: read(&self.rejected),
        }
    }
}
