//! The embedded store itself: opening the database and the stream's log,
//! the database's group-commit queue, and the ports it implements directly
//! (publisher, status, dead letters, reservations).

use std::ops::Bound;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use async_trait::async_trait;
use bytes::Bytes;
use redb::{Database, ReadableDatabase};
use skyport_core::partitioning::partition_for;
use skyport_core::ports::{
    BoxError, ChangeDeadLetter, DeadLetter, DeadLetterError, DeadLetterStore, ETag,
    IdempotencyStore, Lane, ListPage, ListQuery, OutboundEvent, Position, Precondition,
    PublishError, Publisher, Reservation, Reserved, StatusStore, StatusStoreError, Versioned,
};
use skyport_core::status::StatusDocument;
use skyport_runtime::config::EmbeddedSettings;
use time::OffsetDateTime;
use tokio::sync::{Semaphore, mpsc, oneshot, watch};

use crate::codec;
use crate::committer;
use crate::faults::Faults;
use crate::group_commit::{CommitStats, Delay};
use crate::listing::{self, Listed};
use crate::log::{AppendError, OpenLog, ReservationRecord, SegmentLog, Taken};
use crate::ops::{Applied, CommitFailed, Op, OpKind};
use crate::setup::{self, OpenError, RECEIPT_KEY_LEN};
use crate::tables::{DEAD_LETTERS, STATUS, unix_ms};

const DATABASE_FILE: &str = "skyport.redb";
/// The stream's segment log, under the data directory.
const STREAM_DIR: &str = "stream";

/// The embedded store; cheap to share behind an [`Arc`].
#[derive(Debug)]
pub struct EmbeddedStore {
    pub(crate) db: Arc<Database>,
    pub(crate) log: SegmentLog,
    ops: Option<mpsc::Sender<Op>>,
    partitions: u32,
    receipt_key: [u8; RECEIPT_KEY_LEN],
    stats: Arc<CommitStats>,
    database_stats: Arc<CommitStats>,
    committer: Mutex<Option<JoinHandle<()>>>,
    /// Reads of the database on the blocking pool at once (see [`Self::blocking`]).
    readers: Semaphore,
    /// The last change number committed (the change feed's version).
    pub(crate) changes: watch::Receiver<u64>,
}

/// At most this many scans run at once on the blocking pool. A scan can
/// read many pages from disk, and a blocking-pool thread per waiting scan
/// would grow the pool, and the allocator's per-thread heaps, by hundreds
/// under load. (A point read needs no slot: redb 4 takes a reader's snapshot
/// under a lock that a commit releases before its fsync.)
const MAX_CONCURRENT_READS: usize = 16;

impl EmbeddedStore {
    /// Opens (or creates) the store in `settings.data_dir` with `partitions` stream partitions.
    ///
    /// # Errors
    /// [`OpenError`] names the directory or setting that is in the way.
    pub fn open(settings: &EmbeddedSettings, partitions: u32) -> Result<Arc<Self>, OpenError> {
        let dir = &settings.data_dir;
        std::fs::create_dir_all(dir).map_err(|source| OpenError::CreateDir {
            path: dir.clone(),
            source,
        })?;
        let path = dir.join(DATABASE_FILE);
        let storage = |source: redb::Error| OpenError::Storage {
            path: path.clone(),
            source: Box::new(source),
        };
        let mut db = Database::builder()
            .set_cache_size(settings.cache_size_mb * 1024 * 1024)
            .create(&path)
            .map_err(|e| match e {
                redb::DatabaseError::DatabaseAlreadyOpen => {
                    OpenError::AlreadyOpen { path: path.clone() }
                }
                other => storage(other.into()),
            })?;
        let stream = dir.join(STREAM_DIR);
        let segment_size = settings.segment_size_mb * 1024 * 1024;
        let receipt_key = setup::prepare(&mut db, &path, &stream, partitions, segment_size)?;
        let db = Arc::new(db);
        let stats = Arc::new(CommitStats::default());
        let faults = Faults::default();
        let log = SegmentLog::open(
            &stream,
            partitions,
            settings,
            Arc::clone(&db),
            Arc::clone(&stats),
            faults.clone(),
        )?;
        let (ops, rx) = mpsc::channel(settings.queue_capacity);
        let (changed, changes) = watch::channel(0);
        let database_stats = Arc::new(CommitStats::default());
        let committer = committer::spawn(
            Arc::clone(&db),
            rx,
            settings.max_batch,
            Delay {
                delay: settings.commit_delay_ms.duration(),
                after: settings.commit_delay_after,
            },
            faults,
            changed,
            Arc::clone(&database_stats),
        )
        .map_err(|source| OpenError::Storage {
            path: path.clone(),
            source: Box::new(source),
        })?;
        tracing::info!(path = %path.display(), partitions, "Opened the embedded store.");
        Ok(Arc::new(Self {
            db,
            log,
            ops: Some(ops),
            partitions,
            receipt_key,
            stats,
            database_stats,
            committer: Mutex::new(Some(committer)),
            readers: Semaphore::new(MAX_CONCURRENT_READS),
            changes,
        }))
    }

