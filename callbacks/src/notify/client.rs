//! One guarded POST of a callback to the URL a client gave us.
//!
//! The URL is the client's choice, so the request must not become a way into
//! our network: only http and https, no redirects followed, and no connection
//! to an address the [`AddressPolicy`] refuses (loopback, private, link-local
//! such as the cloud metadata service, …). A literal address is checked before
//! anything is sent; a name is checked where it is resolved, and the
//! connection goes only to the addresses that passed, so a name cannot change
//! its answer between the check and the connection.
//!
//! Each answer is sorted once: delivered (2xx), worth retrying (5xx, 408, 429,
//! timeouts, connection errors; `Retry-After` honoured) or refused for good
//! (any other answer, a redirect, a refused address). A failure has two
//! texts: a generic reason the client reads in its status (never an address a
//! name resolved to, nor what the receiver answered, so the status is no
//! oracle into our network), and the detail, for the log only. Only the first
//! `max_response_bytes` of an answer are read, and callbacks in flight are
//! limited per destination and in all, so that one slow receiver cannot hold
//! every callback up.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use reqwest::header::{CONTENT_TYPE, HeaderValue, LOCATION, RETRY_AFTER, USER_AGENT};
use reqwest::{Response, StatusCode};
use skyport_runtime::config::CallbackSettings;
use skyport_runtime::destination::AddressPolicy;
use skyport_runtime::error_chain::error_chain;
use skyport_runtime::telemetry;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc2822;
use tokio::sync::Semaphore;
use url::Url;

use super::resolver::{GuardedResolver, RefusedName};

/// The `User-Agent` of every callback.
const AGENT: &str = concat!("skyport-callbacks/", env!("CARGO_PKG_VERSION"));

/// How much of a receiver's answer goes into a failure's detail.
const ERROR_TEXT_CHARS: usize = 200;

/// The reason of a destination the address policy refuses.
pub(crate) const NOT_ALLOWED: &str = "the destination is not allowed";
/// The reason of a request that got no answer, for want of a connection or
/// because it broke off.
const CONNECTION_FAILED: &str = "the connection failed";

/// Destinations whose limits are kept before the idle ones are forgotten.
const DESTINATIONS_KEPT: usize = 1024;

/// The Standard Webhooks headers of one callback, and its trace.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WebhookHeaders<'a> {
    /// `webhook-id`: the same on every attempt of one callback.
    pub(crate) id: &'a str,
    /// `webhook-timestamp`: Unix seconds, as signed.
    pub(crate) timestamp: i64,
    /// `webhook-signature`, from [`super::sign::Signer::sign`].
    pub(crate) signature: &'a str,
    /// The delivery's `traceparent`, if it has one.
    pub(crate) traceparent: Option<&'a str>,
}

/// How one POST ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Attempt {
    /// The receiver answered 2xx.
    Delivered { status: u16 },
    /// Worth trying again, not before `after` when the receiver said so.
    Retry {
        failure: Failure,
        after: Option<Duration>,
    },
    /// Trying again cannot help; nothing was sent when the address was refused.
    Refused { failure: Failure },
}

/// Why a POST did not deliver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Failure {
    /// A generic reason, for the status document's `lastError`: what the
    /// client may know (a status code, a time limit), nothing of our
    /// network or of the receiver's answer.
    pub(crate) reason: String,
    /// Everything known, for the log only: it may hold resolved addresses
    /// and the receiver's own text, so it is logged escaped (`?detail`).
    pub(crate) detail: String,
}

impl Failure {
    fn new(reason: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            reason: reason.into(),
            detail: detail.into(),
        }
    }
}

/// Sends callbacks, within the address policy and the concurrency limits.
#[derive(Debug)]
pub(crate) struct CallbackClient {
    http: reqwest::Client,
    policy: AddressPolicy,
    /// `callbacks.timeout_ms`, named in the reason of a time-out.
    timeout: Duration,
    max_response_bytes: usize,
    per_destination: usize,
    destinations: Mutex<HashMap<Destination, Arc<Semaphore>>>,
    in_flight: Semaphore,
}

