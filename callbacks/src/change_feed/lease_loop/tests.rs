#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use skyport_core::ports::{DeadLetterStore, FeedRange};
use tokio_util::sync::CancellationToken;

use super::{Ended, LeaseLoop};
use crate::change_feed::fixture::{Call, Fixture, PROCESSOR, Recorder, eventually, settings};
use crate::change_feed::settings::ProcessorSettings;

fn lease_loop(
    fixture: &Fixture,
    settings: ProcessorSettings,
    recorder: &Arc<Recorder>,
) -> Arc<LeaseLoop> {
    Arc::new(LeaseLoop::new(
        settings,
        fixture.source(),
        fixture.leases(),
        Arc::clone(&fixture.store) as Arc<dyn DeadLetterStore>,
        Arc::clone(recorder) as _,
    ))
}

/// Runs the loop of the store's one lease, acquired by `pod-0`, until
/// `handled` ids were handed over; then stops it.
async fn run_until(
    fixture: &Fixture,
    settings: ProcessorSettings,
    recorder: &Arc<Recorder>,
    handled: usize,
) -> Ended {
    let lease = fixture.acquired("pod-0").await;
    let stop = CancellationToken::new();
    let running = tokio::spawn({
        let lease_loop = lease_loop(fixture, settings, recorder);
        let stop = stop.clone();
        async move { lease_loop.run(lease, Vec::new(), stop).await }
    });
    eventually("the changes are handed over", || async {
        (recorder.ids().len() >= handled).then_some(())
    })
    .await;
    let last = fixture.after(u32::MAX).await;
    eventually("the last batch is checkpointed", || async {
        (fixture.lease().await.doc.continuation.as_deref() == Some(last.as_str())).then_some(())
    })
    .await;
    stop.cancel();
    running.await.unwrap()
}

fn call(ids: &[&str], pending_at_call: u64) -> Call {
    Call {
        ids: ids.iter().map(|&id| id.to_owned()).collect(),
        pending_at_call: Some(pending_at_call),
    }
}

#[tokio::test]
async fn changes_are_handed_over_in_order_and_checkpointed_after_each_batch() {
    let fixture = Fixture::open();
    for id in ["a", "b", "c", "d", "e"] {
        fixture.write(id).await;
    }
    let recorder = Arc::new(Recorder::counting(&fixture));
    let ended = run_until(&fixture, settings("pod-0"), &recorder, 5).await;
    assert_eq!(ended, Ended::Stopped);
    // Each batch is handed over once the one before it is checkpointed.
    assert_eq!(
        recorder.calls(),
        [call(&["a", "b"], 5), call(&["c", "d"], 3), call(&["e"], 1)]
    );
}

#[tokio::test]
async fn a_failed_batch_is_handed_over_again_from_the_last_checkpoint() {
    let fixture = Fixture::open();
    for id in ["a", "b", "c", "d", "e"] {
        fixture.write(id).await;
    }
    let recorder = Arc::new(Recorder::counting(&fixture));
    recorder.fail("c", 1);
    run_until(&fixture, settings("pod-0"), &recorder, 7).await;
    // The checkpoint stays before the failed batch until it is handled.
    assert_eq!(
        recorder.calls(),
        [
            call(&["a", "b"], 5),
            call(&["c", "d"], 3),
            call(&["c", "d"], 3),
            call(&["e"], 1),
        ]
    );
    assert!(
        fixture
            .store
            .changes(PROCESSOR, None, 100)
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn a_change_that_keeps_failing_is_dead_lettered_and_the_lease_moves_on() {
    let fixture = Fixture::open();
    for id in ["a", "b", "c"] {
        fixture.write(id).await;
    }
    let recorder = Arc::new(Recorder::default());
    recorder.fail("a", u32::MAX);
    let settings = ProcessorSettings {
        max_attempts: 2,
        ..settings("pod-0")
    };
    run_until(&fixture, settings, &recorder, 7).await;
    // Twice as a batch, then each change alone.
    assert_eq!(recorder.ids(), ["a", "b", "a", "b", "a", "b", "c"]);
    let letters = fixture.store.changes(PROCESSOR, None, 100).await.unwrap();
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].key, "a");
    assert_eq!(letters[0].reason, "the handler refuses a");
}

#[tokio::test]
async fn a_stopped_lease_is_released_with_its_checkpoint() {
    let fixture = Fixture::open();
    fixture.write("a").await;
    let recorder = Arc::new(Recorder::default());
    run_until(&fixture, settings("pod-0"), &recorder, 1).await;
    let lease = fixture.lease().await;
    assert_eq!(lease.doc.owner, None);
    assert_eq!(
        lease.doc.continuation.as_deref(),
        Some(fixture.after(1).await.as_str())
    );
}

