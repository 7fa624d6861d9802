//! The retention sweeper against the store on disk: what goes, what stays,
//! the slowest change-feed lease, batches, and a data directory written
//! before the indexes.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use bytes::Bytes;
use redb::ReadableTable;
use serde_json::json;
use skyport_core::ports::{
    ChangeDeadLetter, ChangeSource, DeadLetter, DeadLetterStore, FeedRange, LeaseCondition,
    LeaseStore, ListQuery, Precondition, StartFrom, StatusStore,
};
use skyport_core::status::{CallbackOutcome, CallbackState, DeliveryState, StatusDocument};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::retention::Retention;
use crate::store::EmbeddedStore;
use crate::tests::settings;

const WINDOW: Duration = Duration::from_secs(60);

fn retention(batch: usize) -> Retention {
    Retention {
        status: WINDOW,
        dead_letters: WINDOW * 2,
        interval: Duration::from_millis(10),
        batch,
    }
}

/// A time at which everything written now has left a window of `windows` × [`WINDOW`].
fn after(windows: u32) -> OffsetDateTime {
    OffsetDateTime::now_utc() + WINDOW * windows + Duration::from_secs(1)
}

fn document(id: &str, state: DeliveryState) -> StatusDocument {
    StatusDocument {
        state,
        ..StatusDocument::accepted(id, OffsetDateTime::now_utc())
    }
}

fn owing_a_callback(id: &str) -> StatusDocument {
    StatusDocument {
        callback_url: Some("http://127.0.0.1:9/hook".into()),
        ..document(id, DeliveryState::Scheduled)
    }
}

fn delivered(mut document: StatusDocument) -> StatusDocument {
    document.callback = Some(CallbackOutcome {
        state: CallbackState::Delivered,
        announced: document.state,
        attempts: 1,
        last_error: None,
        delivered_at: Some(OffsetDateTime::now_utc()),
        retrying_since: None,
    });
    document
}

/// `document` with its callback being retried.
fn retried(mut document: StatusDocument) -> StatusDocument {
    document.callback = Some(CallbackOutcome {
        state: CallbackState::Pending,
        announced: document.state,
        attempts: 1,
        last_error: Some("the receiver answered 503".into()),
        delivered_at: None,
        retrying_since: Some(OffsetDateTime::now_utc()),
    });
    document
}

async fn put(store: &EmbeddedStore, document: &StatusDocument) {
    let condition = match StatusStore::get(store, &document.id).await.unwrap() {
        Some(stored) => Precondition::IfMatch(stored.etag),
        None => Precondition::IfNoneMatch,
    };
    StatusStore::put(store, document, condition).await.unwrap();
}

async fn ids(store: &EmbeddedStore) -> Vec<String> {
    let page = store
        .read(&FeedRange::full(), None, StartFrom::Beginning, 1000)
        .await
        .unwrap();
    let mut ids: Vec<String> = page.changes.into_iter().map(|c| c.id).collect();
    ids.sort();
    ids
}

fn everything() -> ListQuery {
    ListQuery {
        principal: None,
        owner: None,
        state: None,
        since: None,
        until: None,
        limit: 100,
        after: None,
    }
}

fn open(dir: &tempfile::TempDir) -> std::sync::Arc<EmbeddedStore> {
    EmbeddedStore::open(&settings(dir.path()), 1).unwrap()
}

#[tokio::test]
async fn settled_documents_go_with_their_changes_and_the_rest_stays() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    put(&store, &document("scheduled", DeliveryState::Scheduled)).await;
    put(&store, &document("failed", DeliveryState::Failed)).await;
    put(&store, &document("processing", DeliveryState::Processing)).await;
    // A callback not yet sent holds nothing back: the sweep never passes a
    // change the change-feed processor has not handled.
    put(&store, &owing_a_callback("unsent")).await;
    put(&store, &retried(owing_a_callback("retried"))).await;
    put(&store, &delivered(owing_a_callback("announced"))).await;

    let early = store
        .sweep(&retention(100), OffsetDateTime::now_utc())
        .await
        .unwrap();
    assert_eq!(early.statuses, 0, "nothing is older than the window yet");
    assert!(early.oldest_status_ms.is_some());

    let swept = store.sweep(&retention(100), after(1)).await.unwrap();
    assert_eq!(swept.statuses, 4);
    assert!(!swept.held_by_lease);
    assert_eq!(swept.oldest_status_ms, None, "no settled document is left");
    for gone in ["scheduled", "failed", "unsent", "announced"] {
        assert!(
            StatusStore::get(&*store, gone).await.unwrap().is_none(),
            "{gone}"
        );
    }
    for kept in ["processing", "retried"] {
        assert!(
            StatusStore::get(&*store, kept).await.unwrap().is_some(),
            "{kept}"
        );
    }
    assert_eq!(
        ids(&store).await,
        ["processing", "retried"],
        "the change records went too"
    );
    assert_eq!(
        store
            .pending(&FeedRange::full(), None, StartFrom::Beginning)
            .await
            .unwrap(),
        2
    );
}

