//! Upgrading a data directory written before the segment log, when the
//! stream lived in the database's `log`, `heads` and `checkpoints` tables.
//!
//! The events the database still holds (those not yet checkpointed) move
//! into a new log with the same offsets, the checkpoints with them (a
//! partition's next offset is its last event's, or its checkpoint's, plus
//! one, as it was). The log
//! is built under a temporary name and renamed into place once durable; the
//! old tables are dropped only after that, so a crash at any point leaves
//! either the old store whole or the new log whole.

use std::os::unix::fs::FileExt;
use std::path::Path;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition, TableHandle};

use crate::faults::Faults;
use crate::log::frame::{self, END_OF_COMMIT};
use crate::log::{Checkpoints, segment};

const LOG: TableDefinition<(u32, u64), &[u8]> = TableDefinition::new("log");
const HEADS: TableDefinition<u32, u64> = TableDefinition::new("heads");
const CHECKPOINTS: TableDefinition<(&str, u32), u64> = TableDefinition::new("checkpoints");

/// Why an upgrade did not finish.
#[derive(Debug, thiserror::Error)]
pub(crate) enum MigrateError {
    #[error(transparent)]
    Database(#[from] redb::Error),
    #[error("cannot write the new stream directory {path}")]
    Io {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl From<redb::TransactionError> for MigrateError {
    fn from(e: redb::TransactionError) -> Self {
        Self::Database(e.into())
    }
}

impl From<redb::TableError> for MigrateError {
    fn from(e: redb::TableError) -> Self {
        Self::Database(e.into())
    }
}

impl From<redb::StorageError> for MigrateError {
    fn from(e: redb::StorageError) -> Self {
        Self::Database(e.into())
    }
}

impl From<redb::CommitError> for MigrateError {
    fn from(e: redb::CommitError) -> Self {
        Self::Database(e.into())
    }
}

/// Moves the stream out of `db` into a segment log at `dir`, if `db` still holds one.
/// Answers how many events moved.
pub(crate) fn run(
    db: &Database,
    dir: &Path,
    partitions: u32,
    segment_size: u64,
) -> Result<Option<u64>, MigrateError> {
    let exists = {
        let txn = db.begin_read()?;
        txn.list_tables()?.any(|table| table.name() == LOG.name())
    };
    if !exists {
        return Ok(None);
    }
    let mut moved = 0;
    if !dir.exists() {
        let building = dir.with_extension("upgrading");
        let io = |source| MigrateError::Io {
            path: building.clone(),
            source,
        };
        if building.exists() {
            std::fs::remove_dir_all(&building).map_err(io)?;
        }
        std::fs::create_dir_all(&building).map_err(io)?;
        let txn = db.begin_read()?;
        let mut checkpoints = Checkpoints::default();
        for entry in txn.open_table(CHECKPOINTS)?.iter()? {
            let (key, offset) = entry?;
            let (group, partition) = key.value();
            checkpoints.advance(group, partition, offset.value());
        }
        let log = txn.open_table(LOG)?;
        let mut writer = Builder::new(&building, partitions, segment_size).map_err(io)?;
        for partition in 0..partitions {
            for entry in log.range((partition, 0)..(partition, u64::MAX))? {
                let (key, payload) = entry?;
                let offset = key.value().1;
                writer
                    .push(partition, offset, payload.value())
                    .map_err(io)?;
                moved += 1;
            }
        }
        writer.finish().map_err(io)?;
        checkpoints
            .save(&building, &Faults::default())
            .map_err(io)?;
        std::fs::rename(&building, dir).map_err(io)?;
        if let Some(parent) = dir.parent() {
            segment::sync_dir(parent).map_err(io)?;
        }
    }
    let txn = db.begin_write()?;
    txn.delete_table(LOG)?;
    txn.delete_table(HEADS)?;
    txn.delete_table(CHECKPOINTS)?;
    txn.commit()?;
    Ok(Some(moved))
}

/// Writes records into fresh segments, one commit per segment.
struct Builder<'a> {
    dir: &'a Path,
    partitions: u32,
    segment_size: u64,
    id: u64,
    commit: u64,
    buffer: Vec<u8>,
    last_at: Option<usize>,
}

impl<'a> Builder<'a> {
    fn new(dir: &'a Path, partitions: u32, segment_size: u64) -> std::io::Result<Self> {
        Ok(Self {
            dir,
            partitions,
            segment_size,
            id: 1,
            commit: 1,
            buffer: Vec::new(),
            last_at: None,
        })
    }

    fn push(&mut self, partition: u32, offset: u64, payload: &[u8]) -> std::io::Result<()> {
        let room = self.segment_size - segment::DATA_START as u64;
        if (self.buffer.len() + frame::framed_len(payload.len())) as u64 > room {
            self.flush()?;
        }
        self.last_at = Some(self.buffer.len());
        frame::encode(&mut self.buffer, partition, 0, offset, self.commit, payload);
        Ok(())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let Some(last_at) = self.last_at.take() else {
            return Ok(());
        };
        frame::set_flags(&mut self.buffer[last_at..], END_OF_COMMIT);
        let size = self
            .segment_size
            .max((self.buffer.len() + segment::DATA_START) as u64);
        let file = segment::create(self.dir, self.id, self.partitions, size, &Faults::default())?;
        file.write_all_at(&self.buffer, segment::DATA_START as u64)?;
        file.sync_data()?;
        self.buffer.clear();
        self.id += 1;
        self.commit += 1;
        Ok(())
    }

    fn finish(mut self) -> std::io::Result<()> {
        self.flush()
    }
}
