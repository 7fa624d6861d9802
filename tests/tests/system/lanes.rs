//! The expedited lane and fair turns: expedited deliveries overtake a
//! backlog of normal ones on each stream (the embedded log's lane
//! partition, `kafka.expedited_topic`, `eventhubs.expedited_hubs`), their
//! cancellations follow them into the lane, the normal lane keeps draining
//! while expedited ones keep coming, and one client's burst does not hold
//! another client's delivery behind it.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use futures_util::future::join_all;
use serde_json::{Value, json};
use skyport_core::ports::Lane;
use skyport_core::status::{DeliveryState, StatusDocument};
use skyport_gateway::routes::deliveries::resources::Accepted;
use skyport_runtime::config::{Millis, Settings};
use skyport_tests::eventhubs_broker::EventHubsBroker;
use skyport_tests::kafka::Broker;
use skyport_tests::{Client, TestApp, delivery_request, test_settings};

use crate::eventhubs::settings_on;

/// Normal deliveries posted before the expedited ones.
const BACKLOG: usize = 480;
const EXPEDITED: usize = 4;

/// `delivery_request(n)` of `owner`, expedited or not.
fn request(n: usize, owner: &str, expedited: bool) -> Value {
    let mut request = delivery_request(n);
    request["ownerId"] = json!(owner);
    request["expedited"] = json!(expedited);
    request
}

async fn post_all(client: &Client, requests: Vec<Value>) -> Vec<Accepted> {
    let mut accepted = Vec::with_capacity(requests.len());
    for chunk in requests.chunks(32) {
        accepted.extend(join_all(chunk.iter().map(|r| client.post_delivery(r))).await);
    }
    accepted
}

fn urls(accepted: &[Accepted]) -> Vec<String> {
    accepted.iter().map(|a| a.status_url.clone()).collect()
}

/// How many of `urls` are terminal now.
async fn terminal_now(client: &Client, urls: &[String]) -> usize {
    let mut terminal = 0;
    for chunk in urls.chunks(32) {
        let documents = join_all(chunk.iter().map(|url| async {
            client
                .status(url)
                .await
                .json::<StatusDocument>()
                .await
                .unwrap()
        }))
        .await;
        terminal += documents.iter().filter(|d| d.state.is_terminal()).count();
    }
    terminal
}

/// Slow services and narrow windows, so that a few hundred deliveries are
/// a backlog of seconds.
fn slowed(mut settings: Settings) -> Settings {
    settings.simulator.latency_ms = Millis::new(25);
    settings.simulator.jitter_ms = Millis::new(0);
    settings.worker.max_in_flight = 2;
    settings.worker.read_ahead = 4;
    settings.worker.processing_after_ms = Millis::new(0);
    settings
}

