//! The ports: what the gateway and the worker need from a stream and a store,
//! as traits that the adapter crates (embedded, Azure) implement with their
//! own types kept to themselves.
//!
//! A publisher's `Ok` means durable; a status write's `Ok` means the document
//! is durable at the version it returns. [`Ports`] is the bundle a binary
//! opens and hands to the gateway and the worker.

mod change_feed;
mod dead_letters;
mod diagnostics;
mod idempotency;
mod leases;
mod status;
mod stream;
mod timers;

use std::sync::Arc;

pub use self::change_feed::{
    Change, ChangeFeedError, ChangePage, ChangeSource, ChangedIds, FeedRange, LEASE_CONTINUATION,
    LEASE_RETIRED, RANGE_LEASE_PREFIX, StartFrom,
};
pub use self::dead_letters::{ChangeDeadLetter, DeadLetter, DeadLetterError, DeadLetterStore};
pub use self::diagnostics::{Diagnostics, ReportError, ReportQuery, details_of, inspect_parts};
pub use self::idempotency::{IdempotencyStore, Reservation, Reserved};
pub use self::leases::{Lease, LeaseCondition, LeaseError, LeaseFields, LeaseStore, LeaseVersion};
pub use self::status::{
    ETag, ListCursor, ListPage, ListQuery, Precondition, StatusStore, StatusStoreError, Versioned,
};
pub use self::stream::{
    ConsumeError, Consumer, EventProperties, OutboundEvent, PartitionReader, Position,
    PublishError, Publisher, StreamEvent,
};
pub use self::timers::{Due, Timers, shard_of};
pub use crate::error::BoxError;
pub use crate::lane::Lane;

/// The ports a Skyport process runs on, opened by the binary that composes
/// the adapters the settings choose.
#[derive(Clone)]
pub struct Ports {
    pub publisher: Arc<dyn Publisher>,
    pub consumer: Arc<dyn Consumer>,
    pub status: Arc<dyn StatusStore>,
    pub dead_letters: Arc<dyn DeadLetterStore>,
    /// Where retried requests find the delivery they made (beside the status).
    pub idempotency: Arc<dyn IdempotencyStore>,
    /// The change feed of the status documents.
    pub changes: Arc<dyn ChangeSource>,
    /// When Waiting deliveries run, where the status store keeps it;
    /// `None`: deliveries are never deferred.
    pub timers: Option<Arc<dyn Timers>>,
    /// The leases of the status store: the timer shards', and those of the
    /// streams and change-feed processors that balance with them.
    pub leases: Arc<dyn LeaseStore>,
    /// The keys that verify status receipts, the first of which signs them:
    /// the configured ones (`gateway.receipt_keys`, newest first), then the
    /// one the embedded store keeps, if there is one. Empty only in a process
    /// that signs none (`skyport-worker`). Secrets: never printed.
    pub receipt_keys: Vec<Arc<[u8]>>,
}

impl std::fmt::Debug for Ports {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ports")
            .field("publisher", &self.publisher)
            .field("consumer", &self.consumer)
            .field("status", &self.status)
            .field("dead_letters", &self.dead_letters)
            .field("idempotency", &self.idempotency)
            .field("changes", &self.changes)
            .finish_non_exhaustive()
    }
}
