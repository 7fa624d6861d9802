//! What every handler shares: the ports, the receipt signer, a few settings,
//! and the admin routes' readiness check.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use axum::extract::FromRef;
use axum::http::HeaderMap;
use axum::http::uri::Authority;
use serde_json::Value;
use skyport_core::ports::{
    DeadLetterStore, Diagnostics, IdempotencyStore, Lane, Ports, Publisher, ReportError,
    ReportQuery, StatusStore, details_of, inspect_parts,
};
use skyport_runtime::admin::{Admin, ReadinessCheck};
use skyport_runtime::config::GatewaySettings;
use skyport_runtime::destination::CallbackAcceptance;

use crate::error::ApiError;
use crate::pacing::Pacing;
use crate::quotas::{Charged, Quotas};
use crate::receipt::Receipts;
use crate::waiting::Waiters;

/// Cloned for every request (axum's `State`, each middleware's state), so
/// one reference count rather than a copy of each field.
#[derive(Clone, Debug)]
pub struct AppState(Arc<GatewayParts>);

impl std::ops::Deref for AppState {
    type Target = GatewayParts;

    fn deref(&self) -> &GatewayParts {
        &self.0
    }
}

/// What [`AppState`] shares.
#[derive(Debug)]
pub struct GatewayParts {
    pub publisher: Arc<dyn Publisher>,
    pub status: Arc<dyn StatusStore>,
    /// Where a redrive finds dead-lettered events.
    pub dead_letters: Arc<dyn DeadLetterStore>,
    pub idempotency: Arc<dyn IdempotencyStore>,
    /// How long a reservation holds a delivery id.
    pub idempotency_retention: time::Duration,
    pub receipts: Receipts,
    /// `Retry-After` when a request is shed or a backend is unavailable.
    pub retry_after_s: u32,
    /// The `Retry-After` of a 202 and of a status not terminal yet.
    pub pacing: Pacing,
    /// The schema version of the events this gateway writes.
    pub event_schema_version: u32,
    /// How long after its acceptance a delivery with no status document is
    /// gone (410) rather than still queued; `None`: never.
    pub status_gone_after: Option<time::Duration>,
    /// Configured base of status URLs, without a trailing slash.
    pub public_url: Option<String>,
    /// `/healthz`, `/readyz` and `/metrics`.
    pub admin: Admin,
    /// Whether a request's `callbackUrl` is taken.
    pub callbacks: CallbackAcceptance,
    /// Whether every status answers as a long-running operation
    /// (`gateway.respond_async`).
    pub respond_async: bool,
    /// Per-client quotas, when `gateway.quotas` sets them (shared with the
    /// dashboard's data, which shows their busiest clients).
    pub quotas: Option<Arc<Quotas>>,
    /// The status reads waiting for a change.
    pub waiters: Arc<Waiters>,
    /// Most delivery requests in one batch (`gateway.max_batch`).
    pub max_batch: usize,
}

impl FromRef<AppState> for Admin {
    fn from_ref(state: &AppState) -> Self {
        state.admin.clone()
    }
}

/// The gateway is ready when the stream and the status store are; what
/// `diagnostics` report is listed as degraded.
#[derive(Debug)]
struct GatewayReadiness {
    publisher: Arc<dyn Publisher>,
    status: Arc<dyn StatusStore>,
    diagnostics: Vec<Arc<dyn Diagnostics>>,
}

#[async_trait]
impl ReadinessCheck for GatewayReadiness {
    async fn check(&self) -> Result<Vec<String>, String> {
        let stream = self.publisher.ready().await;
        let store = self.status.ready().await;
        let down: Vec<&str> = [(stream, "stream"), (store, "status store")]
            .into_iter()
            .filter_map(|(up, name)| (!up).then_some(name))
            .collect();
        if down.is_empty() {
            Ok(self.diagnostics.iter().flat_map(|d| d.degraded()).collect())
        } else {
            Err(format!("not ready: {} unavailable", down.join(" and ")))
        }
    }

    fn details(&self) -> BTreeMap<String, Value> {
        details_of(&self.diagnostics)
    }

    async fn inspect(&self, path: &str, query: &ReportQuery) -> Option<Result<Value, ReportError>> {
        inspect_parts(&self.diagnostics, path, query).await
    }
}

impl AppState {
    /// The state over `ports`; `/readyz` also lists what `diagnostics` report.
    pub fn new(
        ports: &Ports,
        settings: &GatewaySettings,
        callbacks: CallbackAcceptance,
        diagnostics: Vec<Arc<dyn Diagnostics>>,
    ) -> Self {
        let readiness = GatewayReadiness {
            publisher: Arc::clone(&ports.publisher),
            status: Arc::clone(&ports.status),
            diagnostics,
        };
        Self(Arc::new(GatewayParts {
            publisher: Arc::clone(&ports.publisher),
            status: Arc::clone(&ports.status),
            dead_letters: Arc::clone(&ports.dead_letters),
            idempotency: Arc::clone(&ports.idempotency),
            idempotency_retention: time::Duration::try_from(
                settings.idempotency_retention_s.duration(),
            )
            .unwrap_or(time::Duration::DAY),
            receipts: Receipts::new(&ports.receipt_keys),
            retry_after_s: settings.retry_after_s,
            pacing: Pacing::new(Duration::from_secs(u64::from(settings.retry_after_s))),
            event_schema_version: settings.event_schema_version,
            status_gone_after: settings
                .status_gone_after
                .and_then(|after| time::Duration::try_from(after).ok()),
            public_url: settings
                .public_url
                .as_ref()
                .map(|url| url.as_str().trim_end_matches('/').to_owned()),
            admin: Admin::new(Arc::new(readiness), settings.retry_after_s),
            callbacks,
            respond_async: settings.respond_async,
            quotas: Quotas::new(&settings.quotas).map(Arc::new),
            waiters: Arc::default(),
            max_batch: settings.max_batch,
        }))
    }

    /// The lane of a delivery requested with `expedited`: the expedited lane
    /// when the stream has one.
    pub fn lane_of(&self, expedited: bool) -> Lane {
        Lane::of(expedited && self.publisher.has_expedited_lane())
    }

    /// Charges a creating or changing request to `client` when quotas are on.
    ///
    /// # Errors
    /// [`ApiError::TooManyRequests`] when the client is over its quota.
    pub fn charge(&self, client: &str) -> Result<Option<Charged>, ApiError> {
        self.quotas
            .as_ref()
            .map(|quotas| quotas.charge(client))
            .transpose()
    }

    /// The scheme and authority status URLs start with: the configured public
    /// URL, else `http://` and the request's `Host`.
    ///
    /// # Errors
    /// [`ApiError::BadRequest`] when there is no public URL and the `Host`
    /// header is missing or not a host and port (status URLs are absolute).
    pub fn base_url(&self, headers: &HeaderMap) -> Result<String, ApiError> {
        if let Some(url) = &self.public_url {
            return Ok(url.clone());
        }
        headers
            .get(axum::http::header::HOST)
            .and_then(|host| host.to_str().ok())
            .and_then(|host| host.parse::<Authority>().ok())
            .filter(|authority| !authority.as_str().contains('@'))
            .map(|authority| format!("http://{authority}"))
            .ok_or_else(|| {
                ApiError::BadRequest(
                    "the Host header must be a host name or address, with an optional port".into(),
                )
            })
    }
}