/// A backlog of [`BACKLOG`] normal deliveries, then [`EXPEDITED`] expedited
/// ones: these end Scheduled in the expedited lane while most of the
/// backlog still waits, and then the backlog ends Scheduled too.
async fn expedited_deliveries_overtake_a_backlog(settings: Settings) {
    let app = TestApp::spawn_with(slowed(settings)).await;
    let client = &app.client;
    let backlog = post_all(
        client,
        (0..BACKLOG).map(|n| request(n, "bulk", false)).collect(),
    )
    .await;
    let expedited = post_all(
        client,
        (0..EXPEDITED)
            .map(|n| request(BACKLOG + n, "urgent", true))
            .collect(),
    )
    .await;
    let documents = client
        .wait_for_terminal(&urls(&expedited), Duration::from_secs(60))
        .await;
    let overtaken = BACKLOG - terminal_now(client, &urls(&backlog)).await;
    for document in &documents {
        assert_eq!(document.state, DeliveryState::Scheduled, "{document:?}");
        assert_eq!(document.lane, Lane::Expedited, "{document:?}");
    }
    assert!(
        overtaken > BACKLOG / 2,
        "the expedited deliveries ended while only {overtaken} of {BACKLOG} normal ones still waited"
    );
    println!("lanes: {EXPEDITED} expedited deliveries overtook {overtaken} of {BACKLOG}");
    let normal = client
        .wait_for_terminal(&urls(&backlog), Duration::from_secs(180))
        .await;
    assert!(
        normal
            .iter()
            .all(|d| d.state == DeliveryState::Scheduled && d.lane == Lane::Normal),
        "every normal delivery ends Scheduled in the normal lane"
    );
    app.app.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expedited_deliveries_overtake_a_backlog_on_the_embedded_log() {
    let dir = tempfile::tempdir().unwrap();
    expedited_deliveries_overtake_a_backlog(test_settings(dir.path())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expedited_deliveries_overtake_a_backlog_on_kafka() {
    let broker = Broker::start(&["deliveries"], 4).await;
    broker.create_topics(&["deliveries-expedited"], 1).await;
    let dir = tempfile::tempdir().unwrap();
    let mut settings = test_settings(dir.path());
    broker.configure(&mut settings, &["deliveries"]);
    settings.kafka.expedited_topic = Some("deliveries-expedited".into());
    settings.kafka.session_timeout_ms = Millis::new(10_000);
    expedited_deliveries_overtake_a_backlog(settings).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expedited_deliveries_overtake_a_backlog_on_event_hubs() {
    let broker = EventHubsBroker::start(&[("deliveries", 4), ("expedited", 1)])
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut settings = settings_on(&broker, &dir, &["deliveries"]);
    settings.eventhubs.expedited_hubs = vec!["expedited".into()];
    expedited_deliveries_overtake_a_backlog(settings).await;
    broker.stop().await;
}

/// Expedited deliveries posted without a pause for two seconds, more than
/// their lane's window drains: the normal lane's backlog keeps draining
/// meanwhile (its partitions have windows of their own), and an expedited
/// delivery's cancellation goes to its lane's partition, behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_normal_lane_drains_while_expedited_deliveries_keep_coming() {
    let dir = tempfile::tempdir().unwrap();
    let app = TestApp::spawn_with(slowed(test_settings(dir.path()))).await;
    let client = &app.client;
    let backlog = post_all(
        client,
        (0..200).map(|n| request(n, "bulk", false)).collect(),
    )
    .await;
    let before = terminal_now(client, &urls(&backlog)).await;
    let flood_until = tokio::time::Instant::now() + Duration::from_secs(2);
    let mut expedited = Vec::new();
    let mut n = 1_000;
    while tokio::time::Instant::now() < flood_until {
        expedited.extend(
            post_all(
                client,
                (n..n + 8).map(|n| request(n, "urgent", true)).collect(),
            )
            .await,
        );
        n += 8;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let during = terminal_now(client, &urls(&backlog)).await - before;
    assert!(
        during >= 40,
        "only {during} normal deliveries ended while {} expedited ones were posted",
        expedited.len()
    );
    let lane = app.embedded().expedited_partition() as usize;
    let heads_before = app.embedded().heads()[lane];
    assert_eq!(heads_before as usize, expedited.len());
    let last = expedited.last().unwrap();
    assert_eq!(client.cancel(&last.status_url).await.status(), 202);
    assert_eq!(
        app.embedded().heads()[lane],
        heads_before + 1,
        "the cancellation went to the expedited lane's partition"
    );
    client
        .wait_for_state(
            &last.status_url,
            DeliveryState::Cancelled,
            Duration::from_secs(120),
        )
        .await;
    client
        .wait_for_terminal(&urls(&expedited), Duration::from_secs(120))
        .await;
    client
        .wait_for_terminal(&urls(&backlog), Duration::from_secs(120))
        .await;
    println!(
        "lanes: {during} normal deliveries ended while {} expedited ones were posted",
        expedited.len()
    );
    app.app.stop().await.unwrap();
}

/// On one partition, client A's burst of 100 is read ahead of client B's
/// single delivery; with the clients taking turns, B's ends while most of
/// A's still wait (first come, first served would end it last).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_clients_burst_does_not_hold_another_clients_delivery_behind_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = slowed(test_settings(dir.path()));
    settings.stream.partitions = 1;
    settings.worker.read_ahead = 256;
    let app = TestApp::spawn_with(settings).await;
    let client = &app.client;
    let burst = post_all(client, (0..100).map(|n| request(n, "a", false)).collect()).await;
    let single = post_all(client, vec![request(100, "b", false)]).await;
    client
        .wait_for_terminal(&urls(&single), Duration::from_secs(60))
        .await;
    let waiting = 100 - terminal_now(client, &urls(&burst)).await;
    assert!(
        waiting >= 60,
        "B's delivery ended with only {waiting} of A's 100 still waiting"
    );
    println!("fairness: B's delivery ended with {waiting} of A's 100 still waiting");
    client
        .wait_for_terminal(&urls(&burst), Duration::from_secs(120))
        .await;
    app.app.stop().await.unwrap();
}
