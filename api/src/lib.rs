//! Skyport's gateway: accepts delivery requests, makes each one durable in the
//! stream before answering 202, and serves their status.
//!
//! Library + thin binary: [`Gateway::bind`] builds the axum app from the ports
//! and binds its listener, [`Gateway::serve`] runs it until the shutdown token
//! fires and drains it within a grace period.

pub mod auth;
pub mod error;
pub mod extract;
pub mod receipt;
pub mod routes;
pub mod state;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::DefaultBodyLimit;
use axum::middleware;
use axum::routing::{delete, get, post};
use axum::{Extension, Router};
use skyport_shared::adapters::Backends;
use skyport_shared::config::GatewaySettings;
use skyport_shared::ports::Diagnostics;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower_http::trace::TraceLayer;

use crate::auth::Auth;
use crate::error::ApiError;
use crate::extract::BodyLimit;
use crate::routes::deliveries::{self, DELIVERY_REQUESTS};
use crate::routes::health;
pub use crate::state::AppState;

/// The gateway's routes over `state`, with bodies limited to `max_body_bytes`;
/// with `auth`, the `/api` routes need credentials (the ops routes never do).
pub fn router(state: AppState, auth: Option<Auth>, max_body_bytes: usize) -> Router {
    let mut api = Router::new()
        .route(DELIVERY_REQUESTS, post(deliveries::create))
        .route(
            &format!("{DELIVERY_REQUESTS}/{{id}}"),
            delete(deliveries::cancel),
        )
        .route(
            &format!("{DELIVERY_REQUESTS}/{{id}}/status"),
            get(deliveries::status),
        );
    if let Some(auth) = auth {
        // A route layer: it runs for requests that match one of these routes,
        // so an unknown path or method is still a 404 or 405.
        api = api.route_layer(middleware::from_fn_with_state(
            auth,
            auth::require_credentials,
        ));
    }
    Router::new()
        .merge(api)
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .fallback(|| async { ApiError::NotFound("no such route".into()) })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .layer(Extension(BodyLimit(max_body_bytes)))
        .layer(TraceLayer::new_for_http())
        .with_state(state)
}

/// The gateway's listener could not be bound.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen on gateway.listen = {address}")]
pub struct BindError {
    address: SocketAddr,
    #[source]
    source: std::io::Error,
}

/// A gateway bound to its address, ready to serve.
#[derive(Debug)]
pub struct Gateway {
    listener: TcpListener,
    router: Router,
    grace: Duration,
}

impl Gateway {
    /// Builds the routes over `backends`, checking credentials with `auth`
    /// (from [`Auth::from_settings`]), and binds `settings.listen`; `/readyz`
    /// also reports what `diagnostics` say.
    ///
    /// # Errors
    /// [`BindError`] when the address cannot be bound.
    pub async fn bind(
        backends: &Backends,
        settings: &GatewaySettings,
        auth: Option<Auth>,
        diagnostics: Vec<Arc<dyn Diagnostics>>,
    ) -> Result<Self, BindError> {
        let bind_error = |source| BindError {
            address: settings.listen,
            source,
        };
        let listener = TcpListener::bind(settings.listen)
            .await
            .map_err(bind_error)?;
        Ok(Self {
            listener,
            router: router(
                AppState::new(backends, settings, diagnostics),
                auth,
                settings.max_body_bytes,
            ),
            grace: settings.shutdown_grace_period(),
        })
    }

    /// The address actually bound (port 0 becomes a real port).
    ///
    /// # Errors
    /// When the socket cannot say.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until `shutdown` is cancelled, then lets in-flight requests
    /// finish for at most the grace period.
    ///
    /// # Errors
    /// The listener's I/O error, if accepting fails.
    pub async fn serve(self, shutdown: CancellationToken) -> std::io::Result<()> {
        serve(self.listener, self.router, shutdown, self.grace).await
    }
}

async fn serve(
    listener: TcpListener,
    router: Router,
    shutdown: CancellationToken,
    grace: Duration,
) -> std::io::Result<()> {
    let server =
        axum::serve(listener, router).with_graceful_shutdown(shutdown.clone().cancelled_owned());
    let deadline = async {
        shutdown.cancelled().await;
        tokio::time::sleep(grace).await;
    };
    tokio::select! {
        result = server => result,
        () = deadline => {
            tracing::warn!(grace_ms = grace.as_millis(), "The gateway's drain timed out; open connections were dropped.");
            Ok(())
        }
    }
}
