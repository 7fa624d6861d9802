//! One assigned Kafka partition, read through a queue of its own: batches
//! of what is fetched, pausing, rewinding, the offsets stored as the
//! worker checkpoints, and what is left unread from the statistics' marks.
//! The rebalance callback ([`crate::consumer`]) makes one for each
//! partition it is assigned.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, mpsc as std_mpsc};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::FutureExt;
use rdkafka::consumer::stream_consumer::StreamPartitionQueue;
use rdkafka::consumer::{Consumer as _, ConsumerContext, StreamConsumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::topic_partition_list::TopicPartitionList;
use skyport_core::ports::{ConsumeError, Lane, PartitionReader, StreamEvent};
use tokio_util::sync::CancellationToken;

/// A partition's offsets as librdkafka's statistics report them (-1: not
/// known yet), for [`PartitionReader::unread`].
#[derive(Debug)]
pub(crate) struct Marks {
    /// The high watermark: the offset the next event will get.
    pub(crate) high: AtomicI64,
    /// Where reading starts before the reader has handed anything out: the
    /// group's committed offset, or without one the watermark
    /// `auto.offset.reset` starts a new group at.
    pub(crate) start: AtomicI64,
}

impl Marks {
    pub(crate) fn unknown() -> Self {
        Self {
            high: AtomicI64::new(-1),
            start: AtomicI64::new(-1),
        }
    }
}

/// One assigned partition, read through its own queue.
pub(crate) struct KafkaPartitionReader<C: ConsumerContext + 'static> {
    queue: StreamPartitionQueue<C>,
    consumer: Arc<StreamConsumer<C>>,
    topic: String,
    partition: i32,
    number: u32,
    lane: Lane,
    revoked: CancellationToken,
    marks: Arc<Marks>,
    /// The offset after the last event handed out.
    next: Option<i64>,
    /// The highest offset checkpointed through this reader: librdkafka
    /// stores whatever it is given, so a lower one would move the commit back.
    checkpointed: Option<i64>,
    /// Whether fetching the partition is paused (the worker takes no more now).
    paused: bool,
    /// Dropped with the reader: tells a revocation that this partition is done.
    _done: std_mpsc::SyncSender<()>,
}

/// Where a reader reads: its topic and partition, and the number and lane
/// the worker knows the partition by.
pub(crate) struct Place {
    pub(crate) topic: String,
    pub(crate) partition: i32,
    pub(crate) number: u32,
    pub(crate) lane: Lane,
}

impl<C: ConsumerContext + 'static> KafkaPartitionReader<C> {
    /// The reader of the partition at `place`, newly assigned: it reads
    /// `queue` until `revoked` fires, and dropping it disconnects `done`.
    pub(crate) fn new(
        queue: StreamPartitionQueue<C>,
        consumer: Arc<StreamConsumer<C>>,
        place: Place,
        revoked: CancellationToken,
        marks: Arc<Marks>,
        done: std_mpsc::SyncSender<()>,
    ) -> Self {
        Self {
            queue,
            consumer,
            topic: place.topic,
            partition: place.partition,
            number: place.number,
            lane: place.lane,
            revoked,
            marks,
            next: None,
            checkpointed: None,
            paused: false,
            _done: done,
        }
    }
}

impl<C: ConsumerContext + 'static> std::fmt::Debug for KafkaPartitionReader<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaPartitionReader")
            .field("topic", &self.topic)
            .field("partition", &self.partition)
            .field("number", &self.number)
            .field("next", &self.next)
            .finish_non_exhaustive()
    }
}

impl<C: ConsumerContext + 'static> Drop for KafkaPartitionReader<C> {
    /// A paused partition is resumed before it goes (before a revocation
    /// completes), so that it is fetched when this member gets it again.
    fn drop(&mut self) {
        if self.paused {
            self.set_paused(false);
        }
    }
}

