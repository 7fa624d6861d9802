//! How one processor instance runs: `[change_feed]` resolved. The counts
//! that bound work are at least one (a processor with no batch in flight or
//! no attempt would never move), and a start the configuration does not
//! name is the beginning of the feed.

use std::time::Duration;

use skyport_core::ports::StartFrom;
use skyport_runtime::config::ChangeFeedSettings;

/// How a processor runs: `[change_feed]` resolved.
#[derive(Debug, Clone)]
pub struct ProcessorSettings {
    /// The processor's name: its lease group and its dead letters' key.
    pub processor: String,
    /// This instance's name: the owner written into the leases it holds.
    pub instance: String,
    /// Where a range with no checkpoint yet starts.
    pub start: StartFrom,
    pub poll_interval: Duration,
    pub max_items: u32,
    /// Hand over only documents with this top-level field (the notifier's
    /// `callbackUrl`); the others are passed over, and checkpointed.
    pub only_with_field: Option<String>,
    pub max_batches_in_flight: usize,
    pub acquire_interval: Duration,
    pub renew_interval: Duration,
    pub expiry: Duration,
    pub max_attempts: u32,
    pub retry_backoff: Duration,
    pub estimate_interval: Duration,
}

impl From<&ChangeFeedSettings> for ProcessorSettings {
    fn from(settings: &ChangeFeedSettings) -> Self {
        Self {
            processor: settings.processor_name.clone(),
            instance: settings.instance(),
            start: settings.start().unwrap_or(StartFrom::Beginning),
            poll_interval: settings.poll_interval_ms.duration(),
            max_items: settings.max_items,
            only_with_field: None,
            max_batches_in_flight: settings.max_batches_in_flight.max(1),
            acquire_interval: settings.acquire_interval_ms.duration(),
            renew_interval: settings.renew_interval_ms.duration(),
            expiry: settings.expiry_ms.duration(),
            max_attempts: settings.max_attempts.max(1),
            retry_backoff: settings.retry_backoff_ms.duration(),
            estimate_interval: settings.estimate_interval_ms.duration(),
        }
    }
}
