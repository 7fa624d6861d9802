//! A change-feed processor over any [`ChangeSource`] (Cosmos DB's feed
//! ranges, the embedded store's change sequence), as the Cosmos DB .NET and
//! Java SDKs build it — which the Rust SDK does not.
//!
//! - **Leases**: one per feed range in the [`LeaseStore`] group named after the
//!   processor ([`lease`]), created when missing (a conditional create: a
//!   second creator finds it made, no lock document needed), acquired,
//!   renewed, checkpointed and released with ETag preconditions.
//! - **Balancing** ([`balance`]): every `acquire_interval` an instance takes
//!   leases nobody renewed within `expiry`, up to its equal share, else
//!   steals one from the busiest instance.
//! - **Per lease**: read a batch, hand it to the [`ChangeHandler`], and only
//!   then checkpoint the batch's continuation. A handler error hands the same
//!   batch over again from the last checkpoint, up to `max_attempts`; then
//!   each change is tried alone, the ones that still fail go to the dead
//!   letters with the error, and the lease moves on. Delivery is at least once.
//! - **Splits**: the SDK hides a split range's 410s, so each balancing cycle
//!   compares the source's ranges with the leases: the owner of a lease whose
//!   range now holds several ranges creates a child lease per range, starting
//!   from its continuation, and retires its own.
//! - **Estimator** ([`Estimator`]): pending changes per lease from the
//!   source's sequence numbers, as `skyport_change_feed_lag_events`, on the
//!   admin endpoint and in `/readyz`.

mod balance;
mod lease;

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use serde::Serialize;
use serde_json::{Value, json};
use skyport_core::error::BoxError;
use skyport_core::ports::{
    Change, ChangeDeadLetter, ChangePage, ChangeSource, DeadLetterStore, Diagnostics, FeedRange,
    LeaseError, LeaseStore, StartFrom,
};
use skyport_runtime::config::ChangeFeedSettings;
use skyport_runtime::metrics::{self, LeaseLabels};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use self::balance::Held;
use self::lease::{LeaseDoc, Leases, Stored};

/// What the processor hands each batch of changes to.
#[async_trait]
pub trait ChangeHandler: Send + Sync + 'static {
    /// Handles `changes` (in the order the range holds them). An error hands
    /// the batch over again from the last checkpoint.
    ///
    /// # Errors
    /// When the batch is not handled; nothing of it is checkpointed.
    async fn handle(&self, changes: &[Change]) -> Result<(), BoxError>;
}

/// How a processor runs: `[change_feed]` resolved.
#[derive(Debug, Clone)]
pub struct ProcessorSettings {
    pub processor: String,
    pub instance: String,
    pub start: StartFrom,
    pub poll_interval: Duration,
    pub max_items: u32,
    /// Hand over only documents with this top-level field (the notifier's
    /// `callbackUrl`); the others are passed over, and checkpointed.
    pub only_with_field: Option<String>,
    pub max_batches_in_flight: usize,
    pub acquire_interval: Duration,
    pub renew_interval: Duration,
    pub expiry: Duration,
    pub max_attempts: u32,
    pub retry_backoff: Duration,
    pub estimate_interval: Duration,
}

impl From<&ChangeFeedSettings> for ProcessorSettings {
    fn from(settings: &ChangeFeedSettings) -> Self {
        Self {
            processor: settings.processor_name.clone(),
            instance: settings.instance(),
            start: settings.start().unwrap_or(StartFrom::Beginning),
            poll_interval: settings.poll_interval_ms.duration(),
            max_items: settings.max_items,
            only_with_field: None,
            max_batches_in_flight: settings.max_batches_in_flight.max(1),
            acquire_interval: settings.acquire_interval_ms.duration(),
            renew_interval: settings.renew_interval_ms.duration(),
            expiry: settings.expiry_ms.duration(),
            max_attempts: settings.max_attempts.max(1),
            retry_backoff: settings.retry_backoff_ms.duration(),
            estimate_interval: settings.estimate_interval_ms.duration(),
        }
    }
}

/// One lease's pending changes, as the estimator counted them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LeaseEstimate {
    pub lease: String,
    pub owner: Option<String>,
    pub pending: u64,
}

