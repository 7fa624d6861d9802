//! A reschedule, in its turn after the events of its delivery read before
//! it ([`super::turns`]).
//!
//! One the request's steps ran with is recorded already, and ends here. On a
//! Scheduled delivery the Delivery and Drone bookings are updated, each
//! under an idempotency key of the new revision; when the Drone refuses, the
//! Delivery booking is put back, so the previous booking stands whole. The
//! delivery stays Scheduled at a new revision, and the change, whatever
//! became of it, joins the document's history. A delivery that ended Failed
//! or Cancelled is not changed. A Waiting one books nothing: its request
//! changes and its timer moves ([`super::waiting`]).

use std::borrow::Cow;
use std::time::Duration;

use skyport_core::event::{DeliveryRequested, DeliveryRescheduled};
use skyport_core::ports::Versioned;
use skyport_core::request::DeliveryRequest;
use skyport_core::status::{ChangeOutcome, ChangeRecord, DeliveryState, Step};
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;

use super::engine::Workflow;
use super::outcome::{Handled, Outcome};
use super::retry::Interrupted;
use super::status::Decision;
use super::steps::{self, update_key};
use crate::resilience::client::StepError;

/// How long a reschedule waits for a delivery that another worker still
/// runs (one whose request this worker did not read) to end.
const WAIT_FOR_END: Duration = Duration::from_secs(60);
const LOOK_AGAIN: Duration = Duration::from_millis(250);

/// The bookings a reschedule updates, in order.
const BOOKINGS: [Step; 2] = [Step::Delivery, Step::Drone];

