//! The notifier: a [`ChangeHandler`] of the change-feed processor that POSTs
//! each delivery's terminal status (Scheduled, Failed, Cancelled) to its
//! `callbackUrl`, signed as Standard Webhooks specifies, and records the
//! outcome in the status document.
//!
//! A message's id is `msg_{delivery id}_{state}`: stable per delivery and
//! state, so a receiver drops the duplicates at-least-once delivery brings.
//! The body is `{type: "delivery.{state}", timestamp, data: status}`, the
//! same bytes on every attempt; each attempt is signed with its own
//! timestamp. Retryable failures (5xx, 408, 429, timeouts, connection
//! errors) are retried with backoff and jitter for `callbacks.retry_for_ms`;
//! then, or at once for a permanent one (another 4xx, a redirect, a refused
//! address), the callback is dead-lettered and the document says so.
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

use super::client::{Attempt, CallbackClient, WebhookHeaders, wait_before_retry};
use super::sign::Signer;
use crate::change_feed::ChangeHandler;

/// Sends the callbacks of terminal statuses.
pub struct Notifier {
    status: Arc<dyn StatusStore>,
    dead_letters: Arc<dyn DeadLetterStore>,
    client: CallbackClient,
    signer: Signer,
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

impl Notifier {
    /// A notifier signing with `keys` (each a decoded `whsec_` secret).
    ///
    /// # Errors
    /// When the HTTP client cannot be built.
    pub fn new(
        status: Arc<dyn StatusStore>,
        dead_letters: Arc<dyn DeadLetterStore>,
        settings: &CallbackSettings,
        policy: AddressPolicy,
        keys: &[Vec<u8>],
        processor: &str,
    ) -> Result<Self, reqwest::Error> {
        // The callbacks' series are exposed from the notifier's start, at 0.
        metrics::global();
        Ok(Self {
            status,
            dead_letters,
            client: CallbackClient::new(settings, policy)?,
            signer: Signer::new(keys),
            settings: settings.clone(),
            processor: processor.to_owned(),
            sending: Mutex::new(HashSet::new()),
        })
    }

    /// The field of a status document the notifier acts on: a processor
    /// may pass over documents without it.
    pub const FIELD: &'static str = "callbackUrl";

    /// The callback's message id: stable per delivery and announced state.
    pub fn message_id(delivery_id: &str, state: DeliveryState) -> String {
        format!("msg_{delivery_id}_{}", state_name(state))
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
        let id = Self::message_id(&current.id, current.state);
        if !self
            .sending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id.clone())
        {
            return Ok(());
        }
        let _sending = Sending {
            set: &self.sending,
            id,
        };
        let span = trace_span!(
            "callback",
            otel.name = "callback",
            delivery_id = %current.id,
            state = state_name(current.state),
        );
        telemetry::continue_trace(&span, current.traceparent.as_deref());
        let ended = self.send(&current, url).instrument(span).await?;
        self.record(&current.id, current.state, ended).await
    }

    async fn send(&self, document: &StatusDocument, url: &str) -> Result<Ended, BoxError> {
        let id = Self::message_id(&document.id, document.state);
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
                let error = format!("the callbackUrl is not a URL: {e}");
                self.dead_letter(&id, document, url, &error).await?;
                return Ok(ended.finish(CallbackState::DeadLettered, Some(error)));
            }
        };
        let body = Bytes::from(payload(document).to_string());
        let retry_for = time::Duration::try_from(self.settings.retry_for_ms.duration())
            .unwrap_or(time::Duration::MAX);
        let mut recorded: Option<Instant> = None;
        loop {
            ended.attempts += 1;
            let timestamp = OffsetDateTime::now_utc().unix_timestamp();
            let signature = self.signer.sign(&id, timestamp, &body);
            let headers = WebhookHeaders {
                id: &id,
                timestamp,
                signature: &signature,
                traceparent: document.traceparent.as_deref(),
            };
            let started = Instant::now();
            let attempt = self.client.send(&url, &headers, body.clone()).await;
            metrics::global()
                .callback_duration
                .observe(started.elapsed().as_secs_f64());
            let (error, after) = match attempt {
                Attempt::Delivered { .. } => {
                    count("delivered");
                    return Ok(ended.finish(CallbackState::Delivered, None));
                }
                Attempt::Refused { error } => {
                    count("refused");
                    tracing::warn!(delivery_id = %document.id, %error, "A callback was refused for good; it is dead-lettered.");
                    self.dead_letter(&id, document, url.as_str(), &error)
                        .await?;
                    return Ok(ended.finish(CallbackState::DeadLettered, Some(error)));
                }
                Attempt::Retry { error, after } => (error, after),
            };
            let now = OffsetDateTime::now_utc();
            let since = *ended.retrying_since.get_or_insert(now);
            let wait = wait_before_retry(&self.settings, ended.attempts, after);
            if now + wait > since.saturating_add(retry_for) {
                count("dead_lettered");
                let error = format!("{error} (gave up after {} attempts)", ended.attempts);
                tracing::warn!(delivery_id = %document.id, %error, "A callback kept failing; it is dead-lettered.");
                self.dead_letter(&id, document, url.as_str(), &error)
                    .await?;
                return Ok(ended.finish(CallbackState::DeadLettered, Some(error)));
            }
            count("retried");
            tracing::debug!(delivery_id = %document.id, %error, ?wait, "A callback failed; it is tried again.");
            ended.last_error = Some(error);
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
        id: &str,
        document: &StatusDocument,
        url: &str,
        error: &str,
    ) -> Result<(), BoxError> {
        self.dead_letters
            .put_change(ChangeDeadLetter {
                processor: self.processor.clone(),
                key: id.to_owned(),
                reason: error.to_owned(),
                payload: json!({
                    "webhookId": id,
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

    use std::sync::Mutex;

    use axum::Router;
    use axum::http::{HeaderMap, StatusCode};
    use skyport_core::ports::Versioned;
    use skyport_embedded::EmbeddedStore;
    use tokio::net::TcpListener;

    use super::*;
    use crate::change_feed::fixture::Fixture;

    const KEY: &[u8] = b"a test key of the notifier";

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
            &[KEY.to_vec()],
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

    /// A local receiver answering 204, keeping what it was sent.
    async fn receiver() -> (String, Arc<Mutex<Vec<(HeaderMap, Bytes)>>>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let received = Arc::new(Mutex::new(Vec::new()));
        let keep = Arc::clone(&received);
        let app = Router::new().fallback(move |headers: HeaderMap, body: Bytes| {
            keep.lock().unwrap().push((headers, body));
            async { StatusCode::NO_CONTENT }
        });
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (format!("http://{address}/hook"), received)
    }

    #[test]
    fn the_message_id_is_stable_per_delivery_and_state() {
        assert_eq!(
            Notifier::message_id("d-1", DeliveryState::Scheduled),
            "msg_d-1_scheduled"
        );
        assert_ne!(
            Notifier::message_id("d-1", DeliveryState::Failed),
            Notifier::message_id("d-1", DeliveryState::Cancelled)
        );
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
        assert_eq!(header("webhook-id"), "msg_d-1_scheduled");
        let timestamp: i64 = header("webhook-timestamp").parse().unwrap();
        assert_eq!(
            header("webhook-signature"),
            Signer::new(&[KEY.to_vec()]).sign("msg_d-1_scheduled", timestamp, &body)
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
        let letters = store.changes("test-processor", None, 100).await.unwrap();
        assert_eq!(letters.len(), 1);
        assert_eq!(letters[0].key, "msg_d-1_failed");
        assert_eq!(letters[0].payload["callbackUrl"], url.as_str());
    }
}
