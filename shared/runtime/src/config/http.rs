//! `[gateway.http]` and `[worker.http]`: what a Skyport HTTP listener allows a
//! connection, so that no client can hold it by sending slowly or not at all.

use serde::Deserialize;

use super::checks::Checks;
use super::duration::Millis;

/// The smallest head limit: hyper's read buffer cannot be smaller than 8 KiB.
const MIN_HEADER_BYTES: usize = 8 * 1024;

/// Limits on the connections of one HTTP listener.
#[derive(Debug, Clone, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields)]
pub struct HttpSettings {
    /// How long a request's head (request line and headers) may take to
    /// arrive, from its first byte; the connection is closed past it.
    pub header_read_timeout_ms: Millis,
    /// How long a request's whole body may take to arrive once its head has;
    /// past it the request is answered 408 and the connection closed.
    pub body_read_timeout_ms: Millis,
    /// How long a connection may stay open without a request in progress
    /// (from its opening, or the end of its last response) before it is closed.
    pub idle_timeout_ms: Millis,
    /// Connections open at once; past it, new ones wait in the listen backlog.
    pub max_connections: usize,
    /// Largest request head (request line and headers) in bytes; larger is 431.
    pub max_header_bytes: usize,
}

impl Default for HttpSettings {
    fn default() -> Self {
        Self {
            // Kestrel's and hyper's request-headers timeout.
            header_read_timeout_ms: Millis::new(30_000),
            body_read_timeout_ms: Millis::new(30_000),
            // nginx's keepalive_timeout: longer than the 60 s idle timeout of
            // the load balancers that usually sit in front.
            idle_timeout_ms: Millis::new(75_000),
            max_connections: 8_192,
            // Kestrel's MaxRequestHeadersTotalSize; nginx allows 4 lines of 8 KiB.
            max_header_bytes: 32 * 1024,
        }
    }
}

impl HttpSettings {
    pub(super) fn validate(&self, checks: &mut Checks<'_>) {
        for (value, key) in [
            (self.header_read_timeout_ms, "header_read_timeout_ms"),
            (self.body_read_timeout_ms, "body_read_timeout_ms"),
            (self.idle_timeout_ms, "idle_timeout_ms"),
        ] {
            checks.at_least(value.count(), 100, key);
        }
        checks.at_least(self.max_connections, 1, "max_connections");
        checks.at_least(self.max_header_bytes, MIN_HEADER_BYTES, "max_header_bytes");
    }
}
