//! The log's writer: one thread that owns every append (group commit).
//!
//! It takes all the operations queued at the moment it wakes (up to
//! `max_batch`), frames their records into one buffer, writes it with one
//! `pwrite` at the end of the active segment and makes it durable with one
//! `fdatasync`; only then are the records indexed, the partitions' heads
//! moved and the callers answered. An operation that arrives during a
//! commit goes into the next one. When a commit fails, every append in it
//! fails, and the bytes it may have left are zeroed before the next commit
//! is written, so nothing that was refused can come back at the next start.

use std::collections::HashSet;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use skyport_runtime::metrics::{self, StreamLabels};
use tokio::sync::{mpsc, oneshot};

use super::frame::{self, END_OF_COMMIT};
use super::reservations::{self, Held, Holds, Record};
use super::segment::{self, DATA_START};
use super::{AppendError, Location, OpenLog, now_ms};
use crate::faults::Faults;
use crate::group_commit::{self, CommitStats};

/// An append the writer is asked for.
#[derive(Debug)]
pub(crate) struct Append {
    pub(crate) partition: u32,
    /// The delivery the event belongs to; its reservation, if unwritten, goes with it.
    pub(crate) key: String,
    pub(crate) payload: Bytes,
    pub(crate) reply: oneshot::Sender<Result<u64, AppendError>>,
}

/// The `stream` label of this stream's publish metrics.
const STREAM: &str = "embedded";

/// How often reservations that were never written are checked for expiry.
const PURGE_EVERY: Duration = Duration::from_secs(10);

/// The largest payload a segment of `segment_size` bytes takes: a commit
/// must fit in a segment with room to spare for the rest of its batch.
pub(crate) fn max_payload(segment_size: u64) -> usize {
    usize::try_from(segment_size / 8).unwrap_or(usize::MAX)
}

/// What the writer starts from.
pub(crate) struct Start {
    pub(crate) shared: Arc<OpenLog>,
    pub(crate) holds: Arc<Holds>,
    pub(crate) active: (u64, u64),
    pub(crate) segment_size: u64,
    pub(crate) next_offsets: Vec<u64>,
    pub(crate) next_commit: u64,
    pub(crate) unfolded: Vec<(u64, Record)>,
    pub(crate) fold: Sender<Vec<(u64, Record)>>,
    pub(crate) max_batch: usize,
    pub(crate) stats: Arc<CommitStats>,
    pub(crate) faults: Faults,
}

/// The segment being written and where the next commit goes.
struct Active {
    id: u64,
    file: Arc<File>,
    position: u64,
}

pub(crate) struct Writer {
    shared: Arc<OpenLog>,
    holds: Arc<Holds>,
    active: Active,
    segment_size: u64,
    next_offsets: Vec<u64>,
    next_commit: u64,
    /// Bytes a failed commit may have left, to zero before the next one.
    scrub: Option<(Arc<File>, u64, usize)>,
    fold: Sender<Vec<(u64, Record)>>,
    max_batch: usize,
    stats: Arc<CommitStats>,
    faults: Faults,
    prepare: Option<Sender<u64>>,
    prepared: Receiver<std::io::Result<(u64, File)>>,
    last_purge: Instant,
    buffer: Vec<u8>,
}

