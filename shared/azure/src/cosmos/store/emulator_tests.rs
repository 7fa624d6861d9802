//! Retention on the SDK's in-memory emulator: the `ttl` a status document
//! carries as it settles and unsettles, and the `ttl` of dead letters. The
//! emulator keeps an item's `ttl` but never expires it, so these tests read
//! the stored items back; that Cosmos DB removes them is its own doing.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use azure_data_cosmos::ContainerClient;
use serde_json::Value;
use skyport_core::ports::{
    ChangeDeadLetter, ChangeSource, DeadLetter, DeadLetterStore, ETag, Precondition, StartFrom,
    StatusStore,
};
use skyport_core::status::{CallbackOutcome, CallbackState, DeliveryState, StatusDocument};
use skyport_runtime::config::{CosmosSettings, Millis, Seconds, StoreSettings};
use time::OffsetDateTime;

use crate::cosmos::CosmosStore;
use crate::cosmos::emulator::Emulator;

const STATUS_TTL: u64 = 3_600;
const DEAD_LETTER_TTL: u64 = 86_400;

async fn open() -> Arc<CosmosStore> {
    let settings = CosmosSettings {
        bulk_max_wait_ms: Millis::new(5),
        ..CosmosSettings::default()
    };
    let retention = StoreSettings {
        status_retention_s: Seconds::new(STATUS_TTL),
        dead_letter_retention_s: Seconds::new(DEAD_LETTER_TTL),
        ..StoreSettings::default()
    };
    Emulator::new(false)
        .unwrap()
        .store_with(&settings, &retention)
        .await
        .unwrap()
}

/// The item `id` as Cosmos DB keeps it.
async fn stored(container: &ContainerClient, id: &str) -> Value {
    container
        .read_item(id.to_owned(), id, None)
        .await
        .unwrap()
        .into_model()
        .unwrap()
}

/// Writes `document` over the version `etag` and checks what is stored: the
/// document as written (read back through the store), and its `ttl`.
async fn put(store: &CosmosStore, document: &StatusDocument, etag: ETag, ttl: Option<u64>) -> ETag {
    let etag = StatusStore::put(store, document, Precondition::IfMatch(etag))
        .await
        .unwrap();
    let item = stored(&store.status, &document.id).await;
    assert_eq!(item.get("ttl").and_then(Value::as_u64), ttl, "{item}");
    let read = StatusStore::get(store, &document.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(read.document, *document);
    etag
}

fn callback(state: CallbackState, announced: DeliveryState) -> Option<CallbackOutcome> {
    Some(CallbackOutcome {
        state,
        announced,
        attempts: 1,
        last_error: None,
        delivered_at: None,
        retrying_since: None,
    })
}

#[tokio::test]
async fn a_status_document_carries_the_retention_as_its_ttl_only_while_settled() {
    let store = open().await;
    let mut document = StatusDocument::accepted("d-1", OffsetDateTime::now_utc());
    document.callback_url = Some("https://receiver.example/done".into());
    let etag = StatusStore::put(&*store, &document, Precondition::IfNoneMatch)
        .await
        .unwrap();
    let item = stored(&store.status, "d-1").await;
    assert!(item.get("ttl").is_none(), "{item}");

    // Settled at its terminal write: a callback delivered at once writes nothing back.
    document.state = DeliveryState::Scheduled;
    let etag = put(&store, &document, etag, Some(STATUS_TTL)).await;
    document.callback = callback(CallbackState::Pending, DeliveryState::Scheduled);
    let etag = put(&store, &document, etag, None).await;
    document.callback = callback(CallbackState::Delivered, DeliveryState::Scheduled);
    let etag = put(&store, &document, etag, Some(STATUS_TTL)).await;
    // Cancelled after it was scheduled: its callback, retried, holds it back again.
    document.state = DeliveryState::Cancelled;
    let etag = put(&store, &document, etag, Some(STATUS_TTL)).await;
    document.callback = callback(CallbackState::Pending, DeliveryState::Cancelled);
    let etag = put(&store, &document, etag, None).await;
    document.callback = callback(CallbackState::DeadLettered, DeliveryState::Cancelled);
    put(&store, &document, etag, Some(STATUS_TTL)).await;

    for range in store.ranges().await.unwrap() {
        let page = store
            .read(&range, None, StartFrom::Beginning, 100)
            .await
            .unwrap();
        for change in page.changes {
            assert!(change.document.get("ttl").is_none(), "{}", change.document);
        }
    }
    store.close().await;
}

#[tokio::test]
async fn dead_letters_carry_the_dead_letter_retention_as_their_ttl() {
    let store = open().await;
    let at = OffsetDateTime::now_utc();
    let letter = DeadLetter {
        partition: 2,
        offset: 9,
        reason: "poison".into(),
        payload: bytes::Bytes::from_static(b"not json"),
        at,
    };
    DeadLetterStore::put(&*store, letter).await.unwrap();
    store
        .put_change(ChangeDeadLetter {
            processor: "notify".into(),
            key: "d-1.Failed".into(),
            reason: "refused".into(),
            payload: serde_json::json!({"id": "d-1", "state": "Failed"}),
            at,
        })
        .await
        .unwrap();
    for id in ["2-9", "change.notify.d-1.Failed"] {
        let item = stored(&store.dead_letters, id).await;
        assert_eq!(item["ttl"], DEAD_LETTER_TTL, "{item}");
    }
    assert_eq!(store.events(None, 100).await.unwrap().len(), 1);
    assert_eq!(store.changes("notify", None, 100).await.unwrap().len(), 1);
    store.close().await;
}
