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

use reqwest::header::{CONTENT_TYPE, RETRY_AFTER};
use reqwest::{Method, StatusCode, Url};
use serde_json::Value;
use skyport_core::status::Step;
use skyport_runtime::config::{ServicesProtocol, ServicesSettings};
use skyport_runtime::metrics::{self, StepErrorLabels, StepLabels};
use skyport_runtime::{telemetry, trace_span};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::backoff::Backoff;
use super::breaker::{Admission, Breakers};
use super::classify::{Attempt, classify, error_chain, parse_retry_after};

/// One request to a service: method, path segments under the base URL, and a
/// JSON body (`Null` for none).
#[derive(Debug, Clone)]
pub struct Call {
    pub method: Method,
    pub path: Vec<String>,
    pub body: Value,
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

/// The five services behind one base URL, one connection pool.
#[derive(Debug, Clone)]
pub struct ServiceClient {
    http: reqwest::Client,
    base: Url,
    backoff: Backoff,
    max_attempts: u32,
    breakers: Arc<Breakers>,
}

impl ServiceClient {
    /// # Errors
    /// When the HTTP client cannot be built (no TLS backend).
    pub fn new(
        base: Url,
        settings: &ServicesSettings,
        breakers: Arc<Breakers>,
    ) -> Result<Self, reqwest::Error> {
        let http = reqwest::Client::builder()
            .timeout(settings.timeout_ms.duration())
            .connect_timeout(settings.timeout_ms.duration())
            .redirect(reqwest::redirect::Policy::none())
            .pool_idle_timeout(Duration::from_secs(30));
        let http = match settings.protocol {
            ServicesProtocol::Auto | ServicesProtocol::Http1 => http.http1_only(),
            ServicesProtocol::H2c => http.http2_prior_knowledge(),
        }
        .build()?;
        Ok(Self {
            http,
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
            serde_json::to_vec(&call.body)
                .unwrap_or_else(|e| unreachable!("a JSON value always serializes: {e}"))
        });
        let breaker = self.breakers.get(step);
        let mut calls = 0u32;
        // Probes of an open circuit are the breaker's business and do not use up attempts:
        // a call that happens to probe a long outage again and again must not fail for it.
        let mut attempts = 0u32;
        loop {
            let admission = breaker.admit(tokio::time::Instant::now());
            if let Admission::Wait(until) = admission {
                tokio::select! {
                    () = abandon.cancelled() => return Answer::abandoned(calls),
                    () = breaker.wait(until) => continue,
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
                attempt = self.attempt(step, call, &url, body.as_deref(), idempotency_key, traceparent) => attempt,
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
        body: Option<&[u8]>,
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
                metrics.throttled_by(step.as_str());
            }
        }
        attempt
    }

    async fn send(
        &self,
        call: &Call,
        url: &Url,
        body: Option<&[u8]>,
        idempotency_key: &str,
        traceparent: Option<&str>,
    ) -> (Attempt, Option<StatusCode>) {
        let mut request = self
            .http
            .request(call.method.clone(), url.clone())
            .header("idempotency-key", idempotency_key);
        if let Some(body) = body {
            request = request
                .header(CONTENT_TYPE, "application/json")
                .body(body.to_vec());
        }
        if let Some(traceparent) = telemetry::traceparent_or(traceparent) {
            request = request.header(telemetry::TRACEPARENT, traceparent);
        }
        let response = match request.send().await {
            Ok(response) => response,
            Err(e) => {
                let attempt = Attempt::Transient {
                    reason: error_chain(&e),
                    retry_after: None,
                };
                return (attempt, None);
            }
        };
        let status = response.status();
        let retry_after = response
            .headers()
            .get(RETRY_AFTER)
            .and_then(parse_retry_after);
        let bytes = match response.bytes().await {
            Ok(bytes) => bytes,
            Err(e) => {
                let attempt = Attempt::Transient {
                    reason: error_chain(&e),
                    retry_after: None,
                };
                return (attempt, Some(status));
            }
        };
        (classify(status, &bytes, retry_after), Some(status))
    }
}
