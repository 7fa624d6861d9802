//! `[simulator]`: the simulated backend services (in the all-in-one process,
//! or alone in `skyport-simulator`).

use std::net::SocketAddr;

use serde::Deserialize;

use super::checks::Checks;
use super::duration::Millis;

/// The simulated backend services.
#[derive(Debug, Clone, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields)]
pub struct SimulatorSettings {
    /// Where they listen (port 0 in the all-in-one process: any free port).
    pub listen: SocketAddr,
    /// Fixed latency of every call.
    pub latency_ms: Millis,
    /// Extra latency drawn uniformly from 0 to this.
    pub jitter_ms: Millis,
    /// Fraction of calls (0 to 1) answered 503.
    pub error_rate: f64,
    /// Owners whose accounts are suspended.
    pub suspended_owners: Vec<String>,
    /// How many of its most recent resources each service remembers for
    /// replays (at least half of them); older ones are forgotten, so that
    /// memory stays bounded however long the services run.
    pub max_resources: usize,
}

impl Default for SimulatorSettings {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            latency_ms: Millis::new(10),
            jitter_ms: Millis::new(10),
            error_rate: 0.0,
            suspended_owners: Vec::new(),
            // About a kilobyte each (the delivery's answer holds its
            // request): 50 MB for the five, and seconds of retries at
            // thousands of deliveries a second.
            max_resources: 10_000,
        }
    }
}

impl SimulatorSettings {
    pub(super) fn validate(&self, checks: &mut Checks<'_>) {
        checks.check(
            (0.0..=1.0).contains(&self.error_rate),
            "error_rate",
            "must be from 0 to 1",
        );
        checks.at_least(self.max_resources, 1, "max_resources");
    }
}
