//! Retention on the embedded store, with a window of seconds: settled
//! deliveries go with their change records and answer 410 Gone, open ones
//! and young receipts stay, a Scheduled delivery stays (readable,
//! reschedulable, cancellable) until the window after its deadline, the
//! change-feed processor goes on, and the database file stops growing once
//! the window is full.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use serde_json::{Value, json};
use skyport_core::ports::Lane;
use skyport_core::ports::{ChangeSource, FeedRange, StartFrom};
use skyport_core::status::{DeliveryState, Step};
use skyport_gateway::receipt::Receipts;
use skyport_runtime::config::{Millis, Seconds, Settings};
use skyport_simulator::Behaviour;
use skyport_tests::{Client, TestApp, delivery_request, eventually, metric_sum, test_settings};
use time::OffsetDateTime;
use tokio::task::JoinSet;

const WAIT: Duration = Duration::from_secs(30);

/// Settled deliveries are kept `window_s`; a receipt with no document is
/// gone one second after that.
fn short_windows(dir: &std::path::Path, window_s: u64) -> Settings {
    let mut settings = test_settings(dir);
    settings.gateway.idempotency_retention_s = Seconds::new(window_s);
    settings.store.status_retention_s = Seconds::new(window_s);
    settings.store.dead_letter_retention_s = Seconds::new(window_s);
    settings.worker.allow_backlog_to_ms = Millis::new(1_000);
    settings.embedded.sweep_interval_ms = Millis::new(200);
    settings
}

/// Delivery request `n`, picked up and due in 2020: once Scheduled it is
/// settled (its deadline has passed).
fn past_request(n: usize) -> Value {
    let mut request = delivery_request(n);
    request["pickupTime"] = json!("2020-01-01T10:00:00Z");
    request["deadline"] = json!("2020-01-01T12:00:00Z");
    request
}

/// Posts `past_request(n)` for every `n` in `numbers`; answers their status URLs.
async fn post_past(client: &Client, numbers: std::ops::Range<usize>) -> Vec<String> {
    let mut posts = JoinSet::new();
    for n in numbers {
        let client = client.clone();
        posts.spawn(async move { client.post_delivery(&past_request(n)).await.status_url });
    }
    posts.join_all().await
}

#[tokio::test]
async fn settled_deliveries_go_after_their_window_and_their_status_url_answers_410() {
    let dir = tempfile::tempdir().unwrap();
    let app = TestApp::spawn_with(short_windows(dir.path(), 2)).await;
    let urls = post_past(&app.client, 0..20).await;
    app.client.wait_for_terminal(&urls, WAIT).await;
    // One delivery stays open: its drone takes longer than the test looks.
    app.simulator().set_behaviour(
        Step::Drone,
        Behaviour {
            latency: Duration::from_secs(20),
            ..Behaviour::default()
        },
    );
    let open = app.client.post_delivery(&delivery_request(1_000)).await;
    app.client
        .wait_for_state(&open.status_url, DeliveryState::Processing, WAIT)
        .await;

    // Each settled at its own terminal write: the last goes last.
    eventually("the settled deliveries are gone", WAIT, || async {
        for url in &urls {
            if app.client.status(url).await.status() != 410 {
                return None;
            }
        }
        Some(())
    })
    .await;
    for url in &urls {
        let response = app.client.status(url).await;
        assert_eq!(response.status(), 410, "{url}");
        assert_eq!(
            response.headers()["content-type"],
            "application/problem+json"
        );
        let problem: Value = response.json().await.unwrap();
        assert!(
            problem["detail"]
                .as_str()
                .unwrap()
                .contains("store.status_retention_s"),
            "{problem}"
        );
    }
    assert_eq!(app.client.cancel(&urls[0]).await.status(), 410);
    let response = app.client.status(&open.status_url).await;
    assert_eq!(response.status(), 200, "an open delivery is never removed");

    // The change records went with the documents: the feed holds the open one.
    let store = app.embedded();
    let page = store
        .read(&FeedRange::full(), None, StartFrom::Beginning, 1_000)
        .await
        .unwrap();
    let ids: Vec<&str> = page.changes.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(ids, [open.delivery_id.as_str()]);

    // A receipt with no document yet is Accepted while young, gone once old.
    let receipts = Receipts::new(&[store.receipt_key()]);
    let young = receipts.sign("queued", OffsetDateTime::now_utc(), Lane::Normal, None);
    let response = app
        .client
        .status(&format!(
            "/api/deliveryrequests/queued/status?receipt={young}"
        ))
        .await;
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["state"], "Accepted");
    let old = receipts.sign(
        "queued",
        OffsetDateTime::now_utc() - Duration::from_secs(4),
        Lane::Normal,
        None,
    );
    let response = app
        .client
        .status(&format!(
            "/api/deliveryrequests/queued/status?receipt={old}"
        ))
        .await;
    assert_eq!(response.status(), 410);

    let removed = metric_sum(
        &app.client.base,
        "skyport_retention_removed_total{kind=\"status\"}",
    )
    .await;
    assert!(removed >= 20.0, "{removed}");

    // The change-feed processor goes on: a delivery after the sweeps is announced.
    app.simulator()
        .set_behaviour(Step::Drone, Behaviour::default());
    app.client
        .wait_for_state(&open.status_url, DeliveryState::Scheduled, WAIT)
        .await;
    app.app.stop().await.unwrap();
}

