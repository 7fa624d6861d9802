//! Reservations that ride in the log with the event they name.
//!
//! A request that names its delivery (an `Idempotency-Key` or a
//! `deliveryId`) is first reserved in memory ([`Holds`]), at once and
//! without waiting for the log's writer: the name is free, or held by this
//! earlier request, or recorded by a delivery's status (one read of the
//! database looks up both). The
//! reservation becomes durable in the same group commit as the request's
//! event, as a record of its own stream in the log, so a named request costs
//! one durable write like any other. A folding thread then copies the
//! durable reservations into the database, where they are kept for their
//! retention; once copied, the log may forget them (a checkpoint of the
//! reservation stream). At start, reservations the log holds past that
//! checkpoint are copied again.
//!
//! Expired reservations are forgotten by the same thread: each copy forgets
//! at least as many as it copies in, plus part of what is left over, and
//! while none arrive it looks every second. So under any sustained rate the
//! tables hold about one retention period's worth, never a growing backlog.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use redb::{Database, ReadableTable};

use super::checkpoints::Request;
use super::{lock, now_ms};
use crate::tables::{RESERVATION_EXPIRY, RESERVATIONS, STATUS};

/// The partition number that marks a reservation record in the log.
pub(crate) const STREAM: u32 = u32::MAX;

/// The shortest time between two copies into the database.
const FOLD_EVERY: Duration = Duration::from_millis(100);

/// The niceness of the folding thread. The log has made each reservation
/// durable already; copying it into the database is deferred work (B-tree
/// inserts, a commit), so under a spike it yields the CPU to the requests
/// and catches up after, the reservations waiting in memory and in the log.
const FOLD_NICE: i32 = 10;

/// How many expired reservations a commit forgets beyond as many as it
/// copies in: what is left over from a burst (or a restart) goes at up to
/// this many a commit, so that one commit stays short.
const PURGE_LEFT_OVER: usize = 4_096;

/// How often the folding thread forgets expired reservations while no new
/// ones arrive.
const PURGE_IDLE_EVERY: Duration = Duration::from_secs(1);

/// A reservation as the log holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Record {
    pub(crate) id: String,
    pub(crate) expires_ms: i64,
    /// The reservation's JSON.
    pub(crate) body: Vec<u8>,
}

impl Record {
    /// `[expiry in Unix ms: i64][id length: u32][id][body]`, little-endian.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let id_len = u32::try_from(self.id.len()).unwrap_or(u32::MAX);
        let mut out = Vec::with_capacity(12 + self.id.len() + self.body.len());
        out.extend_from_slice(&self.expires_ms.to_le_bytes());
        out.extend_from_slice(&id_len.to_le_bytes());
        out.extend_from_slice(self.id.as_bytes());
        out.extend_from_slice(&self.body);
        out
    }

    pub(crate) fn decode(bytes: &[u8]) -> Option<Self> {
        let expires_ms = i64::from_le_bytes(bytes.get(0..8)?.try_into().ok()?);
        let id_len = u32::from_le_bytes(bytes.get(8..12)?.try_into().ok()?) as usize;
        let id = std::str::from_utf8(bytes.get(12..12usize.checked_add(id_len)?)?).ok()?;
        Some(Self {
            id: id.to_owned(),
            expires_ms,
            body: bytes[12 + id_len..].to_vec(),
        })
    }
}

/// A reservation the log knows of and the database may not yet hold: not
/// yet written (`written` is `None`), or written at that offset of the
/// reservation stream and not yet copied.
#[derive(Debug, Clone)]
pub(crate) struct Held {
    pub(crate) expires_ms: i64,
    pub(crate) body: Vec<u8>,
    pub(crate) written: Option<u64>,
}

/// The reservations held in memory, shared by the gateway's requests, the
/// log's writer and the folding thread.
#[derive(Debug, Default)]
pub(crate) struct Holds {
    held: Mutex<HashMap<String, Held>>,
    /// Copies into the database so far: a reservation that raced one looks again.
    folds: AtomicU64,
}

