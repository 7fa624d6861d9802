//! One partition: read in order up to `read_ahead` events past the
//! checkpoint, run up to `max_in_flight` delivery requests at once, taken
//! in turn over their clients ([`super::ready`]), checkpoint what is
//! complete every `checkpoint_interval`, and on shutdown or revocation
//! (another consumer took the partition over) stop reading, start the
//! requests that turns left behind what has started, let in-flight events
//! finish within the grace period and write a final checkpoint.
//!
//! Events start as they are read and a window slot frees, never batch by
//! batch: a slow event holds back only the checkpoint, not the events
//! behind it. An event handed back (its
//! writes failed `worker.redeliver_after_failures` times in a row, or its
//! processing panicked) is read again from the stream: the reader is rewound
//! to it (a Kafka seek), and of what comes again only the handed-back events
//! run. One that panics `MAX_PANICS` times goes to the dead letters.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::metrics::{self, PartitionLabels};
use skyport_core::ports::{ConsumeError, Lane, PartitionReader, StreamEvent};
use tokio::task::{Id, JoinError, JoinSet};
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use super::PartitionContext;
use super::ready::{Ready, Waiting};
use super::tracker::{Begin, Tracker};
use crate::workflow::Outcome;

/// Runs of one event that may panic before it is dead-lettered.
const MAX_PANICS: u32 = 3;

struct Partition {
    context: Arc<PartitionContext>,
    reader: Box<dyn PartitionReader>,
    tracker: Tracker,
    tasks: JoinSet<(u64, Outcome)>,
    /// Each task's event, and whether it holds a slot of the window.
    offsets: HashMap<Id, (u64, bool)>,
    /// Delivery requests read and not started.
    ready: Ready,
    /// Tasks holding a slot of the window.
    windowed: usize,
    /// The highest offset started since the partition was assigned.
    highest_started: Option<u64>,
    lane: Lane,
    /// Whether the reader was told that intake is paused.
    fetching_paused: bool,
}

