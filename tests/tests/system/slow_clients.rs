//! Clients that connect and stall cannot hold a Skyport listener: ten times
//! `max_in_flight` connections that send nothing, half a head, a head sent a
//! byte at a time, or half a body leave room for a good POST, and each is
//! closed once its own timeout has passed (a stalled body with a 408
//! problem). Bodies are read only once credentials pass, and at most
//! `max_bodies_reading` at once. Heads past `max_header_bytes` are 431. The
//! worker's admin listener keeps the same limits.

#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use skyport_runtime::admin::{self, Admin, ReadinessCheck};
use skyport_runtime::config::{HttpSettings, Millis};
use skyport_runtime::metrics::{self, ClosedLabels};
use skyport_tests::{TestApp, delivery_request, test_settings};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

const HEAD: Duration = Duration::from_millis(1_500);
const BODY: Duration = Duration::from_millis(1_500);
const IDLE: Duration = Duration::from_millis(2_500);
/// How late a close may come after its timeout on a busy machine.
const SLACK: Duration = Duration::from_secs(3);

fn limits() -> HttpSettings {
    HttpSettings {
        header_read_timeout_ms: Millis::new(1_500),
        body_read_timeout_ms: Millis::new(1_500),
        idle_timeout_ms: Millis::new(2_500),
        ..HttpSettings::default()
    }
}

/// How a stalled client behaves.
#[derive(Debug, Clone, Copy)]
enum Stall {
    /// Connects and sends nothing.
    Silent,
    /// Sends half a head, then nothing.
    HalfHead,
    /// Sends a head one byte every 300 ms: progress that never ends.
    Trickle,
    /// Sends a whole head and half the body it announces.
    HalfBody,
}

impl Stall {
    /// When it should be closed, counted from its first byte (or its connection).
    fn timeout(self) -> Duration {
        match self {
            Self::Silent => IDLE,
            Self::HalfHead | Self::Trickle => HEAD,
            Self::HalfBody => BODY,
        }
    }
}

const HALF_HEAD: &str =
    "POST /api/deliveryrequests HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\n";
const HALF_BODY: &str = "POST /api/deliveryrequests HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{\"ownerId\":";

