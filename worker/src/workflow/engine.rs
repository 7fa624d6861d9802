//! The workflow's entry: [`Workflow::process`] decodes an event, runs it as a
//! delivery ([`super::deliver`]) or a cancellation ([`super::cancel`]), or
//! dead-letters it ([`super::dead_letter`]), and counts what became of it.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::metrics::{self, OutcomeLabels};
use skyport_core::event::{DecodeError, Event};
use skyport_core::ports::{DeadLetterStore, Lane, StreamEvent};
use skyport_runtime::{telemetry, trace_span};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::cancellations::Cancellations;
use super::outcome::{Begin, Handled, Outcome, Tally};
use super::retry::RetryPolicy;
use super::status::StatusWriter;
use super::turns::{Turn, Turns};
use crate::intake::pacer::Pacer;
use crate::resilience::client::ServiceClient;

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

#[derive(Debug)]
pub struct Workflow {
    pub(super) client: ServiceClient,
    pub(super) status: StatusWriter,
    pub(super) dead_letters: Arc<dyn DeadLetterStore>,
    pub(super) retries: RetryPolicy,
    pub(super) cancellations: Cancellations,
    pub(super) tally: Arc<Tally>,
    /// How long a delivery runs before it is marked Processing (`ZERO`:
    /// before its first step).
    pub(super) processing_after: Duration,
    /// How far apart redrives start.
    pub(super) redrives: Pacer,
    /// The deliveries' events whose order matters, and the reschedules read.
    pub(super) turns: Arc<Turns>,
    /// How long before its pickup a delivery runs its steps; one whose
    /// pickup is further away waits (`worker.booking_lead_s`). `None`: none waits.
    pub(super) booking_lead: Option<Duration>,
}

/// An event as it was read: decoded, with its place among its delivery's
/// events. Taken in the partition's order, before the event runs.
#[derive(Debug)]
pub struct Admitted {
    event: Result<Event, DecodeError>,
    /// The lane of the partition it was read from.
    lane: Lane,
    turn: Option<Turn>,
    turns: Arc<Turns>,
}

impl Admitted {
    /// Whose turn a delivery request waits for among the events read ahead
    /// (its principal, else its owner); `None` for the other events, which
    /// start as soon as they are read.
    pub fn client(&self) -> Option<&str> {
        match &self.event {
            Ok(Event::DeliveryRequested(request)) => Some(
                request
                    .principal
                    .as_deref()
                    .unwrap_or(&request.request.owner_id),
            ),
            _ => None,
        }
    }

    /// When the gateway accepted the event (a delivery request, a
    /// reschedule or a cancellation), in Unix milliseconds; `None` for one
    /// that does not decode.
    pub fn accepted_ms(&self) -> Option<i64> {
        let at = match &self.event {
            Ok(Event::DeliveryRequested(request)) => request.accepted_at,
            Ok(Event::DeliveryRescheduled(reschedule)) => reschedule.requested_at,
            Ok(Event::CancellationRequested(cancel)) => cancel.requested_at,
            Ok(Event::DeliveryDue(due)) => due.runs_at,
            Err(_) => return None,
        };
        Some(crate::metrics::unix_ms(at))
    }

    /// An event that does not decode, read from the normal lane.
    #[cfg(test)]
    pub(crate) fn unreadable(event: &StreamEvent) -> Self {
        Self {
            event: Event::decode(&event.payload),
            lane: Lane::Normal,
            turn: None,
            turns: Arc::default(),
        }
    }
}

impl Drop for Admitted {
    /// A reschedule not handled (given up, abandoned) is no longer pending:
    /// it is read again, or dead-lettered.
    fn drop(&mut self) {
        if let Ok(Event::DeliveryRescheduled(reschedule)) = &self.event {
            self.turns.handled(reschedule);
        }
    }
}

impl Workflow {
    pub fn new(
        client: ServiceClient,
        status: StatusWriter,
        dead_letters: Arc<dyn DeadLetterStore>,
        retries: RetryPolicy,
        processing_after: Duration,
        redrive_per_s: u32,
        booking_lead: Option<Duration>,
    ) -> Self {
        Self {
            client,
            status,
            dead_letters,
            retries,
            cancellations: Cancellations::default(),
            tally: Arc::default(),
            processing_after,
            redrives: Pacer::new(redrive_per_s),
            turns: Arc::default(),
            booking_lead,
        }
    }

    /// Decodes `event`, read from a partition of `lane`, and gives it its
    /// place among its delivery's events; called as events are read, in the
    /// partition's order.
    pub fn admit(&self, event: &StreamEvent, lane: Lane) -> Admitted {
        let decoded = Event::decode(&event.payload);
        let turn = match &decoded {
            Ok(Event::DeliveryRequested(request)) => Some(self.turns.turn(&request.delivery_id)),
            Ok(Event::DeliveryRescheduled(reschedule)) => {
                self.turns.read(reschedule);
                Some(self.turns.turn(&reschedule.delivery_id))
            }
            Ok(Event::DeliveryDue(due)) => Some(self.turns.turn(&due.delivery_id)),
            Ok(Event::CancellationRequested(_)) | Err(_) => None,
        };
        Admitted {
            event: decoded,
            lane,
            turn,
            turns: Arc::clone(&self.turns),
        }
    }

