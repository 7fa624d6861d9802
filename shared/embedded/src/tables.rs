//! The tables of the embedded store's database file (the crate's
//! documentation says what each maps).

use redb::{Table, TableDefinition, WriteTransaction};
use skyport_core::ports::{ChangeDeadLetter, DeadLetter};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// Delivery id → its [`Stored`] status: version, entry in `status_changes`,
/// start of its retention window, compact document ([`crate::codec`]).
/// One row holds what a write reads and replaces, so that a status write
/// touches one randomly keyed table (the others are keyed by time or
/// sequence, and a write lands on their last pages).
pub(crate) const STATUS: TableDefinition<&str, Stored> = TableDefinition::new("status_records");

/// A status row: (version, its number in `status_changes` — none for a
/// document an upgrade moved unchanged —, the Unix ms its retention window
/// starts at — none while it is not settled —, its compact body).
pub(crate) type Stored = (u64, Option<u64>, Option<i64>, &'static [u8]);
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
/// (processor, key) → (reason, time, JSON payload): changes a change-feed
/// handler gave up on.
pub(crate) const CHANGE_DEAD_LETTERS: TableDefinition<(&str, &str), (&str, &str, &[u8])> =
    TableDefinition::new("change_dead_letters");
/// (Unix ms of the write that settled it, delivery id) → (): settled status
/// documents (terminal, their callback delivered or given up on) by when they
/// settled, which the retention sweeper removes oldest first.
pub(crate) const STATUS_EXPIRY: TableDefinition<(i64, &str), ()> =
    TableDefinition::new("status_expiry");
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
/// Delivery id → the Unix ms its steps run at: the Waiting documents, so
/// that a write finds the timer it moves or removes.
pub(crate) const WAITING: TableDefinition<&str, i64> = TableDefinition::new("waiting");
/// (Unix ms its steps run at, delivery id) → (the document's revision then,
/// whether it is in the expedited lane): the timers of Waiting documents,
/// earliest first.
pub(crate) const TIMERS: TableDefinition<(i64, &str), (u32, bool)> = TableDefinition::new("timers");

/// Every table a commit writes, opened once per transaction.
pub(crate) struct Tables<'txn> {
    pub(crate) status: Table<'txn, &'static str, Stored>,
    pub(crate) dead_letters: Table<'txn, (u32, u64), (&'static str, &'static str, &'static [u8])>,
    pub(crate) leases: Table<'txn, (&'static str, &'static str), (u64, i64, &'static [u8])>,
    pub(crate) changes: Table<'txn, u64, &'static str>,
    pub(crate) change_dead_letters:
        Table<'txn, (&'static str, &'static str), (&'static str, &'static str, &'static [u8])>,
    pub(crate) status_expiry: Table<'txn, (i64, &'static str), ()>,
    pub(crate) dead_letter_expiry: Table<'txn, (i64, u32, u64), ()>,
    pub(crate) change_dead_letter_expiry: Table<'txn, (i64, &'static str, &'static str), ()>,
    pub(crate) listing: Table<'txn, (&'static str, i64, &'static str), ()>,
    pub(crate) waiting: Table<'txn, &'static str, i64>,
    pub(crate) timers: Table<'txn, (i64, &'static str), (u32, bool)>,
}

impl<'txn> Tables<'txn> {
    pub(crate) fn open(txn: &'txn WriteTransaction) -> Result<Self, redb::TableError> {
        Ok(Self {
            status: txn.open_table(STATUS)?,
            dead_letters: txn.open_table(DEAD_LETTERS)?,
            leases: txn.open_table(LEASES)?,
            changes: txn.open_table(STATUS_CHANGES)?,
            change_dead_letters: txn.open_table(CHANGE_DEAD_LETTERS)?,
            status_expiry: txn.open_table(STATUS_EXPIRY)?,
            dead_letter_expiry: txn.open_table(DEAD_LETTER_EXPIRY)?,
            change_dead_letter_expiry: txn.open_table(CHANGE_DEAD_LETTER_EXPIRY)?,
            listing: txn.open_table(LISTING)?,
            waiting: txn.open_table(WAITING)?,
            timers: txn.open_table(TIMERS)?,
        })
    }

    /// Sets, moves or removes the timer of document `id`: `due` is when its
    /// steps run (Unix ms), its revision and whether it is expedited, while
    /// it is Waiting.
    pub(crate) fn time(
        &mut self,
        id: &str,
        due: Option<(i64, u32, bool)>,
    ) -> Result<(), redb::Error> {
        let previous = self.waiting.remove(id)?.map(|at| at.value());
        if let Some(previous) = previous {
            self.timers.remove((previous, id))?;
        }
        if let Some((at, revision, expedited)) = due {
            self.waiting.insert(id, at)?;
            self.timers.insert((at, id), (revision, expedited))?;
        }
        Ok(())
    }

    /// Moves the retention window of document `id` from `previous` to
    /// `settled_ms` (Unix ms, possibly later than now: a Scheduled
    /// delivery's deadline; `None`: not settled); the row keeps which.
    pub(crate) fn settle(
        &mut self,
        id: &str,
        previous: Option<i64>,
        settled_ms: Option<i64>,
    ) -> Result<(), redb::Error> {
        if previous == settled_ms {
            return Ok(());
        }
        if let Some(previous) = previous {
            self.status_expiry.remove((previous, id))?;
        }
        if let Some(at) = settled_ms {
            self.status_expiry.insert((at, id), ())?;
        }
        Ok(())
    }

    /// Keeps a dead-lettered event, indexed by when.
    pub(crate) fn dead_letter(&mut self, letter: &DeadLetter) -> Result<(), redb::Error> {
        let at = letter.at.format(&Rfc3339).unwrap_or_default();
        let key = (letter.partition, letter.offset);
        if let Some(previous) = self.dead_letters.insert(
            key,
            (letter.reason.as_str(), at.as_str(), letter.payload.as_ref()),
        )? {
            let previous = unix_ms_of(previous.value().1);
            self.dead_letter_expiry.remove((previous, key.0, key.1))?;
        }
        self.dead_letter_expiry
            .insert((unix_ms(letter.at), key.0, key.1), ())?;
        Ok(())
    }

    /// Keeps a dead-lettered change, indexed by when.
    pub(crate) fn change_dead_letter(
        &mut self,
        letter: &ChangeDeadLetter,
    ) -> Result<(), redb::Error> {
        let at = letter.at.format(&Rfc3339).unwrap_or_default();
        let payload = letter.payload.to_string();
        let key = (letter.processor.as_str(), letter.key.as_str());
        if let Some(previous) = self.change_dead_letters.insert(
            key,
            (letter.reason.as_str(), at.as_str(), payload.as_bytes()),
        )? {
            let previous = unix_ms_of(previous.value().1);
            self.change_dead_letter_expiry
                .remove((previous, key.0, key.1))?;
        }
        self.change_dead_letter_expiry
            .insert((unix_ms(letter.at), key.0, key.1), ())?;
        Ok(())
    }
}

pub(crate) fn unix_ms(at: OffsetDateTime) -> i64 {
    i64::try_from(at.unix_timestamp_nanos() / 1_000_000).unwrap_or(i64::MAX)
}

/// The Unix ms of a stored RFC 3339 time (the epoch when it cannot be read,
/// so that it is swept first).
pub(crate) fn unix_ms_of(at: &str) -> i64 {
    OffsetDateTime::parse(at, &Rfc3339).map_or(0, unix_ms)
}
