//! Status reads that wait for a change (`Prefer: wait=N`, `?wait=N`): woken
//! by the status write, apart from the in-flight limit, bounded by
//! `gateway.max_waiting`.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use skyport_core::ports::Lane;
use skyport_core::status::{DeliveryState, StatusDocument};
use skyport_gateway::receipt::Receipts;
use skyport_runtime::config::Millis;
use skyport_tests::{Client, TestApp, delivery_request, test_settings};
use time::OffsetDateTime;
use tokio::task::JoinSet;

/// A held read of `status_url`, naming `etag` as the client's copy when given.
async fn held_read(
    client: &Client,
    status_url: &str,
    wait: &str,
    etag: Option<&str>,
) -> reqwest::Response {
    let url = format!(
        "{}{}",
        client.base,
        &status_url[status_url.find("/api/").unwrap()..]
    );
    let mut request = client.http.get(url).header("prefer", wait);
    if let Some(etag) = etag {
        request = request.header("if-none-match", etag);
    }
    request.send().await.unwrap()
}

/// The status URL of a delivery this gateway signed a receipt for but that
/// was never posted: it stays Accepted for as long as a test runs.
fn never_written(app: &TestApp, id: &str) -> String {
    let receipt = Receipts::new(&app.app.backends.ports.receipt_keys).sign(
        id,
        OffsetDateTime::now_utc(),
        Lane::Normal,
        None,
    );
    reqwest::Url::parse_with_params(
        &format!("{}/api/deliveryrequests/{id}/status", app.client.base),
        &[("receipt", receipt)],
    )
    .unwrap()
    .to_string()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((sorted.len() as f64) * p).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Reads `status_url` with waits until it is terminal: the number of reads
/// and how long after the terminal write the last answer came.
async fn read_until_terminal(client: &Client, status_url: &str) -> (usize, Duration) {
    let mut etag: Option<String> = None;
    for reads in 1..=5 {
        let response = held_read(client, status_url, "wait=10", etag.as_deref()).await;
        let answered = OffsetDateTime::now_utc();
        assert_eq!(response.status(), 200);
        etag = Some(response.headers()["etag"].to_str().unwrap().to_owned());
        let document: StatusDocument = response.json().await.unwrap();
        if document.state.is_terminal() {
            let after = (answered - document.updated_at).max(time::Duration::ZERO);
            return (reads, after.try_into().unwrap());
        }
    }
    panic!("{status_url} was not terminal after 5 held reads");
}

#[tokio::test]
async fn held_reads_reach_the_terminal_status_in_at_most_two_requests_woken_by_its_write() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = test_settings(dir.path());
    // Every delivery is marked Processing before its first step, so that a
    // read arriving before that is woken by it, and reads again.
    settings.worker.processing_after_ms = Millis::new(0);
    settings.simulator.latency_ms = Millis::new(10);
    // One client (one address, auth off) holds them all.
    settings.gateway.max_waiting_per_client = 1000;
    let app = TestApp::spawn_with(settings).await;
    let mut reads = JoinSet::new();
    for n in 0..1000 {
        let client = app.client.clone();
        let accepted = client.post_delivery(&delivery_request(n)).await;
        reads.spawn(async move { read_until_terminal(&client, &accepted.status_url).await });
    }
    let answers = reads.join_all().await;
    let most = answers.iter().map(|(reads, _)| *reads).max().unwrap();
    let twice = answers.iter().filter(|(reads, _)| *reads == 2).count();
    let mut after: Vec<Duration> = answers.iter().map(|(_, after)| *after).collect();
    after.sort();
    let (p50, p99) = (percentile(&after, 0.5), percentile(&after, 0.99));
    println!(
        "1,000 deliveries read with wait=10: {twice} took two reads, the rest one; \
         terminal write to answer p50 {p50:?}, p99 {p99:?}, max {:?}",
        after.last().unwrap()
    );
    assert!(most <= 2, "a delivery took {most} held reads");
    // Woken by the write, not by a poll: far under any poll interval even on
    // a busy machine (the bench prints the real figure).
    assert!(p99 < Duration::from_secs(1), "p99 {p99:?}");
    app.app.stop().await.unwrap();
}

