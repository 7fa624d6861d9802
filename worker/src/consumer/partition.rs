//! One partition: read in order, run up to `max_in_flight` events at once,
//! checkpoint what is complete every `checkpoint_interval`, and on shutdown or
//! revocation (another consumer took the partition over) stop reading, let
//! in-flight events finish within the grace period and write a final
//! checkpoint.
//!
//! Events run as they arrive, never batch by batch: a slow event holds back
//! only the checkpoint, not the events behind it. An event handed back (its
//! writes failed `worker.redeliver_after_failures` times in a row, or its
//! processing panicked) is read again from the stream: the reader is rewound
//! to it (a Kafka seek), and of what comes again only the handed-back events
//! run. One that panics `MAX_PANICS` times goes to the dead letters.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::metrics::{self, PartitionLabels};
use skyport_core::ports::{ConsumeError, PartitionReader, StreamEvent};
use tokio::task::{Id, JoinError, JoinSet};
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use super::PartitionContext;
use super::tracker::{Begin, Tracker};
use crate::workflow::Outcome;

/// Runs of one event that may panic before it is dead-lettered.
const MAX_PANICS: u32 = 3;

struct Partition {
    context: Arc<PartitionContext>,
    reader: Box<dyn PartitionReader>,
    tracker: Tracker,
    tasks: JoinSet<(u64, Outcome)>,
    offsets: HashMap<Id, u64>,
    /// Whether the reader was told that the worker takes no more events now.
    saturated: bool,
}

pub async fn run(
    reader: Box<dyn PartitionReader>,
    context: Arc<PartitionContext>,
    shutdown: CancellationToken,
) {
    let settings = &context.settings;
    let mut paused = context.intake.pauses().subscribe();
    let id = reader.partition();
    let mut partition = Partition {
        context: Arc::clone(&context),
        reader,
        tracker: Tracker::default(),
        tasks: JoinSet::new(),
        offsets: HashMap::new(),
        saturated: false,
    };
    // In-flight events keep running through the grace period; this gives them up after it.
    let abandon = CancellationToken::new();
    let mut checkpoints = tokio::time::interval(settings.checkpoint_interval_ms.duration());
    checkpoints.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let metrics = metrics::global();
    metrics.partition_assigned(id);
    let labels = PartitionLabels { partition: id };
    let in_flight = metrics.events_in_flight.get_or_create(&labels).clone();
    // A stream that cannot tell what is unread shows no lag rather than a wrong one.
    let lag = partition
        .reader
        .unread()
        .map(|_| metrics.consumer_lag.get_or_create(&labels).clone());
    loop {
        let pending = partition.tracker.in_flight();
        context
            .intake
            .report(id, pending, partition.tracker.oldest_in_flight());
        in_flight.set(i64::try_from(pending).unwrap_or(i64::MAX));
        if let (Some(lag), Some(unread)) = (&lag, partition.reader.unread()) {
            let events = unread.saturating_add(pending as u64);
            lag.set(i64::try_from(events).unwrap_or(i64::MAX));
        }
        let room = context
            .intake
            .window()
            .saturating_sub(partition.tasks.len());
        if let Some(offset) = partition.tracker.rewind_to() {
            match partition.reader.rewind(offset).await {
                Ok(()) => {
                    tracing::info!(
                        offset,
                        "Reading the partition again from a handed-back event."
                    );
                    partition.tracker.rewound();
                    metrics.consumer_rewinds.get_or_create(&labels).inc();
                }
                Err(ConsumeError::Revoked) => {
                    tracing::info!(
                        in_flight = partition.tasks.len(),
                        "The partition was taken over; draining what is in flight."
                    );
                    break;
                }
                Err(e @ ConsumeError::Unavailable(_)) => {
                    tracing::error!(error = %e, "Cannot read the partition again from a handed-back event; retrying in 1 s.");
                    tokio::select! {
                        () = shutdown.cancelled() => break,
                        () = tokio::time::sleep(Duration::from_secs(1)) => continue,
                    }
                }
            }
        }
        let pulling = room > 0 && !*paused.borrow_and_update();
        if pulling == partition.saturated {
            partition.saturated = !pulling;
            partition.reader.set_paused(partition.saturated);
        }
        tokio::select! {
            () = shutdown.cancelled() => break,
            Some(joined) = partition.tasks.join_next_with_id(), if !partition.tasks.is_empty() => {
                partition.finished(joined);
            }
            _ = checkpoints.tick() => partition.checkpoint().await,
            Ok(()) = paused.changed() => {}
            batch = partition.reader.next_batch(room), if pulling => match batch {
                Ok(events) => {
                    let now = Instant::now();
                    for event in events {
                        match partition.tracker.begin(event.offset, now) {
                            Begin::Run { panics } => partition.start(event, panics, &shutdown, &abandon),
                            Begin::Skip => {}
                        }
                    }
                }
                Err(ConsumeError::Revoked) => {
                    tracing::info!(in_flight = partition.tasks.len(), "The partition was taken over; draining what is in flight.");
                    break;
                }
                Err(e @ ConsumeError::Unavailable(_)) => {
                    tracing::error!(error = %e, "Cannot read the partition; retrying in 1 s.");
                    tokio::select! {
                        () = shutdown.cancelled() => break,
                        () = tokio::time::sleep(Duration::from_secs(1)) => {}
                    }
                }
            },
        }
    }
    partition
        .drain(settings.shutdown_grace_period_ms.duration(), &abandon)
        .await;
    metrics.partition_released(id);
}

