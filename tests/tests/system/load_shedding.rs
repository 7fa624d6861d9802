//! Load shedding over real HTTP: with `gateway.max_in_flight` requests in
//! flight, one more (on any API route) is refused at once (503 problem,
//! `Retry-After`) instead of queueing, the probes still answer, and capacity
//! comes back when the requests in flight end. A burst of new connections
//! waits in the listen backlog (`gateway.listen_backlog`) without losing a
//! handshake.
//!
//! A request holds its slot from the moment its body has arrived until it is
//! answered, so the requests held here are real POSTs whose append to the
//! embedded stream waits at a gate the test opens: the slots are taken when
//! the gate has counted them in, with no race against the gateway's
//! scheduling. (Requests whose bodies stall hold no slot at all; the
//! slow-client tests check that.)

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde_json::Value;
use skyport::Backends;
use skyport_core::ports::{OutboundEvent, Position, PublishError, Publisher};
use skyport_gateway::Gateway;
use skyport_tests::{Client, TestApp, delivery_request, eventually, test_settings};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// The embedded stream's publisher, holding every append until opened.
#[derive(Debug)]
struct Gate {
    inner: Arc<dyn Publisher>,
    waiting: AtomicUsize,
    open: watch::Sender<bool>,
}

#[async_trait]
impl Publisher for Gate {
    async fn publish(&self, event: OutboundEvent) -> Result<Position, PublishError> {
        let mut open = self.open.subscribe();
        self.waiting.fetch_add(1, Ordering::SeqCst);
        open.wait_for(|open| *open).await.unwrap();
        self.inner.publish(event).await
    }

    async fn ready(&self) -> bool {
        self.inner.ready().await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_beyond_the_limit_is_refused_at_once_with_retry_after() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = test_settings(dir.path());
    settings.gateway.max_in_flight = 2;
    settings.gateway.retry_after_s = 3;
    let mut backends = Backends::open(&settings).await.unwrap();
    let gate = Arc::new(Gate {
        inner: Arc::clone(&backends.ports.publisher),
        waiting: AtomicUsize::new(0),
        open: watch::Sender::new(false),
    });
    backends.ports.publisher = gate.clone();
    let gateway = Gateway::bind(
        &backends.ports,
        &settings.gateway,
        skyport_runtime::destination::CallbackAcceptance::from_settings(&settings),
        None,
        Vec::new(),
    )
    .await
    .unwrap();
    let client = Client::new(format!("http://{}", gateway.local_addr().unwrap()));
    let shutdown = CancellationToken::new();
    let served = tokio::spawn(gateway.serve(shutdown.clone()));

    let held: Vec<_> = (1..=2)
        .map(|n| {
            let client = client.clone();
            tokio::spawn(async move {
                client
                    .post_raw("application/json", delivery_request(n).to_string())
                    .await
                    .status()
            })
        })
        .collect();
    eventually(
        "both requests wait at the gate",
        Duration::from_secs(10),
        || {
            let waiting = gate.waiting.load(Ordering::SeqCst);
            async move { (waiting == 2).then_some(()) }
        },
    )
    .await;

    let started = Instant::now();
    let response = client
        .post_raw("application/json", delivery_request(3).to_string())
        .await;
    let took = started.elapsed();
    assert_eq!(response.status(), 503);
    assert!(took < Duration::from_secs(1), "a refusal is fast: {took:?}");
    assert_eq!(response.headers()["retry-after"], "3");
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json"
    );
    let problem: Value = response.json().await.unwrap();
    assert_eq!(problem["code"], "Overloaded", "{problem}");
    assert_eq!(
        gate.waiting.load(Ordering::SeqCst),
        2,
        "it never reached the stream"
    );
    // The limit is one for every API route: the held POSTs leave no room for a GET.
    let status = client
        .http
        .get(format!(
            "{}/api/deliveryrequests/some-id/status?receipt=x",
            client.base
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(status.status(), 503, "a status read is shed too");

    for probe in ["/readyz", "/api/probe"] {
        let health = client
            .http
            .get(format!("{}{probe}", client.base))
            .send()
            .await
            .unwrap();
        assert_eq!(health.status(), 200, "the probes are never shed: {probe}");
    }

    gate.open.send_replace(true);
    for request in held {
        assert_eq!(request.await.unwrap(), 202, "a held request completes");
    }
    let response = client
        .post_raw("application/json", delivery_request(4).to_string())
        .await;
    assert_eq!(response.status(), 202, "capacity came back");

    shutdown.cancel();
    served.await.unwrap();
    backends.close().await;
}

/// A spike on 2,000 connections opened as it starts: every handshake ends at
/// once, however far behind the accepting loop is (the backlog of 128 that
/// `TcpListener::bind` asked for lost handshakes past it, which clients send
/// again after a second), and every request is accepted. Needs
/// `net.core.somaxconn` and `net.ipv4.tcp_max_syn_backlog` of 2,048 or more,
/// or SYN cookies on (Linux's defaults since 5.4 on any machine with 1 GiB).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_new_connections_is_taken_without_a_handshake_sent_twice() {
    const BURST: usize = 2_000;
    // Two descriptors a connection (the client's and the gateway's) in this process.
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    let needed = 2 * BURST as u64 + 1_024;
    if limit.current.is_some_and(|current| current < needed) {
        assert!(
            limit.maximum.is_none_or(|maximum| maximum >= needed),
            "the hard RLIMIT_NOFILE is below the {needed} descriptors the burst needs"
        );
        rustix::process::setrlimit(
            rustix::process::Resource::Nofile,
            rustix::process::Rlimit {
                current: Some(needed),
                maximum: limit.maximum,
            },
        )
        .unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let app = TestApp::spawn(&dir).await;
    let address = app.app.gateway_addr;
    let mut burst = tokio::task::JoinSet::new();
    for n in 0..BURST {
        burst.spawn(async move {
            let started = Instant::now();
            let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
            let handshake = started.elapsed();
            let body = delivery_request(n).to_string();
            let request = format!(
                "POST /api/deliveryrequests HTTP/1.1\r\nhost: {address}\r\ncontent-type: application/json\r\n\
                 content-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            stream.write_all(request.as_bytes()).await.unwrap();
            let mut response = Vec::new();
            stream.read_to_end(&mut response).await.unwrap();
            let status = String::from_utf8_lossy(&response)
                .lines()
                .next()
                .unwrap_or_default()
                .to_owned();
            (handshake, status, started.elapsed())
        });
    }
    let mut handshakes = Vec::with_capacity(BURST);
    let mut answered = Vec::with_capacity(BURST);
    for (handshake, status, elapsed) in burst.join_all().await {
        assert!(status.starts_with("HTTP/1.1 202"), "{status}");
        handshakes.push(handshake);
        answered.push(elapsed);
    }
    handshakes.sort();
    answered.sort();
    println!(
        "{BURST} new connections: handshake p99 {:?}, slowest {:?}; answer p99 {:?}, slowest {:?}",
        handshakes[BURST * 99 / 100],
        handshakes[BURST - 1],
        answered[BURST * 99 / 100],
        answered[BURST - 1]
    );
    assert!(
        handshakes[BURST - 1] < Duration::from_secs(1),
        "a handshake took {:?}: one was lost and sent again",
        handshakes[BURST - 1]
    );
    app.app.stop().await.unwrap();
}
