//! The stream: durable, keyed appends on one side; partitions read in order
//! and checkpointed on the other.

use async_trait::async_trait;
use bytes::Bytes;

use crate::error::BoxError;

/// An event to append to the stream, routed by `key`.
#[derive(Debug, Clone)]
pub struct OutboundEvent {
    pub key: String,
    pub payload: Bytes,
    pub properties: EventProperties,
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
/// `next_batch` is cancel-safe: dropping its future loses no events.
#[async_trait]
pub trait PartitionReader: std::fmt::Debug + Send + 'static {
    fn partition(&self) -> u32;

    /// Waits until at least one event is available and returns up to `max` of them in order.
    ///
    /// # Errors
    /// [`ConsumeError::Unavailable`] when the stream cannot be read now;
    /// [`ConsumeError::Revoked`] when the partition is no longer this reader's.
    async fn next_batch(&mut self, max: usize) -> Result<Vec<StreamEvent>, ConsumeError>;

    /// Events durable in the partition that `next_batch` has not handed out
    /// yet, when the stream tells (for the consumer-lag metric).
    fn unread(&self) -> Option<u64> {
        None
    }

    /// Whether the worker takes more events from this partition now (its
    /// in-flight window is full, or intake is paused). A stream that fetches
    /// ahead stops fetching the partition while it does not, and the reader
    /// keeps what it already holds.
    fn set_paused(&mut self, _paused: bool) {}

    /// Reads again from `offset`, an event handed out and not checkpointed:
    /// the next batch starts with it, and the events after it come again
    /// (the worker skips those it is running or has done). This is how a
    /// handed-back event (a nack) is redelivered.
    ///
    /// # Errors
    /// [`ConsumeError::Revoked`] when the partition is no longer this reader's;
    /// [`ConsumeError::Unavailable`] when the stream cannot be read now.
    async fn rewind(&mut self, offset: u64) -> Result<(), ConsumeError>;

    /// Records that every event up to and including `offset` is complete.
    ///
    /// # Errors
    /// [`ConsumeError`] when the checkpoint is not durable.
    async fn checkpoint(&mut self, offset: u64) -> Result<(), ConsumeError>;
}
