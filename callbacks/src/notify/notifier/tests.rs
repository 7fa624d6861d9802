#![allow(clippy::unwrap_used)]

use std::io::Write;
use std::sync::Mutex;

use axum::Router;
use axum::http::{HeaderMap, StatusCode};
use skyport_core::ports::Versioned;
use skyport_embedded::EmbeddedStore;
use skyport_runtime::config::Millis;
use tokio::net::TcpListener;

use super::*;
use crate::change_feed::fixture::Fixture;
use crate::notify::sign::Signer;

const KEY: &[u8] = b"a test key of the notifier";

fn masters() -> MasterSecrets {
    MasterSecrets::new(&[KEY.to_vec()]).unwrap()
}

fn notifier(store: &Arc<EmbeddedStore>, allow: &[&str]) -> Notifier {
    let settings = CallbackSettings {
        allow: allow.iter().map(|&entry| entry.to_owned()).collect(),
        ..CallbackSettings::default()
    };
    Notifier::new(
        Arc::clone(store) as _,
        Arc::clone(store) as _,
        &settings,
        AddressPolicy::new(settings.allowed()),
        masters(),
        "test-processor",
    )
    .unwrap()
}

fn document(id: &str, state: DeliveryState, callback_url: Option<&str>) -> StatusDocument {
    StatusDocument {
        state,
        callback_url: callback_url.map(str::to_owned),
        ..StatusDocument::accepted(id, OffsetDateTime::UNIX_EPOCH)
    }
}

/// Writes `document` and returns it as the change feed hands it over.
async fn written(store: &EmbeddedStore, document: &StatusDocument) -> Change {
    StatusStore::put(store, document, Precondition::IfNoneMatch)
        .await
        .unwrap();
    Change {
        id: document.id.clone(),
        document: serde_json::to_value(document).unwrap(),
    }
}

async fn stored(store: &EmbeddedStore, id: &str) -> StatusDocument {
    let versioned: Versioned = StatusStore::get(store, id).await.unwrap().unwrap();
    versioned.document
}

/// A local receiver answering `status` with `body`, keeping what it was sent.
async fn answering(
    status: StatusCode,
    body: &'static str,
) -> (String, Arc<Mutex<Vec<(HeaderMap, Bytes)>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let received = Arc::new(Mutex::new(Vec::new()));
    let keep = Arc::clone(&received);
    let app = Router::new().fallback(move |headers: HeaderMap, sent: Bytes| {
        keep.lock().unwrap().push((headers, sent));
        async move { (status, body) }
    });
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{address}/hook"), received)
}

/// A local receiver answering 204, keeping what it was sent.
async fn receiver() -> (String, Arc<Mutex<Vec<(HeaderMap, Bytes)>>>) {
    answering(StatusCode::NO_CONTENT, "").await
}

#[tokio::test]
async fn the_message_is_known_by_an_opaque_id_and_kept_under_a_readable_key() {
    let fixture = Fixture::open();
    let notifier = notifier(&fixture.store, &[]);
    let scheduled = document("d-1", DeliveryState::Scheduled, None);
    let message = notifier.message(&scheduled);
    assert_eq!(message.key, "d-1:scheduled");
    assert_eq!(
        message.webhook_id,
        masters().webhook_id("d-1", "scheduled", 0)
    );
    assert!(
        !message.webhook_id.contains("d-1"),
        "{}",
        message.webhook_id
    );
    let cancelled = document("d-1", DeliveryState::Cancelled, None);
    assert_ne!(notifier.message(&cancelled).webhook_id, message.webhook_id);
    let redriven = StatusDocument {
        epoch: 1,
        ..scheduled.clone()
    };
    assert_ne!(notifier.message(&redriven).webhook_id, message.webhook_id);
}

#[test]
fn the_payload_wraps_the_status_without_its_callback_outcome() {
    let mut document = document("d-1", DeliveryState::Failed, Some("http://h/hook"));
    document.callback = Some(CallbackOutcome {
        state: CallbackState::Pending,
        announced: DeliveryState::Failed,
        attempts: 2,
        last_error: None,
        delivered_at: None,
        retrying_since: None,
    });
    let body = payload(&document);
    assert_eq!(body["type"], "delivery.failed");
    assert_eq!(body["timestamp"], "1970-01-01T00:00:00Z");
    assert_eq!(body["data"]["id"], "d-1");
    assert!(body["data"].get("callback").is_none());
}

