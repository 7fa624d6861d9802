//! The change feed of the status container on the SDK's in-memory emulator:
//! its four ranges, reading every change once through continuations,
//! pending counts, a split read from the parent's continuation, and the
//! dead letters of changes.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use skyport_core::ports::{
    ChangeDeadLetter, ChangeFeedError, ChangeSource, DeadLetter, DeadLetterStore, FeedRange,
    Precondition, StartFrom, StatusStore,
};
use skyport_core::status::StatusDocument;
use skyport_runtime::config::{CosmosSettings, Millis, ThroughputGroupSettings, Work};
use time::OffsetDateTime;

use crate::cosmos::CosmosStore;
use crate::cosmos::emulator::Emulator;
use crate::cosmos::request_units::Operation;

fn settings() -> CosmosSettings {
    CosmosSettings {
        bulk_max_wait_ms: Millis::new(5),
        ..CosmosSettings::default()
    }
}

async fn open() -> (Emulator, Arc<CosmosStore>) {
    let emulator = Emulator::new(false).unwrap();
    let store = emulator.store(&settings()).await.unwrap();
    (emulator, store)
}

/// Creates the status documents `{prefix}-0` … `{prefix}-{count - 1}`.
async fn write(store: &CosmosStore, prefix: &str, count: usize) -> Vec<String> {
    let mut ids = Vec::new();
    for n in 0..count {
        let id = format!("{prefix}-{n}");
        let document = StatusDocument::accepted(id.clone(), OffsetDateTime::now_utc());
        StatusStore::put(store, &document, Precondition::IfNoneMatch)
            .await
            .unwrap();
        ids.push(id);
    }
    ids
}

/// Reads `range` five changes at a time until a page is empty: the ids
/// read, and the continuation to go on from.
async fn drain(
    store: &CosmosStore,
    range: &FeedRange,
    mut from: Option<String>,
) -> (Vec<String>, String) {
    let mut ids = Vec::new();
    loop {
        let page = store
            .read(range, from.as_deref(), StartFrom::Beginning, 5)
            .await
            .unwrap();
        assert!(page.changes.len() <= 5, "{} changes", page.changes.len());
        for change in &page.changes {
            assert_eq!(change.document["id"], change.id.as_str());
            assert!(
                change
                    .document
                    .as_object()
                    .unwrap()
                    .keys()
                    .all(|key| !key.starts_with('_')),
                "{}",
                change.document
            );
        }
        let empty = page.changes.is_empty();
        ids.extend(page.changes.into_iter().map(|change| change.id));
        if empty {
            return (ids, page.continuation);
        }
        from = Some(page.continuation);
    }
}

/// Every range read to its end from `from` (or from the beginning): the ids
/// read, in all, and each range's continuation.
async fn drain_all(
    store: &CosmosStore,
    ranges: &[FeedRange],
    from: &BTreeMap<FeedRange, String>,
) -> (Vec<String>, BTreeMap<FeedRange, String>) {
    let mut ids = Vec::new();
    let mut continuations = BTreeMap::new();
    for range in ranges {
        let (read, continuation) = drain(store, range, from.get(range).cloned()).await;
        ids.extend(read);
        continuations.insert(range.clone(), continuation);
    }
    ids.sort();
    (ids, continuations)
}

async fn pending(store: &CosmosStore, continuations: &BTreeMap<FeedRange, String>) -> u64 {
    let mut total = 0;
    for (range, continuation) in continuations {
        total += store
            .pending(range, Some(continuation), StartFrom::Beginning)
            .await
            .unwrap();
    }
    total
}

fn sorted(mut ids: Vec<String>) -> Vec<String> {
    ids.sort();
    ids
}

#[tokio::test]
async fn the_status_container_has_four_ranges_over_the_key_space() {
    let (_emulator, store) = open().await;
    let ranges = store.ranges().await.unwrap();
    assert_eq!(ranges.len(), 4, "{ranges:?}");
    assert_eq!(ranges[0].min, "");
    assert_eq!(ranges[3].max, "FF");
    for pair in ranges.windows(2) {
        assert_eq!(pair[0].max, pair[1].min, "{ranges:?}");
    }
    assert!(ranges.iter().all(|r| FeedRange::full().contains(r)));
}

