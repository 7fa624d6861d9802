//! The change-feed processor on Cosmos DB (the SDK's in-memory emulator, a
//! status container of 4 feed ranges): leases shared evenly, taken over when
//! an instance stops renewing, stolen one per cycle by a newcomer; a failing
//! handler's batch handed over again, a change that always fails
//! dead-lettered; a split range carried on by child leases; the estimator's
//! count. Every change handled at least once; duplicates are printed.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use skyport_azure::cosmos::CosmosStore;
use skyport_azure::cosmos::emulator::Emulator;
use skyport_callbacks::change_feed::{ChangeHandler, Estimator, Processor, ProcessorSettings};
use skyport_core::error::BoxError;
use skyport_core::ports::{
    Change, ChangeSource, DeadLetterStore, Precondition, StartFrom, StatusStore, StatusStoreError,
};
use skyport_core::status::StatusDocument;
use skyport_runtime::config::{CosmosSettings, Millis};
use skyport_tests::eventually;
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;

/// Records every change it is handed, by instance; fails as told.
#[derive(Debug, Default)]
struct Recorder {
    batches: Mutex<Vec<(String, Vec<String>)>>,
    /// Ids whose batches fail: how many more times (`u32::MAX`: always).
    failing: Mutex<BTreeMap<String, u32>>,
}

impl Recorder {
    fn handled(&self) -> BTreeMap<String, usize> {
        let mut counts = BTreeMap::new();
        for (_, ids) in self.batches.lock().unwrap().iter() {
            for id in ids {
                *counts.entry(id.clone()).or_default() += 1;
            }
        }
        counts
    }

    fn batches(&self) -> Vec<Vec<String>> {
        self.batches
            .lock()
            .unwrap()
            .iter()
            .map(|(_, ids)| ids.clone())
            .collect()
    }
}

/// A handler for one instance, recording into a shared [`Recorder`].
struct Handler {
    instance: String,
    recorder: Arc<Recorder>,
}

