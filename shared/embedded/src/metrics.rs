//! The embedded store's Prometheus series: what the retention sweeper
//! removed and how old the oldest entry it keeps is, by kind. Registered in
//! the process's exposition (`skyport_runtime::metrics`) the first time
//! [`global`] is read, every kind at 0.

use std::sync::LazyLock;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use skyport_runtime::metrics;
use time::OffsetDateTime;

use crate::sweep::Swept;
use crate::tables::unix_ms;

/// The store's series, registered once per process.
pub(crate) fn global() -> &'static StoreMetrics {
    static METRICS: LazyLock<StoreMetrics> =
        LazyLock::new(|| StoreMetrics::registered_in(metrics::global()));
    &METRICS
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct KindLabels {
    /// One of [`KINDS`].
    pub(crate) kind: &'static str,
}

/// What retention removes: `status` documents, their `change` records,
/// `dead_letter` events and `callback_dead_letter` changes.
pub(crate) const KINDS: [&str; 4] = ["status", "change", "dead_letter", "callback_dead_letter"];

#[derive(Debug)]
pub(crate) struct StoreMetrics {
    removed: Family<KindLabels, Counter>,
    oldest: Family<KindLabels, Gauge>,
}

impl StoreMetrics {
    pub(crate) fn registered_in(exposition: &metrics::Metrics) -> Self {
        let mut registry = metrics::component();
        let removed: Family<KindLabels, Counter> = Family::default();
        registry.register(
            "retention_removed",
            "Entries the retention sweeper removed, by kind",
            removed.clone(),
        );
        let oldest: Family<KindLabels, Gauge> = Family::default();
        registry.register(
            "retention_oldest_seconds",
            "Age of the oldest entry kept in a retention window, by kind (0 when none), as of the last sweep",
            oldest.clone(),
        );
        exposition.register(registry);
        for kind in KINDS {
            removed.get_or_create_owned(&KindLabels { kind });
        }
        for kind in ["status", "dead_letter", "callback_dead_letter"] {
            oldest.get_or_create_owned(&KindLabels { kind });
        }
        Self { removed, oldest }
    }

    /// Counts what a sweep at `now` removed and sets the ages it left.
    pub(crate) fn record(&self, swept: &Swept, now: OffsetDateTime) {
        let removed = [
            ("status", swept.statuses),
            ("change", swept.statuses),
            ("dead_letter", swept.dead_letters),
            ("callback_dead_letter", swept.change_dead_letters),
        ];
        for (kind, count) in removed {
            self.removed
                .get_or_create(&KindLabels { kind })
                .inc_by(u64::try_from(count).unwrap_or(u64::MAX));
        }
        let now_ms = unix_ms(now);
        let oldest = [
            ("status", swept.oldest_status_ms),
            ("dead_letter", swept.oldest_dead_letter_ms),
            ("callback_dead_letter", swept.oldest_change_dead_letter_ms),
        ];
        for (kind, at) in oldest {
            let age_s = at.map_or(0, |at| now_ms.saturating_sub(at).max(0) / 1000);
            self.oldest.get_or_create(&KindLabels { kind }).set(age_s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sweep_is_counted_by_kind_and_sets_the_oldest_age() {
        let exposition = metrics::Metrics::new();
        let store = StoreMetrics::registered_in(&exposition);
        let text = exposition.render();
        for kind in KINDS {
            assert!(
                text.contains(&format!(
                    "skyport_retention_removed_total{{kind=\"{kind}\"}} 0"
                )),
                "{kind} in {text}"
            );
        }
        let now = OffsetDateTime::now_utc();
        store.record(
            &Swept {
                statuses: 3,
                dead_letters: 1,
                oldest_status_ms: Some(unix_ms(now) - 90_000),
                ..Swept::default()
            },
            now,
        );
        let text = exposition.render();
        assert!(
            text.contains("skyport_retention_removed_total{kind=\"change\"} 3"),
            "{text}"
        );
        assert!(
            text.contains("skyport_retention_oldest_seconds{kind=\"status\"} 90"),
            "{text}"
        );
    }
}
