//! Upgrading a data directory whose status documents earlier versions kept
//! as plain JSON in the table `status`: at start, each moves to the table
//! `documents` in the compact form of [`codec`], with its version (so every
//! ETag a client holds still matches) and without a change-feed entry (the
//! document did not change). They move in id order, so the new table's
//! leaves are full, and the file is then compacted, so that the space the
//! old bodies took goes back to the disk.
//!
//! Each batch moves in one transaction (written to `documents`, removed
//! from `status`), and `meta`'s `status-compact` is set with the last: a
//! crash in between leaves every document in one of the two tables, and the
//! next start goes on where this one stopped. Nothing else reads the
//! database until the upgrade is done.

use redb::{Database, ReadableDatabase, ReadableTableMetadata, TableDefinition, TableError};

use crate::codec;
use crate::rows::DOCUMENTS;
use crate::tables::META;

/// Where earlier versions kept status documents, as plain JSON.
const PLAIN: TableDefinition<&str, (u64, &[u8])> = TableDefinition::new("status");
/// Set once every document is compact.
const DONE: &str = "status-compact";
/// Documents moved per transaction.
const BATCH: usize = 10_000;

/// What the upgrade did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Compacted {
    /// Documents moved in the compact form.
    pub(crate) documents: u64,
    /// Bodies that do not decode, moved as they were (their reads answer
    /// that they are corrupt, as before).
    pub(crate) unreadable: u64,
}

/// Moves every plain status document of `db` into the compact table, once;
/// `None` when an earlier start did.
pub(crate) fn run(db: &mut Database) -> Result<Option<Compacted>, redb::Error> {
    {
        let txn = db.begin_read()?;
        match txn.open_table(META) {
            Ok(meta) if meta.get(DONE)?.is_some() => return Ok(None),
            Ok(_) | Err(TableError::TableDoesNotExist(_)) => {}
            Err(e) => return Err(e.into()),
        }
    }
    {
        let txn = db.begin_read()?;
        match txn.open_table(PLAIN) {
            Ok(plain) => tracing::info!(
                documents = plain.len()?,
                "Moving the status documents an earlier version kept as plain JSON into the compact form, once."
            ),
            Err(TableError::TableDoesNotExist(_)) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let mut done = Compacted::default();
    loop {
        let txn = db.begin_write()?;
        let finished = {
            let mut plain = match txn.open_table(PLAIN) {
                Ok(table) => Some(table),
                Err(TableError::TableDoesNotExist(_)) => None,
                Err(e) => return Err(e.into()),
            };
            let mut moved = 0;
            if let Some(plain) = &mut plain {
                let mut status = txn.open_table(DOCUMENTS)?;
                while moved < BATCH {
                    let Some((id, value)) = plain.pop_first()? else {
                        break;
                    };
                    let (version, body) = value.value();
                    let compact = match codec::decode(body) {
                        Ok(document) => {
                            done.documents += 1;
                            codec::encode(&document)
                        }
                        Err(_) => {
                            done.unreadable += 1;
                            body.to_vec()
                        }
                    };
                    status.insert(id.value(), (version, compact.as_slice()))?;
                    moved += 1;
                }
            }
            moved < BATCH
        };
        if finished {
            txn.delete_table(PLAIN)?;
            txn.open_table(META)?.insert(DONE, [1u8].as_slice())?;
        }
        txn.commit()?;
        if finished {
            break;
        }
    }
    // Each pass moves pages towards the start of the file and gives back
    // what is free at its end; it answers false once none moved.
    if done.documents + done.unreadable > 0 {
        while db.compact()? {}
    }
    Ok(Some(done))
}

#[cfg(test)]
mod tests;
