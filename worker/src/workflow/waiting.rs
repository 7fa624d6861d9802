//! Deliveries that book close to their time (`worker.booking_lead_s`): a
//! request whose pickup is further away than the lead is recorded Waiting
//! with `runsAt`, its pickup less the lead, and books nothing. The status
//! store keeps its timer with the document; when it is due, a `DeliveryDue`
//! comes through the stream ([`crate::timers`]) and the delivery runs if it
//! is still Waiting at the timer's revision. A reschedule of a Waiting
//! delivery moves its `runsAt` and books nothing; a cancellation just
//! records it Cancelled.

use skyport_core::event::{DeliveryDue, DeliveryRequested, DeliveryRescheduled};
use skyport_core::ports::{Lane, Versioned};
use skyport_core::status::{ChangeOutcome, ChangeRecord, DeliveryState, StatusDocument};
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;

use super::engine::Workflow;
use super::outcome::Outcome;
use super::retry::Interrupted;
use super::status::Decision;

impl Workflow {
    /// When `request`'s steps are to run, if that is later than now: its
    /// pickup less the booking lead. A redrive (a later epoch) runs at once.
    pub(super) fn runs_at(&self, request: &DeliveryRequested) -> Option<OffsetDateTime> {
        let lead = self.booking_lead?;
        let runs_at = request.request.pickup_time - lead;
        (request.epoch == 0 && runs_at > OffsetDateTime::now_utc()).then_some(runs_at)
    }

    /// Records `request` Waiting until `runs_at`, with the reschedules
    /// `merged` applied, unless its document has gone further (a replay).
    pub(super) async fn wait(
        &self,
        request: &DeliveryRequested,
        merged: &[ChangeRecord],
        lane: Lane,
        runs_at: OffsetDateTime,
        abandon: &CancellationToken,
    ) -> Result<Outcome, Interrupted> {
        let id = &request.delivery_id;
        let (outcome, _) = self
            .status
            .update_likely_new(id, abandon, |current| {
                let mut next = match current {
                    None => StatusDocument::accepted(id.clone(), request.accepted_at),
                    Some(document)
                        if document.state == DeliveryState::Accepted
                            && document.cancel_requested_at.is_none() =>
                    {
                        document.clone()
                    }
                    // Waiting already (a replay), started by its timer, or ended.
                    Some(document) if document.state.is_terminal() => {
                        return Decision::Keep(Outcome::AlreadyTerminal);
                    }
                    Some(document) if document.state == DeliveryState::Waiting => {
                        return Decision::Keep(Outcome::Waiting);
                    }
                    Some(_) => return Decision::Keep(Outcome::NotDue),
                };
                Self::describe(&mut next, request, lane);
                Self::record_changes(&mut next, merged);
                next.state = DeliveryState::Waiting;
                next.runs_at = Some(runs_at);
                next.updated_at = OffsetDateTime::now_utc();
                Decision::Write(next, Outcome::Waiting)
            })
            .await?;
        if outcome == Outcome::Waiting {
            tracing::debug!(delivery_id = %id, %runs_at, "A delivery waits for its time to book.");
        }
        Ok(outcome)
    }

    /// A Waiting delivery's timer fired: runs its steps if it is still
    /// Waiting at the timer's revision, marking it Processing first (which
    /// removes its timer).
    pub(super) async fn due(
        &self,
        due: &DeliveryDue,
        abandon: &CancellationToken,
    ) -> Result<Outcome, Interrupted> {
        let id = &due.delivery_id;
        let (started, written) = self
            .status
            .update(id, None, abandon, |current| match current {
                Some(document)
                    if document.state == DeliveryState::Waiting
                        && document.revision == due.revision
                        && document.request.is_some() =>
                {
                    let mut next = document.clone();
                    next.state = DeliveryState::Processing;
                    next.attempt += 1;
                    next.updated_at = OffsetDateTime::now_utc();
                    Decision::Write(next, true)
                }
                _ => Decision::Keep(false),
            })
            .await?;
        let (true, Some(written)) = (started, written) else {
            return Ok(Outcome::NotDue);
        };
        let document = &written.document;
        let Some(request) = document.request.clone() else {
            return Ok(Outcome::NotDue);
        };
        let request = DeliveryRequested {
            delivery_id: id.clone(),
            accepted_at: document.created_at,
            traceparent: document.traceparent.clone(),
            idempotency_key: None,
            principal: document.principal.clone(),
            epoch: document.epoch,
            redrive: None,
            request,
        };
        let lane = document.lane;
        self.deliver(&request, &[], lane, Some(written), abandon)
            .await
    }

    /// Applies `reschedule` to the Waiting delivery `current`: its request
    /// changes and its `runsAt` moves (to now, when the new pickup is within
    /// the lead or the lead is off); nothing is booked. `None` when the delivery is no longer
    /// Waiting (its timer started it meanwhile): the caller looks again.
    pub(super) async fn reschedule_waiting(
        &self,
        reschedule: &DeliveryRescheduled,
        current: Versioned,
        abandon: &CancellationToken,
    ) -> Result<Option<Outcome>, Interrupted> {
        // With the lead turned off since, the delivery books at once.
        let lead = self.booking_lead;
        let (outcome, _) = self
            .status
            .update(&reschedule.delivery_id, Some(current), abandon, |now| {
                let Some(document) = now.filter(|d| d.state == DeliveryState::Waiting) else {
                    return Decision::Keep(None);
                };
                let mut next = document.clone();
                let applied = document
                    .request
                    .as_ref()
                    .map(|request| reschedule.changes.apply(request));
                match applied {
                    Some(Ok(patched)) => {
                        let at = OffsetDateTime::now_utc();
                        let runs_at = lead.map_or(at, |lead| patched.pickup_time - lead);
                        next.runs_at = Some(runs_at.max(at));
                        next.request = Some(patched);
                        next.revision += 1;
                        let mut record =
                            super::reschedule::record(reschedule, ChangeOutcome::Applied, None);
                        record.revision = Some(next.revision);
                        next.changes.push(record);
                        next.updated_at = at;
                        Decision::Write(next, Some(Outcome::Rescheduled))
                    }
                    Some(Err(errors)) => {
                        next.changes.push(super::reschedule::record(
                            reschedule,
                            ChangeOutcome::Refused,
                            Some(super::reschedule::broken(&errors)),
                        ));
                        next.updated_at = OffsetDateTime::now_utc();
                        Decision::Write(next, Some(Outcome::RescheduleRefused))
                    }
                    None => Decision::Keep(Some(Outcome::RescheduleRefused)),
                }
            })
            .await?;
        Ok(outcome)
    }
}
