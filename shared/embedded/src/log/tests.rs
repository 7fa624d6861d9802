//! The segment log against a crash at any byte, damage, rotation, named
//! requests, a failing disk and an upgrade from the database-backed stream.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use redb::TableDefinition;
use skyport_core::ports::{IdempotencyStore, OutboundEvent, Publisher, Reservation, Reserved};
use time::OffsetDateTime;

use super::frame;
use super::segment::{self, DATA_START};
use crate::setup::OpenError;
use crate::store::EmbeddedStore;
use crate::tests::{event, next_batch, reader_for, settings};

/// The one segment file of a fresh log in `data`.
fn first_segment(data: &Path) -> PathBuf {
    segment::path(&data.join("stream"), 1)
}

/// Every event of partition 0, by payload, reading until `head`.
async fn payloads(store: &Arc<EmbeddedStore>) -> Vec<Bytes> {
    let head = store.heads()[0];
    let mut reader = reader_for(store, 0).await;
    let mut payloads = Vec::new();
    while payloads.len() < usize::try_from(head).unwrap() {
        payloads.extend(
            next_batch(&mut reader, 100)
                .await
                .into_iter()
                .map(|e| e.payload),
        );
    }
    payloads
}

fn copy_stream(from: &Path, to: &Path) {
    std::fs::create_dir_all(to.join("stream")).unwrap();
    for entry in std::fs::read_dir(from.join("stream")).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join("stream").join(entry.file_name())).unwrap();
    }
}

