//! The group-commit writer of the embedded store's database: status
//! documents, dead letters and leases (the stream log has a writer of its
//! own; both take their batches through `group_commit`).
//!
//! One thread owns every write to the database. It takes all the operations queued at the
//! moment it wakes (up to `max_batch`), applies them in queue order inside one
//! transaction, commits it with one fsync, and only then answers each caller.
//! An operation that arrives during a commit goes into the next one, so no
//! caller waits for more than the commit its operation is in. If a commit
//! fails, every operation in it fails and nothing of it is visible.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;

use redb::{Database, ReadableTable, Table, WriteTransaction};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use tokio::sync::{mpsc, oneshot, watch};

use crate::faults::Faults;
use crate::group_commit::{self, CommitStats};
use crate::listing::Listed;
use crate::retention::{self, Cutoffs, Swept};
use crate::tables::{
    CHANGE_DEAD_LETTER_EXPIRY, CHANGE_DEAD_LETTERS, DEAD_LETTER_EXPIRY, DEAD_LETTERS, LEASES,
    LISTING, STATUS, STATUS_CHANGE_OF, STATUS_CHANGES, STATUS_EXPIRY, STATUS_EXPIRY_OF,
};
use skyport_core::ports::{ChangeDeadLetter, DeadLetter};

/// A commit that did not happen; every operation in it failed.
#[derive(Debug, Clone, thiserror::Error)]
#[error("the embedded store could not commit")]
pub(crate) struct CommitFailed(#[source] Arc<redb::Error>);

pub(crate) type Reply = oneshot::Sender<Result<Applied, CommitFailed>>;

/// A write, with where to send its result once it is durable.
#[derive(Debug)]
pub(crate) struct Op {
    pub(crate) kind: OpKind,
    pub(crate) reply: Reply,
}

#[derive(Debug)]
pub(crate) enum OpKind {
    /// Write a status document if its stored version is `expected` (`None`:
    /// absent), listed as `listed`; `settled_ms`: when its retention window
    /// starts (Unix ms; `None` while it is not settled).
    PutStatus {
        id: String,
        expected: Option<u64>,
        body: Vec<u8>,
        listed: Listed,
        settled_ms: Option<i64>,
    },
    DeadLetter(DeadLetter),
    /// Forget the dead-lettered event at this position.
    RemoveDeadLetter {
        partition: u32,
        offset: u64,
    },
    ChangeDeadLetter(ChangeDeadLetter),
    /// Write a lease (an ownership claim or a checkpoint of the Event Hubs
    /// processor) if its stored version is as expected.
    PutLease {
        group: String,
        name: String,
        expected: Expected,
        body: Vec<u8>,
    },
    /// Remove what the retention windows have expired, up to a batch of each kind.
    Sweep(Cutoffs),
}

/// The version a conditional write expects to replace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Expected {
    Any,
    Absent,
    Version(u64),
}

/// The durable result of one operation.
#[derive(Debug)]
pub(crate) enum Applied {
    Written(u64),
    /// A lease's new version, and the commit's time in Unix milliseconds.
    Leased {
        version: u64,
        modified_ms: i64,
    },
    PreconditionFailed,
    Done,
    Swept(Swept),
}

/// Every table a commit writes, opened once per transaction.
pub(crate) struct Tables<'txn> {
    pub(crate) status: Table<'txn, &'static str, (u64, &'static [u8])>,
    pub(crate) dead_letters: Table<'txn, (u32, u64), (&'static str, &'static str, &'static [u8])>,
    pub(crate) leases: Table<'txn, (&'static str, &'static str), (u64, i64, &'static [u8])>,
    pub(crate) changes: Table<'txn, u64, &'static str>,
    pub(crate) change_of: Table<'txn, &'static str, u64>,
    pub(crate) change_dead_letters:
        Table<'txn, (&'static str, &'static str), (&'static str, &'static str, &'static [u8])>,
    pub(crate) status_expiry: Table<'txn, (i64, &'static str), ()>,
    pub(crate) status_expiry_of: Table<'txn, &'static str, i64>,
    pub(crate) dead_letter_expiry: Table<'txn, (i64, u32, u64), ()>,
    pub(crate) change_dead_letter_expiry: Table<'txn, (i64, &'static str, &'static str), ()>,
    pub(crate) listing: Table<'txn, (&'static str, i64, &'static str), ()>,
}

