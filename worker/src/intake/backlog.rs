//! The backlog guard: how much pending work one worker may hold, and for how long.
//!
//! Pending means pulled and not completed. Past `allow_backlog_of` events or
//! with the oldest pending event older than `allow_backlog_to`, the worker first
//! pauses intake (backpressure into the stream); if the breach outlasts the
//! grace period it stops with an error that names the limit, so that its
//! orchestrator restarts it from the last checkpoint.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prometheus_client::metrics::gauge::Gauge;
use skyport_runtime::config::WorkerSettings;
use skyport_runtime::locks::{NamedGuard, NamedMutex};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::pauses::Pauses;

const INTAKE_SOURCE: &str = "backlog";

/// A breach that lasted past the grace period.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the backlog stayed over its limit for {grace_s} s: {reason}")]
pub struct BacklogExceeded {
    pub reason: String,
    pub grace_s: u64,
}

#[derive(Debug)]
pub struct BacklogGuard {
    allow_backlog_of: usize,
    allow_backlog_to: Duration,
    grace: Duration,
    /// Each partition loop's pending events and when the oldest began, by
    /// the key of its [`Pending`].
    partitions: NamedMutex<HashMap<u64, (usize, Option<Instant>)>>,
    next_key: AtomicU64,
    /// Their pending events summed, on `/metrics`.
    pending: Gauge,
}

/// One partition loop's entry in the backlog: what it last reported counts
/// until it is dropped, when its loop ends. Keyed by loop, not by
/// partition: a partition the worker wins back while the loop that lost it
/// still drains has two loops here for a while, and what a finished loop
/// last reported must not count for ever (its oldest event would age past
/// `allow_backlog_to_ms` and stop the worker).
#[derive(Debug)]
pub struct Pending<'a> {
    guard: &'a BacklogGuard,
    key: u64,
}

impl Pending<'_> {
    /// The loop's pending events and when the oldest of them began.
    pub fn report(&self, pending: usize, oldest: Option<Instant>) {
        let before = self.guard.lock().insert(self.key, (pending, oldest));
        self.guard.count(pending, before);
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        let before = self.guard.lock().remove(&self.key);
        self.guard.count(0, before);
    }
}

impl BacklogGuard {
    pub fn new(settings: &WorkerSettings) -> Self {
        Self {
            allow_backlog_of: settings.allow_backlog_of,
            allow_backlog_to: settings.allow_backlog_to_ms.duration(),
            grace: settings.backlog_grace_period_ms.duration(),
            partitions: NamedMutex::new("backlog", HashMap::new()),
            next_key: AtomicU64::new(0),
            pending: crate::metrics::global().worker_pending_events.clone(),
        }
    }

    /// Moves the pending events' gauge from an entry's `before` to `now`.
    fn count(&self, now: usize, before: Option<(usize, Option<Instant>)>) {
        let before = before.map_or(0, |(pending, _)| pending);
        let delta =
            i64::try_from(now).unwrap_or(i64::MAX) - i64::try_from(before).unwrap_or(i64::MAX);
        self.pending.inc_by(delta);
    }

