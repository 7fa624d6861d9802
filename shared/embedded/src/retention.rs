//! Retention: settled status documents (each with its change record) and
//! dead letters are removed once their window has passed, oldest first, in
//! bounded batches that go through the committer's queue (the database has
//! one writer). The 202 path writes only the stream's log and readers read
//! snapshots, so neither waits for a sweep; a status write queued behind one
//! waits for at most one batch.
//!
//! A document is settled when it is terminal and owes no callback, a
//! Scheduled delivery not before its deadline
//! ([`StatusDocument::settled_at`](skyport_core::status::StatusDocument::settled_at));
//! its window starts with the write that settled it (or that deadline, if
//! later: the key of its retention entry is in the future until then), and a
//! later write that unsettles it (a callback to send again) ends it. A document whose change
//! record a live change-feed lease has not checkpointed past stays: the sweep
//! stops at the slowest lease, so a short window never drops a change before
//! its handler has seen it.
//!
//! redb reuses the pages a sweep frees, so under a steady load the database
//! file stops growing once the window is full; it never shrinks.

use std::sync::{Arc, Weak};
use std::time::Duration;

use skyport_runtime::config::{EmbeddedSettings, StoreSettings};
use time::OffsetDateTime;

use crate::metrics;
use crate::ops::{Applied, OpKind};
use crate::store::{EmbeddedStore, SubmitError};
use crate::sweep::{Cutoffs, Swept};
use crate::tables::unix_ms;

/// How long what the store keeps is kept, and how the sweeper goes about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// A settled status document, after the write that settled it (a
    /// Scheduled delivery's, after its deadline).
    pub status: Duration,
    /// A dead-lettered event or change, after it was dead-lettered.
    pub dead_letters: Duration,
    /// How often the sweeper looks.
    pub interval: Duration,
    /// The most entries of each kind one commit removes.
    pub batch: usize,
}

impl Retention {
    /// `store.*_retention_s`, `embedded.sweep_interval_ms` and `embedded.sweep_batch`.
    pub fn from_settings(store: &StoreSettings, embedded: &EmbeddedSettings) -> Self {
        Self {
            status: store.status_retention_s.duration(),
            dead_letters: store.dead_letter_retention_s.duration(),
            interval: embedded.sweep_interval_ms.duration(),
            batch: embedded.sweep_batch,
        }
    }

    fn cutoffs(&self, now: OffsetDateTime) -> Cutoffs {
        Cutoffs {
            status_before_ms: unix_ms(now - self.status),
            dead_letters_before_ms: unix_ms(now - self.dead_letters),
            batch: self.batch.max(1),
        }
    }
}

/// Why a sweep did not happen.
#[derive(Debug, thiserror::Error)]
#[error("the retention sweep did not commit")]
pub struct SweepError(#[source] SubmitError);

impl EmbeddedStore {
    /// One sweep: removes at most `retention.batch` entries of each kind
    /// that `retention` has expired at `now`, in one commit.
    ///
    /// # Errors
    /// [`SweepError`] when the commit fails or the store is closed.
    pub async fn sweep(
        &self,
        retention: &Retention,
        now: OffsetDateTime,
    ) -> Result<Swept, SweepError> {
        match self.submit(OpKind::Sweep(retention.cutoffs(now))).await {
            Ok(Applied::Swept(swept)) => Ok(swept),
            Ok(other) => unreachable!("a sweep is answered with what it removed, not {other:?}"),
            Err(e) => Err(SweepError(e)),
        }
    }

    /// Starts the sweeper: every `retention.interval` it sweeps, and goes on
    /// at once while a sweep removes a whole batch. It stops once the store
    /// is dropped.
    pub fn spawn_sweeper(self: &Arc<Self>, retention: Retention) -> tokio::task::JoinHandle<()> {
        let store = Arc::downgrade(self);
        tokio::spawn(run_sweeper(store, retention))
    }
}

async fn run_sweeper(store: Weak<EmbeddedStore>, retention: Retention) {
    let metrics = metrics::global();
    loop {
        tokio::time::sleep(retention.interval).await;
        loop {
            let Some(open) = store.upgrade() else {
                return;
            };
            let now = OffsetDateTime::now_utc();
            match open.sweep(&retention, now).await {
                Ok(swept) => {
                    metrics.record(&swept, now);
                    if swept.statuses + swept.dead_letters + swept.change_dead_letters > 0 {
                        tracing::debug!(?swept, "Removed what the retention windows expired.");
                    }
                    if !swept.more(retention.batch) {
                        break;
                    }
                }
                Err(SweepError(SubmitError::Closed)) => return,
                Err(e) => {
                    tracing::warn!(error = %e, "A retention sweep failed; the next one tries again.");
                    break;
                }
            }
            drop(open);
            tokio::task::yield_now().await;
        }
    }
}

#[cfg(test)]
mod tests;
