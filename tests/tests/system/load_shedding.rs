//! Load shedding over real HTTP: with `gateway.max_in_flight` requests in
//! flight, one more is refused at once (503 problem, `Retry-After`) instead of
//! queueing, the probes still answer, and capacity comes back when the
//! requests in flight end.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use serde_json::Value;
use skyport_tests::{TestApp, delivery_request, test_settings};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// A POST whose body never finishes arriving: it holds its slot until dropped.
async fn stalled_post(address: std::net::SocketAddr) -> TcpStream {
    let mut stream = TcpStream::connect(address).await.unwrap();
    let head = format!(
        "POST /api/deliveryrequests HTTP/1.1\r\nhost: {address}\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{{\"ownerId\":"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_beyond_the_limit_is_refused_at_once_with_retry_after() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = test_settings(dir.path());
    settings.gateway.max_in_flight = 2;
    settings.gateway.retry_after_s = 3;
    let app = TestApp::spawn_with(settings).await;
    let address = app.app.gateway_addr;
    let stalled = vec![stalled_post(address).await, stalled_post(address).await];

    // The stalled posts are in flight once their headers are read; poll until shed.
    let deadline = Instant::now() + Duration::from_secs(10);
    let shed = loop {
        let started = Instant::now();
        let response = app
            .client
            .post_raw("application/json", delivery_request(1).to_string())
            .await;
        if response.status() == 503 {
            break (started.elapsed(), response);
        }
        assert!(
            Instant::now() < deadline,
            "never shed: {}",
            response.status()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let (took, response) = shed;
    assert!(took < Duration::from_secs(1), "a refusal is fast: {took:?}");
    assert_eq!(response.headers()["retry-after"], "3");
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json"
    );
    let problem: Value = response.json().await.unwrap();
    assert_eq!(problem["code"], "Overloaded", "{problem}");

    let health = app
        .client
        .http
        .get(format!("{}/readyz", app.client.base))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200, "the probes are never shed");

    drop(stalled);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let response = app
            .client
            .post_raw("application/json", delivery_request(2).to_string())
            .await;
        if response.status() == 202 {
            break;
        }
        assert_eq!(response.status(), 503);
        assert!(Instant::now() < deadline, "capacity never came back");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    app.app.stop().await.unwrap();
}