/// What the processor reports: the leases this instance owns and the last estimate.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProcessorReport {
    pub processor: String,
    pub instance: String,
    pub owned: Vec<String>,
    pub pending: u64,
    pub leases: Vec<LeaseEstimate>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

/// Counts the pending changes of a processor's leases; works whether or not
/// the processor runs.
#[derive(Debug, Clone)]
pub struct Estimator {
    source: Arc<dyn ChangeSource>,
    leases: Leases,
    start: StartFrom,
}

impl Estimator {
    pub fn new(
        source: Arc<dyn ChangeSource>,
        leases: Arc<dyn LeaseStore>,
        processor: &str,
        start: StartFrom,
    ) -> Self {
        Self {
            source,
            leases: Leases {
                store: leases,
                group: processor.to_owned(),
            },
            start,
        }
    }

    /// The pending changes of every live lease.
    ///
    /// # Errors
    /// When the leases or the feed cannot be read.
    pub async fn estimate(&self) -> Result<Vec<LeaseEstimate>, BoxError> {
        let mut estimates = Vec::new();
        for stored in self.leases.list().await? {
            if stored.doc.retired {
                continue;
            }
            let pending = self
                .source
                .pending(
                    &stored.doc.range(),
                    stored.doc.continuation.as_deref(),
                    self.start,
                )
                .await?;
            estimates.push(LeaseEstimate {
                lease: stored.doc.name(),
                owner: stored.doc.owner.clone(),
                pending,
            });
        }
        Ok(estimates)
    }
}

/// A change-feed processor instance.
pub struct Processor {
    settings: ProcessorSettings,
    source: Arc<dyn ChangeSource>,
    leases: Leases,
    dead_letters: Arc<dyn DeadLetterStore>,
    handler: Arc<dyn ChangeHandler>,
    owned: Mutex<HashMap<String, Owned>>,
    report: Arc<Mutex<ProcessorReport>>,
    rebalance: Notify,
}

impl std::fmt::Debug for Processor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Processor")
            .field("settings", &self.settings)
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

/// A lease this instance processes, and how to stop it.
struct Owned {
    stop: CancellationToken,
    task: JoinHandle<()>,
}

/// A batch handed over and not yet checkpointed.
struct InFlight {
    /// Where the range is read from once this batch is done.
    continuation: String,
    /// Set when the batch is done: handled (or its failures dead-lettered),
    /// or not (the lease stopped first).
    handled: Arc<OnceLock<bool>>,
    /// The handler's work, unless the page held nothing it wants.
    task: Option<JoinHandle<()>>,
}

/// How a lease's processing ended.
enum Ended {
    /// Shutdown or a handed-back lease: release it.
    Stopped,
    /// Another instance holds it now.
    Lost,
    /// Its range split; its children were created.
    Split,
}

impl Processor {
    pub fn new(
        settings: ProcessorSettings,
        source: Arc<dyn ChangeSource>,
        leases: Arc<dyn LeaseStore>,
        dead_letters: Arc<dyn DeadLetterStore>,
        handler: Arc<dyn ChangeHandler>,
    ) -> Arc<Self> {
        let report = ProcessorReport {
            processor: settings.processor.clone(),
            instance: settings.instance.clone(),
            ..ProcessorReport::default()
        };
        Arc::new(Self {
            leases: Leases {
                store: leases,
                group: settings.processor.clone(),
            },
            settings,
            source,
            dead_letters,
            handler,
            owned: Mutex::new(HashMap::new()),
            report: Arc::new(Mutex::new(report)),
            rebalance: Notify::new(),
        })
    }

