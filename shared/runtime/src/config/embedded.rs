//! `[embedded]`: the embedded store (stream, status, checkpoints in one directory).

use std::path::PathBuf;

use serde::Deserialize;

use super::checks::Checks;

/// The embedded store (stream, status, checkpoints in one file).
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EmbeddedSettings {
    pub data_dir: PathBuf,
    /// Page cache of the database, in MiB.
    pub cache_size_mb: usize,
    /// Most writes committed by one transaction (one fsync).
    pub max_batch: usize,
    /// Writes that may wait for the committer before writers wait to queue.
    pub queue_capacity: usize,
}

impl Default for EmbeddedSettings {
    fn default() -> Self {
        Self {
            data_dir: PathBuf::from("./data"),
            cache_size_mb: 64,
            max_batch: 4096,
            queue_capacity: 65_536,
        }
    }
}

impl EmbeddedSettings {
    pub(super) fn validate(&self, checks: &mut Checks<'_>) {
        checks.at_least(self.cache_size_mb, 1, "cache_size_mb");
        checks.at_least(self.max_batch, 1, "max_batch");
        checks.at_least(self.queue_capacity, 1, "queue_capacity");
    }
}
