//! Dead letters: where poison events go so that their partition can move on,
//! and changes of the status feed that a change-feed handler gave up on (a
//! callback that could not be delivered) so that their lease can move on.
//!
//! Both are read a page at a time, after the last one read: however many
//! there are, a reader holds at most a page.

use async_trait::async_trait;
use bytes::Bytes;
use time::OffsetDateTime;

use crate::error::BoxError;

/// An event the worker cannot process, kept with the reason and its raw bytes.
#[derive(Debug, Clone)]
pub struct DeadLetter {
    pub partition: u32,
    pub offset: u64,
    pub reason: String,
    pub payload: Bytes,
    pub at: OffsetDateTime,
}

/// A change a change-feed handler gave up on, kept with the reason.
#[derive(Debug, Clone, PartialEq)]
pub struct ChangeDeadLetter {
    /// The processor (deployment unit) whose handler gave up.
    pub processor: String,
    /// Unique within the processor: the same change given up twice is kept once.
    pub key: String,
    pub reason: String,
    /// The change, or what the handler tried to send (JSON).
    pub payload: serde_json::Value,
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

    /// Keeps a change a handler gave up on (replacing one with the same key).
    ///
    /// # Errors
    /// [`DeadLetterError`] when the dead letter is not durable.
    async fn put_change(&self, letter: ChangeDeadLetter) -> Result<(), DeadLetterError>;

    /// At most `limit` dead-lettered events, the first ones after the one
    /// at `after` (a `(partition, offset)` read before; from the first when
    /// `None`), in an order of positions the store keeps. A page shorter
    /// than `limit` is the last; removing what was read does not move the
    /// next page.
    ///
    /// # Errors
    /// [`DeadLetterError`] when the store cannot be read.
    async fn events(
        &self,
        after: Option<(u32, u64)>,
        limit: usize,
    ) -> Result<Vec<DeadLetter>, DeadLetterError>;

    /// Forgets the dead-lettered event at `partition` and `offset` (a
    /// redrive published it again); forgetting one that is not there succeeds.
    ///
    /// # Errors
    /// [`DeadLetterError`] when the removal is not durable.
    async fn remove(&self, partition: u32, offset: u64) -> Result<(), DeadLetterError>;

    /// At most `limit` of the changes `processor`'s handler gave up on, by
    /// key, the first ones after key `after` (from the first when `None`). A
    /// page shorter than `limit` is the last.
    ///
    /// # Errors
    /// [`DeadLetterError`] when the store cannot be read.
    async fn changes(
        &self,
        processor: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<ChangeDeadLetter>, DeadLetterError>;
}
