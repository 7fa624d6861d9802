//! `POST /api/deliveryrequests/batch`: each request answered on its own, in
//! order; only those answered 202 run; a retry of the whole batch under its
//! `Idempotency-Key` finds what it made.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use serde_json::{Value, json};
use skyport_tests::{Client, TestApp, delivery_request, metric_sum, test_settings};

/// Posts `body` as a batch, with `key` as its `Idempotency-Key` when given.
async fn post_batch(client: &Client, key: Option<&str>, body: impl ToString) -> reqwest::Response {
    let mut request = client
        .http
        .post(format!("{}/api/deliveryrequests/batch", client.base))
        .header("content-type", "application/json")
        .body(body.to_string());
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    request.send().await.unwrap()
}

/// The per-request results of a 200.
async fn results(response: reqwest::Response) -> Vec<Value> {
    assert_eq!(response.status(), 200);
    let answer: Value = response.json().await.unwrap();
    answer["results"].as_array().unwrap().clone()
}

fn codes(results: &[Value]) -> Vec<u64> {
    results
        .iter()
        .map(|result| result["status"].as_u64().unwrap())
        .collect()
}

#[tokio::test]
async fn a_mixed_batch_answers_each_request_in_order_and_runs_only_those_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = test_settings(dir.path());
    // With auth off a request is metered by its ownerId: "greedy" may make 2 at once.
    settings.gateway.quotas.default_per_s = Some(1);
    settings.gateway.quotas.burst = Some(2);
    let app = TestApp::spawn_with(settings).await;
    let taken = delivery_request(900);
    let first = app.client.post_delivery(&taken).await;

    let mut wrong_type = delivery_request(1);
    wrong_type["packageInfo"]["weight"] = json!("heavy");
    let mut taken_other_body = taken.clone();
    taken_other_body["dropoffLocation"] = json!("47.0000,-122.0000");
    let greedy = |n: usize| {
        let mut request = delivery_request(n);
        request["ownerId"] = json!("greedy");
        request
    };
    let mut unnamed = delivery_request(4);
    unnamed.as_object_mut().unwrap().remove("deliveryId");
    let body = json!({ "requests": [
        delivery_request(0),
        wrong_type,
        taken_other_body,
        delivery_request(0),
        unnamed,
        greedy(10),
        greedy(11),
        greedy(12),
        json!("not an object"),
        json!({ "deliveryId": "batch" }),
    ]});
    let published = app.published();
    let results = results(post_batch(&app.client, None, &body).await).await;
    assert_eq!(results.len(), 10);
    let statuses = codes(&results);
    assert_eq!(statuses[0], 202, "{results:?}");
    assert_eq!(statuses[1], 422);
    assert_eq!(
        results[1]["problem"]["errors"][0]["field"],
        "packageInfo.weight"
    );
    assert_eq!(statuses[2], 409, "the deliveryId is taken by another body");
    assert_eq!(statuses[3], 409, "named twice in the batch");
    assert!(
        results[3]["problem"]["detail"]
            .as_str()
            .unwrap()
            .contains("request 0")
    );
    assert_eq!(statuses[4], 202);
    assert!(
        results[4]["accepted"]["deliveryId"]
            .as_str()
            .unwrap()
            .starts_with("sp-")
    );
    let greedy_codes = &statuses[5..8];
    assert_eq!(greedy_codes.iter().filter(|c| **c == 202).count(), 2);
    assert_eq!(greedy_codes.iter().filter(|c| **c == 429).count(), 1);
    assert_eq!(statuses[8], 422);
    assert_eq!(statuses[9], 422);
    for result in &results {
        let accepted = result["status"] == 202;
        assert_eq!(result["accepted"].is_object(), accepted, "{result}");
        assert_eq!(result["problem"].is_object(), !accepted, "{result}");
        if !accepted {
            assert_eq!(result["problem"]["status"], result["status"]);
        }
    }

    let mut accepted: Vec<String> = results
        .iter()
        .filter(|result| result["status"] == 202)
        .map(|result| result["accepted"]["statusUrl"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(accepted.len(), 4);
    assert_eq!(
        app.published() - published,
        4,
        "only the accepted were published"
    );
    accepted.push(first.status_url);
    app.expect_all_scheduled_once(&accepted, Duration::from_secs(30))
        .await;
    // The refused requests made nothing under their names.
    let store = app.embedded();
    let stored = |id: String| {
        let store = std::sync::Arc::clone(&store);
        async move {
            skyport_core::ports::StatusStore::get(store.as_ref(), &id)
                .await
                .unwrap()
        }
    };
    assert!(stored("delivery-1".into()).await.is_none());
    let greedy_refused = results[5..8]
        .iter()
        .zip(10..)
        .find(|(result, _)| result["status"] == 429)
        .map(|(_, n)| format!("delivery-{n}"))
        .unwrap();
    assert!(
        stored(greedy_refused.clone()).await.is_none(),
        "{greedy_refused} was over its quota and must not run"
    );
    // The metrics are the test binary's, shared with the tests beside this one.
    assert!(
        metric_sum(
            &app.client.base,
            "skyport_deliveries_accepted_total{via=\"batch\"}"
        )
        .await
            >= 4.0
    );
}

#[tokio::test]
async fn a_batch_retried_under_its_key_finds_what_it_made_and_another_body_is_a_conflict() {
    let dir = tempfile::tempdir().unwrap();
    let app = TestApp::spawn(&dir).await;
    let unnamed = |n: usize| {
        let mut request = delivery_request(n);
        request.as_object_mut().unwrap().remove("deliveryId");
        request
    };
    let body = json!({ "requests": (0..20).map(unnamed).collect::<Vec<_>>() });
    let first = results(post_batch(&app.client, Some("close-of-day-1"), &body).await).await;
    assert!(codes(&first).iter().all(|code| *code == 202), "{first:?}");
    let urls: Vec<String> = first
        .iter()
        .map(|result| result["accepted"]["statusUrl"].as_str().unwrap().to_owned())
        .collect();
    app.expect_all_scheduled_once(&urls, Duration::from_secs(30))
        .await;
    let published = app.published();

    let retried = results(post_batch(&app.client, Some("close-of-day-1"), &body).await).await;
    for (then, now) in first.iter().zip(&retried) {
        assert_eq!(now["status"], 202);
        assert_eq!(
            now["accepted"]["deliveryId"],
            then["accepted"]["deliveryId"]
        );
        assert_eq!(now["accepted"]["receipt"], then["accepted"]["receipt"]);
        assert_eq!(now["accepted"]["status"], "Scheduled");
    }
    assert_eq!(app.published(), published, "a retry publishes nothing");

    let other = json!({ "requests": (0..19).map(unnamed).collect::<Vec<_>>() });
    let conflict = post_batch(&app.client, Some("close-of-day-1"), &other).await;
    assert_eq!(conflict.status(), 409);
    let problem: Value = conflict.json().await.unwrap();
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("close-of-day-1")
    );
    // A named request of a batch is named by its deliveryId alone: a POST of
    // it on its own is its retry, whatever key the batch had.
    let named = json!({ "requests": [delivery_request(50)] });
    let in_batch = results(post_batch(&app.client, Some("close-of-day-2"), &named).await).await;
    let alone = app.client.post_delivery(&delivery_request(50)).await;
    assert_eq!(in_batch[0]["accepted"]["deliveryId"], alone.delivery_id);
    let published = app.published();
    // The key of a batch is not the key of a POST: the two never meet.
    let response = app
        .client
        .post_with(&[("idempotency-key", "close-of-day-1")], &unnamed(0))
        .await;
    assert_eq!(response.status(), 202);
    assert_eq!(app.published(), published + 1);
}

