//! The estimator: how many changes each live lease of a processor has not
//! handled yet, counted from the source's sequence numbers after the lease's
//! checkpoint. It reads the leases and the feed only, so it works whether or
//! not the processor runs, on any instance.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::metrics::{self, LeaseLabels};
use skyport_core::error::BoxError;
use skyport_core::ports::{ChangeSource, LeaseStore, StartFrom};
use tokio_util::sync::CancellationToken;

use super::lease::Leases;
use super::report::{LeaseEstimate, ProcessorReport};

/// Counts the pending changes of a processor's leases; works whether or not
/// the processor runs.
#[derive(Debug, Clone)]
pub struct Estimator {
    source: Arc<dyn ChangeSource>,
    leases: Leases,
    start: StartFrom,
}

impl Estimator {
    /// An estimator of the leases of `processor` in `leases`, over `source`
    /// read from `start` where a lease has no checkpoint.
    pub fn new(
        source: Arc<dyn ChangeSource>,
        leases: Arc<dyn LeaseStore>,
        processor: &str,
        start: StartFrom,
    ) -> Self {
        Self::over(
            source,
            Leases {
                store: leases,
                group: processor.to_owned(),
            },
            start,
        )
    }

    pub(super) fn over(source: Arc<dyn ChangeSource>, leases: Leases, start: StartFrom) -> Self {
        Self {
            source,
            leases,
            start,
        }
    }

    /// The pending changes of every live lease.
    ///
    /// # Errors
    /// When the leases or the feed cannot be read.
    pub async fn estimate(&self) -> Result<Vec<LeaseEstimate>, BoxError> {
        let mut estimates = Vec::new();
        for stored in self.leases.list().await? {
            if stored.doc.retired {
                continue;
            }
            let pending = self
                .source
                .pending(
                    &stored.doc.range(),
                    stored.doc.continuation.as_deref(),
                    self.start,
                )
                .await?;
            estimates.push(LeaseEstimate {
                lease: stored.doc.name(),
                owner: stored.doc.owner.clone(),
                pending,
            });
        }
        Ok(estimates)
    }

