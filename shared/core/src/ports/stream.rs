//! The stream: durable, keyed appends on one side; partitions read in order
//! and checkpointed on the other.

use async_trait::async_trait;
use bytes::Bytes;

use crate::error::BoxError;
use crate::lane::Lane;

/// An event to append to the stream, routed by `key` within its `lane`.
#[derive(Debug, Clone)]
pub struct OutboundEvent {
    pub key: String,
    pub payload: Bytes,
    pub properties: EventProperties,
    pub lane: Lane,
}

/// What travels beside an event's payload, where the stream has room for it
/// (Event Hubs application properties). The payload carries them too, so a
/// stream without properties loses nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EventProperties {
    /// The W3C trace context of the request that produced the event.
    pub traceparent: Option<String>,
    /// What makes a retried request the same logical request.
    pub idempotency_key: Option<String>,
    /// The schema version of the payload's envelope.
    pub schema_version: u32,
}

/// Where an event was made durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    /// The partition, numbered as the worker numbers them.
    pub partition: u32,
    /// The event's offset, when the stream tells it on append.
    pub offset: Option<u64>,
}

#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// The stream cannot take the event now; the client should retry later.
    #[error("the stream is unavailable")]
    Unavailable(#[source] BoxError),
    /// The stream is shutting down and takes no more events.
    #[error("the stream is shutting down")]
    Closed,
    /// The stream did not say whether it stored the event (a send timed out
    /// after it left, or the broker answered neither stored nor refused):
    /// it may yet be durable, so its name stays taken.
    #[error("the stream did not say whether it stored the event")]
    Unknown(#[source] BoxError),
}

/// Appends events durably. Concurrent publishes share batches (group commit);
/// each caller waits only for the batch its event is in.
#[async_trait]
pub trait Publisher: std::fmt::Debug + Send + Sync + 'static {
    /// # Errors
    /// [`PublishError`] when the event is not durable; it was then not accepted.
    async fn publish(&self, event: OutboundEvent) -> Result<Position, PublishError>;

    /// Whether the stream can take events now (for `/readyz`).
    async fn ready(&self) -> bool;

    /// Whether the stream has an expedited lane; without one, expedited
    /// events go to the normal lane.
    fn has_expedited_lane(&self) -> bool {
        false
    }
}

/// An event read from a partition.
#[derive(Debug, Clone)]
pub struct StreamEvent {
    pub partition: u32,
    pub offset: u64,
    pub payload: Bytes,
}

#[derive(Debug, thiserror::Error)]
pub enum ConsumeError {
    #[error("the stream is unavailable")]
    Unavailable(#[source] BoxError),
    /// Another consumer owns the partition now: stop reading it, finish what
    /// is in flight and write a final checkpoint.
    #[error("the partition was taken over by another consumer")]
    Revoked,
}

/// Hands out the partitions this consumer owns.
#[async_trait]
pub trait Consumer: std::fmt::Debug + Send + Sync + 'static {
    /// Waits for the next partition assigned to this consumer.
    ///
    /// # Errors
    /// [`ConsumeError`] when the stream cannot be reached.
    async fn next_partition(&self) -> Result<Box<dyn PartitionReader>, ConsumeError>;

    /// Gives up every partition once their readers are done (after their final
    /// checkpoints), so that other consumers take them over without waiting
    /// for an expiry. Called once, at shutdown.
    async fn stop(&self) {}
}