    /// The latest report (owned leases, estimate).
    pub fn report(&self) -> ProcessorReport {
        self.report
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// An estimator over this processor's leases.
    pub fn estimator(&self) -> Estimator {
        Estimator {
            source: Arc::clone(&self.source),
            leases: self.leases.clone(),
            start: self.settings.start,
        }
    }

    /// Runs until `shutdown`: balances leases, processes the owned ones and
    /// estimates; then stops every lease's processing and releases it.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        tracing::info!(processor = %self.settings.processor, instance = %self.settings.instance, "The change-feed processor started.");
        let estimating = tokio::spawn(Arc::clone(&self).estimate_every(shutdown.clone()));
        loop {
            if let Err(e) = self.cycle(&shutdown).await {
                tracing::warn!(processor = %self.settings.processor, error = %e, "A change-feed balancing cycle failed; the next one tries again.");
                self.note_error(&e);
            }
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = tokio::time::sleep(self.settings.acquire_interval) => {}
                () = self.rebalance.notified() => {}
            }
        }
        let owned: Vec<Owned> = self
            .owned
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain()
            .map(|(_, owned)| owned)
            .collect();
        for owned in &owned {
            owned.stop.cancel();
        }
        for owned in owned {
            let _ = owned.task.await;
        }
        metrics::global().change_feed_leases.set(0);
        let _ = estimating.await;
        tracing::info!(processor = %self.settings.processor, "The change-feed processor stopped and released its leases.");
    }

    fn note_error(&self, error: &dyn std::fmt::Display) {
        self.report
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .last_error = Some(error.to_string());
    }

    /// One balancing cycle: create the leases of new ranges, take this
    /// instance's share, and start processing what it took.
    async fn cycle(self: &Arc<Self>, shutdown: &CancellationToken) -> Result<(), BoxError> {
        let ranges = self.source.ranges().await?;
        let mut stored = self.leases.list().await?;
        let mut created = false;
        for range in &ranges {
            let covered = stored.iter().any(|lease| {
                !lease.doc.retired
                    && (lease.doc.range().contains(range) || range.contains(&lease.doc.range()))
            });
            if !covered {
                self.leases.create(&LeaseDoc::new(range)).await?;
                created = true;
            }
        }
        if created {
            stored = self.leases.list().await?;
        }
        let now = OffsetDateTime::now_utc();
        let expiry = time::Duration::try_from(self.settings.expiry).unwrap_or(time::Duration::MAX);
        let me = self.settings.instance.as_str();
        let running: Vec<String> = {
            let mut owned = self.owned.lock().unwrap_or_else(PoisonError::into_inner);
            owned.retain(|_, lease| !lease.task.is_finished());
            owned.keys().cloned().collect()
        };
        let active: Vec<&Stored> = stored.iter().filter(|lease| !lease.doc.retired).collect();
        // A range that split under a running lease: stop it (it is released
        // and split by whoever acquires it next).
        for lease in &active {
            let split = ranges
                .iter()
                .any(|range| lease.doc.range().contains(range) && *range != lease.doc.range());
            if split && running.contains(&lease.name) {
                let owned = self.owned.lock().unwrap_or_else(PoisonError::into_inner);
                if let Some(owned) = owned.get(&lease.name) {
                    owned.stop.cancel();
                }
                self.rebalance.notify_one();
            }
        }
        // Leases the store says are this instance's but nothing processes (a
        // restart under the same name) are taken again first.
        let mut wanted: Vec<&str> = active
            .iter()
            .filter(|lease| {
                lease.live_owner(now, expiry) == Some(me) && !running.contains(&lease.name)
            })
            .map(|lease| lease.name.as_str())
            .collect();
        let held: Vec<Held<'_>> = active
            .iter()
            .map(|lease| Held {
                name: lease.name.as_str(),
                live_owner: lease.live_owner(now, expiry),
            })
            .collect();
        wanted.extend(balance::choose(&held, me));
        for name in wanted {
            let Some(lease) = active.iter().find(|lease| lease.name == name) else {
                continue;
            };
            let mut doc = lease.doc.clone();
            doc.owner = Some(me.to_owned());
            match self.leases.replace(&doc, &lease.etag).await {
                Ok(acquired) => {
                    tracing::info!(processor = %self.settings.processor, lease = name, from = ?lease.doc.owner, "Acquired a change-feed lease.");
                    self.start_lease(acquired, &ranges, shutdown);
                }
                Err(LeaseError::Conflict) => {
                    tracing::debug!(lease = name, "Another instance acquired the lease first.");
                }
                Err(e) => return Err(e.into()),
            }
        }
        let owned = self.owned.lock().unwrap_or_else(PoisonError::into_inner);
        let mut report = self.report.lock().unwrap_or_else(PoisonError::into_inner);
        report.owned = owned.keys().cloned().collect();
        report.owned.sort();
        report.last_error = None;
        metrics::global()
            .change_feed_leases
            .set(i64::try_from(owned.len()).unwrap_or(i64::MAX));
        Ok(())
    }

    fn start_lease(
        self: &Arc<Self>,
        lease: Stored,
        ranges: &[FeedRange],
        shutdown: &CancellationToken,
    ) {
        let name = lease.doc.name();
        let stop = shutdown.child_token();
        let children: Vec<FeedRange> = ranges
            .iter()
            .filter(|range| lease.doc.range().contains(range) && **range != lease.doc.range())
            .cloned()
            .collect();
        let processor = Arc::clone(self);
        let task = tokio::spawn({
            let stop = stop.clone();
            let name = name.clone();
            async move {
                let ended = processor.process(lease, children, stop).await;
                match ended {
                    Ended::Split => processor.rebalance.notify_one(),
                    Ended::Lost => {
                        tracing::info!(processor = %processor.settings.processor, lease = %name, "Lost a change-feed lease to another instance.");
                    }
                    Ended::Stopped => {}
                }
            }
        });
        self.owned
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(name, Owned { stop, task });
    }

    /// Processes one owned lease until it is lost, split or stopped; a
    /// stopped lease is released.
    async fn process(
        self: &Arc<Self>,
        lease: Stored,
        children: Vec<FeedRange>,
        stop: CancellationToken,
    ) -> Ended {
        let held = Arc::new(tokio::sync::Mutex::new(lease));
        let lost = stop.child_token();
        let renewing = tokio::spawn(renew(
            self.leases.clone(),
            Arc::clone(&held),
            self.settings.renew_interval,
            lost.clone(),
        ));
        let ended = if children.is_empty() {
            self.read_and_handle(&held, &lost).await
        } else {
            self.split(&held, &children).await
        };
        lost.cancel();
        let _ = renewing.await;
        if matches!(ended, Ended::Stopped) {
            let stored = held.lock().await;
            let mut doc = stored.doc.clone();
            doc.owner = None;
            if let Err(e) = self.leases.replace(&doc, &stored.etag).await {
                tracing::debug!(lease = %doc.name(), error = %e, "A lease was not released; it expires instead.");
            }
        }
        ended
    }

    /// Creates a child lease per range of a split, each from the parent's
    /// continuation and owned by this instance, then retires the parent. If
    /// a child cannot be created the parent is kept, to be split again.
    async fn split(&self, held: &tokio::sync::Mutex<Stored>, children: &[FeedRange]) -> Ended {
        let mut parent = held.lock().await;
        for range in children {
            let child = LeaseDoc {
                owner: Some(self.settings.instance.clone()),
                continuation: parent.doc.continuation.clone(),
                parent: Some(parent.doc.name()),
                ..LeaseDoc::new(range)
            };
            if let Err(e) = self.leases.create(&child).await {
                tracing::warn!(lease = %parent.doc.name(), error = %e, "A child lease of a split range was not created; the parent stays.");
                return Ended::Stopped;
            }
        }
        let mut retired = parent.doc.clone();
        retired.retired = true;
        retired.owner = None;
        match self.leases.replace(&retired, &parent.etag).await {
            Ok(stored) => {
                tracing::info!(lease = %retired.name(), children = children.len(), "A change-feed range split; its children carry on from its checkpoint.");
                *parent = stored;
                Ended::Split
            }
            Err(LeaseError::Conflict) => Ended::Lost,
            Err(e) => {
                tracing::warn!(lease = %retired.name(), error = %e, "A split lease was not retired; it is split again later.");
                Ended::Stopped
            }
        }
    }

    /// Reads the range and hands its batches over, up to
    /// `max_batches_in_flight` at once (one slow batch — a receiver that is
    /// down — does not hold up the ones behind it), checkpointing each
    /// batch's continuation once it and every batch before it are done.
    async fn read_and_handle(
        self: &Arc<Self>,
        held: &tokio::sync::Mutex<Stored>,
        lost: &CancellationToken,
    ) -> Ended {
        let (name, range) = {
            let stored = held.lock().await;
            (stored.doc.name(), stored.doc.range())
        };
        let mut next = held.lock().await.doc.continuation.clone();
        let mut in_flight: VecDeque<InFlight> = VecDeque::new();
        // Wakes this loop when a batch is done.
        let done = Arc::new(Notify::new());
        loop {
            // Checkpoint the batches done in order, at the furthest of them.
            let (mut furthest, mut stopped) = (None, false);
            while let Some(&handled) = in_flight.front().and_then(|batch| batch.handled.get()) {
                let Some(batch) = in_flight.pop_front() else {
                    break;
                };
                if !handled {
                    stopped = true;
                    break;
                }
                furthest = Some(batch.continuation);
            }
            if let Some(continuation) = furthest
                && !self.checkpoint(held, &continuation).await
            {
                stopped = true;
            }
            if stopped || lost.is_cancelled() {
                return self.stop_in_flight(held, in_flight).await;
            }
            let mut wait = None;
            if in_flight.len() < self.settings.max_batches_in_flight {
                match self.read(&range, next.as_deref()).await {
                    Ok(page) if page.changes.is_empty() && page.skipped > 0 => {
                        // Only changes the handler does not want: passed
                        // over, and checkpointed in their turn.
                        next = Some(page.continuation.clone());
                        in_flight.push_back(InFlight {
                            continuation: page.continuation,
                            handled: Arc::new(OnceLock::from(true)),
                            task: None,
                        });
                    }
                    Ok(page) if page.changes.is_empty() => {
                        // An empty page still moves the position on (the
                        // first read pins "now"; Cosmos DB's records the
                        // range's latest LSN for the estimator).
                        let moved = next.as_deref() != Some(page.continuation.as_str());
                        if in_flight.is_empty()
                            && moved
                            && !self.checkpoint(held, &page.continuation).await
                        {
                            return Ended::Lost;
                        }
                        if in_flight.is_empty() {
                            next = Some(page.continuation);
                        }
                        wait = Some(self.settings.poll_interval);
                    }
                    Ok(page) => {
                        let from = next.replace(page.continuation.clone());
                        let continuation = page.continuation.clone();
                        let handled = Arc::new(OnceLock::new());
                        let processor = Arc::clone(self);
                        let (range, lost, done) = (range.clone(), lost.clone(), Arc::clone(&done));
                        let task = tokio::spawn({
                            let handled = Arc::clone(&handled);
                            async move {
                                let ok = processor
                                    .deliver(&range, from.as_deref(), page, &lost)
                                    .await
                                    .is_some();
                                let _ = handled.set(ok);
                                done.notify_one();
                            }
                        });
                        in_flight.push_back(InFlight {
                            continuation,
                            handled,
                            task: Some(task),
                        });
                    }
                    Err(e) => {
                        tracing::warn!(lease = %name, error = %e, "A change-feed range could not be read; it is read again after the poll interval.");
                        wait = Some(self.settings.poll_interval);
                    }
                }
            } else {
                // A year: until a batch is done or the lease stops.
                wait = Some(Duration::from_secs(365 * 24 * 3600));
            }
            if let Some(wait) = wait {
                tokio::select! {
                    () = lost.cancelled() => {}
                    () = tokio::time::sleep(wait) => {}
                    () = done.notified(), if !in_flight.is_empty() => {}
                }
            }
        }
    }

    /// Lets the batches in flight see the lease stop, then says why it did.
    async fn stop_in_flight(
        &self,
        held: &tokio::sync::Mutex<Stored>,
        in_flight: VecDeque<InFlight>,
    ) -> Ended {
        for task in in_flight.into_iter().filter_map(|batch| batch.task) {
            task.abort();
            let _ = task.await;
        }
        self.why_stopped(held).await
    }

    async fn read(&self, range: &FeedRange, from: Option<&str>) -> Result<ChangePage, BoxError> {
        let (start, max_items) = (self.settings.start, self.settings.max_items);
        Ok(match &self.settings.only_with_field {
            Some(field) => {
                self.source
                    .read_having(range, from, start, max_items, field)
                    .await?
            }
            None => self.source.read(range, from, start, max_items).await?,
        })
    }

    /// Hands `page` to the handler until it succeeds (re-reading the batch
    /// from `from` after each failure), else dead-letters the changes that
    /// fail alone. The page that was handled, or `None` when stopped first.
    async fn deliver(
        &self,
        range: &FeedRange,
        from: Option<&str>,
        mut page: ChangePage,
        lost: &CancellationToken,
    ) -> Option<ChangePage> {
        let mut wait = self.settings.retry_backoff;
        for attempt in 1..=self.settings.max_attempts {
            let handled = tokio::select! {
                () = lost.cancelled() => return None,
                handled = self.handler.handle(&page.changes) => handled,
            };
            let error = match handled {
                Ok(()) => return Some(page),
                Err(e) => e,
            };
            metrics::global().change_feed_handler_errors.inc();
            tracing::warn!(processor = %self.settings.processor, range = %range.name(), attempt, changes = page.changes.len(), error = %error, "A change-feed handler failed; the batch is handed over again from the last checkpoint.");
            if attempt == self.settings.max_attempts {
                break;
            }
            if !self.pause(wait, lost).await {
                return None;
            }
            wait = wait.saturating_mul(2);
            loop {
                match self.read(range, from).await {
                    Ok(again) if !again.changes.is_empty() => {
                        page = again;
                        break;
                    }
                    Ok(_) => break,
                    Err(e) => {
                        tracing::warn!(range = %range.name(), error = %e, "A failed batch could not be read again.");
                        if !self.pause(self.settings.poll_interval, lost).await {
                            return None;
                        }
                    }
                }
            }
        }
        for change in &page.changes {
            loop {
                let handled = tokio::select! {
                    () = lost.cancelled() => return None,
                    handled = self.handler.handle(std::slice::from_ref(change)) => handled,
                };
                let Err(error) = handled else {
                    break;
                };
                let letter = ChangeDeadLetter {
                    processor: self.settings.processor.clone(),
                    key: change.id.clone(),
                    reason: error.to_string(),
                    payload: change.document.clone(),
                    at: OffsetDateTime::now_utc(),
                };
                match self.dead_letters.put_change(letter).await {
                    Ok(()) => {
                        tracing::error!(processor = %self.settings.processor, id = %change.id, error = %error, "A change kept failing; it was dead-lettered and its lease moves on.");
                        break;
                    }
                    Err(e) => {
                        tracing::warn!(id = %change.id, error = %e, "A failing change could not be dead-lettered; it is tried again.");
                        if !self.pause(self.settings.retry_backoff, lost).await {
                            return None;
                        }
                    }
                }
            }
        }
        Some(page)
    }

    /// Sleeps `wait` unless the lease stops first; true if it did not.
    async fn pause(&self, wait: Duration, lost: &CancellationToken) -> bool {
        tokio::select! {
            () = lost.cancelled() => false,
            () = tokio::time::sleep(wait) => true,
        }
    }

    async fn why_stopped(&self, held: &tokio::sync::Mutex<Stored>) -> Ended {
        let stored = held.lock().await;
        if stored.doc.owner.as_deref() == Some(self.settings.instance.as_str()) {
            Ended::Stopped
        } else {
            Ended::Lost
        }
    }

    /// Writes `continuation` as the lease's checkpoint; false if the lease was lost.
    async fn checkpoint(&self, held: &tokio::sync::Mutex<Stored>, continuation: &str) -> bool {
        let mut stored = held.lock().await;
        loop {
            let mut doc = stored.doc.clone();
            doc.continuation = Some(continuation.to_owned());
            match self.leases.replace(&doc, &stored.etag).await {
                Ok(written) => {
                    *stored = written;
                    return true;
                }
                Err(LeaseError::Conflict) => match self.leases.get(&doc.name()).await {
                    Ok(Some(fresh)) if fresh.doc.owner == doc.owner && !fresh.doc.retired => {
                        *stored = fresh;
                    }
                    Ok(fresh) => {
                        if let Some(fresh) = fresh {
                            *stored = fresh;
                        }
                        return false;
                    }
                    Err(e) => {
                        tracing::warn!(lease = %doc.name(), error = %e, "A checkpoint's lease could not be re-read.");
                        tokio::time::sleep(self.settings.retry_backoff).await;
                    }
                },
                Err(e) => {
                    tracing::warn!(lease = %doc.name(), error = %e, "A checkpoint was not written; it is tried again.");
                    tokio::time::sleep(self.settings.retry_backoff).await;
                }
            }
        }
    }

    async fn estimate_every(self: Arc<Self>, shutdown: CancellationToken) {
        let estimator = self.estimator();
        let mut known: Vec<String> = Vec::new();
        loop {
            match estimator.estimate().await {
                Ok(estimates) => {
                    let lag = &metrics::global().change_feed_lag;
                    for name in &known {
                        if !estimates.iter().any(|e| e.lease == *name) {
                            lag.remove(&LeaseLabels {
                                lease: name.clone(),
                            });
                        }
                    }
                    for estimate in &estimates {
                        lag.get_or_create(&LeaseLabels {
                            lease: estimate.lease.clone(),
                        })
                        .set(i64::try_from(estimate.pending).unwrap_or(i64::MAX));
                    }
                    known = estimates.iter().map(|e| e.lease.clone()).collect();
                    let mut report = self.report.lock().unwrap_or_else(PoisonError::into_inner);
                    report.pending = estimates.iter().map(|e| e.pending).sum();
                    report.leases = estimates;
                }
                Err(e) => {
                    tracing::warn!(processor = %self.settings.processor, error = %e, "The change-feed estimator could not count.");
                }
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(self.settings.estimate_interval) => {}
            }
        }
    }
}

