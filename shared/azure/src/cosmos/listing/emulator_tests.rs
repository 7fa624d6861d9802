//! What the listing view keeps on Cosmos DB, on the SDK's in-memory emulator:
//! its items' `ttl`, and what it costs. What every store's listing answers is
//! the listing contract (`tests/src/listing_contract.rs`), run against this
//! view in the system tests.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use serde_json::Value;
use skyport_core::ports::{ListQuery, Precondition, StatusStore};
use skyport_core::status::{DeliveryState, StatusDocument, Step, StepOutcome, StepResult};
use skyport_runtime::config::{CosmosSettings, Millis, Seconds, StoreSettings};
use time::OffsetDateTime;

use crate::cosmos::CosmosStore;
use crate::cosmos::emulator::{Emulator, ListingView};
use crate::cosmos::request_units::Operation;

const STATUS_TTL: u64 = 3_600;

async fn open() -> Arc<CosmosStore> {
    let settings = CosmosSettings {
        bulk_max_wait_ms: Millis::new(5),
        ..CosmosSettings::default()
    };
    let retention = StoreSettings {
        status_retention_s: Seconds::new(STATUS_TTL),
        ..StoreSettings::default()
    };
    Emulator::new(false)
        .unwrap()
        .store_with(&settings, &retention)
        .await
        .unwrap()
}

fn document(n: usize, at: OffsetDateTime) -> StatusDocument {
    let states = [DeliveryState::Scheduled, DeliveryState::Failed];
    StatusDocument {
        state: states[n % 2],
        owner_id: Some(format!("owner-{}", n % 3)),
        principal: Some(format!("client-{}", n % 2)),
        ..StatusDocument::accepted(format!("d-{n:03}"), at)
    }
}

fn query() -> ListQuery {
    ListQuery {
        principal: None,
        owner: None,
        state: None,
        since: None,
        until: None,
        limit: 1_000,
        after: None,
    }
}

async fn put(store: &CosmosStore, document: &StatusDocument) {
    StatusStore::put(store, document, Precondition::IfNoneMatch)
        .await
        .unwrap();
}

/// The view item of delivery `id` under `scope`, as Cosmos DB keeps it.
async fn item(store: &CosmosStore, scope: &str, id: &str) -> Value {
    store
        .listing
        .read_item(scope.to_owned(), id, None)
        .await
        .unwrap()
        .into_model()
        .unwrap()
}

#[tokio::test]
async fn a_settled_documents_view_items_carry_its_ttl() {
    let store = open().await;
    let mut view = ListingView::default();
    let mut document = document(0, OffsetDateTime::now_utc());
    document.state = DeliveryState::Processing;
    put(&store, &document).await;
    view.catch_up(&store).await.unwrap();
    for scope in ["o:owner-0", "p:client-0"] {
        let item = item(&store, scope, "d-000").await;
        assert!(item.get("ttl").is_none(), "{item}");
        assert_eq!(item["state"], "Processing");
    }
    let etag = StatusStore::get(&*store, "d-000")
        .await
        .unwrap()
        .unwrap()
        .etag;
    document.state = DeliveryState::Scheduled;
    StatusStore::put(&*store, &document, Precondition::IfMatch(etag))
        .await
        .unwrap();
    view.catch_up(&store).await.unwrap();
    for scope in ["o:owner-0", "p:client-0"] {
        let item = item(&store, scope, "d-000").await;
        assert_eq!(item["ttl"], STATUS_TTL, "{item}");
        assert_eq!(item["state"], "Scheduled");
        assert_eq!(item["scope"], scope);
        assert_eq!(item["ownerId"], "owner-0");
        assert_eq!(item["principal"], "client-0");
        let listed: StatusDocument = serde_json::from_value(item["document"].clone()).unwrap();
        assert_eq!(listed, document);
    }
    store.close().await;
}

/// A delivery as it ends: five steps, a drone, a callback, a trace.
fn scheduled(n: usize, at: OffsetDateTime) -> StatusDocument {
    let steps = Step::ALL
        .into_iter()
        .map(|step| StepOutcome {
            step,
            result: StepResult::Succeeded,
            at,
            calls: 1,
            detail: None,
        })
        .collect();
    StatusDocument {
        state: DeliveryState::Scheduled,
        steps,
        drone_id: Some(format!("drone-{n}")),
        third_party_required: Some(false),
        package_id: Some(format!("package-{n}")),
        attempt: 1,
        callback_url: Some("https://receiver.example.com/deliveries/done".into()),
        traceparent: Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into()),
        ..document(n, at)
    }
}

#[tokio::test]
async fn the_view_costs_one_upsert_per_scope_of_each_change_read() {
    let store = open().await;
    let mut view = ListingView::default();
    let at = OffsetDateTime::now_utc();
    for n in 0..50 {
        put(&store, &scheduled(n, at)).await;
    }
    view.catch_up(&store).await.unwrap();
    let (writes, units) = store.request_units().spent(Operation::ListingWrite);
    assert_eq!(writes, 100, "an owner's and a principal's item each");
    // Handed over again (at least once), each item is written over.
    view.forget();
    view.catch_up(&store).await.unwrap();
    let (rewrites, reunits) = store.request_units().spent(Operation::ListingWrite);
    assert_eq!(rewrites, 200);
    let all = StatusStore::list(&*store, &query()).await.unwrap();
    assert_eq!(all.items.len(), 50);
    let mut stored = item(&store, "o:owner-0", "d-000").await;
    if let Value::Object(fields) = &mut stored {
        fields.retain(|key, _| !key.starts_with('_'));
    }
    let size = serde_json::to_vec(&stored).unwrap().len();
    println!(
        "listing view: {size} bytes an item; {:.1} RU an upsert that creates it, {:.1} RU one \
         that replaces it ({:.1} RU a status change of an owned delivery with a principal)",
        units / writes as f64,
        (reunits - units) / (rewrites - writes) as f64,
        2.0 * (reunits - units) / (rewrites - writes) as f64
    );
    store.close().await;
}
