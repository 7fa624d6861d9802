//! The embedded backend, under one data directory:
//!
//! - `stream/`: the stream, a segment log of Skyport's own ([`log`]): one
//!   append-only log for every partition, group-committed with one `pwrite`
//!   and one `fdatasync`, its consumer checkpoints in a file beside it. The
//!   202 path writes only here; a named request's reservation rides in the
//!   same commit as its event.
//! - `skyport.redb`: status documents, reservations, leases and dead letters.
//!   redb is a pure-Rust, ACID, copy-on-write B-tree store with MVCC readers
//!   and checksummed commits, so a `kill -9` at any moment leaves the last
//!   committed transaction intact. Every write goes through one committer
//!   thread ([`committer`]) that puts all the writes waiting at that moment
//!   into a single transaction and a single fsync (group commit; when many
//!   are waiting it lingers `embedded.commit_delay_ms` for more, so a busy
//!   store commits less often); a caller's future resolves only after its
//!   transaction is durable. Reads run concurrently on snapshots.
//!
//! A data directory written before the segment log (the stream in the
//! database's `log` table) is upgraded at start ([`migrate`]).
//!
//! Tables:
//! - `status_records`: delivery id → (version, its number in
//!   `status_changes`, the start of its retention window, status document),
//!   the document's JSON compressed against a dictionary ([`codec`]): about
//!   150 bytes where its JSON is 1.4 KB. It is the only randomly keyed table
//!   a status write touches. Earlier versions kept plain JSON in `status`
//!   ([`compact`]), then the compact document alone in `documents` with two
//!   reverse indexes, `status_change_of` and `status_expiry_of` ([`rows`]):
//!   they move here at start, once.
//! - `dead_letters`: (partition, offset) → (reason, time, raw payload).
//! - `lease_groups`: (group, name) → (version, last modified in Unix ms, JSON
//!   fields): the [`LeaseStore`](skyport_core::ports::LeaseStore) of a
//!   partition-balancing consumer (the Event Hubs processor); see [`leases`].
//! - `reservations`: delivery id → (expiry in Unix ms, [`Reservation`] JSON),
//!   what a retried POST is matched against, copied from the log once
//!   durable there; `reservation_expiry` indexes them by expiry, and every
//!   copy forgets a few expired ones.
//! - `status_changes`: sequence number → delivery id, each document once at
//!   its latest write: the change feed
//!   the change-feed processor reads ([`ChangeSource`](skyport_core::ports::ChangeSource)).
//! - `change_dead_letters`: (processor, key) → (reason, time, JSON payload):
//!   changes a change-feed handler gave up on (undeliverable callbacks).
//! - `status_expiry` (settled time, id),
//!   `dead_letter_expiry` and `change_dead_letter_expiry` (time, key): what
//!   the [`retention`] sweeper removes, oldest first.
//! - `listing` (scope, accepted time, id): status documents newest first,
//!   for every delivery, by owner and by principal ([`listing`]).
//! - `meta`: `partitions` (fixed at creation), `receipt-key`, `indexed`
//!   (the retention and listing indexes built), and the upgrades done (`status-compact`,
//!   `status-rows`).

mod changes;
mod codec;
mod committer;
mod compact;
mod consumer;
mod faults;
mod group_commit;
mod leases;
mod listing;
pub mod log;
mod metrics;
mod migrate;
mod ops;
mod retention;
mod rows;
mod setup;
mod store;
mod sweep;
mod tables;
#[cfg(test)]
mod tests;
mod timers;

pub use self::consumer::EmbeddedConsumer;
pub use self::faults::Faults;
pub use self::group_commit::CommitStats;
pub use self::log::{AppendError, LogError};
pub use self::retention::{Retention, SweepError};
pub use self::setup::OpenError;
pub use self::store::EmbeddedStore;
pub use self::sweep::Swept;
