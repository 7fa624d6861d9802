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

use skyport_core::event::DeliveryRequested;
use skyport_core::status::{DeliveryState, Epoch};
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;

use super::engine::Workflow;
use super::outcome::Begin;
use super::retry::Interrupted;
use super::status::Decision;
use crate::metrics::{self, OutcomeLabels};

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
