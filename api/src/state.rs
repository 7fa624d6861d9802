//! What every handler shares: the ports, the receipt signer and a few settings.

use std::sync::Arc;

use axum::http::HeaderMap;
use axum::http::uri::Authority;
use skyport_shared::adapters::Backends;
use skyport_shared::config::GatewaySettings;
use skyport_shared::ports::{Diagnostics, IdempotencyStore, Publisher, StatusStore};

use crate::error::ApiError;
use crate::receipt::Receipts;

#[derive(Clone, Debug)]
pub struct AppState {
    pub publisher: Arc<dyn Publisher>,
    pub status: Arc<dyn StatusStore>,
    pub idempotency: Arc<dyn IdempotencyStore>,
    /// How long a reservation holds a delivery id.
    pub idempotency_retention: time::Duration,
    pub receipts: Receipts,
    pub retry_after_s: u32,
    /// Configured base of status URLs, without a trailing slash.
    pub public_url: Option<String>,
    /// Parts of the process whose trouble `/readyz` reports.
    pub diagnostics: Vec<Arc<dyn Diagnostics>>,
}

impl AppState {
    pub fn new(
        backends: &Backends,
        settings: &GatewaySettings,
        diagnostics: Vec<Arc<dyn Diagnostics>>,
    ) -> Self {
        Self {
            publisher: Arc::clone(&backends.publisher),
            status: Arc::clone(&backends.status),
            idempotency: Arc::clone(&backends.idempotency),
            idempotency_retention: time::Duration::try_from(settings.idempotency_retention())
                .unwrap_or(time::Duration::DAY),
            receipts: Receipts::new(&backends.receipt_key),
            retry_after_s: settings.retry_after_s,
            public_url: settings
                .public_url
                .as_ref()
                .map(|url| url.as_str().trim_end_matches('/').to_owned()),
            diagnostics,
        }
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