    /// The key that signs status receipts when none is configured; created once and kept.
    pub fn receipt_key(&self) -> &[u8] {
        &self.receipt_key
    }

    /// The stream's durable commits and the events they carried, since the store opened.
    pub fn commit_stats(&self) -> &CommitStats {
        &self.stats
    }

    /// The database's durable commits (status documents, dead letters,
    /// leases) and the writes they carried, since the store opened.
    pub fn database_commit_stats(&self) -> &CommitStats {
        &self.database_stats
    }

    /// The normal lane's partitions (`stream.partitions`).
    pub fn partitions(&self) -> u32 {
        self.partitions
    }

    /// The expedited lane's partition, numbered after the normal ones.
    pub fn expedited_partition(&self) -> u32 {
        self.partitions
    }

    /// The lane `partition` belongs to.
    pub fn lane_of(&self, partition: u32) -> Lane {
        if partition == self.expedited_partition() {
            Lane::Expedited
        } else {
            Lane::Normal
        }
    }

    /// The switch that makes the store's writes (the stream's, and the
    /// database's commits) fail as a full disk does.
    #[cfg(feature = "fault-injection")]
    pub fn faults(&self) -> &Faults {
        self.log.faults()
    }

    /// The ids of the stream's segment files, oldest first.
    pub fn segments(&self) -> Vec<u64> {
        self.log.segments()
    }

    /// The checkpoint (last completed offset) of each partition `group` has checkpointed.
    pub fn checkpoints(&self, group: &str) -> Vec<(u32, u64)> {
        self.log.checkpoints(group)
    }

    /// The next offset each partition will assign: how many events it has
    /// ever held; the expedited lane's last.
    pub fn heads(&self) -> Vec<u64> {
        (0..=self.partitions)
            .map(|partition| *self.log.head(partition).borrow())
            .collect()
    }

    /// At most `limit` dead-lettered events after the position `after`, by position.
    async fn dead_letters_after(
        &self,
        after: Option<(u32, u64)>,
        limit: usize,
    ) -> Result<Vec<DeadLetter>, DeadLetterError> {
        let db = Arc::clone(&self.db);
        self.blocking(move || -> Result<_, redb::Error> {
            let txn = db.begin_read()?;
            let table = match txn.open_table(DEAD_LETTERS) {
                Ok(table) => table,
                Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
                Err(e) => return Err(e.into()),
            };
            let from = after.map_or(Bound::Unbounded, Bound::Excluded);
            let mut letters = Vec::new();
            for entry in table.range((from, Bound::Unbounded))?.take(limit) {
                let (key, value) = entry?;
                let (partition, offset) = key.value();
                let (reason, at, payload) = value.value();
                letters.push(DeadLetter {
                    partition,
                    offset,
                    reason: reason.to_owned(),
                    payload: Bytes::copy_from_slice(payload),
                    at: OffsetDateTime::parse(at, &time::format_description::well_known::Rfc3339)
                        .unwrap_or(OffsetDateTime::UNIX_EPOCH),
                });
            }
            Ok(letters)
        })
        .await
        .map_err(|e| DeadLetterError::Unavailable(Box::new(e)))
    }

