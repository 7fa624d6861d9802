//! Group commit, shared by the two writers of the embedded store (the
//! database's committer and the stream log's writer): the intake that takes
//! every operation queued behind the first, and the counts of how much it
//! groups. Below both, so that neither writer imports the other.

use std::sync::atomic::AtomicU64;

use tokio::sync::mpsc;

/// How much group commit is grouping: operations per durable commit.
#[derive(Debug, Default)]
pub struct CommitStats {
    pub commits: AtomicU64,
    pub operations: AtomicU64,
}

/// Group commit's intake, shared by the database's committer and the log's
/// writer: waits for one operation, then takes every one queued behind it,
/// up to `max` in all. False once every sender is gone and the queue is empty.
pub(crate) fn next_batch<T>(ops: &mut mpsc::Receiver<T>, batch: &mut Vec<T>, max: usize) -> bool {
    let Some(first) = ops.blocking_recv() else {
        return false;
    };
    batch.push(first);
    while batch.len() < max {
        match ops.try_recv() {
            Ok(op) => batch.push(op),
            Err(_) => break,
        }
    }
    true
}