/// A Scheduled delivery whose request has `deadline`.
fn scheduled_until(id: &str, deadline: OffsetDateTime) -> StatusDocument {
    let rfc3339 = |at: OffsetDateTime| at.format(&Rfc3339).unwrap();
    let request = json!({
        "ownerId": "owner-1",
        "pickupLocation": "a",
        "pickupTime": rfc3339(deadline - Duration::from_secs(3_600)),
        "deadline": rfc3339(deadline),
        "dropoffLocation": "b",
        "packageInfo": {"packageId": "p-1", "size": "Small", "weight": 1.0},
    });
    StatusDocument {
        request: Some(serde_json::from_value(request).unwrap()),
        ..document(id, DeliveryState::Scheduled)
    }
}

#[tokio::test]
async fn a_scheduled_delivery_stays_until_the_window_after_its_deadline_has_passed() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let now = OffsetDateTime::now_utc();
    put(&store, &scheduled_until("past", now - WINDOW * 10)).await;
    put(&store, &scheduled_until("far", now + WINDOW * 3)).await;
    put(&store, &scheduled_until("moved", now + WINDOW * 3)).await;
    // A reschedule moves the deadline, and the window with it.
    put(&store, &scheduled_until("moved", now + WINDOW * 5)).await;

    let swept = store.sweep(&retention(100), after(1)).await.unwrap();
    assert_eq!(swept.statuses, 1, "only the one whose deadline has passed");
    assert!(StatusStore::get(&*store, "past").await.unwrap().is_none());
    assert_eq!(ids(&store).await, ["far", "moved"]);
    let swept = store.sweep(&retention(100), after(3)).await.unwrap();
    assert_eq!(swept.statuses, 0, "the deadline has passed, not its window");
    let swept = store.sweep(&retention(100), after(4)).await.unwrap();
    assert_eq!(swept.statuses, 1);
    assert_eq!(ids(&store).await, ["moved"]);
    let swept = store.sweep(&retention(100), after(6)).await.unwrap();
    assert_eq!(swept.statuses, 1);
    assert!(ids(&store).await.is_empty());
}

#[tokio::test]
async fn a_write_that_unsettles_a_document_ends_its_window_and_the_next_settling_starts_one() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let announced = delivered(owing_a_callback("d-1"));
    put(&store, &announced).await;
    // A resend marks the callback pending again: it is owed once more.
    let mut resend = announced.clone();
    resend.callback.as_mut().unwrap().state = CallbackState::Pending;
    put(&store, &resend).await;
    let swept = store.sweep(&retention(100), after(1)).await.unwrap();
    assert_eq!(swept.statuses, 0);
    assert!(StatusStore::get(&*store, "d-1").await.unwrap().is_some());
    put(&store, &announced).await;
    assert_eq!(
        store
            .sweep(&retention(100), after(1))
            .await
            .unwrap()
            .statuses,
        1
    );
}

#[tokio::test]
async fn the_sweep_stops_at_the_slowest_change_feed_lease() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    for id in ["a", "b", "c"] {
        put(&store, &document(id, DeliveryState::Scheduled)).await;
    }
    let lease = |continuation: &str| {
        let fields = json!({"min": "", "max": "FF", "owner": "w-1", "continuation": continuation});
        fields.as_object().unwrap().clone()
    };
    // Changes 1..=3; one lease has handled the first, a retired one nothing.
    let lease_store: &dyn LeaseStore = &*store;
    lease_store
        .put("processor", "range.-FF", &lease("1"), LeaseCondition::Any)
        .await
        .unwrap();
    let retired = json!({"min": "", "max": "7F", "continuation": "0", "retired": true});
    lease_store
        .put(
            "processor",
            "range.-7F",
            retired.as_object().unwrap(),
            LeaseCondition::Any,
        )
        .await
        .unwrap();
    // Another consumer's leases are not change-feed leases.
    let other = json!({"continuation": "0"});
    lease_store
        .put(
            "hub",
            "ownership.0",
            other.as_object().unwrap(),
            LeaseCondition::Any,
        )
        .await
        .unwrap();
    let swept = store.sweep(&retention(100), after(1)).await.unwrap();
    assert_eq!(swept.statuses, 1);
    assert!(swept.held_by_lease);
    assert_eq!(ids(&store).await, ["b", "c"]);
    lease_store
        .put("processor", "range.-FF", &lease("3"), LeaseCondition::Any)
        .await
        .unwrap();
    let swept = store.sweep(&retention(100), after(1)).await.unwrap();
    assert_eq!(swept.statuses, 2);
    assert!(!swept.held_by_lease);
}

