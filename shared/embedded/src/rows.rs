//! Upgrading a data directory whose status documents earlier versions kept
//! in the table `documents`, with two reverse indexes beside them:
//! `status_change_of` (id → its number in `status_changes`) and
//! `status_expiry_of` (id → the start of its retention window). At start,
//! each document moves to `status_records` with both in its row, and the
//! three old tables go: a status write then touches one randomly keyed
//! table instead of three.
//!
//! Documents move in id order, a batch per transaction (written to the new
//! table, removed from the old ones), and `meta`'s `status-rows` is set with
//! the last: a crash in between leaves every document in one of the two
//! tables, and the next start goes on where this one stopped. Nothing else
//! reads the database until the upgrade is done. The version, the change
//! number and the retention window move as they were, so ETags, change-feed
//! checkpoints and retention are unchanged by it.

use redb::{Database, ReadableDatabase, ReadableTableMetadata, TableDefinition, TableError};

use crate::tables::{META, STATUS};

/// Where earlier versions kept status documents: id → (version, compact body).
pub(crate) const DOCUMENTS: TableDefinition<&str, (u64, &[u8])> = TableDefinition::new("documents");
/// Their reverse index into `status_changes`.
pub(crate) const CHANGE_OF: TableDefinition<&str, u64> = TableDefinition::new("status_change_of");
/// Their reverse index into `status_expiry`.
pub(crate) const EXPIRY_OF: TableDefinition<&str, i64> = TableDefinition::new("status_expiry_of");
/// Set once every document is in `status_records`.
pub(crate) const DONE: &str = "status-rows";
/// Documents moved per transaction.
const BATCH: usize = 10_000;

/// Moves every document of `db` into `status_records`, once; answers how
/// many moved, `None` when an earlier start did.
pub(crate) fn run(db: &mut Database) -> Result<Option<u64>, redb::Error> {
    {
        let txn = db.begin_read()?;
        match txn.open_table(META) {
            Ok(meta) if meta.get(DONE)?.is_some() => return Ok(None),
            Ok(_) | Err(TableError::TableDoesNotExist(_)) => {}
            Err(e) => return Err(e.into()),
        }
        match txn.open_table(DOCUMENTS) {
            Ok(documents) => tracing::info!(
                documents = documents.len()?,
                "Moving each status document into one row with its change number and retention window, once."
            ),
            Err(TableError::TableDoesNotExist(_)) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let mut moved = 0;
    loop {
        let txn = db.begin_write()?;
        let finished = {
            let mut documents = match txn.open_table(DOCUMENTS) {
                Ok(table) => Some(table),
                Err(TableError::TableDoesNotExist(_)) => None,
                Err(e) => return Err(e.into()),
            };
            let mut batch = 0;
            if let Some(documents) = &mut documents {
                let mut change_of = txn.open_table(CHANGE_OF)?;
                let mut expiry_of = txn.open_table(EXPIRY_OF)?;
                let mut status = txn.open_table(STATUS)?;
                while batch < BATCH {
                    let Some((id, value)) = documents.pop_first()? else {
                        break;
                    };
                    let id = id.value();
                    let (version, body) = value.value();
                    let change = change_of.remove(id)?.map(|seq| seq.value());
                    let settled = expiry_of.remove(id)?.map(|at| at.value());
                    status.insert(id, (version, change, settled, body))?;
                    batch += 1;
                }
            }
            moved += batch as u64;
            batch < BATCH
        };
        if finished {
            txn.delete_table(DOCUMENTS)?;
            txn.delete_table(CHANGE_OF)?;
            txn.delete_table(EXPIRY_OF)?;
            txn.open_table(META)?.insert(DONE, [1u8].as_slice())?;
        }
        txn.commit()?;
        if finished {
            break;
        }
    }
    // The old tables' pages are free: give them back to the disk.
    if moved > 0 {
        while db.compact()? {}
    }
    Ok(Some(moved))
}

#[cfg(test)]
mod tests;
