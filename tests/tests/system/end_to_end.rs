//! The whole path on the embedded default: POST → durable event → worker →
//! five services → status → GET.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use bytes::Bytes;
use skyport_core::ports::{DeadLetterStore, EventProperties, FeedRange, OutboundEvent, StartFrom};
use skyport_core::status::DeliveryState;
use skyport_core::status::Step;
use skyport_runtime::config::{Millis, ServicesSettings};
use skyport_simulator::Behaviour;
use skyport_tests::{TestApp, delivery_request, eventually};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_concurrent_requests_are_all_scheduled_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let app = TestApp::spawn(&dir).await;
    let accepted = app.client.post_many(1_000).await;
    let urls: Vec<String> = accepted.iter().map(|a| a.status_url.clone()).collect();
    let documents = app
        .client
        .wait_for_terminal(&urls, Duration::from_secs(120))
        .await;
    for document in &documents {
        assert_eq!(document.state, DeliveryState::Scheduled, "{document:?}");
        assert_eq!(document.steps.len(), 5);
        assert!(document.drone_id.is_some());
    }
    let stats = app.simulator().stats();
    for service in Step::ALL {
        let counters = stats.get(service);
        assert_eq!(counters.created, 1_000, "{service:?}: {counters:?}");
        assert_eq!(counters.conflicts, 0, "{service:?}: {counters:?}");
    }
    let connections = u64::try_from(ServicesSettings::default().h2c_connections).unwrap();
    assert_eq!(
        stats.connections, connections,
        "the workflow's calls to the simulated services take services.h2c_connections HTTP/2 connections in turn"
    );
    app.app.stop().await.unwrap();
}

#[tokio::test]
async fn the_status_url_answers_accepted_before_the_worker_writes_anything() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = skyport_tests::test_settings(dir.path());
    // One partition, one event at a time, each step slow: the first request
    // holds the worker, so the two behind it have no status document yet.
    settings.stream.partitions = 1;
    settings.worker.max_in_flight = 1;
    settings.worker.shutdown_grace_period_ms = Millis::new(100);
    settings.simulator.latency_ms = Millis::new(2_000);
    let app = TestApp::spawn_with(settings).await;
    let first = app.client.post_delivery(&delivery_request(1)).await;
    let second = app.client.post_delivery(&delivery_request(2)).await;
    let third = app.client.post_delivery(&delivery_request(3)).await;
    let mut states = Vec::new();
    for accepted in [&first, &second, &third] {
        let response = app.client.status(&accepted.status_url).await;
        assert_eq!(response.status(), 200);
        assert!(response.headers().contains_key("retry-after"));
        if accepted.delivery_id != first.delivery_id {
            assert_eq!(
                response.headers()["etag"],
                "\"accepted\"",
                "nothing written yet"
            );
        }
        let document: skyport_core::status::StatusDocument = response.json().await.unwrap();
        states.push(document.state);
    }
    assert_eq!(
        states[1..],
        [DeliveryState::Accepted, DeliveryState::Accepted]
    );
    // Without the receipt the same id is unknown until the worker writes its status.
    let bare = third.status_url.split('?').next().unwrap().to_owned();
    assert_eq!(app.client.status(&bare).await.status(), 404);
    app.app.stop().await.unwrap();
}

/// `Retry-After` follows what deliveries recently took to reach their outcome:
/// before any has ended it is `gateway.retry_after_s`; once the gateway has
/// served terminal documents, a new 202 tells its client to come back when
/// its delivery is expected to end (`retry-after-ms`), in whole seconds at
/// least 1.
#[tokio::test]
async fn retry_after_follows_the_recent_time_to_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let app = TestApp::spawn(&dir).await;
    let waits = |response: &reqwest::Response| {
        let header = |name: &str| {
            response.headers()[name]
                .to_str()
                .unwrap()
                .parse::<u64>()
                .unwrap()
        };
        (header("retry-after"), header("retry-after-ms"))
    };
    let first = app
        .client
        .post_raw("application/json", delivery_request(1).to_string())
        .await;
    assert_eq!(first.status(), 202);
    assert_eq!(waits(&first), (1, 1_000), "nothing has ended yet");
    let accepted = app.client.post_many(50).await;
    let urls: Vec<String> = accepted.iter().map(|a| a.status_url.clone()).collect();
    let documents = app
        .client
        .wait_for_terminal(&urls, Duration::from_secs(60))
        .await;
    let took: Vec<u64> = documents
        .iter()
        .map(|d| u64::try_from((d.updated_at - d.created_at).whole_milliseconds()).unwrap())
        .collect();
    let (fastest, slowest) = (took.iter().min().unwrap(), took.iter().max().unwrap());
    let next = app
        .client
        .post_raw("application/json", delivery_request(2).to_string())
        .await;
    assert_eq!(next.status(), 202);
    let (seconds, millis) = waits(&next);
    assert!(
        millis >= fastest.saturating_sub(100).max(100) && millis <= (*slowest).max(100) + 1,
        "retry-after-ms {millis} outside what the deliveries took ({fastest}..{slowest} ms)"
    );
    assert_eq!(seconds, millis.div_ceil(1_000).max(1));
    app.app.stop().await.unwrap();
}

