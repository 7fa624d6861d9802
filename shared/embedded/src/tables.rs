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
