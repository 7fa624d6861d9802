//! The ports: what the gateway and the worker need from a stream and a store.
//!
//! Adapters (`embedded` today; Event Hubs, Kafka and Cosmos DB later) implement
//! these traits and keep their own types to themselves. A publisher's `Ok`
//! means durable; a status write's `Ok` means the document is durable at the
//! version it returns.

use std::error::Error as StdError;

use async_trait::async_trait;
use bytes::Bytes;
use time::OffsetDateTime;

use crate::status::StatusDocument;

/// A source error, boxed so that no adapter's types leak out of it.
pub type BoxError = Box<dyn StdError + Send + Sync>;

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

    /// Records that every event up to and including `offset` is complete.
    ///
    /// # Errors
    /// [`ConsumeError`] when the checkpoint is not durable.
    async fn checkpoint(&mut self, offset: u64) -> Result<(), ConsumeError>;
}

/// An opaque document version for optimistic concurrency.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ETag(pub String);

/// A status document and the version it was read at.
#[derive(Debug, Clone, PartialEq)]
pub struct Versioned {
    pub document: StatusDocument,
    pub etag: ETag,
}

/// The condition a status write is made on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Precondition {
    /// Only if no document with this id exists.
    IfNoneMatch,
    /// Only if the stored document is still at this version.
    IfMatch(ETag),
}

#[derive(Debug, thiserror::Error)]
pub enum StatusStoreError {
    /// The write's precondition does not hold: re-read and re-apply.
    #[error("the status document changed since it was read")]
    PreconditionFailed,
    #[error("the status store is unavailable")]
    Unavailable(#[source] BoxError),
    #[error("the stored status document {id} cannot be read")]
    Corrupt {
        id: String,
        #[source]
        source: BoxError,
    },
}

/// Status documents by delivery id, written conditionally.
#[async_trait]
pub trait StatusStore: std::fmt::Debug + Send + Sync + 'static {
    /// # Errors
    /// [`StatusStoreError`] when the store cannot be read.
    async fn get(&self, id: &str) -> Result<Option<Versioned>, StatusStoreError>;

    /// Writes `document` when `condition` holds and returns its new version.
    ///
    /// # Errors
    /// [`StatusStoreError::PreconditionFailed`] when it does not hold.
    async fn put(
        &self,
        document: &StatusDocument,
        condition: Precondition,
    ) -> Result<ETag, StatusStoreError>;

    /// Whether the store can be read and written now (for `/readyz`).
    async fn ready(&self) -> bool;
}

/// What the gateway remembers of a request that named its delivery: by a
/// client-chosen `deliveryId`, or by an `Idempotency-Key` the id is derived from.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Reservation {
    pub delivery_id: String,
    /// A digest of what was asked (the body, the key and the client), so that a
    /// retry can be told from another request under the same name.
    pub fingerprint: String,
    #[serde(with = "time::serde::rfc3339")]
    pub accepted_at: OffsetDateTime,
    /// When the name may be taken again.
    #[serde(with = "time::serde::rfc3339")]
    pub expires_at: OffsetDateTime,
}

/// The answer to [`IdempotencyStore::reserve`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reserved {
    /// The name was free (or its reservation had expired) and is now this one's.
    New,
    /// The name is held by this earlier reservation.
    Existing(Reservation),
}

/// Reservations by delivery id: how a retried POST finds the delivery it made.
#[async_trait]
pub trait IdempotencyStore: std::fmt::Debug + Send + Sync + 'static {
    /// Stores `reservation` unless an unexpired one holds its delivery id.
    ///
    /// # Errors
    /// [`StatusStoreError::Unavailable`] when the store cannot be used.
    async fn reserve(&self, reservation: &Reservation) -> Result<Reserved, StatusStoreError>;

    /// Forgets `reservation` if it is still the one stored (its request was
    /// never made durable, so the name is free again).
    ///
    /// # Errors
    /// [`StatusStoreError::Unavailable`] when the store cannot be used.
    async fn release(&self, reservation: &Reservation) -> Result<(), StatusStoreError>;
}

/// An event the worker cannot process, kept with the reason and its raw bytes.
#[derive(Debug, Clone)]
pub struct DeadLetter {
    pub partition: u32,
    pub offset: u64,
    pub reason: String,
    pub payload: Bytes,
    pub at: OffsetDateTime,
}

#[derive(Debug, thiserror::Error)]
pub enum DeadLetterError {
    #[error("the dead-letter store is unavailable")]
    Unavailable(#[source] BoxError),
}

/// Where poison events go so that their partition can move on.
#[async_trait]
pub trait DeadLetterStore: std::fmt::Debug + Send + Sync + 'static {
    /// # Errors
    /// [`DeadLetterError`] when the dead letter is not durable.
    async fn put(&self, letter: DeadLetter) -> Result<(), DeadLetterError>;
}

/// A part of the process that can say why it is degraded, for `/readyz`.
pub trait Diagnostics: std::fmt::Debug + Send + Sync + 'static {
    /// What is wrong now, one sentence each (empty when all is well).
    fn degraded(&self) -> Vec<String>;
}
