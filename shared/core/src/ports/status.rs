//! Status documents by delivery id, written on a condition (optimistic concurrency).

use async_trait::async_trait;

use crate::error::BoxError;
use crate::status::StatusDocument;

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
