//! The embedded store against its contract: durable appends in key order,
//! conditional status writes, checkpoints that resume readers and trim the log.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use time::OffsetDateTime;

use skyport_core::ports::{
    Consumer, DeadLetter, DeadLetterStore, EventProperties, OutboundEvent, PartitionReader,
    Precondition, Publisher, StatusStore, StatusStoreError,
};
use skyport_core::status::{DeliveryState, StatusDocument};
use skyport_runtime::config::EmbeddedSettings;

use crate::consumer::EmbeddedConsumer;
use crate::setup::{OpenError, RECEIPT_KEY_LEN};
use crate::store::EmbeddedStore;

/// A status row as the tests compare it: id, version, change number,
/// retention window, body.
pub(crate) type Row = (String, u64, Option<u64>, Option<i64>, Vec<u8>);

/// Every row of the status table, in id order.
pub(crate) fn status_rows(db: &redb::Database) -> Vec<Row> {
    use redb::{ReadableDatabase, ReadableTable};
    let txn = db.begin_read().unwrap();
    let status = txn.open_table(crate::tables::STATUS).unwrap();
    status
        .iter()
        .unwrap()
        .map(|entry| {
            let (id, row) = entry.unwrap();
            let (version, change, settled, body) = row.value();
            (
                id.value().to_owned(),
                version,
                change,
                settled,
                body.to_vec(),
            )
        })
        .collect()
}

pub(crate) fn settings(dir: &std::path::Path) -> EmbeddedSettings {
    EmbeddedSettings {
        data_dir: dir.to_path_buf(),
        cache_size_mb: 8,
        max_batch: 64,
        queue_capacity: 1024,
        segment_size_mb: 1,
        ..EmbeddedSettings::default()
    }
}

pub(crate) fn event(key: &str) -> OutboundEvent {
    OutboundEvent {
        key: key.to_owned(),
        payload: Bytes::from(format!("payload-{key}")),
        properties: EventProperties::default(),
        lane: skyport_core::ports::Lane::Normal,
    }
}

pub(crate) async fn next_batch(
    reader: &mut Box<dyn PartitionReader>,
    max: usize,
) -> Vec<StreamEvent> {
    tokio::time::timeout(Duration::from_secs(5), reader.next_batch(max))
        .await
        .expect("events arrive")
        .unwrap()
}

use skyport_core::ports::StreamEvent;

