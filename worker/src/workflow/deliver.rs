//! A delivery request: call the steps in [`ORDER`] and record Scheduled or
//! Failed — a permanent failure first undoes the steps that succeeded. A
//! cancellation that reached this worker meanwhile stops it at its next step.
//!
//! A delivery is marked Processing once it has run for
//! `worker.processing_after_ms` (with 0, before its first step); one that
//! ends sooner is written once, with its terminal status. Its final write is
//! conditional on the document it last saw (or on there being none), so a
//! cancellation or an earlier attempt recorded meanwhile is found there: a
//! terminal state another attempt recorded stands, and what this attempt did
//! is undone unless that state is Scheduled (the same calls, made again under
//! the same idempotency keys, found the same resources).

use std::sync::atomic::Ordering;

use crate::metrics::{self, LaneLabels};
use skyport_core::event::DeliveryRequested;
use skyport_core::ports::{Lane, Versioned};
use skyport_core::status::{
    ChangeOutcome, ChangeRecord, DeliveryState, Failure, StatusDocument, StepOutcome, StepResult,
};
use skyport_runtime::trace_span;
use time::OffsetDateTime;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::compensate::succeeded_latest_first;
use super::engine::Workflow;
use super::outcome::Outcome;
use super::ownership::conflict;
use super::retry::Interrupted;
use super::status::Decision;
use super::steps::{ORDER, Progress, UndoTarget, call_key};
use crate::resilience::client::{Answer, StepError};

/// How the final write of a delivery went.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Finish {
    Written,
    AlreadyTerminal,
    CancelRequested,
    /// Another principal made the delivery meanwhile: nothing is written.
    Foreign,
}

/// A delivery whose steps are over, as its final write left it: what it
/// asked, where it ran, how it ended and what its steps did.
struct Ended<'a> {
    request: &'a DeliveryRequested,
    lane: Lane,
    state: DeliveryState,
    counted: bool,
    outcomes: Vec<StepOutcome>,
    traceparent: Option<&'a str>,
}

/// The document as this attempt last wrote or read it, and whether this
/// attempt is counted in its `attempt`.
#[derive(Default)]
struct Seen {
    current: Option<Versioned>,
    counted: bool,
}