/// Fails every write of the store once it has handled a batch, so that
/// the batch's checkpoint cannot be written.
struct FailsTheStoreAfterOneBatch {
    store: Arc<skyport_embedded::EmbeddedStore>,
    handled: std::sync::atomic::AtomicBool,
}

#[async_trait::async_trait]
impl crate::change_feed::ChangeHandler for FailsTheStoreAfterOneBatch {
    async fn handle(
        &self,
        _changes: &[skyport_core::ports::Change],
    ) -> Result<(), skyport_core::error::BoxError> {
        self.store.faults().fail_writes(true);
        self.handled
            .store(true, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }
}

#[tokio::test]
async fn a_stop_ends_a_checkpoint_the_failing_store_keeps_refusing() {
    let fixture = Fixture::open();
    fixture.write("a").await;
    let lease = fixture.acquired("pod-0").await;
    let handler = Arc::new(FailsTheStoreAfterOneBatch {
        store: Arc::clone(&fixture.store),
        handled: std::sync::atomic::AtomicBool::new(false),
    });
    let lease_loop = Arc::new(LeaseLoop::new(
        settings("pod-0"),
        fixture.source(),
        fixture.leases(),
        Arc::clone(&fixture.store) as Arc<dyn DeadLetterStore>,
        Arc::clone(&handler) as _,
    ));
    let stop = CancellationToken::new();
    let running = tokio::spawn({
        let stop = stop.clone();
        async move { lease_loop.run(lease, Vec::new(), stop).await }
    });
    eventually("the batch is handled and the store fails", || async {
        handler
            .handled
            .load(std::sync::atomic::Ordering::SeqCst)
            .then_some(())
    })
    .await;
    // Past the first refused checkpoint, into its retries.
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    stop.cancel();
    let ended = tokio::time::timeout(std::time::Duration::from_secs(5), running)
        .await
        .expect("the loop ends once stopped, though its checkpoint is never written")
        .unwrap();
    assert_eq!(ended, Ended::Stopped);
    fixture.store.faults().fail_writes(false);
    assert_ne!(
        fixture.lease().await.doc.continuation,
        Some(fixture.after(1).await),
        "the batch was not checkpointed: it is handed over again"
    );
}

#[tokio::test]
async fn a_lease_another_instance_took_ends_lost_and_stays_theirs() {
    let fixture = Fixture::open();
    let lease = fixture.acquired("pod-0").await;
    let recorder = Arc::new(Recorder::default());
    let running = tokio::spawn({
        let lease_loop = lease_loop(&fixture, settings("pod-0"), &recorder);
        async move {
            lease_loop
                .run(lease, Vec::new(), CancellationToken::new())
                .await
        }
    });
    // Taken at the version last written (the loop's first checkpoint may come first).
    eventually("pod-1 takes the lease", || async {
        let current = fixture.lease().await;
        let mut stolen = current.doc.clone();
        stolen.owner = Some("pod-1".into());
        fixture.leases().replace(&stolen, &current.etag).await.ok()
    })
    .await;
    // The next renewal finds the lease taken.
    assert_eq!(running.await.unwrap(), Ended::Lost);
    assert_eq!(fixture.lease().await.doc.owner.as_deref(), Some("pod-1"));
}

#[tokio::test]
async fn a_split_range_is_carried_on_by_child_leases_from_the_parents_checkpoint() {
    let fixture = Fixture::open();
    let acquired = fixture.acquired("pod-0").await;
    let mut doc = acquired.doc.clone();
    doc.continuation = Some("7".into());
    let lease = fixture
        .leases()
        .replace(&doc, &acquired.etag)
        .await
        .unwrap();
    let children = vec![
        FeedRange {
            min: String::new(),
            max: "7F".into(),
        },
        FeedRange {
            min: "7F".into(),
            max: "FF".into(),
        },
    ];
    let recorder = Arc::new(Recorder::default());
    let ended = lease_loop(&fixture, settings("pod-0"), &recorder)
        .run(lease, children, CancellationToken::new())
        .await;
    assert_eq!(ended, Ended::Split);
    let leases = fixture.leases().list().await.unwrap();
    let summary: Vec<(&str, Option<&str>, Option<&str>, bool)> = leases
        .iter()
        .map(|lease| {
            (
                lease.name.as_str(),
                lease.doc.owner.as_deref(),
                lease.doc.continuation.as_deref(),
                lease.doc.retired,
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("range.-7F", Some("pod-0"), Some("7"), false),
            ("range.-FF", None, Some("7"), true),
            ("range.7F-FF", Some("pod-0"), Some("7"), false),
        ]
    );
    assert!(recorder.calls().is_empty());
}
