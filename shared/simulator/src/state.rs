//! What the simulated services hold: each service's behaviour, the resources
//! it created and the counters of what happened to it.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use skyport_core::status::Step;
use skyport_runtime::config::SimulatorSettings;

use crate::store::Store;

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
    pub(crate) fn delay(&self) -> Duration {
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

    pub(crate) fn should_fail(&self) -> bool {
        // `fastrand::f64` is in [0, 1), so a rate of 1.0 always fails and a NaN rate never does.
        self.error_rate > 0.0 && fastrand::f64() < self.error_rate
    }
}

#[derive(Clone, Debug)]
pub struct SimulatorOptions {
    /// Initial behaviour of all five services.
    pub behaviour: Behaviour,
    /// Owners whose account authorizations are refused with 403.
    pub suspended_owners: Vec<String>,
    /// How many of its most recent resources each service remembers (at
    /// least half of them, at most all): a PUT of a forgotten id creates it again.
    pub max_resources: usize,
}

impl Default for SimulatorOptions {
    fn default() -> Self {
        Self {
            behaviour: Behaviour::default(),
            suspended_owners: Vec::new(),
            max_resources: SimulatorSettings::default().max_resources,
        }
    }
}

pub(crate) struct Services {
    pub(crate) services: [ServiceState; Step::ALL.len()],
    pub(crate) suspended_owners: HashSet<String>,
    pub(crate) next_drone: AtomicU64,
    /// Connections accepted since start.
    pub(crate) connections: AtomicU64,
}

pub(crate) struct ServiceState {
    pub(crate) behaviour: RwLock<Behaviour>,
    pub(crate) counters: ServiceCounters,
    pub(crate) store: Store,
}

impl Services {
    pub(crate) fn service(&self, service: Step) -> &ServiceState {
        &self.services[service as usize]
    }

    pub(crate) fn stats(&self) -> SimulatorStats {
        let snapshot = |service| self.service(service).counters.snapshot();
        SimulatorStats {
            account: snapshot(Step::Account),
            package: snapshot(Step::Package),
            delivery: snapshot(Step::Delivery),
            third_party: snapshot(Step::ThirdParty),
            drone: snapshot(Step::Drone),
            connections: self.connections.load(Ordering::Relaxed),
        }
    }
}

impl ServiceState {
    pub(crate) fn new(behaviour: Behaviour, max_resources: usize) -> Self {
        Self {
            behaviour: RwLock::new(behaviour),
            counters: ServiceCounters::default(),
            store: Store::new(max_resources),
        }
    }

    pub(crate) fn behaviour(&self) -> Behaviour {
        // A poisoned lock still holds a whole `Behaviour`: writers only ever assign it.
        self.behaviour
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
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
    /// Connections accepted since start (HTTP/2 callers share one).
    pub connections: u64,
}

impl SimulatorStats {
    pub fn get(&self, service: Step) -> &ServiceStats {
        match service {
            Step::Account => &self.account,
            Step::Package => &self.package,
            Step::Delivery => &self.delivery,
            Step::ThirdParty => &self.third_party,
            Step::Drone => &self.drone,
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
    /// PUTs and PATCHes refused with 422 because the id is in `rejected_ids`.
    pub rejected: u64,
    /// PATCHes (reschedules) applied, once per idempotency key.
    #[serde(default)]
    pub updated: u64,
}

#[derive(Default)]
pub(crate) struct ServiceCounters {
    pub(crate) calls: AtomicU64,
    pub(crate) created: AtomicU64,
    pub(crate) replayed: AtomicU64,
    pub(crate) conflicts: AtomicU64,
    pub(crate) injected_failures: AtomicU64,
    pub(crate) deleted: AtomicU64,
    pub(crate) rejected: AtomicU64,
    pub(crate) updated: AtomicU64,
}

impl ServiceCounters {
    pub(crate) fn bump(counter: &AtomicU64) {
        // Counters are independent tallies read only for reporting, so no ordering is needed.
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> ServiceStats {
        let read = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        ServiceStats {
            calls: read(&self.calls),
            created: read(&self.created),
            replayed: read(&self.replayed),
            conflicts: read(&self.conflicts),
            injected_failures: read(&self.injected_failures),
            deleted: read(&self.deleted),
            rejected: read(&self.rejected),
            updated: read(&self.updated),
        }
    }
}