impl Partition {
    /// Runs `event` in a task of its own; one whose runs panicked
    /// [`MAX_PANICS`] times goes to the dead letters instead.
    fn start(
        &mut self,
        event: StreamEvent,
        panics: u32,
        shutdown: &CancellationToken,
        abandon: &CancellationToken,
    ) {
        let context = Arc::clone(&self.context);
        let abandon = abandon.clone();
        let stop = shutdown.clone();
        let offset = event.offset;
        // In the partition's order, before any of the events read runs.
        let admitted = context.workflow.admit(&event);
        let handle = self.tasks.spawn(async move {
            let workflow = &context.workflow;
            let outcome = if panics >= MAX_PANICS {
                let reason = format!("processing the event panicked {panics} times");
                workflow.give_up(&event, reason, &abandon).await
            } else if context.intake.admit(&stop, &abandon).await {
                workflow.process(&event, admitted, &abandon).await
            } else {
                // An event still waiting for a rate-limit slot when the worker
                // stops gives up at once: it has done nothing, and is read again.
                workflow.record(Outcome::Abandoned)
            };
            (offset, outcome)
        });
        self.offsets.insert(handle.id(), offset);
    }

    fn finished(&mut self, joined: Result<(Id, (u64, Outcome)), JoinError>) {
        match joined {
            Ok((id, (offset, outcome))) => {
                self.offsets.remove(&id);
                if outcome.is_completed() {
                    self.tracker.complete(offset);
                } else if outcome == Outcome::Nacked {
                    self.tracker.nack(offset, false);
                }
            }
            Err(e) => {
                let offset = self.offsets.remove(&e.id());
                if let (Some(offset), true) = (offset, e.is_panic()) {
                    tracing::error!(offset, error = %e, "Processing an event panicked; it will be read again.");
                    self.context.workflow.record(Outcome::Nacked);
                    self.tracker.nack(offset, true);
                }
            }
        }
    }

    async fn checkpoint(&mut self) {
        let Some(offset) = self.tracker.pending_checkpoint() else {
            return;
        };
        match self.reader.checkpoint(offset).await {
            Ok(()) => {
                self.tracker.committed(offset);
                metrics::global().checkpointed(self.reader.partition());
                tracing::debug!(
                    offset,
                    in_flight = self.tracker.in_flight(),
                    "Checkpointed."
                );
            }
            Err(e) => {
                tracing::warn!(offset, error = %e, "A checkpoint failed; the next one will cover it.")
            }
        }
    }

    async fn drain(&mut self, grace: Duration, abandon: &CancellationToken) {
        let in_flight = self.tasks.len();
        if in_flight > 0 {
            tracing::info!(
                in_flight,
                grace_ms = grace.as_millis(),
                "Draining in-flight events."
            );
        }
        let deadline = tokio::time::sleep(grace);
        tokio::pin!(deadline);
        while !self.tasks.is_empty() {
            tokio::select! {
                Some(joined) = self.tasks.join_next_with_id() => self.finished(joined),
                () = &mut deadline, if !abandon.is_cancelled() => {
                    tracing::warn!(in_flight = self.tasks.len(), "The grace period ended; giving up the rest (they will be read again).");
                    abandon.cancel();
                }
            }
        }
        self.checkpoint().await;
    }
}