#[tokio::test]
async fn every_change_is_read_once_and_pending_counts_the_writes_after() {
    let (_emulator, store) = open().await;
    let ranges = store.ranges().await.unwrap();
    let first = write(&store, "first", 20).await;

    // Nothing is pending from now; everything from the beginning.
    let mut from_beginning = 0;
    for range in &ranges {
        assert_eq!(store.pending(range, None, StartFrom::Now).await.unwrap(), 0);
        from_beginning += store
            .pending(range, None, StartFrom::Beginning)
            .await
            .unwrap();
    }
    assert_eq!(from_beginning, 20);

    let (read, continuations) = drain_all(&store, &ranges, &BTreeMap::new()).await;
    assert_eq!(read, sorted(first.clone()));

    // From the final continuations: nothing more, nothing pending.
    let (again, after) = drain_all(&store, &ranges, &continuations).await;
    assert!(again.is_empty(), "{again:?}");
    assert_eq!(pending(&store, &after).await, 0);

    // Ten writes: exactly ten pending, over all the ranges.
    let second = write(&store, "second", 10).await;
    assert_eq!(pending(&store, &after).await, 10);
    let (read, after) = drain_all(&store, &ranges, &after).await;
    assert_eq!(read, sorted(second));
    assert_eq!(pending(&store, &after).await, 0);

    // A document written again is a change again, counted once per write.
    for id in &first[..3] {
        let current = StatusStore::get(&*store, id).await.unwrap().unwrap();
        let mut document = current.document;
        document.attempt += 1;
        StatusStore::put(&*store, &document, Precondition::IfMatch(current.etag))
            .await
            .unwrap();
    }
    assert_eq!(pending(&store, &after).await, 3);
    let (read, _) = drain_all(&store, &ranges, &after).await;
    assert_eq!(read, sorted(first[..3].to_vec()));
}

#[tokio::test]
async fn an_empty_range_read_from_the_beginning_goes_on_from_there() {
    let (_emulator, store) = open().await;
    let ranges = store.ranges().await.unwrap();
    let (read, continuations) = drain_all(&store, &ranges, &BTreeMap::new()).await;
    assert!(read.is_empty());
    for range in &ranges {
        assert_eq!(
            store
                .pending(range, None, StartFrom::Beginning)
                .await
                .unwrap(),
            0
        );
    }
    assert_eq!(pending(&store, &continuations).await, 0);
    let written = write(&store, "new", 7).await;
    assert_eq!(pending(&store, &continuations).await, 7);
    let (read, _) = drain_all(&store, &ranges, &continuations).await;
    assert_eq!(read, sorted(written));
}

#[tokio::test]
async fn a_read_from_now_sees_only_later_writes() {
    let (_emulator, store) = open().await;
    let ranges = store.ranges().await.unwrap();
    write(&store, "before", 8).await;
    let mut continuations = BTreeMap::new();
    for range in &ranges {
        let page = store.read(range, None, StartFrom::Now, 5).await.unwrap();
        assert!(page.changes.is_empty(), "{:?}", page.changes);
        continuations.insert(range.clone(), page.continuation);
    }
    assert_eq!(pending(&store, &continuations).await, 0);
    let after = write(&store, "after", 6).await;
    assert_eq!(pending(&store, &continuations).await, 6);
    let (read, _) = drain_all(&store, &ranges, &continuations).await;
    assert_eq!(read, sorted(after));
}

#[tokio::test]
async fn the_children_of_a_split_range_go_on_from_the_parents_continuation() {
    let (emulator, store) = open().await;
    let ranges = store.ranges().await.unwrap();
    let first = write(&store, "first", 20).await;
    let (read, continuations) = drain_all(&store, &ranges, &BTreeMap::new()).await;
    assert_eq!(read, sorted(first));

    let before_split = write(&store, "before-split", 12).await;
    let parent = ranges[1].clone();
    let settings = settings();
    emulator
        .split(
            &settings.database,
            &settings.status_container,
            &parent,
            Duration::from_millis(50),
        )
        .await
        .unwrap();
    let after_split = write(&store, "after-split", 12).await;

    let split = store.ranges().await.unwrap();
    assert_eq!(split.len(), 5, "{split:?}");
    let children: Vec<FeedRange> = split
        .iter()
        .filter(|range| parent.contains(range))
        .cloned()
        .collect();
    assert_eq!(children.len(), 2, "{split:?}");
    assert_eq!(children[0].min, parent.min);
    assert_eq!(children[0].max, children[1].min);
    assert_eq!(children[1].max, parent.max);

    // Each child goes on from its parent's continuation; the other ranges
    // from their own.
    let from: BTreeMap<FeedRange, String> = split
        .iter()
        .map(|range| {
            let owner = ranges.iter().find(|r| r.contains(range)).unwrap();
            (range.clone(), continuations[owner].clone())
        })
        .collect();
    let pending_after_split = pending(&store, &from).await;
    let (read, after) = drain_all(&store, &split, &from).await;
    let mut written = before_split;
    written.extend(after_split);
    assert_eq!(read, sorted(written));
    let mut in_children = Vec::new();
    for child in &children {
        in_children.extend(drain(&store, child, from.get(child).cloned()).await.0);
    }
    assert!(!in_children.is_empty(), "the parent's range had changes");
    // Each child counts its parent's writes from before the split, and the
    // split's own LSN: an estimate above what is left, never below.
    assert!(pending_after_split >= 24, "{pending_after_split}");
    assert_eq!(pending(&store, &after).await, 0);
}

