//! The estimator: how many changes each live lease of a processor has not
//! handled yet, counted from the source's sequence numbers after the lease's
//! checkpoint. It reads the leases and the feed only, so it works whether or
//! not the processor runs, on any instance.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde::Serialize;
use skyport_core::error::BoxError;
use skyport_core::ports::{ChangeSource, LeaseStore, StartFrom};
use skyport_runtime::metrics::{self, LeaseLabels};
use tokio_util::sync::CancellationToken;

use super::lease::Leases;
use super::processor::ProcessorReport;

/// One lease's pending changes, as the estimator counted them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LeaseEstimate {
    pub lease: String,
    pub owner: Option<String>,
    pub pending: u64,
}

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

    /// Estimates every `interval` until `shutdown`: into the lag gauge (a
    /// lease that is gone loses its series) and `report`.
    pub(super) async fn run_every(
        &self,
        interval: Duration,
        processor: &str,
        report: &Mutex<ProcessorReport>,
        shutdown: CancellationToken,
    ) {
        let mut known: Vec<String> = Vec::new();
        loop {
            match self.estimate().await {
                Ok(estimates) => {
                    let lag = &metrics::global().change_feed_lag;
                    for name in &known {
                        if !estimates.iter().any(|e| e.lease == *name) {
                            lag.remove(&LeaseLabels {
                                lease: name.clone(),
                            });
                        }
                    }
                    for estimate in &estimates {
                        lag.get_or_create(&LeaseLabels {
                            lease: estimate.lease.clone(),
                        })
                        .set(i64::try_from(estimate.pending).unwrap_or(i64::MAX));
                    }
                    known = estimates.iter().map(|e| e.lease.clone()).collect();
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
