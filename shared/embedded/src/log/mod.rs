//! The embedded stream: a segment log of its own, as durable streams write
//! theirs (Kafka, Redpanda, Vector's disk buffer, Quickwit's mrecordlog).
//!
//! - **One log for every partition.** A group commit is one `pwrite` and
//!   one `fdatasync` however many partitions its events go to; each record
//!   is framed with its length, CRC-32C, partition, offset and commit number
//!   ([`frame`]).
//! - **Segments** of a fixed size, made ahead of time by a thread of their
//!   own ([`segment`]), so a commit never waits for one to be made.
//! - **An index in memory** per partition (offset → segment and position),
//!   rebuilt at start by reading the segments ([`scan`]), the torn tail of
//!   the last one cut off and zeroed; a damaged record that was acknowledged
//!   stops the start with the file and byte that are damaged.
//! - **Readers** (the worker) follow a partition's head and read records with
//!   `pread`, never taking the writer's time: the index has a lock per
//!   partition, held for a copy of the positions.
//! - **Checkpoints** in a small file replaced atomically, and segments
//!   deleted once every partition's checkpoint has passed them.
//! - **Reservations** of named requests ride in the same commit as their
//!   event ([`reservations`]).
//! - **The expedited lane** is one partition more, numbered after the
//!   others (`stream.partitions`). Segment headers name only the others'
//!   count, so a data directory written before the lane existed opens
//!   unchanged, with the lane empty.

mod checkpoints;
pub mod frame;
mod index;
mod recover;
mod reservations;
pub mod scan;
pub(crate) mod segment;
mod writer;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};
use std::thread::JoinHandle;

use bytes::Bytes;
use redb::Database;
use skyport_core::ports::{BoxError, StreamEvent};
use skyport_runtime::config::EmbeddedSettings;
use tokio::sync::{mpsc, oneshot, watch};

pub(crate) use self::checkpoints::Checkpoints;
use self::frame::{Decoded, HEADER};
use self::index::{Index, Location};
use self::recover::recover;
pub(crate) use self::reservations::{Record as ReservationRecord, Taken};
use crate::faults::Faults;
use crate::group_commit::CommitStats;

/// Why the log did not open.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("cannot use the stream's directory {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the stream segment {path} is damaged at byte {position}: a record that was acknowledged \
         no longer reads back. Restore the data directory from a backup, or move this segment \
         out of the directory to give up the events it holds, then start again"
    )]
    Damaged { path: PathBuf, position: u64 },
    #[error(
        "{path} is not a segment of this stream (its header names another segment or another \
         partition count); move it out of the directory"
    )]
    Foreign { path: PathBuf },
    #[error("cannot read the stream's checkpoints {path}")]
    Checkpoints {
        path: PathBuf,
        #[source]
        source: BoxError,
    },
}

/// Why an append, a reservation or a checkpoint did not become durable.
#[derive(Debug, Clone, thiserror::Error)]
pub enum AppendError {
    #[error("the embedded stream is closed")]
    Closed,
    #[error("the embedded stream could not write")]
    Io(#[source] Arc<std::io::Error>),
    #[error("an event of {len} bytes is larger than a segment takes ({max} bytes)")]
    TooLarge { len: usize, max: usize },
}

/// The open log: its segment files, each partition's index and head, and
/// what the writer, the readers and the checkpoint thread share of them.
#[derive(Debug)]
pub(crate) struct OpenLog {
    dir: PathBuf,
    /// The normal lane's partitions; the expedited lane's is numbered `partitions`.
    partitions: u32,
    /// One per partition (the expedited lane's last), then the reservation stream's.
    indexes: Vec<Mutex<Index>>,
    segments: RwLock<BTreeMap<u64, Arc<File>>>,
    /// The segment commits go to; never deleted.
    active: AtomicU64,
    heads: Vec<watch::Sender<u64>>,
    checkpoints: Mutex<Checkpoints>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl OpenLog {
    fn slot(&self, partition: u32) -> usize {
        if partition == reservations::STREAM {
            reservation_slot(self.partitions)
        } else {
            partition as usize
        }
    }

    fn index(&self, partition: u32) -> MutexGuard<'_, Index> {
        lock(&self.indexes[self.slot(partition)])
    }