impl Workflow {
    /// `request` with the reschedules of its delivery read so far (and not
    /// yet handled) applied in stream order, and the record of each: Applied,
    /// or Refused when the request it makes breaks a rule.
    pub(super) fn with_pending<'a>(
        &self,
        request: &'a DeliveryRequested,
    ) -> (Cow<'a, DeliveryRequested>, Vec<ChangeRecord>) {
        let pending = self.turns.pending(&request.delivery_id);
        if pending.is_empty() {
            return (Cow::Borrowed(request), Vec::new());
        }
        let mut patched = request.clone();
        let records = pending
            .iter()
            .map(
                |reschedule| match reschedule.changes.apply(&patched.request) {
                    Ok(request) => {
                        patched.request = request;
                        record(reschedule, ChangeOutcome::Applied, None)
                    }
                    Err(errors) => {
                        record(reschedule, ChangeOutcome::Refused, Some(broken(&errors)))
                    }
                },
            )
            .collect();
        (Cow::Owned(patched), records)
    }

    pub(super) async fn reschedule(
        &self,
        reschedule: &DeliveryRescheduled,
        abandon: &CancellationToken,
    ) -> Result<Handled, Interrupted> {
        let id = &reschedule.delivery_id;
        let waiting_since = tokio::time::Instant::now();
        let current = loop {
            let Some(current) = self.status.current(id, abandon).await? else {
                return Ok(Handled::GiveUp(format!(
                    "delivery {id} has no status to reschedule: its request was not processed"
                )));
            };
            if current
                .document
                .changes
                .iter()
                .any(|known| known.change_id == reschedule.change_id)
            {
                return Ok(Handled::Done(Outcome::AlreadyTerminal));
            }
            if current.document.state == DeliveryState::Waiting {
                match self
                    .reschedule_waiting(reschedule, current, abandon)
                    .await?
                {
                    Some(outcome) => return Ok(Handled::Done(outcome)),
                    // Started meanwhile: look again.
                    None => continue,
                }
            }
            if current.document.state.is_terminal() {
                break current;
            }
            if waiting_since.elapsed() >= WAIT_FOR_END {
                return Ok(Handled::GiveUp(format!(
                    "delivery {id} was still {:?} after {WAIT_FOR_END:?}",
                    current.document.state
                )));
            }
            tokio::select! {
                () = abandon.cancelled() => return Err(Interrupted::Abandoned),
                () = tokio::time::sleep(LOOK_AGAIN) => {}
            }
        };
        let state = current.document.state;
        if state != DeliveryState::Scheduled {
            let detail = format!("the delivery had ended {state:?}");
            return self
                .record_outcome(reschedule, current, ChangeOutcome::Refused, detail, abandon)
                .await
                .map(Handled::Done);
        }
        let Some(booked) = current.document.request.clone() else {
            let detail = "the status holds no request to change".to_owned();
            return self
                .record_outcome(reschedule, current, ChangeOutcome::Refused, detail, abandon)
                .await
                .map(Handled::Done);
        };
        let patched = match reschedule.changes.apply(&booked) {
            Ok(patched) => patched,
            Err(errors) => {
                return self
                    .record_outcome(
                        reschedule,
                        current,
                        ChangeOutcome::Refused,
                        broken(&errors),
                        abandon,
                    )
                    .await
                    .map(Handled::Done);
            }
        };
        let revision = current.document.revision + 1;
        let epoch = current.document.epoch;
        let traceparent = reschedule.traceparent.as_deref();
        let mut updated = Vec::new();
        for step in BOOKINGS {
            let key = update_key(id, epoch, step, revision, false);
            match self
                .update_booking(step, id, &patched, &key, traceparent, abandon)
                .await?
            {
                Ok(()) => updated.push(step),
                Err(message) => {
                    // The previous booking stands whole: what was updated goes back.
                    for &done in &updated {
                        let key = update_key(id, epoch, done, revision, true);
                        if let Err(undone) = self
                            .update_booking(done, id, &booked, &key, traceparent, abandon)
                            .await?
                        {
                            tracing::warn!(delivery_id = %id, step = done.as_str(), error = %undone, "Cannot put a booking back after a refused reschedule.");
                        }
                    }
                    let detail = format!("{} refused the update: {message}", step.as_str());
                    return self
                        .record_outcome(reschedule, current, ChangeOutcome::Failed, detail, abandon)
                        .await
                        .map(Handled::Done);
                }
            }
        }
        let (outcome, _) = self
            .status
            .update(id, Some(current), abandon, |now| {
                let Some(document) = now else {
                    return Decision::Keep(Outcome::RescheduleRefused);
                };
                let mut next = document.clone();
                if document.state == DeliveryState::Scheduled && document.epoch == epoch {
                    next.revision += 1;
                    next.request = Some(patched.clone());
                    let mut applied = record(reschedule, ChangeOutcome::Applied, None);
                    applied.revision = Some(next.revision);
                    next.changes.push(applied);
                    next.updated_at = OffsetDateTime::now_utc();
                    Decision::Write(next, Outcome::Rescheduled)
                } else {
                    // Cancelled (or redriven) while the bookings were updated.
                    let detail = format!("the delivery became {:?} meanwhile", document.state);
                    next.changes
                        .push(record(reschedule, ChangeOutcome::Refused, Some(detail)));
                    next.updated_at = OffsetDateTime::now_utc();
                    Decision::Write(next, Outcome::RescheduleRefused)
                }
            })
            .await?;
        if outcome == Outcome::Rescheduled {
            tracing::info!(delivery_id = %id, revision, "Rescheduled a delivery.");
        }
        Ok(Handled::Done(outcome))
    }

    /// Updates `step`'s booking of `id` to `request`'s times and places:
    /// `Err` with the service's reason when it refuses.
    async fn update_booking(
        &self,
        step: Step,
        id: &str,
        request: &DeliveryRequest,
        key: &str,
        traceparent: Option<&str>,
        abandon: &CancellationToken,
    ) -> Result<Result<(), String>, Interrupted> {
        let Some(call) = steps::by_id(step).update(id, request) else {
            return Ok(Ok(()));
        };
        let answer = self
            .client
            .call(step, &call, key, traceparent, abandon)
            .await;
        match answer.result {
            Ok(_) => Ok(Ok(())),
            Err(StepError::Abandoned) => Err(Interrupted::Abandoned),
            Err(StepError::Permanent { code, message }) => Ok(Err(format!("{code}: {message}"))),
        }
    }

    /// Adds the change to the document's history as `outcome`, the
    /// delivery otherwise as it is.
    async fn record_outcome(
        &self,
        reschedule: &DeliveryRescheduled,
        current: Versioned,
        outcome: ChangeOutcome,
        detail: String,
        abandon: &CancellationToken,
    ) -> Result<Outcome, Interrupted> {
        tracing::info!(delivery_id = %reschedule.delivery_id, ?outcome, %detail, "A reschedule was not applied.");
        self.status
            .update(&reschedule.delivery_id, Some(current), abandon, |now| {
                let Some(document) = now else {
                    return Decision::Keep(Outcome::RescheduleRefused);
                };
                if document
                    .changes
                    .iter()
                    .any(|known| known.change_id == reschedule.change_id)
                {
                    return Decision::Keep(Outcome::RescheduleRefused);
                }
                let mut next = document.clone();
                next.changes
                    .push(record(reschedule, outcome, Some(detail.clone())));
                next.updated_at = OffsetDateTime::now_utc();
                Decision::Write(next, Outcome::RescheduleRefused)
            })
            .await
            .map(|(outcome, _)| outcome)
    }
}

/// The history entry of `reschedule`, decided now.
pub(super) fn record(
    reschedule: &DeliveryRescheduled,
    outcome: ChangeOutcome,
    detail: Option<String>,
) -> ChangeRecord {
    ChangeRecord {
        change_id: reschedule.change_id.clone(),
        requested_at: reschedule.requested_at,
        at: OffsetDateTime::now_utc(),
        fields: reschedule.changes.fields(),
        outcome,
        revision: None,
        detail,
        requested_by: reschedule.principal.clone(),
    }
}

/// The rules a patched request breaks, in a sentence.
pub(super) fn broken(errors: &[skyport_core::request::FieldError]) -> String {
    let rules: Vec<String> = errors
        .iter()
        .map(|e| format!("{} {}", e.field, e.message))
        .collect();
    format!(
        "the rescheduled request breaks a rule: {}",
        rules.join("; ")
    )
}
