//! The Event Hubs scenarios of `eventhubs.rs` against a real namespace and a
//! real Cosmos DB account (feature `live`). The "Live tests" section of
//! docs/testing.md says how to run them; each reads its targets from the environment:
//!
//! - `SKYPORT_LIVE_EVENTHUBS_CONNECTION_STRING`: a namespace-level key with
//!   Send and Listen rights.
//! - `SKYPORT_LIVE_EVENTHUBS_HUBS`: hubs for the sharded publisher and the end
//!   to end run, comma-separated (for example `skyport-0,skyport-1`); nothing
//!   else may write to them while the tests run.
//! - `SKYPORT_LIVE_EVENTHUBS_TAKEOVER_HUB`: a hub with an even number of
//!   partitions for the two-worker scenario.
//! - `SKYPORT_LIVE_EVENTHUBS_CONSUMER_GROUP`: the consumer group (default `$Default`).
//! - `SKYPORT_LIVE_COSMOS_ENDPOINT` and `SKYPORT_LIVE_COSMOS_KEY`: the account
//!   that keeps status, ownership and checkpoints (database `skyport-live`).

#![cfg(feature = "live")]
#![allow(clippy::unwrap_used)]

use skyport::App;
use skyport::Backends;
use skyport_azure::cosmos::CosmosStore;
use skyport_runtime::config::Millis;
use skyport_runtime::config::{CosmosAuth, Settings, StreamBackend};
use skyport_tests::eventhubs::{
    publisher_spreads_keys_and_keeps_their_order, requests_reach_scheduled_end_to_end, run_tag,
    two_workers_share_a_hub_and_one_takes_over,
};
use skyport_tests::test_settings;
use tokio_util::sync::CancellationToken;

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} must be set for the live tests"))
}

fn live_settings(dir: &tempfile::TempDir, hubs: Vec<String>) -> Settings {
    let mut settings = test_settings(dir.path());
    settings.stream.backend = Some(StreamBackend::EventHubs);
    settings.eventhubs.hubs = hubs;
    settings.eventhubs.connection_string =
        Some(env("SKYPORT_LIVE_EVENTHUBS_CONNECTION_STRING").into());
    settings.eventhubs.update_interval_ms = Millis::new(2_000);
    settings.eventhubs.partition_expiration_ms = Millis::new(20_000);
    settings.worker.consumer_group = std::env::var("SKYPORT_LIVE_EVENTHUBS_CONSUMER_GROUP")
        .unwrap_or_else(|_| "$Default".into());
    settings.gateway.receipt_keys = vec!["a-receipt-key-for-the-live-tests-only".into()];
    settings.cosmos.endpoint = Some(env("SKYPORT_LIVE_COSMOS_ENDPOINT").parse().unwrap());
    settings.cosmos.auth = CosmosAuth::Key;
    settings.cosmos.key = Some(env("SKYPORT_LIVE_COSMOS_KEY").into());
    settings.cosmos.database = "skyport-live".into();
    settings.cosmos.bulk_max_wait_ms = Millis::new(50);
    settings
}

fn hubs() -> Vec<String> {
    env("SKYPORT_LIVE_EVENTHUBS_HUBS")
        .split(',')
        .map(|h| h.trim().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_the_publisher_spreads_keys_in_order_and_in_batches() {
    let dir = tempfile::tempdir().unwrap();
    let settings = live_settings(&dir, hubs());
    let report =
        publisher_spreads_keys_and_keeps_their_order(&settings.eventhubs, &run_tag()).await;
    println!("live publisher: {report:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_two_workers_split_a_hub_and_one_takes_over() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = live_settings(&dir, vec![env("SKYPORT_LIVE_EVENTHUBS_TAKEOVER_HUB")]);
    settings.worker.max_in_flight = 16;
    let (cosmos, store) = (settings.cosmos.clone(), settings.store.clone());
    let report = two_workers_share_a_hub_and_one_takes_over(settings, async || {
        CosmosStore::open(&cosmos, &store).await.unwrap()
    })
    .await;
    println!("live takeover: {report:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_two_thousand_requests_reach_scheduled() {
    let dir = tempfile::tempdir().unwrap();
    let settings = live_settings(&dir, hubs());
    let backends = Backends::open(&settings).await.unwrap();
    let app = App::start_with(settings, backends, CancellationToken::new())
        .await
        .unwrap();
    let took = requests_reach_scheduled_end_to_end(&app, 2_000).await;
    println!("live end to end: 2000 requests Scheduled in {took:?}");
    app.stop().await.unwrap();
}