    /// Estimates every `interval` until `shutdown`: every live lease into
    /// `report`, and the leases `instance` owns into the lag gauge (a lease
    /// it no longer owns loses its series), so that the gauge summed over
    /// a fleet counts each lease once. A lease between owners is counted by
    /// none until one takes it (within the acquire interval).
    pub(super) async fn run_every(
        &self,
        interval: Duration,
        (processor, instance): (&str, &str),
        report: &Mutex<ProcessorReport>,
        shutdown: CancellationToken,
    ) {
        let mut known: Vec<String> = Vec::new();
        loop {
            match self.estimate().await {
                Ok(estimates) => {
                    let lag = &metrics::global().change_feed_lag;
                    let owned: Vec<&LeaseEstimate> = estimates
                        .iter()
                        .filter(|e| e.owner.as_deref() == Some(instance))
                        .collect();
                    for name in &known {
                        if !owned.iter().any(|e| e.lease == *name) {
                            lag.remove(&LeaseLabels {
                                lease: name.clone(),
                                processor: processor.to_owned(),
                            });
                        }
                    }
                    for estimate in &owned {
                        lag.get_or_create(&LeaseLabels {
                            lease: estimate.lease.clone(),
                            processor: processor.to_owned(),
                        })
                        .set(i64::try_from(estimate.pending).unwrap_or(i64::MAX));
                    }
                    known = owned.iter().map(|e| e.lease.clone()).collect();
                    let mut report = report.lock().unwrap_or_else(PoisonError::into_inner);
                    report.pending = estimates.iter().map(|e| e.pending).sum();
                    report.leases = estimates;
                }
                Err(e) => {
                    tracing::warn!(processor = %processor, error = %e, "The change-feed estimator could not count.");
                }
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(interval) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::Mutex;
    use std::time::Duration;

    use skyport_core::ports::{FeedRange, StartFrom};
    use tokio_util::sync::CancellationToken;

    use super::Estimator;
    use crate::change_feed::fixture::{Fixture, PROCESSOR, eventually};
    use crate::change_feed::lease::LeaseDoc;
    use crate::change_feed::{LeaseEstimate, ProcessorReport};

    fn estimator(fixture: &Fixture, start: StartFrom) -> Estimator {
        Estimator::new(fixture.source(), fixture.lease_store(), PROCESSOR, start)
    }

    #[tokio::test]
    async fn a_lease_without_a_checkpoint_has_every_change_pending() {
        let fixture = Fixture::open();
        for id in ["a", "b", "c"] {
            fixture.write(id).await;
        }
        fixture.acquired("pod-0").await;
        assert_eq!(
            estimator(&fixture, StartFrom::Beginning)
                .estimate()
                .await
                .unwrap(),
            [LeaseEstimate {
                lease: "range.-FF".into(),
                owner: Some("pod-0".into()),
                pending: 3,
            }]
        );
    }

    #[tokio::test]
    async fn only_the_changes_after_the_checkpoint_are_pending() {
        let fixture = Fixture::open();
        for id in ["a", "b", "c", "d", "e"] {
            fixture.write(id).await;
        }
        let acquired = fixture.acquired("pod-0").await;
        let mut doc = acquired.doc.clone();
        doc.continuation = Some(fixture.after(3).await);
        fixture
            .leases()
            .replace(&doc, &acquired.etag)
            .await
            .unwrap();
        let estimates = estimator(&fixture, StartFrom::Beginning)
            .estimate()
            .await
            .unwrap();
        assert_eq!(estimates[0].pending, 2);
        fixture.write("f").await;
        let estimates = estimator(&fixture, StartFrom::Beginning)
            .estimate()
            .await
            .unwrap();
        assert_eq!(estimates[0].pending, 3);
    }

    #[tokio::test]
    async fn a_processor_that_starts_now_has_nothing_pending_before_its_first_checkpoint() {
        let fixture = Fixture::open();
        fixture.write("a").await;
        fixture.acquired("pod-0").await;
        let estimates = estimator(&fixture, StartFrom::Now)
            .estimate()
            .await
            .unwrap();
        assert_eq!(estimates[0].pending, 0);
    }

    #[tokio::test]
    async fn retired_leases_are_not_counted_and_no_lease_is_no_estimate() {
        let fixture = Fixture::open();
        fixture.write("a").await;
        assert!(
            estimator(&fixture, StartFrom::Beginning)
                .estimate()
                .await
                .unwrap()
                .is_empty()
        );
        fixture
            .leases()
            .create(&LeaseDoc {
                retired: true,
                ..LeaseDoc::new(&FeedRange::full())
            })
            .await
            .unwrap();
        assert!(
            estimator(&fixture, StartFrom::Beginning)
                .estimate()
                .await
                .unwrap()
                .is_empty()
        );
    }

    #[tokio::test]
    async fn the_periodic_estimate_fills_the_report_until_shutdown() {
        let fixture = Fixture::open();
        for id in ["a", "b"] {
            fixture.write(id).await;
        }
        fixture.acquired("pod-0").await;
        let estimator = estimator(&fixture, StartFrom::Beginning);
        let report = Mutex::new(ProcessorReport::default());
        let shutdown = CancellationToken::new();
        let running = estimator.run_every(
            Duration::from_millis(10),
            (PROCESSOR, "pod-0"),
            &report,
            shutdown.clone(),
        );
        let watching = async {
            eventually("the report holds the estimate", || async {
                let report = report.lock().unwrap().clone();
                (report.pending == 2 && report.leases.len() == 1).then_some(())
            })
            .await;
            shutdown.cancel();
        };
        tokio::join!(running, watching);
        assert_eq!(report.lock().unwrap().leases[0].lease, "range.-FF");
    }

    /// The lag gauge of `lease` of `processor`, when it has a series.
    fn lag(processor: &str, lease: &str) -> Option<i64> {
        crate::metrics::global()
            .change_feed_lag
            .get(&crate::metrics::LeaseLabels {
                lease: lease.to_owned(),
                processor: processor.to_owned(),
            })
            .map(|gauge| gauge.get())
    }

    #[tokio::test]
    async fn only_the_owner_of_a_lease_exports_its_lag() {
        const OWNED_ELSEWHERE: &str = "estimator-test-owned-elsewhere";
        let fixture = Fixture::open();
        for id in ["a", "b"] {
            fixture.write(id).await;
        }
        fixture.acquired("pod-0").await;
        let estimator = estimator(&fixture, StartFrom::Beginning);
        for (processor, instance, exported) in [
            (OWNED_ELSEWHERE, "pod-1", None),
            ("estimator-test-owned-here", "pod-0", Some(2)),
        ] {
            let report = Mutex::new(ProcessorReport::default());
            let shutdown = CancellationToken::new();
            let running = estimator.run_every(
                Duration::from_millis(10),
                (processor, instance),
                &report,
                shutdown.clone(),
            );
            let watching = async {
                eventually("the report holds the lease", || async {
                    (report.lock().unwrap().pending == 2).then_some(())
                })
                .await;
                shutdown.cancel();
            };
            tokio::join!(running, watching);
            assert_eq!(lag(processor, "range.-FF"), exported, "{instance}");
        }
    }
}