#[tokio::test]
async fn a_held_read_answers_when_its_wait_ends_and_takes_no_place_among_those_in_flight() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = test_settings(dir.path());
    settings.gateway.max_in_flight = 2;
    settings.gateway.max_waiting = 40;
    let app = TestApp::spawn_with(settings).await;
    let url = never_written(&app, "held-forever");
    let first = app.client.status(&url).await;
    let etag = first.headers()["etag"].to_str().unwrap().to_owned();
    assert_eq!(etag, "\"accepted\"");

    // Forty reads held on a status that does not change, then two more
    // than `max_waiting` allows: those are answered at once.
    let started = tokio::time::Instant::now();
    let mut held = JoinSet::new();
    for _ in 0..40 {
        let (client, url, etag) = (app.client.clone(), url.clone(), etag.clone());
        held.spawn(async move {
            let response = held_read(&client, &url, "wait=2", Some(&etag)).await;
            (response.status(), started.elapsed())
        });
    }
    let metrics_url = format!("{}/metrics", app.client.base);
    // The gauge is the process's, which other tests share: at least ours.
    skyport_tests::eventually("40 reads held", Duration::from_secs(10), || async {
        let metrics = reqwest::get(&metrics_url)
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let held = metrics
            .lines()
            .find_map(|line| line.strip_prefix("skyport_http_held_requests "))
            .and_then(|count| count.parse::<u64>().ok());
        held.filter(|held| *held >= 40)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let over = held_read(&app.client, &url, "wait=2", Some(&etag)).await;
    assert_eq!(over.status(), 304, "past max_waiting: answered at once");
    assert!(started.elapsed() < Duration::from_secs(2));
    // A listing that asks to wait is not held: it is answered at once (a
    // parameter it does not take).
    let listing = app
        .client
        .http
        .get(format!("{}/api/deliveryrequests?wait=5", app.client.base))
        .send()
        .await
        .unwrap();
    assert_eq!(listing.status(), 400);
    assert!(started.elapsed() < Duration::from_secs(2));
    // The held reads take no slot: posts and plain reads still go through a
    // limit of 2 in flight.
    for n in 0..20 {
        app.client.post_delivery(&delivery_request(n)).await;
        assert_eq!(app.client.status(&url).await.status(), 200);
    }
    for (status, elapsed) in held.join_all().await {
        assert_eq!(
            status, 304,
            "the copy was still current when the wait ended"
        );
        assert!(elapsed >= Duration::from_secs(2), "{elapsed:?}");
    }

    let metrics = reqwest::get(&metrics_url)
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let held_count: u64 = metrics
        .lines()
        .find(|line| {
            // The status route's: this binary's other tests hold POSTs too.
            line.starts_with("skyport_http_request_duration_seconds_count")
                && line.contains("route=\"/api/deliveryrequests/{id}/status\"")
                && line.contains("class=\"held\"")
        })
        .and_then(|line| line.rsplit(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no held class in:\n{metrics}"));
    assert!(held_count >= 40, "{held_count}");
    app.app.stop().await.unwrap();
}

#[tokio::test]
async fn a_wait_out_of_range_is_a_400_and_a_malformed_preference_is_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let app = TestApp::spawn(&dir).await;
    let url = never_written(&app, "never-posted");
    for wait in ["0", "31", "soon", "-1"] {
        let response = app
            .client
            .http
            .get(format!("{url}&wait={wait}"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 400, "wait={wait}");
        assert_eq!(
            response.headers()["content-type"],
            "application/problem+json"
        );
    }
    let started = tokio::time::Instant::now();
    let response = held_read(&app.client, &url, "wait=forever", None).await;
    assert_eq!(response.status(), 200);
    assert!(started.elapsed() < Duration::from_secs(1));
    app.app.stop().await.unwrap();
}

#[tokio::test]
async fn on_cosmos_db_a_held_read_is_woken_through_the_change_feed() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = test_settings(dir.path());
    settings.worker.processing_after_ms = Millis::new(0);
    settings.gateway.wait_poll_interval_ms = Millis::new(50);
    // Status writes leave at once rather than lingering for a bulk batch, so
    // that the time after the write is the wake's.
    settings.cosmos.bulk_max_wait_ms = Millis::new(1);
    let app = TestApp::spawn_on_cosmos(settings).await;
    let mut reads = JoinSet::new();
    for n in 0..20 {
        let client = app.client.clone();
        let accepted = client.post_delivery(&delivery_request(n)).await;
        reads.spawn(async move { read_until_terminal(&client, &accepted.status_url).await });
    }
    for (reads, after) in reads.join_all().await {
        assert!(reads <= 2, "{reads} held reads");
        assert!(after < Duration::from_secs(1), "{after:?} after the write");
    }
    // A read held at Accepted on a delivery that is never written ends with
    // its wait, unchanged.
    let url = never_written(&app, "held-on-cosmos");
    let started = tokio::time::Instant::now();
    let response = held_read(&app.client, &url, "wait=1", None).await;
    assert_eq!(response.status(), 200);
    let document: StatusDocument = response.json().await.unwrap();
    assert_eq!(document.state, DeliveryState::Accepted);
    assert!(started.elapsed() >= Duration::from_secs(1));
    app.app.stop().await.unwrap();
}