#[async_trait]
impl Diagnostics for Processor {
    fn degraded(&self) -> Vec<String> {
        self.report()
            .last_error
            .map(|error| format!("the change-feed processor cannot balance its leases: {error}"))
            .into_iter()
            .collect()
    }

    fn details(&self) -> Vec<(&'static str, Value)> {
        serde_json::to_value(self.report())
            .map(|report| vec![("changeFeed", report)])
            .unwrap_or_default()
    }

    /// `change-feed`: the report; `change-feed/dead-letters`: the changes
    /// and callbacks given up on.
    async fn inspect(&self, path: &str) -> Option<Result<Value, String>> {
        match path.trim_end_matches('/') {
            "change-feed" => Some(serde_json::to_value(self.report()).map_err(|e| e.to_string())),
            "change-feed/dead-letters" => Some(
                self.dead_letters
                    .changes(&self.settings.processor)
                    .await
                    .map(|letters| {
                        Value::Array(
                            letters
                                .into_iter()
                                .map(|letter| {
                                    json!({
                                        "key": letter.key,
                                        "reason": letter.reason,
                                        "at": letter.at.format(&Rfc3339).unwrap_or_default(),
                                        "payload": letter.payload,
                                    })
                                })
                                .collect(),
                        )
                    })
                    .map_err(|e| e.to_string()),
            ),
            _ => None,
        }
    }
}

