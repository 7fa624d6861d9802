//! `[callbacks]`: the notifier that POSTs each delivery's terminal status to
//! its `callbackUrl`, signed as Standard Webhooks specifies.

use std::net::IpAddr;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use ipnet::IpNet;
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;

use super::checks::Checks;
use super::duration::Millis;

/// The prefix of a Standard Webhooks secret; the rest is base64.
pub const SECRET_PREFIX: &str = "whsec_";

/// Callbacks: signing secrets, destinations, retries and limits.
#[derive(Debug, Clone, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields)]
pub struct CallbackSettings {
    /// Whether requests may carry a `callbackUrl` (refused with 422 when off)
    /// and the worker runs the notifier. Unset: on where the notifier can
    /// sign (secrets set, or the embedded store keeps one). A gateway alone
    /// holds no secret: set it to `true` there.
    pub enabled: Option<bool>,
    /// The master secrets (`whsec_` + base64), newest first; only the
    /// processes that sign callbacks (worker, all-in-one) need them. Each
    /// derives the secret of every principal, which signs that principal's
    /// callbacks (without a principal, auth off: the masters sign). Rotation:
    /// put the new one first, hand receivers their new secrets, drop the old
    /// one. Empty on the embedded store: the secret it generates and keeps in
    /// its data directory (`callback-secret`).
    #[cfg_attr(test, schemars(with = "Vec<String>"))]
    pub secrets: Vec<SecretString>,
    /// Addresses (`10.1.2.3`) and networks (`127.0.0.0/8`) callbacks may go
    /// to although they are loopback, private, link-local, multicast or
    /// unspecified, all of which are otherwise refused.
    pub allow: Vec<String>,
    /// How long one POST may take, connection included.
    pub timeout_ms: Millis,
    /// How long a callback is retried (5xx, 408, 429, timeouts, connection
    /// errors) from its first failed attempt, across restarts (the time is
    /// kept in the status document), before it is dead-lettered.
    pub retry_for_ms: Millis,
    /// The first wait between two attempts (doubling, with jitter).
    pub backoff_initial_ms: Millis,
    /// The longest wait between two attempts (a receiver's `Retry-After` may ask for more).
    pub backoff_max_ms: Millis,
    /// The most of a receiver's answer that is read.
    pub max_response_bytes: usize,
    /// Callbacks in flight to one destination (scheme, host and port).
    pub per_destination: usize,
    /// Callbacks in flight in all.
    pub max_in_flight: usize,
}

impl Default for CallbackSettings {
    fn default() -> Self {
        Self {
            enabled: None,
            secrets: Vec::new(),
            allow: Vec::new(),
            timeout_ms: Millis::new(10_000),
            retry_for_ms: Millis::new(300_000),
            backoff_initial_ms: Millis::new(500),
            backoff_max_ms: Millis::new(30_000),
            max_response_bytes: 64 * 1024,
            per_destination: 8,
            max_in_flight: 256,
        }
    }
}

impl CallbackSettings {
    /// The allow-list as networks (a bare address is a network of one);
    /// entries that do not parse are left out (validation names them).
    pub fn allowed(&self) -> Vec<IpNet> {
        self.allow
            .iter()
            .filter_map(|entry| network(entry))
            .collect()
    }

    /// The secrets' keys (the base64 after `whsec_`, decoded); secrets that
    /// do not decode are left out (validation names them).
    pub fn keys(&self) -> Vec<Vec<u8>> {
        self.secrets
            .iter()
            .filter_map(|secret| decode_secret(secret.expose_secret()))
            .collect()
    }

    pub(super) fn validate(&self, checks: &mut Checks<'_>) {
        for (index, secret) in self.secrets.iter().enumerate() {
            checks.check(
                decode_secret(secret.expose_secret()).is_some(),
                &format!("secrets[{index}]"),
                "must be \"whsec_\" followed by base64 of at least 24 bytes",
            );
        }
        for (index, entry) in self.allow.iter().enumerate() {
            checks.check(
                network(entry).is_some(),
                &format!("allow[{index}]"),
                format!("{entry:?} is not an IP address or a network such as 127.0.0.0/8"),
            );
        }
        checks.at_least(self.timeout_ms.count(), 100, "timeout_ms");
        checks.at_least(self.backoff_initial_ms.count(), 1, "backoff_initial_ms");
        checks.check(
            self.backoff_max_ms >= self.backoff_initial_ms,
            "backoff_max_ms",
            "must be at least backoff_initial_ms",
        );
        checks.at_least(self.max_response_bytes, 1, "max_response_bytes");
        checks.at_least(self.per_destination, 1, "per_destination");
        checks.at_least(self.max_in_flight, 1, "max_in_flight");
    }
}

fn network(entry: &str) -> Option<IpNet> {
    let entry = entry.trim();
    entry
        .parse::<IpNet>()
        .ok()
        .or_else(|| entry.parse::<IpAddr>().ok().map(IpNet::from))
}

/// The key of a `whsec_` secret, if it is one (at least 24 bytes, as the
/// specification asks).
pub fn decode_secret(secret: &str) -> Option<Vec<u8>> {
    let key = STANDARD
        .decode(secret.strip_prefix(SECRET_PREFIX)?.trim())
        .ok()?;
    (key.len() >= 24).then_some(key)
}