/// Where a callback goes, as its concurrency limit counts it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Destination {
    scheme: String,
    host: String,
    port: u16,
}

impl Destination {
    fn of(url: &Url) -> Option<Self> {
        Some(Self {
            scheme: url.scheme().to_owned(),
            host: url.host_str()?.to_owned(),
            port: url.port_or_known_default()?,
        })
    }
}

impl CallbackClient {
    /// # Errors
    /// When the HTTP client cannot be built (no TLS backend).
    pub(crate) fn new(
        settings: &CallbackSettings,
        policy: AddressPolicy,
    ) -> Result<Self, reqwest::Error> {
        let http = reqwest::Client::builder()
            .timeout(settings.timeout_ms.duration())
            .connect_timeout(settings.timeout_ms.duration())
            .redirect(reqwest::redirect::Policy::none())
            // A proxy would resolve the name itself, past the address check.
            .no_proxy()
            .dns_resolver(GuardedResolver {
                policy: policy.clone(),
            })
            .pool_idle_timeout(Duration::from_secs(30))
            .build()?;
        Ok(Self {
            http,
            policy,
            timeout: settings.timeout_ms.duration(),
            max_response_bytes: settings.max_response_bytes,
            per_destination: settings.per_destination,
            destinations: Mutex::new(HashMap::new()),
            in_flight: Semaphore::new(settings.max_in_flight),
        })
    }

    /// POSTs `body` to `url` once, waiting first for room under the
    /// destination's limit and then under the overall one.
    pub(crate) async fn send(
        &self,
        url: &Url,
        headers: &WebhookHeaders<'_>,
        body: Bytes,
    ) -> Attempt {
        if !matches!(url.scheme(), "http" | "https") {
            return Attempt::Refused {
                failure: Failure::new(
                    "the callbackUrl is not an http or https URL",
                    format!("{}: callbacks go over http or https only", url.scheme()),
                ),
            };
        }
        if let Some(detail) = self.policy.literal_refusal(url) {
            return Attempt::Refused {
                failure: Failure::new(NOT_ALLOWED, detail),
            };
        }
        let Some(destination) = Destination::of(url) else {
            return Attempt::Refused {
                failure: Failure::new(
                    "the callbackUrl names no host",
                    format!("{url} names no host"),
                ),
            };
        };
        // The destination's permit first: callbacks queued behind one slow
        // receiver must not hold places that other receivers could use.
        let destination = self.destination(destination);
        let _destination = destination
            .acquire()
            .await
            .unwrap_or_else(|e| unreachable!("the semaphore is never closed: {e}"));
        let _in_flight = self
            .in_flight
            .acquire()
            .await
            .unwrap_or_else(|e| unreachable!("the semaphore is never closed: {e}"));
        self.post(url, headers, body).await
    }

    /// The limit of `destination`, made on first use; when many are kept,
    /// those no one holds or waits for are forgotten.
    fn destination(&self, destination: Destination) -> Arc<Semaphore> {
        let mut destinations = self
            .destinations
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if destinations.len() >= DESTINATIONS_KEPT && !destinations.contains_key(&destination) {
            // Every sender holds a clone while it waits or sends: a count of one is idle.
            destinations.retain(|_, semaphore| Arc::strong_count(semaphore) > 1);
        }
        Arc::clone(
            destinations
                .entry(destination)
                .or_insert_with(|| Arc::new(Semaphore::new(self.per_destination))),
        )
    }

