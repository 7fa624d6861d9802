//! Cosmos DB on the SDK's in-memory emulator: the status-store, listing and
//! checkpoint-store contracts (the same suites as the embedded store),
//! throttling, dead letters, and the whole system with its status in Cosmos
//! DB, listed by a query on its status container.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use skyport_azure::cosmos::CosmosStore;
use skyport_azure::cosmos::emulator;
use skyport_azure::cosmos::request_units::{Operation, Spend};
use skyport_core::ports::{ListQuery, Precondition, StatusStore, StatusStoreError};
use skyport_core::status::{DeliveryState, StatusDocument};
use skyport_embedded::EmbeddedStore;
use skyport_runtime::config::{CosmosSettings, EmbeddedSettings, Millis};
use skyport_tests::contract::status_store_contract;
use skyport_tests::idempotency_contract::idempotency_store_contract;
use skyport_tests::leases_contract::lease_store_contract;
use skyport_tests::listing_contract::{Listed, listing_contract};
use skyport_tests::{TestApp, delivery_request, test_settings};
use time::OffsetDateTime;

fn settings() -> CosmosSettings {
    CosmosSettings {
        bulk_max_wait_ms: Millis::new(10),
        ..CosmosSettings::default()
    }
}

/// An embedded store in `dir`, its segments small.
fn embedded(dir: &Path) -> EmbeddedSettings {
    EmbeddedSettings {
        data_dir: dir.to_path_buf(),
        segment_size_mb: 1,
        ..EmbeddedSettings::default()
    }
}

/// The embedded store lists a document in the transaction that writes it.
struct EmbeddedListing {
    store: Arc<EmbeddedStore>,
    _dir: tempfile::TempDir,
}

impl Listed for EmbeddedListing {
    fn store(&self) -> &dyn StatusStore {
        &*self.store
    }

    async fn close(self) {}
}

/// Cosmos DB lists by a query on its status container.
struct CosmosListing {
    store: Arc<CosmosStore>,
}

impl Listed for CosmosListing {
    fn store(&self) -> &dyn StatusStore {
        &*self.store
    }

    async fn close(self) {
        self.store.close().await;
    }
}

#[tokio::test]
async fn the_embedded_store_keeps_the_listing_contract() {
    listing_contract(|| async {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(&embedded(dir.path()), 1).unwrap();
        EmbeddedListing { store, _dir: dir }
    })
    .await;
}

#[tokio::test]
async fn cosmos_keeps_the_listing_contract() {
    listing_contract(|| async {
        let (store, _wire) = emulator::open(&settings(), false).await.unwrap();
        CosmosListing { store }
    })
    .await;
}

