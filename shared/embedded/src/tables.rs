//! The tables of the embedded store's database file (the crate's
//! documentation says what each maps).

use redb::TableDefinition;

pub(crate) const STATUS: TableDefinition<&str, (u64, &[u8])> = TableDefinition::new("status");
pub(crate) const DEAD_LETTERS: TableDefinition<(u32, u64), (&str, &str, &[u8])> =
    TableDefinition::new("dead_letters");
pub(crate) const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
pub(crate) const LEASES: TableDefinition<(&str, &str), (u64, i64, &[u8])> =
    TableDefinition::new("lease_groups");
pub(crate) const RESERVATIONS: TableDefinition<&str, (i64, &[u8])> =
    TableDefinition::new("reservations");
pub(crate) const RESERVATION_EXPIRY: TableDefinition<(i64, &str), ()> =
    TableDefinition::new("reservation_expiry");
/// The status change sequence: sequence number → delivery id, one entry per
/// document (its latest write), so reading after a number reads every
/// document written since.
pub(crate) const STATUS_CHANGES: TableDefinition<u64, &str> =
    TableDefinition::new("status_changes");
/// Delivery id → its entry in `status_changes`.
pub(crate) const STATUS_CHANGE_OF: TableDefinition<&str, u64> =
    TableDefinition::new("status_change_of");
/// (processor, key) → (reason, time, JSON payload): changes a change-feed
/// handler gave up on.
pub(crate) const CHANGE_DEAD_LETTERS: TableDefinition<(&str, &str), (&str, &str, &[u8])> =
    TableDefinition::new("change_dead_letters");
/// (Unix ms of the write that settled it, delivery id) → (): settled status
/// documents (terminal, their callback delivered or given up on) by when they
/// settled, which the retention sweeper removes oldest first.
pub(crate) const STATUS_EXPIRY: TableDefinition<(i64, &str), ()> =
    TableDefinition::new("status_expiry");
/// Delivery id → its entry in `status_expiry`.
pub(crate) const STATUS_EXPIRY_OF: TableDefinition<&str, i64> =
    TableDefinition::new("status_expiry_of");
/// (Unix ms, partition, offset) → (): dead-lettered events by when.
pub(crate) const DEAD_LETTER_EXPIRY: TableDefinition<(i64, u32, u64), ()> =
    TableDefinition::new("dead_letter_expiry");
/// (Unix ms, processor, key) → (): dead-lettered changes by when.
pub(crate) const CHANGE_DEAD_LETTER_EXPIRY: TableDefinition<(i64, &str, &str), ()> =
    TableDefinition::new("change_dead_letter_expiry");
/// (scope, `createdAt` in Unix ms, delivery id) → (): status documents for
/// listing, newest last. A document is under the scope `""` (all), `o:` and
/// its owner, and `p:` and its principal.
pub(crate) const LISTING: TableDefinition<(&str, i64, &str), ()> = TableDefinition::new("listing");
