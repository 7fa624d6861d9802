//! Leases: small JSON documents kept in groups, each replaced only at the
//! version it was read at. What a partition-balancing consumer (the Event Hubs
//! processor, a change-feed processor) keeps its ownership claims and
//! checkpoints in.
//!
//! A group is listed as a whole (one partition of a store); a lease's name is
//! unique in its group and may not hold `/`, `\`, `?` or `#` (it becomes a
//! document id). The store sets the version ([`ETag`]) and the time of every
//! write; expiry is judged by that time, never by a clock of the writer's.

use async_trait::async_trait;
use serde_json::{Map, Value};
use time::OffsetDateTime;

use super::status::ETag;
use crate::error::BoxError;

/// What a lease holds: a JSON object of the caller's.
pub type LeaseFields = Map<String, Value>;

/// A lease as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct Lease {
    pub name: String,
    pub version: LeaseVersion,
    pub fields: LeaseFields,
}

/// The version and time a write gave a lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseVersion {
    pub etag: ETag,
    pub modified: OffsetDateTime,
}

/// The condition a lease write is made on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseCondition {
    /// Whatever is stored (a checkpoint: the last writer wins).
    Any,
    /// Only if the lease does not exist yet.
    Absent,
    /// Only if the stored lease is still at this version.
    Matches(ETag),
}

#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// The condition does not hold: another writer was first.
    #[error("the lease changed since it was read")]
    Conflict,
    #[error("the lease store is unavailable")]
    Unavailable(#[source] BoxError),
}

/// Leases by group and name, written on a condition.
#[async_trait]
pub trait LeaseStore: std::fmt::Debug + Send + Sync + 'static {
    /// Every lease of `group` whose name starts with `prefix`, by name.
    ///
    /// # Errors
    /// [`LeaseError::Unavailable`] when the store cannot be read.
    async fn list(&self, group: &str, prefix: &str) -> Result<Vec<Lease>, LeaseError>;

    /// Writes lease `name` of `group` when `condition` holds.
    ///
    /// # Errors
    /// [`LeaseError::Conflict`] when it does not.
    async fn put(
        &self,
        group: &str,
        name: &str,
        fields: &LeaseFields,
        condition: LeaseCondition,
    ) -> Result<LeaseVersion, LeaseError>;
}