impl Holds {
    pub(crate) fn lock(&self) -> MutexGuard<'_, HashMap<String, Held>> {
        lock(&self.held)
    }

    /// Reserves `record.id` unless an unexpired reservation holds it (in
    /// memory or in `db`) or `db` records a status by that id.
    pub(crate) fn reserve(&self, db: &Database, record: Record) -> Result<Taken, redb::Error> {
        let now = now_ms();
        loop {
            let folds = self.folds.load(Ordering::SeqCst);
            if let Some(held) = self.lock().get(&record.id)
                && held.expires_ms > now
            {
                return Ok(Taken::Held(held.body.clone()));
            }
            match stored(db, &record.id, now)? {
                Taken::Free => {}
                taken => return Ok(taken),
            }
            let mut held = self.lock();
            // A copy that finished since the first look may have moved it into the database.
            if self.folds.load(Ordering::SeqCst) != folds {
                continue;
            }
            if let Some(holder) = held.get(&record.id)
                && holder.expires_ms > now
            {
                return Ok(Taken::Held(holder.body.clone()));
            }
            held.insert(
                record.id,
                Held {
                    expires_ms: record.expires_ms,
                    body: record.body,
                    written: None,
                },
            );
            return Ok(Taken::Free);
        }
    }

    /// Forgets the reservation of `id` if it is still `body` and was never written.
    pub(crate) fn release(&self, id: &str, body: &[u8]) {
        let mut held = self.lock();
        if held
            .get(id)
            .is_some_and(|h| h.written.is_none() && h.body == body)
        {
            held.remove(id);
        }
    }

    /// Forgets what the database now holds: the records up to `offset`.
    fn folded(&self, offset: u64) {
        let mut held = self.lock();
        held.retain(|_, h| h.written.is_none_or(|written| written > offset));
        self.folds.fetch_add(1, Ordering::SeqCst);
    }

    /// Forgets reservations that expired without ever being written.
    pub(crate) fn purge_expired(&self, now: i64) {
        self.lock()
            .retain(|_, h| h.written.is_some() || h.expires_ms > now);
    }
}

/// Who holds a name.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Taken {
    /// No one: a reservation asked for is now held.
    Free,
    /// An unexpired reservation, with this body.
    Held(Vec<u8>),
    /// A status document, at this version and with this body.
    Recorded(u64, Vec<u8>),
}

/// Who holds `id` in the database at `now_ms`: an unexpired reservation or,
/// failing that, a status document; both looked up in one read.
fn stored(db: &Database, id: &str, now_ms: i64) -> Result<Taken, redb::Error> {
    use redb::ReadableDatabase;
    let txn = db.begin_read()?;
    if let Some(held) = txn.open_table(RESERVATIONS)?.get(id)? {
        let (expires, body) = held.value();
        if expires > now_ms {
            return Ok(Taken::Held(body.to_vec()));
        }
    }
    Ok(match txn.open_table(STATUS)?.get(id)? {
        Some(status) => {
            let (version, _, _, body) = status.value();
            Taken::Recorded(version, body.to_vec())
        }
        None => Taken::Free,
    })
}

