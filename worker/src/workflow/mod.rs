//! The workflow run for every event: decode, mark Processing, call the five
//! services in [`steps::ORDER`], record Scheduled or Failed.
//!
//! Invariant: an event counts as completed only once its terminal status (or
//! its dead letter) is durable. Replays are safe: each call is keyed by the
//! delivery id (PUT by id, `Idempotency-Key: {deliveryId}:{step}`), and an
//! event whose delivery is already terminal does nothing.

pub mod backoff;
pub mod breaker;
pub mod client;
pub mod status;
pub mod steps;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use skyport_shared::event::DeliveryRequested;
use skyport_shared::ports::{DeadLetter, DeadLetterStore, StreamEvent};
use skyport_shared::status::{DeliveryState, Failure, StepOutcome, StepResult};
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;

use self::backoff::Backoff;
use self::client::{ServiceClient, StepError};
use self::status::{Abandoned, Finish, Start, StatusWriter};
use self::steps::Progress;
use crate::rate_limit::RateLimiter;

/// What became of one event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Scheduled,
    Failed,
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
            "scheduled={} failed={} replayed={} dead_lettered={} abandoned={}",
            get(&self.scheduled),
            get(&self.failed),
            get(&self.replayed),
            get(&self.dead_lettered),
            get(&self.abandoned)
        )
    }
}

#[derive(Debug)]
pub struct Workflow {
    client: ServiceClient,
    status: StatusWriter,
    dead_letters: Arc<dyn DeadLetterStore>,
    backoff: Backoff,
    limiter: Option<RateLimiter>,
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
            counters: Arc::default(),
        }
    }

    pub fn counters(&self) -> Arc<Counters> {
        Arc::clone(&self.counters)
    }

    /// Runs the workflow for `event`; `abandon` gives it up (only at shutdown).
    pub async fn process(&self, event: &StreamEvent, abandon: &CancellationToken) -> Outcome {
        let outcome = match &self.limiter {
            Some(limiter) => tokio::select! {
                () = abandon.cancelled() => Outcome::Abandoned,
                () = limiter.acquire() => self.run(event, abandon).await,
            },
            None => self.run(event, abandon).await,
        };
        let counter = match outcome {
            Outcome::Scheduled => &self.counters.scheduled,
            Outcome::Failed => &self.counters.failed,
            Outcome::AlreadyTerminal => &self.counters.replayed,
            Outcome::DeadLettered => &self.counters.dead_lettered,
            Outcome::Abandoned => &self.counters.abandoned,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        outcome
    }

    async fn run(&self, event: &StreamEvent, abandon: &CancellationToken) -> Outcome {
        let request = match DeliveryRequested::decode(&event.payload) {
            Ok(request) => request,
            Err(e) => return self.dead_letter(event, e.to_string(), abandon).await,
        };
        let started = match self.status.start(&request, abandon).await {
            Ok(Start::Begun(started)) => started,
            Ok(Start::AlreadyTerminal) => return Outcome::AlreadyTerminal,
            Err(Abandoned) => return Outcome::Abandoned,
        };
        if started.document.attempt > 1 {
            self.counters.replayed.fetch_add(1, Ordering::Relaxed);
        }
        let mut progress = Progress::default();
        let mut outcomes = Vec::with_capacity(steps::ORDER.len());
        let mut failure = None;
        for step in steps::ORDER {
            let call = steps::call(step, &request, &progress);
            let key = format!("{}:{}", request.delivery_id, step.as_str());
            let answer = self
                .client
                .call(step, &call, &key, request.traceparent.as_deref(), abandon)
                .await;
            let recorded = answer
                .result
                .and_then(|body| steps::record(step, &body, &mut progress));
            let (result, detail) = match recorded {
                Ok(detail) => (StepResult::Succeeded, detail),
                Err(StepError::Abandoned) => return Outcome::Abandoned,
                Err(StepError::Permanent { code, message }) => {
                    tracing::info!(delivery_id = %request.delivery_id, step = step.as_str(), %code, %message, "A delivery failed.");
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
        if failure.is_some()
            && self
                .compensate(&request, &mut outcomes, abandon)
                .await
                .is_err()
        {
            return Outcome::Abandoned;
        }
        let state = if failure.is_some() {
            DeliveryState::Failed
        } else {
            DeliveryState::Scheduled
        };
        let apply = |document: &mut skyport_shared::status::StatusDocument| {
            document.state = state;
            document.steps.clone_from(&outcomes);
            document.drone_id.clone_from(&progress.drone_id);
            document.third_party_required = progress.third_party_required;
            document.failure.clone_from(&failure);
            document.updated_at = OffsetDateTime::now_utc();
        };
        match self.status.finish(started, apply, abandon).await {
            Ok(Finish::Written) => {
                if state == DeliveryState::Scheduled {
                    Outcome::Scheduled
                } else {
                    Outcome::Failed
                }
            }
            Ok(Finish::AlreadyTerminal) => Outcome::AlreadyTerminal,
            Err(Abandoned) => Outcome::Abandoned,
        }
    }

    /// Undoes the steps that succeeded, latest first, and marks them Compensated.
    /// A compensation the service refuses is logged and noted on the step; it
    /// does not stop the others.
    async fn compensate(
        &self,
        request: &DeliveryRequested,
        outcomes: &mut [StepOutcome],
        abandon: &CancellationToken,
    ) -> Result<(), Abandoned> {
        for outcome in outcomes.iter_mut().rev() {
            if outcome.result != StepResult::Succeeded {
                continue;
            }
            let Some(call) = steps::undo(outcome.step, request) else {
                continue;
            };
            let key = format!("{}:{}:undo", request.delivery_id, outcome.step.as_str());
            let answer = self
                .client
                .call(
                    outcome.step,
                    &call,
                    &key,
                    request.traceparent.as_deref(),
                    abandon,
                )
                .await;
            outcome.calls += answer.calls;
            outcome.at = OffsetDateTime::now_utc();
            match answer.result {
                Ok(_) => outcome.result = StepResult::Compensated,
                Err(StepError::Abandoned) => return Err(Abandoned),
                Err(StepError::Permanent { code, message }) => {
                    tracing::error!(delivery_id = %request.delivery_id, step = outcome.step.as_str(), %code, %message, "Could not undo a step; it needs a person.");
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