#[tokio::test]
async fn appends_get_consecutive_offsets_per_partition_under_concurrency() {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(&settings(dir.path()), 4).unwrap();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..500 {
        let store = Arc::clone(&store);
        tasks.spawn(async move { store.publish(event(&format!("k{i}"))).await.unwrap() });
    }
    let mut offsets = vec![Vec::new(); 4];
    while let Some(position) = tasks.join_next().await {
        let position = position.unwrap();
        offsets[position.partition as usize].push(position.offset.expect("the log tells offsets"));
    }
    for mut partition in offsets {
        partition.sort_unstable();
        let expected: Vec<u64> = (0..partition.len() as u64).collect();
        assert_eq!(partition, expected);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_appends_share_commits() {
    use std::sync::atomic::Ordering;
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(&settings(dir.path()), 4).unwrap();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..1_000 {
        let store = Arc::clone(&store);
        tasks.spawn(async move { store.publish(event(&format!("k{i}"))).await.unwrap() });
    }
    tasks.join_all().await;
    let stats = store.commit_stats();
    let commits = stats.commits.load(Ordering::Relaxed);
    let operations = stats.operations.load(Ordering::Relaxed);
    assert_eq!(operations, 1_000);
    assert!(
        commits < 1_000 / 4,
        "{commits} commits for 1000 concurrent appends"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_status_writes_share_the_databases_commits() {
    use std::sync::atomic::Ordering;
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(&settings(dir.path()), 4).unwrap();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..500 {
        let store = Arc::clone(&store);
        tasks.spawn(async move {
            let document = StatusDocument::accepted(format!("d{i}"), OffsetDateTime::now_utc());
            StatusStore::put(&*store, &document, Precondition::IfNoneMatch)
                .await
                .unwrap();
        });
    }
    tasks.join_all().await;
    let stats = store.database_commit_stats();
    let commits = stats.commits.load(Ordering::Relaxed);
    assert_eq!(stats.operations.load(Ordering::Relaxed), 500);
    assert!(
        (1..500 / 4).contains(&commits),
        "{commits} commits for 500 concurrent status writes"
    );
    assert_eq!(
        store.commit_stats().operations.load(Ordering::Relaxed),
        0,
        "the stream's commits are counted apart"
    );
}

#[tokio::test]
async fn a_key_always_lands_on_the_same_partition() {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(&settings(dir.path()), 8).unwrap();
    let first = store.publish(event("same")).await.unwrap();
    let second = store.publish(event("same")).await.unwrap();
    assert_eq!(first.partition, second.partition);
    assert_eq!(second.offset, first.offset.map(|o| o + 1));
}

#[tokio::test]
async fn events_and_offsets_survive_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let position = {
        let store = EmbeddedStore::open(&settings(dir.path()), 2).unwrap();
        store.publish(event("a")).await.unwrap();
        store.publish(event("a")).await.unwrap()
    };
    let store = EmbeddedStore::open(&settings(dir.path()), 2).unwrap();
    let mut reader = reader_for(&store, position.partition).await;
    let events = next_batch(&mut reader, 10).await;
    assert_eq!(events.len(), 2);
    assert_eq!(events[1].payload, Bytes::from("payload-a"));
    let next = store.publish(event("a")).await.unwrap();
    assert_eq!(next.offset, position.offset.map(|o| o + 1));
}

#[tokio::test]
async fn a_different_partition_count_is_refused_on_reopen() {
    let dir = tempfile::tempdir().unwrap();
    drop(EmbeddedStore::open(&settings(dir.path()), 2).unwrap());
    let error = EmbeddedStore::open(&settings(dir.path()), 3).unwrap_err();
    assert!(matches!(
        error,
        OpenError::PartitionMismatch {
            stored: 2,
            configured: 3,
            ..
        }
    ));
    assert!(error.to_string().contains("stream.partitions"));
}

#[tokio::test]
async fn a_second_open_of_the_same_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let _store = EmbeddedStore::open(&settings(dir.path()), 2).unwrap();
    let error = EmbeddedStore::open(&settings(dir.path()), 2).unwrap_err();
    assert!(matches!(error, OpenError::AlreadyOpen { .. }), "{error:?}");
}

#[tokio::test]
async fn the_receipt_key_is_kept_across_reopens() {
    let dir = tempfile::tempdir().unwrap();
    let first = EmbeddedStore::open(&settings(dir.path()), 1)
        .unwrap()
        .receipt_key()
        .to_vec();
    let second = EmbeddedStore::open(&settings(dir.path()), 1)
        .unwrap()
        .receipt_key()
        .to_vec();
    assert_eq!(first, second);
    assert_eq!(first.len(), RECEIPT_KEY_LEN);
}

/// A database whose every commit is damaged must stop the start: opened as
/// an empty one it would lose every status document and reservation, and
/// hand out a new receipt key (redb before 4.6 did, through its repair's
/// fallback to a commit slot that failed its checksum).
#[tokio::test]
async fn a_database_damaged_past_repair_is_refused_not_opened_empty() {
    use std::io::{Read, Seek, SeekFrom, Write};

    let dir = tempfile::tempdir().unwrap();
    drop(EmbeddedStore::open(&settings(dir.path()), 1).unwrap());
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(dir.path().join("skyport.redb"))
        .unwrap();
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).unwrap();
    // redb's file format (its docs/design.md): the god byte at 9 (bit 0: the
    // primary commit slot, bit 1: repair needed, bit 2: two-phase commit),
    // commit slots at 64 and 192, each with its roots' presence flags at 1..4;
    // the pages start after the first 4 KiB.
    let god = &mut bytes[9];
    *god = (*god | 0b010) & !0b100;
    let secondary = if bytes[9] & 1 == 1 { 64 } else { 192 };
    bytes[secondary + 1..secondary + 4].fill(0);
    for byte in &mut bytes[4096..] {
        *byte ^= 0x5a;
    }
    file.seek(SeekFrom::Start(0)).unwrap();
    file.write_all(&bytes).unwrap();
    file.sync_all().unwrap();
    drop(file);

    let error = EmbeddedStore::open(&settings(dir.path()), 1).unwrap_err();
    let OpenError::Storage { source, .. } = &error else {
        panic!("{error:?}");
    };
    assert!(
        matches!(
            source.downcast_ref::<redb::Error>(),
            Some(redb::Error::Corrupted(_))
        ),
        "{error:?}"
    );
}

pub(crate) async fn reader_for(
    store: &Arc<EmbeddedStore>,
    partition: u32,
) -> Box<dyn PartitionReader> {
    let consumer = EmbeddedConsumer::new(Arc::clone(store), "group");
    loop {
        let reader = consumer.next_partition().await.unwrap();
        if reader.partition() == partition {
            return reader;
        }
    }
}

#[tokio::test]
async fn a_reader_waits_for_new_events() {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(&settings(dir.path()), 1).unwrap();
    let mut reader = reader_for(&store, 0).await;
    let waiting = tokio::spawn(async move { next_batch(&mut reader, 10).await });
    tokio::time::sleep(Duration::from_millis(20)).await;
    store.publish(event("late")).await.unwrap();
    let events = waiting.await.unwrap();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].offset, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_dropped_while_it_reads_loses_nothing_and_starts_no_second_read() {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(&settings(dir.path()), 1).unwrap();
    for i in 0..300 {
        store.publish(event(&format!("k{i}"))).await.unwrap();
    }
    let mut reader = reader_for(&store, 0).await;
    let mut offsets = Vec::new();
    let mut polls = 0;
    while offsets.len() < 300 {
        // As the worker's loop does when another branch wins: poll once, then
        // drop the future. The caller's room changes between calls.
        let max = [100, 7, 1, 50][polls % 4];
        polls += 1;
        if let Ok(batch) = tokio::time::timeout(Duration::ZERO, reader.next_batch(max)).await {
            let batch = batch.unwrap();
            assert!(
                !batch.is_empty() && batch.len() <= max,
                "{} for {max}",
                batch.len()
            );
            offsets.extend(batch.iter().map(|e| e.offset));
            assert_eq!(reader.unread(), Some(300 - offsets.len() as u64));
        }
        tokio::task::yield_now().await;
    }
    assert_eq!(offsets, (0..300).collect::<Vec<u64>>());
}

#[tokio::test]
async fn a_checkpoint_resumes_the_next_reader_and_trims_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(&settings(dir.path()), 1).unwrap();
    for i in 0..5 {
        store.publish(event(&format!("k{i}"))).await.unwrap();
    }
    let mut reader = reader_for(&store, 0).await;
    assert_eq!(next_batch(&mut reader, 3).await.len(), 3);
    reader.checkpoint(2).await.unwrap();
    // An older checkpoint arriving late never moves it back.
    reader.checkpoint(1).await.unwrap();
    let mut resumed = reader_for(&store, 0).await;
    let events = next_batch(&mut resumed, 10).await;
    assert_eq!(events.iter().map(|e| e.offset).collect::<Vec<_>>(), [3, 4]);
    assert_eq!(store.checkpoints("group"), [(0, 2)]);
}