    /// Runs a read that scans (a page of a listing, of changes, of dead
    /// letters) on the blocking pool, so that its disk reads never stall the
    /// async workers, once one of the read slots is free.
    pub(crate) async fn blocking<T: Send + 'static>(
        &self,
        read: impl FnOnce() -> Result<T, redb::Error> + Send + 'static,
    ) -> Result<T, redb::Error> {
        let closed =
            |e: &dyn std::fmt::Display| redb::Error::Io(std::io::Error::other(e.to_string()));
        let _slot = self.readers.acquire().await.map_err(|e| closed(&e))?;
        tokio::task::spawn_blocking(read)
            .await
            .unwrap_or_else(|e| Err(closed(&e)))
    }

    /// Queues a write and waits until it is durable.
    pub(crate) async fn submit(&self, kind: OpKind) -> Result<Applied, SubmitError> {
        let (reply, rx) = oneshot::channel();
        let sender = self.ops.as_ref().ok_or(SubmitError::Closed)?;
        sender
            .send(Op { kind, reply })
            .await
            .map_err(|_| SubmitError::Closed)?;
        Ok(rx.await.map_err(|_| SubmitError::Closed)??)
    }

    pub(crate) fn head(&self, partition: u32) -> watch::Receiver<u64> {
        self.log.head(partition)
    }

    pub(crate) fn stream(&self) -> Arc<OpenLog> {
        self.log.shared()
    }
}

impl Drop for EmbeddedStore {
    fn drop(&mut self) {
        // Closing the queue lets the committer finish what is queued and stop
        // (the log's threads stop when `log` is dropped, after this).
        drop(self.ops.take());
        if let Some(thread) = self.committer.lock().ok().and_then(|mut t| t.take())
            && thread.join().is_err()
        {
            tracing::error!("The embedded store's committer thread panicked.");
        }
    }
}

/// Why a write did not become durable.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SubmitError {
    #[error("the embedded store is closed")]
    Closed,
    #[error(transparent)]
    Failed(#[from] CommitFailed),
}

#[async_trait]
impl Publisher for EmbeddedStore {
    async fn publish(&self, event: OutboundEvent) -> Result<Position, PublishError> {
        let partition = match event.lane {
            Lane::Normal => partition_for(&event.key, self.partitions()),
            Lane::Expedited => self.expedited_partition(),
        };
        match self.log.append(partition, event.key, event.payload).await {
            Ok(offset) => Ok(Position {
                partition,
                offset: Some(offset),
            }),
            Err(AppendError::Closed) => Err(PublishError::Closed),
            Err(e) => Err(PublishError::Unavailable(Box::new(e))),
        }
    }

    fn has_expedited_lane(&self) -> bool {
        true
    }

    async fn ready(&self) -> bool {
        self.log.ready() && self.ops.as_ref().is_some_and(|s| !s.is_closed())
    }
}

#[async_trait]
impl StatusStore for EmbeddedStore {
    /// A point read runs on the caller's thread: one lookup, as the
    /// reservation check's, costs less than the hop to the blocking pool
    /// (which is for the reads that scan), and the worker makes one before
    /// every delivery's first step.
    async fn get(&self, id: &str) -> Result<Option<Versioned>, StatusStoreError> {
        let point_read = || -> Result<_, redb::Error> {
            let txn = self.db.begin_read()?;
            let table = match txn.open_table(STATUS) {
                Ok(table) => table,
                Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
                Err(e) => return Err(e.into()),
            };
            Ok(table.get(id)?.map(|guard| {
                let (version, _, _, body) = guard.value();
                (version, body.to_vec())
            }))
        };
        let found = point_read().map_err(|e| StatusStoreError::Unavailable(Box::new(e)))?;
        let Some((version, body)) = found else {
            return Ok(None);
        };
        let document = codec::decode(&body).map_err(|e| StatusStoreError::Corrupt {
            id: id.to_owned(),
            source: Box::new(e),
        })?;
        Ok(Some(Versioned {
            document,
            etag: ETag(version.to_string()),
        }))
    }