#[tokio::test]
async fn a_batch_is_refused_whole_only_when_it_is_malformed_empty_or_too_large() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = test_settings(dir.path());
    settings.gateway.max_batch = 50;
    let app = TestApp::spawn_with(settings).await;
    let requests =
        |count: usize| json!({ "requests": (0..count).map(delivery_request).collect::<Vec<_>>() });
    for body in [
        json!({ "requests": [] }),
        requests(51),
        json!([delivery_request(0)]),
        json!({ "requests": [], "more": 1 }),
    ] {
        let response = post_batch(&app.client, None, &body).await;
        assert_eq!(response.status(), 422, "{body}");
        assert_eq!(
            response.headers()["content-type"],
            "application/problem+json"
        );
        let problem: Value = response.json().await.unwrap();
        assert_eq!(problem["code"], "ValidationFailed");
    }
    let malformed = post_batch(&app.client, None, r#"{"requests": [{"#).await;
    assert_eq!(malformed.status(), 400);

    // 50 requests spaced out: far above a POST's 64 KiB, within the batch's 1 MiB.
    let spaced = format!(
        r#"{{"requests": [{}]}}"#,
        (0..50)
            .map(|n| delivery_request(n).to_string())
            .collect::<Vec<_>>()
            .join(&format!(",{}", " ".repeat(2000)))
    );
    assert!(spaced.len() > 64 * 1024);
    let results = results(post_batch(&app.client, None, &spaced).await).await;
    assert_eq!(codes(&results), vec![202; 50]);
    // Compressed, a batch is held to its limit once decoded.
    let gzip = |text: &str| {
        use std::io::Write as _;
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        encoder.write_all(text.as_bytes()).unwrap();
        encoder.finish().unwrap()
    };
    let post_gzip = |body: Vec<u8>| {
        app.client
            .http
            .post(format!("{}/api/deliveryrequests/batch", app.client.base))
            .header("content-type", "application/json")
            .header("content-encoding", "gzip")
            .body(body)
            .send()
    };
    let compressed = post_gzip(gzip(
        &spaced
            .replace("delivery-", "gzip-delivery-")
            .replace("package-", "gzip-package-"),
    ))
    .await
    .unwrap();
    assert_eq!(compressed.status(), 200);
    let bomb = format!(
        r#"{{"requests": [{}{}]}}"#,
        delivery_request(0),
        " ".repeat(2 * 1024 * 1024)
    );
    let bomb = post_gzip(gzip(&bomb)).await.unwrap();
    assert_eq!(bomb.status(), 413);
    let mut huge = requests(1);
    huge["requests"][0]["pickupLocation"] = json!("x".repeat(1024 * 1024));
    let too_large = post_batch(&app.client, None, &huge).await;
    assert_eq!(too_large.status(), 413);
    // A POST keeps its own limit.
    let post = app
        .client
        .post_raw("application/json", huge["requests"][0].to_string())
        .await;
    assert_eq!(post.status(), 413);
}