/// Every status answer carries an `ETag` that changes with each write of the
/// delivery's status; a GET naming the current one in `If-None-Match` is a
/// 304 without a body, and the page a browser gets has a tag of its own.
#[tokio::test]
async fn a_status_read_is_conditional_on_its_etag() {
    let dir = tempfile::tempdir().unwrap();
    let app = TestApp::spawn(&dir).await;
    let accepted = app.client.post_delivery(&delivery_request(1)).await;
    app.client
        .wait_for_terminal(
            std::slice::from_ref(&accepted.status_url),
            Duration::from_secs(60),
        )
        .await;
    let url = format!(
        "{}{}",
        app.client.base,
        &accepted.status_url[accepted.status_url.find("/api/").unwrap()..]
    );
    let get = |if_none_match: Option<&str>, accept: &str| {
        let mut request = app.client.http.get(&url).header("accept", accept);
        if let Some(tags) = if_none_match {
            request = request.header("if-none-match", tags);
        }
        request.send()
    };
    let first = get(None, "application/json").await.unwrap();
    assert_eq!(first.status(), 200);
    let etag = first.headers()["etag"].to_str().unwrap().to_owned();
    assert!(
        etag.starts_with('"') && etag.ends_with('"') && etag != "\"accepted\"",
        "{etag}"
    );
    for current in [
        etag.clone(),
        format!("W/{etag}"),
        format!("\"other\", {etag}"),
        "*".to_owned(),
    ] {
        let response = get(Some(&current), "application/json").await.unwrap();
        assert_eq!(response.status(), 304, "If-None-Match: {current}");
        assert_eq!(response.headers()["etag"], etag.as_str());
        assert!(response.bytes().await.unwrap().is_empty());
    }
    let stale = get(Some("\"accepted\""), "application/json").await.unwrap();
    assert_eq!(stale.status(), 200);
    let page = get(None, "text/html").await.unwrap();
    assert_eq!(page.status(), 200);
    assert_ne!(
        page.headers()["etag"],
        etag.as_str(),
        "the page is another representation"
    );
    app.app.stop().await.unwrap();
}

#[tokio::test]
async fn poison_events_are_dead_lettered_and_the_partition_moves_on() {
    let dir = tempfile::tempdir().unwrap();
    let app = TestApp::spawn(&dir).await;
    let publisher = &app.app.backends.ports.publisher;
    for (key, payload) in [
        ("poison-1", Bytes::from_static(b"\xff\xfe not json")),
        (
            "poison-2",
            Bytes::from_static(br#"{"schemaVersion":99,"deliveryId":"x"}"#),
        ),
        (
            "poison-3",
            Bytes::from_static(br#"{"schemaVersion":1,"deliveryId":"x"}"#),
        ),
    ] {
        publisher
            .publish(OutboundEvent {
                key: key.into(),
                payload,
                properties: EventProperties::default(),
                lane: skyport_core::ports::Lane::Normal,
            })
            .await
            .unwrap();
    }
    let accepted = app.client.post_many(50).await;
    let urls: Vec<String> = accepted.iter().map(|a| a.status_url.clone()).collect();
    let documents = app
        .client
        .wait_for_terminal(&urls, Duration::from_secs(60))
        .await;
    assert!(
        documents
            .iter()
            .all(|d| d.state == DeliveryState::Scheduled)
    );
    let store = app.embedded();
    let letters = eventually("three dead letters", Duration::from_secs(10), || async {
        let letters = DeadLetterStore::events(&*store, None, 100).await.unwrap();
        (letters.len() == 3).then_some(letters)
    })
    .await;
    let reasons: Vec<&str> = letters.iter().map(|l| l.reason.as_str()).collect();
    assert!(
        reasons.iter().any(|r| r.contains("not a JSON envelope")),
        "{reasons:?}"
    );
    assert!(
        reasons.iter().any(|r| r.contains("version 99")),
        "{reasons:?}"
    );
    assert!(
        reasons
            .iter()
            .any(|r| r.contains("does not match its schema")),
        "{reasons:?}"
    );
    assert!(
        letters
            .iter()
            .any(|l| l.payload.as_ref() == b"\xff\xfe not json")
    );
    app.app.stop().await.unwrap();
}

#[tokio::test]
async fn a_graceful_stop_checkpoints_everything_so_a_restart_replays_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let app = TestApp::spawn(&dir).await;
    let accepted = app.client.post_many(200).await;
    let urls: Vec<String> = accepted.iter().map(|a| a.status_url.clone()).collect();
    app.client
        .wait_for_terminal(&urls, Duration::from_secs(60))
        .await;
    let app = app.restart().await;
    // Once a new request is through, anything left unchecked-in would have been read again.
    let more = app.client.post_delivery(&delivery_request(10_000)).await;
    app.client
        .wait_for_terminal(&[more.status_url], Duration::from_secs(30))
        .await;
    let counters = app.app.tally.to_string();
    assert!(counters.contains("replayed=0"), "{counters}");
    assert!(counters.contains("scheduled=1"), "{counters}");
    app.app.stop().await.unwrap();
}

#[tokio::test]
async fn a_rate_limited_worker_stops_at_once_and_its_waiting_events_run_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = skyport_tests::test_settings(dir.path());
    settings.worker.rate_limit_per_s = 5;
    let app = TestApp::spawn_with(settings).await;
    let accepted = app.client.post_many(40).await;
    eventually(
        "the worker started a delivery",
        Duration::from_secs(10),
        || async { (app.simulator().stats().account.calls > 0).then_some(()) },
    )
    .await;
    // The 40 are pulled, and most wait for a slot: they have not started, so
    // the stop does not wait for them (the grace period is 10 s).
    let stopping = std::time::Instant::now();
    let app = app.restart().await;
    assert!(
        stopping.elapsed() < Duration::from_secs(5),
        "stopping took {:?}",
        stopping.elapsed()
    );
    let urls: Vec<String> = accepted.iter().map(|a| a.status_url.clone()).collect();
    for document in app
        .client
        .wait_for_terminal(&urls, Duration::from_secs(60))
        .await
    {
        assert_eq!(document.state, DeliveryState::Scheduled, "{document:?}");
    }
    app.app.stop().await.unwrap();
}