    async fn post(&self, url: &Url, headers: &WebhookHeaders<'_>, body: Bytes) -> Attempt {
        let mut request = self
            .http
            .post(url.clone())
            .header(CONTENT_TYPE, "application/json")
            .header(USER_AGENT, AGENT)
            .header("webhook-id", headers.id)
            .header("webhook-timestamp", headers.timestamp.to_string())
            .header("webhook-signature", headers.signature)
            .body(body);
        if let Some(traceparent) = telemetry::traceparent_or(headers.traceparent) {
            request = request.header(telemetry::TRACEPARENT, traceparent);
        }
        let mut response = match request.send().await {
            Ok(response) => response,
            Err(e) => return self.failed(&e),
        };
        let status = response.status();
        if status.is_success() {
            // Read (within the limit) so that the connection can be used again.
            read_prefix(&mut response, self.max_response_bytes).await;
            return Attempt::Delivered {
                status: status.as_u16(),
            };
        }
        if status.is_redirection() {
            let location = response
                .headers()
                .get(LOCATION)
                .map_or("(none)".into(), |value| {
                    String::from_utf8_lossy(value.as_bytes()).into_owned()
                });
            return Attempt::Refused {
                failure: Failure::new(
                    "the receiver redirected (callbacks do not follow redirects)",
                    format!("{status}: redirects are not followed: Location {location}"),
                ),
            };
        }
        let after = response
            .headers()
            .get(RETRY_AFTER)
            .and_then(|value| retry_after(value, OffsetDateTime::now_utc()));
        let text = read_prefix(&mut response, self.max_response_bytes).await;
        let failure = Failure::new(
            format!("the receiver answered {}", status.as_u16()),
            describe(status, &text),
        );
        if status.is_server_error()
            || status == StatusCode::REQUEST_TIMEOUT
            || status == StatusCode::TOO_MANY_REQUESTS
        {
            Attempt::Retry { failure, after }
        } else {
            Attempt::Refused { failure }
        }
    }

    /// A request that got no answer: refused when the address was, or when
    /// the request could not even be built; worth retrying otherwise.
    fn failed(&self, error: &reqwest::Error) -> Attempt {
        let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
        while let Some(cause) = source {
            if let Some(refused) = cause.downcast_ref::<RefusedName>() {
                return Attempt::Refused {
                    failure: Failure::new(NOT_ALLOWED, refused.to_string()),
                };
            }
            source = cause.source();
        }
        let detail = error_chain(error);
        if error.is_builder() {
            return Attempt::Refused {
                failure: Failure::new("the callbackUrl cannot be requested", detail),
            };
        }
        let reason = if error.is_timeout() {
            format!(
                "the receiver did not answer within {} ms",
                self.timeout.as_millis()
            )
        } else {
            CONNECTION_FAILED.to_owned()
        };
        Attempt::Retry {
            failure: Failure::new(reason, detail),
            after: None,
        }
    }
}

/// The first `limit` bytes of the answer's body, or fewer when it is shorter
/// or breaks off; nothing more is read.
async fn read_prefix(response: &mut Response, limit: usize) -> Vec<u8> {
    let mut body = Vec::new();
    while body.len() < limit {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                let take = chunk.len().min(limit - body.len());
                body.extend_from_slice(&chunk[..take]);
            }
            Ok(None) | Err(_) => break,
        }
    }
    body
}

/// `503 Service Unavailable: <the start of what the receiver said>`.
fn describe(status: StatusCode, body: &[u8]) -> String {
    let text: String = String::from_utf8_lossy(body)
        .trim()
        .chars()
        .take(ERROR_TEXT_CHARS)
        .collect();
    if text.is_empty() {
        status.to_string()
    } else {
        format!("{status}: {text}")
    }
}

/// `Retry-After` as seconds or as an HTTP date (none when that has passed).
fn retry_after(value: &HeaderValue, now: OffsetDateTime) -> Option<Duration> {
    let text = value.to_str().ok()?.trim();
    if let Ok(seconds) = text.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = OffsetDateTime::parse(text, &Rfc2822).ok()?;
    Duration::try_from(at - now).ok()
}

#[cfg(test)]
mod tests;
