//! `[gateway]`: the HTTP gateway (its authentication is [`super::auth`]).

use std::collections::BTreeMap;
use std::net::SocketAddr;

use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use url::Url;

use super::auth::AuthSettings;
use super::checks::Checks;
use super::duration::{Millis, Seconds};
use super::http::HttpSettings;

/// The most requests a batch may be allowed to hold.
const MAX_BATCH: usize = 10_000;

/// The largest body a batch may be allowed: the body is held whole while its
/// items are answered.
const MAX_BATCH_BODY_BYTES: usize = 16 * 1024 * 1024;

/// The HTTP gateway.
#[derive(Debug, Clone, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields)]
pub struct GatewaySettings {
    /// Address the gateway listens on.
    pub listen: SocketAddr,
    /// Connections past their handshake that may wait to be accepted, on
    /// every listener the process opens (the gateway's, its internal one,
    /// the worker's, the simulated services'). A spike of new connections
    /// larger than it loses handshakes, which clients retry after a second.
    /// The kernel keeps at most `net.core.somaxconn` (the start logs it
    /// when that is lower).
    pub listen_backlog: u32,
    /// Base of the status URLs handed to clients; when unset, the request's `Host` is used.
    pub public_url: Option<Url>,
    /// Largest request body accepted, in bytes.
    pub max_body_bytes: usize,
    /// Most delivery requests in one `POST /api/deliveryrequests/batch`.
    pub max_batch: usize,
    /// Largest body of a batch, in bytes once decoded (its own limit:
    /// `max_body_bytes` stays the limit of every other request).
    pub max_batch_body_bytes: usize,
    /// Request bodies read at once (each whole, up to `max_body_bytes`
    /// decoded), so that their memory stays bounded whatever the
    /// connections; one more is refused at once with 503 and `Retry-After`.
    /// Only requests with credentials get this far when auth is on.
    pub max_bodies_reading: usize,
    /// Seconds a client is asked to wait before polling a status URL.
    pub retry_after_s: u32,
    /// Keys that sign status receipts (each at least 32 characters), newest
    /// first: the first signs, every one verifies, so a key is rotated by
    /// putting the new one first and dropping the old one once the receipts
    /// it signed are no longer needed. Empty: the key the embedded store
    /// generates and keeps; gateways that scale out must share these.
    #[cfg_attr(test, schemars(with = "Vec<String>"))]
    pub receipt_keys: Vec<SecretString>,
    /// Not a key any more: refused with a message naming `receipt_keys`,
    /// which took its place.
    #[cfg_attr(test, schemars(skip))]
    pub receipt_key: Option<SecretString>,
    /// Where the probes (`/healthz`, `/readyz`) and `/metrics` are served
    /// apart from the API, so that an exhausted API cannot starve them and
    /// metrics need not face the API's clients. Unset: beside the API on
    /// `listen`.
    pub internal_listen: Option<SocketAddr>,
    /// Whether the `/admin` routes (redrive, callback resend, reports) are
    /// served to anyone while authentication is off. Off: with auth off they
    /// answer 404; with auth on they need the admin scope, whatever this says.
    pub admin_without_auth: bool,
    /// How long in-flight requests may take to finish after a shutdown signal.
    pub shutdown_grace_period_ms: Millis,
    /// How long a client-chosen `deliveryId` or an `Idempotency-Key` is
    /// remembered: a retry within it returns the same delivery.
    pub idempotency_retention_s: Seconds,
    /// The 202's p99 the gateway aims at. In the all-in-one on the embedded
    /// stream, where the worker beside it shares the cores, the disk and the
    /// store's committer, the worker halves its in-flight window (down to an
    /// eighth of `worker.max_in_flight`) while more than 1 % of the 202s in
    /// each 50 ms took longer, and widens it again step by step while they
    /// did not. 0: the worker keeps its whole window, as it does beside a
    /// gateway on Kafka or Event Hubs, where a 202 waits on the broker.
    pub latency_objective_ms: Millis,
    /// Requests handled at once; one more is refused at once with 503 and
    /// `Retry-After` instead of queueing behind them.
    pub max_in_flight: usize,
    /// Status reads held at once waiting for a change (`Prefer: wait=N` or
    /// `?wait=N`); they do not count against `max_in_flight`. One more is
    /// answered at once, as if it had not asked to wait. Below
    /// `http.max_connections`, so held reads never take every connection.
    pub max_waiting: usize,
    /// Status reads one client may have held at once (its principal with
    /// auth on, else its address); one more is answered at once.
    pub max_waiting_per_client: usize,
    /// How often the gateway reads a Cosmos DB change feed from "now" while
    /// status reads wait on it (each read of each feed range is charged
    /// RUs; nothing is read while nobody waits). The embedded store wakes
    /// waiting reads on its status write instead.
    pub wait_poll_interval_ms: Millis,
    /// Whether every delivery's status answers as an Azure long-running
    /// operation (202 while it runs, `Operation-Location` on the POST), as
    /// a POST with `Prefer: respond-async` asks for one delivery.
    pub respond_async: bool,
    /// Per-client rate quotas on the requests that create or change a
    /// delivery; off while `default_per_s` is unset.
    pub quotas: QuotaSettings,
    /// Who may call the `/api` routes.
    pub auth: AuthSettings,
    /// What the listener allows a connection (timeouts, head size, connections).
    pub http: HttpSettings,
    /// Whether the gateway serves the operators' page at `/dashboard` (its
    /// data behind the API's credentials, read scope). Unset: the profile's
    /// (embedded and kafka → on, azure → off).
    pub dashboard: Option<bool>,
    /// The schema version of the events the gateway writes. Every worker
    /// must read a version before a gateway writes it: during a rolling
    /// upgrade that brings a new version, keep the old one here until every
    /// worker runs the new build.
    pub event_schema_version: u32,
    /// Not a key: how long after its acceptance a delivery with no status
    /// document is gone rather than still queued (`store.status_retention_s`
    /// plus `worker.allow_backlog_to_ms`), filled in by
    /// [`Settings::gateway_settings`](super::Settings::gateway_settings).
    /// `None`: never.
    #[serde(skip)]
    #[cfg_attr(test, schemars(skip))]
    pub status_gone_after: Option<std::time::Duration>,
}

