//! Safe retries over real HTTP: a client-chosen `deliveryId` or an
//! `Idempotency-Key` makes a retried POST return the same delivery and status
//! URL, runs the delivery once, and a different body under the same name is a
//! 409 problem.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use serde_json::Value;
use skyport_core::status::DeliveryState;
use skyport_gateway::routes::deliveries::resources::Accepted;
use skyport_tests::{Client, TestApp, delivery_request};

async fn post_with_key(client: &Client, key: &str, body: &Value) -> reqwest::Response {
    client
        .http
        .post(format!("{}/api/deliveryrequests", client.base))
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .body(body.to_string())
        .send()
        .await
        .unwrap()
}

async fn conflict(response: reqwest::Response, what: &str) -> Value {
    assert_eq!(response.status(), 409, "{what}");
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json",
        "{what}"
    );
    let problem: Value = response.json().await.unwrap();
    assert_eq!(problem["code"], "Conflict", "{what}: {problem}");
    problem
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_delivery_id_returns_the_same_delivery_and_runs_it_once() {
    let dir = tempfile::tempdir().unwrap();
    let app = TestApp::spawn(&dir).await;
    let request = delivery_request(1);
    let first = app.client.post_delivery(&request).await;
    let again = app.client.post_delivery(&request).await;
    assert_eq!(again.delivery_id, first.delivery_id);
    assert_eq!(again.status_url, first.status_url);
    app.client
        .wait_for_state(
            &first.status_url,
            DeliveryState::Scheduled,
            Duration::from_secs(30),
        )
        .await;
    // A retry after the delivery is scheduled says so, and publishes nothing.
    let late = app.client.post_delivery(&request).await;
    assert_eq!(late.status_url, first.status_url);
    assert_eq!(late.status, DeliveryState::Scheduled);

    let mut changed = request.clone();
    changed["packageInfo"]["weight"] = 3.0.into();
    let problem = conflict(
        app.client
            .post_raw("application/json", changed.to_string())
            .await,
        "the same deliveryId with another body",
    )
    .await;
    assert!(
        problem["detail"].as_str().unwrap().contains("delivery-1"),
        "{problem}"
    );
    let stats = app.simulator().stats();
    assert_eq!(stats.drone.created, 1, "one drone booking: {stats:?}");
    assert_eq!(stats.package.created, 1, "one package: {stats:?}");
    app.app.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotency_key_names_one_delivery_even_when_retries_race() {
    let dir = tempfile::tempdir().unwrap();
    let app = TestApp::spawn(&dir).await;
    let mut request = delivery_request(2);
    request.as_object_mut().unwrap().remove("deliveryId");
    let mut racers = tokio::task::JoinSet::new();
    for _ in 0..16 {
        let client = app.client.clone();
        let request = request.clone();
        racers.spawn(async move {
            let response = post_with_key(&client, "order-2-attempt", &request).await;
            assert_eq!(response.status(), 202);
            response.json::<Accepted>().await.unwrap()
        });
    }
    let answers = racers.join_all().await;
    let first = &answers[0];
    assert!(first.delivery_id.starts_with("k-"), "{}", first.delivery_id);
    for answer in &answers {
        assert_eq!(answer.delivery_id, first.delivery_id);
        assert_eq!(answer.status_url, first.status_url);
    }
    app.client
        .wait_for_state(
            &first.status_url,
            DeliveryState::Scheduled,
            Duration::from_secs(30),
        )
        .await;
    // Another key is another delivery; the same key with another body is a conflict.
    let other = post_with_key(&app.client, "order-2-other", &request).await;
    assert_eq!(other.status(), 202);
    let other: Accepted = other.json().await.unwrap();
    assert_ne!(other.delivery_id, first.delivery_id);
    let mut changed = request.clone();
    changed["dropoffLocation"] = "somewhere else".into();
    conflict(
        post_with_key(&app.client, "order-2-attempt", &changed).await,
        "the same Idempotency-Key with another body",
    )
    .await;
    let stats = app.simulator().stats();
    assert_eq!(
        stats.drone.created, 1,
        "16 racing retries book one drone: {stats:?}"
    );
    app.app.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_a_restart_still_finds_its_delivery() {
    let dir = tempfile::tempdir().unwrap();
    let app = TestApp::spawn(&dir).await;
    let mut request = delivery_request(3);
    request.as_object_mut().unwrap().remove("deliveryId");
    let first: Accepted = post_with_key(&app.client, "restart-key", &request)
        .await
        .json()
        .await
        .unwrap();
    let app = app.restart().await;
    let again: Accepted = post_with_key(&app.client, "restart-key", &request)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(again.delivery_id, first.delivery_id);
    let path = |url: &str| url.split_once("/api/").unwrap().1.to_owned();
    assert_eq!(path(&again.status_url), path(&first.status_url));
    app.app.stop().await.unwrap();
}

#[tokio::test]
async fn a_malformed_idempotency_key_is_a_400_problem() {
    let dir = tempfile::tempdir().unwrap();
    let app = TestApp::spawn(&dir).await;
    for key in [String::new(), "x".repeat(256), "with space".into()] {
        let response = post_with_key(&app.client, &key, &delivery_request(4)).await;
        assert_eq!(response.status(), 400, "key {key:?}");
        assert_eq!(
            response.headers()["content-type"],
            "application/problem+json"
        );
    }
    app.app.stop().await.unwrap();
}

/// A body shaped as the reference implementation's Java clients send it
/// (Jackson's default serialization of its `ExternalDelivery`:
/// `dropOffLocation`, `pickupTime` in epoch milliseconds, `null` for the
/// absent `deliveryId` and `tag`, no `expedited`) is accepted and runs to
/// Scheduled; Skyport's own spelling of the same request, retried under the
/// same `Idempotency-Key`, is the same delivery, not a conflict.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reference_implementations_body_is_the_same_delivery_as_skyports_spelling() {
    let dir = tempfile::tempdir().unwrap();
    let app = TestApp::spawn(&dir).await;
    let reference = serde_json::json!({
        "deliveryId": null,
        "ownerId": "owner-java",
        "pickupLocation": "47.6423,-122.1368",
        "dropOffLocation": "47.6101,-122.2015",
        "pickupTime": 1_893_492_000_000_i64,
        "deadline": "2030-01-01T12:00:00Z",
        "confirmationRequired": "None",
        "packageInfo": {"packageId": "package-java", "size": "Medium", "weight": 4.0, "tag": null}
    });
    let first = post_with_key(&app.client, "java-1", &reference).await;
    assert_eq!(first.status(), 202);
    let first: Accepted = first.json().await.unwrap();
    let own = serde_json::json!({
        "ownerId": "owner-java",
        "pickupLocation": "47.6423,-122.1368",
        "dropoffLocation": "47.6101,-122.2015",
        "pickupTime": "2030-01-01T10:00:00Z",
        "deadline": "2030-01-01T12:00:00Z",
        "expedited": false,
        "packageInfo": {"packageId": "package-java", "size": "Medium", "weight": 4.0}
    });
    let again = post_with_key(&app.client, "java-1", &own).await;
    assert_eq!(again.status(), 202, "{}", again.text().await.unwrap());
    let again: Accepted = again.json().await.unwrap();
    assert_eq!(again.delivery_id, first.delivery_id);
    let documents = app
        .client
        .wait_for_terminal(&[first.status_url], Duration::from_secs(60))
        .await;
    assert_eq!(documents[0].state, DeliveryState::Scheduled);
    app.app.stop().await.unwrap();
}