#[tokio::test]
async fn the_embedded_store_keeps_the_status_store_contract() {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(&embedded(dir.path()), 1).unwrap();
    status_store_contract(store, "embedded").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_embedded_store_keeps_the_lease_store_contract() {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(&embedded(dir.path()), 1).unwrap();
    lease_store_contract(store.clone()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_embedded_store_keeps_the_idempotency_store_contract() {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(&embedded(dir.path()), 1).unwrap();
    idempotency_store_contract(store, "embedded").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cosmos_keeps_the_idempotency_store_contract() {
    let (store, _wire) = emulator::open(&settings(), false).await.unwrap();
    idempotency_store_contract(store.clone(), "cosmos").await;
    store.close().await;
}

#[tokio::test]
async fn cosmos_keeps_the_status_store_contract() {
    let (store, _wire) = emulator::open(&settings(), false).await.unwrap();
    status_store_contract(store.clone(), "cosmos").await;
    store.close().await;
}

#[tokio::test]
async fn a_missing_container_is_named_when_it_may_not_be_created() {
    let error = emulator::open(
        &CosmosSettings {
            create_if_missing: false,
            ..settings()
        },
        false,
    )
    .await
    .unwrap_err();
    assert!(
        error
            .to_string()
            .contains("database skyport does not exist"),
        "{error}"
    );
    assert!(
        error.to_string().contains("cosmos.create_if_missing"),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttled_writes_all_land_without_sdk_retries() {
    let throttled = CosmosSettings {
        throughput: Some(400),
        ..settings()
    };
    let (store, wire) = emulator::open(&throttled, true).await.unwrap();
    let mut writes = tokio::task::JoinSet::new();
    for n in 0..2_000 {
        let store = Arc::clone(&store);
        writes.spawn(async move {
            let id = format!("delivery-{n}");
            let document = StatusDocument::accepted(id, OffsetDateTime::UNIX_EPOCH);
            let put = StatusStore::put(&*store, &document, Precondition::IfNoneMatch);
            put.await.unwrap();
        });
    }
    writes.join_all().await;
    let units = store.request_units();
    let (written, write_units) = units.spent(Operation::Write);
    let write_throttles = units.throttled_count();
    // Read every one back: none lost.
    let mut reads = tokio::task::JoinSet::new();
    for n in 0..2_000 {
        let store = Arc::clone(&store);
        reads.spawn(async move {
            let id = format!("delivery-{n}");
            // A throttled read answers unavailable after a few 429s; readers retry.
            let found = loop {
                match StatusStore::get(&*store, &id).await {
                    Ok(found) => break found,
                    Err(StatusStoreError::Unavailable(_)) => {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    Err(e) => panic!("{e}"),
                }
            };
            assert!(found.is_some(), "{id} landed");
        });
    }
    reads.join_all().await;
    let (read, _) = units.spent(Operation::Read);
    let throttles = units.throttled_count();
    println!(
        "throttling: 2000 writes landed ({write_throttles} 429s waited out, {write_units:.0} RU), \
         all 2000 read back; {} document requests on the wire = {written} writes + {read} reads + {throttles} throttled",
        wire.documents()
    );
    assert_eq!(written, 2_000);
    assert_eq!(read, 2_000);
    assert!(
        write_throttles > 0,
        "a 400 RU/s container throttles 2000 quick writes"
    );
    assert_eq!(
        wire.documents(),
        written + read + throttles,
        "every request on the wire is one the adapter made: the SDK retried nothing"
    );
    store.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cosmos_keeps_the_lease_store_contract() {
    let (store, _wire) = emulator::open(&settings(), false).await.unwrap();
    lease_store_contract(store.clone()).await;
    store.close().await;
}

#[tokio::test]
async fn dead_letters_keep_the_reason_the_time_and_the_raw_bytes() {
    use skyport_core::ports::{DeadLetter, DeadLetterStore};
    let (store, _wire) = emulator::open(&settings(), false).await.unwrap();
    let at = OffsetDateTime::from_unix_timestamp(1_795_000_000).unwrap();
    let letter = DeadLetter {
        partition: 3,
        offset: 41,
        reason: "schema version 99 is not supported".into(),
        payload: bytes::Bytes::from_static(b"\xff\x00{not json"),
        at,
    };
    DeadLetterStore::put(&*store, letter.clone()).await.unwrap();
    // Dead-lettering the same event again (a replay) keeps one letter.
    DeadLetterStore::put(&*store, letter.clone()).await.unwrap();
    let letters = DeadLetterStore::events(&*store, None, 100).await.unwrap();
    assert_eq!(letters.len(), 1);
    let kept = &letters[0];
    assert_eq!((kept.partition, kept.offset, kept.at), (3, 41, at));
    assert_eq!(kept.reason, letter.reason);
    assert_eq!(kept.payload, letter.payload);
    store.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_requests_reach_scheduled_with_their_status_in_cosmos() {
    let dir = tempfile::tempdir().unwrap();
    // The bulk defaults (100 items or 1 s) as deployed.
    let app = TestApp::spawn_on_cosmos(test_settings(dir.path())).await;
    let accepted = app.client.post_many(1_000).await;
    let urls: Vec<String> = accepted.iter().map(|a| a.status_url.clone()).collect();
    let documents = app
        .client
        .wait_for_terminal(&urls, Duration::from_secs(120))
        .await;
    assert!(
        documents
            .iter()
            .all(|d| d.state == DeliveryState::Scheduled)
    );
    let cosmos = app.cosmos();
    let (written, write_units) = cosmos
        .request_units()
        .spent_doing(Spend::StatusWrites, Operation::Write);
    println!(
        "1,000 deliveries: {written} status writes, {write_units:.0} RU ({:.1} writes and {:.1} RU per delivery)",
        written as f64 / 1_000.0,
        write_units / 1_000.0
    );
    assert!(
        written >= 1_000,
        "the outcome of every delivery went to Cosmos DB (and Processing of those that ran \
         longer than worker.processing_after_ms): {written}"
    );
    // Listed as written: every delivery listed Scheduled.
    let status = Arc::clone(&app.app.backends.ports.status);
    let scheduled = ListQuery {
        principal: None,
        owner: None,
        state: Some(DeliveryState::Scheduled),
        since: None,
        until: None,
        limit: 1_000,
        after: None,
    };
    let page = status.list(&scheduled).await.unwrap();
    assert_eq!(page.items.len(), 1_000);
    let (pages, page_units) = cosmos.request_units().spent_on(Spend::Listing);
    println!("listing: {pages} page of 1,000, {page_units:.0} RU on the emulator");
    // Each request unit is counted once under what it was for, and the
    // status writes and the listing each under their own.
    let units = cosmos.request_units();
    let by_operation: f64 = Operation::ALL.iter().map(|&o| units.spent(o).1).sum();
    let by_work: f64 = Spend::ALL.iter().map(|&s| units.spent_on(s).1).sum();
    assert!(
        (by_operation - by_work).abs() < 0.01,
        "{by_operation} RU by operation, {by_work} by work: {units}"
    );
    assert_eq!(
        units.spent_on(Spend::Listing),
        (pages, page_units),
        "{units}"
    );
    println!("request units by work: {units}");
    app.app.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_posted_on_cosmos_are_listed_as_their_status_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let app = TestApp::spawn_on_cosmos(test_settings(dir.path())).await;
    // owner-{n % 97}: three deliveries of owner-0, one of owner-1, posted in turn.
    let mut accepted = Vec::new();
    for n in [0, 1, 97, 194] {
        accepted.push(app.client.post_delivery(&delivery_request(n)).await);
    }
    let urls: Vec<String> = accepted.iter().map(|a| a.status_url.clone()).collect();
    app.client
        .wait_for_terminal(&urls, Duration::from_secs(30))
        .await;
    let status = Arc::clone(&app.app.backends.ports.status);
    let list = |owner: Option<&str>| {
        let status = Arc::clone(&status);
        let query = ListQuery {
            principal: None,
            owner: owner.map(str::to_owned),
            state: None,
            since: None,
            until: None,
            limit: 10,
            after: None,
        };
        async move { status.list(&query).await.unwrap() }
    };
    // Listed as written: the outcomes are there once the reads saw them.
    let listed = list(Some("owner-0")).await;
    assert!(
        listed
            .items
            .iter()
            .all(|d| d.state == DeliveryState::Scheduled),
        "{listed:?}"
    );
    let newest_first: Vec<&str> = [3, 2, 0]
        .iter()
        .map(|&i| accepted[i].delivery_id.as_str())
        .collect();
    let ids: Vec<&str> = listed.items.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(ids, newest_first);
    assert_eq!(listed.next, None);
    let everything = list(None).await;
    assert_eq!(everything.items.len(), 4);
    assert_eq!(everything.items[0].id, accepted[3].delivery_id);
    let (pages, units) = app.cosmos().request_units().spent_on(Spend::Listing);
    assert_eq!(
        pages, 2,
        "a page is one query: nothing else is spent on listing"
    );
    println!("listing: {units:.0} RU for {pages} pages on the emulator");
    app.app.stop().await.unwrap();
}

/// The emulator served over HTTP: a store opened at its endpoint through the
/// SDK's own HTTP client (what a separate process does) keeps the status
/// store contract; the server answers HTTP/1.1 and h2c (prior knowledge),
/// counts what reached the account, and takes a ReplaceOffer through the
/// SDK's control plane.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_at_the_emulator_served_over_http_keeps_the_contract() {
    use skyport_azure::cosmos::emulator::server::{self, STATS_PATH, ServedStats};

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}/", listener.local_addr().unwrap());
    let account = server::account_for(&listener, false).unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let serving = tokio::spawn(server::serve(listener, account, stop.clone()));
    let cosmos = CosmosSettings {
        endpoint: Some(endpoint.parse().unwrap()),
        auth: skyport_runtime::config::CosmosAuth::Key,
        key: Some(emulator::Emulator::key().to_owned().into()),
        throughput: Some(1_000),
        ..settings()
    };
    let store = CosmosStore::open(&cosmos, &Default::default())
        .await
        .unwrap();
    status_store_contract(store.clone(), "cosmos over HTTP").await;
    store.close().await;
    server::replace_throughput(&endpoint, &cosmos.database, &cosmos.status_container, 4_000)
        .await
        .unwrap();
    let stats_url = format!("{}{STATS_PATH}", endpoint.trim_end_matches('/'));
    for client in [
        reqwest::Client::new(),
        reqwest::Client::builder()
            .http2_prior_knowledge()
            .build()
            .unwrap(),
    ] {
        let response = client.get(&stats_url).send().await.unwrap();
        let version = response.version();
        let stats: ServedStats = response.json().await.unwrap();
        assert!(
            stats.documents > 0 && stats.requests > stats.documents,
            "{version:?}: {stats:?}"
        );
        assert_eq!(stats.failed, 0, "{stats:?}");
    }
    stop.cancel();
    serving.await.unwrap();
}