impl Default for GatewaySettings {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            // Linux's net.core.somaxconn since 5.4: as many as the kernel keeps.
            listen_backlog: 4_096,
            public_url: None,
            max_body_bytes: 64 * 1024,
            max_batch: 1_000,
            max_batch_body_bytes: 1024 * 1024,
            max_bodies_reading: 1024,
            retry_after_s: 1,
            receipt_keys: Vec::new(),
            receipt_key: None,
            internal_listen: None,
            admin_without_auth: false,
            shutdown_grace_period_ms: Millis::new(10_000),
            idempotency_retention_s: Seconds::new(24 * 60 * 60),
            event_schema_version: skyport_core::event::SCHEMA_VERSION,
            status_gone_after: None,
            // The 202's p99 objective of the seed: 25 ms.
            latency_objective_ms: Millis::new(25),
            max_in_flight: 4096,
            max_waiting: 2_048,
            max_waiting_per_client: 64,
            wait_poll_interval_ms: Millis::new(200),
            respond_async: false,
            quotas: QuotaSettings::default(),
            auth: AuthSettings::default(),
            http: HttpSettings::default(),
            dashboard: None,
        }
    }
}

impl GatewaySettings {
    /// Checks the gateway's own keys; `auth_enabled` is what the profile and
    /// `auth.enabled` decide together.
    pub(super) fn validate(&self, checks: &mut Checks<'_>, auth_enabled: bool) {
        checks.at_least(self.max_body_bytes, 1024, "max_body_bytes");
        checks.check(
            (1..=MAX_BATCH).contains(&self.max_batch),
            "max_batch",
            format!("must be from 1 to {MAX_BATCH}"),
        );
        checks.check(
            self.max_batch_body_bytes >= self.max_body_bytes,
            "max_batch_body_bytes",
            format!(
                "must be at least gateway.max_body_bytes ({}): a batch of one is a request",
                self.max_body_bytes
            ),
        );
        checks.check(
            self.max_batch_body_bytes <= MAX_BATCH_BODY_BYTES,
            "max_batch_body_bytes",
            format!("must be at most {MAX_BATCH_BODY_BYTES} (16 MiB)"),
        );
        checks.at_least(self.retry_after_s, 1, "retry_after_s");
        checks.check(
            (1..=30 * 24 * 60 * 60).contains(&self.idempotency_retention_s.count()),
            "idempotency_retention_s",
            "must be from 1 to 2592000 (30 days)",
        );
        checks.at_least(self.max_in_flight, 1, "max_in_flight");
        checks.at_least(self.listen_backlog, 1, "listen_backlog");
        checks.at_least(self.max_bodies_reading, 1, "max_bodies_reading");
        checks.at_least(
            self.wait_poll_interval_ms.count(),
            10,
            "wait_poll_interval_ms",
        );
        let reads = skyport_core::event::READS;
        checks.check(
            reads.contains(&self.event_schema_version),
            "event_schema_version",
            format!("must be from {} to {}", reads.start(), reads.end()),
        );
        if self.receipt_key.is_some() {
            checks.fail(
                "receipt_key",
                "was replaced by gateway.receipt_keys, a list of keys, newest first: put this key \
                 in it (first, so that it still signs) and every receipt it signed keeps verifying",
            );
        }
        for (index, key) in self.receipt_keys.iter().enumerate() {
            let key = key.expose_secret();
            checks.check(
                key.len() >= 32,
                "receipt_keys",
                format!("key {index} (from 0) must be at least 32 characters"),
            );
            if self.receipt_keys[..index]
                .iter()
                .any(|earlier| earlier.expose_secret() == key)
            {
                checks.fail(
                    "receipt_keys",
                    format!("key {index} (from 0) is listed twice"),
                );
            }
        }
        checks.at_least(self.max_waiting_per_client, 1, "max_waiting_per_client");
        checks.check(
            self.max_waiting_per_client <= self.max_waiting,
            "max_waiting_per_client",
            format!("must be at most gateway.max_waiting ({})", self.max_waiting),
        );
        checks.check(
            self.max_waiting < self.http.max_connections,
            "max_waiting",
            format!(
                "must be below gateway.http.max_connections ({}): held reads must leave \
                 connections for the requests that end them",
                self.http.max_connections
            ),
        );
        if let Some(internal) = self.internal_listen {
            checks.check(
                internal != self.listen || internal.port() == 0,
                "internal_listen",
                "must differ from gateway.listen",
            );
        }
        checks.http_url(self.public_url.as_ref(), "public_url");
        self.quotas.validate(&mut checks.section("quotas"));
        if self.quotas.client_claim.is_some() {
            checks.check(
                auth_enabled && self.auth.jwt.is_some(),
                "quotas.client_claim",
                "names a bearer token's claim: needs auth on and gateway.auth.jwt",
            );
        }
        self.auth
            .validate(&mut checks.section("auth"), auth_enabled);
        self.http.validate(&mut checks.section("http"));
    }
}

