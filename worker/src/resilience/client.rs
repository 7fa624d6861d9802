//! The one HTTP client every step calls its service through.
//!
//! Whether a failure is worth retrying is decided in [`super::classify`] and
//! nowhere else. Transient failures are retried with
//! exponential backoff and full jitter (a `Retry-After` from the service
//! stretches the wait), up to `max_attempts` calls. Each service has a circuit
//! breaker: while it is open, calls wait instead of failing and do not use up
//! attempts, so an outage pauses deliveries rather than failing them.

use std::sync::Arc;
use std::time::Duration;

use crate::metrics::{self, StepErrorLabels, StepLabels};
use bytes::Bytes;
use http_body_util::Full;
use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};
use reqwest::{Method, StatusCode, Url};
use serde_json::Value;
use skyport_core::status::Step;
use skyport_runtime::backoff::Backoff;
use skyport_runtime::config::{ServicesProtocol, ServicesSettings};
use skyport_runtime::error_chain::error_chain;
use skyport_runtime::{telemetry, trace_span};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::breaker::{Admission, Breaker, Breakers};
use super::classify::{Attempt, classify, parse_retry_after};
use super::h2c::H2c;

/// The header every call carries: the delivery and the step it is for.
const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
/// The W3C trace context a call carries.
const TRACEPARENT: HeaderName = HeaderName::from_static(telemetry::TRACEPARENT);

/// An answer's status and headers, and its body or why it could not be read.
type Sent = (StatusCode, HeaderMap, Result<Bytes, String>);

/// One request to a service: method, path segments under the base URL, and a
/// JSON body (`Null` for none).
#[derive(Debug, Clone)]
pub struct Call {
    pub method: Method,
    pub path: Vec<String>,
    pub body: Value,
}

/// Why the client cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("the HTTP client cannot be built")]
    Http(#[from] reqwest::Error),
    #[error("the services' base URL {0} names no host and port")]
    NoHost(Url),
}

/// Why a step did not succeed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StepError {
    /// The service refused the request for good; retrying cannot help.
    #[error("{code}: {message}")]
    Permanent { code: String, message: String },
    /// The worker is giving the event up (shutdown); it will be read again.
    #[error("the call was abandoned")]
    Abandoned,
}

/// How a step's calls ended, and how many there were.
#[derive(Debug)]
pub struct Answer {
    pub result: Result<Value, StepError>,
    pub calls: u32,
}

impl Answer {
    fn abandoned(calls: u32) -> Self {
        Self {
            result: Err(StepError::Abandoned),
            calls,
        }
    }
}

/// How the calls reach the services.
#[derive(Debug, Clone)]
enum Transport {
    /// reqwest's client: HTTP/1.1, a pool of connections.
    Pooled(reqwest::Client),
    /// One HTTP/2 connection with prior knowledge; `timeout` bounds a call.
    H2c { h2c: Arc<H2c>, timeout: Duration },
}

/// The five services behind one base URL, one connection pool (or one
/// HTTP/2 connection).
#[derive(Debug, Clone)]
pub struct ServiceClient {
    transport: Transport,
    base: Url,
    backoff: Backoff,
    max_attempts: u32,
    breakers: Arc<Breakers>,
}

impl ServiceClient {
    /// # Errors
    /// When the HTTP client cannot be built (no TLS backend), or h2c is
    /// asked of a base URL with no host.
    pub fn new(
        base: Url,
        settings: &ServicesSettings,
        breakers: Arc<Breakers>,
    ) -> Result<Self, ClientError> {
        let timeout = settings.timeout_ms.duration();
        let transport = match settings.protocol {
            ServicesProtocol::Auto | ServicesProtocol::Http1 => Transport::Pooled(
                reqwest::Client::builder()
                    .timeout(timeout)
                    .connect_timeout(timeout)
                    .redirect(reqwest::redirect::Policy::none())
                    .pool_idle_timeout(Duration::from_secs(30))
                    .http1_only()
                    .build()?,
            ),
            ServicesProtocol::H2c => {
                let (Some(host), Some(port)) = (base.host_str(), base.port_or_known_default())
                else {
                    return Err(ClientError::NoHost(base));
                };
                Transport::H2c {
                    h2c: Arc::new(H2c::new(
                        format!("{host}:{port}"),
                        timeout,
                        settings.h2c_connections,
                    )),
                    timeout,
                }
            }
        };
        Ok(Self {
            transport,
            base,
            backoff: Backoff::new(
                settings.retry_initial_backoff_ms.duration(),
                settings.retry_max_backoff_ms.duration(),
            ),
            max_attempts: settings.max_attempts,
            breakers,
        })
    }

