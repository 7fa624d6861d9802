//! A cancellation: cancel what has not started, flag what is running here
//! (it stops at its next step), undo what was scheduled; all end Cancelled.

use skyport_core::event::CancellationRequested;
use skyport_core::ports::Versioned;
use skyport_core::status::{DeliveryState, StatusDocument, Step, StepOutcome};
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;

use super::compensate::succeeded_latest_first;
use super::engine::Workflow;
use super::outcome::Outcome;
use super::retry::Interrupted;
use super::status::Decision;
use super::steps::{ORDER, UndoTarget};

/// What a cancellation found.
enum Found {
    Done(Outcome),
    Scheduled,
}

impl Workflow {
    pub(super) async fn cancel(
        &self,
        cancel: &CancellationRequested,
        abandon: &CancellationToken,
    ) -> Result<Outcome, Interrupted> {
        let id = &cancel.delivery_id;
        let running_here = self.cancellations.is_running(id);
        let (found, stored) = self
            .status
            .update(id, None, abandon, |current| {
                let Some(document) = current else {
                    // The request, read later, tells its owner, principal and
                    // accept time; until then the listing shows it the canceller's.
                    let mut cancelled = StatusDocument::accepted(id.clone(), cancel.requested_at);
                    cancelled.cancel_requested_at = Some(cancel.requested_at);
                    cancelled.principal.clone_from(&cancel.principal);
                    if running_here {
                        // Running here and not yet marked Processing: it stops at its next step.
                        return Decision::Write(cancelled, Found::Done(Outcome::CancelRequested));
                    }
                    // Not started yet: the request event will find it Cancelled and do nothing.
                    cancelled.state = DeliveryState::Cancelled;
                    return Decision::Write(cancelled, Found::Done(Outcome::Cancelled));
                };
                match document.state {
                    DeliveryState::Failed | DeliveryState::Cancelled => {
                        Decision::Keep(Found::Done(Outcome::AlreadyTerminal))
                    }
                    DeliveryState::Scheduled => Decision::Keep(Found::Scheduled),
                    // Nothing booked yet: cancelled at once, its timer gone with it.
                    DeliveryState::Waiting if !running_here => {
                        let mut cancelled = document.clone();
                        cancelled.state = DeliveryState::Cancelled;
                        cancelled.cancel_requested_at = Some(cancel.requested_at);
                        cancelled.updated_at = OffsetDateTime::now_utc();
                        Decision::Write(cancelled, Found::Done(Outcome::Cancelled))
                    }
                    DeliveryState::Accepted
                    | DeliveryState::Processing
                    | DeliveryState::Waiting => {
                        if document.cancel_requested_at.is_some() {
                            return Decision::Keep(Found::Done(Outcome::CancelRequested));
                        }
                        let mut flagged = document.clone();
                        flagged.cancel_requested_at = Some(cancel.requested_at);
                        flagged.updated_at = OffsetDateTime::now_utc();
                        Decision::Write(flagged, Found::Done(Outcome::CancelRequested))
                    }
                }
            })
            .await?;
        match (found, stored) {
            // A delivery running here stops at its next step; one whose
            // request is read but not yet started stops before its first.
            (Found::Done(outcome @ (Outcome::CancelRequested | Outcome::Cancelled)), _) => {
                self.cancellations.request(id);
                Ok(outcome)
            }
            (Found::Done(outcome), _) => Ok(outcome),
            (Found::Scheduled, Some(current)) => {
                let outcomes = current.document.steps.clone();
                self.undo_and_cancel(
                    current,
                    outcomes,
                    true,
                    cancel.traceparent.as_deref(),
                    abandon,
                )
                .await
            }
            (Found::Scheduled, None) => unreachable!("a Scheduled document was just read"),
        }
    }

    /// Undoes what the delivery left behind and records it Cancelled. `undo_all`:
    /// an earlier attempt may have done steps this one did not see, so every
    /// step that leaves something behind is undone (undoing what is not there
    /// succeeds).
    pub(super) async fn undo_and_cancel(
        &self,
        current: Versioned,
        mut outcomes: Vec<StepOutcome>,
        undo_all: bool,
        traceparent: Option<&str>,
        abandon: &CancellationToken,
    ) -> Result<Outcome, Interrupted> {
        let id = current.document.id.clone();
        let undo: Vec<Step> = if undo_all {
            ORDER.into_iter().rev().map(|step| step.id()).collect()
        } else {
            succeeded_latest_first(&outcomes)
        };
        let package_id = current.document.package_id.clone();
        let target = UndoTarget {
            delivery_id: &id,
            epoch: current.document.epoch,
            package_id: package_id.as_deref(),
        };
        self.compensate(&target, &undo, &mut outcomes, traceparent, abandon)
            .await?;
        let (outcome, _) = self
            .status
            .update(&id, Some(current), abandon, |current| {
                let mut next = match current {
                    Some(document) if !document.state.can_become(DeliveryState::Cancelled) => {
                        return Decision::Keep(Outcome::AlreadyTerminal);
                    }
                    Some(document) => document.clone(),
                    None => StatusDocument::accepted(id.clone(), OffsetDateTime::now_utc()),
                };
                next.state = DeliveryState::Cancelled;
                next.steps.clone_from(&outcomes);
                next.drone_id = None;
                next.updated_at = OffsetDateTime::now_utc();
                Decision::Write(next, Outcome::Cancelled)
            })
            .await?;
        tracing::info!(delivery_id = %id, "Cancelled a delivery.");
        Ok(outcome)
    }
}
