//! A redrive: a delivery request of a later attempt epoch. Before its steps
//! run, its epoch begins on the document — only on a Failed document of an
//! earlier epoch, which keeps how that epoch ended and why this one began —
//! and then it runs as any delivery does, its calls keyed by the epoch. A
//! replay of the redrive finds its epoch begun and goes on as a replay does;
//! an event of an earlier epoch finds it superseded and does nothing.
//!
//! Redrives start at most `worker.redrive_per_s` a second (they also count
//! against `worker.rate_limit_per_s`, as every event does), so that a redrive
//! of a whole outage's failures does not crowd out new deliveries.

use std::sync::Mutex;
use std::time::Duration;

use skyport_core::event::DeliveryRequested;
use skyport_core::status::{DeliveryState, Epoch};
use time::OffsetDateTime;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::engine::Workflow;
use super::retry::Interrupted;
use super::status::Decision;
use crate::metrics::{self, OutcomeLabels};

/// Why a redrive is not run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Begin {
    /// The epoch began now, or had begun (a replay): run it.
    Run,
    /// No document, a later epoch, or a delivery that did not fail.
    Skip(&'static str),
}

impl Workflow {
    /// Begins the epoch `request` runs on its delivery's document, when the
    /// document is Failed in an earlier epoch.
    pub(super) async fn begin_epoch(
        &self,
        request: &DeliveryRequested,
        abandon: &CancellationToken,
    ) -> Result<Begin, Interrupted> {
        tokio::select! {
            () = self.redrives.wait() => {}
            () = abandon.cancelled() => return Err(Interrupted::Abandoned),
        }
        let epoch = request.epoch;
        let (begin, _) = self
            .status
            .update(&request.delivery_id, None, abandon, |current| {
                let Some(document) = current else {
                    return Decision::Keep(Begin::Skip("its delivery has no status document"));
                };
                if document.epoch == epoch {
                    return Decision::Keep(Begin::Run);
                }
                if document.epoch > epoch {
                    return Decision::Keep(Begin::Skip("a later epoch began"));
                }
                if document.state != DeliveryState::Failed {
                    return Decision::Keep(Begin::Skip("its delivery did not fail"));
                }
                let now = OffsetDateTime::now_utc();
                let mut next = document.clone();
                let queued = next.redrive.take();
                let cause = request.redrive.as_ref().or(queued.as_ref());
                next.epochs.push(Epoch {
                    epoch,
                    began_at: now,
                    reason: cause.map_or_else(|| "redrive".to_owned(), |c| c.reason.clone()),
                    requested_by: cause.and_then(|c| c.requested_by.clone()),
                    after: document.failure.clone(),
                });
                next.epoch = epoch;
                next.state = DeliveryState::Processing;
                next.steps.clear();
                next.failure = None;
                next.drone_id = None;
                next.third_party_required = None;
                next.attempt = 0;
                next.updated_at = now;
                Decision::Write(next, Begin::Run)
            })
            .await?;
        let outcome = match begin {
            Begin::Run => "began",
            Begin::Skip(why) => {
                tracing::info!(delivery_id = %request.delivery_id, epoch, why, "Did not run a redrive.");
                "skipped"
            }
        };
        metrics::global()
            .redrives
            .get_or_create(&OutcomeLabels { outcome })
            .inc();
        Ok(begin)
    }
}

/// Spaces redrives `1/rate` apart (a rate of 0: no limit). Cheaper than a
/// slot pool with a refill task: the next start time is all it keeps.
#[derive(Debug)]
pub(super) struct Pacer {
    interval: Duration,
    next: Mutex<Option<Instant>>,
}

impl Pacer {
    pub(super) fn new(per_s: u32) -> Self {
        Self {
            interval: if per_s == 0 {
                Duration::ZERO
            } else {
                Duration::from_secs(1) / per_s
            },
            next: Mutex::new(None),
        }
    }

    /// Waits for this caller's turn.
    pub(super) async fn wait(&self) {
        if self.interval.is_zero() {
            return;
        }
        let at = {
            let mut next = self
                .next
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let now = Instant::now();
            let at = next.map_or(now, |next| next.max(now));
            *next = Some(at + self.interval);
            at
        };
        tokio::time::sleep_until(at).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_pacer_spaces_callers_by_its_rate() {
        let pacer = Pacer::new(10);
        let start = Instant::now();
        for _ in 0..5 {
            pacer.wait().await;
        }
        assert_eq!(start.elapsed(), Duration::from_millis(400));
        let unlimited = Pacer::new(0);
        let start = Instant::now();
        unlimited.wait().await;
        assert_eq!(start.elapsed(), Duration::ZERO);
    }
}