impl Workflow {
    /// Runs `request`, which carries the reschedules `merged` records (read
    /// before it started: see [`Workflow::with_pending`]); `started`: the
    /// document this attempt has marked Processing already (a Waiting
    /// delivery whose time came).
    pub(super) async fn deliver(
        &self,
        request: &DeliveryRequested,
        merged: &[ChangeRecord],
        lane: Lane,
        started: Option<Versioned>,
        abandon: &CancellationToken,
    ) -> Result<Outcome, Interrupted> {
        let id = &request.delivery_id;
        let traceparent = request.traceparent.as_deref();
        let (mut seen, mut processing_due) =
            self.start(request, merged, lane, started, abandon).await?;
        let mut progress = Progress::default();
        let mut outcomes = Vec::with_capacity(ORDER.len());
        let mut failure = None;
        for step in ORDER {
            let name = step.id();
            // A cancellation that reached this worker is read from the document.
            if self.cancellations.is_requested(id)
                && let Some(fresh) = self.status.current(id, abandon).await?
            {
                seen.current = Some(fresh);
            }
            if let Some(current) = &seen.current {
                if current.document.state.is_terminal() {
                    return self
                        .found_terminal(request, current.clone(), outcomes, abandon)
                        .await;
                }
                if current.document.cancel_requested_at.is_some() {
                    return self
                        .undo_and_cancel(
                            Self::described(current.clone(), request, lane),
                            outcomes,
                            Self::is_replay(&current.document, seen.counted),
                            traceparent,
                            abandon,
                        )
                        .await;
                }
            }
            let call = step.request(request, &progress);
            let key = call_key(id, request.epoch, name, false);
            let span = trace_span!(
                "step",
                otel.name = %format_args!("step {}", name.as_str()),
                step = name.as_str(),
            );
            let answer = self.client.call(name, &call, &key, traceparent, abandon);
            tokio::pin!(answer);
            let answer: Answer = loop {
                let Some(due) = processing_due else {
                    break answer.as_mut().instrument(span.clone()).await;
                };
                tokio::select! {
                    answer = answer.as_mut().instrument(span.clone()) => break answer,
                    () = tokio::time::sleep_until(due) => {
                        processing_due = None;
                        seen = self.mark_processing(request, merged, lane, abandon).await?;
                    }
                }
            };
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
        let state = self
            .outcome_of_steps(request, failure.is_some(), &mut outcomes, abandon)
            .await?;
        let counted = seen.counted;
        let mut replayed = false;
        let decide = |current: Option<&StatusDocument>| {
            let mut next = match current {
                Some(document) if conflict(document, request).is_some() => {
                    return Decision::Keep(Finish::Foreign);
                }
                Some(document)
                    if document.state.is_terminal() || document.epoch != request.epoch =>
                {
                    return Decision::Keep(Finish::AlreadyTerminal);
                }
                Some(document) if document.cancel_requested_at.is_some() => {
                    return Decision::Keep(Finish::CancelRequested);
                }
                Some(document) => document.clone(),
                None => StatusDocument::accepted(id.clone(), request.accepted_at),
            };
            if !counted {
                next.attempt += 1;
                replayed = next.attempt > 1;
                Self::describe(&mut next, request, lane);
            }
            Self::record_changes(&mut next, merged);
            next.state = state;
            next.steps.clone_from(&outcomes);
            next.drone_id.clone_from(&progress.drone_id);
            next.third_party_required = progress.third_party_required;
            next.failure.clone_from(&failure);
            next.updated_at = OffsetDateTime::now_utc();
            Decision::Write(next, Finish::Written)
        };
        let (finish, stored) = match seen.current {
            Some(current) => {
                self.status
                    .update(id, Some(current), abandon, decide)
                    .await?
            }
            None => self.status.update_likely_new(id, abandon, decide).await?,
        };
        if replayed {
            self.count_replay();
        }
        let ended = Ended {
            request,
            lane,
            state,
            counted,
            outcomes,
            traceparent,
        };
        self.after_final_write(finish, stored, ended, abandon).await
    }

    /// How an attempt starts: marked Processing already (`started`), now
    /// (with `worker.processing_after_ms` 0), or once it has run that long
    /// (the instant returned).
    async fn start(
        &self,
        request: &DeliveryRequested,
        merged: &[ChangeRecord],
        lane: Lane,
        started: Option<Versioned>,
        abandon: &CancellationToken,
    ) -> Result<(Seen, Option<Instant>), Interrupted> {
        if let Some(started) = started {
            let seen = Seen {
                current: Some(started),
                counted: true,
            };
            return Ok((seen, None));
        }
        if self.processing_after.is_zero() {
            let seen = self.mark_processing(request, merged, lane, abandon).await?;
            return Ok((seen, None));
        }
        Ok((
            Seen::default(),
            Some(Instant::now() + self.processing_after),
        ))
    }

    /// The state the steps leave a delivery in: Scheduled, or Failed once
    /// the steps that succeeded before the one that `failed` are undone.
    async fn outcome_of_steps(
        &self,
        request: &DeliveryRequested,
        failed: bool,
        outcomes: &mut Vec<StepOutcome>,
        abandon: &CancellationToken,
    ) -> Result<DeliveryState, Interrupted> {
        if !failed {
            return Ok(DeliveryState::Scheduled);
        }
        let undo = succeeded_latest_first(outcomes);
        let target = UndoTarget {
            delivery_id: &request.delivery_id,
            epoch: request.epoch,
            package_id: Some(&request.request.package_info.package_id),
        };
        let traceparent = request.traceparent.as_deref();
        self.compensate(&target, &undo, outcomes, traceparent, abandon)
            .await?;
        Ok(DeliveryState::Failed)
    }

    /// What became of a delivery once its final write was made (or found
    /// made): counted, cancelled, or told what the document already says.
    async fn after_final_write(
        &self,
        finish: Finish,
        stored: Option<Versioned>,
        ended: Ended<'_>,
        abandon: &CancellationToken,
    ) -> Result<Outcome, Interrupted> {
        let Ended {
            request,
            lane,
            state,
            counted,
            outcomes,
            traceparent,
        } = ended;
        let id = &request.delivery_id;
        if finish == Finish::Written {
            let waited = OffsetDateTime::now_utc() - request.accepted_at;
            metrics::global()
                .time_to_terminal
                .get_or_create(&LaneLabels {
                    lane: lane.as_str(),
                })
                .observe(waited.as_seconds_f64().max(0.0));
        }
        match (finish, stored) {
            (Finish::Foreign, _) => {
                // Its steps ran under the owner's keys, so undoing them would
                // undo the owner's bookings: left as they are.
                tracing::error!(delivery_id = %id, principal = ?request.principal, "Another principal made this delivery while a request naming its id ran; nothing was written or undone. It needs a person.");
                Ok(Outcome::AlreadyTerminal)
            }
            (Finish::Written, _) if state == DeliveryState::Scheduled => Ok(Outcome::Scheduled),
            (Finish::Written, _) => Ok(Outcome::Failed),
            (Finish::CancelRequested, Some(current)) => {
                let replay = Self::is_replay(&current.document, counted);
                let current = Self::described(current, request, lane);
                self.undo_and_cancel(current, outcomes, replay, traceparent, abandon)
                    .await
            }
            (Finish::AlreadyTerminal, Some(current)) => {
                self.found_terminal(request, current, outcomes, abandon)
                    .await
            }
            (Finish::AlreadyTerminal | Finish::CancelRequested, None) => {
                Ok(Outcome::AlreadyTerminal)
            }
        }
    }

    /// Marks the delivery Processing, counting this attempt, unless its
    /// document is terminal already (then it is left as it is).
    async fn mark_processing(
        &self,
        request: &DeliveryRequested,
        merged: &[ChangeRecord],
        lane: Lane,
        abandon: &CancellationToken,
    ) -> Result<Seen, Interrupted> {
        let (counted, current) = self
            .status
            .update_likely_new(&request.delivery_id, abandon, |current| {
                let mut next = match current {
                    Some(document)
                        if document.state.is_terminal()
                            || document.epoch != request.epoch
                            || conflict(document, request).is_some() =>
                    {
                        return Decision::Keep(false);
                    }
                    Some(document) => document.clone(),
                    None => {
                        StatusDocument::accepted(request.delivery_id.clone(), request.accepted_at)
                    }
                };
                next.state = DeliveryState::Processing;
                next.attempt += 1;
                Self::describe(&mut next, request, lane);
                Self::record_changes(&mut next, merged);
                next.updated_at = OffsetDateTime::now_utc();
                Decision::Write(next, true)
            })
            .await?;
        if counted && current.as_ref().is_some_and(|c| c.document.attempt > 1) {
            self.count_replay();
        }
        Ok(Seen { current, counted })
    }

    /// What the request tells the document: its package, callback, trace and
    /// lane, and the request itself unless reschedules changed the document's.
    pub(super) fn describe(document: &mut StatusDocument, request: &DeliveryRequested, lane: Lane) {
        document.lane = lane;
        document.package_id = Some(request.request.package_info.package_id.clone());
        document
            .callback_url
            .clone_from(&request.request.callback_url);
        document.traceparent.clone_from(&request.traceparent);
        document.owner_id = Some(request.request.owner_id.clone());
        document.principal.clone_from(&request.principal);
        if document.changes.is_empty() {
            document.request = Some(request.request.clone());
        }
    }

    /// Records the reschedules the steps ran with (`merged`) that the
    /// document lacks, each applied one a revision.
    pub(super) fn record_changes(document: &mut StatusDocument, merged: &[ChangeRecord]) {
        for record in merged {
            if document
                .changes
                .iter()
                .any(|known| known.change_id == record.change_id)
            {
                continue;
            }
            let mut record = record.clone();
            if record.outcome == ChangeOutcome::Applied {
                document.revision += 1;
                record.revision = Some(document.revision);
            }
            document.changes.push(record);
        }
    }

    /// `current` with what the request tells it, for a document this
    /// attempt has not written (a cancellation's): compensation finds the
    /// package there.
    fn described(mut current: Versioned, request: &DeliveryRequested, lane: Lane) -> Versioned {
        if current.document.package_id.is_none() {
            Self::describe(&mut current.document, request, lane);
        }
        current
    }

    /// Whether an earlier attempt may have done steps this one did not see:
    /// the document counts attempts before this one (`counted`: this one is
    /// among those it counts).
    fn is_replay(document: &StatusDocument, counted: bool) -> bool {
        document.attempt > u32::from(counted)
    }

    fn count_replay(&self) {
        self.tally.replayed.fetch_add(1, Ordering::Relaxed);
        metrics::global().replays.inc();
    }

    /// Whether the request tells a terminal document something it lacks: a
    /// callback URL, or (on a document a cancellation made before the
    /// request was read) its owner and when it was accepted.
    fn tells_more(document: &StatusDocument, request: &DeliveryRequested) -> bool {
        (document.callback_url.is_none() && request.request.callback_url.is_some())
            || document.owner_id.is_none()
    }

    /// The document was found terminal (recorded by another attempt or a
    /// cancellation): it stands. What this attempt did is undone unless it
    /// is Scheduled, and what the request tells a document that lacks it
    /// (a callback URL, so the callback still announces the state; the
    /// owner and accept time) is recorded.
    async fn found_terminal(
        &self,
        request: &DeliveryRequested,
        current: Versioned,
        mut outcomes: Vec<StepOutcome>,
        abandon: &CancellationToken,
    ) -> Result<Outcome, Interrupted> {
        let id = &request.delivery_id;
        // A Scheduled state stands on the calls this attempt made again under
        // the same keys, unless it is another epoch's.
        if current.document.state != DeliveryState::Scheduled
            || current.document.epoch != request.epoch
        {
            let undo = succeeded_latest_first(&outcomes);
            if !undo.is_empty() {
                tracing::info!(delivery_id = %id, state = ?current.document.state, "Undoing the steps of an attempt whose delivery ended meanwhile.");
                let target = UndoTarget {
                    delivery_id: id,
                    epoch: request.epoch,
                    package_id: Some(&request.request.package_info.package_id),
                };
                self.compensate(
                    &target,
                    &undo,
                    &mut outcomes,
                    request.traceparent.as_deref(),
                    abandon,
                )
                .await?;
            }
        }
        if Self::tells_more(&current.document, request) {
            self.status
                .update(id, Some(current), abandon, |current| match current {
                    Some(document)
                        if document.state.is_terminal()
                            && Self::tells_more(document, request)
                            && conflict(document, request).is_none() =>
                    {
                        let mut told = document.clone();
                        if told.callback_url.is_none() {
                            told.callback_url.clone_from(&request.request.callback_url);
                            told.traceparent.clone_from(&request.traceparent);
                        }
                        if told.owner_id.is_none() {
                            // Made by a cancellation that came first, at its time.
                            told.created_at = request.accepted_at;
                            told.owner_id = Some(request.request.owner_id.clone());
                            // Whoever cancelled first, the request says who made it.
                            told.principal.clone_from(&request.principal);
                        }
                        Decision::Write(told, ())
                    }
                    _ => Decision::Keep(()),
                })
                .await?;
        }
        Ok(Outcome::AlreadyTerminal)
    }
}
