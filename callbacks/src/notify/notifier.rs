//! The notifier: a [`ChangeHandler`] of the change-feed processor that POSTs
//! each delivery's terminal status (Scheduled, Failed, Cancelled) to its
//! `callbackUrl`, signed as Standard Webhooks specifies, and records in the
//! status document a callback that is retried: Pending, then Delivered or
//! DeadLettered. A callback delivered at its first attempt writes nothing
//! back: on Cosmos DB that write and its read cost more than the terminal
//! write that announced it.
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
use skyport_runtime::backoff::Backoff;
use skyport_runtime::config::CallbackSettings;
use skyport_runtime::destination::AddressPolicy;
use skyport_runtime::{telemetry, trace_span};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use tracing::Instrument;
use url::Url;

use super::client::{Attempt, CallbackClient, Failure, WebhookHeaders};
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
    /// Whether the document holds an outcome of this message: written
    /// before (a restart, a resend) or while it was retried.
    on_document: bool,
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
        if ended.state == CallbackState::Delivered && !ended.on_document {
            return Ok(());
        }
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
            on_document: earlier.is_some(),
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
                ended.on_document = true;
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
        DeliveryState::Waiting => "waiting",
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

/// A random wait before trying again after `attempt` attempts failed (the
/// first failure is attempt 1): up to `backoff_initial_ms`, doubling with each
/// attempt up to `backoff_max_ms` (full jitter).
fn backoff(settings: &CallbackSettings, attempt: u32) -> Duration {
    Backoff::new(
        settings.backoff_initial_ms.duration(),
        settings.backoff_max_ms.duration(),
    )
    .delay(attempt.saturating_sub(1))
}

/// The wait before trying again after `attempt` attempts failed: the
/// [`backoff`], or longer when the receiver's `Retry-After` asked for longer.
fn wait_before_retry(
    settings: &CallbackSettings,
    attempt: u32,
    retry_after: Option<Duration>,
) -> Duration {
    backoff(settings, attempt).max(retry_after.unwrap_or_default())
}

#[cfg(test)]
mod tests;
