//! One Event Hubs partition as the worker reads it: a loop on the consumer
//! thread moves its events from the SDK's stream (not `Send`) into a bounded
//! channel, and [`EventHubsPartitionReader`] hands them to the worker and writes its
//! checkpoints.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use azure_messaging_eventhubs::error::ErrorKind;
use azure_messaging_eventhubs::models::{Checkpoint, ReceivedEventData};
use azure_messaging_eventhubs::processor::PartitionClient;
use bytes::Bytes;
use futures_util::StreamExt;
use skyport_core::ports::{ConsumeError, Lane, PartitionReader, StreamEvent};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::checkpoints::Checkpoints;
use super::hub::HubContext;
use super::tails::Ends;

/// How long closing a partition's receiver may take (a dead connection never answers).
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// What a partition loop feeds its reader.
#[derive(Debug)]
pub(crate) enum Fed {
    Event(StreamEvent, Option<String>),
    /// The partition's stream ended: taken over, or its link broke.
    Ended,
}

/// The pump's side of a partition's reader: the channel it feeds, and the
/// flag it raises once another processor owns the partition.
pub(crate) struct Feed {
    events: mpsc::Sender<Fed>,
    taken: Arc<AtomicBool>,
}

/// Who owns each of a processor's partitions, as the ownership records said
/// at the last reading: one listing every balancing interval, shared by the
/// processor's partitions. The processor that loses a partition closes its
/// receiver, but an idle receiver only notices at its next event, which the
/// new owner reads too.
pub(crate) struct Owners {
    store: Checkpoints,
    context: HubContext,
    /// How often the records are read: the processors' balancing interval.
    interval: Duration,
    /// Each partition's owner, by partition id, and when the reading began;
    /// `None` until the first reading.
    records: watch::Sender<Option<Reading>>,
}

impl Owners {
    pub(crate) fn new(store: Checkpoints, context: HubContext, interval: Duration) -> Self {
        Self {
            store,
            context,
            interval,
            records: watch::Sender::new(None),
        }
    }

    /// A watch of `partition_id`'s owner.
    pub(crate) fn watch(&self, partition_id: String) -> OwnershipWatch {
        OwnershipWatch {
            records: self.records.subscribe(),
            partition_id,
            owner: self.context.owner.clone(),
            since: Instant::now(),
        }
    }

    /// Reads the records every interval, as long as the processor runs.
    pub(crate) async fn run(&self) -> std::convert::Infallible {
        let mut ticks = tokio::time::interval(self.interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            let began = Instant::now();
            let listed = self
                .store
                .list_ownerships(
                    &self.context.namespace,
                    &self.context.hub,
                    &self.context.consumer_group,
                )
                .await;
            // A store that cannot be read now says nothing about the owners;
            // the processor gives a partition up if it cannot renew it.
            let Ok(ownerships) = listed else { continue };
            let owners = ownerships
                .into_iter()
                .map(|o| (o.partition_id, o.owner_id))
                .collect();
            self.records.send_replace(Some((began, owners)));
        }
    }
}

/// When a reading of the ownership records began, and each partition's owner in it.
type Reading = (Instant, HashMap<String, Option<String>>);

/// One partition's owner, from [`Owners`].
pub(crate) struct OwnershipWatch {
    records: watch::Receiver<Option<Reading>>,
    partition_id: String,
    owner: String,
    /// Readings begun before this are older than the claim that handed the
    /// partition here, and say nothing about its owner now.
    since: Instant,
}

impl OwnershipWatch {
    /// Waits until another owner holds the partition (or none does), or
    /// until the processor that handed it out stops.
    async fn lost(&mut self) {
        loop {
            {
                let records = self.records.borrow_and_update();
                if let Some((began, owners)) = records.as_ref()
                    && *began >= self.since
                {
                    let owner = owners.get(&self.partition_id).cloned().flatten();
                    if owner.as_deref() != Some(self.owner.as_str()) {
                        tracing::info!(owner, "Another processor owns the partition now.");
                        return;
                    }
                }
            }
            if self.records.changed().await.is_err() {
                // The processor stopped: rebuilt on a new connection, or the
                // consumer stops. Nothing revokes the partition's receiver
                // now (the SDK's shutdown leaves it open) and no reading says
                // who owns the partition, so it is given up here; whichever
                // processor claims it next reads it from its checkpoint.
                tracing::info!("The processor that owned the partition stopped; giving it up.");
                return;
            }
        }
    }
}

