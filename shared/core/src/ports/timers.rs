//! The timers of Waiting deliveries: an index of when each one's steps run,
//! kept by the status store with the document (the document is the truth,
//! the index a hint that a timer reads).

use async_trait::async_trait;
use time::OffsetDateTime;

use super::status::StatusStoreError;
use crate::lane::Lane;

/// A Waiting delivery whose time has come, as the index holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Due {
    pub delivery_id: String,
    /// The document's revision when its timer was set.
    pub revision: u32,
    pub runs_at: OffsetDateTime,
    /// The lane its events travel in.
    pub lane: Lane,
}

/// When Waiting deliveries run, as the status store keeps it: every write
/// of a document sets, moves or removes its timer in the same transaction.
#[async_trait]
pub trait Timers: std::fmt::Debug + Send + Sync + 'static {
    /// The Waiting deliveries due at or before `up_to`, earliest first (by
    /// when, then by id), after `after` when given, at most `limit` of them.
    ///
    /// # Errors
    /// [`StatusStoreError::Unavailable`] when the index cannot be read.
    async fn due(
        &self,
        after: Option<&Due>,
        up_to: OffsetDateTime,
        limit: usize,
    ) -> Result<Vec<Due>, StatusStoreError>;

    /// How many deliveries are Waiting now.
    ///
    /// # Errors
    /// [`StatusStoreError::Unavailable`] when the index cannot be read.
    async fn waiting(&self) -> Result<u64, StatusStoreError>;
}
