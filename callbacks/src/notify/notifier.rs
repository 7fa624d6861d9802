//! The notifier: a [`ChangeHandler`] of the change-feed processor that POSTs
//! each delivery's terminal status (Scheduled, Failed, Cancelled) to its
//! `callbackUrl`, signed as Standard Webhooks specifies, and records the
//! outcome in the status document.
//!
//! A message's `webhook-id` is a MAC of its delivery, announced state and
//! attempt epoch under the first master secret ([`MasterSecrets::webhook_id`]):
//! stable for every attempt and resend of one message, so a receiver drops
//! the duplicates at-least-once delivery brings, and not to be guessed by
//! anyone who would forge one. The body is `{type: "delivery.{state}",
//! timestamp, data: status}`, the same bytes on every attempt; each attempt
//! is signed with its own timestamp, by the secrets of the principal who made
//! the delivery (the masters' without one). Retryable failures (5xx, 408,
//! 429, timeouts, connection errors) are retried with backoff and jitter for
//! `callbacks.retry_for_ms`; then, or at once for a permanent one (another
//! 4xx, a redirect, a refused address), the callback is dead-lettered under
//! the key `{delivery id}:{state}` and the document says so, with a generic
//! reason: the detail of each failure goes to the log alone, escaped.
//!
//! The batch's callbacks run concurrently (the client limits each
//! destination); the batch is done, and checkpointed, once every one of them
//! is delivered or dead-lettered.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::metrics::{self, CallbackLabels};
use async_trait::async_trait;
use bytes::Bytes;
use futures_util::future::join_all;
use serde_json::json;
use skyport_core::error::BoxError;
use skyport_core::ports::{
    Change, ChangeDeadLetter, DeadLetterStore, Precondition, StatusStore, StatusStoreError,
};
use skyport_core::status::{CallbackOutcome, CallbackState, DeliveryState, StatusDocument};
use skyport_runtime::config::CallbackSettings;
use skyport_runtime::destination::AddressPolicy;
use skyport_runtime::{telemetry, trace_span};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use tracing::Instrument;
use url::Url;

use super::client::{Attempt, CallbackClient, Failure, WebhookHeaders, wait_before_retry};
use super::sign::MasterSecrets;
use crate::change_feed::ChangeHandler;

/// Sends the callbacks of terminal statuses.
pub struct Notifier {
    status: Arc<dyn StatusStore>,
    dead_letters: Arc<dyn DeadLetterStore>,
    client: CallbackClient,
    masters: MasterSecrets,
    settings: CallbackSettings,
    /// The processor the dead letters are kept under.
    processor: String,
    /// The messages being sent now: a change of a document whose callback
    /// is being retried (its Pending write) does not start a second sender.
    sending: Mutex<HashSet<String>>,
}

/// A message marked as being sent, unmarked when dropped.
struct Sending<'a> {
    set: &'a Mutex<HashSet<String>>,
    id: String,
}

impl Drop for Sending<'_> {
    fn drop(&mut self) {
        self.set
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.id);
    }
}

impl std::fmt::Debug for Notifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Notifier")
            .field("processor", &self.processor)
            .finish_non_exhaustive()
    }
}

/// How often a callback being retried writes its attempts and last error.
const PENDING_RECORD_INTERVAL: Duration = Duration::from_secs(10);

/// Where one callback is, as the status document records it.
#[derive(Debug, Clone)]
struct Ended {
    state: CallbackState,
    attempts: u32,
    last_error: Option<String>,
    retrying_since: Option<OffsetDateTime>,
}

impl Ended {
    fn finish(self, state: CallbackState, last_error: Option<String>) -> Self {
        Self {
            state,
            last_error,
            ..self
        }
    }
}

/// One message: what the receiver knows it by, and what its dead letter is kept under.
struct Message {
    webhook_id: String,
    key: String,
}

impl Notifier {
    /// A notifier signing with secrets derived from `masters`.
    ///
    /// # Errors
    /// When the HTTP client cannot be built.
    pub fn new(
        status: Arc<dyn StatusStore>,
        dead_letters: Arc<dyn DeadLetterStore>,
        settings: &CallbackSettings,
        policy: AddressPolicy,
        masters: MasterSecrets,
        processor: &str,
    ) -> Result<Self, reqwest::Error> {
        // The callbacks' series are exposed from the notifier's start, at 0.
        metrics::global();
        Ok(Self {
            status,
            dead_letters,
            client: CallbackClient::new(settings, policy)?,
            masters,
            settings: settings.clone(),
            processor: processor.to_owned(),
            sending: Mutex::new(HashSet::new()),
        })
    }

    /// The field of a status document the notifier acts on: a processor
    /// may pass over documents without it.
    pub const FIELD: &'static str = "callbackUrl";