/// Moves one partition's events from the SDK's stream (not `Send`) to its
/// reader, until the stream ends, the partition's ownership moves to another
/// processor, the processor that handed it out stops, or the reader is
/// dropped. The client goes back to the
/// processor (closed) only once the worker is done with the partition, so
/// the processor does not reopen it while events still drain.
pub(crate) async fn pump(
    client: Arc<PartitionClient>,
    partition: u32,
    mut ownership: OwnershipWatch,
    feed: Feed,
    broken: CancellationToken,
) {
    let Feed { events: fed, taken } = feed;
    {
        let mut events = client.stream_events();
        let lost = ownership.lost();
        tokio::pin!(lost);
        // Once another processor owns the partition, the reader hands out
        // nothing more, not even what is queued for it: the new owner reads
        // that from the last checkpoint, and two live owners never work on
        // the same event (the reader may be full and not reading).
        let give_up = || {
            taken.store(true, Ordering::Relaxed);
            let _ = fed.try_send(Fed::Ended);
        };
        loop {
            tokio::select! {
                () = fed.closed() => break,
                () = &mut lost => {
                    give_up();
                    break;
                }
                next = events.next() => {
                    let item = match next {
                        Some(Ok(event)) => match stream_event(partition, &event) {
                            Some((event, offset)) => Fed::Event(event, offset),
                            None => {
                                tracing::error!("An event came without a sequence number; skipping it.");
                                continue;
                            }
                        },
                        Some(Err(e)) => {
                            if matches!(e.kind, ErrorKind::ConsumerDisconnected(_)) {
                                tracing::info!("The partition was taken over.");
                                give_up();
                                break;
                            }
                            tracing::warn!(error = %e, "The partition's stream failed; giving the partition back and reconnecting.");
                            broken.cancel();
                            Fed::Ended
                        }
                        None => Fed::Ended,
                    };
                    let ended = matches!(item, Fed::Ended);
                    tokio::select! {
                        sent = fed.send(item) => if sent.is_err() || ended {
                            break;
                        },
                        () = &mut lost => {
                            give_up();
                            break;
                        }
                    }
                }
            }
        }
    }
    fed.closed().await;
    if let Ok(client) = Arc::try_unwrap(client) {
        match tokio::time::timeout(CLOSE_TIMEOUT, client.close()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::debug!(error = %e, "Closing the partition client failed."),
            Err(_) => tracing::debug!("Closing the partition client timed out."),
        }
    }
}

fn stream_event(
    partition: u32,
    event: &ReceivedEventData,
) -> Option<(StreamEvent, Option<String>)> {
    let sequence_number = u64::try_from(event.sequence_number()?).ok()?;
    let payload = event
        .event_data()
        .body()
        .map_or_else(Bytes::new, Bytes::copy_from_slice);
    Some((
        StreamEvent {
            partition,
            offset: sequence_number,
            payload,
        },
        event.offset().clone(),
    ))
}

/// One Event Hubs partition as the worker reads it: offsets are sequence
/// numbers, and a checkpoint records the sequence number and the service's
/// offset of the last completed event. The SDK's receiver cannot seek, so
/// the reader keeps what it handed out until it is checkpointed and reads
/// it again from there when rewound.
pub(crate) struct EventHubsPartitionReader {
    pub(crate) partition: u32,
    context: HubContext,
    partition_id: String,
    events: mpsc::Receiver<Fed>,
    /// Raised by the pump once another processor owns the partition.
    taken: Arc<AtomicBool>,
    /// Each event handed out and not yet checkpointed, with the service's offset.
    handed: BTreeMap<u64, (StreamEvent, Option<String>)>,
    /// Handed out before, to hand out again (after a rewind) before what is new.
    again: VecDeque<StreamEvent>,
    store: Checkpoints,
    /// The highest offset checkpointed through this reader: the store's
    /// write replaces the record, so a lower one would move it back.
    checkpointed: Option<u64>,
    ended: bool,
    /// The partition's ends, read now and again, for [`PartitionReader::unread`].
    ends: Arc<Ends>,
    /// The sequence number of the checkpoint the partition was won at: the
    /// processor starts after it (at the partition's first event without one).
    start: Option<i64>,
    /// The highest sequence number handed out.
    last_handed: Option<i64>,
}

impl std::fmt::Debug for EventHubsPartitionReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventHubsPartitionReader")
            .field("hub", &self.context.hub)
            .field("partition_id", &self.partition_id)
            .field("partition", &self.partition)
            .finish_non_exhaustive()
    }
}

