//! Making a database file ready at start: upgrading what earlier versions
//! left ([`compact`], [`rows`], [`migrate`]), creating the tables, checking the
//! partition count and keeping the receipt key.

use std::path::{Path, PathBuf};

use redb::{Database, ReadableTable};
use skyport_core::ports::BoxError;

use crate::log::LogError;
use crate::tables::{DEAD_LETTERS, LEASES, META, RESERVATION_EXPIRY, RESERVATIONS, STATUS};
use crate::{compact, migrate, rows, sweep};

pub(crate) const RECEIPT_KEY_LEN: usize = 32;

/// Why the embedded store did not open.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("cannot create the data directory {path}")]
    CreateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the database {path} is open in another process (the embedded store belongs to one process)"
    )]
    AlreadyOpen { path: PathBuf },
    #[error(
        "the data in {path} was created with {stored} partitions but {configured} are configured; \
         keep stream.partitions = {stored} or use another embedded.data_dir"
    )]
    PartitionMismatch {
        path: PathBuf,
        stored: u32,
        configured: u32,
    },
    #[error("cannot open the database {path}")]
    Storage {
        path: PathBuf,
        #[source]
        source: BoxError,
    },
    #[error(
        "cannot move the stream of {path} (written by an earlier version, in the database) into \
         the segment log; free space or fix what the cause names and start again, nothing was lost"
    )]
    Upgrade {
        path: PathBuf,
        #[source]
        source: BoxError,
    },
    #[error(
        "cannot rewrite the status documents of {path} (kept as plain JSON by an earlier version) \
         in the compact form; free space or fix what the cause names and start again, nothing was lost"
    )]
    Compact {
        path: PathBuf,
        #[source]
        source: BoxError,
    },
    #[error(
        "cannot move the status documents of {path} (kept in three tables by an earlier version) \
         into one row each; free space or fix what the cause names and start again, nothing was lost"
    )]
    Rows {
        path: PathBuf,
        #[source]
        source: BoxError,
    },
    #[error(transparent)]
    Stream(#[from] LogError),
}

/// Upgrades `db` (at `path`, its stream at `stream`) and sets it up;
/// answers the receipt key.
pub(crate) fn prepare(
    db: &mut Database,
    path: &Path,
    stream: &Path,
    partitions: u32,
    segment_size: u64,
) -> Result<[u8; RECEIPT_KEY_LEN], OpenError> {
    match compact::run(db) {
        Ok(Some(done)) if done.documents + done.unreadable > 0 => tracing::warn!(
            path = %path.display(),
            documents = done.documents,
            unreadable = done.unreadable,
            "Rewrote the status documents an earlier version kept as plain JSON in the compact form, and compacted the file."
        ),
        Ok(_) => {}
        Err(e) => {
            return Err(OpenError::Compact {
                path: path.to_path_buf(),
                source: Box::new(e),
            });
        }
    }
    match rows::run(db) {
        Ok(Some(moved)) if moved > 0 => tracing::warn!(
            path = %path.display(),
            documents = moved,
            "Moved each status document into one row with its change number and retention window, and compacted the file."
        ),
        Ok(_) => {}
        Err(e) => {
            return Err(OpenError::Rows {
                path: path.to_path_buf(),
                source: Box::new(e),
            });
        }
    }
    let receipt_key = initialize(db, partitions).map_err(|e| match e {
        InitError::Storage(source) => OpenError::Storage {
            path: path.to_path_buf(),
            source: Box::new(source),
        },
        InitError::PartitionMismatch(stored) => OpenError::PartitionMismatch {
            path: path.to_path_buf(),
            stored,
            configured: partitions,
        },
    })?;
    match migrate::run(db, stream, partitions, segment_size) {
        Ok(Some(moved)) => tracing::warn!(
            path = %path.display(),
            events = moved,
            "Moved the stream of a data directory written by an earlier version into the segment log."
        ),
        Ok(None) => {}
        Err(e) => {
            return Err(OpenError::Upgrade {
                path: path.to_path_buf(),
                source: Box::new(e),
            });
        }
    }
    Ok(receipt_key)
}

enum InitError {
    Storage(redb::Error),
    PartitionMismatch(u32),
}

impl<E: Into<redb::Error>> From<E> for InitError {
    fn from(e: E) -> Self {
        Self::Storage(e.into())
    }
}

/// Creates the tables and checks the partition count; answers the receipt key.
fn initialize(db: &Database, partitions: u32) -> Result<[u8; RECEIPT_KEY_LEN], InitError> {
    let txn = db.begin_write()?;
    let receipt_key = {
        let mut meta = txn.open_table(META)?;
        let stored = meta
            .get("partitions")?
            .and_then(|v| <[u8; 4]>::try_from(v.value()).ok())
            .map(u32::from_be_bytes);
        match stored {
            Some(stored) if stored != partitions => {
                return Err(InitError::PartitionMismatch(stored));
            }
            Some(_) => {}
            None => {
                meta.insert("partitions", partitions.to_be_bytes().as_slice())?;
            }
        }
        let stored_key = meta
            .get("receipt-key")?
            .and_then(|v| <[u8; RECEIPT_KEY_LEN]>::try_from(v.value()).ok());
        let receipt_key = match stored_key {
            Some(key) => key,
            None => {
                let mut key = [0u8; RECEIPT_KEY_LEN];
                getrandom::fill(&mut key).map_err(|e| {
                    InitError::Storage(redb::Error::Io(std::io::Error::other(e.to_string())))
                })?;
                meta.insert("receipt-key", key.as_slice())?;
                key
            }
        };
        txn.open_table(STATUS)?;
        txn.open_table(DEAD_LETTERS)?;
        txn.open_table(LEASES)?;
        txn.open_table(RESERVATIONS)?;
        txn.open_table(RESERVATION_EXPIRY)?;
        receipt_key
    };
    if let Some(settled) = sweep::index_existing(&txn)? {
        tracing::info!(
            settled,
            "Indexed the embedded store's status documents and dead letters for retention."
        );
    }
    txn.commit()?;
    Ok(receipt_key)
}
