//! Load shedding over real HTTP: with `gateway.max_in_flight` requests in
//! flight, one more (on any API route) is refused at once (503 problem,
//! `Retry-After`) instead of queueing, the probes still answer, and capacity
//! comes back when the requests in flight end.
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
use skyport_tests::{Client, delivery_request, eventually, test_settings};
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
