//! Consumer checkpoints of the segment log, and the thread that writes them
//! and deletes the segments every checkpoint has passed.
//!
//! The checkpoints live in one small file, replaced atomically (written
//! under a temporary name, synced, renamed, the directory synced, as Kafka's
//! `CheckpointFile`), at the consumers' pace and off the append path.
//! Checkpoints that arrive while a write is under way share the next one.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc::Receiver;

use tokio::sync::oneshot;

use super::{LogError, OpenLog, segment};
use crate::faults::Faults;

const FILE: &str = "checkpoints.json";
const TEMPORARY: &str = "checkpoints.json.tmp";

/// Every group's checkpoint (the last offset it completed) of each partition.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Checkpoints {
    #[serde(default)]
    pub(crate) groups: BTreeMap<String, BTreeMap<u32, u64>>,
    /// The last reservation record copied into the database.
    #[serde(default)]
    pub(crate) reservations: Option<u64>,
}

impl Checkpoints {
    pub(crate) fn path(dir: &Path) -> PathBuf {
        dir.join(FILE)
    }

    /// Reads the checkpoints of the log in `dir` (none if it has no file yet).
    pub(crate) fn load(dir: &Path) -> Result<Self, LogError> {
        let path = Self::path(dir);
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| LogError::Checkpoints {
                path,
                source: Box::new(e),
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Self::default()),
            Err(e) => Err(LogError::Checkpoints {
                path,
                source: Box::new(e),
            }),
        }
    }

    /// Replaces the file in `dir` with these checkpoints, atomically.
    pub(crate) fn save(&self, dir: &Path, faults: &Faults) -> std::io::Result<()> {
        let bytes = serde_json::to_vec(self).map_err(std::io::Error::other)?;
        let temporary = dir.join(TEMPORARY);
        let mut file = std::fs::File::create(&temporary)?;
        faults.check()?;
        file.write_all(&bytes)?;
        file.sync_all()?;
        std::fs::rename(&temporary, Self::path(dir))?;
        segment::sync_dir(dir)
    }

    /// The lowest checkpoint of `partition` over the groups that have one:
    /// what every group has completed.
    pub(crate) fn lowest(&self, partition: u32) -> Option<u64> {
        self.groups
            .values()
            .filter_map(|group| group.get(&partition).copied())
            .min()
    }

    /// The highest checkpoint of `partition` over every group.
    pub(crate) fn highest(&self, partition: u32) -> Option<u64> {
        self.groups
            .values()
            .filter_map(|group| group.get(&partition).copied())
            .max()
    }

    /// Moves `group`'s checkpoint of `partition` to `offset` unless it is already past it.
    pub(crate) fn advance(&mut self, group: &str, partition: u32, offset: u64) {
        let stored = self
            .groups
            .entry(group.to_owned())
            .or_default()
            .entry(partition)
            .or_insert(offset);
        *stored = (*stored).max(offset);
    }
}

/// What the checkpoint thread is asked to make durable.
#[derive(Debug)]
pub(crate) enum Request {
    Checkpoint {
        group: String,
        partition: u32,
        offset: u64,
        reply: oneshot::Sender<Result<(), Arc<std::io::Error>>>,
    },
    /// Reservation records up to this offset are in the database.
    Folded(u64),
}

/// The checkpoint thread: writes what is asked, deletes what no partition
/// needs any more, then answers. Stops when every sender is gone.
pub(crate) fn run(shared: &OpenLog, requests: &Receiver<Request>, faults: &Faults) {
    while let Ok(first) = requests.recv() {
        let mut replies = Vec::new();
        let checkpoints = {
            let mut checkpoints = shared.lock_checkpoints();
            let mut apply = |request| match request {
                Request::Checkpoint {
                    group,
                    partition,
                    offset,
                    reply,
                } => {
                    // A checkpoint past the last event written would skip events to come.
                    if let Some(last) = shared.head(partition).checked_sub(1) {
                        checkpoints.advance(&group, partition, offset.min(last));
                    }
                    replies.push(reply);
                }
                Request::Folded(offset) => {
                    checkpoints.reservations = Some(
                        checkpoints
                            .reservations
                            .map_or(offset, |folded| folded.max(offset)),
                    );
                }
            };
            apply(first);
            while let Ok(request) = requests.try_recv() {
                apply(request);
            }
            checkpoints.clone()
        };
        let saved = checkpoints.save(&shared.dir, faults).map_err(Arc::new);
        if let Err(e) = &saved {
            tracing::error!(error = %e, path = %Checkpoints::path(&shared.dir).display(), "Could not write the stream's checkpoints; the consumer will try again.");
        }
        if saved.is_ok() {
            shared.trim(&checkpoints);
        }
        for reply in replies {
            // A consumer that gave up waiting is no reason to stop.
            let _ = reply.send(saved.clone());
        }
    }
}
