//! Event Hubs through the real SDK against the protocol-level test broker:
//! the sharded publisher, a refused send, two workers sharing a hub, and the
//! whole system end to end. The same scenarios run against a real namespace
//! with the `live` feature (`eventhubs_live.rs`).

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use skyport::{App, Backends};
use skyport_azure::eventhubs::EventHubsConsumer;
use skyport_core::ports::{
    Lease, LeaseCondition, LeaseError, LeaseFields, LeaseStore, LeaseVersion,
};
use tokio_util::sync::CancellationToken;

use skyport_azure::cosmos::emulator::Emulator;
use skyport_runtime::config::{CosmosSettings, Millis, Settings, StreamBackend};
use skyport_tests::eventhubs::{
    publisher_spreads_keys_and_keeps_their_order, requests_reach_scheduled_end_to_end,
    two_workers_share_a_hub_and_one_takes_over,
};
use skyport_tests::eventhubs_broker::EventHubsBroker;
use skyport_tests::{TestApp, delivery_request, test_settings};

/// Settings that stream through `hubs` on `broker`, with a SAS connection string.
pub(crate) fn settings_on(
    broker: &EventHubsBroker,
    dir: &tempfile::TempDir,
    hubs: &[&str],
) -> Settings {
    let mut settings = test_settings(dir.path());
    settings.stream.backend = Some(StreamBackend::EventHubs);
    settings.eventhubs.hubs = hubs.iter().map(|h| (*h).to_owned()).collect();
    settings.eventhubs.connection_string = Some(
        format!(
            "Endpoint=sb://{}/;SharedAccessKeyName=skyport;SharedAccessKey=dGVzdC1rZXk=",
            broker.namespace()
        )
        .into(),
    );
    settings.eventhubs.custom_endpoint = Some(broker.endpoint().parse().unwrap());
    settings.eventhubs.update_interval_ms = Millis::new(250);
    settings.eventhubs.partition_expiration_ms = Millis::new(5_000);
    settings
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_publisher_spreads_keys_over_hubs_and_partitions_in_order_and_in_batches() {
    let broker = EventHubsBroker::start(&[("d-0", 4), ("d-1", 4)])
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let settings = settings_on(&broker, &dir, &["d-0", "d-1"]);
    let report = publisher_spreads_keys_and_keeps_their_order(&settings.eventhubs, "broker").await;
    // What went over the wire agrees: events of one batch share a transfer.
    let (mut events, mut transfers) = (0, BTreeSet::new());
    for hub in ["d-0", "d-1"] {
        for partition in 0..4 {
            for event in broker.events(hub, partition) {
                events += 1;
                transfers.insert((hub, partition, event.transfer));
                assert!(event.properties.contains_key("idempotencyKey"));
                assert!(
                    event.partition_key.is_none(),
                    "sent to a partition, not by key"
                );
            }
        }
    }
    #[allow(clippy::cast_precision_loss)]
    let wire_mean = f64::from(events) / transfers.len() as f64;
    println!(
        "publisher: events per partition {:?}; mean batch size {:.1} (publisher) / {wire_mean:.1} (broker transfers)",
        report.per_partition, report.mean_batch_size
    );
    assert!(wire_mean > 1.0);
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_the_hub_refuses_answers_503_and_the_next_one_is_accepted() {
    let broker = EventHubsBroker::start(&[("deliveries", 2)]).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let app = TestApp::spawn_with(settings_on(&broker, &dir, &["deliveries"])).await;
    broker.refuse_sends(true);
    let response = app
        .client
        .post_raw("application/json", delivery_request(1).to_string())
        .await;
    assert_eq!(response.status(), 503);
    assert!(response.headers().contains_key("retry-after"));
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json"
    );
    broker.refuse_sends(false);
    let accepted = app.client.post_delivery(&delivery_request(2)).await;
    app.client
        .wait_for_terminal(&[accepted.status_url], Duration::from_secs(30))
        .await;
    app.app.stop().await.unwrap();
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_the_hub_is_down_posts_get_503_and_the_publisher_reconnects_when_it_is_back() {
    let broker = EventHubsBroker::start(&[("deliveries", 2)]).await.unwrap();
    let addr = broker.addr();
    let dir = tempfile::tempdir().unwrap();
    let mut settings = settings_on(&broker, &dir, &["deliveries"]);
    settings.eventhubs.send_timeout_ms = Millis::new(2_000);
    let app = TestApp::spawn_with(settings).await;
    app.client.post_delivery(&delivery_request(1)).await;
    broker.stop().await;
    let started = std::time::Instant::now();
    let response = app
        .client
        .post_raw("application/json", delivery_request(2).to_string())
        .await;
    assert_eq!(response.status(), 503);
    assert!(response.headers().contains_key("retry-after"));
    let refused_in = started.elapsed();
    assert!(
        refused_in < Duration::from_secs(5),
        "refused after {refused_in:?}"
    );
    let broker = EventHubsBroker::start_on(addr, &[("deliveries", 2)])
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let accepted = loop {
        let response = app
            .client
            .post_raw("application/json", delivery_request(3).to_string())
            .await;
        if response.status() == 202 {
            break response.json::<serde_json::Value>().await.unwrap();
        }
        assert_eq!(response.status(), 503);
        assert!(std::time::Instant::now() < deadline, "no reconnect in 30 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    println!(
        "hub down: POST refused with 503 in {refused_in:?}; accepted again after the hub came back"
    );
    assert_eq!(
        broker.events("deliveries", 0).len() + broker.events("deliveries", 1).len(),
        1
    );
    assert!(accepted["statusUrl"].is_string());
    app.app.stop().await.unwrap();
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_split_a_hub_and_one_takes_over_all_partitions_when_the_other_stops() {
    let broker = EventHubsBroker::start(&[("deliveries", 8)]).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut settings = settings_on(&broker, &dir, &["deliveries"]);
    settings.gateway.receipt_keys = vec!["a-receipt-key-shared-by-every-gateway".into()];
    settings.worker.max_in_flight = 16;
    settings.simulator.latency_ms = Millis::new(5);
    settings.cosmos = CosmosSettings {
        bulk_max_wait_ms: Millis::new(10),
        ..CosmosSettings::default()
    };
    let emulator = Emulator::new(false).unwrap();
    let cosmos = settings.cosmos.clone();
    let report = two_workers_share_a_hub_and_one_takes_over(settings, async || {
        emulator.store(&cosmos).await.unwrap()
    })
    .await;
    println!(
        "takeover: all partitions owned {:?} after the second worker stopped; {} duplicate events (the in-flight windows allow {})",
        report.takeover, report.duplicates, report.bound
    );
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_requests_reach_scheduled_through_event_hubs() {
    let broker = EventHubsBroker::start(&[("d-0", 4), ("d-1", 4)])
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let app = TestApp::spawn_with(settings_on(&broker, &dir, &["d-0", "d-1"])).await;
    let took = requests_reach_scheduled_end_to_end(&app.app, 2_000).await;
    println!("end to end: 2000 requests Scheduled through two hubs in {took:?}");
    app.app.stop().await.unwrap();
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_whose_status_writes_keep_failing_are_handed_out_again_from_the_reader() {
    let broker = EventHubsBroker::start(&[("deliveries", 2)]).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let settings = settings_on(&broker, &dir, &["deliveries"]);
    crate::disk_faults::handed_back_events_are_read_again_and_end_scheduled(settings).await;
    broker.stop().await;
}

/// A lease store whose first `failures` listings of ownerships fail, as a
/// store that is briefly unreachable does.
#[derive(Debug)]
struct Flaky {
    inner: Arc<dyn LeaseStore>,
    failures: AtomicU32,
}

#[async_trait::async_trait]
impl LeaseStore for Flaky {
    async fn list(&self, group: &str, prefix: &str) -> Result<Vec<Lease>, LeaseError> {
        let fail = prefix.starts_with("ownership")
            && self
                .failures
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                .is_ok();
        if fail {
            return Err(LeaseError::Unavailable(
                "the ownership store is unreachable".into(),
            ));
        }
        self.inner.list(group, prefix).await
    }

    async fn put(
        &self,
        group: &str,
        name: &str,
        fields: &LeaseFields,
        condition: LeaseCondition,
    ) -> Result<LeaseVersion, LeaseError> {
        self.inner.put(group, name, fields, condition).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_processor_that_fails_is_restarted_and_its_partitions_are_consumed() {
    let broker = EventHubsBroker::start(&[("deliveries", 2)]).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let settings = settings_on(&broker, &dir, &["deliveries"]);
    let mut backends = Backends::open(&settings).await.unwrap();
    let flaky = Arc::new(Flaky {
        inner: backends.store.leases(),
        failures: AtomicU32::new(2),
    });
    backends.ports.consumer = Arc::new(EventHubsConsumer::new(
        &settings.eventhubs,
        &settings.worker.consumer_group,
        flaky.clone(),
    ));
    let app = App::start_with(settings, backends, CancellationToken::new())
        .await
        .unwrap();
    requests_reach_scheduled_end_to_end(&app, 100).await;
    assert_eq!(
        flaky.failures.load(Ordering::Relaxed),
        0,
        "both failures were met"
    );
    app.stop().await.unwrap();
    broker.stop().await;
}
