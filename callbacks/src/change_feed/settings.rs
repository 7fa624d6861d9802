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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use skyport_core::ports::StartFrom;
    use skyport_runtime::config::{ChangeFeedSettings, Millis};
    use time::macros::datetime;

    use super::ProcessorSettings;

    #[test]
    fn the_defaults_resolve_to_the_sdks_timings() {
        let settings = ProcessorSettings::from(&ChangeFeedSettings {
            instance_name: "pod-0".into(),
            ..ChangeFeedSettings::default()
        });
        assert_eq!(settings.processor, "skyport-callbacks");
        assert_eq!(settings.instance, "pod-0");
        assert_eq!(settings.start, StartFrom::Beginning);
        assert_eq!(settings.poll_interval, Duration::from_secs(5));
        assert_eq!(settings.max_items, 100);
        assert_eq!(settings.only_with_field, None);
        assert_eq!(settings.max_batches_in_flight, 8);
        assert_eq!(settings.acquire_interval, Duration::from_secs(13));
        assert_eq!(settings.renew_interval, Duration::from_secs(17));
        assert_eq!(settings.expiry, Duration::from_secs(60));
        assert_eq!(settings.max_attempts, 5);
        assert_eq!(settings.retry_backoff, Duration::from_secs(1));
        assert_eq!(settings.estimate_interval, Duration::from_secs(5));
    }

    #[test]
    fn counts_of_zero_become_one_so_that_a_lease_still_moves() {
        let settings = ProcessorSettings::from(&ChangeFeedSettings {
            max_batches_in_flight: 0,
            max_attempts: 0,
            ..ChangeFeedSettings::default()
        });
        assert_eq!(settings.max_batches_in_flight, 1);
        assert_eq!(settings.max_attempts, 1);
    }

    #[test]
    fn the_start_is_read_from_its_three_forms_else_the_beginning() {
        let start = |text: &str| {
            ProcessorSettings::from(&ChangeFeedSettings {
                start_from: text.into(),
                ..ChangeFeedSettings::default()
            })
            .start
        };
        assert_eq!(start("beginning"), StartFrom::Beginning);
        assert_eq!(start("now"), StartFrom::Now);
        assert_eq!(
            start("2026-01-02T03:04:05Z"),
            StartFrom::Time(datetime!(2026-01-02 03:04:05 UTC))
        );
        assert_eq!(start("yesterday"), StartFrom::Beginning);
    }

    #[test]
    fn millisecond_settings_become_durations() {
        let settings = ProcessorSettings::from(&ChangeFeedSettings {
            poll_interval_ms: Millis::new(250),
            expiry_ms: Millis::new(1_500),
            ..ChangeFeedSettings::default()
        });
        assert_eq!(settings.poll_interval, Duration::from_millis(250));
        assert_eq!(settings.expiry, Duration::from_millis(1_500));
    }

    #[test]
    fn an_unnamed_instance_is_named_after_the_host_and_the_process() {
        let settings = ProcessorSettings::from(&ChangeFeedSettings::default());
        assert!(
            settings
                .instance
                .ends_with(&format!("-{}", std::process::id())),
            "{}",
            settings.instance
        );
    }
}