#[async_trait]
impl ChangeHandler for Handler {
    async fn handle(&self, changes: &[Change]) -> Result<(), BoxError> {
        let ids: Vec<String> = changes.iter().map(|c| c.id.clone()).collect();
        self.recorder
            .batches
            .lock()
            .unwrap()
            .push((self.instance.clone(), ids.clone()));
        let mut failing = self.recorder.failing.lock().unwrap();
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

fn cosmos_settings() -> CosmosSettings {
    CosmosSettings {
        bulk_max_wait_ms: Millis::new(2),
        ..CosmosSettings::default()
    }
}

fn processor_settings(instance: &str) -> ProcessorSettings {
    ProcessorSettings {
        processor: "test-processor".into(),
        instance: instance.into(),
        start: StartFrom::Beginning,
        poll_interval: Duration::from_millis(100),
        max_items: 10,
        only_with_field: None,
        max_batches_in_flight: 4,
        acquire_interval: Duration::from_millis(400),
        renew_interval: Duration::from_millis(500),
        expiry: Duration::from_secs(3),
        max_attempts: 3,
        retry_backoff: Duration::from_millis(100),
        estimate_interval: Duration::from_millis(200),
    }
}

fn processor(
    store: &Arc<CosmosStore>,
    settings: ProcessorSettings,
    recorder: &Arc<Recorder>,
) -> Arc<Processor> {
    let handler = Handler {
        instance: settings.instance.clone(),
        recorder: Arc::clone(recorder),
    };
    Processor::new(
        settings,
        Arc::clone(store) as Arc<dyn ChangeSource>,
        Arc::clone(store) as _,
        Arc::clone(store) as Arc<dyn DeadLetterStore>,
        Arc::new(handler),
    )
}

/// A processor instance running on the test's runtime until [`Running::stop`].
struct Running {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Running {
    fn start(processor: Arc<Processor>) -> Self {
        let stop = CancellationToken::new();
        let task = tokio::spawn(processor.run(stop.clone()));
        Self { stop, task }
    }

    /// Stops it as a shutdown does: its leases are released.
    async fn stop(self) {
        self.stop.cancel();
        self.task.await.unwrap();
    }
}

async fn write(store: &Arc<CosmosStore>, ids: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut written = Vec::new();
    for id in ids {
        let document = StatusDocument::accepted(id.clone(), OffsetDateTime::now_utc());
        // A write during a split may be refused (410, completing split):
        // as the worker's status writer does, write again.
        let mut tries = 0;
        loop {
            match StatusStore::put(&**store, &document, Precondition::IfNoneMatch).await {
                Ok(_) | Err(StatusStoreError::PreconditionFailed) => break,
                Err(e) if tries < 100 => {
                    tries += 1;
                    tracing::debug!(error = %e, "A test write is retried.");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("{id} was not written: {e}"),
            }
        }
        written.push(id);
    }
    written
}

/// Waits until every id in `ids` was handled at least once.
async fn all_handled(recorder: &Recorder, ids: &[String], within: Duration) {
    eventually("every change handled", within, || async {
        let handled = recorder.handled();
        ids.iter().all(|id| handled.contains_key(id)).then_some(())
    })
    .await;
}

fn duplicates(recorder: &Recorder) -> usize {
    recorder.handled().values().map(|n| n - 1).sum()
}

/// A runtime of its own, so that dropping it stops an instance the way a
/// crash does: nothing released, nothing renewed.
fn own_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_share_leases_take_over_the_silent_and_let_a_newcomer_steal_its_share() {
    let emulator = Emulator::new(false).unwrap();
    let store = emulator.store(&cosmos_settings()).await.unwrap();
    let recorder = Arc::new(Recorder::default());
    let first = write(&store, (0..40).map(|n| format!("doc-{n}"))).await;

    let a = processor(&store, processor_settings("a"), &recorder);
    let running_a = Running::start(Arc::clone(&a));
    let b_runtime = own_runtime();
    let b_store = b_runtime
        .spawn({
            let emulator = emulator.clone();
            async move { emulator.store(&cosmos_settings()).await }
        })
        .await
        .unwrap()
        .unwrap();
    let b = processor(&b_store, processor_settings("b"), &recorder);
    b_runtime.spawn(Arc::clone(&b).run(CancellationToken::new()));

    eventually(
        "a and b hold 2 leases each",
        Duration::from_secs(30),
        || async { (a.report().owned.len() == 2 && b.report().owned.len() == 2).then_some(()) },
    )
    .await;
    all_handled(&recorder, &first, Duration::from_secs(30)).await;
    println!(
        "2 instances: a holds {:?}, b holds {:?}; {} changes handled, {} duplicates",
        a.report().owned,
        b.report().owned,
        first.len(),
        duplicates(&recorder)
    );

    // b stops renewing (its runtime is gone): a owns all 4 within the expiry.
    b_runtime.shutdown_background();
    let silent_at = std::time::Instant::now();
    eventually("a holds all 4 leases", Duration::from_secs(10), || async {
        (a.report().owned.len() == 4).then_some(())
    })
    .await;
    let took = silent_at.elapsed();
    println!("a owned all 4 leases {took:?} after b went silent (expiry 3 s)");
    assert!(took < Duration::from_secs(5), "{took:?}");
    let second = write(&store, (40..60).map(|n| format!("doc-{n}"))).await;
    all_handled(&recorder, &second, Duration::from_secs(30)).await;

    // c joins: nothing is free, so it steals one lease per cycle up to 2.
    let c = processor(&store, processor_settings("c"), &recorder);
    let running_c = Running::start(Arc::clone(&c));
    let mut counts = vec![0];
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while c.report().owned.len() < 2 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let owned = c.report().owned.len();
        if counts.last() != Some(&owned) {
            counts.push(owned);
        }
    }
    println!("c's leases as it joined: {counts:?}");
    assert_eq!(counts, [0, 1, 2], "one lease stolen per cycle");
    eventually("a keeps 2", Duration::from_secs(10), || async {
        (a.report().owned.len() == 2).then_some(())
    })
    .await;
    let third = write(&store, (60..80).map(|n| format!("doc-{n}"))).await;
    all_handled(&recorder, &third, Duration::from_secs(30)).await;
    let instances: BTreeSet<String> = recorder
        .batches
        .lock()
        .unwrap()
        .iter()
        .map(|(instance, _)| instance.clone())
        .collect();
    println!(
        "80 changes handled by {instances:?}, {} duplicates",
        duplicates(&recorder)
    );
    running_a.stop().await;
    running_c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_batch_is_handed_over_again_and_a_change_that_always_fails_is_dead_lettered() {
    let store = Emulator::new(false)
        .unwrap()
        .store(&cosmos_settings())
        .await
        .unwrap();
    let recorder = Arc::new(Recorder::default());
    recorder
        .failing
        .lock()
        .unwrap()
        .extend([("once".to_owned(), 1), ("poison".to_owned(), u32::MAX)]);
    let mut ids = write(&store, (0..30).map(|n| format!("doc-{n}"))).await;
    ids.extend(write(&store, ["once".to_owned(), "poison".to_owned()]).await);
    let mut settings = processor_settings("solo");
    settings.max_batches_in_flight = 1;
    let solo = processor(&store, settings, &recorder);
    let running = Running::start(Arc::clone(&solo));
    let letters = eventually(
        "the poison change dead-lettered",
        Duration::from_secs(30),
        || {
            let store = Arc::clone(&store);
            async move {
                let letters = DeadLetterStore::changes(&*store, "test-processor", None, 100)
                    .await
                    .unwrap();
                (!letters.is_empty()).then_some(letters)
            }
        },
    )
    .await;
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(letters[0].key, "poison");
    assert!(letters[0].reason.contains("refuses poison"), "{letters:?}");
    all_handled(&recorder, &ids, Duration::from_secs(30)).await;
    let batches = recorder.batches();
    let with_once: Vec<&Vec<String>> = batches
        .iter()
        .filter(|batch| batch.contains(&"once".to_owned()))
        .collect();
    assert!(with_once.len() >= 2, "{batches:?}");
    assert_eq!(
        with_once[0], with_once[1],
        "the failed batch is handed over again, whole and in order"
    );
    let poison_batches = batches
        .iter()
        .filter(|b| b.contains(&"poison".to_owned()))
        .count();
    println!(
        "{} batches; the one with 'once' handed over twice; 'poison' in {poison_batches} batches, then dead-lettered",
        batches.len()
    );
    // The lease moved on: what is written next is handled, and nothing is pending.
    let later = write(&store, (30..40).map(|n| format!("doc-{n}"))).await;
    all_handled(&recorder, &later, Duration::from_secs(30)).await;
    let estimator = solo.estimator();
    eventually("nothing pending", Duration::from_secs(30), || async {
        let pending: u64 = estimator
            .estimate()
            .await
            .unwrap()
            .iter()
            .map(|e| e.pending)
            .sum();
        (pending == 0).then_some(())
    })
    .await;
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_range_is_carried_on_by_child_leases_from_the_parents_position() {
    let emulator = Emulator::new(false).unwrap();
    let settings = cosmos_settings();
    let store = emulator.store(&settings).await.unwrap();
    let recorder = Arc::new(Recorder::default());
    let before = write(&store, (0..40).map(|n| format!("doc-{n}"))).await;
    let solo = processor(&store, processor_settings("solo"), &recorder);
    let running = Running::start(Arc::clone(&solo));
    all_handled(&recorder, &before, Duration::from_secs(30)).await;

    let ranges = store.ranges().await.unwrap();
    assert_eq!(ranges.len(), 4);
    let writing = tokio::spawn({
        let store = Arc::clone(&store);
        async move { write(&store, (40..80).map(|n| format!("doc-{n}"))).await }
    });
    emulator
        .split(
            &settings.database,
            &settings.status_container,
            &ranges[1],
            Duration::from_millis(200),
        )
        .await
        .unwrap();
    let during = writing.await.unwrap();
    let after = write(&store, (80..100).map(|n| format!("doc-{n}"))).await;
    all_handled(&recorder, &during, Duration::from_secs(30)).await;
    all_handled(&recorder, &after, Duration::from_secs(30)).await;
    eventually(
        "5 leases, one per range",
        Duration::from_secs(30),
        || async { (solo.report().owned.len() == 5).then_some(()) },
    )
    .await;
    let report = solo.report();
    println!(
        "after the split of {:?}: leases {:?}; 100 changes handled, {} duplicates",
        ranges[1],
        report.owned,
        duplicates(&recorder)
    );
    let children: Vec<&String> = report
        .owned
        .iter()
        .filter(|name| {
            name.starts_with(&format!("range.{}-", ranges[1].min))
                || name.ends_with(&format!("-{}", ranges[1].max))
        })
        .collect();
    assert!(children.len() >= 2, "{report:?}");
    assert!(
        !report
            .owned
            .contains(&format!("range.{}", ranges[1].name())),
        "the parent lease is retired"
    );
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn merged_ranges_keep_their_leases_each_reading_its_part() {
    let emulator = Emulator::new(false).unwrap();
    let settings = cosmos_settings();
    let store = emulator.store(&settings).await.unwrap();
    let recorder = Arc::new(Recorder::default());
    let before = write(&store, (0..40).map(|n| format!("doc-{n}"))).await;
    let solo = processor(&store, processor_settings("solo"), &recorder);
    let running = Running::start(Arc::clone(&solo));
    all_handled(&recorder, &before, Duration::from_secs(30)).await;
    let leases = solo.report().owned;
    let ranges = store.ranges().await.unwrap();
    let writing = tokio::spawn({
        let store = Arc::clone(&store);
        async move { write(&store, (40..80).map(|n| format!("doc-{n}"))).await }
    });
    emulator
        .merge(
            &settings.database,
            &settings.status_container,
            &ranges[2],
            &ranges[3],
            Duration::from_millis(200),
        )
        .await
        .unwrap();
    let during = writing.await.unwrap();
    assert_eq!(store.ranges().await.unwrap().len(), 3, "the merge happened");
    let after = write(&store, (80..100).map(|n| format!("doc-{n}"))).await;
    all_handled(&recorder, &during, Duration::from_secs(30)).await;
    all_handled(&recorder, &after, Duration::from_secs(30)).await;
    // A few cycles later the leases are still the four of before.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(solo.report().owned, leases);
    println!(
        "after merging {:?} and {:?}: leases {leases:?}; 100 changes handled, {} duplicates",
        ranges[2],
        ranges[3],
        duplicates(&recorder)
    );
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_estimator_counts_what_a_stopped_processor_has_not_handled() {
    let store = Emulator::new(false)
        .unwrap()
        .store(&cosmos_settings())
        .await
        .unwrap();
    let recorder = Arc::new(Recorder::default());
    let first = write(&store, (0..20).map(|n| format!("doc-{n}"))).await;
    let solo = processor(&store, processor_settings("solo"), &recorder);
    let running = Running::start(Arc::clone(&solo));
    all_handled(&recorder, &first, Duration::from_secs(30)).await;
    let estimator = Estimator::new(
        Arc::clone(&store) as Arc<dyn ChangeSource>,
        Arc::clone(&store) as _,
        "test-processor",
        StartFrom::Beginning,
    );
    let total = || async {
        estimator
            .estimate()
            .await
            .unwrap()
            .iter()
            .map(|e| e.pending)
            .sum::<u64>()
    };
    eventually("the estimate drained", Duration::from_secs(30), || async {
        (total().await == 0).then_some(())
    })
    .await;
    running.stop().await;

    write(&store, (20..30).map(|n| format!("doc-{n}"))).await;
    let stopped = total().await;
    println!("processor stopped, 10 writes: the estimator counts {stopped} pending");
    assert_eq!(stopped, 10);

    let again = processor(&store, processor_settings("solo"), &recorder);
    let running = Running::start(Arc::clone(&again));
    eventually(
        "the estimate drained again",
        Duration::from_secs(30),
        || async { (total().await == 0).then_some(()) },
    )
    .await;
    eventually(
        "the report says 0 pending",
        Duration::from_secs(10),
        || async {
            let report = again.report();
            (report.pending == 0 && report.leases.len() == 4).then_some(())
        },
    )
    .await;
    running.stop().await;
}