    /// The message announcing `document`'s state.
    fn message(&self, document: &StatusDocument) -> Message {
        let state = state_name(document.state);
        Message {
            webhook_id: self.masters.webhook_id(&document.id, state, document.epoch),
            key: format!("{}:{state}", document.id),
        }
    }

    /// Sends the callback of `document` unless the stored document no longer
    /// waits for it (announced already, or moved on to another state whose
    /// own change follows).
    async fn notify(&self, document: StatusDocument) -> Result<(), BoxError> {
        let Some(current) = self.status.get(&document.id).await? else {
            return Ok(());
        };
        let current = current.document;
        if !current.awaits_callback() || current.state != document.state {
            return Ok(());
        }
        let Some(url) = current.callback_url.as_deref() else {
            return Ok(());
        };
        let message = self.message(&current);
        if !self
            .sending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(message.key.clone())
        {
            return Ok(());
        }
        let _sending = Sending {
            set: &self.sending,
            id: message.key.clone(),
        };
        let span = trace_span!(
            "callback",
            otel.name = "callback",
            delivery_id = %current.id,
            state = state_name(current.state),
        );
        telemetry::continue_trace(&span, current.traceparent.as_deref());
        let ended = self.send(&current, &message, url).instrument(span).await?;
        self.record(&current.id, current.state, ended).await
    }

    async fn send(
        &self,
        document: &StatusDocument,
        message: &Message,
        url: &str,
    ) -> Result<Ended, BoxError> {
        let id = message.webhook_id.as_str();
        let earlier = document
            .callback
            .as_ref()
            .filter(|outcome| outcome.announced == document.state);
        let mut ended = Ended {
            state: CallbackState::Pending,
            attempts: earlier.map_or(0, |outcome| outcome.attempts),
            last_error: None,
            // Kept in the document, so a restart does not start the retry time over.
            retrying_since: earlier.and_then(|outcome| outcome.retrying_since),
        };
        let url = match Url::parse(url) {
            Ok(url) => url,
            Err(e) => {
                let failure = Failure {
                    reason: "the callbackUrl is not a URL".into(),
                    detail: e.to_string(),
                };
                count("refused");
                log_dead_lettered(
                    document,
                    id,
                    &failure,
                    "A callback was refused for good; it is dead-lettered.",
                );
                self.dead_letter(message, document, url, &failure.reason)
                    .await?;
                return Ok(ended.finish(CallbackState::DeadLettered, Some(failure.reason)));
            }
        };
        let body = Bytes::from(payload(document).to_string());
        // Derived once a message: its retries sign with the same keys.
        let signer = self.masters.signer(document.principal.as_deref());
        let retry_for = time::Duration::try_from(self.settings.retry_for_ms.duration())
            .unwrap_or(time::Duration::MAX);
        let mut recorded: Option<Instant> = None;
        loop {
            ended.attempts += 1;
            let timestamp = OffsetDateTime::now_utc().unix_timestamp();
            let signature = signer.sign(id, timestamp, &body);
            let headers = WebhookHeaders {
                id,
                timestamp,
                signature: &signature,
                traceparent: document.traceparent.as_deref(),
            };
            let started = Instant::now();
            let attempt = self.client.send(&url, &headers, body.clone()).await;
            metrics::global()
                .callback_duration
                .observe(started.elapsed().as_secs_f64());
            let (failure, after) = match attempt {
                Attempt::Delivered { .. } => {
                    count("delivered");
                    return Ok(ended.finish(CallbackState::Delivered, None));
                }
                Attempt::Refused { failure } => {
                    count("refused");
                    log_dead_lettered(
                        document,
                        id,
                        &failure,
                        "A callback was refused for good; it is dead-lettered.",
                    );
                    self.dead_letter(message, document, url.as_str(), &failure.reason)
                        .await?;
                    return Ok(ended.finish(CallbackState::DeadLettered, Some(failure.reason)));
                }
                Attempt::Retry { failure, after } => (failure, after),
            };
            let now = OffsetDateTime::now_utc();
            let since = *ended.retrying_since.get_or_insert(now);
            let wait = wait_before_retry(&self.settings, ended.attempts, after);
            if now + wait > since.saturating_add(retry_for) {
                count("dead_lettered");
                log_dead_lettered(
                    document,
                    id,
                    &failure,
                    "A callback kept failing; it is dead-lettered.",
                );
                let reason = format!(
                    "{} (gave up after {} attempts)",
                    failure.reason, ended.attempts
                );
                self.dead_letter(message, document, url.as_str(), &reason)
                    .await?;
                return Ok(ended.finish(CallbackState::DeadLettered, Some(reason)));
            }
            count("retried");
            tracing::debug!(
                delivery_id = %document.id,
                webhook_id = id,
                reason = failure.reason,
                detail = ?failure.detail,
                ?wait,
                "A callback failed; it is tried again."
            );
            ended.last_error = Some(failure.reason);
            // Pending, its attempts and last error are written at the first
            // failure and then now and again, not at every attempt.
            if recorded.is_none_or(|at| at.elapsed() >= PENDING_RECORD_INTERVAL) {
                recorded = Some(Instant::now());
                self.record(&document.id, document.state, ended.clone())
                    .await?;
            }
            tokio::time::sleep(wait).await;
        }
    }

