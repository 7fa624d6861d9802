//! The listing view on the SDK's in-memory emulator, as the embedded store's
//! listing is tested: documents are written through the store, the view is
//! brought up to the status container's change feed (as the listing
//! processor's handler does), and listings are read back.

#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use skyport_core::ports::{
    ChangeSource, FeedRange, ListPage, ListQuery, Precondition, StartFrom, StatusStore,
};
use skyport_core::status::{DeliveryState, StatusDocument, Step, StepOutcome, StepResult};
use skyport_runtime::config::{CosmosSettings, Millis, Seconds, StoreSettings};
use time::OffsetDateTime;

use crate::cosmos::CosmosStore;
use crate::cosmos::emulator::Emulator;
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

/// Reads the status container's change feed on from where it left off and
/// hands every page to the view, as the listing processor does.
#[derive(Default)]
struct View {
    positions: HashMap<FeedRange, String>,
}

impl View {
    async fn catch_up(&mut self, store: &CosmosStore) {
        for range in store.ranges().await.unwrap() {
            loop {
                let from = self.positions.get(&range).cloned();
                let page = store
                    .read(&range, from.as_deref(), StartFrom::Beginning, 100)
                    .await
                    .unwrap();
                store.update_listing(&page.changes).await.unwrap();
                self.positions.insert(range.clone(), page.continuation);
                if page.changes.is_empty() {
                    break;
                }
            }
        }
    }
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

fn ids(page: &ListPage) -> Vec<&str> {
    page.items.iter().map(|d| d.id.as_str()).collect()
}

async fn put(store: &CosmosStore, document: &StatusDocument) {
    StatusStore::put(store, document, Precondition::IfNoneMatch)
        .await
        .unwrap();
}

/// 30 documents accepted a second apart, the last newest, and listed.
async fn thirty(store: &CosmosStore, view: &mut View) -> OffsetDateTime {
    let start = OffsetDateTime::now_utc() - Duration::from_secs(60);
    for n in 0..30 {
        put(store, &document(n, start + Duration::from_secs(n as u64))).await;
    }
    view.catch_up(store).await;
    start
}

#[tokio::test]
async fn a_listing_is_newest_first_and_filtered_by_owner_principal_state_and_time() {
    let store = open().await;
    let start = thirty(&store, &mut View::default()).await;
    let all = StatusStore::list(&*store, &query()).await.unwrap();
    assert_eq!(all.items.len(), 30);
    assert_eq!(ids(&all)[..3], ["d-029", "d-028", "d-027"]);
    let expected: Vec<String> = (0..30).rev().map(|n| format!("d-{n:03}")).collect();
    assert_eq!(ids(&all), expected);
    assert_eq!(all.next, None);

    let owner = ListQuery {
        owner: Some("owner-1".into()),
        ..query()
    };
    let page = StatusStore::list(&*store, &owner).await.unwrap();
    assert_eq!(page.items.len(), 10);
    assert!(
        page.items
            .iter()
            .all(|d| d.owner_id.as_deref() == Some("owner-1"))
    );
    assert_eq!(ids(&page)[..2], ["d-028", "d-025"]);

    let mine = ListQuery {
        principal: Some("client-0".into()),
        owner: Some("owner-0".into()),
        state: Some(DeliveryState::Scheduled),
        ..query()
    };
    let page = StatusStore::list(&*store, &mine).await.unwrap();
    // n even (client-0, Scheduled) and n % 3 == 0: 0, 6, 12, 18, 24.
    assert_eq!(ids(&page), ["d-024", "d-018", "d-012", "d-006", "d-000"]);

    let failed = ListQuery {
        state: Some(DeliveryState::Failed),
        ..query()
    };
    let page = StatusStore::list(&*store, &failed).await.unwrap();
    assert_eq!(page.items.len(), 15);
    assert!(page.items.iter().all(|d| d.state == DeliveryState::Failed));

    let window = ListQuery {
        since: Some(start + Duration::from_secs(10)),
        until: Some(start + Duration::from_secs(13)),
        ..query()
    };
    let page = StatusStore::list(&*store, &window).await.unwrap();
    assert_eq!(ids(&page), ["d-012", "d-011", "d-010"]);
    store.close().await;
}

#[tokio::test]
async fn pages_go_on_from_their_cursor_exactly_while_new_documents_arrive() {
    let store = open().await;
    let mut view = View::default();
    thirty(&store, &mut view).await;
    let mine = ListQuery {
        principal: Some("client-1".into()),
        ..query()
    };
    let mut arrivals = 100;
    // Client 1's listing also holds the two of it that arrived during the first.
    for (listing, count) in [(query(), 30), (mine, 17)] {
        // What the listing holds before the first page, in one page.
        let expected: Vec<String> = StatusStore::list(&*store, &listing)
            .await
            .unwrap()
            .items
            .into_iter()
            .map(|d| d.id)
            .collect();
        assert_eq!(expected.len(), count, "{expected:?}");
        let mut seen = Vec::new();
        let mut after = None;
        loop {
            let page = StatusStore::list(
                &*store,
                &ListQuery {
                    limit: 7,
                    after: after.clone(),
                    ..listing.clone()
                },
            )
            .await
            .unwrap();
            assert!(page.items.len() <= 7);
            seen.extend(page.items.iter().map(|d| d.id.clone()));
            // A newer delivery arrives between two pages: it sorts before the cursor.
            put(&store, &document(arrivals, OffsetDateTime::now_utc())).await;
            view.catch_up(&store).await;
            arrivals += 1;
            match page.next {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        assert_eq!(seen, expected, "{listing:?}");
    }
    store.close().await;
}

#[tokio::test]
async fn a_document_written_before_its_owner_was_known_is_listed_under_it_later_and_once() {
    let store = open().await;
    let mut view = View::default();
    // A cancellation that arrived before its request.
    let at = OffsetDateTime::now_utc();
    let bare = StatusDocument {
        cancel_requested_at: Some(at),
        ..StatusDocument::accepted("d-1", at)
    };
    put(&store, &bare).await;
    view.catch_up(&store).await;
    let all = StatusStore::list(&*store, &query()).await.unwrap();
    assert_eq!(ids(&all), ["d-1"]);
    let etag = StatusStore::get(&*store, "d-1")
        .await
        .unwrap()
        .unwrap()
        .etag;
    let described = StatusDocument {
        owner_id: Some("owner-9".into()),
        principal: Some("client-9".into()),
        state: DeliveryState::Processing,
        ..bare
    };
    StatusStore::put(&*store, &described, Precondition::IfMatch(etag))
        .await
        .unwrap();
    view.catch_up(&store).await;
    let page = StatusStore::list(
        &*store,
        &ListQuery {
            owner: Some("owner-9".into()),
            ..query()
        },
    )
    .await
    .unwrap();
    assert_eq!(page.items, std::slice::from_ref(&described));
    let all = StatusStore::list(&*store, &query()).await.unwrap();
    assert_eq!(all.items, [described]);
    store.close().await;
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
    let mut view = View::default();
    let mut document = document(0, OffsetDateTime::now_utc());
    document.state = DeliveryState::Processing;
    put(&store, &document).await;
    view.catch_up(&store).await;
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
    view.catch_up(&store).await;
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
    let mut view = View::default();
    let at = OffsetDateTime::now_utc();
    for n in 0..50 {
        put(&store, &scheduled(n, at)).await;
    }
    view.catch_up(&store).await;
    let (writes, units) = store.request_units().spent(Operation::ListingWrite);
    assert_eq!(writes, 100, "an owner's and a principal's item each");
    // Handed over again (at least once), each item is written over.
    view.positions.clear();
    view.catch_up(&store).await;
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
