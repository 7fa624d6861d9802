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
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use reqwest::header::{CONTENT_TYPE, HeaderValue, LOCATION, RETRY_AFTER, USER_AGENT};
use reqwest::{Response, StatusCode};
use skyport_runtime::backoff::Backoff;
use skyport_runtime::config::CallbackSettings;
use skyport_runtime::destination::AddressPolicy;
use skyport_runtime::error_chain::error_chain;
use skyport_runtime::telemetry;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc2822;
use tokio::sync::Semaphore;
use url::Url;

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

/// A random wait before trying again after `attempt` attempts failed (the
/// first failure is attempt 1): up to `backoff_initial_ms`, doubling with each
/// attempt up to `backoff_max_ms` (full jitter).
pub(crate) fn backoff(settings: &CallbackSettings, attempt: u32) -> Duration {
    Backoff::new(
        settings.backoff_initial_ms.duration(),
        settings.backoff_max_ms.duration(),
    )
    .delay(attempt.saturating_sub(1))
}

/// The wait before trying again after `attempt` attempts failed: the
/// [`backoff`], or longer when the receiver's `Retry-After` asked for longer.
pub(crate) fn wait_before_retry(
    settings: &CallbackSettings,
    attempt: u32,
    retry_after: Option<Duration>,
) -> Duration {
    backoff(settings, attempt).max(retry_after.unwrap_or_default())
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

/// Resolves names as the system does and keeps only the addresses the policy
/// permits, so that the connection can go nowhere else.
#[derive(Debug)]
struct GuardedResolver {
    policy: AddressPolicy,
}

/// A name every address of which the policy refuses.
#[derive(Debug, thiserror::Error)]
#[error("{name} resolves only to addresses callbacks may not reach: {reasons}")]
struct RefusedName {
    name: String,
    reasons: String,
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let policy = self.policy.clone();
        Box::pin(async move {
            let resolved: Vec<SocketAddr> =
                tokio::net::lookup_host((name.as_str(), 0)).await?.collect();
            let mut reasons: Vec<String> = Vec::new();
            let mut permitted = Vec::new();
            for address in resolved {
                match policy.refusal(address.ip()) {
                    None => permitted.push(address),
                    Some(kind) => {
                        let reason = format!("{} is {kind}", address.ip());
                        if !reasons.contains(&reason) {
                            reasons.push(reason);
                        }
                    }
                }
            }
            if permitted.is_empty() && !reasons.is_empty() {
                return Err(RefusedName {
                    name: name.as_str().to_owned(),
                    reasons: reasons.join(", "),
                }
                .into());
            }
            let addresses: Addrs = Box::new(permitted.into_iter());
            Ok(addresses)
        })
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Instant;

    use axum::Router;
    use axum::http::HeaderMap;
    use axum::response::{IntoResponse, Response as AxumResponse};
    use skyport_runtime::config::Millis;
    use time::macros::datetime;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;
    use tokio::task::JoinHandle;
    use tokio_util::sync::CancellationToken;

    use super::*;

    const HEADERS: WebhookHeaders<'static> = WebhookHeaders {
        id: "msg_1",
        timestamp: 1_700_000_000,
        signature: "v1,c2lnbmF0dXJl",
        traceparent: Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
    };

    /// Local receivers are loopback: the tests allow it unless they test refusal.
    fn settings(allow: &[&str], timeout_ms: u64) -> CallbackSettings {
        CallbackSettings {
            allow: allow.iter().map(|&entry| entry.to_owned()).collect(),
            timeout_ms: Millis::new(timeout_ms),
            ..CallbackSettings::default()
        }
    }

    fn client(settings: &CallbackSettings) -> CallbackClient {
        CallbackClient::new(settings, AddressPolicy::new(settings.allowed())).expect("client")
    }

    fn local() -> CallbackClient {
        client(&settings(&["127.0.0.0/8"], 5_000))
    }

    fn url(text: &str) -> Url {
        Url::parse(text).expect("url")
    }

    async fn send(client: &CallbackClient, url: &Url) -> Attempt {
        client
            .send(
                url,
                &HEADERS,
                Bytes::from_static(br#"{"status":"Delivered"}"#),
            )
            .await
    }

    /// A receiver on `bind` that answers every request with `respond` and
    /// keeps what it was sent.
    struct Server {
        address: SocketAddr,
        received: Arc<Mutex<Vec<(HeaderMap, Bytes)>>>,
        stop: CancellationToken,
        task: JoinHandle<()>,
    }

    impl Server {
        /// `None` when `bind` is not available here (no IPv6).
        async fn start<F, Fut>(bind: &str, respond: F) -> Option<Self>
        where
            F: Fn() -> Fut + Clone + Send + Sync + 'static,
            Fut: Future<Output = AxumResponse> + Send + 'static,
        {
            let listener = TcpListener::bind(bind).await.ok()?;
            let address = listener.local_addr().expect("address");
            let received = Arc::new(Mutex::new(Vec::new()));
            let keep = Arc::clone(&received);
            let app = Router::new().fallback(move |headers: HeaderMap, body: Bytes| {
                keep.lock().expect("lock").push((headers, body));
                respond()
            });
            let stop = CancellationToken::new();
            let shutdown = stop.clone().cancelled_owned();
            let task = tokio::spawn(async move {
                axum::serve(listener, app)
                    .with_graceful_shutdown(shutdown)
                    .await
                    .expect("serves");
            });
            Some(Self {
                address,
                received,
                stop,
                task,
            })
        }

        fn url(&self, host: &str) -> Url {
            url(&format!("http://{host}:{}/hook", self.address.port()))
        }

        fn own_url(&self) -> Url {
            url(&format!("http://{}/hook", self.address))
        }

        fn hits(&self) -> usize {
            self.received.lock().expect("lock").len()
        }

        async fn stop(self) {
            self.stop.cancel();
            tokio::time::timeout(Duration::from_secs(5), self.task)
                .await
                .expect("the server stops")
                .expect("the server task ends");
        }
    }

    async fn answering(status: u16) -> Server {
        Server::start("127.0.0.1:0", move || async move {
            StatusCode::from_u16(status)
                .expect("status")
                .into_response()
        })
        .await
        .expect("a local server")
    }

    /// A raw TCP receiver that accepts connections and runs `serve` on each.
    async fn raw<F, Fut>(serve: F) -> (SocketAddr, JoinHandle<()>)
    where
        F: Fn(tokio::net::TcpStream) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address");
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(stream));
            }
        });
        (address, task)
    }

    #[tokio::test]
    async fn a_2xx_is_delivered_with_the_webhook_headers() {
        let server = answering(200).await;
        assert_eq!(
            send(&local(), &server.own_url()).await,
            Attempt::Delivered { status: 200 }
        );
        {
            let received = server.received.lock().expect("lock");
            let (headers, body) = &received[0];
            let header = |name: &str| headers.get(name).expect(name).to_str().expect(name);
            assert_eq!(header("webhook-id"), "msg_1");
            assert_eq!(header("webhook-timestamp"), "1700000000");
            assert_eq!(header("webhook-signature"), "v1,c2lnbmF0dXJl");
            assert_eq!(header("traceparent"), HEADERS.traceparent.expect("set"));
            assert_eq!(header("content-type"), "application/json");
            assert!(header("user-agent").starts_with("skyport-callbacks/"));
            assert_eq!(&body[..], br#"{"status":"Delivered"}"#);
        }
        server.stop().await;
    }

    #[tokio::test]
    async fn a_503_is_retried_when_the_receiver_says() {
        let server = Server::start("127.0.0.1:0", || async {
            (
                StatusCode::SERVICE_UNAVAILABLE,
                [(RETRY_AFTER, "2")],
                "  down for maintenance ",
            )
                .into_response()
        })
        .await
        .expect("a local server");
        assert_eq!(
            send(&local(), &server.own_url()).await,
            Attempt::Retry {
                failure: Failure::new(
                    "the receiver answered 503",
                    "503 Service Unavailable: down for maintenance"
                ),
                after: Some(Duration::from_secs(2)),
            }
        );
        server.stop().await;
    }

    #[tokio::test]
    async fn throttling_and_request_timeouts_are_retried_other_4xx_refused() {
        for (status, retried) in [
            (429, true),
            (408, true),
            (500, true),
            (404, false),
            (400, false),
        ] {
            let server = answering(status).await;
            let attempt = send(&local(), &server.own_url()).await;
            assert_eq!(
                matches!(attempt, Attempt::Retry { .. }),
                retried,
                "{status}: {attempt:?}"
            );
            if !retried {
                assert_eq!(
                    attempt,
                    Attempt::Refused {
                        failure: Failure::new(
                            format!("the receiver answered {status}"),
                            StatusCode::from_u16(status).expect("status").to_string()
                        )
                    }
                );
            }
            server.stop().await;
        }
    }

    #[tokio::test]
    async fn redirects_are_refused_and_not_followed() {
        let target = answering(200).await;
        for location in [
            target.own_url().to_string(),
            "http://169.254.169.254/".into(),
        ] {
            let redirect = location.clone();
            let server = Server::start("127.0.0.1:0", move || {
                let redirect = redirect.clone();
                async move { (StatusCode::FOUND, [(LOCATION, redirect)]).into_response() }
            })
            .await
            .expect("a local server");
            assert_eq!(
                send(&local(), &server.own_url()).await,
                Attempt::Refused {
                    failure: Failure::new(
                        "the receiver redirected (callbacks do not follow redirects)",
                        format!("302 Found: redirects are not followed: Location {location}")
                    )
                }
            );
            server.stop().await;
        }
        assert_eq!(target.hits(), 0, "the redirect's target was contacted");
        target.stop().await;
    }

    #[tokio::test]
    async fn a_receiver_that_never_answers_times_out_and_is_retried() {
        let (address, task) = raw(|mut stream| async move {
            let mut request = [0u8; 1024];
            let _ = stream.read(&mut request).await;
            // Holds the connection open without answering.
            std::future::pending::<()>().await;
        })
        .await;
        let client = client(&settings(&["127.0.0.0/8"], 300));
        let started = Instant::now();
        let attempt = send(&client, &url(&format!("http://{address}/hook"))).await;
        let took = started.elapsed();
        assert!(
            matches!(&attempt, Attempt::Retry { failure, after: None }
                if failure.reason == "the receiver did not answer within 300 ms"),
            "{attempt:?}"
        );
        assert!(
            took >= Duration::from_millis(250) && took < Duration::from_secs(2),
            "{took:?}"
        );
        task.abort();
    }

    #[tokio::test]
    async fn refused_literal_addresses_are_never_contacted() {
        let v4 = answering(200).await;
        let v6 = Server::start("[::1]:0", || async { StatusCode::OK.into_response() }).await;
        let mut urls = vec![
            url("http://10.0.0.1/hook"),
            url("http://169.254.169.254/latest/meta-data"),
            url("http://[::ffff:169.254.169.254]/"),
            v4.own_url(),
        ];
        urls.extend(v6.as_ref().map(Server::own_url));
        // No allow-list, and a timeout a connection attempt would run into.
        let client = client(&settings(&[], 5_000));
        for url in urls {
            let started = Instant::now();
            let attempt = send(&client, &url).await;
            assert!(
                matches!(&attempt, Attempt::Refused { failure }
                    if failure.reason == NOT_ALLOWED && failure.detail.contains("callbacks may not reach")),
                "{url}: {attempt:?}"
            );
            assert!(started.elapsed() < Duration::from_secs(1), "{url}");
        }
        assert_eq!(v4.hits(), 0);
        v4.stop().await;
        if let Some(v6) = v6 {
            assert_eq!(v6.hits(), 0);
            v6.stop().await;
        }
    }

    #[tokio::test]
    async fn only_http_and_https_are_sent() {
        for text in ["ftp://example.com/hook", "file:///etc/passwd"] {
            let attempt = send(&local(), &url(text)).await;
            assert!(
                matches!(attempt, Attempt::Refused { .. }),
                "{text}: {attempt:?}"
            );
        }
    }

    #[tokio::test]
    async fn a_name_is_refused_unless_the_allow_list_admits_its_addresses() {
        let server = answering(204).await;
        let url = server.url("localhost");
        let attempt = send(&client(&settings(&[], 5_000)), &url).await;
        // The detail names the name and what it resolved to; the reason, which
        // the client reads, neither.
        assert!(
            matches!(&attempt, Attempt::Refused { failure }
                if failure.reason == NOT_ALLOWED
                    && failure.detail.starts_with("localhost resolves only to addresses callbacks may not reach")
                    && failure.detail.contains("127.0.0.1 is loopback")),
            "{attempt:?}"
        );
        assert_eq!(server.hits(), 0);
        assert_eq!(
            send(&local(), &url).await,
            Attempt::Delivered { status: 204 }
        );
        assert_eq!(server.hits(), 1);
        server.stop().await;
    }

    #[tokio::test]
    async fn a_refused_connection_is_retried_with_a_generic_reason() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address");
        drop(listener);
        let attempt = send(&local(), &url(&format!("http://{address}/hook"))).await;
        assert!(
            matches!(&attempt, Attempt::Retry { failure, after: None }
                if failure.reason == CONNECTION_FAILED && !failure.detail.is_empty()),
            "{attempt:?}"
        );
    }

    /// The ranges the review of 2026-11-28 found open, each as a literal.
    const NEWLY_REFUSED: [&str; 13] = [
        "168.63.129.16",
        "192.0.0.8",
        "198.18.0.1",
        "198.19.1.1",
        "192.0.2.1",
        "198.51.100.1",
        "203.0.113.1",
        "2001:db8::1",
        "2001:0:4136:e378:8000:63bf:3fff:fdd2",
        "64:ff9b::a00:1",
        "64:ff9b::a83f:8110",
        "64:ff9b:1::a9fe:a9fe",
        "2002:a00:1::1",
    ];

    #[tokio::test]
    async fn the_newly_refused_ranges_are_refused_as_literals_before_sending() {
        let client = client(&settings(&[], 5_000));
        for text in NEWLY_REFUSED {
            let host = if text.contains(':') {
                format!("[{text}]")
            } else {
                text.to_owned()
            };
            let started = Instant::now();
            let attempt = send(&client, &url(&format!("http://{host}/hook"))).await;
            assert!(
                matches!(&attempt, Attempt::Refused { failure }
                    if failure.reason == NOT_ALLOWED && failure.detail.contains("callbacks may not reach")),
                "{text}: {attempt:?}"
            );
            assert!(started.elapsed() < Duration::from_secs(1), "{text}");
        }
    }

    /// The resolver judges every address the system's lookup answers (here
    /// each range written out, which the lookup answers as itself).
    #[tokio::test]
    async fn the_newly_refused_ranges_are_refused_where_names_resolve() {
        let resolver = GuardedResolver {
            policy: AddressPolicy::default(),
        };
        for text in NEWLY_REFUSED {
            let name: Name = text.parse().expect("a name");
            let Err(error) = resolver.resolve(name).await else {
                panic!("{text} resolved to an address callbacks may reach");
            };
            let refused = error.downcast_ref::<RefusedName>().expect("refused");
            let shown = text
                .parse::<std::net::IpAddr>()
                .expect("an address")
                .to_string();
            assert!(refused.reasons.starts_with(&shown), "{text}: {refused}");
        }
        let public: Name = "93.184.215.14".parse().expect("a name");
        let addresses: Vec<SocketAddr> = resolver
            .resolve(public)
            .await
            .expect("a public address passes")
            .collect();
        assert_eq!(addresses.len(), 1);
    }

    /// A receiver that takes `delay` to answer and counts the requests it
    /// serves at once: (the server, the most at once).
    async fn slow(delay: Duration) -> (Server, Arc<AtomicUsize>) {
        let current = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let (now, max) = (Arc::clone(&current), Arc::clone(&most));
        let server = Server::start("127.0.0.1:0", move || {
            let (now, max) = (Arc::clone(&now), Arc::clone(&max));
            async move {
                let at_once = now.fetch_add(1, Ordering::SeqCst) + 1;
                max.fetch_max(at_once, Ordering::SeqCst);
                tokio::time::sleep(delay).await;
                now.fetch_sub(1, Ordering::SeqCst);
                StatusCode::OK.into_response()
            }
        })
        .await
        .expect("a local server");
        (server, most)
    }

    #[tokio::test]
    async fn one_destination_is_limited_without_holding_others_up() {
        let delay = Duration::from_millis(300);
        let (busy, busy_most) = slow(delay).await;
        let (other, _) = slow(delay).await;
        let client = client(&CallbackSettings {
            per_destination: 1,
            max_in_flight: 8,
            ..settings(&["127.0.0.0/8"], 5_000)
        });
        let started = Instant::now();
        let timed = |url: Url| {
            let client = &client;
            async move {
                let attempt = send(client, &url).await;
                (attempt, started.elapsed())
            }
        };
        let (first, second, elsewhere) = tokio::join!(
            timed(busy.own_url()),
            timed(busy.own_url()),
            timed(other.own_url()),
        );
        for (attempt, _) in [&first, &second, &elsewhere] {
            assert_eq!(*attempt, Attempt::Delivered { status: 200 });
        }
        assert_eq!(busy.hits(), 2);
        assert_eq!(busy_most.load(Ordering::SeqCst), 1);
        assert!(first.1.max(second.1) >= delay * 2, "{first:?} {second:?}");
        assert!(elsewhere.1 < delay * 2, "{elsewhere:?}");
        busy.stop().await;
        other.stop().await;
    }

    #[tokio::test]
    async fn the_overall_limit_holds_across_destinations() {
        let delay = Duration::from_millis(300);
        let (one, _) = slow(delay).await;
        let (two, _) = slow(delay).await;
        let client = client(&CallbackSettings {
            max_in_flight: 1,
            ..settings(&["127.0.0.0/8"], 5_000)
        });
        let started = Instant::now();
        let (one_url, two_url) = (one.own_url(), two.own_url());
        let (a, b) = tokio::join!(send(&client, &one_url), send(&client, &two_url));
        assert_eq!((a.clone(), b), (Attempt::Delivered { status: 200 }, a));
        assert!(started.elapsed() >= delay * 2);
        one.stop().await;
        two.stop().await;
    }

    #[tokio::test]
    async fn idle_destinations_are_forgotten() {
        let client = local();
        let held = client.destination(Destination::of(&url("http://held.example/")).expect("host"));
        for n in 0..DESTINATIONS_KEPT + 10 {
            drop(client.destination(
                Destination::of(&url(&format!("http://h{n}.example/"))).expect("host"),
            ));
        }
        let destinations = client.destinations.lock().expect("lock");
        assert!(
            destinations.len() <= DESTINATIONS_KEPT,
            "{}",
            destinations.len()
        );
        assert!(
            destinations
                .values()
                .any(|semaphore| Arc::ptr_eq(semaphore, &held))
        );
    }

    #[tokio::test]
    async fn only_the_start_of_a_long_answer_is_read() {
        // An answer that claims a gigabyte and keeps sending until the client hangs up.
        let (address, task) = raw(|mut stream| async move {
            let mut request = [0u8; 4096];
            let _ = stream.read(&mut request).await;
            let head = "HTTP/1.1 500 Internal Server Error\r\ncontent-length: 1000000000\r\n\r\n";
            if stream.write_all(head.as_bytes()).await.is_err() {
                return;
            }
            let chunk = vec![b'x'; 16 * 1024];
            while stream.write_all(&chunk).await.is_ok() {}
        })
        .await;
        let client = client(&CallbackSettings {
            max_response_bytes: 1024,
            ..settings(&["127.0.0.0/8"], 10_000)
        });
        let started = Instant::now();
        let attempt = send(&client, &url(&format!("http://{address}/hook"))).await;
        assert!(started.elapsed() < Duration::from_secs(2));
        assert_eq!(
            attempt,
            Attempt::Retry {
                failure: Failure::new(
                    "the receiver answered 500",
                    format!(
                        "500 Internal Server Error: {}",
                        "x".repeat(ERROR_TEXT_CHARS)
                    )
                ),
                after: None,
            }
        );
        task.abort();
    }

    #[test]
    fn retry_after_is_seconds_or_an_http_date() {
        let now = datetime!(1994-11-06 08:48:37 UTC);
        let parse = |text: &'static str| retry_after(&HeaderValue::from_static(text), now);
        assert_eq!(parse("120"), Some(Duration::from_secs(120)));
        assert_eq!(
            parse("Sun, 06 Nov 1994 08:49:37 GMT"),
            Some(Duration::from_secs(60))
        );
        assert_eq!(parse("Sun, 06 Nov 1994 08:40:00 GMT"), None);
        assert_eq!(parse("soon"), None);
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
}
