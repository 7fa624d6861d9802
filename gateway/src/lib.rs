//! Skyport's gateway: accepts delivery requests, makes each one durable in the
//! stream before answering 202, and serves their status.
//!
//! A library: [`Gateway::bind`] builds the axum app from the ports and binds
//! its listener, [`Gateway::serve`] runs it until the shutdown token
//! fires and drains it within a grace period.

pub mod auth;
pub mod body;
pub mod error;
pub mod extract;
pub mod heavy_hitters;
pub mod idempotency;
pub mod openapi;
pub mod pacing;
pub mod prefer;
pub mod quotas;
pub mod receipt;
pub mod request_context;
pub mod request_id;
pub mod routes;
pub mod state;
pub mod waiting;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::header;
use axum::middleware;
use axum::routing::get;
use skyport_core::ports::{ChangeSource, Diagnostics, Ports};
use skyport_runtime::config::GatewaySettings;
use skyport_runtime::destination::CallbackAcceptance;
use skyport_runtime::http::Server;
use skyport_runtime::{admin, dashboard};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower::ServiceBuilder;
use tower_http::compression::CompressionLayer;
use tower_http::compression::predicate::SizeAbove;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::auth::Auth;
use crate::body::BodyLimits;
use crate::error::ApiError;
use crate::openapi::ApiDoc;
use crate::routes::{deliveries, listing, operations, reschedule};
pub use crate::state::AppState;
use crate::waiting::Waiters;

/// The API's routes, each with its part of the OpenAPI document.
fn deliveries() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(deliveries::create))
        .routes(routes!(deliveries::cancel, reschedule::reschedule))
        .routes(routes!(operations::redrive))
        .routes(routes!(operations::resend))
        .merge(
            OpenApiRouter::new()
                .routes(routes!(deliveries::status))
                .routes(routes!(listing::list))
                .layer(compression()),
        )
}

/// Responses of at least this many bytes are compressed for a client that
/// accepts it; smaller ones gain less than the encoding costs.
const COMPRESS_FROM_BYTES: u16 = 512;

/// Compression for the routes whose answers are large (a status document
/// with its steps, the spec), and only those: on the others the layer would
/// cost every request its boxed body and gain nothing.
fn compression() -> CompressionLayer<SizeAbove> {
    CompressionLayer::new().compress_when(SizeAbove::new(COMPRESS_FROM_BYTES))
}

/// The probes (with the reference implementation's `/api/probe`) and
/// `/metrics`, which are never shed and need no credentials.
fn operations() -> OpenApiRouter<AppState> {
    admin::routes().routes(routes!(admin::probe))
}

/// The gateway's OpenAPI document, as served at `/openapi.json`.
pub fn openapi() -> utoipa::openapi::OpenApi {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .merge(deliveries())
        .merge(operations())
        .into_openapi()
}

