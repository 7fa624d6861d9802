//! `[change_feed]`: the change-feed processor over the status documents, the
//! one the callback notifier runs on.

use serde::Deserialize;
use skyport_core::ports::StartFrom;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::checks::Checks;
use super::duration::Millis;

/// The change-feed processor (timings as the Cosmos DB SDKs' defaults).
#[derive(Debug, Clone, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields)]
pub struct ChangeFeedSettings {
    /// The deployment unit: instances with the same name share its leases.
    pub processor_name: String,
    /// This instance's name, unique among the processor's instances; empty:
    /// the host name and the process id.
    pub instance_name: String,
    /// Where a range without a checkpoint starts: `beginning`, `now`, or an
    /// RFC 3339 time.
    pub start_from: String,
    /// How long a range that had no changes waits before it is read again.
    pub poll_interval_ms: Millis,
    /// Most changes handed to the handler at once.
    pub max_items: u32,
    /// Batches of one lease handed over at once: one that is slow (its
    /// callbacks retried) does not hold up those behind it; the checkpoint
    /// waits for it.
    pub max_batches_in_flight: usize,
    /// How often the leases are balanced across the live instances.
    pub acquire_interval_ms: Millis,
    /// How often an owned lease is renewed.
    pub renew_interval_ms: Millis,
    /// How long a lease that is not renewed stays its owner's.
    pub expiry_ms: Millis,
    /// Times a batch is handed to a failing handler before each of its
    /// changes is tried alone and the ones that still fail are dead-lettered.
    pub max_attempts: u32,
    /// The wait before a failed batch is handed over again (doubling).
    pub retry_backoff_ms: Millis,
    /// How often the estimator counts the pending changes.
    pub estimate_interval_ms: Millis,
}

impl Default for ChangeFeedSettings {
    fn default() -> Self {
        Self {
            processor_name: "skyport-callbacks".into(),
            instance_name: String::new(),
            start_from: "beginning".into(),
            poll_interval_ms: Millis::new(5_000),
            max_items: 100,
            max_batches_in_flight: 8,
            acquire_interval_ms: Millis::new(13_000),
            renew_interval_ms: Millis::new(17_000),
            expiry_ms: Millis::new(60_000),
            max_attempts: 5,
            retry_backoff_ms: Millis::new(1_000),
            estimate_interval_ms: Millis::new(5_000),
        }
    }
}

impl ChangeFeedSettings {
    /// Where a range without a checkpoint starts; `None` when `start_from`
    /// is none of the three forms (validation names the key).
    pub fn start(&self) -> Option<StartFrom> {
        match self.start_from.trim() {
            "beginning" => Some(StartFrom::Beginning),
            "now" => Some(StartFrom::Now),
            time => OffsetDateTime::parse(time, &Rfc3339)
                .ok()
                .map(StartFrom::Time),
        }
    }

    /// This instance's name: `instance_name`, else `{host}-{pid}` (the host
    /// name from `HOSTNAME`, as Kubernetes sets it to the pod's name).
    pub fn instance(&self) -> String {
        if self.instance_name.trim().is_empty() {
            format!("{}-{}", crate::host::name(), std::process::id())
        } else {
            self.instance_name.clone()
        }
    }

    pub(super) fn validate(&self, checks: &mut Checks<'_>) {
        let name_ok = |name: &str| !name.chars().any(|c| matches!(c, '/' | '\\' | '?' | '#'));
        checks.check(
            !self.processor_name.trim().is_empty() && name_ok(&self.processor_name),
            "processor_name",
            "must be a non-empty name without '/', '\\', '?' or '#'",
        );
        checks.check(
            name_ok(&self.instance_name),
            "instance_name",
            "must not hold '/', '\\', '?' or '#'",
        );
        checks.check(
            self.start().is_some(),
            "start_from",
            "must be \"beginning\", \"now\" or an RFC 3339 time",
        );
        checks.at_least(self.poll_interval_ms.count(), 10, "poll_interval_ms");
        checks.at_least(self.max_items, 1, "max_items");
        checks.at_least(self.max_batches_in_flight, 1, "max_batches_in_flight");
        checks.at_least(self.acquire_interval_ms.count(), 100, "acquire_interval_ms");
        checks.at_least(self.renew_interval_ms.count(), 100, "renew_interval_ms");
        checks.check(
            self.expiry_ms.count() > self.renew_interval_ms.count(),
            "expiry_ms",
            "must be longer than renew_interval_ms, or every lease expires before it is renewed",
        );
        checks.at_least(self.max_attempts, 1, "max_attempts");
        checks.at_least(
            self.estimate_interval_ms.count(),
            100,
            "estimate_interval_ms",
        );
    }
}