/// The event of `message`, the partition numbered `number`; `next` moves past it.
fn to_event(
    number: u32,
    next: &mut Option<i64>,
    message: &BorrowedMessage<'_>,
) -> Option<StreamEvent> {
    let offset = message.offset();
    *next = Some(offset + 1);
    Some(StreamEvent {
        partition: number,
        offset: u64::try_from(offset).ok()?,
        payload: Bytes::copy_from_slice(message.payload().unwrap_or_default()),
    })
}

#[async_trait]
impl<C: ConsumerContext + 'static> PartitionReader for KafkaPartitionReader<C> {
    fn partition(&self) -> u32 {
        self.number
    }

    fn lane(&self) -> Lane {
        self.lane
    }

    async fn next_batch(&mut self, max: usize) -> Result<Vec<StreamEvent>, ConsumeError> {
        if max == 0 {
            return Ok(Vec::new());
        }
        let first = tokio::select! {
            biased;
            () = self.revoked.cancelled() => return Err(ConsumeError::Revoked),
            message = self.queue.recv() => message.map_err(|e| ConsumeError::Unavailable(Box::new(e)))?,
        };
        let mut batch = Vec::with_capacity(max.min(1_024));
        batch.extend(to_event(self.number, &mut self.next, &first));
        drop(first);
        // What is already fetched joins the batch; nothing waits for more.
        while batch.len() < max {
            let Some(Ok(message)) = self.queue.recv().now_or_never() else {
                break;
            };
            batch.extend(to_event(self.number, &mut self.next, &message));
        }
        Ok(batch)
    }

    fn unread(&self) -> Option<u64> {
        let high = self.marks.high.load(Ordering::Relaxed);
        let next = match self.next {
            Some(next) => next,
            None => self.marks.start.load(Ordering::Relaxed),
        };
        // Until the first statistics (a second at most) nothing waits as far
        // as the reader knows; `None` would tell the worker it never knows.
        if high < 0 || next < 0 {
            return Some(0);
        }
        Some(u64::try_from(high.saturating_sub(next)).unwrap_or(0))
    }

    fn set_paused(&mut self, paused: bool) {
        self.paused = paused;
        let mut partition = TopicPartitionList::new();
        partition.add_partition(&self.topic, self.partition);
        let done = if paused {
            self.consumer.pause(&partition)
        } else {
            self.consumer.resume(&partition)
        };
        match done {
            Ok(()) => {
                tracing::debug!(topic = %self.topic, partition = self.partition, paused, "Fetching of the partition paused or resumed.")
            }
            Err(error) => {
                tracing::warn!(topic = %self.topic, partition = self.partition, paused, %error, "Cannot pause or resume fetching the partition.")
            }
        }
    }

    async fn rewind(&mut self, offset: u64) -> Result<(), ConsumeError> {
        if self.revoked.is_cancelled() {
            return Err(ConsumeError::Revoked);
        }
        let offset = i64::try_from(offset)
            .map_err(|_| ConsumeError::Unavailable("offset out of range".into()))?;
        // Without a timeout the seek is queued at once and what was fetched
        // before it is discarded; the partition's queue then starts at `offset`.
        self.consumer
            .seek(
                &self.topic,
                self.partition,
                rdkafka::Offset::Offset(offset),
                Duration::ZERO,
            )
            .map_err(|e| ConsumeError::Unavailable(Box::new(e)))?;
        self.next = Some(offset);
        Ok(())
    }

    async fn checkpoint(&mut self, offset: u64) -> Result<(), ConsumeError> {
        let offset = i64::try_from(offset)
            .map_err(|_| ConsumeError::Unavailable("offset out of range".into()))?;
        if self.checkpointed.is_some_and(|highest| offset <= highest) {
            return Ok(());
        }
        // librdkafka stores offset + 1: the next offset to read.
        match self
            .consumer
            .store_offset(&self.topic, self.partition, offset)
        {
            Ok(()) => {
                self.checkpointed = Some(offset);
                Ok(())
            }
            Err(KafkaError::StoreOffset(RDKafkaErrorCode::State)) => Err(ConsumeError::Revoked),
            Err(error) => Err(ConsumeError::Unavailable(Box::new(error))),
        }
    }
}