    fn lock_checkpoints(&self) -> MutexGuard<'_, Checkpoints> {
        lock(&self.checkpoints)
    }

    fn head(&self, partition: u32) -> u64 {
        *self.heads[partition as usize].borrow()
    }

    fn segment_path(&self, id: u64) -> PathBuf {
        segment::path(&self.dir, id)
    }

    /// The committed events of `partition` from `from` (or the first still
    /// kept, if the checkpoint has passed `from`) up to `to`, exclusive.
    ///
    /// # Errors
    /// When a segment cannot be read, or a record no longer reads back.
    pub(crate) fn read(
        &self,
        partition: u32,
        from: u64,
        to: u64,
    ) -> Result<Vec<StreamEvent>, ReadError> {
        let (start, locations): (u64, Vec<Location>) = {
            let index = self.index(partition);
            let start = from.max(index.first);
            let skip = usize::try_from(start - index.first).unwrap_or(usize::MAX);
            let take = usize::try_from(to.saturating_sub(start)).unwrap_or(usize::MAX);
            (
                start,
                index
                    .locations
                    .iter()
                    .skip(skip)
                    .take(take)
                    .copied()
                    .collect(),
            )
        };
        let files: Vec<Arc<File>> = {
            let segments = self.segments.read().unwrap_or_else(PoisonError::into_inner);
            let mut files = Vec::new();
            for location in &locations {
                let file = segments
                    .get(&location.segment)
                    .ok_or(ReadError::Gone(location.segment))?;
                files.push(Arc::clone(file));
            }
            files
        };
        let mut events = Vec::with_capacity(locations.len());
        for (i, (location, file)) in locations.iter().zip(&files).enumerate() {
            // One read per record, into a buffer of its own: the event owns
            // exactly its bytes for as long as the worker holds it.
            let mut buffer = vec![0; location.len as usize];
            file.read_exact_at(&mut buffer, u64::from(location.position))
                .map_err(|source| ReadError::Io {
                    path: self.segment_path(location.segment),
                    source,
                })?;
            let offset = start + i as u64;
            let len = match frame::decode(&buffer) {
                Decoded::Frame(frame, _)
                    if frame.partition == partition && frame.offset == offset =>
                {
                    frame.payload.len()
                }
                _ => {
                    return Err(ReadError::Damaged {
                        path: self.segment_path(location.segment),
                        position: u64::from(location.position),
                    });
                }
            };
            events.push(StreamEvent {
                partition,
                offset,
                payload: Bytes::from(buffer).slice(HEADER..HEADER + len),
            });
        }
        Ok(events)
    }

    /// Forgets the records every checkpoint has passed and deletes the
    /// segments that no longer hold a record anyone needs.
    fn trim(&self, checkpoints: &Checkpoints) {
        // Read before the indexes: a segment that becomes inactive after this
        // holds only records the indexes below already show.
        let active = self.active.load(Ordering::SeqCst);
        for partition in 0..=self.partitions {
            if let Some(lowest) = checkpoints.lowest(partition) {
                self.index(partition).trim_through(lowest);
            }
        }
        if let Some(folded) = checkpoints.reservations {
            self.index(reservations::STREAM).trim_through(folded);
        }
        let keep_from = self
            .indexes
            .iter()
            .filter_map(|index| lock(index).locations.front().map(|l| l.segment))
            .fold(active, u64::min);
        let doomed: Vec<u64> = {
            let mut segments = self
                .segments
                .write()
                .unwrap_or_else(PoisonError::into_inner);
            let doomed: Vec<u64> = segments.range(..keep_from).map(|(id, _)| *id).collect();
            for id in &doomed {
                segments.remove(id);
            }
            doomed
        };
        for id in &doomed {
            let path = self.segment_path(*id);
            match std::fs::remove_file(&path) {
                Ok(()) => {
                    tracing::debug!(path = %path.display(), "Deleted a segment every checkpoint has passed.")
                }
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "Could not delete a segment every checkpoint has passed.")
                }
            }
        }
        if !doomed.is_empty()
            && let Err(e) = segment::sync_dir(&self.dir)
        {
            tracing::warn!(error = %e, "Could not sync the stream's directory after deleting segments.");
        }
    }
}

