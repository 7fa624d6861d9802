//! Skyport's gateway: accepts delivery requests, makes each one durable in the
//! stream before answering 202, and serves their status.
//!
//! A library: [`Gateway::bind`] builds the axum app from the ports and binds
//! its listener, [`Gateway::serve`] runs it until the shutdown token
//! fires and drains it within a grace period.

pub mod auth;
pub mod error;
pub mod extract;
pub mod idempotency;
pub mod openapi;
pub mod receipt;
pub mod request_context;
pub mod routes;
pub mod state;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::error_handling::HandleErrorLayer;
use axum::extract::DefaultBodyLimit;
use axum::http::header;
use axum::middleware;
use axum::routing::get;
use axum::{Extension, Router};
use skyport_core::ports::{Diagnostics, Ports};
use skyport_runtime::admin;
use skyport_runtime::config::GatewaySettings;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower::{BoxError, ServiceBuilder};
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::auth::Auth;
use crate::error::ApiError;
use crate::extract::BodyLimit;
use crate::openapi::ApiDoc;
use crate::routes::deliveries;
pub use crate::state::AppState;

/// The API's routes, each with its part of the OpenAPI document.
fn deliveries() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(deliveries::create))
        .routes(routes!(deliveries::cancel))
        .routes(routes!(deliveries::status))
}

/// The probes and `/metrics`, which are never shed and need no credentials.
fn operations() -> OpenApiRouter<AppState> {
    admin::routes()
}

/// The gateway's OpenAPI document, as served at `/openapi.json`.
pub fn openapi() -> utoipa::openapi::OpenApi {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .merge(deliveries())
        .merge(operations())
        .into_openapi()
}

/// The gateway's routes over `state`, as `settings` limit them: bodies to
/// `max_body_bytes`, API requests in flight to `max_in_flight` (one more is
/// refused at once with 503 and `Retry-After` rather than queued). With
/// `auth`, the `/api` routes need credentials (the ops routes never do).
pub fn router(state: AppState, auth: Option<Auth>, settings: &GatewaySettings) -> Router {
    let retry_after_s = state.retry_after_s;
    let mut api = deliveries();
    if let Some(auth) = auth {
        // A route layer: it runs for requests that match one of these routes,
        // so an unknown path or method is still a 404 or 405.
        api = api.route_layer(middleware::from_fn_with_state(
            auth,
            auth::require_credentials,
        ));
    }
    // Outermost, so that a request refused for load costs no credential check.
    let api = api.route_layer(
        ServiceBuilder::new()
            .layer(HandleErrorLayer::new(move |_: BoxError| async move {
                ApiError::Overloaded { retry_after_s }
            }))
            .load_shed()
            .concurrency_limit(settings.max_in_flight),
    );
    let max_body_bytes = settings.max_body_bytes;
    let (routes, spec) = OpenApiRouter::with_openapi(ApiDoc::openapi())
        .merge(api)
        .merge(operations())
        .split_for_parts();
    let spec = axum::body::Bytes::from(openapi::to_json(&spec));
    routes
        .route(
            "/openapi.json",
            get(
                move || async move { ([(header::CONTENT_TYPE, "application/json")], spec.clone()) },
            ),
        )
        .fallback(|| async { ApiError::NotFound("no such route".into()) })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .layer(Extension(BodyLimit(max_body_bytes)))
        .layer(middleware::from_fn(request_context::observe))
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
    /// Builds the routes over `ports`, checking credentials with `auth`
    /// (from [`Auth::from_settings`]), and binds `settings.listen`; `/readyz`
    /// also reports what `diagnostics` say.
    ///
    /// # Errors
    /// [`BindError`] when the address cannot be bound.
    pub async fn bind(
        ports: &Ports,
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
            router: router(AppState::new(ports, settings, diagnostics), auth, settings),
            grace: settings.shutdown_grace_period_ms.duration(),
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