impl EventHubsPartitionReader {
    pub(crate) fn new(
        context: &HubContext,
        partition_id: &str,
        store: Checkpoints,
        prefetch: u32,
        (ends, start): (Arc<Ends>, Option<i64>),
    ) -> (Self, Feed) {
        let index = context
            .partition_ids
            .iter()
            .position(|id| id == partition_id)
            .and_then(|i| u32::try_from(i).ok())
            .unwrap_or(0);
        let (tx, rx) = mpsc::channel(usize::try_from(prefetch).unwrap_or(300).max(1));
        let taken = Arc::new(AtomicBool::new(false));
        (
            Self {
                partition: context.first + index,
                context: context.clone(),
                partition_id: partition_id.to_owned(),
                events: rx,
                taken: Arc::clone(&taken),
                handed: BTreeMap::new(),
                again: VecDeque::new(),
                store,
                checkpointed: None,
                ended: false,
                ends,
                start,
                last_handed: None,
            },
            Feed { events: tx, taken },
        )
    }

    fn take(&mut self, fed: Fed, batch: &mut Vec<StreamEvent>) {
        match fed {
            Fed::Event(event, offset) => {
                let sequence_number = i64::try_from(event.offset).unwrap_or(i64::MAX);
                self.last_handed = self.last_handed.max(Some(sequence_number));
                self.handed.insert(event.offset, (event.clone(), offset));
                batch.push(event);
            }
            Fed::Ended => self.ended = true,
        }
    }
}

#[async_trait]
impl PartitionReader for EventHubsPartitionReader {
    fn partition(&self) -> u32 {
        self.partition
    }

    fn lane(&self) -> Lane {
        self.context.lane
    }

    async fn next_batch(&mut self, max: usize) -> Result<Vec<StreamEvent>, ConsumeError> {
        if max == 0 {
            return Ok(Vec::new());
        }
        if self.taken.load(Ordering::Relaxed) {
            self.ended = true;
            self.again.clear();
            return Err(ConsumeError::Revoked);
        }
        if !self.again.is_empty() {
            let take = max.min(self.again.len());
            return Ok(self.again.drain(..take).collect());
        }
        if self.ended {
            return Err(ConsumeError::Revoked);
        }
        let mut batch = Vec::new();
        match self.events.recv().await {
            Some(fed) => self.take(fed, &mut batch),
            None => self.ended = true,
        }
        while batch.len() < max && !self.ended {
            match self.events.try_recv() {
                Ok(fed) => self.take(fed, &mut batch),
                Err(_) => break,
            }
        }
        if batch.is_empty() {
            Err(ConsumeError::Revoked)
        } else {
            Ok(batch)
        }
    }

    /// The partition's last enqueued sequence number past the next one this
    /// reader hands out: after the last it handed out, else after the
    /// checkpoint it started from, else the partition's first. 0 until the
    /// partition's ends are first read (a second or so).
    fn unread(&self) -> Option<u64> {
        let Some((first, last)) = self.ends.read() else {
            return Some(0);
        };
        let next = match (self.last_handed, self.start) {
            (Some(handed), _) => handed.saturating_add(1),
            (None, Some(checkpoint)) => checkpoint.saturating_add(1),
            (None, None) => first,
        };
        Some(u64::try_from(last.saturating_add(1).saturating_sub(next)).unwrap_or(0))
    }

    async fn rewind(&mut self, offset: u64) -> Result<(), ConsumeError> {
        self.again = self
            .handed
            .range(offset..)
            .map(|(_, (event, _))| event.clone())
            .collect();
        Ok(())
    }

    async fn checkpoint(&mut self, offset: u64) -> Result<(), ConsumeError> {
        if self.checkpointed.is_some_and(|highest| offset <= highest) {
            return Ok(());
        }
        let checkpoint = Checkpoint {
            fully_qualified_namespace: self.context.namespace.clone(),
            event_hub_name: self.context.hub.clone(),
            consumer_group: self.context.consumer_group.clone(),
            partition_id: self.partition_id.clone(),
            offset: self
                .handed
                .get(&offset)
                .and_then(|(_, offset)| offset.clone()),
            sequence_number: i64::try_from(offset).ok(),
        };
        self.store
            .update_checkpoint(checkpoint)
            .await
            .map_err(|e| ConsumeError::Unavailable(Box::new(e)))?;
        self.handed = self.handed.split_off(&(offset + 1));
        self.checkpointed = Some(offset);
        Ok(())
    }
}