#[tokio::test]
async fn a_terminal_status_is_posted_signed_and_written_back_only_once_retried() {
    let fixture = Fixture::open();
    let store = Arc::clone(&fixture.store);
    let (url, received) = receiver().await;
    let notifier = notifier(&store, &["127.0.0.0/8"]);
    let change = written(
        &store,
        &document("d-1", DeliveryState::Scheduled, Some(&url)),
    )
    .await;
    notifier.handle(&[change]).await.unwrap();
    let (headers, body) = received.lock().unwrap().remove(0);
    let header = |name: &str| headers[name].to_str().unwrap().to_owned();
    let id = masters().webhook_id("d-1", "scheduled", 0);
    assert_eq!(header("webhook-id"), id);
    let timestamp: i64 = header("webhook-timestamp").parse().unwrap();
    // No principal (auth off): the master signs.
    assert_eq!(
        header("webhook-signature"),
        masters().signer(None).sign(&id, timestamp, &body)
    );
    let sent: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(sent["type"], "delivery.scheduled");
    let before = StatusStore::get(&*store, "d-1").await.unwrap().unwrap();
    assert!(
        before.document.callback.is_none(),
        "delivered at the first attempt: nothing written back"
    );
    // Marked pending again after a failure (as a resend does): once
    // delivered, the outcome is written over the Pending one.
    let mut resent = before.document;
    resent.callback = Some(CallbackOutcome {
        state: CallbackState::Pending,
        announced: DeliveryState::Scheduled,
        attempts: 1,
        last_error: Some("the receiver answered 503".into()),
        delivered_at: None,
        retrying_since: Some(OffsetDateTime::UNIX_EPOCH),
    });
    StatusStore::put(&*store, &resent, Precondition::IfMatch(before.etag))
        .await
        .unwrap();
    let change = Change {
        id: resent.id.clone(),
        document: serde_json::to_value(&resent).unwrap(),
    };
    notifier.handle(&[change]).await.unwrap();
    assert_eq!(received.lock().unwrap().len(), 1, "sent again");
    let outcome = stored(&store, "d-1").await.callback.unwrap();
    assert_eq!(outcome.state, CallbackState::Delivered);
    assert_eq!(outcome.announced, DeliveryState::Scheduled);
    assert_eq!(outcome.attempts, 2);
    assert!(outcome.delivered_at.is_some() && outcome.last_error.is_none());
}

#[tokio::test]
async fn a_principals_delivery_is_signed_with_its_derived_secret() {
    let fixture = Fixture::open();
    let store = Arc::clone(&fixture.store);
    let (url, received) = receiver().await;
    let notifier = notifier(&store, &["127.0.0.0/8"]);
    let made_by_alice = StatusDocument {
        principal: Some("alice".into()),
        ..document("d-1", DeliveryState::Scheduled, Some(&url))
    };
    let change = written(&store, &made_by_alice).await;
    notifier.handle(&[change]).await.unwrap();
    let (headers, body) = received.lock().unwrap().remove(0);
    let header = |name: &str| headers[name].to_str().unwrap().to_owned();
    let (id, signature) = (header("webhook-id"), header("webhook-signature"));
    let timestamp: i64 = header("webhook-timestamp").parse().unwrap();
    let sign = |signer: Signer| signer.sign(&id, timestamp, &body);
    assert_eq!(signature, sign(masters().signer(Some("alice"))));
    assert_ne!(signature, sign(masters().signer(Some("bob"))));
    assert_ne!(signature, sign(masters().signer(None)));
}

#[tokio::test]
async fn documents_not_waiting_for_a_callback_are_passed_over() {
    let fixture = Fixture::open();
    let store = Arc::clone(&fixture.store);
    let (url, received) = receiver().await;
    let notifier = notifier(&store, &["127.0.0.0/8"]);
    let running = written(
        &store,
        &document("d-1", DeliveryState::Processing, Some(&url)),
    )
    .await;
    let silent = written(&store, &document("d-2", DeliveryState::Failed, None)).await;
    notifier.handle(&[running, silent]).await.unwrap();
    assert!(received.lock().unwrap().is_empty());
    assert!(stored(&store, "d-1").await.callback.is_none());
    assert!(stored(&store, "d-2").await.callback.is_none());
}