    /// Calls `step`'s service until it answers for good, counting the calls it took:
    /// the body, [`StepError::Permanent`] when the service refuses, or
    /// [`StepError::Abandoned`] when `abandon` fires first.
    pub async fn call(
        &self,
        step: Step,
        call: &Call,
        idempotency_key: &str,
        traceparent: Option<&str>,
        abandon: &CancellationToken,
    ) -> Answer {
        let url = self.url(&call.path);
        let body = (!call.body.is_null()).then(|| {
            Bytes::from(
                serde_json::to_vec(&call.body)
                    .unwrap_or_else(|e| unreachable!("a JSON value always serializes: {e}")),
            )
        });
        let breaker = self.breakers.get(step);
        let mut calls = 0u32;
        // Probes of an open circuit are the breaker's business and do not use up attempts:
        // a call that happens to probe a long outage again and again must not fail for it.
        let mut attempts = 0u32;
        loop {
            let changes = breaker.changes();
            let admission = breaker.admit(tokio::time::Instant::now());
            if let Admission::Wait(until) = admission {
                tokio::select! {
                    () = abandon.cancelled() => return Answer::abandoned(calls),
                    () = Breaker::wait(changes, until) => continue,
                }
            }
            calls += 1;
            if admission == Admission::Call {
                attempts += 1;
            }
            let attempt = tokio::select! {
                () = abandon.cancelled() => {
                    if admission == Admission::Probe {
                        breaker.release_probe(tokio::time::Instant::now());
                    }
                    return Answer::abandoned(calls);
                }
                attempt = self.attempt(step, call, &url, body.as_ref(), idempotency_key, traceparent) => attempt,
            };
            let transient = matches!(attempt, Attempt::Transient { .. });
            breaker.record(admission, !transient, tokio::time::Instant::now());
            let (reason, retry_after) = match attempt {
                Attempt::Done(value) => {
                    return Answer {
                        result: Ok(value),
                        calls,
                    };
                }
                Attempt::Permanent { code, message } => {
                    return Answer {
                        result: Err(StepError::Permanent { code, message }),
                        calls,
                    };
                }
                Attempt::Transient {
                    reason,
                    retry_after,
                } => (reason, retry_after),
            };
            if attempts >= self.max_attempts {
                metrics::global()
                    .step_errors
                    .get_or_create(&StepErrorLabels {
                        step: step.as_str(),
                        kind: "retries_exhausted",
                    })
                    .inc();
                tracing::warn!(step = step.as_str(), key = idempotency_key, calls, %reason, "Gave up on a step after its last attempt.");
                return Answer {
                    result: Err(StepError::Permanent {
                        code: "RetriesExhausted".into(),
                        message: format!("{calls} calls failed; the last: {reason}"),
                    }),
                    calls,
                };
            }
            let wait = self
                .backoff
                .delay(attempts.saturating_sub(1))
                .max(retry_after.unwrap_or_default());
            tracing::debug!(step = step.as_str(), calls, %reason, wait_ms = wait.as_millis(), "Retrying a transient failure.");
            tokio::select! {
                () = abandon.cancelled() => return Answer::abandoned(calls),
                () = tokio::time::sleep(wait) => {}
            }
        }
    }

    fn url(&self, path: &[String]) -> Url {
        let mut url = self.base.clone();
        if let Ok(mut segments) = url.path_segments_mut() {
            segments.pop_if_empty().extend(path);
        }
        url
    }

