//! `[store]`: which backend keeps the status, and for how long.

use serde::Deserialize;

use super::checks::Checks;
use super::duration::Seconds;

/// Which store holds status documents and dead letters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum StoreBackend {
    Embedded,
    Cosmos,
}

#[derive(Debug, Clone, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields)]
pub struct StoreSettings {
    /// Unset: the profile's (embedded → embedded, azure → cosmos, kafka → embedded).
    pub backend: Option<StoreBackend>,
    /// How long a settled delivery (terminal, its callback delivered or given
    /// up on) is kept after its last write; at least
    /// `gateway.idempotency_retention_s`.
    pub status_retention_s: Seconds,
    /// How long a dead letter (an event or a callback) is kept.
    pub dead_letter_retention_s: Seconds,
}

/// Seven days, as the reference implementation kept deliveries.
const STATUS_RETENTION_S: u64 = 7 * 24 * 60 * 60;
const DEAD_LETTER_RETENTION_S: u64 = 30 * 24 * 60 * 60;
/// The longest retention either kind may have: ten years.
const MAX_RETENTION_S: u64 = 10 * 365 * 24 * 60 * 60;

impl Default for StoreSettings {
    fn default() -> Self {
        Self {
            backend: None,
            status_retention_s: Seconds::new(STATUS_RETENTION_S),
            dead_letter_retention_s: Seconds::new(DEAD_LETTER_RETENTION_S),
        }
    }
}

impl StoreSettings {
    /// Checks the retention windows; the status one may not be shorter than
    /// the idempotency one, or a retried POST would find its reservation and
    /// no status, and publish the delivery again.
    pub(super) fn validate(&self, checks: &mut Checks<'_>, idempotency_retention_s: Seconds) {
        checks.check(
            (1..=MAX_RETENTION_S).contains(&self.status_retention_s.count()),
            "status_retention_s",
            "must be from 1 to 315360000 (ten years)",
        );
        checks.check(
            self.status_retention_s >= idempotency_retention_s,
            "status_retention_s",
            format!(
                "must be at least gateway.idempotency_retention_s ({} s): a retried request must \
                 find the delivery it made",
                idempotency_retention_s.count()
            ),
        );
        checks.check(
            (1..=MAX_RETENTION_S).contains(&self.dead_letter_retention_s.count()),
            "dead_letter_retention_s",
            "must be from 1 to 315360000 (ten years)",
        );
    }
}
