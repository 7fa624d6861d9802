//! A delivery request: mark it Processing, call the steps in
//! [`ORDER`], and record Scheduled or Failed — a permanent failure first
//! undoes the steps that succeeded. A cancellation that reached this worker
//! meanwhile stops it at its next step.

use std::sync::atomic::Ordering;

use skyport_core::event::DeliveryRequested;
use skyport_core::status::{DeliveryState, Failure, StatusDocument, StepOutcome, StepResult};
use skyport_runtime::metrics;
use skyport_runtime::trace_span;
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::compensate::succeeded_latest_first;
use super::engine::Workflow;
use super::outcome::Outcome;
use super::retry::Interrupted;
use super::status::Decision;
use super::steps::{ORDER, Progress};
use crate::resilience::client::StepError;

/// How the final write of a delivery went.
enum Finish {
    Written,
    AlreadyTerminal,
    CancelRequested,
}

impl Workflow {
    pub(super) async fn deliver(
        &self,
        request: &DeliveryRequested,
        abandon: &CancellationToken,
    ) -> Result<Outcome, Interrupted> {
        let id = &request.delivery_id;
        let package_id = &request.request.package_info.package_id;
        let (begun, current) = self
            .status
            .update_likely_new(id, abandon, |current| {
                let mut next = match current {
                    // Cancelled before this request was read: the callback
                    // URL it carries still hears of the cancellation.
                    Some(document)
                        if document.state.is_terminal()
                            && document.callback_url.is_none()
                            && request.request.callback_url.is_some() =>
                    {
                        let mut told = document.clone();
                        told.callback_url.clone_from(&request.request.callback_url);
                        told.traceparent.clone_from(&request.traceparent);
                        return Decision::Write(told, false);
                    }
                    Some(document) if document.state.is_terminal() => return Decision::Keep(false),
                    Some(document) => document.clone(),
                    None => StatusDocument::accepted(id.clone(), request.accepted_at),
                };
                next.state = DeliveryState::Processing;
                next.attempt += 1;
                next.package_id = Some(package_id.clone());
                next.callback_url.clone_from(&request.request.callback_url);
                next.traceparent.clone_from(&request.traceparent);
                next.updated_at = OffsetDateTime::now_utc();
                Decision::Write(next, true)
            })
            .await?;
        let (true, Some(mut current)) = (begun, current) else {
            return Ok(Outcome::AlreadyTerminal);
        };
        let replay = current.document.attempt > 1;
        if replay {
            self.tally.replayed.fetch_add(1, Ordering::Relaxed);
            metrics::global().replays.inc();
        }
        let traceparent = request.traceparent.as_deref();
        let mut progress = Progress::default();
        let mut outcomes = Vec::with_capacity(ORDER.len());
        let mut failure = None;
        for (index, step) in ORDER.into_iter().enumerate() {
            let name = step.id();
            // Before every step but the first (whose document the Processing write just
            // made), a cancellation that reached this worker is read from the document.
            if index > 0 && self.cancellations.is_requested(id) {
                match self.status.current(id, abandon).await? {
                    Some(fresh) if fresh.document.state.is_terminal() => {
                        return Ok(Outcome::AlreadyTerminal);
                    }
                    Some(fresh) => current = fresh,
                    None => {}
                }
            }
            if current.document.cancel_requested_at.is_some() {
                return self
                    .undo_and_cancel(current, outcomes, replay, traceparent, abandon)
                    .await;
            }
            let call = step.request(request, &progress);
            let key = format!("{id}:{}", name.as_str());
            let span = trace_span!(
                "step",
                otel.name = %format_args!("step {}", name.as_str()),
                step = name.as_str(),
            );
            let answer = self
                .client
                .call(name, &call, &key, traceparent, abandon)
                .instrument(span)
                .await;
            let recorded = answer
                .result
                .and_then(|body| step.record(&body, &mut progress));
            let (result, detail) = match recorded {
                Ok(detail) => (StepResult::Succeeded, detail),
                Err(StepError::Abandoned) => return Err(Interrupted::Abandoned),
                Err(StepError::Permanent { code, message }) => {
                    tracing::info!(delivery_id = %id, step = name.as_str(), %code, %message, "A delivery failed.");
                    failure = Some(Failure {
                        step: name,
                        code,
                        message: message.clone(),
                    });
                    (StepResult::Failed, Some(message))
                }
            };
            outcomes.push(StepOutcome {
                step: name,
                result,
                at: OffsetDateTime::now_utc(),
                calls: answer.calls,
                detail,
            });
            if failure.is_some() {
                break;
            }
        }
        if failure.is_some() {
            let undo = succeeded_latest_first(&outcomes);
            self.compensate(
                id,
                Some(package_id),
                &undo,
                &mut outcomes,
                traceparent,
                abandon,
            )
            .await?;
        }
        let state = if failure.is_some() {
            DeliveryState::Failed
        } else {
            DeliveryState::Scheduled
        };
        let (finish, stored) = self
            .status
            .update(id, Some(current), abandon, |current| {
                let mut next = match current {
                    Some(document) if document.state.is_terminal() => {
                        return Decision::Keep(Finish::AlreadyTerminal);
                    }
                    Some(document) if document.cancel_requested_at.is_some() => {
                        return Decision::Keep(Finish::CancelRequested);
                    }
                    Some(document) => document.clone(),
                    None => StatusDocument::accepted(id.clone(), request.accepted_at),
                };
                next.state = state;
                next.steps.clone_from(&outcomes);
                next.drone_id.clone_from(&progress.drone_id);
                next.third_party_required = progress.third_party_required;
                next.failure.clone_from(&failure);
                next.updated_at = OffsetDateTime::now_utc();
                Decision::Write(next, Finish::Written)
            })
            .await?;
        match (finish, stored) {
            (Finish::Written, _) if state == DeliveryState::Scheduled => Ok(Outcome::Scheduled),
            (Finish::Written, _) => Ok(Outcome::Failed),
            (Finish::CancelRequested, Some(current)) => {
                self.undo_and_cancel(current, outcomes, replay, traceparent, abandon)
                    .await
            }
            (Finish::AlreadyTerminal | Finish::CancelRequested, _) => Ok(Outcome::AlreadyTerminal),
        }
    }
}