/// Connects and stalls as `stall` says; resolves with what the server sent
/// before closing, once it has, and how long after the stall began.
async fn stall(address: SocketAddr, stall: Stall) -> (Stall, Duration, String) {
    let mut stream = TcpStream::connect(address).await.unwrap();
    let began = Instant::now();
    match stall {
        Stall::Silent => {}
        Stall::HalfHead => stream.write_all(HALF_HEAD.as_bytes()).await.unwrap(),
        Stall::HalfBody => stream.write_all(HALF_BODY.as_bytes()).await.unwrap(),
        Stall::Trickle => {
            let (mut reader, mut writer) = stream.into_split();
            let trickle = tokio::spawn(async move {
                for byte in HALF_HEAD.bytes().cycle() {
                    if writer.write_all(&[byte]).await.is_err() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
            });
            let mut received = Vec::new();
            let read = tokio::time::timeout(HEAD + SLACK, reader.read_to_end(&mut received)).await;
            trickle.abort();
            assert!(read.is_ok(), "{stall:?} was never closed");
            return (
                stall,
                began.elapsed(),
                String::from_utf8_lossy(&received).into_owned(),
            );
        }
    }
    let mut received = Vec::new();
    let read =
        tokio::time::timeout(stall.timeout() + SLACK, stream.read_to_end(&mut received)).await;
    assert!(read.is_ok(), "{stall:?} was never closed");
    (
        stall,
        began.elapsed(),
        String::from_utf8_lossy(&received).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_connections_hold_no_slot_and_are_closed_once_their_timeouts_pass() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = test_settings(dir.path());
    settings.gateway.max_in_flight = 4;
    settings.gateway.http = limits();
    let app = TestApp::spawn_with(settings).await;
    let address = app.app.gateway_addr;

    let closed_for = |reason| {
        metrics::global()
            .http_connections_closed
            .get_or_create(&ClosedLabels { reason })
            .get()
    };
    let (idle_before, slow_before) = (closed_for("idle"), closed_for("head_timeout"));
    let kinds = [
        Stall::Silent,
        Stall::HalfHead,
        Stall::Trickle,
        Stall::HalfBody,
    ];
    let mut stalled = JoinSet::new();
    for n in 0..40 {
        stalled.spawn(stall(address, kinds[n % kinds.len()]));
    }
    // Every stalled client has connected and sent what it sends.
    tokio::time::sleep(Duration::from_millis(300)).await;

    let started = Instant::now();
    let response = app
        .client
        .post_raw("application/json", delivery_request(1).to_string())
        .await;
    let took = started.elapsed();
    assert_eq!(response.status(), 202, "{:?}", response.text().await);
    assert!(took < Duration::from_secs(1), "a good POST waited {took:?}");

    let mut closed = 0;
    while let Some(result) = stalled.join_next().await {
        let (kind, after, received) = result.unwrap();
        assert!(
            after + Duration::from_millis(50) >= kind.timeout(),
            "{kind:?} was closed after {after:?}, before its timeout"
        );
        match kind {
            Stall::HalfBody => {
                assert!(received.starts_with("HTTP/1.1 408"), "{received}");
                assert!(received.contains("application/problem+json"), "{received}");
                assert!(
                    received.contains("\"code\":\"RequestTimeout\""),
                    "{received}"
                );
            }
            _ => assert_eq!(received, "", "{kind:?} is closed without an answer"),
        }
        closed += 1;
    }
    assert_eq!(closed, 40);
    // Counted for operators (other tests in this process may add their own).
    assert!(closed_for("idle") - idle_before >= 10);
    assert!(closed_for("head_timeout") - slow_before >= 20);

    let response = app
        .client
        .post_raw("application/json", delivery_request(2).to_string())
        .await;
    assert_eq!(response.status(), 202);
    app.app.stop().await.unwrap();
}

const KEY: &str = "slow-client-key-0123456789abcdef012345";

/// Sends a head announcing a body of 1000 bytes and a little of it, with
/// `credentials` (a header line, or nothing); resolves with what came back before the
/// connection closed, and when.
async fn half_body(address: SocketAddr, credentials: &str) -> (Duration, String) {
    let mut stream = TcpStream::connect(address).await.unwrap();
    let began = Instant::now();
    let head = HALF_BODY.replacen("\r\n\r\n", &format!("\r\n{credentials}\r\n\r\n"), 1);
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut received = Vec::new();
    let read = tokio::time::timeout(BODY + SLACK, stream.read_to_end(&mut received)).await;
    assert!(read.is_ok(), "a half body was never answered");
    (
        began.elapsed(),
        String::from_utf8_lossy(&received).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_are_read_after_credentials_and_a_bounded_number_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = test_settings(dir.path());
    settings.gateway.max_bodies_reading = 4;
    settings.gateway.http = limits();
    let scopes = skyport_runtime::config::Scope::all();
    skyport_tests::with_api_keys(&mut settings, &[("slow", KEY, &scopes)]);
    let app = TestApp::spawn_with(settings).await;
    let address = app.app.gateway_addr;
    let client = app.client.with_header("x-api-key", KEY);
    // Without credentials nothing of a body is read: 401 at once, whatever comes.
    let mut anonymous = JoinSet::new();
    for _ in 0..8 {
        anonymous.spawn(half_body(address, "x-request-id: anonymous"));
    }
    for (after, received) in anonymous.join_all().await {
        assert!(received.starts_with("HTTP/1.1 401"), "{received}");
        assert!(after < BODY, "an anonymous body was waited for ({after:?})");
    }
    // Four stalled bodies with credentials hold the four places.
    let credentials = format!("x-api-key: {KEY}");
    let mut stalled = JoinSet::new();
    for _ in 0..4 {
        let credentials = credentials.clone();
        stalled.spawn(async move { half_body(address, &credentials).await });
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    let refused = client
        .post_raw("application/json", delivery_request(1).to_string())
        .await;
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_eq!(refused.status(), 503);
    assert!(refused.headers().contains_key("retry-after"));
    let problem: serde_json::Value = refused.json().await.unwrap();
    assert_eq!(problem["code"], "Overloaded");
    // A request that announces no body takes no place among them.
    let listing = client
        .http
        .get(format!("{}/api/deliveryrequests", client.base))
        .send()
        .await
        .unwrap();
    assert_eq!(listing.status(), 200);
    for (after, received) in stalled.join_all().await {
        assert!(received.starts_with("HTTP/1.1 408"), "{received}");
        assert!(after + Duration::from_millis(50) >= BODY, "{after:?}");
    }
    let response = client
        .post_raw("application/json", delivery_request(2).to_string())
        .await;
    assert_eq!(response.status(), 202);
    app.app.stop().await.unwrap();
}

/// Sends a head whose one extra header is `bytes` long; returns the head of
/// the answer, or what came before the connection closed.
async fn with_header_of(address: SocketAddr, bytes: usize) -> String {
    let stream = TcpStream::connect(address).await.unwrap();
    let (mut reader, mut writer) = stream.into_split();
    let head = format!(
        "GET /healthz HTTP/1.1\r\nhost: test\r\nx-padding: {}\r\n\r\n",
        "a".repeat(bytes)
    );
    // The server may answer and close before it has read it all; the write
    // half stays open until the answer is read (closing it would end the request).
    let writing = tokio::spawn(async move {
        let written = writer.write_all(head.as_bytes()).await;
        (writer, written)
    });
    let mut received = Vec::new();
    let mut chunk = [0_u8; 4096];
    let reading = async {
        while !received.windows(4).any(|w| w == b"\r\n\r\n") {
            match reader.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(read) => received.extend_from_slice(&chunk[..read]),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), reading)
        .await
        .unwrap();
    writing.abort();
    String::from_utf8_lossy(&received).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_larger_than_the_limit_is_431() {
    let dir = tempfile::tempdir().unwrap();
    let app = TestApp::spawn(&dir).await;
    let address = app.app.gateway_addr;
    let limit = app.settings.gateway.http.max_header_bytes;
    assert_eq!(limit, 32 * 1024, "the documented default");

    let small = with_header_of(address, 8 * 1024).await;
    assert!(small.starts_with("HTTP/1.1 200"), "{small}");
    let large = with_header_of(address, 64 * 1024).await;
    assert!(large.starts_with("HTTP/1.1 431"), "{large}");
    assert!(large.contains("application/problem+json"), "{large}");
    assert!(large.contains("HeadersTooLarge"), "{large}");
    // Far past it, hyper refuses before the head is even parsed.
    let huge = with_header_of(address, 200 * 1024).await;
    assert!(
        huge.is_empty() || huge.starts_with("HTTP/1.1 431"),
        "{huge}"
    );
    app.app.stop().await.unwrap();
}

#[derive(Debug)]
struct AlwaysReady;

#[async_trait::async_trait]
impl ReadinessCheck for AlwaysReady {
    async fn check(&self) -> Result<Vec<String>, String> {
        Ok(Vec::new())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_admin_listener_keeps_the_same_limits() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let stop = CancellationToken::new();
    let router = admin::router(Admin::new(Arc::new(AlwaysReady), 1), false);
    let server = tokio::spawn({
        let stop = stop.clone();
        async move { admin::serve(listener, router, &limits(), stop).await }
    });

    let mut stalled = JoinSet::new();
    for kind in [Stall::Silent, Stall::HalfHead, Stall::Trickle] {
        stalled.spawn(stall(address, kind));
    }
    let ready = reqwest::get(format!("http://{address}/readyz"))
        .await
        .unwrap();
    assert_eq!(ready.status(), 200);
    while let Some(result) = stalled.join_next().await {
        let (kind, after, received) = result.unwrap();
        assert!(
            after + Duration::from_millis(50) >= kind.timeout(),
            "{kind:?}: {after:?}"
        );
        assert_eq!(received, "", "{kind:?}");
    }
    let large = with_header_of(address, 64 * 1024).await;
    assert!(large.starts_with("HTTP/1.1 431"), "{large}");

    stop.cancel();
    server.await.unwrap();
}