    async fn dead_letter(
        &self,
        message: &Message,
        document: &StatusDocument,
        url: &str,
        reason: &str,
    ) -> Result<(), BoxError> {
        self.dead_letters
            .put_change(ChangeDeadLetter {
                processor: self.processor.clone(),
                key: message.key.clone(),
                reason: reason.to_owned(),
                payload: json!({
                    "webhookId": message.webhook_id,
                    "callbackUrl": url,
                    "payload": payload(document),
                }),
                at: OffsetDateTime::now_utc(),
            })
            .await?;
        Ok(())
    }

    /// Writes the callback's outcome into the document, unless its state
    /// moved on meanwhile (the new state's callback is announced on its own).
    async fn record(
        &self,
        id: &str,
        announced: DeliveryState,
        ended: Ended,
    ) -> Result<(), BoxError> {
        let delivered_at = (ended.state == CallbackState::Delivered).then(OffsetDateTime::now_utc);
        loop {
            let Some(current) = self.status.get(id).await? else {
                return Ok(());
            };
            if current.document.state != announced {
                return Ok(());
            }
            let mut next = current.document;
            next.callback = Some(CallbackOutcome {
                state: ended.state,
                announced,
                attempts: ended.attempts,
                last_error: ended.last_error.clone(),
                delivered_at,
                retrying_since: ended.retrying_since,
            });
            match self
                .status
                .put(&next, Precondition::IfMatch(current.etag))
                .await
            {
                Ok(_) => return Ok(()),
                Err(StatusStoreError::PreconditionFailed) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
}

/// Logs a callback given up on, once: the detail (which may hold the
/// receiver's text or addresses a name resolved to) escaped, so that it
/// cannot break the line it is on.
fn log_dead_lettered(
    document: &StatusDocument,
    webhook_id: &str,
    failure: &Failure,
    message: &str,
) {
    tracing::warn!(
        delivery_id = %document.id,
        webhook_id,
        reason = failure.reason,
        detail = ?failure.detail,
        "{message}"
    );
}

fn count(outcome: &'static str) {
    metrics::global()
        .callbacks
        .get_or_create(&CallbackLabels { outcome })
        .inc();
}

fn state_name(state: DeliveryState) -> &'static str {
    match state {
        DeliveryState::Accepted => "accepted",
        DeliveryState::Processing => "processing",
        DeliveryState::Scheduled => "scheduled",
        DeliveryState::Failed => "failed",
        DeliveryState::Cancelled => "cancelled",
    }
}

/// The callback's body: the Standard Webhooks envelope around the status
/// (without the callback's own outcome), timestamped with the state's time.
fn payload(document: &StatusDocument) -> serde_json::Value {
    let mut data = document.clone();
    data.callback = None;
    json!({
        "type": format!("delivery.{}", state_name(document.state)),
        "timestamp": document.updated_at.format(&Rfc3339).unwrap_or_default(),
        "data": data,
    })
}

#[async_trait]
impl ChangeHandler for Notifier {
    async fn handle(&self, changes: &[Change]) -> Result<(), BoxError> {
        let mut due = Vec::new();
        for change in changes {
            // Most documents ask for no callback: skip them before decoding.
            if change
                .document
                .get(Self::FIELD)
                .is_none_or(serde_json::Value::is_null)
            {
                continue;
            }
            let document: StatusDocument = serde_json::from_value(change.document.clone())
                .map_err(|e| format!("change {} is not a status document: {e}", change.id))?;
            if document.awaits_callback() {
                due.push(document);
            }
        }
        let results = join_all(due.into_iter().map(|document| self.notify(document))).await;
        results.into_iter().collect::<Result<Vec<()>, BoxError>>()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::io::Write;
    use std::sync::Mutex;

    use axum::Router;
    use axum::http::{HeaderMap, StatusCode};
    use skyport_core::ports::Versioned;
    use skyport_embedded::EmbeddedStore;
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
    async fn a_terminal_status_is_posted_signed_and_its_delivery_recorded() {
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
        let outcome = stored(&store, "d-1").await.callback.unwrap();
        assert_eq!(outcome.state, CallbackState::Delivered);
        assert_eq!(outcome.announced, DeliveryState::Scheduled);
        assert_eq!(outcome.attempts, 1);
        assert!(outcome.delivered_at.is_some());
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
}
