//! The workflow run for every event. A delivery request: mark Processing,
//! call the five services in [`steps::ORDER`], record Scheduled or Failed (a
//! permanent failure first undoes the steps that succeeded). A cancellation:
//! cancel what has not started, flag what is running (it stops at its next
//! step), undo what was scheduled; all end Cancelled.
//!
//! Invariant: an event counts as completed only once its status write (or its
//! dead letter) is durable. Replays are safe: each call is keyed by the
//! delivery id (PUT by id, `Idempotency-Key: {deliveryId}:{step}`), and an
//! event whose delivery is already terminal does nothing.

pub mod backoff;
pub mod breaker;
pub mod client;
pub mod status;
pub mod steps;

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use skyport_shared::event::{CancellationRequested, DeliveryRequested, Event};
use skyport_shared::metrics::{self, OutcomeLabels};
use skyport_shared::ports::{DeadLetter, DeadLetterStore, StreamEvent, Versioned};
use skyport_shared::status::{
    DeliveryState, Failure, StatusDocument, Step, StepOutcome, StepResult,
};
use skyport_shared::{telemetry, trace_span};
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use self::backoff::Backoff;
use self::client::{ServiceClient, StepError};
use self::status::{Abandoned, Decision, StatusWriter};
use self::steps::Progress;
use crate::rate_limit::RateLimiter;

/// What became of one event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Scheduled,
    Failed,
    Cancelled,
    /// A running delivery was flagged; it cancels itself at its next step.
    CancelRequested,
    /// A replay of a delivery whose terminal state was already recorded.
    AlreadyTerminal,
    DeadLettered,
    /// Given up at shutdown before completing; it will be read again.
    Abandoned,
}

impl Outcome {
    /// Whether the event is done with, so that the checkpoint may pass it.
    pub fn is_completed(self) -> bool {
        !matches!(self, Self::Abandoned)
    }
}

/// What the workflow has done since the process started.
#[derive(Debug, Default)]
pub struct Counters {
    pub scheduled: AtomicU64,
    pub failed: AtomicU64,
    pub cancelled: AtomicU64,
    pub cancel_requested: AtomicU64,
    /// Events of deliveries that an earlier attempt had already started or finished.
    pub replayed: AtomicU64,
    pub dead_lettered: AtomicU64,
    pub abandoned: AtomicU64,
}

impl std::fmt::Display for Counters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        write!(
            f,
            "scheduled={} failed={} cancelled={} cancel_requested={} replayed={} dead_lettered={} abandoned={}",
            get(&self.scheduled),
            get(&self.failed),
            get(&self.cancelled),
            get(&self.cancel_requested),
            get(&self.replayed),
            get(&self.dead_lettered),
            get(&self.abandoned)
        )
    }
}

/// Deliveries a cancellation event flagged while they were running here.
///
/// A cancellation travels on its delivery's partition, so the worker running
/// the delivery reads it too: the delivery looks here before each step instead
/// of re-reading its document. A cancellation handled elsewhere (after a
/// rebalance) is still caught, by the conditional final write.
#[derive(Debug, Default)]
struct Cancellations(Mutex<HashSet<String>>);

impl Cancellations {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn request(&self, id: &str) {
        self.lock().insert(id.to_owned());
    }

    fn is_requested(&self, id: &str) -> bool {
        self.lock().contains(id)
    }

    fn forget(&self, id: &str) {
        self.lock().remove(id);
    }
}

/// How the final write of a delivery went.
enum Finish {
    Written,
    AlreadyTerminal,
    CancelRequested,
}

/// The span of one event's workflow: a consumer span continuing the trace of
/// the request that produced it.
fn event_span(
    kind: &'static str,
    delivery_id: &str,
    event: &StreamEvent,
    traceparent: Option<&str>,
) -> tracing::Span {
    let span = trace_span!(
        "event",
        otel.name = %format_args!("process {kind}"),
        otel.kind = "consumer",
        delivery_id,
        partition = event.partition,
        offset = event.offset,
    );
    telemetry::continue_trace(&span, traceparent);
    span
}

/// What a cancellation found.
enum Found {
    Done(Outcome),
    Scheduled,
}

#[derive(Debug)]
pub struct Workflow {
    client: ServiceClient,
    status: StatusWriter,
    dead_letters: Arc<dyn DeadLetterStore>,
    backoff: Backoff,
    limiter: Option<RateLimiter>,
    cancellations: Cancellations,
    counters: Arc<Counters>,
}

impl Workflow {
    pub fn new(
        client: ServiceClient,
        status: StatusWriter,
        dead_letters: Arc<dyn DeadLetterStore>,
        backoff: Backoff,
        limiter: Option<RateLimiter>,
    ) -> Self {
        Self {
            client,
            status,
            dead_letters,
            backoff,
            limiter,
            cancellations: Cancellations::default(),
            counters: Arc::default(),
        }
    }

    pub fn counters(&self) -> Arc<Counters> {
        Arc::clone(&self.counters)
    }

