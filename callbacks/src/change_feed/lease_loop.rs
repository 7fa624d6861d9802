//! One owned lease's loop: renew it in the background, read its range, hand
//! each batch to the [`ChangeHandler`] and checkpoint a batch's continuation
//! only once it and every batch before it are handled (or their failures
//! dead-lettered). A failed batch is handed over again from the last
//! checkpoint; a range that split is handed on to child leases; a lease that
//! stops is released, one that another instance took is left alone.

use std::collections::VecDeque;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::metrics::{self, ProcessorLabels};
use skyport_core::error::BoxError;
use skyport_core::ports::{
    ChangeDeadLetter, ChangePage, ChangeSource, DeadLetterStore, FeedRange, LeaseError,
};
use time::OffsetDateTime;
use tokio::sync::{Mutex, Notify};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::handler::ChangeHandler;
use super::lease::{LeaseDoc, Leases, Stored};
use super::settings::ProcessorSettings;

/// How a lease's processing ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ended {
    /// Shutdown or a handed-back lease: release it.
    Stopped,
    /// Another instance holds it now.
    Lost,
    /// Its range split; its children were created.
    Split,
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

/// What every owned lease of a processor is processed with.
pub(super) struct LeaseLoop {
    settings: ProcessorSettings,
    source: Arc<dyn ChangeSource>,
    leases: Leases,
    dead_letters: Arc<dyn DeadLetterStore>,
    handler: Arc<dyn ChangeHandler>,
}

impl LeaseLoop {
    pub(super) fn new(
        settings: ProcessorSettings,
        source: Arc<dyn ChangeSource>,
        leases: Leases,
        dead_letters: Arc<dyn DeadLetterStore>,
        handler: Arc<dyn ChangeHandler>,
    ) -> Self {
        Self {
            settings,
            source,
            leases,
            dead_letters,
            handler,
        }
    }

    /// Processes one owned lease until it is lost, split or `stop` fires; a
    /// stopped lease is released. With `children` (the ranges its range split
    /// into) it creates their leases instead of reading.
    pub(super) async fn run(
        self: &Arc<Self>,
        lease: Stored,
        children: Vec<FeedRange>,
        stop: CancellationToken,
    ) -> Ended {
        let held = Arc::new(Mutex::new(lease));
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
        if ended == Ended::Stopped {
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
    async fn split(&self, held: &Mutex<Stored>, children: &[FeedRange]) -> Ended {
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
        held: &Mutex<Stored>,
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
                && !self.checkpoint(held, &continuation, lost).await
            {
                stopped = true;
            }
            if stopped || lost.is_cancelled() {
                return self.stop_in_flight(held, in_flight).await;
            }
            let mut wait = None;
            // Taken before the read: once it has caught up with nothing in
            // flight, a change written after it wakes the wait (where the
            // source can tell). While batches are in flight (a slow or down
            // receiver) the changes gather for the poll interval or the end
            // of a batch instead: read as each is written, a page a change
            // each would fill `max_batches_in_flight` with a few callbacks
            // and hold back every later one.
            let seen = self.source.version();
            let mut caught_up = false;
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
                            && !self.checkpoint(held, &page.continuation, lost).await
                        {
                            return Ended::Lost;
                        }
                        if in_flight.is_empty() {
                            next = Some(page.continuation);
                        }
                        caught_up = in_flight.is_empty();
                        wait = Some(self.settings.poll_interval);
                    }
                    Ok(page) => {
                        let from = next.replace(page.continuation.clone());
                        let continuation = page.continuation.clone();
                        let handled = Arc::new(OnceLock::new());
                        let lease_loop = Arc::clone(self);
                        let (range, lost, done) = (range.clone(), lost.clone(), Arc::clone(&done));
                        let task = tokio::spawn({
                            let handled = Arc::clone(&handled);
                            async move {
                                let ok = lease_loop
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
                    () = self.written_since(seen), if caught_up => {}
                }
            }
        }
    }

    /// Lets the batches in flight see the lease stop, then says why it did.
    async fn stop_in_flight(&self, held: &Mutex<Stored>, in_flight: VecDeque<InFlight>) -> Ended {
        for task in in_flight.into_iter().filter_map(|batch| batch.task) {
            task.abort();
            let _ = task.await;
        }
        self.why_stopped(held).await
    }

    /// Resolves once the source has a change written after it was at
    /// `seen`; never when it cannot tell (the loop then polls).
    async fn written_since(&self, seen: Option<u64>) {
        match seen {
            Some(seen) => self.source.changed_since(seen).await,
            None => std::future::pending().await,
        }
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
            metrics::global()
                .change_feed_handler_errors
                .get_or_create(&ProcessorLabels {
                    processor: self.settings.processor.clone(),
                })
                .inc();
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

    async fn why_stopped(&self, held: &Mutex<Stored>) -> Ended {
        let stored = held.lock().await;
        if stored.doc.owner.as_deref() == Some(self.settings.instance.as_str()) {
            Ended::Stopped
        } else {
            Ended::Lost
        }
    }

    /// Writes `continuation` as the lease's checkpoint, trying again while the
    /// store fails; false if the lease was lost, or stopped while the store
    /// was failing (the changes since the last checkpoint are handed over
    /// again, to whoever holds the lease next: at least once).
    async fn checkpoint(
        &self,
        held: &Mutex<Stored>,
        continuation: &str,
        lost: &CancellationToken,
    ) -> bool {
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
                        if !self.pause(self.settings.retry_backoff, lost).await {
                            return false;
                        }
                    }
                },
                Err(e) => {
                    tracing::warn!(lease = %doc.name(), error = %e, "A checkpoint was not written; it is tried again.");
                    if !self.pause(self.settings.retry_backoff, lost).await {
                        return false;
                    }
                }
            }
        }
    }
}

/// Renews a held lease every `interval` until `lost` fires; a renewal that
/// finds the lease taken cancels `lost`.
async fn renew(
    leases: Leases,
    held: Arc<Mutex<Stored>>,
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

#[cfg(test)]
mod tests;
