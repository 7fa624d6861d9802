//! The callbacks' Prometheus series: the change-feed processor's leases,
//! lag and handler errors (labelled by processor, `change_feed.processor_name`,
//! which names its lease group), and the notifier's POSTs. Registered in the process's exposition
//! (`skyport_runtime::metrics`) the first time [`global`] is read; the
//! callback outcomes start at 0, and a processor's series when it is made.

use std::sync::LazyLock;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use skyport_runtime::metrics::{self, latency};

/// The callbacks' series, registered once per process.
pub fn global() -> &'static CallbackMetrics {
    static METRICS: LazyLock<CallbackMetrics> =
        LazyLock::new(|| CallbackMetrics::registered_in(metrics::global()));
    &METRICS
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LeaseLabels {
    /// A change-feed processor's lease: `range.{min}-{max}` of its feed range.
    pub lease: String,
    /// The processor's name (`change_feed.processor_name`).
    pub processor: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProcessorLabels {
    /// The processor's name (`change_feed.processor_name`).
    pub processor: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallbackLabels {
    /// One of [`CALLBACK_OUTCOMES`].
    pub outcome: &'static str,
}

/// How a callback POST can end: `delivered`, `retried` (an attempt that will
/// be tried again), `refused` (a permanent answer or a refused destination)
/// or `dead_lettered`.
pub const CALLBACK_OUTCOMES: [&str; 4] = ["delivered", "retried", "refused", "dead_lettered"];

/// Every series of the callbacks.
#[derive(Debug)]
pub struct CallbackMetrics {
    pub change_feed_lag: Family<LeaseLabels, Gauge>,
    pub change_feed_leases: Family<ProcessorLabels, Gauge>,
    pub change_feed_handler_errors: Family<ProcessorLabels, Counter>,
    pub callbacks: Family<CallbackLabels, Counter>,
    pub callback_duration: Histogram,
}

impl CallbackMetrics {
    /// The series of processor `processor` that exist from its start, at 0.
    pub fn start_processor(&self, processor: &str) {
        let labels = ProcessorLabels {
            processor: processor.to_owned(),
        };
        self.change_feed_leases.get_or_create(&labels).set(0);
        self.change_feed_handler_errors.get_or_create_owned(&labels);
    }

    /// The callbacks' series, registered in `exposition`, the outcomes at 0.
    pub fn registered_in(exposition: &metrics::Metrics) -> Self {
        let mut registry = metrics::component();
        let change_feed_lag = Family::default();
        registry.register(
            "change_feed_lag_events",
            "Changes of a change-feed lease not handled yet (the estimator's count, from the store's sequence numbers)",
            change_feed_lag.clone(),
        );
        let change_feed_leases = Family::default();
        registry.register(
            "change_feed_leases_owned",
            "Change-feed leases this instance owns now",
            change_feed_leases.clone(),
        );
        let change_feed_handler_errors = Family::default();
        registry.register(
            "change_feed_handler_errors",
            "Batches of changes a handler failed on (each handed over again from the last checkpoint)",
            change_feed_handler_errors.clone(),
        );
        let callbacks: Family<CallbackLabels, Counter> = Family::default();
        registry.register("callbacks", "Callback POSTs, by outcome", callbacks.clone());
        let callback_duration = latency();
        registry.register(
            "callback_duration_seconds",
            "Time one callback POST took, to its answer or its error",
            callback_duration.clone(),
        );
        exposition.register(registry);
        for outcome in CALLBACK_OUTCOMES {
            callbacks.get_or_create_owned(&CallbackLabels { outcome });
        }
        Self {
            change_feed_lag,
            change_feed_leases,
            change_feed_handler_errors,
            callbacks,
            callback_duration,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_callbacks_series_are_exposed_with_every_outcome_at_zero() {
        let exposition = metrics::Metrics::new();
        let callbacks = CallbackMetrics::registered_in(&exposition);
        callbacks.start_processor("skyport-other");
        callbacks
            .change_feed_leases
            .get_or_create(&ProcessorLabels {
                processor: "skyport-callbacks".into(),
            })
            .set(2);
        let text = exposition.render();
        for outcome in CALLBACK_OUTCOMES {
            assert!(
                text.contains(&format!(
                    "skyport_callbacks_total{{outcome=\"{outcome}\"}} 0"
                )),
                "{outcome} in {text}"
            );
        }
        for series in [
            "skyport_change_feed_leases_owned{processor=\"skyport-callbacks\"} 2",
            "skyport_change_feed_leases_owned{processor=\"skyport-other\"} 0",
            "skyport_change_feed_handler_errors_total{processor=\"skyport-other\"} 0",
        ] {
            assert!(text.contains(series), "{series} in {text}");
        }
        assert!(
            text.contains("# TYPE skyport_callback_duration_seconds histogram"),
            "{text}"
        );
    }
}