/// The gateway's routes over `state`, as `settings` limit them: bodies to
/// `max_body_bytes` once decoded and to the body read timeout, API requests
/// in flight to `max_in_flight` (one more is refused at once with 503 and
/// `Retry-After` rather than queued; a request takes its slot only once its
/// body has arrived). With `auth`, the `/api` routes, the `/admin`
/// reports and the dashboard's data need credentials (the probes and
/// `/metrics` never do). The dashboard is served when `settings.dashboard`
/// says so (resolved from the profile by [`skyport_runtime::config::Settings::gateway_settings`]).
pub fn router(state: AppState, auth: Option<Auth>, settings: &GatewaySettings) -> Router {
    let admission = waiting::Admission::new(
        settings.max_in_flight,
        settings.max_waiting,
        state.retry_after_s,
    );
    let mut api = deliveries();
    let mut reports = admin::reports();
    if settings.dashboard == Some(true) {
        let top_clients = state
            .quotas
            .clone()
            .map(|quotas| quotas as Arc<dyn dashboard::TopClients>);
        reports = reports.merge(dashboard::data(top_clients));
    }
    if let Some(auth) = &auth {
        reports = reports.route_layer(middleware::from_fn_with_state(
            auth.clone(),
            auth::require_credentials,
        ));
    }
    if settings.dashboard == Some(true) {
        reports = reports.merge(dashboard::page());
    }
    if let Some(auth) = auth {
        // A route layer: it runs for requests that match one of these routes,
        // so an unknown path or method is still a 404 or 405.
        api = api.route_layer(middleware::from_fn_with_state(
            auth,
            auth::require_credentials,
        ));
    }
    let limits = BodyLimits {
        max_bytes: settings.max_body_bytes,
        timeout: settings.http.body_read_timeout_ms.duration(),
    };
    // The body first, so that a slow one never holds a slot; the load limit
    // next, so that a request refused for load costs no credential check.
    // One admission for all routes: a route layer is applied to each route.
    let api = api.route_layer(
        ServiceBuilder::new()
            .layer(middleware::from_fn_with_state(limits, body::read))
            .layer(middleware::from_fn_with_state(admission, waiting::admit)),
    );
    let (routes, spec) = OpenApiRouter::with_openapi(ApiDoc::openapi())
        .merge(api)
        .merge(operations())
        .split_for_parts();
    request_context::count_from_zero(&spec);
    let spec = axum::body::Bytes::from(openapi::to_json(&spec));
    routes
        .merge(reports)
        .route(
            "/openapi.json",
            get(
                move || async move { ([(header::CONTENT_TYPE, "application/json")], spec.clone()) },
            )
            .layer(compression()),
        )
        .fallback(|| async { ApiError::NotFound("no such route".into()) })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        // The body stage has bounded the body already (decoded, which axum's
        // own limit could not see).
        .layer(DefaultBodyLimit::disable())
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
    server: Server,
    /// What wakes the status reads that wait.
    waiters: Arc<Waiters>,
    changes: Arc<dyn ChangeSource>,
    wait_poll_interval: std::time::Duration,
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
        callbacks: CallbackAcceptance,
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
        let state = AppState::new(ports, settings, callbacks, diagnostics);
        Ok(Self {
            listener,
            waiters: Arc::clone(&state.waiters),
            router: router(state, auth, settings),
            server: Server::new(&settings.http, settings.shutdown_grace_period_ms.duration()),
            changes: Arc::clone(&ports.changes),
            wait_poll_interval: settings.wait_poll_interval_ms.duration(),
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
    pub async fn serve(self, shutdown: CancellationToken) {
        let following = shutdown.child_token();
        let follower = tokio::spawn(waiting::follow(
            self.waiters,
            self.changes,
            self.wait_poll_interval,
            following.clone(),
        ));
        self.server
            .serve(self.listener, self.router, shutdown)
            .await;
        following.cancel();
        if let Err(e) = follower.await {
            tracing::warn!(error = %e, "The change-feed follower of waiting status reads panicked.");
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use skyport_runtime::config::HttpSettings;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    use super::*;

    /// Sends `request` on `stream` and reads one answer: its head, then as
    /// many body bytes as its `content-length` says.
    async fn exchange(stream: &mut TcpStream, request: &str) -> (String, String) {
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut received = Vec::new();
        let mut chunk = [0_u8; 4096];
        loop {
            let text = String::from_utf8_lossy(&received).into_owned();
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                let length = head
                    .lines()
                    .find_map(|line| line.strip_prefix("content-length: "))
                    .map_or(0, |n| n.parse::<usize>().unwrap());
                if body.len() >= length {
                    return (head.to_owned(), body.to_owned());
                }
            }
            let read = stream.read(&mut chunk).await.unwrap();
            assert!(read > 0, "the connection closed after {text:?}");
            received.extend_from_slice(&chunk[..read]);
        }
    }

    #[tokio::test]
    async fn a_panicking_handler_is_a_500_problem_naming_the_request_and_the_connection_lives_on() {
        async fn boom() -> &'static str {
            panic!("a handler made to panic")
        }
        let routes = Router::new().route("/boom", get(boom));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let shutdown = CancellationToken::new();
        let server = Server::new(&HttpSettings::default(), std::time::Duration::from_secs(1));
        let routes = routes.layer(middleware::from_fn(request_context::observe));
        let served = tokio::spawn(server.serve(listener, routes, shutdown.clone()));

        let mut stream = TcpStream::connect(address).await.unwrap();
        let (head, body) = exchange(
            &mut stream,
            "GET /boom HTTP/1.1\r\nhost: test\r\nx-request-id: req-42\r\n\r\n",
        )
        .await;
        assert!(head.starts_with("HTTP/1.1 500"), "{head}");
        assert!(
            head.contains("content-type: application/problem+json"),
            "{head}"
        );
        assert!(head.contains("x-request-id: req-42"), "{head}");
        let problem: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(problem["code"], "Internal", "{problem}");
        assert!(
            problem["detail"].as_str().unwrap().contains("req-42"),
            "{problem}"
        );
        // The same connection answers the next request: nothing was dropped.
        let (head, _) = exchange(&mut stream, "GET /boom HTTP/1.1\r\nhost: test\r\n\r\n").await;
        assert!(head.starts_with("HTTP/1.1 500"), "{head}");
        let (head, _) = exchange(&mut stream, "GET /none HTTP/1.1\r\nhost: test\r\n\r\n").await;
        assert!(head.starts_with("HTTP/1.1 404"), "{head}");

        shutdown.cancel();
        served.await.unwrap();
    }
}
