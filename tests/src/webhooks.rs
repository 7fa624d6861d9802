//! A callback receiver for the tests: an HTTP or HTTPS server on a loopback
//! address, port 0, that records every callback it is sent and answers as
//! told, the check of their signatures by the `standardwebhooks` Python
//! package (a verifier nobody here wrote), and of their `webhook-id`s: opaque,
//! one per message.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::process::Command;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::serve::Listener;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_native_tls::native_tls::Identity;
use tokio_util::sync::CancellationToken;

use crate::tls::TlsListener;
use crate::{CONCURRENCY, Client, delivery_request, installed_tool, workspace};

/// How the receiver answers.
#[derive(Debug, Clone)]
pub enum Behaviour {
    /// 204 to everything.
    Accept,
    /// 503 (with `Retry-After: 1`) until the instant, then 204.
    UnavailableUntil(Instant),
    /// Never answers (the connection stays open until the receiver stops).
    Silent,
    /// 302 to this location.
    Redirect(String),
}

/// One callback as it arrived.
#[derive(Debug, Clone)]
pub struct Received {
    pub id: String,
    pub timestamp: String,
    pub signature: String,
    pub traceparent: Option<String>,
    pub body: String,
    /// Whether the receiver answered it 2xx.
    pub acknowledged: bool,
}

impl Received {
    /// The body as JSON.
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap()
    }

    /// The message the body announces: its delivery's id and its type
    /// (`delivery.scheduled`, …).
    pub fn message(&self) -> (String, String) {
        let body = self.json();
        let text = |value: &Value| value.as_str().unwrap_or_default().to_owned();
        (text(&body["data"]["id"]), text(&body["type"]))
    }
}

/// The `webhook-id` of each message in `received`, by (delivery id, type);
/// asserts that the ids are opaque (`msg_` and no delivery id in them), the
/// same for every POST of one message, and another for each message.
pub fn message_ids(received: &[Received]) -> BTreeMap<(String, String), String> {
    let mut ids: BTreeMap<(String, String), String> = BTreeMap::new();
    for callback in received {
        let message = callback.message();
        assert!(
            callback.id.starts_with("msg_") && !callback.id.contains(&message.0),
            "{}: not an opaque id of {message:?}",
            callback.id
        );
        let id = ids
            .entry(message.clone())
            .or_insert_with(|| callback.id.clone());
        assert_eq!(*id, callback.id, "{message:?} came with two ids");
    }
    let mut messages: BTreeMap<&str, &(String, String)> = BTreeMap::new();
    for (message, id) in &ids {
        if let Some(other) = messages.insert(id, message) {
            panic!("{message:?} and {other:?} share the id {id}");
        }
    }
    ids
}

#[derive(Debug)]
struct ReceiverState {
    behaviour: Behaviour,
    hits: Mutex<Vec<Received>>,
}

/// A running receiver; stop it with [`Receiver::stop`].
#[derive(Debug)]
pub struct Receiver {
    pub addr: SocketAddr,
    scheme: &'static str,
    /// The errors of the TLS handshakes that failed (HTTPS only).
    handshake_failures: Arc<Mutex<Vec<String>>>,
    shared: Arc<ReceiverState>,
    shutdown: CancellationToken,
    task: JoinHandle<()>,
}

fn header_text(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

async fn receive(
    State(shared): State<Arc<ReceiverState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let acknowledged = match &shared.behaviour {
        Behaviour::Accept => true,
        Behaviour::UnavailableUntil(until) => Instant::now() >= *until,
        Behaviour::Silent | Behaviour::Redirect(_) => false,
    };
    shared
        .hits
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(Received {
            id: header_text(&headers, "webhook-id").unwrap_or_default(),
            timestamp: header_text(&headers, "webhook-timestamp").unwrap_or_default(),
            signature: header_text(&headers, "webhook-signature").unwrap_or_default(),
            traceparent: header_text(&headers, "traceparent"),
            body: String::from_utf8_lossy(&body).into_owned(),
            acknowledged,
        });
    match &shared.behaviour {
        Behaviour::Accept => StatusCode::NO_CONTENT.into_response(),
        Behaviour::UnavailableUntil(_) if !acknowledged => (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::RETRY_AFTER, "1")],
            "down for maintenance",
        )
            .into_response(),
        Behaviour::UnavailableUntil(_) => StatusCode::NO_CONTENT.into_response(),
        Behaviour::Silent => {
            std::future::pending::<()>().await;
            StatusCode::NO_CONTENT.into_response()
        }
        Behaviour::Redirect(location) => {
            (StatusCode::FOUND, [(header::LOCATION, location.clone())]).into_response()
        }
    }
}

impl Receiver {
    /// Listens on `ip`, port 0.
    pub async fn start(ip: IpAddr, behaviour: Behaviour) -> Self {
        let listener = TcpListener::bind(SocketAddr::new(ip, 0)).await.unwrap();
        Self::serve(listener, "http", Arc::default(), behaviour)
    }