#[tokio::test]
async fn a_refused_destination_is_dead_lettered_and_recorded() {
    let fixture = Fixture::open();
    let store = Arc::clone(&fixture.store);
    let (url, received) = receiver().await;
    // No allow-list: loopback is refused before anything is sent.
    let notifier = notifier(&store, &[]);
    let change = written(&store, &document("d-1", DeliveryState::Failed, Some(&url))).await;
    notifier.handle(&[change]).await.unwrap();
    assert!(received.lock().unwrap().is_empty());
    let outcome = stored(&store, "d-1").await.callback.unwrap();
    assert_eq!(outcome.state, CallbackState::DeadLettered);
    // The client reads that much, not which address was refused.
    assert_eq!(
        outcome.last_error.as_deref(),
        Some("the destination is not allowed")
    );
    let letters = store.changes("test-processor", None, 100).await.unwrap();
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].key, "d-1:failed");
    assert_eq!(letters[0].reason, "the destination is not allowed");
    assert_eq!(letters[0].payload["callbackUrl"], url.as_str());
    assert_eq!(
        letters[0].payload["webhookId"],
        masters().webhook_id("d-1", "failed", 0)
    );
}

/// Log lines as the human format writes them, into memory.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}

/// A receiver whose answer holds a line break and a line of its own
/// making: the log keeps it on the callback's one line, escaped, and
/// the client's `lastError` holds none of it.
#[tokio::test]
async fn a_receivers_answer_forges_no_log_line_and_stays_out_of_the_last_error() {
    const FORGED: &str = "2026-11-28T00:00:00.000000Z ERROR skyport: forged";
    let fixture = Fixture::open();
    let store = Arc::clone(&fixture.store);
    let (url, _) = answering(
        StatusCode::BAD_REQUEST,
        "refused\n2026-11-28T00:00:00.000000Z ERROR skyport: forged",
    )
    .await;
    let notifier = notifier(&store, &["127.0.0.0/8"]);
    let change = written(&store, &document("d-1", DeliveryState::Failed, Some(&url))).await;
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .finish();
    {
        // The test's runtime has one thread: every poll of the notifier logs here.
        let _default = tracing::subscriber::set_default(subscriber);
        notifier.handle(&[change]).await.unwrap();
    }
    let log = captured.text();
    let lines: Vec<&str> = log.lines().collect();
    assert_eq!(lines.len(), 1, "one event, one line: {log}");
    assert!(lines[0].contains("dead-lettered"), "{log}");
    assert!(lines[0].contains("refused\\n2026-11-28"), "{log}");
    assert!(
        !log.contains(&format!("\n{FORGED}")),
        "a forged line: {log}"
    );
    let outcome = stored(&store, "d-1").await.callback.unwrap();
    assert_eq!(
        outcome.last_error.as_deref(),
        Some("the receiver answered 400")
    );
}

#[test]
fn the_backoff_doubles_up_to_its_maximum_with_jitter() {
    let settings = CallbackSettings {
        backoff_initial_ms: Millis::new(100),
        backoff_max_ms: Millis::new(1_000),
        ..CallbackSettings::default()
    };
    for _ in 0..200 {
        assert!(backoff(&settings, 1) <= Duration::from_millis(100));
        assert!(backoff(&settings, 3) <= Duration::from_millis(400));
        assert!(backoff(&settings, 30) <= Duration::from_millis(1_000));
    }
    let waits: Vec<Duration> = (0..200).map(|_| backoff(&settings, 30)).collect();
    assert!(waits.iter().any(|&wait| wait != waits[0]), "no jitter");
    assert_eq!(
        wait_before_retry(&settings, 1, Some(Duration::from_secs(5))),
        Duration::from_secs(5)
    );
    assert!(wait_before_retry(&settings, 1, None) <= Duration::from_millis(100));
}