/// `[gateway.quotas]`: how many creating or changing requests (POST, PATCH,
/// DELETE) a client may make a second, metered per gateway process. A client
/// is its principal when auth is on (an API key's name, a bearer token's
/// `client_claim`), else the request's `ownerId`.
#[derive(Debug, Clone, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields)]
pub struct QuotaSettings {
    /// Requests a second each client may make; unset: no quotas.
    pub default_per_s: Option<u32>,
    /// How many a client may make at once above its rate; unset: a
    /// second's worth.
    pub burst: Option<u32>,
    /// Quotas of their own, by client.
    pub clients: BTreeMap<String, ClientQuota>,
    /// Clients remembered at once; the least recently seen is forgotten
    /// past it (and starts with a full bucket when it comes back).
    pub max_clients: usize,
    /// The bearer token claim that names the client (`azp`, `appid`, `tid`
    /// or one of the issuer's own); unset: `sub`. A token without it as a
    /// string is refused (401), as no bucket can be chosen for it. An API
    /// key is always its name.
    pub client_claim: Option<String>,
}

impl Default for QuotaSettings {
    fn default() -> Self {
        Self {
            default_per_s: None,
            burst: None,
            clients: BTreeMap::new(),
            max_clients: 100_000,
            client_claim: None,
        }
    }
}

/// One client's quota.
#[derive(Debug, Clone, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct ClientQuota {
    pub per_s: u32,
    /// Unset: a second's worth.
    #[serde(default)]
    pub burst: Option<u32>,
}

impl QuotaSettings {
    fn validate(&self, checks: &mut Checks<'_>) {
        if let Some(per_s) = self.default_per_s {
            checks.at_least(per_s, 1, "default_per_s");
        }
        if let Some(burst) = self.burst {
            checks.at_least(burst, 1, "burst");
            checks.check(self.default_per_s.is_some(), "burst", "needs default_per_s");
        }
        checks.at_least(self.max_clients, 1, "max_clients");
        if let Some(claim) = &self.client_claim {
            checks.check(
                !claim.trim().is_empty(),
                "client_claim",
                "must name a token claim (unset: sub)",
            );
            checks.check(
                !matches!(claim.as_str(), "scp" | "roles"),
                "client_claim",
                "scp and roles grant scopes; they do not name a client",
            );
            checks.check(
                self.default_per_s.is_some(),
                "client_claim",
                "needs default_per_s",
            );
        }
        for (name, quota) in &self.clients {
            let mut client = checks.section("clients");
            let mut client = client.section(name);
            client.at_least(quota.per_s, 1, "per_s");
            if let Some(burst) = quota.burst {
                client.at_least(burst, 1, "burst");
            }
        }
    }
}
