//! What the change-feed unit tests run on: the embedded store in a temporary
//! directory on disk (its change feed, leases and dead letters are the real
//! ones), a handler that records what it is handed and fails as told, and a
//! deadline-bounded wait for what a background loop does.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use skyport_core::error::BoxError;
use skyport_core::ports::{
    Change, ChangeSource, FeedRange, LeaseStore, Precondition, StartFrom, StatusStore,
};
use skyport_core::status::StatusDocument;
use skyport_embedded::EmbeddedStore;
use skyport_runtime::config::EmbeddedSettings;
use tempfile::TempDir;
use time::OffsetDateTime;

use super::handler::ChangeHandler;
use super::lease::{LeaseDoc, Leases, Stored};
use super::settings::ProcessorSettings;

/// The lease group every test processor uses.
pub(super) const PROCESSOR: &str = "test-processor";

/// The embedded store on a temporary directory, removed when dropped.
pub(crate) struct Fixture {
    pub(crate) store: Arc<EmbeddedStore>,
    _dir: TempDir,
}

impl Fixture {
    pub(crate) fn open() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let settings = EmbeddedSettings {
            data_dir: dir.path().to_path_buf(),
            cache_size_mb: 8,
            max_batch: 64,
            queue_capacity: 1024,
            segment_size_mb: 1,
            ..EmbeddedSettings::default()
        };
        Self {
            store: EmbeddedStore::open(&settings, 1).unwrap(),
            _dir: dir,
        }
    }

    pub(super) fn source(&self) -> Arc<dyn ChangeSource> {
        Arc::clone(&self.store) as _
    }

    pub(super) fn lease_store(&self) -> Arc<dyn LeaseStore> {
        Arc::clone(&self.store) as _
    }

    pub(super) fn leases(&self) -> Leases {
        Leases {
            store: self.lease_store(),
            group: PROCESSOR.into(),
        }
    }

    /// Writes a new status document `id`: one change in the feed.
    pub(super) async fn write(&self, id: &str) {
        let document = StatusDocument::accepted(id, OffsetDateTime::UNIX_EPOCH);
        StatusStore::put(&*self.store, &document, Precondition::IfNoneMatch)
            .await
            .unwrap();
    }

    /// The lease of the store's one range, created and acquired by `owner`.
    pub(super) async fn acquired(&self, owner: &str) -> Stored {
        let leases = self.leases();
        leases
            .create(&LeaseDoc::new(&FeedRange::full()))
            .await
            .unwrap();
        let stored = leases.list().await.unwrap().remove(0);
        let mut doc = stored.doc.clone();
        doc.owner = Some(owner.into());
        leases.replace(&doc, &stored.etag).await.unwrap()
    }

    /// The lease of the store's one range as stored now.
    pub(super) async fn lease(&self) -> Stored {
        let name = super::lease::name(&FeedRange::full());
        self.leases().get(&name).await.unwrap().unwrap()
    }

    /// The continuation after the first `count` changes of the feed.
    pub(super) async fn after(&self, count: u32) -> String {
        self.store
            .read(&FeedRange::full(), None, StartFrom::Beginning, count)
            .await
            .unwrap()
            .continuation
    }
}

/// Quick timings, so that a test's loops turn within milliseconds.
pub(super) fn settings(instance: &str) -> ProcessorSettings {
    ProcessorSettings {
        processor: PROCESSOR.into(),
        instance: instance.into(),
        start: StartFrom::Beginning,
        poll_interval: Duration::from_millis(20),
        max_items: 2,
        only_with_field: None,
        max_batches_in_flight: 1,
        acquire_interval: Duration::from_millis(50),
        renew_interval: Duration::from_millis(50),
        expiry: Duration::from_secs(60),
        max_attempts: 3,
        retry_backoff: Duration::from_millis(10),
        estimate_interval: Duration::from_millis(50),
    }
}

/// One call of the handler: the ids handed over, and how many changes the
/// lease's checkpoint left pending when it was made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Call {
    pub(super) ids: Vec<String>,
    pub(super) pending_at_call: Option<u64>,
}

/// Records every batch it is handed; fails a batch holding a failing id.
#[derive(Default)]
pub(super) struct Recorder {
    calls: Mutex<Vec<Call>>,
    /// Ids whose batches fail: how many more times (`u32::MAX`: always).
    failing: Mutex<BTreeMap<String, u32>>,
    /// Where to count the pending changes at each call, when set.
    estimator: Option<super::Estimator>,
}

impl Recorder {
    /// A recorder that also notes the pending changes behind the checkpoint
    /// of the lease of `fixture` at each call.
    pub(super) fn counting(fixture: &Fixture) -> Self {
        Self {
            estimator: Some(super::Estimator::new(
                fixture.source(),
                fixture.lease_store(),
                PROCESSOR,
                StartFrom::Beginning,
            )),
            ..Self::default()
        }
    }

    /// Fails the batches holding `id`, `times` times.
    pub(super) fn fail(&self, id: &str, times: u32) {
        self.failing.lock().unwrap().insert(id.into(), times);
    }

    pub(super) fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    /// The ids handed over so far, in the order of the calls.
    pub(super) fn ids(&self) -> Vec<String> {
        self.calls().into_iter().flat_map(|call| call.ids).collect()
    }
}

#[async_trait]
impl ChangeHandler for Recorder {
    async fn handle(&self, changes: &[Change]) -> Result<(), BoxError> {
        let pending_at_call = match &self.estimator {
            Some(estimator) => Some(estimator.estimate().await?.iter().map(|e| e.pending).sum()),
            None => None,
        };
        let ids: Vec<String> = changes.iter().map(|c| c.id.clone()).collect();
        self.calls.lock().unwrap().push(Call {
            ids: ids.clone(),
            pending_at_call,
        });
        let mut failing = self.failing.lock().unwrap();
        for id in &ids {
            if let Some(left) = failing.get_mut(id)
                && *left > 0
            {
                *left = left.saturating_sub(u32::from(*left != u32::MAX));
                return Err(format!("the handler refuses {id}").into());
            }
        }
        Ok(())
    }
}

/// Polls `probe` until it yields, for at most five seconds.
pub(super) async fn eventually<T, F, Fut>(what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(found) = probe().await {
            return found;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not within five seconds"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