#[tokio::test]
async fn dead_letters_have_their_own_window() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let now = OffsetDateTime::now_utc();
    DeadLetterStore::put(
        &*store,
        DeadLetter {
            partition: 0,
            offset: 7,
            reason: "poison".into(),
            payload: Bytes::from_static(b"{"),
            at: now,
        },
    )
    .await
    .unwrap();
    let change = ChangeDeadLetter {
        processor: "callbacks".into(),
        key: "d-1".into(),
        reason: "refused".into(),
        payload: json!({"id": "d-1"}),
        at: now,
    };
    store.put_change(change.clone()).await.unwrap();
    // Kept again later: its window starts again.
    let later = ChangeDeadLetter {
        at: now + WINDOW,
        ..change
    };
    store.put_change(later).await.unwrap();
    let within = store.sweep(&retention(100), after(1)).await.unwrap();
    assert_eq!((within.dead_letters, within.change_dead_letters), (0, 0));
    let swept = store.sweep(&retention(100), after(2)).await.unwrap();
    assert_eq!((swept.dead_letters, swept.change_dead_letters), (1, 0));
    assert!(store.events(None, 100).await.unwrap().is_empty());
    assert_eq!(
        store.changes("callbacks", None, 100).await.unwrap().len(),
        1
    );
    let swept = store.sweep(&retention(100), after(3)).await.unwrap();
    assert_eq!(swept.change_dead_letters, 1);
    assert!(
        store
            .changes("callbacks", None, 100)
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn a_sweep_removes_one_batch_and_the_sweeper_goes_on_until_none_is_due() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    for n in 0..5 {
        put(&store, &document(&format!("d-{n}"), DeliveryState::Failed)).await;
    }
    let swept = store.sweep(&retention(2), after(1)).await.unwrap();
    assert_eq!(swept.statuses, 2);
    let sweeper = store.spawn_sweeper(Retention {
        status: Duration::ZERO,
        ..retention(2)
    });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !ids(&store).await.is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the sweeper removes the rest"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    sweeper.abort();
}

#[tokio::test]
async fn a_data_directory_written_before_the_indexes_is_indexed_once_at_open() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = open(&dir);
        put(&store, &document("old", DeliveryState::Cancelled)).await;
        put(&store, &document("open", DeliveryState::Processing)).await;
    }
    {
        // As an earlier build left it: no index entries, no marker.
        let db = redb::Database::open(dir.path().join("skyport.redb")).unwrap();
        let txn = db.begin_write().unwrap();
        txn.delete_table(crate::tables::STATUS_EXPIRY).unwrap();
        {
            // Rows that say nothing of their retention window.
            let mut status = txn.open_table(crate::tables::STATUS).unwrap();
            let rows: Vec<(String, u64, Option<u64>, Vec<u8>)> = status
                .iter()
                .unwrap()
                .map(|entry| {
                    let (id, row) = entry.unwrap();
                    let (version, change, _, body) = row.value();
                    (id.value().to_owned(), version, change, body.to_vec())
                })
                .collect();
            for (id, version, change, body) in &rows {
                status
                    .insert(id.as_str(), (*version, *change, None, body.as_slice()))
                    .unwrap();
            }
        }
        txn.delete_table(crate::tables::LISTING).unwrap();
        txn.open_table(crate::tables::META)
            .unwrap()
            .remove("indexed")
            .unwrap();
        txn.commit().unwrap();
    }
    let store = open(&dir);
    let listed = StatusStore::list(&*store, &everything()).await.unwrap();
    assert_eq!(listed.items.len(), 2, "listed again");
    let swept = store.sweep(&retention(100), after(1)).await.unwrap();
    assert_eq!(swept.statuses, 1);
    assert_eq!(ids(&store).await, ["open"]);
    let listed = StatusStore::list(&*store, &everything()).await.unwrap();
    assert_eq!(listed.items.len(), 1, "a removed document is not listed");
}