/// Renews a held lease every `interval` until `lost` fires; a renewal that
/// finds the lease taken cancels `lost`.
async fn renew(
    leases: Leases,
    held: Arc<tokio::sync::Mutex<Stored>>,
    interval: Duration,
    lost: CancellationToken,
) {
    loop {
        tokio::select! {
            () = lost.cancelled() => return,
            () = tokio::time::sleep(interval) => {}
        }
        let mut stored = held.lock().await;
        match leases.replace(&stored.doc, &stored.etag).await {
            Ok(renewed) => *stored = renewed,
            Err(LeaseError::Conflict) => match leases.get(&stored.doc.name()).await {
                Ok(Some(fresh)) if fresh.doc.owner == stored.doc.owner && !fresh.doc.retired => {
                    *stored = fresh;
                }
                Ok(fresh) => {
                    if let Some(fresh) = fresh {
                        *stored = fresh;
                    }
                    lost.cancel();
                    return;
                }
                Err(e) => {
                    tracing::warn!(lease = %stored.doc.name(), error = %e, "A lease could not be re-read; it is renewed again next interval.")
                }
            },
            Err(e) => {
                tracing::warn!(lease = %stored.doc.name(), error = %e, "A lease was not renewed; it is renewed again next interval.");
            }
        }
    }
}