#[tokio::test]
async fn after_a_split_with_nothing_new_nothing_is_pending_once_the_children_are_read() {
    let (emulator, store) = open().await;
    let ranges = store.ranges().await.unwrap();
    write(&store, "first", 20).await;
    let (_, continuations) = drain_all(&store, &ranges, &BTreeMap::new()).await;
    let settings = settings();
    emulator
        .split(
            &settings.database,
            &settings.status_container,
            &ranges[2],
            Duration::ZERO,
        )
        .await
        .unwrap();
    let split = store.ranges().await.unwrap();
    let from: BTreeMap<FeedRange, String> = split
        .iter()
        .map(|range| {
            let owner = ranges.iter().find(|r| r.contains(range)).unwrap();
            (range.clone(), continuations[owner].clone())
        })
        .collect();
    // The emulator starts each child one LSN past its parent: one change
    // seems pending in each until it is read.
    assert_eq!(pending(&store, &from).await, 2);
    let (read, after) = drain_all(&store, &split, &from).await;
    assert!(read.is_empty(), "{read:?}");
    assert_eq!(pending(&store, &after).await, 0);
}

#[tokio::test]
async fn the_change_feed_is_its_own_work_and_operation() {
    let emulator = Emulator::new(false).unwrap();
    let group = ThroughputGroupSettings {
        container: "status".into(),
        work: vec![Work::ChangeFeed],
        target_ru_per_s: Some(1_000),
        ..ThroughputGroupSettings::default()
    };
    let store = emulator
        .store(&CosmosSettings {
            throughput_groups: [("feed".to_owned(), group)].into(),
            ..settings()
        })
        .await
        .unwrap();
    let ranges = store.ranges().await.unwrap();
    write(&store, "doc", 4).await;
    drain_all(&store, &ranges, &BTreeMap::new()).await;
    let (requests, units) = store.request_units().spent(Operation::ChangeFeed);
    assert!(requests >= 5, "{requests}");
    let feed = store.throughput_groups().remove(0);
    assert_eq!(feed.name, "feed");
    assert!(
        feed.spent > 0.0 && (feed.spent - units).abs() < 1e-9,
        "{feed:?} {units}"
    );
}

#[tokio::test]
async fn a_continuation_this_source_did_not_give_out_is_refused() {
    let (_emulator, store) = open().await;
    let range = store.ranges().await.unwrap().remove(0);
    for bad in ["17", r#"{"token":"c1.!!!notvalid!!!","lsn":3}"#] {
        let refused = store.read(&range, Some(bad), StartFrom::Beginning, 5).await;
        assert!(
            matches!(&refused, Err(ChangeFeedError::BadContinuation { continuation, .. }) if continuation == bad),
            "{refused:?}"
        );
    }
    let refused = store.pending(&range, Some("nope"), StartFrom::Now).await;
    assert!(matches!(
        refused,
        Err(ChangeFeedError::BadContinuation { .. })
    ));
}

#[tokio::test]
async fn the_changes_given_up_on_are_kept_by_processor_and_key() {
    let (_emulator, store) = open().await;
    let at = OffsetDateTime::from_unix_timestamp(1_700_000_000).unwrap();
    let letter = |processor: &str, key: &str, reason: &str| ChangeDeadLetter {
        processor: processor.into(),
        key: key.into(),
        reason: reason.into(),
        payload: serde_json::json!({"id": key, "state": "Failed"}),
        at,
    };
    store
        .put_change(letter("notify", "d2.Failed", "refused"))
        .await
        .unwrap();
    store
        .put_change(letter("notify", "d1/x?#.Failed", "timed out"))
        .await
        .unwrap();
    store
        .put_change(letter("notify", "d2.Failed", "refused again"))
        .await
        .unwrap();
    store
        .put_change(letter("notify.v2", "d3.Failed", "other"))
        .await
        .unwrap();
    DeadLetterStore::put(
        &*store,
        DeadLetter {
            partition: 3,
            offset: 7,
            reason: "poison".into(),
            payload: bytes::Bytes::from_static(b"\x00not json"),
            at,
        },
    )
    .await
    .unwrap();

    assert_eq!(
        store.changes("notify", None, 100).await.unwrap(),
        [
            letter("notify", "d1/x?#.Failed", "timed out"),
            letter("notify", "d2.Failed", "refused again"),
        ]
    );
    assert_eq!(
        store.changes("notify.v2", None, 100).await.unwrap(),
        [letter("notify.v2", "d3.Failed", "other")]
    );
    assert!(store.changes("nobody", None, 100).await.unwrap().is_empty());
    let events = store.events(None, 100).await.unwrap();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!((events[0].partition, events[0].offset), (3, 7));
}
