//! `[services]`: the five backend services the workflow calls, and how their
//! calls are retried and their circuits opened.

use serde::Deserialize;
use url::Url;

use super::checks::Checks;
use super::duration::Millis;

/// The most HTTP/2 connections to the services a worker opens.
const MAX_H2C_CONNECTIONS: usize = 64;

/// The HTTP version the workflow's calls use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum ServicesProtocol {
    /// HTTP/2 to the simulated services the all-in-one process starts (it
    /// knows they speak it); HTTP/1.1 to a configured `base_url`.
    #[default]
    Auto,
    /// HTTP/1.1, one call per connection at a time.
    Http1,
    /// HTTP/2 over cleartext with prior knowledge: the calls share
    /// `h2c_connections` connections. Only for `http://` services that speak it.
    H2c,
}

/// The five backend services the workflow calls.
#[derive(Debug, Clone, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields)]
pub struct ServicesSettings {
    /// Base URL that serves `/account`, `/package`, `/delivery`, `/thirdparty` and `/drone`.
    /// Unset: the all-in-one process starts the simulated services and uses them.
    pub base_url: Option<Url>,
    /// HTTP/1.1, or HTTP/2 over cleartext (see [`ServicesProtocol`]).
    pub protocol: ServicesProtocol,
    /// HTTP/2 connections the calls take in turn (h2c): each one's framing
    /// is one task on each side, so one connection bounds a worker's calls.
    pub h2c_connections: usize,
    /// Time limit of one call.
    pub timeout_ms: Millis,
    /// First wait before retrying a transient failure; doubles up to `retry_max_backoff_ms`.
    pub retry_initial_backoff_ms: Millis,
    pub retry_max_backoff_ms: Millis,
    /// Calls a step makes while its circuit lets it, before a transient failure counts as permanent.
    pub max_attempts: u32,
    /// A circuit opens after this many transient failures in a row…
    pub breaker_consecutive_failures: u32,
    /// …or when this percentage of the last `breaker_window` calls failed.
    pub breaker_failure_percent: u32,
    pub breaker_window: usize,
    /// How long an open circuit waits before one probe call.
    pub breaker_open_ms: Millis,
}

impl Default for ServicesSettings {
    fn default() -> Self {
        Self {
            base_url: None,
            protocol: ServicesProtocol::Auto,
            h2c_connections: 4,
            timeout_ms: Millis::new(5_000),
            retry_initial_backoff_ms: Millis::new(50),
            retry_max_backoff_ms: Millis::new(5_000),
            max_attempts: 10,
            breaker_consecutive_failures: 5,
            breaker_failure_percent: 50,
            breaker_window: 20,
            breaker_open_ms: Millis::new(2_000),
        }
    }
}

impl ServicesSettings {
    pub(super) fn validate(&self, checks: &mut Checks<'_>) {
        checks.http_url(self.base_url.as_ref(), "base_url");
        checks.check(
            self.protocol != ServicesProtocol::H2c
                || self
                    .base_url
                    .as_ref()
                    .is_none_or(|url| url.scheme() == "http"),
            "protocol",
            "h2c (HTTP/2 with prior knowledge) needs an http:// services.base_url",
        );
        checks.check(
            (1..=MAX_H2C_CONNECTIONS).contains(&self.h2c_connections),
            "h2c_connections",
            format!("must be from 1 to {MAX_H2C_CONNECTIONS}"),
        );
        checks.at_least(self.timeout_ms.count(), 1, "timeout_ms");
        checks.at_least(
            self.retry_initial_backoff_ms.count(),
            1,
            "retry_initial_backoff_ms",
        );
        checks.check(
            self.retry_max_backoff_ms >= self.retry_initial_backoff_ms,
            "retry_max_backoff_ms",
            "must be at least services.retry_initial_backoff_ms",
        );
        checks.at_least(self.max_attempts, 1, "max_attempts");
        checks.at_least(
            self.breaker_consecutive_failures,
            1,
            "breaker_consecutive_failures",
        );
        checks.check(
            (1..=100).contains(&self.breaker_failure_percent),
            "breaker_failure_percent",
            "must be from 1 to 100",
        );
        checks.check(
            self.max_attempts > self.breaker_consecutive_failures,
            "max_attempts",
            "must be more than services.breaker_consecutive_failures, or a lone call gives up before its circuit can open",
        );
        checks.at_least(self.breaker_window, 1, "breaker_window");
        checks.at_least(self.breaker_open_ms.count(), 1, "breaker_open_ms");
    }
}
