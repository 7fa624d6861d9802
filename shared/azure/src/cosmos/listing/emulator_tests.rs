//! Listing on Cosmos DB, on the SDK's in-memory emulator: a write is listed
//! at once and costs nothing more; documents of an earlier version are
//! listed once backfilled. What every store's listing answers is the listing
//! contract (`tests/src/listing_contract.rs`), run in the system tests.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use serde_json::{Value, json};
use skyport_core::ports::{ListQuery, Precondition, StatusStore};
use skyport_core::status::{DeliveryState, StatusDocument};
use skyport_runtime::config::{CosmosSettings, Millis, Seconds, StoreSettings};
use time::OffsetDateTime;

use crate::cosmos::CosmosStore;
use crate::cosmos::emulator::Emulator;
use crate::cosmos::request_units::{Operation, Spend};

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

fn owners(owner: Option<&str>) -> ListQuery {
    ListQuery {
        principal: None,
        owner: owner.map(str::to_owned),
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

async fn listed(store: &CosmosStore, query: &ListQuery) -> Vec<String> {
    StatusStore::list(store, query)
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|document| document.id)
        .collect()
}

#[tokio::test]
async fn a_delivery_is_listed_as_its_status_is_written_for_no_more_than_the_write() {
    let store = open().await;
    let at = OffsetDateTime::now_utc();
    put(&store, &document(0, at)).await;
    let (writes, units) = store.request_units().spent_on(Spend::StatusWrites);
    assert_eq!(writes, 1, "one write, no view to keep");
    assert_eq!(listed(&store, &owners(Some("owner-0"))).await, ["d-000"]);
    for n in 1..50 {
        put(&store, &document(n, at)).await;
    }
    let (pages, paged) = store.request_units().spent_on(Spend::Listing);
    assert_eq!(listed(&store, &owners(None)).await.len(), 50);
    let (all_pages, all_paged) = store.request_units().spent_on(Spend::Listing);
    println!(
        "listing on the status container: {units:.1} RU a write, with createdMs; a page of one \
         owner's {:.1} RU, of all 50 deliveries {:.1} RU on the emulator",
        paged / pages as f64,
        (all_paged - paged) / (all_pages - pages) as f64
    );
    store.close().await;
}

#[tokio::test]
async fn documents_of_an_earlier_version_are_listed_once_backfilled_and_expire_as_they_would() {
    let store = open().await;
    let at = OffsetDateTime::now_utc();
    put(&store, &document(0, at)).await;
    // As a version that kept a listing view wrote them: no createdMs.
    for n in 1..4 {
        let mut old = serde_json::to_value(document(n, at)).unwrap();
        old["ttl"] = json!(STATUS_TTL);
        let id = old["id"].as_str().unwrap().to_owned();
        store
            .status
            .create_item(id.clone(), &id, &old, None)
            .await
            .unwrap();
    }
    assert_eq!(listed(&store, &owners(None)).await, ["d-000"]);
    assert_eq!(store.backfill_created_ms().await.unwrap(), 3);
    assert_eq!(
        listed(&store, &owners(None)).await,
        ["d-003", "d-002", "d-001", "d-000"],
        "newest first, by createdMs then id"
    );
    assert_eq!(listed(&store, &owners(Some("owner-1"))).await, ["d-001"]);
    let stored: Value = store
        .status
        .read_item("d-002".to_owned(), "d-002", None)
        .await
        .unwrap()
        .into_model()
        .unwrap();
    let ttl = stored["ttl"].as_u64().unwrap();
    assert!((STATUS_TTL - 5..=STATUS_TTL).contains(&ttl), "{stored}");
    let read = StatusStore::get(&*store, "d-002").await.unwrap().unwrap();
    assert_eq!(read.document, document(2, at));
    let queries = store
        .request_units()
        .spent_doing(Spend::StatusWrites, Operation::Query);
    assert_eq!(store.backfill_created_ms().await.unwrap(), 0, "done");
    let again = store
        .request_units()
        .spent_doing(Spend::StatusWrites, Operation::Query);
    assert_eq!(again.0 - queries.0, 1, "one query that finds nothing");
    store.close().await;
}