    async fn put(
        &self,
        document: &StatusDocument,
        condition: Precondition,
    ) -> Result<ETag, StatusStoreError> {
        let expected = match condition {
            Precondition::IfNoneMatch => None,
            Precondition::IfMatch(ETag(tag)) => match tag.parse::<u64>() {
                Ok(version) => Some(version),
                // A tag this store never issued cannot match.
                Err(_) => return Err(StatusStoreError::PreconditionFailed),
            },
        };
        let body = codec::encode(document);
        let kind = OpKind::PutStatus {
            id: document.id.clone(),
            expected,
            body,
            listed: Listed::of(document),
            settled_ms: document.settled_at(OffsetDateTime::now_utc()).map(unix_ms),
            due: document.due_at().map(|at| {
                (
                    unix_ms(at),
                    document.revision,
                    document.lane == Lane::Expedited,
                )
            }),
        };
        match self.submit(kind).await {
            Ok(Applied::Written(version)) => Ok(ETag(version.to_string())),
            Ok(Applied::PreconditionFailed) => Err(StatusStoreError::PreconditionFailed),
            Ok(other) => unreachable!("a status write is answered with its version, not {other:?}"),
            Err(e) => Err(StatusStoreError::Unavailable(Box::new(e))),
        }
    }

    async fn list(&self, query: &ListQuery) -> Result<ListPage, StatusStoreError> {
        let db = Arc::clone(&self.db);
        let query = query.clone();
        self.blocking(move || listing::read_page(&db, &query))
            .await
            .map_err(|e| StatusStoreError::Unavailable(Box::new(e)))?
    }

    async fn ready(&self) -> bool {
        Publisher::ready(self).await
    }
}

#[async_trait]
impl DeadLetterStore for EmbeddedStore {
    async fn put(&self, letter: DeadLetter) -> Result<(), DeadLetterError> {
        match self.submit(OpKind::DeadLetter(letter)).await {
            Ok(Applied::Done) => Ok(()),
            Ok(other) => unreachable!("a dead letter is answered with Done, not {other:?}"),
            Err(e) => Err(DeadLetterError::Unavailable(Box::new(e))),
        }
    }

    async fn put_change(&self, letter: ChangeDeadLetter) -> Result<(), DeadLetterError> {
        self.put_change_dead_letter(letter).await
    }

    async fn events(
        &self,
        after: Option<(u32, u64)>,
        limit: usize,
    ) -> Result<Vec<DeadLetter>, DeadLetterError> {
        self.dead_letters_after(after, limit).await
    }

    async fn remove(&self, partition: u32, offset: u64) -> Result<(), DeadLetterError> {
        match self
            .submit(OpKind::RemoveDeadLetter { partition, offset })
            .await
        {
            Ok(Applied::Done) => Ok(()),
            Ok(other) => unreachable!("a removal is answered with Done, not {other:?}"),
            Err(e) => Err(DeadLetterError::Unavailable(Box::new(e))),
        }
    }

    async fn changes(
        &self,
        processor: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<ChangeDeadLetter>, DeadLetterError> {
        self.change_dead_letters(processor, after, limit).await
    }
}

#[async_trait]
impl IdempotencyStore for EmbeddedStore {
    async fn reserve(&self, reservation: &Reservation) -> Result<Reserved, StatusStoreError> {
        let record = ReservationRecord {
            id: reservation.delivery_id.clone(),
            expires_ms: unix_millis(reservation.expires_at),
            body: serde_json::to_vec(reservation)
                .unwrap_or_else(|e| unreachable!("a reservation always serializes: {e}")),
        };
        let corrupt = |source: BoxError| StatusStoreError::Corrupt {
            id: reservation.delivery_id.clone(),
            source,
        };
        match self.log.reserve(record).await {
            Ok(Taken::Free) => Ok(Reserved::New),
            Ok(Taken::Held(body)) => serde_json::from_slice(&body)
                .map(Reserved::Existing)
                .map_err(|e| corrupt(Box::new(e))),
            Ok(Taken::Recorded(version, body)) => codec::decode(&body)
                .map(|document| {
                    Reserved::Recorded(Box::new(Versioned {
                        document,
                        etag: ETag(version.to_string()),
                    }))
                })
                .map_err(|e| corrupt(Box::new(e))),
            Err(e) => Err(StatusStoreError::Unavailable(Box::new(e))),
        }
    }

    async fn release(&self, reservation: &Reservation) -> Result<(), StatusStoreError> {
        let body = serde_json::to_vec(reservation)
            .unwrap_or_else(|e| unreachable!("a reservation always serializes: {e}"));
        self.log.release(&reservation.delivery_id, &body);
        Ok(())
    }
}

fn unix_millis(at: OffsetDateTime) -> i64 {
    i64::try_from(at.unix_timestamp_nanos() / 1_000_000).unwrap_or(i64::MAX)
}