    pub fn tally(&self) -> Arc<Tally> {
        Arc::clone(&self.tally)
    }

    /// Runs the workflow for `event`, admitted as [`Workflow::admit`] read
    /// it; `abandon` gives it up (only at shutdown).
    pub async fn process(
        &self,
        event: &StreamEvent,
        mut admitted: Admitted,
        abandon: &CancellationToken,
    ) -> Outcome {
        if let Some(turn) = admitted.turn.as_mut() {
            turn.come().await;
        }
        let outcome = self.run(event, &admitted, abandon).await;
        self.record(outcome)
    }

    /// Dead-letters `event` with `reason` without running it, and counts that.
    pub async fn give_up(
        &self,
        event: &StreamEvent,
        reason: String,
        abandon: &CancellationToken,
    ) -> Outcome {
        let outcome = self.dead_letter(event, reason, abandon).await;
        self.record(outcome)
    }

    /// Counts `outcome` in the tally and the metrics, and answers it.
    pub fn record(&self, outcome: Outcome) -> Outcome {
        let (counter, label) = match outcome {
            Outcome::Scheduled => (&self.tally.scheduled, "scheduled"),
            Outcome::Failed => (&self.tally.failed, "failed"),
            Outcome::Cancelled => (&self.tally.cancelled, "cancelled"),
            Outcome::CancelRequested => (&self.tally.cancel_requested, "cancel_requested"),
            Outcome::Waiting => (&self.tally.waiting, "waiting"),
            Outcome::NotDue => (&self.tally.not_due, "not_due"),
            Outcome::Rescheduled => (&self.tally.rescheduled, "rescheduled"),
            Outcome::RescheduleRefused => (&self.tally.reschedules_refused, "reschedule_refused"),
            Outcome::AlreadyTerminal => (&self.tally.replayed, "already_terminal"),
            Outcome::DeadLettered => (&self.tally.dead_lettered, "dead_lettered"),
            Outcome::Abandoned => (&self.tally.abandoned, "abandoned"),
            Outcome::Nacked => (&self.tally.nacked, "nacked"),
        };
        counter.fetch_add(1, Ordering::Relaxed);
        metrics::global()
            .workflow_events
            .get_or_create(&OutcomeLabels { outcome: label })
            .inc();
        outcome
    }

    async fn run(
        &self,
        event: &StreamEvent,
        admitted: &Admitted,
        abandon: &CancellationToken,
    ) -> Outcome {
        let result = match &admitted.event {
            Ok(Event::DeliveryRequested(request)) => {
                let span = event_span(
                    "DeliveryRequested",
                    &request.delivery_id,
                    event,
                    request.traceparent.as_deref(),
                );
                let _running = self.cancellations.run(&request.delivery_id);
                match self
                    .foreign(request, abandon)
                    .instrument(span.clone())
                    .await
                {
                    Ok(Some(reason)) => return self.dead_letter(event, reason, abandon).await,
                    Ok(None) => {}
                    Err(interrupted) => return interrupted.into(),
                }
                async {
                    if request.epoch > 0 && self.begin_epoch(request, abandon).await? != Begin::Run
                    {
                        return Ok(Outcome::AlreadyTerminal);
                    }
                    let (request, merged) = self.with_pending(request);
                    if let Some(runs_at) = self.runs_at(&request) {
                        return self
                            .wait(&request, &merged, admitted.lane, runs_at, abandon)
                            .await;
                    }
                    self.deliver(&request, &merged, admitted.lane, None, abandon)
                        .await
                }
                .instrument(span)
                .await
            }
            Ok(Event::CancellationRequested(cancel)) => {
                let span = event_span(
                    "CancellationRequested",
                    &cancel.delivery_id,
                    event,
                    cancel.traceparent.as_deref(),
                );
                self.cancel(cancel, abandon).instrument(span).await
            }
            Ok(Event::DeliveryRescheduled(reschedule)) => {
                let span = event_span(
                    "DeliveryRescheduled",
                    &reschedule.delivery_id,
                    event,
                    reschedule.traceparent.as_deref(),
                );
                match self.reschedule(reschedule, abandon).instrument(span).await {
                    Ok(Handled::Done(outcome)) => Ok(outcome),
                    Ok(Handled::GiveUp(reason)) => {
                        return self.dead_letter(event, reason, abandon).await;
                    }
                    Err(interrupted) => Err(interrupted),
                }
            }
            Ok(Event::DeliveryDue(due)) => {
                let span = event_span("DeliveryDue", &due.delivery_id, event, None);
                let _running = self.cancellations.run(&due.delivery_id);
                self.due(due, abandon).instrument(span).await
            }
            Err(e) => return self.dead_letter(event, e.to_string(), abandon).await,
        };
        result.unwrap_or_else(Outcome::from)
    }
}
