//! `POST` with `Prefer: wait=N`: the delivery's outcome in one request when
//! it comes within N, the usual 202 when it does not; held among the same
//! places as held status reads.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use serde_json::Value;
use skyport_runtime::config::Millis;
use skyport_tests::{Client, TestApp, delivery_request, metric_sum, test_settings};

async fn post_preferring(client: &Client, prefer: &str, request: &Value) -> reqwest::Response {
    client.post_with(&[("prefer", prefer)], request).await
}

/// Posts deliveries `numbers`, each preferring `prefer`, and gives them
/// 300 ms to take their places: their answers' statuses, to come.
async fn held_posts(
    client: &Client,
    numbers: std::ops::Range<usize>,
    prefer: &'static str,
) -> Vec<tokio::task::JoinHandle<reqwest::StatusCode>> {
    let posts = numbers
        .map(|n| {
            let client = client.clone();
            tokio::spawn(async move {
                post_preferring(&client, prefer, &delivery_request(n))
                    .await
                    .status()
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    posts
}

#[tokio::test]
async fn a_fast_delivery_is_answered_with_its_outcome_in_one_request() {
    let dir = tempfile::tempdir().unwrap();
    let app = TestApp::spawn(&dir).await;
    for (n, prefer) in [(0, "wait=10"), (1, "respond-async, wait=10")] {
        let response = post_preferring(&app.client, prefer, &delivery_request(n)).await;
        assert_eq!(response.status(), 200, "{prefer}");
        let headers = response.headers().clone();
        let answer: Value = response.json().await.unwrap();
        assert_eq!(answer["deliveryId"], format!("delivery-{n}"));
        assert_eq!(answer["status"], "Scheduled", "{answer}");
        let outcome = &answer["outcome"];
        assert_eq!(outcome["state"], "Scheduled");
        assert_eq!(outcome["terminal"], true);
        assert_eq!(outcome["status"], "Succeeded");
        let url = answer["statusUrl"].as_str().unwrap();
        assert_eq!(headers["location"], url);
        assert_eq!(outcome["links"]["self"], url);
        assert!(!headers.contains_key("operation-location"));
        assert!(!headers.contains_key("retry-after"));
        // The same status its URL answers.
        let read: Value = app.client.status(url).await.json().await.unwrap();
        assert_eq!(read, *outcome);
    }
    // A retry under the same name answers the outcome at once.
    let started = Instant::now();
    let again = post_preferring(&app.client, "wait=10", &delivery_request(0)).await;
    assert_eq!(again.status(), 200);
    assert!(started.elapsed() < Duration::from_secs(2));
    // The metrics are the test binary's, shared with the tests beside this one.
    let held = metric_sum(
        &app.client.base,
        "skyport_http_request_duration_seconds_count{route=\"/api/deliveryrequests\",method=\"POST\",class=\"held\"}",
    )
    .await;
    assert!(held >= 3.0, "held POSTs are timed apart from the 202s");
}

#[tokio::test]
async fn a_slow_delivery_is_answered_202_when_the_wait_ends_and_held_places_are_shared() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = test_settings(dir.path());
    // Five steps of 600 ms: three seconds to the outcome.
    settings.simulator.latency_ms = Millis::new(600);
    settings.simulator.jitter_ms = Millis::new(0);
    settings.gateway.max_waiting = 2;
    settings.gateway.max_waiting_per_client = 2;
    let app = TestApp::spawn_with(settings).await;

    let started = Instant::now();
    let response = post_preferring(&app.client, "wait=1", &delivery_request(0)).await;
    let took = started.elapsed();
    assert_eq!(response.status(), 202);
    assert!(
        (Duration::from_millis(950)..Duration::from_millis(2_500)).contains(&took),
        "{took:?}"
    );
    let accepted: Value = response.json().await.unwrap();
    assert_eq!(accepted["deliveryId"], "delivery-0");
    assert!(accepted.get("outcome").is_none());

    let lro = post_preferring(&app.client, "respond-async, wait=1", &delivery_request(1)).await;
    assert_eq!(lro.status(), 202);
    assert!(lro.headers().contains_key("operation-location"));
    assert_eq!(lro.headers()["preference-applied"], "respond-async");

    // Two held places: a third POST that asks to wait is answered at once,
    // as if it had not asked.
    let held = held_posts(&app.client, 10..12, "wait=5").await;
    let started = Instant::now();
    let third = post_preferring(&app.client, "wait=5", &delivery_request(12)).await;
    assert_eq!(third.status(), 202);
    assert!(started.elapsed() < Duration::from_millis(900));
    for held in held {
        assert_eq!(held.await.unwrap(), 200, "each ended within its wait");
    }
    // A status read finds no place while two POSTs wait either: naming the
    // current copy of a terminal delivery, it would be held 5 s.
    let url = accepted["statusUrl"].as_str().unwrap().to_owned();
    let done = app
        .client
        .wait_for_terminal(std::slice::from_ref(&url), Duration::from_secs(10))
        .await;
    let etag = app.client.status(&url).await.headers()["etag"].clone();
    let waiting = held_posts(&app.client, 20..22, "wait=2").await;
    let started = Instant::now();
    let read = app
        .client
        .http
        .get(&url)
        .header("prefer", "wait=5")
        .header("if-none-match", etag)
        .send()
        .await
        .unwrap();
    assert_eq!(read.status(), 304, "{:?}", done[0].state);
    assert!(started.elapsed() < Duration::from_millis(900));
    for waiting in waiting {
        assert_eq!(waiting.await.unwrap(), 202);
    }
}