/// The folding thread: copies batches of durable reservations into the
/// database, then forgets them in memory and tells the checkpoint thread
/// (which lets the log forget them); forgets expired ones as it goes, and
/// every [`PURGE_IDLE_EVERY`] while none arrive. `now` is the time in Unix
/// ms. Stops when the writer is gone and what it sent is copied, or could
/// not be: whatever is not copied stays in the log and is copied at the
/// next start.
pub(crate) fn fold(
    db: &Database,
    batches: &Receiver<Vec<(u64, Record)>>,
    holds: &Holds,
    checkpoints: &Sender<Request>,
    now: impl Fn() -> i64,
) {
    if let Err(e) = skyport_runtime::priority::lower_this_thread(FOLD_NICE) {
        tracing::warn!(error = %e, "Could not lower the reservation folder's priority; it competes with requests as an equal.");
    }
    let mut batch: Vec<(u64, Record)> = Vec::new();
    let mut closed = false;
    // While idle, how long to wait for reservations before forgetting
    // expired ones: at once again while a look finds a whole commit's worth.
    let mut idle = PURGE_IDLE_EVERY;
    loop {
        if batch.is_empty() {
            match batches.recv_timeout(idle) {
                Ok(more) => batch = more,
                Err(RecvTimeoutError::Timeout) => {
                    idle = match purge(db, now(), PURGE_LEFT_OVER) {
                        Ok(forgot) if forgot == PURGE_LEFT_OVER => Duration::ZERO,
                        Ok(_) => PURGE_IDLE_EVERY,
                        Err(e) => {
                            tracing::warn!(error = %e, "Could not forget expired reservations; the next look tries again.");
                            PURGE_IDLE_EVERY
                        }
                    };
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => return,
            }
        }
        while let Ok(more) = batches.try_recv() {
            batch.extend(more);
        }
        match write(db, &batch, now()) {
            Ok(()) => {
                let last = batch.iter().map(|(offset, _)| *offset).max();
                batch.clear();
                if let Some(last) = last {
                    holds.folded(last);
                    let _ = checkpoints.send(Request::Folded(last));
                }
                if closed {
                    return;
                }
                // Copies are batched: every database commit holds its readers
                // (the gateway's lookups) for its fsync, so fewer commits keep
                // named requests fast; memory holds the reservations meanwhile.
                std::thread::sleep(FOLD_EVERY);
            }
            Err(e) => {
                tracing::error!(error = %e, reservations = batch.len(), "Could not copy reservations into the database; they stay in the log and are tried again.");
                if closed {
                    return;
                }
                match batches.recv_timeout(Duration::from_secs(1)) {
                    Ok(more) => batch.extend(more),
                    Err(RecvTimeoutError::Timeout) => {}
                    Err(RecvTimeoutError::Disconnected) => closed = true,
                }
            }
        }
    }
}

/// Copies `batch` into the database and forgets as many expired
/// reservations (by `now_ms`) as it copies, plus [`PURGE_LEFT_OVER`], in one commit.
fn write(db: &Database, batch: &[(u64, Record)], now_ms: i64) -> Result<(), redb::Error> {
    let txn = db.begin_write()?;
    {
        let mut reservations = txn.open_table(RESERVATIONS)?;
        let mut expiry = txn.open_table(RESERVATION_EXPIRY)?;
        for (_, record) in batch {
            let id = record.id.as_str();
            let previous = reservations.get(id)?.map(|v| v.value().0);
            if let Some(expires) = previous {
                expiry.remove((expires, id))?;
            }
            reservations.insert(id, (record.expires_ms, record.body.as_slice()))?;
            expiry.insert((record.expires_ms, id), ())?;
        }
        purge_expired(
            &mut reservations,
            &mut expiry,
            now_ms,
            batch.len() + PURGE_LEFT_OVER,
        )?;
    }
    txn.commit()?;
    Ok(())
}

/// Forgets up to `most` reservations that expired before `now_ms` in one
/// commit, made only when one has; answers how many it forgot.
fn purge(db: &Database, now_ms: i64, most: usize) -> Result<usize, redb::Error> {
    use redb::ReadableDatabase;
    let due = {
        let txn = db.begin_read()?;
        match txn.open_table(RESERVATION_EXPIRY) {
            Ok(expiry) => expiry
                .first()?
                .is_some_and(|(key, _)| key.value().0 < now_ms),
            Err(redb::TableError::TableDoesNotExist(_)) => false,
            Err(e) => return Err(e.into()),
        }
    };
    if !due {
        return Ok(0);
    }
    let txn = db.begin_write()?;
    let forgot = {
        let mut reservations = txn.open_table(RESERVATIONS)?;
        let mut expiry = txn.open_table(RESERVATION_EXPIRY)?;
        purge_expired(&mut reservations, &mut expiry, now_ms, most)?
    };
    txn.commit()?;
    Ok(forgot)
}

/// Forgets up to `most` reservations that expired before `now_ms`, oldest
/// first, so the table stays as large as the retention period needs; answers
/// how many.
fn purge_expired(
    reservations: &mut redb::Table<&str, (i64, &[u8])>,
    expiry: &mut redb::Table<(i64, &str), ()>,
    now_ms: i64,
    most: usize,
) -> Result<usize, redb::Error> {
    let mut expired = Vec::new();
    for entry in expiry.range((i64::MIN, "")..(now_ms, ""))?.take(most) {
        let (key, _) = entry?;
        let (expires, id) = key.value();
        expired.push((expires, id.to_owned()));
    }
    let forgot = expired.len();
    for (expires, id) in expired {
        expiry.remove((expires, id.as_str()))?;
        if reservations
            .get(id.as_str())?
            .is_some_and(|v| v.value().0 == expires)
        {
            reservations.remove(id.as_str())?;
        }
    }
    Ok(forgot)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::atomic::AtomicI64;

    use redb::{ReadableDatabase, ReadableTableMetadata};

    use super::*;

    /// The reservations that expired before `now_ms`, and all of them.
    fn counts(db: &Database, now_ms: i64) -> (usize, usize) {
        let txn = db.begin_read().unwrap();
        let expiry = txn.open_table(RESERVATION_EXPIRY).unwrap();
        let reservations = txn.open_table(RESERVATIONS).unwrap();
        let expired = expiry.range(..(now_ms, "")).unwrap().count();
        (
            expired,
            usize::try_from(reservations.len().unwrap()).unwrap(),
        )
    }

    #[test]
    fn expired_reservations_go_as_fast_as_they_come_and_while_idle() {
        // 12,000 named requests a second, above the 2,560/s a fold of 256
        // every 100 ms could forget, each kept for a second.
        const PER_FOLD: usize = 1_200;
        const RETENTION_MS: i64 = 1_000;
        const FOLDS: usize = 30;
        let dir = tempfile::tempdir().unwrap();
        let db = Database::create(dir.path().join("skyport.redb")).unwrap();
        let clock = AtomicI64::new(1_700_000_000_000);
        let now = || clock.load(Ordering::SeqCst);
        let holds = Holds::default();
        let (batches, received) = std::sync::mpsc::channel();
        let (checkpoints, folded) = std::sync::mpsc::channel();
        std::thread::scope(|scope| {
            let (db, holds, checkpoints) = (&db, &holds, &checkpoints);
            scope.spawn(move || fold(db, &received, holds, checkpoints, now));
            let mut offset = 0;
            for n in 0..FOLDS {
                let at = clock.fetch_add(100, Ordering::SeqCst) + 100;
                let batch = (0..PER_FOLD)
                    .map(|i| {
                        offset += 1;
                        let record = Record {
                            id: format!("d-{n}-{i}"),
                            expires_ms: at + RETENTION_MS,
                            body: b"{}".to_vec(),
                        };
                        (offset, record)
                    })
                    .collect();
                batches.send(batch).unwrap();
                match folded.recv().unwrap() {
                    Request::Folded(last) => assert_eq!(last, offset),
                    Request::Checkpoint { .. } => unreachable!("only folds are reported"),
                }
                let (expired, kept) = counts(db, at);
                assert_eq!(expired, 0, "fold {n}: {expired} expired reservations left");
                // One retention's worth, and the fold that just came in.
                assert!(kept <= PER_FOLD * 11, "fold {n}: {kept} kept");
            }
            // Idle: nothing arrives, and all of them expire.
            let later = clock.fetch_add(2 * RETENTION_MS, Ordering::SeqCst) + 2 * RETENTION_MS;
            assert_eq!(counts(db, later).0, PER_FOLD * 11);
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while counts(db, later) != (0, 0) {
                assert!(
                    std::time::Instant::now() < deadline,
                    "still kept while idle: {:?}",
                    counts(db, later)
                );
                std::thread::sleep(Duration::from_millis(20));
            }
            drop(batches);
        });
    }

    #[test]
    fn a_record_reads_back_and_truncations_are_refused() {
        let record = Record {
            id: "d-1".into(),
            expires_ms: 1_700_000_000_000,
            body: br#"{"deliveryId":"d-1"}"#.to_vec(),
        };
        let bytes = record.encode();
        assert_eq!(Record::decode(&bytes), Some(record));
        assert_eq!(Record::decode(&bytes[..10]), None);
        assert_eq!(Record::decode(&bytes[..13]), None);
    }
}