#[tokio::test]
async fn a_scheduled_delivery_stays_until_the_window_after_its_deadline_and_can_still_change() {
    let dir = tempfile::tempdir().unwrap();
    let app = TestApp::spawn_with(short_windows(dir.path(), 2)).await;
    // Picked up in 2030, far beyond the two seconds' window.
    let mut far = Vec::new();
    for n in 0..3 {
        let accepted = app.client.post_delivery(&delivery_request(n)).await;
        app.client
            .wait_for_state(&accepted.status_url, DeliveryState::Scheduled, WAIT)
            .await;
        far.push(accepted.status_url);
    }
    // Due in 2020: it goes after the window, so the sweeper has run past the others.
    let past = post_past(&app.client, 100..101).await.remove(0);
    eventually("the delivery due in 2020 is gone", WAIT, || async {
        (app.client.status(&past).await.status() == 410).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    for url in &far {
        let response = app.client.status(url).await;
        assert_eq!(response.status(), 200, "{url}");
        let document: Value = response.json().await.unwrap();
        assert_eq!(document["state"], "Scheduled", "{document}");
    }
    // Rescheduled: an hour later, the bookings updated.
    let path = &far[1][far[1].find("/api/").unwrap()..];
    let response = app
        .client
        .http
        .patch(format!(
            "{}{}",
            app.client.base,
            path.replacen("/status?", "?", 1)
        ))
        .header("content-type", "application/merge-patch+json")
        .body(
            json!({"pickupTime": "2030-01-01T11:00:00Z", "deadline": "2030-01-01T13:00:00Z"})
                .to_string(),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 202);
    eventually("the reschedule is applied", WAIT, || async {
        let document: Value = app.client.status(&far[1]).await.json().await.unwrap();
        (document["revision"] == 1).then_some(())
    })
    .await;
    // Cancelled: compensated, and then settled like any Cancelled delivery.
    assert_eq!(app.client.cancel(&far[2]).await.status(), 202);
    app.client
        .wait_for_state(&far[2], DeliveryState::Cancelled, WAIT)
        .await;
    eventually(
        "the cancelled delivery goes after its window",
        WAIT,
        || async { (app.client.status(&far[2]).await.status() == 410).then_some(()) },
    )
    .await;
    for url in &far[..2] {
        assert_eq!(app.client.status(url).await.status(), 200, "{url}");
    }
    app.app.stop().await.unwrap();
}

#[tokio::test]
async fn the_database_file_stops_growing_once_the_window_is_full() {
    const WINDOW_S: u64 = 3;
    const RATE_PER_S: usize = 100;
    let dir = tempfile::tempdir().unwrap();
    let app = TestApp::spawn_with(short_windows(dir.path(), WINDOW_S)).await;
    let file = dir.path().join("skyport.redb");
    let size = || std::fs::metadata(&file).unwrap().len();
    let mut sizes = Vec::new();
    let started = tokio::time::Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(1_000 / RATE_PER_S as u64));
    let mut n = 0;
    let mut posts = tokio::task::JoinSet::new();
    // The window fills for WINDOW_S + 7 s, then the size is read every 10 s for 60 s.
    let fill = Duration::from_secs(WINDOW_S + 7);
    let mut next_reading = started + fill;
    while sizes.len() < 7 {
        tick.tick().await;
        let client = app.client.clone();
        posts.spawn(async move { client.post_delivery(&past_request(n)).await });
        n += 1;
        if tokio::time::Instant::now() >= next_reading {
            let reading = size();
            println!(
                "{:>3} s: {n} deliveries posted, skyport.redb {} KiB",
                started.elapsed().as_secs(),
                reading / 1024
            );
            sizes.push(reading);
            next_reading += Duration::from_secs(10);
        }
    }
    posts.join_all().await;
    let first = sizes[0];
    let largest = *sizes.iter().max().unwrap();
    assert!(
        largest <= first + first / 4,
        "the file grew from {first} to {largest} bytes under a steady load: {sizes:?}"
    );
    app.app.stop().await.unwrap();
}
