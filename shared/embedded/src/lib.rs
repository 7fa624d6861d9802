//! The embedded backend: stream, consumer offsets, status documents and dead
//! letters in one redb database file under the data directory.
//!
//! redb is a pure-Rust, ACID, copy-on-write B-tree store with MVCC readers and
//! checksummed commits, so a `kill -9` at any moment leaves the last committed
//! transaction intact. Every write goes through one committer thread
//! ([`committer`]) that puts all the writes waiting at that moment into a
//! single transaction and a single fsync (group commit); a caller's future
//! resolves only after its transaction is durable. Reads run concurrently on
//! snapshots.
//!
//! Tables:
//! - `log`: (partition, offset) → encoded event; entries at or below every
//!   consumer group's checkpoint are deleted.
//! - `heads`: partition → next offset to assign (so offsets never restart).
//! - `checkpoints`: (consumer group, partition) → last completed offset.
//! - `status`: delivery id → (version, status document JSON).
//! - `dead_letters`: (partition, offset) → (reason, time, raw payload).
//! - `lease_groups`: (group, name) → (version, last modified in Unix ms, JSON
//!   fields): the [`LeaseStore`](skyport_core::ports::LeaseStore) of a
//!   partition-balancing consumer (the Event Hubs processor); see [`leases`].
//! - `reservations`: delivery id → (expiry in Unix ms, [`Reservation`] JSON),
//!   what a retried POST is matched against; `reservation_expiry` indexes
//!   them by expiry, and every commit that reserves forgets a few expired ones.
//! - `meta`: `partitions` (fixed at creation) and `receipt-key`.

mod committer;
mod consumer;
mod leases;
mod store;
mod tables;
#[cfg(test)]
mod tests;

pub use self::committer::CommitStats;
pub use self::consumer::EmbeddedConsumer;
pub use self::store::{EmbeddedStore, OpenError};
