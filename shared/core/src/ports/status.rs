//! Status documents by delivery id, written on a condition (optimistic concurrency).

use async_trait::async_trait;

use time::OffsetDateTime;

use crate::error::BoxError;
use crate::status::{DeliveryState, StatusDocument};

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

/// Which status documents a listing asks for, newest first (by when the
/// delivery was accepted, `createdAt`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListQuery {
    /// Only the deliveries this principal made (a caller without the admin scope).
    pub principal: Option<String>,
    /// Only the deliveries of this `ownerId`.
    pub owner: Option<String>,
    pub state: Option<DeliveryState>,
    /// Accepted at or after.
    pub since: Option<OffsetDateTime>,
    /// Accepted before.
    pub until: Option<OffsetDateTime>,
    /// The most documents the page holds.
    pub limit: usize,
    /// Where the previous page ended.
    pub after: Option<ListCursor>,
}

/// A position in a listing: the last document a page handed out (or passed
/// over). New documents never move it, since they sort before it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListCursor {
    /// `createdAt` in Unix milliseconds.
    pub created_ms: i64,
    pub id: String,
}

impl ListCursor {
    /// The position of `document` in a listing: the next page starts after it.
    pub fn of(document: &StatusDocument) -> Self {
        Self {
            created_ms: i64::try_from(document.created_at.unix_timestamp_nanos() / 1_000_000)
                .unwrap_or(i64::MAX),
            id: document.id.clone(),
        }
    }
}

/// One page of a listing.
#[derive(Debug, Clone, PartialEq)]
pub struct ListPage {
    pub items: Vec<StatusDocument>,
    /// Where the next page starts; `None` when there is none. A page may hold
    /// fewer than `limit` items and still have a next one (a store bounds
    /// what one page reads).
    pub next: Option<ListCursor>,
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

    /// A page of the documents `query` asks for, newest first.
    ///
    /// # Errors
    /// [`StatusStoreError`] when the store cannot be read.
    async fn list(&self, query: &ListQuery) -> Result<ListPage, StatusStoreError>;

    /// Whether the store can be read and written now (for `/readyz`).
    async fn ready(&self) -> bool;
}
