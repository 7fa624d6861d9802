//! The group-commit writer of the embedded store.
//!
//! One thread owns every write. It takes all the operations queued at the
//! moment it wakes (up to `max_batch`), applies them in queue order inside one
//! transaction, commits it with one fsync, and only then answers each caller.
//! An operation that arrives during a commit goes into the next one, so no
//! caller waits for more than the commit its operation is in. If a commit
//! fails, every operation in it fails and nothing of it is visible.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;

use bytes::Bytes;
use redb::{Database, ReadableTable};
use time::format_description::well_known::Rfc3339;
use tokio::sync::{mpsc, oneshot, watch};

use skyport_core::ports::DeadLetter;
use skyport_runtime::metrics::{self, StreamLabels};

use crate::tables::{
    CHECKPOINTS, DEAD_LETTERS, HEADS, LEASES, LOG, RESERVATION_EXPIRY, RESERVATIONS, STATUS,
};

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
    Append {
        partition: u32,
        payload: Bytes,
    },
    /// Write a status document if its stored version is `expected` (`None`: absent).
    PutStatus {
        id: String,
        expected: Option<u64>,
        body: Vec<u8>,
    },
    Checkpoint {
        group: String,
        partition: u32,
        offset: u64,
    },
    DeadLetter(DeadLetter),
    /// Write a lease (an ownership claim or a checkpoint of the Event Hubs
    /// processor) if its stored version is as expected.
    PutLease {
        group: String,
        name: String,
        expected: Expected,
        body: Vec<u8>,
    },
    /// Store a reservation unless an unexpired one holds its id.
    Reserve {
        id: String,
        expires_ms: i64,
        body: Vec<u8>,
    },
    /// Forget a reservation if it is still `body`.
    Release {
        id: String,
        body: Vec<u8>,
    },
}

/// How many expired reservations a commit that reserves also forgets.
const PURGE_PER_COMMIT: usize = 64;

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
    Appended(u64),
    Written(u64),
    /// A lease's new version, and the commit's time in Unix milliseconds.
    Leased {
        version: u64,
        modified_ms: i64,
    },
    PreconditionFailed,
    Done,
    /// The reservation was stored.
    Reserved,
    /// An unexpired reservation holds the id; this is its body.
    Held(Vec<u8>),
}

/// The `stream` label of this stream's publish metrics.
const STREAM: &str = "embedded";

/// How much group commit is grouping: operations per durable commit.
#[derive(Debug, Default)]
pub struct CommitStats {
    pub commits: AtomicU64,
    pub operations: AtomicU64,
}

struct Committer {
    db: Arc<Database>,
    next_offsets: Vec<u64>,
    heads: Vec<watch::Sender<u64>>,
    max_batch: usize,
    stats: Arc<CommitStats>,
}

/// Starts the committer thread; it stops when every sender of `ops` is gone and the queue is empty.
pub(crate) fn spawn(
    db: Arc<Database>,
    ops: mpsc::Receiver<Op>,
    next_offsets: Vec<u64>,
    heads: Vec<watch::Sender<u64>>,
    max_batch: usize,
    stats: Arc<CommitStats>,
) -> std::io::Result<JoinHandle<()>> {
    let committer = Committer {
        db,
        next_offsets,
        heads,
        max_batch: max_batch.max(1),
        stats,
    };
    std::thread::Builder::new()
        .name("skyport-committer".into())
        .spawn(move || committer.run(ops))
}

impl Committer {
    fn run(mut self, mut ops: mpsc::Receiver<Op>) {
        let mut batch = Vec::with_capacity(self.max_batch);
        while let Some(op) = ops.blocking_recv() {
            batch.push(op);
            while batch.len() < self.max_batch {
                match ops.try_recv() {
                    Ok(op) => batch.push(op),
                    Err(_) => break,
                }
            }
            self.commit(&mut batch);
        }
    }

    fn commit(&mut self, batch: &mut Vec<Op>) {
        let before = self.next_offsets.clone();
        let appends = batch
            .iter()
            .filter(|op| matches!(op.kind, OpKind::Append { .. }))
            .count();
        let started = std::time::Instant::now();
        let applied = self.apply(batch, &before);
        let metrics = metrics::global();
        match applied {
            Ok(results) => {
                if appends > 0 {
                    metrics.published(STREAM, appends, started.elapsed().as_secs_f64());
                }
                self.stats.commits.fetch_add(1, Ordering::Relaxed);
                self.stats
                    .operations
                    .fetch_add(results.len() as u64, Ordering::Relaxed);
                for (partition, head) in self.heads.iter().enumerate() {
                    if before[partition] != self.next_offsets[partition] {
                        head.send_replace(self.next_offsets[partition]);
                    }
                }
                for (op, result) in batch.drain(..).zip(results) {
                    // A caller that gave up waiting is no reason to stop.
                    let _ = op.reply.send(Ok(result));
                }
            }
            Err(e) => {
                if appends > 0 {
                    metrics
                        .publish_failures
                        .get_or_create(&StreamLabels { stream: STREAM })
                        .inc();
                }
                tracing::error!(error = %e, operations = batch.len(), "An embedded store commit failed; its writes were refused.");
                self.next_offsets = before;
                let failed = CommitFailed(Arc::new(e));
                for op in batch.drain(..) {
                    let _ = op.reply.send(Err(failed.clone()));
                }
            }
        }
    }