pub async fn run(
    reader: Box<dyn PartitionReader>,
    context: Arc<PartitionContext>,
    shutdown: CancellationToken,
) {
    let settings = &context.settings;
    let mut paused = context.intake.pauses().subscribe();
    let id = reader.partition();
    let lane = reader.lane();
    let mut partition = Partition {
        context: Arc::clone(&context),
        reader,
        tracker: Tracker::default(),
        tasks: JoinSet::new(),
        offsets: HashMap::new(),
        ready: Ready::default(),
        windowed: 0,
        highest_started: None,
        lane,
        fetching_paused: false,
    };
    // In-flight events keep running through the grace period; this gives them up after it.
    let abandon = CancellationToken::new();
    let mut checkpoints = tokio::time::interval(settings.checkpoint_interval_ms.duration());
    checkpoints.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let metrics = metrics::global();
    let labels = PartitionLabels {
        lane: lane.as_str(),
        partition: id,
    };
    let series = metrics.partition_read(&labels);
    let backlog = context.intake.track();
    let in_flight = metrics.events_in_flight.get_or_create(&labels).clone();
    // A stream that cannot tell what is unread shows no lag rather than a wrong one.
    let lag = partition
        .reader
        .unread()
        .map(|_| metrics.consumer_lag.get_or_create(&labels).clone());
    loop {
        let pending = partition.tracker.in_flight();
        backlog.report(pending, partition.tracker.oldest_in_flight());
        series.oldest_accepted(partition.tracker.oldest_accepted_ms());
        in_flight.set(i64::try_from(pending).unwrap_or(i64::MAX));
        if let (Some(lag), Some(unread)) = (&lag, partition.reader.unread()) {
            let events = unread.saturating_add(pending as u64);
            lag.set(i64::try_from(events).unwrap_or(i64::MAX));
        }
        let intake_paused = *paused.borrow_and_update();
        if !intake_paused {
            partition.start_ready(context.intake.window(), &shutdown, &abandon);
        }
        let room = settings
            .read_ahead
            .saturating_sub(partition.tasks.len() + partition.ready.len());
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
        // Fetching pauses with intake (seconds at least), not as the window
        // fills and frees: Kafka drops what it fetched for a paused partition
        // and fetches it again on resuming, which, event by event, starved
        // the partition. Its fetcher bounds what it holds ahead on its own.
        if intake_paused != partition.fetching_paused {
            partition.fetching_paused = intake_paused;
            partition.reader.set_paused(intake_paused);
        }
        let pulling = room > 0 && !intake_paused;
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
                            Begin::Run { panics } => partition.read(event, panics, &shutdown, &abandon),
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
}

impl Partition {
    /// Takes in `event`, just read: a delivery request waits for its
    /// client's turn and a slot of the window; any other event starts now.
    fn read(
        &mut self,
        event: StreamEvent,
        panics: u32,
        shutdown: &CancellationToken,
        abandon: &CancellationToken,
    ) {
        // In the partition's order, before any of the events read runs.
        let admitted = self.context.workflow.admit(&event, self.lane);
        if let Some(accepted) = admitted.accepted_ms() {
            self.tracker.accepted(event.offset, accepted);
        }
        let waiting = Waiting {
            event,
            admitted,
            panics,
        };
        match waiting.admitted.client().map(str::to_owned) {
            Some(client) => self.ready.push(client, waiting),
            None => self.start(waiting, false, shutdown, abandon),
        }
    }

    /// Starts waiting delivery requests, in their clients' turns, while the
    /// window has room.
    fn start_ready(
        &mut self,
        window: usize,
        shutdown: &CancellationToken,
        abandon: &CancellationToken,
    ) {
        while self.windowed < window {
            let Some(waiting) = self.ready.pop() else {
                return;
            };
            self.start(waiting, true, shutdown, abandon);
        }
    }

    /// Runs an event in a task of its own (holding a slot of the window when
    /// `windowed`); one whose runs panicked [`MAX_PANICS`] times goes to the
    /// dead letters instead.
    fn start(
        &mut self,
        waiting: Waiting,
        windowed: bool,
        shutdown: &CancellationToken,
        abandon: &CancellationToken,
    ) {
        let Waiting {
            event,
            admitted,
            panics,
        } = waiting;
        let context = Arc::clone(&self.context);
        let abandon = abandon.clone();
        let stop = shutdown.clone();
        let offset = event.offset;
        let lane = self.lane;
        let handle = self.tasks.spawn(async move {
            let workflow = &context.workflow;
            let outcome = if panics >= MAX_PANICS {
                let reason = format!("processing the event panicked {panics} times");
                workflow.give_up(&event, reason, &abandon).await
            } else if context.intake.admit(lane, &stop, &abandon).await {
                workflow.process(&event, admitted, &abandon).await
            } else {
                // An event still waiting for a rate-limit slot when the worker
                // stops gives up at once: it has done nothing, and is read again.
                workflow.record(Outcome::Abandoned)
            };
            (offset, outcome)
        });
        self.offsets.insert(handle.id(), (offset, windowed));
        self.highest_started = Some(self.highest_started.map_or(offset, |h| h.max(offset)));
        self.windowed += usize::from(windowed);
    }

    /// Forgets the task `id` ran: its event, and its slot of the window.
    fn ended(&mut self, id: Id) -> Option<u64> {
        let (offset, windowed) = self.offsets.remove(&id)?;
        self.windowed -= usize::from(windowed);
        Some(offset)
    }

    fn finished(&mut self, joined: Result<(Id, (u64, Outcome)), JoinError>) {
        match joined {
            Ok((id, (offset, outcome))) => {
                self.ended(id);
                if outcome.is_completed() {
                    self.tracker.complete(offset);
                } else if outcome == Outcome::Nacked {
                    self.tracker.nack(offset, false);
                }
            }
            Err(e) => {
                let offset = self.ended(e.id());
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
        // The holes below what has started run too, so that the final
        // checkpoint covers everything started; the rest is read again.
        let holes = self
            .highest_started
            .map(|highest| self.ready.take_below(highest))
            .unwrap_or_default();
        let go_on = CancellationToken::new();
        for waiting in holes {
            self.start(waiting, false, &go_on, abandon);
        }
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
