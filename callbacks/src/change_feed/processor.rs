//! The processor: one instance of a change-feed processor. Every
//! `acquire_interval` (or at once after a split) it runs a balancing cycle —
//! create the leases of ranges that have none, stop a lease whose range
//! split, take this instance's share ([`super::balance`]) — and starts each
//! lease it took on its own loop ([`super::lease_loop`]); it estimates the lag
//! alongside. At shutdown every lease's loop stops and releases its lease
//! before [`Processor::run`] returns.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use crate::metrics::{self, ProcessorLabels};
use async_trait::async_trait;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::{Value, json};
use skyport_core::error::BoxError;
use skyport_core::ports::{
    ChangeSource, DeadLetterStore, Diagnostics, FeedRange, LeaseError, LeaseStore, ReportError,
    ReportQuery,
};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::estimator::Estimator;
use super::handler::ChangeHandler;
use super::lease::{LeaseDoc, Leases, Stored};
use super::lease_loop::{Ended, LeaseLoop};
use super::report::ProcessorReport;
use super::settings::ProcessorSettings;
use skyport_runtime::balance::{self, Held};

/// A change-feed processor instance.
pub struct Processor {
    settings: ProcessorSettings,
    source: Arc<dyn ChangeSource>,
    leases: Leases,
    dead_letters: Arc<dyn DeadLetterStore>,
    lease_loop: Arc<LeaseLoop>,
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

impl Processor {
    /// A processor handing the changes of `source` to `handler`, keeping its
    /// leases in `leases` and what keeps failing in `dead_letters`; run it
    /// with [`Processor::run`].
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
        metrics::global().start_processor(&settings.processor);
        let leases = Leases {
            store: leases,
            group: settings.processor.clone(),
        };
        let lease_loop = Arc::new(LeaseLoop::new(
            settings.clone(),
            Arc::clone(&source),
            leases.clone(),
            Arc::clone(&dead_letters),
            handler,
        ));
        Arc::new(Self {
            leases,
            settings,
            source,
            dead_letters,
            lease_loop,
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
        Estimator::over(
            Arc::clone(&self.source),
            self.leases.clone(),
            self.settings.start,
        )
    }

    /// Runs until `shutdown`: balances leases, processes the owned ones and
    /// estimates; then stops every lease's processing and releases it.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        tracing::info!(processor = %self.settings.processor, instance = %self.settings.instance, "The change-feed processor started.");
        let estimating = tokio::spawn({
            let processor = Arc::clone(&self);
            let shutdown = shutdown.clone();
            async move {
                processor
                    .estimator()
                    .run_every(
                        processor.settings.estimate_interval,
                        (
                            processor.settings.processor.as_str(),
                            processor.settings.instance.as_str(),
                        ),
                        &processor.report,
                        shutdown,
                    )
                    .await;
            }
        });
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
        metrics::global()
            .change_feed_leases
            .get_or_create(&self.processor_labels())
            .set(0);
        let _ = estimating.await;
        tracing::info!(processor = %self.settings.processor, "The change-feed processor stopped and released its leases.");
    }