/// Reads one partition in order, from just after its last checkpoint.
///
/// The promises below hold on every stream and are checked, on each, by
/// the partition-reader contract suite (`skyport_tests::stream_contract`).
#[async_trait]
pub trait PartitionReader: std::fmt::Debug + Send + 'static {
    /// The partition, numbered as the worker numbers them.
    fn partition(&self) -> u32;

    /// The lane the partition belongs to.
    fn lane(&self) -> Lane {
        Lane::Normal
    }

    /// Waits until at least one event is available and returns between 1
    /// and `max` of them, in offset order, each once (until a
    /// [`rewind`](Self::rewind)). `max = 0` answers an empty batch at once,
    /// without waiting and without reading.
    ///
    /// Cancel-safe: dropping the future, at any point, loses and repeats
    /// nothing; the next call hands out what this one would have.
    ///
    /// # Errors
    /// [`ConsumeError::Unavailable`] when the stream cannot be read now (the
    /// reader stays usable; call again later);
    /// [`ConsumeError::Revoked`] when the partition is no longer this
    /// reader's, and on every call after that. Kafka answers it as soon as
    /// the rebalance revokes the partition; Event Hubs once the partition's
    /// receiver breaks (after handing out what it had already received and
    /// anything rewound), and at once when its ownership record names
    /// another processor (within one balancing interval) or its receiver is
    /// taken over: what it received and did not hand out is left to the new
    /// owner, so two live owners never work on one event. The embedded log
    /// never does (one process owns every partition).
    async fn next_batch(&mut self, max: usize) -> Result<Vec<StreamEvent>, ConsumeError>;

    /// Events durable in the partition that `next_batch` has not handed out
    /// yet, when the stream tells (for the consumer-lag metric): positive
    /// while events wait, 0 once every one is handed out. A reader either
    /// always answers `Some` or always `None`: the worker asks once, when
    /// the partition is assigned, whether the stream tells. The embedded
    /// log knows it exactly; Kafka learns the partition's watermarks and
    /// committed offset from the client's statistics, so it lags by up to a
    /// second (and says 0 before their first report); Event Hubs reads the
    /// partition's last enqueued sequence number from its properties every
    /// 5 s (and says 0 before the first reading).
    fn unread(&self) -> Option<u64> {
        None
    }

    /// Whether the worker's intake is paused (an open circuit, a backlog
    /// past its limit: seconds at least), not called as its window fills
    /// and frees, so a stream that fetches ahead bounds what it holds on its
    /// own. A stream that fetches ahead may stop fetching the partition
    /// while paused; nothing is lost either way: what was fetched and not
    /// handed out, and what is published meanwhile, is handed out, in
    /// order, once resumed. Pausing twice is pausing once. Kafka pauses the
    /// partition's fetches; the embedded log reads only when asked; Event
    /// Hubs' bounded prefetch channel fills and stops the receiver on its
    /// own, so it ignores this.
    fn set_paused(&mut self, _paused: bool) {}

    /// Reads again from `offset`, an event handed out and not checkpointed:
    /// the next batch starts exactly with it, and the events after it come
    /// again, in order (the worker skips those it is running or has done).
    /// This is how a handed-back event (a nack) is redelivered.
    ///
    /// # Errors
    /// [`ConsumeError::Revoked`] when the partition is no longer this reader's;
    /// [`ConsumeError::Unavailable`] when the stream cannot be read now.
    async fn rewind(&mut self, offset: u64) -> Result<(), ConsumeError>;

    /// Records that every event up to and including `offset` is complete:
    /// a reader opened for the partition afterwards (by this consumer or
    /// another) starts right after the highest offset checkpointed (on
    /// Kafka, committed: see below). Idempotent, and never moves the
    /// position back: a checkpoint at or below one this reader already made
    /// is `Ok` and changes nothing. A reader that
    /// has seen [`ConsumeError::Revoked`] may still write its final
    /// checkpoint while the stream lets it.
    ///
    /// What `Ok` means differs by stream:
    /// - embedded: durable on return. The checkpoint file is replaced
    ///   atomically (written, `fsync`ed, renamed, its directory synced)
    ///   before the call answers; a crash replays nothing checkpointed.
    /// - Kafka: the offset is *stored* in librdkafka (`enable.auto.offset.store`
    ///   is off, so only checkpoints are stored) and *committed* to the
    ///   group coordinator asynchronously every `kafka.commit_interval_ms`
    ///   (`auto.commit.interval.ms`, 1 s by default), and synchronously when
    ///   a partition is revoked and when the consumer stops. A crash replays
    ///   everything after the last committed offset: at most one commit
    ///   interval's worth of checkpoints. Until a revocation completes (the
    ///   reader dropped, or `kafka.drain_timeout_ms` passed) the final
    ///   checkpoint is committed before the new owner starts, so it starts
    ///   right after it; after that the partition is no longer assigned and
    ///   a higher checkpoint answers `Revoked`.
    /// - Event Hubs: the checkpoint record (sequence number and the
    ///   service's offset) is written to the ownership and checkpoint store,
    ///   a [`LeaseStore`](crate::ports::LeaseStore) (Cosmos DB, or the
    ///   embedded store on one machine), before the call answers, durable as
    ///   that store's writes are. Ownership moves first: a new owner that
    ///   claimed the partition before the old owner's final checkpoint
    ///   starts from the checkpoint it found, so it may read those events
    ///   again (at-least-once). The write is unconditional, so "never moves
    ///   back" holds per reader: an old owner's late final checkpoint can
    ///   still replace a higher one of the new owner's, until the new
    ///   owner's next checkpoint.
    ///
    /// # Errors
    /// [`ConsumeError::Unavailable`] when the checkpoint could not be
    /// recorded; [`ConsumeError::Revoked`] when the stream no longer lets
    /// this reader checkpoint the partition.
    async fn checkpoint(&mut self, offset: u64) -> Result<(), ConsumeError>;
}