    /// An entry for a partition loop that starts now, with nothing pending.
    pub fn track(&self) -> Pending<'_> {
        let key = self.next_key.fetch_add(1, Ordering::Relaxed);
        self.lock().insert(key, (0, None));
        Pending { guard: self, key }
    }

    fn lock(&self) -> NamedGuard<'_, HashMap<u64, (usize, Option<Instant>)>> {
        self.partitions.lock()
    }

    /// The limit that is breached now, if any.
    pub fn breach(&self, now: Instant) -> Option<String> {
        let partitions = self.lock();
        let pending: usize = partitions.values().map(|(pending, _)| pending).sum();
        let oldest = partitions.values().filter_map(|(_, oldest)| *oldest).min();
        if pending > self.allow_backlog_of {
            return Some(format!(
                "{pending} pending events exceed worker.allow_backlog_of = {}",
                self.allow_backlog_of
            ));
        }
        let age = oldest.map(|oldest| now.saturating_duration_since(oldest))?;
        (age > self.allow_backlog_to).then(|| {
            format!(
                "the oldest pending event is {} s old, past worker.allow_backlog_to_ms = {}",
                age.as_secs(),
                self.allow_backlog_to.as_millis()
            )
        })
    }

    /// Checks the limits every `period` until `shutdown`.
    ///
    /// # Errors
    /// [`BacklogExceeded`] when a breach outlasts the grace period.
    pub async fn watch(
        &self,
        intake: &Pauses,
        period: Duration,
        shutdown: &CancellationToken,
    ) -> Result<(), BacklogExceeded> {
        let mut ticks = tokio::time::interval(period);
        let mut since: Option<Instant> = None;
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return Ok(()),
                _ = ticks.tick() => {}
            }
            let now = Instant::now();
            match (self.breach(now), since) {
                (Some(reason), None) => {
                    since = Some(now);
                    intake.pause(INTAKE_SOURCE, reason);
                }
                (Some(reason), Some(start)) if now.duration_since(start) >= self.grace => {
                    tracing::error!(%reason, grace_s = self.grace.as_secs(), "The backlog stayed over its limit; stopping so that the worker restarts from its checkpoint.");
                    return Err(BacklogExceeded {
                        reason,
                        grace_s: self.grace.as_secs(),
                    });
                }
                (Some(_), Some(_)) => {}
                (None, Some(_)) => {
                    since = None;
                    intake.resume(INTAKE_SOURCE);
                }
                (None, None) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use skyport_runtime::config::Millis;

    use super::*;

    fn guard() -> BacklogGuard {
        BacklogGuard::new(&WorkerSettings {
            allow_backlog_of: 100,
            allow_backlog_to_ms: Millis::new(10_000),
            backlog_grace_period_ms: Millis::new(5_000),
            ..WorkerSettings::default()
        })
    }

    #[tokio::test(start_paused = true)]
    async fn too_many_pending_events_pause_intake_then_stop_the_worker() {
        let guard = guard();
        let intake = Pauses::default();
        let (first, second) = (guard.track(), guard.track());
        first.report(60, Some(Instant::now()));
        second.report(41, Some(Instant::now()));
        let error = guard
            .watch(&intake, Duration::from_secs(1), &CancellationToken::new())
            .await
            .expect_err("the breach outlasts the grace period");
        assert!(error.reason.contains("worker.allow_backlog_of"), "{error}");
        assert_eq!(intake.reasons().len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn an_old_pending_event_is_a_breach_that_names_its_limit() {
        let guard = guard();
        let partition = guard.track();
        partition.report(1, Some(Instant::now()));
        assert_eq!(guard.breach(Instant::now()), None);
        tokio::time::advance(Duration::from_secs(11)).await;
        let reason = guard.breach(Instant::now()).expect("breach");
        assert!(reason.contains("worker.allow_backlog_to_ms"), "{reason}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_loop_that_ended_counts_no_more_though_another_reads_its_partition() {
        let guard = guard();
        let lost = guard.track();
        lost.report(80, Some(Instant::now()));
        let won_back = guard.track();
        won_back.report(30, Some(Instant::now()));
        assert!(guard.breach(Instant::now()).is_some(), "110 pending of 100");
        drop(lost);
        won_back.report(0, None);
        tokio::time::advance(Duration::from_secs(11)).await;
        assert_eq!(guard.breach(Instant::now()), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_breach_that_clears_within_the_grace_period_resumes_intake() {
        let guard = std::sync::Arc::new(guard());
        let intake = Pauses::default();
        let shutdown = CancellationToken::new();
        let partition = guard.track();
        partition.report(500, Some(Instant::now()));
        let watcher = {
            let (guard, intake, shutdown) = (guard.clone(), intake.clone(), shutdown.clone());
            tokio::spawn(async move {
                guard
                    .watch(&intake, Duration::from_secs(1), &shutdown)
                    .await
            })
        };
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(intake.reasons().len(), 1);
        partition.report(5, Some(Instant::now()));
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(intake.reasons().is_empty());
        shutdown.cancel();
        assert_eq!(watcher.await.expect("joins"), Ok(()));
    }
}