/// Writes `count` events to one partition, one commit each; answers where each commit ended.
async fn written(data: &Path, count: usize) -> Vec<u64> {
    let store = EmbeddedStore::open(&settings(data), 1).unwrap();
    for i in 0..count {
        store.publish(event(&format!("k{i}"))).await.unwrap();
    }
    drop(store);
    let bytes = std::fs::read(first_segment(data)).unwrap();
    let scan = super::scan::scan(&bytes, DATA_START, None);
    scan.records
        .iter()
        .map(|r| r.position + u64::from(r.len))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_cut_at_any_byte_of_its_tail_keeps_every_acknowledged_record() {
    let data = tempfile::tempdir().unwrap();
    let ends = written(data.path(), 12).await;
    let last_few = ends[ends.len() - 4];
    let total = *ends.last().unwrap();
    let mut cuts: Vec<u64> = (last_few..=total).collect();
    cuts.extend((0..40).map(|_| fastrand::u64(DATA_START as u64..total)));
    for cut in cuts {
        let copy = tempfile::tempdir().unwrap();
        copy_stream(data.path(), copy.path());
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(first_segment(copy.path()))
            .unwrap();
        file.set_len(cut).unwrap();
        let store = EmbeddedStore::open(&settings(copy.path()), 1).unwrap();
        let kept = ends.iter().filter(|&&end| end <= cut).count();
        let read = payloads(&store).await;
        assert_eq!(
            read.len(),
            kept,
            "a cut at byte {cut} keeps the whole commits before it"
        );
        for (i, payload) in read.iter().enumerate() {
            assert_eq!(payload, &Bytes::from(format!("payload-k{i}")));
        }
        // The log goes on where the cut left it, with the next offset.
        let next = store.publish(event("after")).await.unwrap();
        assert_eq!(next.offset, Some(kept as u64));
    }
}

#[tokio::test]
async fn a_flipped_byte_in_an_acknowledged_record_stops_the_start_naming_the_file_and_byte() {
    let data = tempfile::tempdir().unwrap();
    let ends = written(data.path(), 5).await;
    let path = first_segment(data.path());
    let mut bytes = std::fs::read(&path).unwrap();
    // Inside the payload of the second record: a later commit proves it was durable.
    let second = usize::try_from(ends[0]).unwrap();
    bytes[second + frame::HEADER + 2] ^= 0x01;
    std::fs::write(&path, &bytes).unwrap();
    let error = EmbeddedStore::open(&settings(data.path()), 1).unwrap_err();
    assert!(
        matches!(&error, OpenError::Stream(super::LogError::Damaged { path: p, position }) if *p == path && *position == ends[0]),
        "{error:?}"
    );
    let message = error.to_string();
    assert!(message.contains(&path.display().to_string()), "{message}");
    assert!(message.contains(&format!("byte {}", ends[0])), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn segments_rotate_and_are_deleted_once_every_checkpoint_has_passed_them() {
    let data = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(&settings(data.path()), 2).unwrap();
    let big = Bytes::from(vec![b'x'; 64 * 1024]);
    for i in 0..40 {
        store
            .publish(OutboundEvent {
                key: format!("k{i}"),
                payload: big.clone(),
                properties: skyport_core::ports::EventProperties::default(),
                lane: skyport_core::ports::Lane::Normal,
            })
            .await
            .unwrap();
    }
    let before = store.segments();
    assert!(
        before.len() >= 3,
        "2.5 MiB of events in 1 MiB segments: {before:?}"
    );
    let heads = store.heads();
    for partition in 0..2 {
        let mut reader = reader_for(&store, partition).await;
        let mut read = 0;
        while read < heads[partition as usize] {
            read += next_batch(&mut reader, 100).await.len() as u64;
        }
        reader.checkpoint(read - 1).await.unwrap();
    }
    let after = store.segments();
    assert_eq!(
        after.len(),
        1,
        "only the segment being written is kept: {after:?}"
    );
    assert_eq!(after[0], *before.last().unwrap());
    drop(store);
    let reopened = EmbeddedStore::open(&settings(data.path()), 2).unwrap();
    assert_eq!(
        reopened.heads(),
        heads,
        "offsets go on after the segments are gone"
    );
    let next = reopened.publish(event("k0")).await.unwrap();
    assert_eq!(next.offset, Some(heads[next.partition as usize]));
}

fn reservation(id: &str, fingerprint: &str) -> Reservation {
    let now = OffsetDateTime::now_utc();
    Reservation {
        delivery_id: id.to_owned(),
        fingerprint: fingerprint.to_owned(),
        accepted_at: now,
        expires_at: now + time::Duration::hours(1),
    }
}

#[tokio::test]
async fn a_named_request_costs_one_commit_and_its_name_survives_a_restart() {
    let data = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(&settings(data.path()), 1).unwrap();
    let first = reservation("d-1", "body-a");
    assert_eq!(store.reserve(&first).await.unwrap(), Reserved::New);
    store.publish(event("d-1")).await.unwrap();
    let stats = store.commit_stats();
    assert_eq!(
        stats.commits.load(Ordering::Relaxed),
        1,
        "the reservation rode with the event"
    );
    assert_eq!(
        store.reserve(&reservation("d-1", "body-b")).await.unwrap(),
        Reserved::Existing(first.clone())
    );
    drop(store);
    // Once before the copy into the database could run, once after it.
    for _ in 0..2 {
        let store = EmbeddedStore::open(&settings(data.path()), 1).unwrap();
        assert_eq!(
            store.reserve(&reservation("d-1", "body-b")).await.unwrap(),
            Reserved::Existing(first.clone())
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_released_reservation_frees_the_name_and_a_reservation_never_written_is_forgotten() {
    let data = tempfile::tempdir().unwrap();
    {
        let store = EmbeddedStore::open(&settings(data.path()), 1).unwrap();
        let first = reservation("d-1", "a");
        assert_eq!(store.reserve(&first).await.unwrap(), Reserved::New);
        store.release(&first).await.unwrap();
        assert_eq!(
            store.reserve(&reservation("d-1", "b")).await.unwrap(),
            Reserved::New
        );
        // Reserved but its event never written: a crash forgets it, as it never got a 202.
        assert_eq!(
            store.reserve(&reservation("d-2", "a")).await.unwrap(),
            Reserved::New
        );
    }
    let store = EmbeddedStore::open(&settings(data.path()), 1).unwrap();
    assert_eq!(
        store.reserve(&reservation("d-2", "c")).await.unwrap(),
        Reserved::New
    );
}

#[cfg(feature = "fault-injection")]
#[tokio::test]
async fn a_failing_disk_refuses_appends_until_it_recovers_and_nothing_refused_comes_back() {
    let data = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(&settings(data.path()), 1).unwrap();
    store.publish(event("k0")).await.unwrap();
    store.faults().fail_writes(true);
    let refused = store.publish(event("refused")).await.unwrap_err();
    assert!(matches!(
        refused,
        skyport_core::ports::PublishError::Unavailable(_)
    ));
    store.faults().fail_writes(false);
    let next = store.publish(event("k1")).await.unwrap();
    assert_eq!(next.offset, Some(1));
    drop(store);
    let store = EmbeddedStore::open(&settings(data.path()), 1).unwrap();
    assert_eq!(
        payloads(&store).await,
        [Bytes::from("payload-k0"), Bytes::from("payload-k1")]
    );
}

#[tokio::test]
async fn a_data_directory_of_the_database_backed_stream_is_upgraded_with_its_offsets() {
    const LOG: TableDefinition<(u32, u64), &[u8]> = TableDefinition::new("log");
    const HEADS: TableDefinition<u32, u64> = TableDefinition::new("heads");
    const CHECKPOINTS: TableDefinition<(&str, u32), u64> = TableDefinition::new("checkpoints");
    let data = tempfile::tempdir().unwrap();
    {
        let db = redb::Database::create(data.path().join("skyport.redb")).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut log = txn.open_table(LOG).unwrap();
            let mut heads = txn.open_table(HEADS).unwrap();
            let mut checkpoints = txn.open_table(CHECKPOINTS).unwrap();
            // Offsets 0..=4 were written, 0..=2 completed (and deleted).
            for offset in 3..5 {
                log.insert((0, offset), format!("old-{offset}").as_bytes())
                    .unwrap();
            }
            heads.insert(0, 5).unwrap();
            checkpoints.insert(("group", 0), 2).unwrap();
            // Partition 1 was drained entirely.
            heads.insert(1, 7).unwrap();
            checkpoints.insert(("group", 1), 6).unwrap();
        }
        txn.commit().unwrap();
    }
    let store = EmbeddedStore::open(&settings(data.path()), 2).unwrap();
    // The expedited lane's partition, last, starts empty.
    assert_eq!(store.heads(), [5, 7, 0]);
    let mut reader = reader_for(&store, 0).await;
    let events = next_batch(&mut reader, 10).await;
    assert_eq!(events.iter().map(|e| e.offset).collect::<Vec<_>>(), [3, 4]);
    assert_eq!(events[0].payload, Bytes::from("old-3"));
    drop(reader);
    drop(store);
    // A second start finds nothing left to move.
    let store = EmbeddedStore::open(&settings(data.path()), 2).unwrap();
    assert_eq!(store.heads(), [5, 7, 0]);
}