fn document(id: &str, state: DeliveryState) -> StatusDocument {
    StatusDocument {
        state,
        ..StatusDocument::accepted(id, OffsetDateTime::UNIX_EPOCH)
    }
}

#[tokio::test]
async fn status_writes_are_conditional_on_the_version() {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(&settings(dir.path()), 1).unwrap();
    assert!(StatusStore::get(&*store, "d-1").await.unwrap().is_none());
    let v1 = StatusStore::put(
        &*store,
        &document("d-1", DeliveryState::Processing),
        Precondition::IfNoneMatch,
    )
    .await
    .unwrap();
    let again = StatusStore::put(
        &*store,
        &document("d-1", DeliveryState::Processing),
        Precondition::IfNoneMatch,
    )
    .await;
    assert!(matches!(again, Err(StatusStoreError::PreconditionFailed)));
    let v2 = StatusStore::put(
        &*store,
        &document("d-1", DeliveryState::Scheduled),
        Precondition::IfMatch(v1.clone()),
    )
    .await
    .unwrap();
    let stale = StatusStore::put(
        &*store,
        &document("d-1", DeliveryState::Failed),
        Precondition::IfMatch(v1),
    )
    .await;
    assert!(matches!(stale, Err(StatusStoreError::PreconditionFailed)));
    let stored = StatusStore::get(&*store, "d-1").await.unwrap().unwrap();
    assert_eq!(stored.document.state, DeliveryState::Scheduled);
    assert_eq!(stored.etag, v2);
}