impl<'txn> Tables<'txn> {
    pub(crate) fn open(txn: &'txn WriteTransaction) -> Result<Self, redb::TableError> {
        Ok(Self {
            status: txn.open_table(STATUS)?,
            dead_letters: txn.open_table(DEAD_LETTERS)?,
            leases: txn.open_table(LEASES)?,
            changes: txn.open_table(STATUS_CHANGES)?,
            change_of: txn.open_table(STATUS_CHANGE_OF)?,
            change_dead_letters: txn.open_table(CHANGE_DEAD_LETTERS)?,
            status_expiry: txn.open_table(STATUS_EXPIRY)?,
            status_expiry_of: txn.open_table(STATUS_EXPIRY_OF)?,
            dead_letter_expiry: txn.open_table(DEAD_LETTER_EXPIRY)?,
            change_dead_letter_expiry: txn.open_table(CHANGE_DEAD_LETTER_EXPIRY)?,
            listing: txn.open_table(LISTING)?,
        })
    }

    /// Starts the retention window of document `id` at `settled_ms` (Unix
    /// ms, possibly later than now: a Scheduled delivery's deadline), or
    /// ends it (`None`).
    pub(crate) fn settle(&mut self, id: &str, settled_ms: Option<i64>) -> Result<(), redb::Error> {
        if let Some(previous) = self.status_expiry_of.remove(id)? {
            let previous = previous.value();
            self.status_expiry.remove((previous, id))?;
        }
        if let Some(at) = settled_ms {
            self.status_expiry.insert((at, id), ())?;
            self.status_expiry_of.insert(id, at)?;
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

struct Committer {
    db: Arc<Database>,
    max_batch: usize,
    faults: Faults,
    /// The last change number committed, for the change feed's readers.
    changes: watch::Sender<u64>,
    stats: Arc<CommitStats>,
}

/// Starts the committer thread; it stops when every sender of `ops` is gone and the queue is empty.
/// Each commit that writes a status document publishes its last change
/// number on `changes`, and each counts in `stats`.
pub(crate) fn spawn(
    db: Arc<Database>,
    ops: mpsc::Receiver<Op>,
    max_batch: usize,
    faults: Faults,
    changes: watch::Sender<u64>,
    stats: Arc<CommitStats>,
) -> std::io::Result<JoinHandle<()>> {
    let committer = Committer {
        db,
        max_batch: max_batch.max(1),
        faults,
        changes,
        stats,
    };
    std::thread::Builder::new()
        .name("skyport-committer".into())
        .spawn(move || committer.run(ops))
}

impl Committer {
    fn run(self, mut ops: mpsc::Receiver<Op>) {
        let mut batch = Vec::with_capacity(self.max_batch);
        while group_commit::next_batch(&mut ops, &mut batch, self.max_batch) {
            self.commit(&mut batch);
        }
    }

    fn commit(&self, batch: &mut Vec<Op>) {
        match self.apply(batch) {
            Ok(results) => {
                self.stats.commits.fetch_add(1, Ordering::Relaxed);
                self.stats
                    .operations
                    .fetch_add(batch.len() as u64, Ordering::Relaxed);
                for (op, result) in batch.drain(..).zip(results) {
                    // A caller that gave up waiting is no reason to stop.
                    let _ = op.reply.send(Ok(result));
                }
            }
            Err(e) => {
                tracing::error!(error = %e, operations = batch.len(), "An embedded store commit failed; its writes were refused.");
                let failed = CommitFailed(Arc::new(e));
                for op in batch.drain(..) {
                    let _ = op.reply.send(Err(failed.clone()));
                }
            }
        }
    }

    /// Applies `batch` in one transaction.
    fn apply(&self, batch: &[Op]) -> Result<Vec<Applied>, redb::Error> {
        self.faults.check().map_err(redb::Error::Io)?;
        let txn = self.db.begin_write()?;
        let mut results = Vec::with_capacity(batch.len());
        let txn_changes;
        {
            let mut tables = Tables::open(&txn)?;
            // Every status write takes the next number; a document's earlier
            // entry goes, so the sequence holds each document once.
            let first_change = tables.changes.last()?.map_or(1, |(seq, _)| seq.value() + 1);
            let mut next_change = first_change;
            let now_ms = unix_ms(OffsetDateTime::now_utc());
            for op in batch {
                results.push(match &op.kind {
                    OpKind::PutStatus {
                        id,
                        expected,
                        body,
                        listed,
                        settled_ms,
                    } => {
                        // A document listed before its owner was known is
                        // listed again, where its owner and accept time say.
                        let (current, relisted) = match tables.status.get(id.as_str())? {
                            Some(stored) => {
                                let (version, previous) = stored.value();
                                let relisted = listed.adds_to(previous).then(|| previous.to_vec());
                                (Some(version), relisted)
                            }
                            None => (None, None),
                        };
                        if current == *expected {
                            let version = current.map_or(1, |v| v + 1);
                            tables
                                .status
                                .insert(id.as_str(), (version, body.as_slice()))?;
                            if let Some(previous) =
                                tables.change_of.insert(id.as_str(), next_change)?
                            {
                                tables.changes.remove(previous.value())?;
                            }
                            tables.changes.insert(next_change, id.as_str())?;
                            next_change += 1;
                            tables.settle(id, *settled_ms)?;
                            if let Some(previous) = &relisted {
                                tables.unlist(id, previous)?;
                            }
                            if current.is_none() || relisted.is_some() {
                                tables.list(id, listed)?;
                            }
                            Applied::Written(version)
                        } else {
                            Applied::PreconditionFailed
                        }
                    }
                    OpKind::DeadLetter(letter) => {
                        tables.dead_letter(letter)?;
                        Applied::Done
                    }
                    OpKind::RemoveDeadLetter { partition, offset } => {
                        if let Some(removed) = tables.dead_letters.remove((*partition, *offset))? {
                            let at = unix_ms_of(removed.value().1);
                            drop(removed);
                            tables
                                .dead_letter_expiry
                                .remove((at, *partition, *offset))?;
                        }
                        Applied::Done
                    }
                    OpKind::ChangeDeadLetter(letter) => {
                        tables.change_dead_letter(letter)?;
                        Applied::Done
                    }
                    OpKind::PutLease {
                        group,
                        name,
                        expected,
                        body,
                    } => {
                        let key = (group.as_str(), name.as_str());
                        let current = tables.leases.get(key)?.map(|v| v.value().0);
                        let holds = match expected {
                            Expected::Any => true,
                            Expected::Absent => current.is_none(),
                            Expected::Version(version) => current == Some(*version),
                        };
                        if holds {
                            let version = current.map_or(1, |v| v + 1);
                            tables
                                .leases
                                .insert(key, (version, now_ms, body.as_slice()))?;
                            Applied::Leased {
                                version,
                                modified_ms: now_ms,
                            }
                        } else {
                            Applied::PreconditionFailed
                        }
                    }
                    OpKind::Sweep(cutoffs) => {
                        Applied::Swept(retention::sweep(&mut tables, cutoffs)?)
                    }
                });
            }
            txn_changes = (next_change > first_change).then_some(next_change - 1);
        }
        txn.commit()?;
        if let Some(last) = txn_changes {
            self.changes.send_replace(last);
        }
        Ok(results)
    }
}