    /// Runs the workflow for `event`; `abandon` gives it up (only at shutdown).
    /// An event still waiting for a rate-limit slot when `stop` fires gives
    /// up at once: it has done nothing yet and will be read again.
    pub async fn process(
        &self,
        event: &StreamEvent,
        stop: &CancellationToken,
        abandon: &CancellationToken,
    ) -> Outcome {
        let outcome = match &self.limiter {
            Some(limiter) => tokio::select! {
                () = stop.cancelled() => Outcome::Abandoned,
                () = abandon.cancelled() => Outcome::Abandoned,
                () = limiter.acquire() => self.run(event, abandon).await,
            },
            None => self.run(event, abandon).await,
        };
        let (counter, label) = match outcome {
            Outcome::Scheduled => (&self.counters.scheduled, "scheduled"),
            Outcome::Failed => (&self.counters.failed, "failed"),
            Outcome::Cancelled => (&self.counters.cancelled, "cancelled"),
            Outcome::CancelRequested => (&self.counters.cancel_requested, "cancel_requested"),
            Outcome::AlreadyTerminal => (&self.counters.replayed, "already_terminal"),
            Outcome::DeadLettered => (&self.counters.dead_lettered, "dead_lettered"),
            Outcome::Abandoned => (&self.counters.abandoned, "abandoned"),
        };
        counter.fetch_add(1, Ordering::Relaxed);
        metrics::global()
            .workflow_events
            .get_or_create(&OutcomeLabels { outcome: label })
            .inc();
        outcome
    }

    async fn run(&self, event: &StreamEvent, abandon: &CancellationToken) -> Outcome {
        let result = match Event::decode(&event.payload) {
            Ok(Event::DeliveryRequested(request)) => {
                let span = event_span(
                    "DeliveryRequested",
                    &request.delivery_id,
                    event,
                    request.traceparent.as_deref(),
                );
                let outcome = self.deliver(&request, abandon).instrument(span).await;
                self.cancellations.forget(&request.delivery_id);
                outcome
            }
            Ok(Event::CancellationRequested(cancel)) => {
                let span = event_span(
                    "CancellationRequested",
                    &cancel.delivery_id,
                    event,
                    cancel.traceparent.as_deref(),
                );
                self.cancel(&cancel, abandon).instrument(span).await
            }
            Err(e) => return self.dead_letter(event, e.to_string(), abandon).await,
        };
        result.unwrap_or(Outcome::Abandoned)
    }