#[tokio::test]
async fn concurrent_conditional_writers_never_lose_an_update() {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(&settings(dir.path()), 1).unwrap();
    StatusStore::put(
        &*store,
        &document("d-1", DeliveryState::Processing),
        Precondition::IfNoneMatch,
    )
    .await
    .unwrap();
    let mut writers = tokio::task::JoinSet::new();
    for _ in 0..20 {
        let store = Arc::clone(&store);
        writers.spawn(async move {
            loop {
                let current = StatusStore::get(&*store, "d-1").await.unwrap().unwrap();
                let mut next = current.document.clone();
                next.attempt += 1;
                match StatusStore::put(&*store, &next, Precondition::IfMatch(current.etag)).await {
                    Ok(_) => return,
                    Err(StatusStoreError::PreconditionFailed) => continue,
                    Err(e) => panic!("{e}"),
                }
            }
        });
    }
    while writers.join_next().await.is_some() {}
    let stored = StatusStore::get(&*store, "d-1").await.unwrap().unwrap();
    assert_eq!(stored.document.attempt, 20);
}

#[tokio::test]
async fn dead_letters_keep_the_reason_and_the_raw_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(&settings(dir.path()), 1).unwrap();
    DeadLetterStore::put(
        &*store,
        DeadLetter {
            partition: 0,
            offset: 7,
            reason: "not JSON".into(),
            payload: Bytes::from_static(b"\xff\x00"),
            at: OffsetDateTime::UNIX_EPOCH,
        },
    )
    .await
    .unwrap();
    let letters = store.events(None, 100).await.unwrap();
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].offset, 7);
    assert_eq!(letters[0].reason, "not JSON");
    assert_eq!(letters[0].payload, Bytes::from_static(b"\xff\x00"));
}

mod change_feed {
    use skyport_core::ports::{ChangeDeadLetter, ChangeSource, FeedRange, StartFrom};

    use super::*;

    async fn put(store: &EmbeddedStore, id: &str, state: DeliveryState) {
        let current = StatusStore::get(store, id).await.unwrap();
        let condition =
            current.map_or(Precondition::IfNoneMatch, |v| Precondition::IfMatch(v.etag));
        StatusStore::put(store, &document(id, state), condition)
            .await
            .unwrap();
    }

    fn ids(page: &skyport_core::ports::ChangePage) -> Vec<&str> {
        page.changes.iter().map(|c| c.id.as_str()).collect()
    }