    /// Listens on `ip`, port 0, for HTTPS with `identity`'s certificate.
    pub async fn start_tls(ip: IpAddr, identity: Identity, behaviour: Behaviour) -> Self {
        let listener = TlsListener::bind(ip, identity).await;
        let failures = listener.failures();
        Self::serve(listener, "https", failures, behaviour)
    }

    fn serve<L>(
        listener: L,
        scheme: &'static str,
        handshake_failures: Arc<Mutex<Vec<String>>>,
        behaviour: Behaviour,
    ) -> Self
    where
        L: Listener<Addr = SocketAddr>,
    {
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(ReceiverState {
            behaviour,
            hits: Mutex::new(Vec::new()),
        });
        let shutdown = CancellationToken::new();
        let router = Router::new()
            .route("/hooks/{*rest}", post(receive))
            .with_state(Arc::clone(&shared));
        let task = tokio::spawn({
            let shutdown = shutdown.clone();
            async move {
                axum::serve(listener, router)
                    .with_graceful_shutdown(shutdown.cancelled_owned())
                    .await
                    .unwrap();
            }
        });
        Self {
            addr,
            scheme,
            handshake_failures,
            shared,
            shutdown,
            task,
        }
    }

    /// The URL of hook `name` on this receiver, with `host` as its host.
    pub fn url(&self, host: &str, name: &str) -> String {
        format!("{}://{host}:{}/hooks/{name}", self.scheme, self.addr.port())
    }

    /// The errors of the TLS handshakes that failed so far.
    pub fn handshake_failures(&self) -> Vec<String> {
        self.handshake_failures
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Every callback so far, in arrival order.
    pub fn received(&self) -> Vec<Received> {
        self.shared
            .hits
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Stops the server (a silent one drops its open connections).
    pub async fn stop(self) {
        self.shutdown.cancel();
        self.task.abort();
        let _ = self.task.await;
    }
}

/// Checks every callback's signature with the `standardwebhooks` package
/// and `secret`; returns how many it verified (panics if it refuses one).
pub fn verify_with_python(secret: &str, messages: &[Received]) -> usize {
    let verified = verified_by_python(secret, messages);
    assert_eq!(
        verified,
        messages.len(),
        "the standardwebhooks verifier refused a callback (its reason is above)"
    );
    verified
}

/// How many of `messages` the `standardwebhooks` package verifies with
/// `secret`, as a receiver holding that secret would; refused ones are counted out.
pub fn verified_by_python(secret: &str, messages: &[Received]) -> usize {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("callbacks.json");
    let recorded: Vec<Value> = messages
        .iter()
        .map(|m| {
            json!({
                "headers": {
                    "webhook-id": m.id,
                    "webhook-timestamp": m.timestamp,
                    "webhook-signature": m.signature,
                },
                "body": m.body,
            })
        })
        .collect();
    std::fs::write(&file, serde_json::to_vec(&recorded).unwrap()).unwrap();
    let output = Command::new(installed_tool("venv/bin/python"))
        .arg(workspace().join("tests/clients/verify_webhooks.py"))
        .arg(&file)
        .env("SKYPORT_TEST_WEBHOOK_SECRET", secret)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    // Exit 1: some were refused, and counted; anything else is a broken check.
    assert!(
        matches!(output.status.code(), Some(0 | 1)),
        "the standardwebhooks verifier failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    if !stderr.is_empty() {
        println!("standardwebhooks: {}", stderr.trim());
    }
    let counted = format!(" of {}", messages.len());
    stdout
        .trim()
        .strip_prefix("verified ")
        .and_then(|rest| rest.strip_suffix(&counted))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("unexpected verifier output: {stdout}{stderr}"))
}

/// Posts deliveries `0..count`, each with `callback(n)` as its callbackUrl
/// (delivery 0 with `traceparent`, when given); their status URLs in order.
pub async fn post_with_callbacks(
    client: &Client,
    count: usize,
    traceparent: Option<&str>,
    callback: impl Fn(usize) -> String,
) -> Vec<String> {
    let permits = Arc::new(tokio::sync::Semaphore::new(CONCURRENCY));
    let mut posts = tokio::task::JoinSet::new();
    for n in 0..count {
        let mut request = delivery_request(n);
        request["callbackUrl"] = Value::String(callback(n));
        let client = match traceparent {
            Some(traceparent) if n == 0 => client.with_header("traceparent", traceparent),
            _ => client.clone(),
        };
        let permit = Arc::clone(&permits).acquire_owned().await.unwrap();
        posts.spawn(async move {
            let accepted = client.post_delivery(&request).await;
            drop(permit);
            (n, accepted.status_url)
        });
    }
    let mut urls = posts.join_all().await;
    urls.sort();
    urls.into_iter().map(|(_, url)| url).collect()
}

/// How long a test waits for callbacks to arrive.
pub const CALLBACK_WAIT: Duration = Duration::from_secs(120);