    /// One call, in a client span of its own whose `traceparent` it sends
    /// (`traceparent`, the event's, when spans are not exported), timed and
    /// counted by how it ended.
    async fn attempt(
        &self,
        step: Step,
        call: &Call,
        url: &Url,
        body: Option<&Bytes>,
        idempotency_key: &str,
        traceparent: Option<&str>,
    ) -> Attempt {
        let span = trace_span!(
            "call",
            otel.name = %format_args!("{} {}", call.method, call.path.first().map_or("", String::as_str)),
            otel.kind = "client",
            http.request.method = %call.method,
            url.full = %url,
            http.response.status_code = tracing::field::Empty,
        );
        let started = std::time::Instant::now();
        let (attempt, status) = self
            .send(call, url, body, idempotency_key, traceparent)
            .instrument(span.clone())
            .await;
        let metrics = metrics::global();
        let result = match &attempt {
            Attempt::Done(_) => "ok",
            Attempt::Transient { .. } => "transient",
            Attempt::Permanent { .. } => "permanent",
        };
        metrics
            .step_duration
            .get_or_create(&StepLabels {
                step: step.as_str(),
                result,
            })
            .observe(started.elapsed().as_secs_f64());
        if result != "ok" {
            metrics
                .step_errors
                .get_or_create(&StepErrorLabels {
                    step: step.as_str(),
                    kind: result,
                })
                .inc();
        }
        if let Some(status) = status {
            span.record("http.response.status_code", status.as_u16());
            if status == StatusCode::TOO_MANY_REQUESTS {
                skyport_runtime::metrics::global().throttled_by(step.as_str());
            }
        }
        attempt
    }

    /// One call over the transport: the answer classified, and its status
    /// when there was one.
    async fn send(
        &self,
        call: &Call,
        url: &Url,
        body: Option<&Bytes>,
        idempotency_key: &str,
        traceparent: Option<&str>,
    ) -> (Attempt, Option<StatusCode>) {
        let answered = match Self::headers(body.is_some(), idempotency_key, traceparent) {
            Err(reason) => Err(reason),
            Ok(headers) => match &self.transport {
                Transport::Pooled(http) => {
                    let mut request = http
                        .request(call.method.clone(), url.clone())
                        .headers(headers);
                    if let Some(body) = body {
                        request = request.body(body.clone());
                    }
                    Self::send_pooled(request).await
                }
                Transport::H2c { h2c, timeout } => {
                    Self::send_h2c(h2c, *timeout, call, url, headers, body).await
                }
            },
        };
        match answered {
            Ok((status, headers, Ok(bytes))) => {
                let retry_after = headers.get(RETRY_AFTER).and_then(parse_retry_after);
                (classify(status, &bytes, retry_after), Some(status))
            }
            Ok((status, _, Err(reason))) => (
                Attempt::Transient {
                    reason,
                    retry_after: None,
                },
                Some(status),
            ),
            Err(reason) => (
                Attempt::Transient {
                    reason,
                    retry_after: None,
                },
                None,
            ),
        }
    }

    /// The headers of a call: its idempotency key, the body's type when it
    /// has one, and the trace context.
    fn headers(
        has_body: bool,
        idempotency_key: &str,
        traceparent: Option<&str>,
    ) -> Result<HeaderMap, String> {
        let mut headers = HeaderMap::with_capacity(3);
        let value = |text: &str| HeaderValue::from_str(text).map_err(|e| error_chain(&e));
        headers.insert(IDEMPOTENCY_KEY, value(idempotency_key)?);
        if has_body {
            headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        }
        if let Some(traceparent) = telemetry::traceparent_or(traceparent) {
            headers.insert(TRACEPARENT, value(&traceparent)?);
        }
        Ok(headers)
    }

    async fn send_pooled(request: reqwest::RequestBuilder) -> Result<Sent, String> {
        let response = request.send().await.map_err(|e| error_chain(&e))?;
        let status = response.status();
        let headers = response.headers().clone();
        let bytes = response.bytes().await.map_err(|e| error_chain(&e));
        Ok((status, headers, bytes))
    }

    async fn send_h2c(
        h2c: &H2c,
        timeout: Duration,
        call: &Call,
        url: &Url,
        headers: HeaderMap,
        body: Option<&Bytes>,
    ) -> Result<Sent, String> {
        let mut request = hyper::Request::builder()
            .method(call.method.clone())
            .uri(url.as_str())
            .body(Full::new(body.cloned().unwrap_or_default()))
            .map_err(|e| error_chain(&e))?;
        *request.headers_mut() = headers;
        match tokio::time::timeout(timeout, h2c.send(request)).await {
            Ok(Ok(answered)) => Ok((answered.status, answered.headers, Ok(answered.body))),
            Ok(Err(e)) => Err(error_chain(&e)),
            Err(_) => Err(format!(
                "no answer within services.timeout_ms ({} ms)",
                timeout.as_millis()
            )),
        }
    }
}