    fn processor_labels(&self) -> ProcessorLabels {
        ProcessorLabels {
            processor: self.settings.processor.clone(),
        }
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
            .get_or_create(&self.processor_labels())
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
                let ended = processor.lease_loop.run(lease, children, stop).await;
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
    /// and callbacks given up on, a page of `query.limit` by key, with
    /// `next` (the key of the last one, opaque) while there may be more.
    async fn inspect(&self, path: &str, query: &ReportQuery) -> Option<Result<Value, ReportError>> {
        match path.trim_end_matches('/') {
            "change-feed" => Some(
                serde_json::to_value(self.report())
                    .map_err(|e| ReportError::Unavailable(e.to_string())),
            ),
            "change-feed/dead-letters" => Some(self.dead_letter_report(query).await),
            _ => None,
        }
    }
}

impl Processor {
    /// A page of the changes and callbacks this processor gave up on.
    async fn dead_letter_report(&self, query: &ReportQuery) -> Result<Value, ReportError> {
        let after = query
            .cursor
            .as_deref()
            .map(|cursor| {
                URL_SAFE_NO_PAD
                    .decode(cursor)
                    .ok()
                    .and_then(|bytes| String::from_utf8(bytes).ok())
                    .ok_or_else(|| {
                        ReportError::Invalid("cursor is not one this report gave out".into())
                    })
            })
            .transpose()?;
        let mut letters = self
            .dead_letters
            .changes(
                &self.settings.processor,
                after.as_deref(),
                query.limit.saturating_add(1),
            )
            .await
            .map_err(|e| ReportError::Unavailable(e.to_string()))?;
        let more = letters.len() > query.limit;
        letters.truncate(query.limit);
        let next = more
            .then(|| letters.last())
            .flatten()
            .map(|last| URL_SAFE_NO_PAD.encode(&last.key));
        let items: Vec<Value> = letters
            .into_iter()
            .map(|letter| {
                json!({
                    "key": letter.key,
                    "reason": letter.reason,
                    "at": letter.at.format(&Rfc3339).unwrap_or_default(),
                    "payload": letter.payload,
                })
            })
            .collect();
        Ok(json!({"items": items, "next": next}))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::Arc;
    use std::time::Duration;

    use serde_json::{Value, json};
    use skyport_core::ports::{
        ChangeDeadLetter, DeadLetterStore, Diagnostics, ReportError, ReportQuery,
    };
    use time::OffsetDateTime;
    use tokio_util::sync::CancellationToken;

    use super::Processor;
    use crate::change_feed::fixture::{Fixture, PROCESSOR, Recorder, eventually, settings};
    use crate::change_feed::settings::ProcessorSettings;

    fn processor(
        fixture: &Fixture,
        settings: ProcessorSettings,
        recorder: &Arc<Recorder>,
    ) -> Arc<Processor> {
        Processor::new(
            settings,
            fixture.source(),
            fixture.lease_store(),
            Arc::clone(&fixture.store) as Arc<dyn DeadLetterStore>,
            Arc::clone(recorder) as _,
        )
    }

    #[tokio::test]
    async fn a_lone_processor_hands_over_every_change_and_releases_its_lease_at_shutdown() {
        let fixture = Fixture::open();
        for id in ["a", "b", "c"] {
            fixture.write(id).await;
        }
        let recorder = Arc::new(Recorder::default());
        let processor = processor(&fixture, settings("pod-0"), &recorder);
        let shutdown = CancellationToken::new();
        let running = tokio::spawn(Arc::clone(&processor).run(shutdown.clone()));
        eventually("every change is handed over", || async {
            (recorder.ids() == ["a", "b", "c"]).then_some(())
        })
        .await;
        eventually("the report shows the lease and nothing pending", || async {
            let report = processor.report();
            (report.owned == ["range.-FF"] && report.leases.len() == 1 && report.pending == 0)
                .then_some(())
        })
        .await;
        assert!(processor.degraded().is_empty());
        shutdown.cancel();
        running.await.unwrap();
        let lease = fixture.lease().await;
        assert_eq!(lease.doc.owner, None);
        assert_eq!(
            lease.doc.continuation.as_deref(),
            Some(fixture.after(3).await.as_str())
        );
    }

    #[tokio::test]
    async fn the_first_cycle_creates_the_lease_of_each_range_and_takes_it() {
        let fixture = Fixture::open();
        let recorder = Arc::new(Recorder::default());
        let processor = processor(&fixture, settings("pod-0"), &recorder);
        let shutdown = CancellationToken::new();
        processor.cycle(&shutdown).await.unwrap();
        assert_eq!(processor.report().owned, ["range.-FF"]);
        assert_eq!(fixture.lease().await.doc.owner.as_deref(), Some("pod-0"));
        shutdown.cancel();
    }

    #[tokio::test]
    async fn a_lease_a_live_instance_holds_is_left_to_it() {
        let fixture = Fixture::open();
        fixture.acquired("pod-1").await;
        let recorder = Arc::new(Recorder::default());
        let processor = processor(&fixture, settings("pod-0"), &recorder);
        processor.cycle(&CancellationToken::new()).await.unwrap();
        assert!(processor.report().owned.is_empty());
        assert_eq!(fixture.lease().await.doc.owner.as_deref(), Some("pod-1"));
    }

    #[tokio::test]
    async fn a_lease_whose_owner_stopped_renewing_is_taken_over_from_its_checkpoint() {
        let fixture = Fixture::open();
        for id in ["a", "b"] {
            fixture.write(id).await;
        }
        let acquired = fixture.acquired("pod-1").await;
        let mut doc = acquired.doc.clone();
        doc.continuation = Some(fixture.after(1).await);
        fixture
            .leases()
            .replace(&doc, &acquired.etag)
            .await
            .unwrap();
        let recorder = Arc::new(Recorder::default());
        // Expired the moment it was written: pod-1 renews no more.
        let settings = ProcessorSettings {
            expiry: Duration::ZERO,
            ..settings("pod-0")
        };
        let processor = processor(&fixture, settings, &recorder);
        let shutdown = CancellationToken::new();
        processor.cycle(&shutdown).await.unwrap();
        assert_eq!(processor.report().owned, ["range.-FF"]);
        eventually("the change after the checkpoint is handed over", || async {
            (recorder.ids() == ["b"]).then_some(())
        })
        .await;
        shutdown.cancel();
        eventually("the lease is released", || async {
            fixture.lease().await.doc.owner.is_none().then_some(())
        })
        .await;
    }

    #[tokio::test]
    async fn the_admin_inspection_lists_the_report_and_the_dead_letters_a_page_at_a_time() {
        let fixture = Fixture::open();
        for n in 0..5 {
            fixture
                .store
                .put_change(ChangeDeadLetter {
                    processor: PROCESSOR.into(),
                    key: format!("msg_d-{n}_failed"),
                    reason: "410 Gone".into(),
                    payload: json!({"webhookId": format!("msg_d-{n}_failed")}),
                    at: OffsetDateTime::UNIX_EPOCH,
                })
                .await
                .unwrap();
        }
        let recorder = Arc::new(Recorder::default());
        let processor = processor(&fixture, settings("pod-0"), &recorder);
        let page = |limit, cursor: Option<&str>| ReportQuery {
            limit,
            cursor: cursor.map(str::to_owned),
        };
        let report = processor
            .inspect("change-feed/", &page(100, None))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(report["processor"], PROCESSOR);
        assert_eq!(report["instance"], "pod-0");
        let first = processor
            .inspect("change-feed/dead-letters", &page(1, None))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            first["items"],
            json!([{
                "key": "msg_d-0_failed",
                "reason": "410 Gone",
                "at": "1970-01-01T00:00:00Z",
                "payload": {"webhookId": "msg_d-0_failed"},
            }])
        );
        let mut keys = vec![first["items"][0]["key"].clone()];
        let mut next = first["next"].as_str().unwrap().to_owned();
        loop {
            let more = processor
                .inspect("change-feed/dead-letters", &page(2, Some(&next)))
                .await
                .unwrap()
                .unwrap();
            let items = more["items"].as_array().unwrap();
            assert!(items.len() <= 2, "{more}");
            keys.extend(items.iter().map(|item| item["key"].clone()));
            match more["next"].as_str() {
                Some(cursor) => next = cursor.to_owned(),
                None => break,
            }
        }
        let expected: Vec<Value> = (0..5).map(|n| json!(format!("msg_d-{n}_failed"))).collect();
        assert_eq!(keys, expected, "every one once, by key");
        let forged = processor
            .inspect("change-feed/dead-letters", &page(2, Some("not base64!")))
            .await
            .unwrap();
        assert!(matches!(forged, Err(ReportError::Invalid(_))), "{forged:?}");
        assert!(processor.inspect("other", &page(100, None)).await.is_none());
        assert_eq!(processor.details()[0].0, "changeFeed");
    }
}
