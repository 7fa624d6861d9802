//! The group-commit writer of the embedded store's database: status
//! documents, dead letters and leases (the stream log has a writer of its
//! own; both take their batches through `group_commit`).
//!
//! One thread owns every write to the database. It takes all the operations queued at the
//! moment it wakes (up to `max_batch`; when that is many, it waits
//! `embedded.commit_delay_ms` and takes those queued meanwhile too, so that a
//! busy store makes fewer, larger commits), applies them in queue order inside one
//! transaction, commits it with one fsync, and only then answers each caller.
//! An operation that arrives during a commit goes into the next one, so no
//! caller waits for more than the commit its operation is in. If a commit
//! fails, every operation in it fails and nothing of it is visible.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;
use std::time::Instant;

use redb::{Database, ReadableTable};
use time::OffsetDateTime;
use tokio::sync::{mpsc, watch};

use crate::faults::Faults;
use crate::group_commit::{self, CommitStats, Delay};
use crate::ops::{Applied, CommitFailed, Expected, Op, OpKind};
use crate::sweep;
use crate::tables::{Tables, unix_ms, unix_ms_of};

struct Committer {
    db: Arc<Database>,
    max_batch: usize,
    delay: Delay,
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
    delay: Delay,
    faults: Faults,
    changes: watch::Sender<u64>,
    stats: Arc<CommitStats>,
) -> std::io::Result<JoinHandle<()>> {
    let committer = Committer {
        db,
        max_batch: max_batch.max(1),
        delay,
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
        while group_commit::next_delayed_batch(&mut ops, &mut batch, self.max_batch, self.delay) {
            self.commit(&mut batch);
        }
    }

    fn commit(&self, batch: &mut Vec<Op>) {
        let started = Instant::now();
        let applied = self.apply(batch);
        self.stats.busy(started.elapsed());
        match applied {
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
                        due,
                    } => {
                        // A document listed before its owner was known is
                        // listed again, where its owner and accept time say.
                        let (current, change, settled, relisted) =
                            match tables.status.get(id.as_str())? {
                                Some(stored) => {
                                    let (version, change, settled, previous) = stored.value();
                                    let relisted =
                                        listed.adds_to(previous).then(|| previous.to_vec());
                                    (Some(version), change, settled, relisted)
                                }
                                None => (None, None, None, None),
                            };
                        if current == *expected {
                            let version = current.map_or(1, |v| v + 1);
                            tables.status.insert(
                                id.as_str(),
                                (version, Some(next_change), *settled_ms, body.as_slice()),
                            )?;
                            if let Some(previous) = change {
                                tables.changes.remove(previous)?;
                            }
                            tables.changes.insert(next_change, id.as_str())?;
                            next_change += 1;
                            tables.settle(id, settled, *settled_ms)?;
                            tables.time(id, *due)?;
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
                    OpKind::Sweep(cutoffs) => Applied::Swept(sweep::sweep(&mut tables, cutoffs)?),
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
