//! `[embedded]`: the embedded store (the stream's segment log, and a database
//! of status documents, reservations, leases and dead letters, in one directory).

use std::path::PathBuf;

use serde::Deserialize;

use super::checks::Checks;
use super::duration::Millis;

/// The embedded store (stream, status, checkpoints in one directory).
#[derive(Debug, Clone, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields)]
pub struct EmbeddedSettings {
    pub data_dir: PathBuf,
    /// Page cache of the database, in MiB.
    pub cache_size_mb: usize,
    /// Most writes committed together (one fsync), in the stream and in the database.
    pub max_batch: usize,
    /// How long the database's committer waits for more writes before a
    /// commit, once it is busy (the writes it woke to are at least
    /// `commit_delay_after`): fewer, larger commits for that wait on each
    /// status write. 0: it never waits.
    pub commit_delay_ms: Millis,
    /// The writes queued when the committer wakes from which it waits
    /// `commit_delay_ms`: below it, a write is committed at once.
    pub commit_delay_after: usize,
    /// The size of each segment file of the stream, in MiB (made ahead of
    /// time; deleted once every checkpoint has passed it). An event may take
    /// up to an eighth of it.
    pub segment_size_mb: u64,
    /// Writes that may wait for the committer before writers wait to queue.
    pub queue_capacity: usize,
    /// How often the retention sweeper looks for what `store.*_retention_s`
    /// has expired.
    pub sweep_interval_ms: Millis,
    /// The most entries one sweep removes in one commit (it goes on at once
    /// while it finds more), so that no write waits behind a long deletion.
    pub sweep_batch: usize,
}

impl Default for EmbeddedSettings {
    fn default() -> Self {
        Self {
            data_dir: PathBuf::from("./data"),
            cache_size_mb: 16,
            max_batch: 4096,
            commit_delay_ms: Millis::new(2),
            commit_delay_after: 8,
            segment_size_mb: 64,
            queue_capacity: 65_536,
            sweep_interval_ms: Millis::new(10_000),
            sweep_batch: 512,
        }
    }
}

impl EmbeddedSettings {
    pub(super) fn validate(&self, checks: &mut Checks<'_>) {
        checks.at_least(self.cache_size_mb, 1, "cache_size_mb");
        checks.at_least(self.max_batch, 1, "max_batch");
        checks.check(
            self.commit_delay_ms.count() <= 100,
            "commit_delay_ms",
            "must be at most 100: every status write waits it",
        );
        checks.at_least(self.commit_delay_after, 1, "commit_delay_after");
        checks.check(
            (1..=4095).contains(&self.segment_size_mb),
            "segment_size_mb",
            "must be from 1 to 4095 (MiB)",
        );
        checks.at_least(self.queue_capacity, 1, "queue_capacity");
        checks.at_least(self.sweep_interval_ms.count(), 10, "sweep_interval_ms");
        checks.check(
            (1..=65_536).contains(&self.sweep_batch),
            "sweep_batch",
            "must be from 1 to 65536",
        );
    }
}
