//! Rescheduling (`PATCH` with a JSON merge patch) in every state: before the
//! worker reads the request (its steps book the new values), mid-workflow and
//! once Scheduled (the bookings are updated, once each), refused when Failed
//! or Cancelled, on a stale `If-Match`, racing a cancellation, and refused by
//! a service; on the embedded default and on Kafka with Cosmos DB.

#![allow(clippy::unwrap_used)]

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use skyport_core::status::{ChangeOutcome, DeliveryState, StatusDocument, Step};
use skyport_runtime::config::Millis;
use skyport_simulator::Behaviour;
use skyport_tests::kafka::Broker;
use skyport_tests::{Client, TestApp, delivery_request, eventually, test_settings};

/// The patch every test sends: an hour later, and a new drop-off.
fn later() -> Value {
    json!({
        "pickupTime": "2030-01-01T11:00:00Z",
        "deadline": "2030-01-01T13:00:00Z",
        "dropOffLocation": "47.6205,-122.3493",
    })
}

/// `PATCH`es the delivery behind `status_url` with `patch`, sending each
/// of `headers`.
async fn patch(
    client: &Client,
    status_url: &str,
    patch: &Value,
    headers: &[(&str, &str)],
) -> reqwest::Response {
    let path = &status_url[status_url.find("/api/").unwrap()..];
    let url = format!("{}{}", client.base, path.replacen("/status?", "?", 1));
    let mut request = client
        .http
        .patch(url)
        .header("content-type", "application/merge-patch+json")
        .body(patch.to_string());
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request.send().await.unwrap()
}

/// The status behind `status_url` once `done` holds for it (read with waits).
async fn status_when(
    client: &Client,
    status_url: &str,
    what: &str,
    done: impl Fn(&StatusDocument) -> bool,
) -> StatusDocument {
    eventually(what, Duration::from_secs(60), || async {
        let url = format!("{status_url}&wait=5");
        let document: StatusDocument = client.status(&url).await.json().await.unwrap();
        done(&document).then_some(document)
    })
    .await
}

async fn scheduled(app: &TestApp, n: usize) -> (String, StatusDocument) {
    let accepted = app.client.post_delivery(&delivery_request(n)).await;
    let document = status_when(&app.client, &accepted.status_url, "Scheduled", |d| {
        d.state == DeliveryState::Scheduled
    })
    .await;
    (accepted.status_url, document)
}

fn expect_rescheduled(document: &StatusDocument) {
    assert_eq!(document.state, DeliveryState::Scheduled, "{document:?}");
    assert_eq!(document.revision, 1);
    assert_eq!(document.changes.len(), 1, "{:?}", document.changes);
    let change = &document.changes[0];
    assert_eq!(change.outcome, ChangeOutcome::Applied, "{change:?}");
    assert_eq!(change.revision, Some(1));
    assert_eq!(change.fields, ["pickupTime", "deadline", "dropoffLocation"]);
    let request = document.request.as_ref().unwrap();
    let pickup = time::OffsetDateTime::parse(
        "2030-01-01T11:00:00Z",
        &time::format_description::well_known::Rfc3339,
    )
    .unwrap();
    assert_eq!(request.pickup_time, pickup);
    assert_eq!(request.dropoff_location, "47.6205,-122.3493");
}

/// A Scheduled delivery rescheduled with `If-Match` and an `Idempotency-Key`
/// (sent twice): each booking updated once, a new revision; a stale
/// `If-Match` is a 412 and the key reused for another patch a 409.
async fn a_scheduled_delivery_is_rescheduled_once(app: &TestApp) {
    let (url, _) = scheduled(app, 1).await;
    let current = app.client.status(&url).await;
    let etag = current.headers()["etag"].to_str().unwrap().to_owned();
    let headers = [("if-match", etag.as_str()), ("idempotency-key", "move-1")];
    let first = patch(&app.client, &url, &later(), &headers).await;
    assert_eq!(first.status(), 202, "{}", first.text().await.unwrap());
    let retried = patch(
        &app.client,
        &url,
        &later(),
        &[("idempotency-key", "move-1")],
    )
    .await;
    assert_eq!(retried.status(), 202);
    let document = status_when(&app.client, &url, "revision 1", |d| d.revision == 1).await;
    expect_rescheduled(&document);
    let stale = patch(&app.client, &url, &later(), &[("if-match", etag.as_str())]).await;
    assert_eq!(stale.status(), 412);
    let reused = patch(
        &app.client,
        &url,
        &json!({"pickupLocation": "47.1,-122.1"}),
        &[("idempotency-key", "move-1")],
    )
    .await;
    assert_eq!(reused.status(), 409);
}