#[tokio::test]
async fn no_delivery_may_be_named_batch() {
    let dir = tempfile::tempdir().unwrap();
    let app = TestApp::spawn(&dir).await;
    let mut request = delivery_request(0);
    request["deliveryId"] = json!("batch");
    let response = app
        .client
        .post_raw("application/json", request.to_string())
        .await;
    assert_eq!(response.status(), 422);
    let problem: Value = response.json().await.unwrap();
    assert_eq!(problem["errors"][0]["field"], "deliveryId");
}

/// With no embedded store to keep one, the gateway's receipt key is configured.
const RECEIPT_KEY: &str = "a-receipt-key-for-the-batch-tests-0123";

/// A batch, its retry, and a POST that waits for its outcome, on `app`:
/// every delivery Scheduled once.
async fn batch_retry_and_wait(app: &TestApp) {
    let body = json!({ "requests": (0..40).map(delivery_request).collect::<Vec<_>>() });
    let first = results(post_batch(&app.client, Some("backends-1"), &body).await).await;
    assert_eq!(codes(&first), vec![202; 40], "{first:?}");
    let retried = results(post_batch(&app.client, Some("backends-1"), &body).await).await;
    for (then, now) in first.iter().zip(&retried) {
        assert_eq!(now["accepted"]["receipt"], then["accepted"]["receipt"]);
    }
    let mut urls: Vec<String> = first
        .iter()
        .map(|result| result["accepted"]["statusUrl"].as_str().unwrap().to_owned())
        .collect();
    // Once the worker reads (on Kafka, after the group's first rebalance),
    // a POST that waits gets its outcome.
    app.client
        .wait_for_terminal(&urls, Duration::from_secs(60))
        .await;
    let waited = app
        .client
        .post_with(&[("prefer", "wait=10")], &delivery_request(100))
        .await;
    assert_eq!(waited.status(), 200);
    let waited: Value = waited.json().await.unwrap();
    assert_eq!(waited["outcome"]["state"], "Scheduled");
    urls.push(waited["statusUrl"].as_str().unwrap().to_owned());
    app.expect_all_scheduled_once(&urls, Duration::from_secs(60))
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_and_waits_work_on_cosmos_db_with_kafka() {
    let broker = skyport_tests::kafka::Broker::start(&["deliveries"], 4).await;
    let dir = tempfile::tempdir().unwrap();
    let mut settings = test_settings(dir.path());
    broker.configure(&mut settings, &["deliveries"]);
    settings.gateway.receipt_keys = vec![RECEIPT_KEY.into()];
    let app = TestApp::spawn_on_cosmos(settings).await;
    batch_retry_and_wait(&app).await;
    app.app.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_and_waits_work_on_cosmos_db_with_event_hubs() {
    let broker = skyport_tests::eventhubs_broker::EventHubsBroker::start(&[("d-0", 4)])
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut settings = crate::eventhubs::settings_on(&broker, &dir, &["d-0"]);
    settings.gateway.receipt_keys = vec![RECEIPT_KEY.into()];
    let app = TestApp::spawn_on_cosmos(settings).await;
    batch_retry_and_wait(&app).await;
    app.app.stop().await.unwrap();
    broker.stop().await;
}

#[tokio::test]
async fn another_tenant_gets_nothing_of_a_batch_by_its_key_its_ids_or_a_wait() {
    const ALICE: &str = "alice-key-0123456789abcdef0123456789ab";
    const BOB: &str = "bob-key-0123456789abcdef0123456789abcd";
    let dir = tempfile::tempdir().unwrap();
    let mut settings = test_settings(dir.path());
    let scopes = [
        skyport_runtime::config::Scope::Read,
        skyport_runtime::config::Scope::Write,
    ];
    skyport_tests::with_api_keys(
        &mut settings,
        &[("alice", ALICE, &scopes), ("bob", BOB, &scopes)],
    );
    let app = TestApp::spawn_with(settings).await;
    let alice = app.client.with_header("x-api-key", ALICE);
    let bob = app.client.with_header("x-api-key", BOB);
    let mut unnamed = delivery_request(1);
    unnamed.as_object_mut().unwrap().remove("deliveryId");
    let body = json!({ "requests": [delivery_request(0), unnamed] });
    let hers = results(post_batch(&alice, Some("day-1"), &body).await).await;
    assert_eq!(codes(&hers), vec![202, 202]);
    let hers_done = alice
        .wait_for_terminal(
            &hers
                .iter()
                .map(|r| r["accepted"]["statusUrl"].as_str().unwrap().to_owned())
                .collect::<Vec<_>>(),
            Duration::from_secs(30),
        )
        .await;

    // Bob repeats her key and body: her named delivery is taken, answered as
    // any taken name is; the unnamed one is a delivery of his own.
    let his = results(post_batch(&bob, Some("day-1"), &body).await).await;
    assert_eq!(codes(&his), vec![409, 202]);
    let detail = his[0]["problem"]["detail"].as_str().unwrap();
    assert!(!detail.contains("alice"), "{detail}");
    assert_ne!(
        his[1]["accepted"]["deliveryId"],
        hers[1]["accepted"]["deliveryId"]
    );
    assert_ne!(
        his[1]["accepted"]["receipt"],
        hers[1]["accepted"]["receipt"]
    );

    // A POST of her id that asks to wait learns nothing of her outcome.
    let started = std::time::Instant::now();
    let waited = bob
        .post_with(&[("prefer", "wait=5")], &delivery_request(0))
        .await;
    assert_eq!(waited.status(), 409);
    assert!(started.elapsed() < Duration::from_secs(2));
    let problem: Value = waited.json().await.unwrap();
    assert!(problem.get("outcome").is_none());

    // Her deliveries are as they were.
    for (result, before) in hers.iter().zip(&hers_done) {
        let now: skyport_core::status::StatusDocument = alice
            .status(result["accepted"]["statusUrl"].as_str().unwrap())
            .await
            .json()
            .await
            .unwrap();
        assert_eq!(now.updated_at, before.updated_at);
        assert_eq!(now.attempt, before.attempt);
    }
}
