//! Dead letters: where poison events go so that their partition can move on.

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