#[tokio::test]
async fn a_scheduled_delivery_has_its_bookings_updated_once_each() {
    let dir = tempfile::tempdir().unwrap();
    let app = TestApp::spawn(&dir).await;
    a_scheduled_delivery_is_rescheduled_once(&app).await;
    // Settled: the retried change was applied once.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stats = app.simulator().stats();
    assert_eq!(stats.delivery.updated, 1, "{:?}", stats.delivery);
    assert_eq!(stats.drone.updated, 1, "{:?}", stats.drone);
    assert_eq!(stats.package.updated, 0);
    app.app.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_kafka_and_cosmos_db_a_scheduled_delivery_is_rescheduled() {
    let broker = Broker::start(&["deliveries"], 2).await;
    let dir = tempfile::tempdir().unwrap();
    let mut settings = test_settings(dir.path());
    broker.configure(&mut settings, &["deliveries"]);
    // Neither stream nor store is embedded: the gateways share a receipt key.
    settings.gateway.receipt_keys = vec!["a-receipt-key-for-kafka-and-cosmos-db".into()];
    let app = TestApp::spawn_on_cosmos(settings).await;
    a_scheduled_delivery_is_rescheduled_once(&app).await;
    let stats = app.simulator().stats();
    assert_eq!((stats.delivery.updated, stats.drone.updated), (1, 1));
    app.app.stop().await.unwrap();
}

#[tokio::test]
async fn a_reschedule_read_before_its_request_runs_is_what_the_steps_book() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = test_settings(dir.path());
    // One event a second: the request waits for its slot, read, while the
    // reschedule is read behind it.
    settings.worker.rate_limit_per_s = 1;
    let app = TestApp::spawn_with(settings).await;
    for n in 0..3 {
        app.client.post_delivery(&delivery_request(n)).await;
    }
    let accepted = app.client.post_delivery(&delivery_request(3)).await;
    let response = patch(&app.client, &accepted.status_url, &later(), &[]).await;
    assert_eq!(response.status(), 202);
    let document = status_when(&app.client, &accepted.status_url, "Scheduled", |d| {
        d.state == DeliveryState::Scheduled
    })
    .await;
    expect_rescheduled(&document);
    let stats = app.simulator().stats();
    assert_eq!(
        (stats.delivery.updated, stats.drone.updated),
        (0, 0),
        "the bookings were made with the new values"
    );
    app.app.stop().await.unwrap();
}

#[tokio::test]
async fn a_reschedule_mid_workflow_updates_the_bookings_once_the_delivery_is_scheduled() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = test_settings(dir.path());
    settings.worker.processing_after_ms = Millis::new(0);
    settings.simulator.latency_ms = Millis::new(300);
    settings.simulator.jitter_ms = Millis::new(0);
    let app = TestApp::spawn_with(settings).await;
    let accepted = app.client.post_delivery(&delivery_request(1)).await;
    // Reads that do not wait: one that waits, sent once Processing is
    // written (late, on a busy machine), is held until the delivery is
    // terminal and never sees Processing.
    eventually("Processing", Duration::from_secs(60), || async {
        let document: StatusDocument = app
            .client
            .status(&accepted.status_url)
            .await
            .json()
            .await
            .unwrap();
        (document.state == DeliveryState::Processing).then_some(())
    })
    .await;
    let response = patch(&app.client, &accepted.status_url, &later(), &[]).await;
    assert_eq!(response.status(), 202);
    let document = status_when(&app.client, &accepted.status_url, "revision 1", |d| {
        d.revision == 1
    })
    .await;
    expect_rescheduled(&document);
    let stats = app.simulator().stats();
    assert_eq!((stats.delivery.updated, stats.drone.updated), (1, 1));
    app.app.stop().await.unwrap();
}