/// Why records could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("cannot read the stream segment {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the stream segment {path} is damaged at byte {position}: the record there no longer reads back"
    )]
    Damaged { path: PathBuf, position: u64 },
    #[error("segment {0} was deleted while it was read")]
    Gone(u64),
}

/// The open log and its threads (writer, segment maker, checkpoints, folding).
#[derive(Debug)]
pub(crate) struct SegmentLog {
    shared: Arc<OpenLog>,
    db: Arc<Database>,
    holds: Arc<reservations::Holds>,
    writer: Option<mpsc::Sender<writer::Append>>,
    checkpoints: Option<std::sync::mpsc::Sender<checkpoints::Request>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    #[cfg(feature = "fault-injection")]
    faults: Faults,
    max_payload: usize,
}

/// The index slot of the reservation stream: after the normal partitions
/// and the expedited lane's.
fn reservation_slot(partitions: u32) -> usize {
    partitions as usize + 1
}

pub(crate) fn now_ms() -> i64 {
    i64::try_from(time::OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000)
        .unwrap_or(i64::MAX)
}

impl SegmentLog {
    /// Opens (or creates) the log in `dir`: reads every segment back, cuts a
    /// torn tail, and starts the writer and its helper threads.
    pub(crate) fn open(
        dir: &Path,
        partitions: u32,
        settings: &EmbeddedSettings,
        db: Arc<Database>,
        stats: Arc<CommitStats>,
        faults: Faults,
    ) -> Result<Self, LogError> {
        let io = |source| LogError::Io {
            path: dir.to_path_buf(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(io)?;
        let segment_size = settings.segment_size_mb * 1024 * 1024;
        let checkpoints = Checkpoints::load(dir)?;
        let recovered = recover(dir, partitions, segment_size, &checkpoints, &faults)?;
        let mut next_offsets: Vec<u64> = recovered.indexes.iter().map(Index::next).collect();
        for (partition, next) in next_offsets
            .iter_mut()
            .enumerate()
            .take(reservation_slot(partitions))
        {
            let partition = u32::try_from(partition).unwrap_or(u32::MAX);
            if let Some(highest) = checkpoints.highest(partition) {
                *next = (*next).max(highest + 1);
            }
        }
        if let Some(folded) = checkpoints.reservations
            && let Some(next) = next_offsets.last_mut()
        {
            *next = (*next).max(folded + 1);
        }
        let heads = next_offsets[..reservation_slot(partitions)]
            .iter()
            .map(|&next| watch::channel(next).0)
            .collect();
        let shared = Arc::new(OpenLog {
            dir: dir.to_path_buf(),
            partitions,
            indexes: recovered.indexes.into_iter().map(Mutex::new).collect(),
            segments: RwLock::new(recovered.segments),
            active: AtomicU64::new(recovered.active.0),
            heads,
            checkpoints: Mutex::new(checkpoints.clone()),
        });
        shared.trim(&checkpoints);
        let (checkpoint_tx, checkpoint_rx) = std::sync::mpsc::channel();
        let (fold_tx, fold_rx) = std::sync::mpsc::channel();
        let holds = Arc::new(reservations::Holds::default());
        let (ops_tx, ops_rx) = mpsc::channel(settings.queue_capacity);
        let max_payload = writer::max_payload(segment_size);
        let mut threads = Vec::new();
        let spawn = |name: &str, body: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new()
                .name(name.to_owned())
                .spawn(body)
                .map_err(io)
        };
        {
            let shared = Arc::clone(&shared);
            let faults = faults.clone();
            threads.push(spawn(
                "skyport-checkpoints",
                Box::new(move || checkpoints::run(&shared, &checkpoint_rx, &faults)),
            )?);
        }
        {
            let db = Arc::clone(&db);
            let holds = Arc::clone(&holds);
            let checkpoint_tx = checkpoint_tx.clone();
            threads.push(spawn(
                "skyport-reservations",
                Box::new(move || {
                    reservations::fold(&db, &fold_rx, &holds, &checkpoint_tx, now_ms);
                }),
            )?);
        }
        let (writer, preparer) = writer::Writer::new(writer::Start {
            shared: Arc::clone(&shared),
            holds: Arc::clone(&holds),
            active: recovered.active,
            segment_size,
            next_offsets,
            next_commit: recovered.next_commit,
            unfolded: recovered.unfolded,
            fold: fold_tx,
            max_batch: settings.max_batch,
            stats,
            faults: faults.clone(),
        });
        threads.push(spawn("skyport-segments", Box::new(preparer))?);
        threads.push(spawn("skyport-log", Box::new(move || writer.run(ops_rx)))?);
        tracing::info!(path = %dir.display(), partitions, "Opened the stream's segment log.");
        Ok(Self {
            shared,
            db,
            holds,
            writer: Some(ops_tx),
            checkpoints: Some(checkpoint_tx),
            threads: Mutex::new(threads),
            #[cfg(feature = "fault-injection")]
            faults,
            max_payload,
        })
    }

    pub(crate) fn shared(&self) -> Arc<OpenLog> {
        Arc::clone(&self.shared)
    }

    #[cfg(feature = "fault-injection")]
    pub(crate) fn faults(&self) -> &Faults {
        &self.faults
    }

    pub(crate) fn ready(&self) -> bool {
        self.writer.as_ref().is_some_and(|w| !w.is_closed())
    }

    /// Appends `payload` to `partition` and waits until it is durable; an
    /// unwritten reservation of `key` becomes durable with it.
    pub(crate) async fn append(
        &self,
        partition: u32,
        key: String,
        payload: Bytes,
    ) -> Result<u64, AppendError> {
        if payload.len() > self.max_payload {
            return Err(AppendError::TooLarge {
                len: payload.len(),
                max: self.max_payload,
            });
        }
        let (reply, answer) = oneshot::channel();
        let writer = self.writer.as_ref().ok_or(AppendError::Closed)?;
        writer
            .send(writer::Append {
                partition,
                key,
                payload,
                reply,
            })
            .await
            .map_err(|_| AppendError::Closed)?;
        answer.await.map_err(|_| AppendError::Closed)?
    }

    /// Reserves `record.id` unless an unexpired reservation holds it or a
    /// status records it. Never waits for the writer.
    pub(crate) async fn reserve(
        &self,
        record: reservations::Record,
    ) -> Result<reservations::Taken, AppendError> {
        self.holds
            .reserve(&self.db, record)
            .map_err(|e| AppendError::Io(Arc::new(std::io::Error::other(e))))
    }

    /// Forgets the reservation of `id` if it is still `body` and was never written.
    pub(crate) fn release(&self, id: &str, body: &[u8]) {
        self.holds.release(id, body);
    }

    /// Moves `group`'s checkpoint of `partition` to `offset` and waits until it is durable.
    pub(crate) async fn checkpoint(
        &self,
        group: &str,
        partition: u32,
        offset: u64,
    ) -> Result<(), AppendError> {
        let (reply, answer) = oneshot::channel();
        let sender = self.checkpoints.as_ref().ok_or(AppendError::Closed)?;
        sender
            .send(checkpoints::Request::Checkpoint {
                group: group.to_owned(),
                partition,
                offset,
                reply,
            })
            .map_err(|_| AppendError::Closed)?;
        answer
            .await
            .map_err(|_| AppendError::Closed)?
            .map_err(AppendError::Io)
    }

    /// `group`'s checkpoint of each partition it has checkpointed.
    pub(crate) fn checkpoints(&self, group: &str) -> Vec<(u32, u64)> {
        self.shared
            .lock_checkpoints()
            .groups
            .get(group)
            .map(|partitions| partitions.iter().map(|(p, o)| (*p, *o)).collect())
            .unwrap_or_default()
    }

    pub(crate) fn head(&self, partition: u32) -> watch::Receiver<u64> {
        self.shared.heads[partition as usize].subscribe()
    }

    /// The segments on disk, oldest first.
    pub(crate) fn segments(&self) -> Vec<u64> {
        self.shared
            .segments
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .keys()
            .copied()
            .collect()
    }
}

impl Drop for SegmentLog {
    fn drop(&mut self) {
        // Closing the queues lets each thread finish what is queued and stop.
        drop(self.writer.take());
        drop(self.checkpoints.take());
        let threads = std::mem::take(&mut *lock(&self.threads));
        for thread in threads {
            if thread.join().is_err() {
                tracing::error!("A thread of the embedded stream panicked.");
            }
        }
    }
}