impl Writer {
    /// The writer, and the body of the thread that makes its segments ahead of time.
    pub(crate) fn new(start: Start) -> (Self, impl FnOnce() + Send + use<>) {
        let file = {
            let segments = start
                .shared
                .segments
                .read()
                .unwrap_or_else(PoisonError::into_inner);
            Arc::clone(&segments[&start.active.0])
        };
        let (prepare, requests) = std::sync::mpsc::channel::<u64>();
        let (made, prepared) = std::sync::mpsc::channel();
        let dir = start.shared.dir.clone();
        let partitions = start.shared.partitions;
        let size = start.segment_size;
        let faults = start.faults.clone();
        let preparer = move || {
            while let Ok(id) = requests.recv() {
                let result = segment::create(&dir, id, partitions, size, &faults).map(|f| (id, f));
                if let Err(e) = &result {
                    tracing::error!(error = %e, segment = id, "Could not make the stream's next segment.");
                }
                if made.send(result).is_err() {
                    return;
                }
            }
        };
        {
            let mut held = start.holds.lock();
            for (offset, record) in &start.unfolded {
                held.insert(
                    record.id.clone(),
                    Held {
                        expires_ms: record.expires_ms,
                        body: record.body.clone(),
                        written: Some(*offset),
                    },
                );
            }
        }
        if !start.unfolded.is_empty() {
            let _ = start.fold.send(start.unfolded);
        }
        let writer = Self {
            shared: start.shared,
            holds: start.holds,
            active: Active {
                id: start.active.0,
                file,
                position: start.active.1,
            },
            segment_size: start.segment_size,
            next_offsets: start.next_offsets,
            next_commit: start.next_commit,
            scrub: None,
            fold: start.fold,
            max_batch: start.max_batch.max(1),
            stats: start.stats,
            faults: start.faults,
            prepare: Some(prepare),
            prepared,
            last_purge: Instant::now(),
            buffer: Vec::new(),
        };
        writer.request_spare();
        (writer, preparer)
    }

    fn request_spare(&self) {
        if let Some(prepare) = &self.prepare {
            let _ = prepare.send(self.active.id + 1);
        }
    }

    /// Runs until every sender of `ops` is gone and the queue is empty.
    pub(crate) fn run(mut self, mut ops: mpsc::Receiver<Append>) {
        metrics::global().stream_started(STREAM);
        let mut batch = Vec::with_capacity(self.max_batch);
        while group_commit::next_batch(&mut ops, &mut batch, self.max_batch) {
            if self.last_purge.elapsed() >= PURGE_EVERY {
                self.holds.purge_expired(now_ms());
                self.last_purge = Instant::now();
            }
            self.commit(&mut batch);
        }
        // Stops the segment maker.
        drop(self.prepare.take());
    }

    fn commit(&mut self, batch: &mut Vec<Append>) {
        let started = Instant::now();
        let before = self.next_offsets.clone();
        let commit = self.next_commit;
        let reservation_slot = self.next_offsets.len() - 1;
        self.buffer.clear();
        // (partition, offset, position in the buffer, length) of each record framed.
        let mut framed: Vec<(u32, u64, usize, usize)> = Vec::new();
        let mut appends = Vec::new();
        let mut written_reservations: Vec<(u64, Record)> = Vec::new();
        let mut newly_written: HashSet<String> = HashSet::new();
        let held = self.holds.lock();
        for op in batch.drain(..) {
            let Append {
                partition,
                key,
                payload,
                reply,
            } = op;
            if let Some(holder) = held.get(&key)
                && holder.written.is_none()
                && !newly_written.contains(&key)
            {
                let record = Record {
                    id: key.clone(),
                    expires_ms: holder.expires_ms,
                    body: holder.body.clone(),
                };
                let offset = self.next_offsets[reservation_slot];
                self.next_offsets[reservation_slot] += 1;
                let at = self.buffer.len();
                frame::encode(
                    &mut self.buffer,
                    reservations::STREAM,
                    0,
                    offset,
                    commit,
                    &record.encode(),
                );
                framed.push((reservations::STREAM, offset, at, self.buffer.len() - at));
                written_reservations.push((offset, record));
                newly_written.insert(key);
            }
            let offset = self.next_offsets[partition as usize];
            self.next_offsets[partition as usize] += 1;
            let at = self.buffer.len();
            frame::encode(&mut self.buffer, partition, 0, offset, commit, &payload);
            framed.push((partition, offset, at, self.buffer.len() - at));
            appends.push((reply, offset));
        }
        drop(held);
        let Some(&(_, _, last_at, _)) = framed.last() else {
            return;
        };
        frame::set_flags(&mut self.buffer[last_at..], END_OF_COMMIT);
        let metrics = metrics::global();
        let written = self.write();
        self.stats.busy(started.elapsed());
        match written {
            Ok(position) => {
                self.next_commit += 1;
                self.index(&framed, position);
                for (partition, (next, was)) in self.next_offsets.iter().zip(&before).enumerate() {
                    if next != was && partition < self.shared.heads.len() {
                        self.shared.heads[partition].send_replace(*next);
                    }
                }
                if !written_reservations.is_empty() {
                    let mut held = self.holds.lock();
                    for (offset, record) in &written_reservations {
                        if let Some(holder) = held.get_mut(&record.id)
                            && holder.written.is_none()
                            && holder.body == record.body
                        {
                            holder.written = Some(*offset);
                        }
                    }
                    drop(held);
                    // Copied even if released meanwhile: its event is durable, so its name stands.
                    let _ = self.fold.send(written_reservations);
                }
                metrics.published(STREAM, appends.len(), started.elapsed().as_secs_f64());
                self.stats.commits.fetch_add(1, Ordering::Relaxed);
                self.stats
                    .operations
                    .fetch_add(appends.len() as u64, Ordering::Relaxed);
                for (reply, offset) in appends {
                    // A caller that gave up waiting is no reason to stop.
                    let _ = reply.send(Ok(offset));
                }
            }
            Err(e) => {
                metrics
                    .publish_failures
                    .get_or_create(&StreamLabels { stream: STREAM })
                    .inc();
                tracing::error!(error = %e, events = appends.len(), "An append to the embedded stream failed; its events were refused.");
                self.next_offsets = before;
                let failed = Arc::new(e);
                for (reply, _) in appends {
                    let _ = reply.send(Err(AppendError::Io(Arc::clone(&failed))));
                }
            }
        }
    }