#[tokio::test]
async fn failed_and_cancelled_deliveries_are_not_rescheduled_and_a_bad_patch_is_a_422() {
    let dir = tempfile::tempdir().unwrap();
    let app = TestApp::spawn(&dir).await;
    app.simulator().set_behaviour(
        Step::Drone,
        Behaviour {
            rejected_ids: Arc::new(HashSet::from(["delivery-1".to_owned()])),
            ..Behaviour::default()
        },
    );
    let failed = app.client.post_delivery(&delivery_request(1)).await;
    status_when(&app.client, &failed.status_url, "Failed", |d| {
        d.state == DeliveryState::Failed
    })
    .await;
    let response = patch(&app.client, &failed.status_url, &later(), &[]).await;
    assert_eq!(response.status(), 409);
    let (cancelled, _) = scheduled(&app, 2).await;
    assert_eq!(app.client.cancel(&cancelled).await.status(), 202);
    status_when(&app.client, &cancelled, "Cancelled", |d| {
        d.state == DeliveryState::Cancelled
    })
    .await;
    assert_eq!(
        patch(&app.client, &cancelled, &later(), &[]).await.status(),
        409
    );

    let (url, _) = scheduled(&app, 3).await;
    for (body, field) in [
        (json!({"packageInfo": {"weight": 3.0}}), "packageInfo"),
        (json!({"pickupTime": null}), "pickupTime"),
        (json!({"pickupTime": "soon"}), "pickupTime"),
        (
            json!({"pickupTime": "2030-01-01T12:00:00Z", "deadline": "2030-01-01T11:00:00Z"}),
            "deadline",
        ),
        (json!({}), ""),
    ] {
        let response = patch(&app.client, &url, &body, &[]).await;
        assert_eq!(response.status(), 422, "{body}");
        let problem: Value = response.json().await.unwrap();
        let named: Vec<&str> = problem["errors"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["field"].as_str().unwrap())
            .collect();
        assert!(named.contains(&field), "{body}: {problem}");
    }
    // A deadline the request's own pickup time is not before: refused by the
    // worker, which holds the request, and recorded so.
    let response = patch(
        &app.client,
        &url,
        &json!({"deadline": "2030-01-01T09:00:00Z"}),
        &[],
    )
    .await;
    assert_eq!(response.status(), 202);
    let document = status_when(&app.client, &url, "the change decided", |d| {
        !d.changes.is_empty()
    })
    .await;
    assert_eq!(document.changes[0].outcome, ChangeOutcome::Refused);
    assert_eq!(document.revision, 0);
    app.app.stop().await.unwrap();
}

#[tokio::test]
async fn a_refused_update_keeps_the_previous_booking_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let app = TestApp::spawn(&dir).await;
    let (url, before) = scheduled(&app, 1).await;
    app.simulator().set_behaviour(
        Step::Drone,
        Behaviour {
            rejected_ids: Arc::new(HashSet::from(["delivery-1".to_owned()])),
            ..Behaviour::default()
        },
    );
    assert_eq!(patch(&app.client, &url, &later(), &[]).await.status(), 202);
    let document = status_when(&app.client, &url, "the change decided", |d| {
        !d.changes.is_empty()
    })
    .await;
    let change = &document.changes[0];
    assert_eq!(change.outcome, ChangeOutcome::Failed, "{change:?}");
    assert!(
        change.detail.as_deref().unwrap().contains("drone"),
        "{change:?}"
    );
    assert_eq!(document.state, DeliveryState::Scheduled);
    assert_eq!(document.revision, 0);
    assert_eq!(document.request, before.request, "the request stands");
    // Delivery was updated, then put back.
    assert_eq!(app.simulator().stats().delivery.updated, 2);
    app.app.stop().await.unwrap();
}

#[tokio::test]
async fn a_reschedule_racing_a_cancellation_leaves_nothing_booked() {
    let dir = tempfile::tempdir().unwrap();
    let app = TestApp::spawn(&dir).await;
    let (url, _) = scheduled(&app, 1).await;
    let body = later();
    let (patched, cancelled) = tokio::join!(
        patch(&app.client, &url, &body, &[]),
        app.client.cancel(&url)
    );
    assert_eq!(cancelled.status(), 202);
    let document = status_when(&app.client, &url, "Cancelled", |d| {
        d.state == DeliveryState::Cancelled
    })
    .await;
    if patched.status() == 202 {
        // The change is decided too, whichever came first.
        let document = status_when(&app.client, &url, "the change decided", |d| {
            !d.changes.is_empty()
        })
        .await;
        assert_eq!(document.state, DeliveryState::Cancelled);
        println!("the change: {:?}", document.changes[0]);
    } else {
        assert_eq!(patched.status(), 409);
        assert!(document.changes.is_empty());
    }
    let stats = app.simulator().stats();
    for service in [Step::Delivery, Step::Drone] {
        let counters = stats.get(service);
        assert_eq!(
            counters.created, counters.deleted,
            "{service:?}: {counters:?}"
        );
    }
    app.app.stop().await.unwrap();
}