    /// Applies `batch` in one transaction; `before` holds the next offsets as
    /// they were, so that only the heads of partitions that moved are written.
    fn apply(&mut self, batch: &[Op], before: &[u64]) -> Result<Vec<Applied>, redb::Error> {
        let txn = self.db.begin_write()?;
        let mut results = Vec::with_capacity(batch.len());
        {
            let mut log = txn.open_table(LOG)?;
            let mut status = txn.open_table(STATUS)?;
            let mut checkpoints = txn.open_table(CHECKPOINTS)?;
            let mut dead_letters = txn.open_table(DEAD_LETTERS)?;
            let mut heads = txn.open_table(HEADS)?;
            let mut leases = txn.open_table(LEASES)?;
            let mut reservations = txn.open_table(RESERVATIONS)?;
            let mut expiry = txn.open_table(RESERVATION_EXPIRY)?;
            let now_ms =
                i64::try_from(time::OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000)
                    .unwrap_or(i64::MAX);
            for op in batch {
                results.push(match &op.kind {
                    OpKind::Append { partition, payload } => {
                        let next = &mut self.next_offsets[*partition as usize];
                        let offset = *next;
                        log.insert((*partition, offset), payload.as_ref())?;
                        *next += 1;
                        Applied::Appended(offset)
                    }
                    OpKind::PutStatus { id, expected, body } => {
                        let current = status.get(id.as_str())?.map(|v| v.value().0);
                        if current == *expected {
                            let version = current.map_or(1, |v| v + 1);
                            status.insert(id.as_str(), (version, body.as_slice()))?;
                            Applied::Written(version)
                        } else {
                            Applied::PreconditionFailed
                        }
                    }
                    OpKind::Checkpoint {
                        group,
                        partition,
                        offset,
                    } => {
                        let stored = checkpoints
                            .get((group.as_str(), *partition))?
                            .map(|v| v.value());
                        // Checkpoints only move forward, whatever order they arrive in.
                        let offset = stored.map_or(*offset, |s| s.max(*offset));
                        checkpoints.insert((group.as_str(), *partition), offset)?;
                        let mut lowest = offset;
                        for entry in checkpoints.iter()? {
                            let (key, value) = entry?;
                            if key.value().1 == *partition {
                                lowest = lowest.min(value.value());
                            }
                        }
                        log.retain_in((*partition, 0)..=(*partition, lowest), |_, _| false)?;
                        Applied::Done
                    }
                    OpKind::DeadLetter(letter) => {
                        let at = letter.at.format(&Rfc3339).unwrap_or_default();
                        dead_letters.insert(
                            (letter.partition, letter.offset),
                            (letter.reason.as_str(), at.as_str(), letter.payload.as_ref()),
                        )?;
                        Applied::Done
                    }
                    OpKind::PutLease {
                        group,
                        name,
                        expected,
                        body,
                    } => {
                        let key = (group.as_str(), name.as_str());
                        let current = leases.get(key)?.map(|v| v.value().0);
                        let holds = match expected {
                            Expected::Any => true,
                            Expected::Absent => current.is_none(),
                            Expected::Version(version) => current == Some(*version),
                        };
                        if holds {
                            let version = current.map_or(1, |v| v + 1);
                            leases.insert(key, (version, now_ms, body.as_slice()))?;
                            Applied::Leased {
                                version,
                                modified_ms: now_ms,
                            }
                        } else {
                            Applied::PreconditionFailed
                        }
                    }
                    OpKind::Reserve {
                        id,
                        expires_ms,
                        body,
                    } => {
                        let held = reservations
                            .get(id.as_str())?
                            .map(|v| (v.value().0, v.value().1.to_vec()));
                        match held {
                            Some((expires, body)) if expires > now_ms => Applied::Held(body),
                            held => {
                                if let Some((expires, _)) = held {
                                    expiry.remove((expires, id.as_str()))?;
                                }
                                reservations.insert(id.as_str(), (*expires_ms, body.as_slice()))?;
                                expiry.insert((*expires_ms, id.as_str()), ())?;
                                Applied::Reserved
                            }
                        }
                    }
                    OpKind::Release { id, body } => {
                        let held = reservations
                            .get(id.as_str())?
                            .map(|v| (v.value().0, v.value().1 == body.as_slice()));
                        if let Some((expires, true)) = held {
                            reservations.remove(id.as_str())?;
                            expiry.remove((expires, id.as_str()))?;
                        }
                        Applied::Done
                    }
                });
            }
            if batch
                .iter()
                .any(|op| matches!(op.kind, OpKind::Reserve { .. }))
            {
                purge_expired(&mut reservations, &mut expiry, now_ms)?;
            }
            for (partition, (next, was)) in self.next_offsets.iter().zip(before).enumerate() {
                if next != was {
                    let partition = u32::try_from(partition)
                        .unwrap_or_else(|_| unreachable!("partitions is a u32"));
                    heads.insert(partition, *next)?;
                }
            }
        }
        txn.commit()?;
        Ok(results)
    }
}

/// Forgets up to [`PURGE_PER_COMMIT`] reservations that expired before `now_ms`,
/// oldest first, so the table stays as large as the retention period needs.
fn purge_expired(
    reservations: &mut redb::Table<&str, (i64, &[u8])>,
    expiry: &mut redb::Table<(i64, &str), ()>,
    now_ms: i64,
) -> Result<(), redb::Error> {
    let mut expired = Vec::new();
    for entry in expiry
        .range((i64::MIN, "")..(now_ms, ""))?
        .take(PURGE_PER_COMMIT)
    {
        let (key, _) = entry?;
        let (expires, id) = key.value();
        expired.push((expires, id.to_owned()));
    }
    for (expires, id) in expired {
        expiry.remove((expires, id.as_str()))?;
        if reservations
            .get(id.as_str())?
            .is_some_and(|v| v.value().0 == expires)
        {
            reservations.remove(id.as_str())?;
        }
    }
    Ok(())
}