    /// Writes the buffer as one commit; answers the segment position it starts at.
    fn write(&mut self) -> std::io::Result<u64> {
        if let Some((file, position, len)) = self.scrub.take() {
            let zeros = vec![0; len];
            let cleared = self
                .faults
                .check()
                .and_then(|()| file.write_all_at(&zeros, position))
                .and_then(|()| file.sync_data());
            if let Err(e) = cleared {
                self.scrub = Some((file, position, len));
                return Err(e);
            }
        }
        let len = self.buffer.len() as u64;
        if self.active.position + len > self.segment_size {
            self.rotate()?;
        }
        let position = self.active.position;
        let written = self
            .faults
            .check()
            .and_then(|()| self.active.file.write_all_at(&self.buffer, position))
            .and_then(|()| self.faults.check())
            .and_then(|()| self.active.file.sync_data());
        match written {
            Ok(()) => {
                self.active.position += len;
                Ok(position)
            }
            Err(e) => {
                self.scrub = Some((Arc::clone(&self.active.file), position, self.buffer.len()));
                Err(e)
            }
        }
    }

    /// Moves to the segment made ahead of time.
    fn rotate(&mut self) -> std::io::Result<()> {
        let (id, file) = match self.prepared.recv() {
            Ok(Ok(spare)) => spare,
            Ok(Err(e)) => {
                // Ask again: the next commit may find the disk has room.
                self.request_spare();
                return Err(e);
            }
            Err(_) => return Err(std::io::Error::other("the segment maker stopped")),
        };
        let file = Arc::new(file);
        self.shared
            .segments
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id, Arc::clone(&file));
        self.shared.active.store(id, Ordering::SeqCst);
        self.active = Active {
            id,
            file,
            position: DATA_START as u64,
        };
        self.request_spare();
        Ok(())
    }

    /// Indexes the records of the commit written at `position`.
    fn index(&self, framed: &[(u32, u64, usize, usize)], position: u64) {
        for &(partition, offset, at, len) in framed {
            self.shared.index(partition).push(
                offset,
                Location {
                    segment: self.active.id,
                    position: u32::try_from(position + at as u64).unwrap_or_else(|_| {
                        unreachable!("a segment is smaller than 4 GiB (segment_size_mb ≤ 4095)")
                    }),
                    len: u32::try_from(len).unwrap_or(u32::MAX),
                },
            );
        }
    }
}
