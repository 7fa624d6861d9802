//! Group commit, shared by the two writers of the embedded store (the
//! database's committer and the stream log's writer): the intake that takes
//! every operation queued behind the first, and the counts of how much it
//! groups. Below both, so that neither writer imports the other.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::mpsc;

/// How much group commit is grouping (operations per durable commit), and
/// how long its thread spent committing: the serial time of the writes.
#[derive(Debug, Default)]
pub struct CommitStats {
    pub commits: AtomicU64,
    pub operations: AtomicU64,
    /// Nanoseconds from taking a batch to its commit being durable (the
    /// fsync's wait included), over every commit, failed ones too.
    pub busy_ns: AtomicU64,
}

impl CommitStats {
    /// Counts `elapsed` as time spent committing.
    pub(crate) fn busy(&self, elapsed: std::time::Duration) {
        self.busy_ns.fetch_add(
            u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }
}

/// Group commit's intake, shared by the database's committer and the log's
/// writer: waits for one operation, then takes every one queued behind it,
/// up to `max` in all. False once every sender is gone and the queue is empty.
pub(crate) fn next_batch<T>(ops: &mut mpsc::Receiver<T>, batch: &mut Vec<T>, max: usize) -> bool {
    let Some(first) = ops.blocking_recv() else {
        return false;
    };
    batch.push(first);
    take_queued(ops, batch, max);
    true
}

/// When to wait for more operations before committing: for `delay`, once
/// at least `after` were queued behind one another (the writer is busy), so
/// that one commit and its fsync serve more of them. Below `after`, or with
/// a zero delay, the operations are committed at once.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Delay {
    pub(crate) delay: Duration,
    pub(crate) after: usize,
}

/// [`next_batch`], then, when `delay` says the writer is busy, a wait and
/// every operation queued during it, up to `max` in all.
pub(crate) fn next_delayed_batch<T>(
    ops: &mut mpsc::Receiver<T>,
    batch: &mut Vec<T>,
    max: usize,
    delay: Delay,
) -> bool {
    if !next_batch(ops, batch, max) {
        return false;
    }
    if !delay.delay.is_zero() && batch.len() >= delay.after && batch.len() < max {
        std::thread::sleep(delay.delay);
        take_queued(ops, batch, max);
    }
    true
}

/// Every operation queued now, until `batch` holds `max`.
fn take_queued<T>(ops: &mut mpsc::Receiver<T>, batch: &mut Vec<T>, max: usize) {
    while batch.len() < max {
        match ops.try_recv() {
            Ok(op) => batch.push(op),
            Err(_) => break,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::time::{Duration, Instant};

    use tokio::sync::mpsc;

    use super::{Delay, next_delayed_batch};

    /// `queued` operations waiting, and one more sent 200 ms later; the
    /// batch taken with a delay of `delay_ms` from `after` operations, and
    /// how long taking it took. A batch without the late one was taken
    /// before it came, without waiting for it.
    fn batch_of(queued: usize, after: usize, delay_ms: u64) -> (Vec<usize>, Duration) {
        let (tx, mut rx) = mpsc::channel(16);
        for op in 0..queued {
            tx.try_send(op).unwrap();
        }
        let late = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            tx.blocking_send(queued).unwrap();
        });
        let delay = Delay {
            delay: Duration::from_millis(delay_ms),
            after,
        };
        let began = Instant::now();
        let mut batch = Vec::new();
        assert!(next_delayed_batch(&mut rx, &mut batch, 16, delay));
        let took = began.elapsed();
        late.join().unwrap();
        (batch, took)
    }

    #[test]
    fn a_busy_writer_waits_and_takes_what_arrives_meanwhile() {
        let (batch, took) = batch_of(3, 3, 600);
        assert_eq!(batch, [0, 1, 2, 3]);
        assert!(took >= Duration::from_millis(600), "{took:?}");
    }

    #[test]
    fn fewer_writes_than_the_threshold_are_committed_at_once() {
        let (batch, _) = batch_of(2, 3, 600);
        assert_eq!(batch, [0, 1]);
    }

    #[test]
    fn no_delay_never_waits() {
        let (batch, _) = batch_of(3, 1, 0);
        assert_eq!(batch, [0, 1, 2]);
    }
}