    async fn deliver(
        &self,
        request: &DeliveryRequested,
        abandon: &CancellationToken,
    ) -> Result<Outcome, Abandoned> {
        let id = &request.delivery_id;
        let package_id = &request.request.package_info.package_id;
        let (begun, current) = self
            .status
            .update_likely_new(id, abandon, |current| {
                let mut next = match current {
                    Some(document) if document.state.is_terminal() => return Decision::Keep(false),
                    Some(document) => document.clone(),
                    None => StatusDocument::accepted(id.clone(), request.accepted_at),
                };
                next.state = DeliveryState::Processing;
                next.attempt += 1;
                next.package_id = Some(package_id.clone());
                next.updated_at = OffsetDateTime::now_utc();
                Decision::Write(next, true)
            })
            .await?;
        let (true, Some(mut current)) = (begun, current) else {
            return Ok(Outcome::AlreadyTerminal);
        };
        let replay = current.document.attempt > 1;
        if replay {
            self.counters.replayed.fetch_add(1, Ordering::Relaxed);
            metrics::global().replays.inc();
        }
        let traceparent = request.traceparent.as_deref();
        let mut progress = Progress::default();
        let mut outcomes = Vec::with_capacity(steps::ORDER.len());
        let mut failure = None;
        for (index, step) in steps::ORDER.into_iter().enumerate() {
            // Before every step but the first (whose document `start` just wrote), a
            // cancellation that reached this worker is read from the document.
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
            let call = steps::call(step, request, &progress);
            let key = format!("{id}:{}", step.as_str());
            let span = trace_span!(
                "step",
                otel.name = %format_args!("step {}", step.as_str()),
                step = step.as_str(),
            );
            let answer = self
                .client
                .call(step, &call, &key, traceparent, abandon)
                .instrument(span)
                .await;
            let recorded = answer
                .result
                .and_then(|body| steps::record(step, &body, &mut progress));
            let (result, detail) = match recorded {
                Ok(detail) => (StepResult::Succeeded, detail),
                Err(StepError::Abandoned) => return Err(Abandoned),
                Err(StepError::Permanent { code, message }) => {
                    tracing::info!(delivery_id = %id, step = step.as_str(), %code, %message, "A delivery failed.");
                    failure = Some(Failure {
                        step,
                        code,
                        message: message.clone(),
                    });
                    (StepResult::Failed, Some(message))
                }
            };
            outcomes.push(StepOutcome {
                step,
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

    async fn cancel(
        &self,
        cancel: &CancellationRequested,
        abandon: &CancellationToken,
    ) -> Result<Outcome, Abandoned> {
        let id = &cancel.delivery_id;
        let (found, stored) = self
            .status
            .update(id, None, abandon, |current| {
                let Some(document) = current else {
                    // Not started yet: the request event will find it Cancelled and do nothing.
                    let mut cancelled = StatusDocument::accepted(id.clone(), cancel.requested_at);
                    cancelled.state = DeliveryState::Cancelled;
                    cancelled.cancel_requested_at = Some(cancel.requested_at);
                    return Decision::Write(cancelled, Found::Done(Outcome::Cancelled));
                };
                match document.state {
                    DeliveryState::Failed | DeliveryState::Cancelled => {
                        Decision::Keep(Found::Done(Outcome::AlreadyTerminal))
                    }
                    DeliveryState::Scheduled => Decision::Keep(Found::Scheduled),
                    DeliveryState::Accepted | DeliveryState::Processing => {
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
            (Found::Done(Outcome::CancelRequested), _) => {
                self.cancellations.request(id);
                Ok(Outcome::CancelRequested)
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
    /// undoable step is undone (undoing what is not there succeeds).
    async fn undo_and_cancel(
        &self,
        current: Versioned,
        mut outcomes: Vec<StepOutcome>,
        undo_all: bool,
        traceparent: Option<&str>,
        abandon: &CancellationToken,
    ) -> Result<Outcome, Abandoned> {
        let id = current.document.id.clone();
        let undo: Vec<Step> = if undo_all {
            steps::ORDER
                .into_iter()
                .rev()
                .filter(|s| steps::is_undoable(*s))
                .collect()
        } else {
            succeeded_latest_first(&outcomes)
        };
        let package_id = current.document.package_id.clone();
        self.compensate(
            &id,
            package_id.as_deref(),
            &undo,
            &mut outcomes,
            traceparent,
            abandon,
        )
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

    /// Undoes `undo` in the order given and marks each step Compensated in
    /// `outcomes`. A compensation the service refuses is logged and noted on
    /// the step; it does not stop the others.
    async fn compensate(
        &self,
        delivery_id: &str,
        package_id: Option<&str>,
        undo: &[Step],
        outcomes: &mut Vec<StepOutcome>,
        traceparent: Option<&str>,
        abandon: &CancellationToken,
    ) -> Result<(), Abandoned> {
        for &step in undo {
            let Some(call) = steps::undo(step, delivery_id, package_id) else {
                continue;
            };
            let key = format!("{delivery_id}:{}:undo", step.as_str());
            let span = trace_span!(
                "undo",
                otel.name = %format_args!("undo {}", step.as_str()),
                step = step.as_str(),
            );
            let answer = self
                .client
                .call(step, &call, &key, traceparent, abandon)
                .instrument(span)
                .await;
            let index = outcomes
                .iter()
                .position(|o| o.step == step)
                .unwrap_or_else(|| {
                    outcomes.push(StepOutcome {
                        step,
                        result: StepResult::Succeeded,
                        at: OffsetDateTime::now_utc(),
                        calls: 0,
                        detail: None,
                    });
                    outcomes.len() - 1
                });
            let outcome = &mut outcomes[index];
            outcome.calls += answer.calls;
            outcome.at = OffsetDateTime::now_utc();
            match answer.result {
                Ok(_) => outcome.result = StepResult::Compensated,
                Err(StepError::Abandoned) => return Err(Abandoned),
                Err(StepError::Permanent { code, message }) => {
                    tracing::error!(%delivery_id, step = step.as_str(), %code, %message, "Could not undo a step; it needs a person.");
                    outcome.detail = Some(format!("compensation failed: {code}: {message}"));
                }
            }
        }
        Ok(())
    }

    async fn dead_letter(
        &self,
        event: &StreamEvent,
        reason: String,
        abandon: &CancellationToken,
    ) -> Outcome {
        tracing::warn!(partition = event.partition, offset = event.offset, %reason, "Dead-lettered an event that cannot be processed.");
        let letter = DeadLetter {
            partition: event.partition,
            offset: event.offset,
            reason,
            payload: event.payload.clone(),
            at: OffsetDateTime::now_utc(),
        };
        let mut failures = 0;
        loop {
            match self.dead_letters.put(letter.clone()).await {
                Ok(()) => return Outcome::DeadLettered,
                Err(e) => {
                    tracing::warn!(error = %e, "Could not store a dead letter; retrying.");
                    let wait = self.backoff.delay(failures);
                    failures += 1;
                    tokio::select! {
                        () = abandon.cancelled() => return Outcome::Abandoned,
                        () = tokio::time::sleep(wait) => {}
                    }
                }
            }
        }
    }
}

/// The steps that succeeded, latest first: the order to undo them in.
fn succeeded_latest_first(outcomes: &[StepOutcome]) -> Vec<Step> {
    outcomes
        .iter()
        .rev()
        .filter(|o| o.result == StepResult::Succeeded)
        .map(|o| o.step)
        .collect()
}