/// Status writes of the embedded store so far: it numbers every write in
/// its change sequence, and a read's continuation is the last number read.
async fn status_writes(app: &TestApp) -> u64 {
    let changes = app.app.backends.store.changes();
    let range = FeedRange::full();
    let page = changes
        .read(&range, None, StartFrom::Beginning, 1_000)
        .await
        .unwrap();
    page.continuation.parse().unwrap()
}

#[tokio::test]
async fn a_quick_delivery_is_written_once_and_a_slow_one_is_marked_processing_while_it_runs() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = skyport_tests::test_settings(dir.path());
    settings.worker.processing_after_ms = Millis::new(300);
    let app = TestApp::spawn_with(settings).await;
    let wait = Duration::from_secs(30);
    let quick = app.client.post_delivery(&delivery_request(1)).await;
    let done = app
        .client
        .wait_for_state(&quick.status_url, DeliveryState::Scheduled, wait)
        .await;
    assert_eq!(done.attempt, 1);
    assert_eq!(done.package_id.as_deref(), Some("package-1"));
    assert_eq!(status_writes(&app).await, 1, "one write: the outcome");

    app.simulator().set_behaviour(
        Step::Drone,
        Behaviour {
            latency: Duration::from_millis(1_500),
            ..Behaviour::default()
        },
    );
    let slow = app.client.post_delivery(&delivery_request(2)).await;
    let running = app
        .client
        .wait_for_state(&slow.status_url, DeliveryState::Processing, wait)
        .await;
    assert_eq!(running.attempt, 1);
    assert!(running.steps.is_empty(), "{:?}", running.steps);
    let done = app
        .client
        .wait_for_state(&slow.status_url, DeliveryState::Scheduled, wait)
        .await;
    assert_eq!(done.attempt, 1, "Processing counted the attempt once");
    assert_eq!(done.steps.len(), 5);
    assert_eq!(
        status_writes(&app).await,
        3,
        "the slow one: Processing while it ran, then the outcome"
    );
    app.app.stop().await.unwrap();
}

#[tokio::test]
async fn a_suspended_owner_fails_at_the_account_step() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = skyport_tests::test_settings(dir.path());
    settings.simulator.suspended_owners = vec!["owner-5".into()];
    let app = TestApp::spawn_with(settings).await;
    let accepted = app.client.post_delivery(&delivery_request(5)).await;
    let documents = app
        .client
        .wait_for_terminal(&[accepted.status_url], Duration::from_secs(30))
        .await;
    let document = &documents[0];
    assert_eq!(document.state, DeliveryState::Failed);
    let failure = document.failure.as_ref().unwrap();
    assert_eq!(failure.step, skyport_core::status::Step::Account);
    assert_eq!(failure.code, "AccountSuspended");
    assert_eq!(app.simulator().stats().get(Step::Package).created, 0);
    app.app.stop().await.unwrap();
}