    #[tokio::test]
    async fn the_feed_holds_each_document_once_at_its_latest_write_and_survives_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(&settings(dir.path()), 1).unwrap();
        let range = FeedRange::full();
        assert_eq!(store.ranges().await.unwrap(), [FeedRange::full()]);
        for id in ["a", "b", "c"] {
            put(&store, id, DeliveryState::Processing).await;
        }
        let first = store
            .read(&range, None, StartFrom::Beginning, 2)
            .await
            .unwrap();
        assert_eq!(ids(&first), ["a", "b"]);
        // a changes again: it moves behind c, once.
        put(&store, "a", DeliveryState::Scheduled).await;
        let second = store
            .read(&range, Some(&first.continuation), StartFrom::Beginning, 10)
            .await
            .unwrap();
        assert_eq!(ids(&second), ["c", "a"]);
        assert_eq!(second.changes[1].document["state"], "Scheduled");
        assert_eq!(
            store
                .pending(&range, Some(&first.continuation), StartFrom::Beginning)
                .await
                .unwrap(),
            2
        );
        assert_eq!(
            store
                .pending(&range, None, StartFrom::Beginning)
                .await
                .unwrap(),
            3
        );
        drop(store);
        let store = EmbeddedStore::open(&settings(dir.path()), 1).unwrap();
        let empty = store
            .read(&range, Some(&second.continuation), StartFrom::Beginning, 10)
            .await
            .unwrap();
        assert!(empty.changes.is_empty());
        assert_eq!(empty.continuation, second.continuation);
        put(&store, "d", DeliveryState::Failed).await;
        let after = store
            .read(&range, Some(&second.continuation), StartFrom::Beginning, 10)
            .await
            .unwrap();
        assert_eq!(ids(&after), ["d"], "numbers keep rising across a restart");
    }

    #[tokio::test]
    async fn now_starts_after_what_is_there_and_a_bad_continuation_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(&settings(dir.path()), 1).unwrap();
        let range = FeedRange::full();
        put(&store, "old", DeliveryState::Processing).await;
        let now = store.read(&range, None, StartFrom::Now, 10).await.unwrap();
        assert!(now.changes.is_empty());
        assert_eq!(
            store.pending(&range, None, StartFrom::Now).await.unwrap(),
            0
        );
        put(&store, "new", DeliveryState::Processing).await;
        let next = store
            .read(&range, Some(&now.continuation), StartFrom::Now, 10)
            .await
            .unwrap();
        assert_eq!(ids(&next), ["new"]);
        let bad = store
            .read(&range, Some("c1.elsewhere"), StartFrom::Now, 10)
            .await;
        assert!(
            matches!(
                bad,
                Err(skyport_core::ports::ChangeFeedError::BadContinuation { .. })
            ),
            "{bad:?}"
        );
    }

    #[tokio::test]
    async fn a_reader_of_one_field_passes_over_the_rest_and_moves_past_them() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(&settings(dir.path()), 1).unwrap();
        let range = FeedRange::full();
        for n in 0..6 {
            let mut doc = document(&format!("d{n}"), DeliveryState::Scheduled);
            if n % 3 == 0 {
                doc.callback_url = Some(format!("https://example.com/{n}"));
            }
            StatusStore::put(&*store, &doc, Precondition::IfNoneMatch)
                .await
                .unwrap();
        }
        let first = store
            .read_having(&range, None, StartFrom::Beginning, 4, "callbackUrl")
            .await
            .unwrap();
        assert_eq!(ids(&first), ["d0", "d3"]);
        assert_eq!(first.skipped, 2);
        let second = store
            .read_having(
                &range,
                Some(&first.continuation),
                StartFrom::Beginning,
                4,
                "callbackUrl",
            )
            .await
            .unwrap();
        assert!(second.changes.is_empty());
        assert_eq!(second.skipped, 2, "d4 and d5 passed over");
        let all = store
            .read(&range, None, StartFrom::Beginning, 10)
            .await
            .unwrap();
        assert_eq!(all.changes.len(), 6);
        assert_eq!(all.skipped, 0);
    }

    #[tokio::test]
    async fn change_dead_letters_are_kept_by_processor_and_key() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(&settings(dir.path()), 1).unwrap();
        for (processor, key) in [("p", "k2"), ("p", "k1"), ("q", "k1"), ("p", "k1")] {
            store
                .put_change(ChangeDeadLetter {
                    processor: processor.into(),
                    key: key.into(),
                    reason: format!("{processor}/{key} failed"),
                    payload: serde_json::json!({"key": key}),
                    at: OffsetDateTime::UNIX_EPOCH,
                })
                .await
                .unwrap();
        }
        let kept = store.changes("p", None, 100).await.unwrap();
        assert_eq!(
            kept.iter().map(|l| l.key.as_str()).collect::<Vec<_>>(),
            ["k1", "k2"]
        );
        assert_eq!(kept[0].payload["key"], "k1");
        assert_eq!(store.changes("q", None, 100).await.unwrap().len(), 1);
        assert!(store.changes("none", None, 100).await.unwrap().is_empty());
    }
}
