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
pub mod ids;
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
use skyport_runtime::http::{Server, listen};
use skyport_runtime::{admin, dashboard};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tower_http::compression::CompressionLayer;
use tower_http::compression::predicate::SizeAbove;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::auth::Auth;
use crate::body::BodyLimits;
use crate::error::ApiError;
use crate::openapi::ApiDoc;
use crate::routes::deliveries::{batch, cancel, create, list, reschedule, status};
use crate::routes::operations;
pub use crate::state::AppState;
use crate::waiting::Waiters;

/// The API's routes, each with its part of the OpenAPI document; the
/// operators' (`/admin/redrive`, `/admin/callbacks/resend`) with them when
/// `operators` says so.
fn deliveries(operators: bool) -> OpenApiRouter<AppState> {
    let mut routes = OpenApiRouter::new()
        .routes(routes!(create::create))
        .routes(routes!(batch::batch))
        .routes(routes!(cancel::cancel, reschedule::reschedule));
    if operators {
        routes = routes
            .routes(routes!(operations::redrive::redrive))
            .routes(routes!(operations::resend::resend));
    }
    routes.merge(
        OpenApiRouter::new()
            .routes(routes!(status::status))
            .routes(routes!(list::list))
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
        .merge(deliveries(true))
        .merge(operations())
        .into_openapi()
}

/// The gateway's routes over `state`, as `settings` limit them.
///
/// With `auth`, every route but the probes, `/metrics` and the spec needs
/// credentials: the `/api` routes their method's scope, the `/admin` routes
/// and the dashboard's data (every client's) the admin scope. Without it, the
/// `/admin` routes are not served at all (404) unless
/// `gateway.admin_without_auth` asks for them. The dashboard is served when
/// `settings.dashboard` says so (resolved from the profile by
/// [`skyport_runtime::config::Settings::gateway_settings`]).
///
/// A request meets its limits in this order: credentials (a header check,
/// before anything is buffered for it), then its body, read at most
/// `max_bodies_reading` at once, whole, within `max_body_bytes` once decoded
/// and the body read timeout; then a slot among `max_in_flight` (one more is
/// refused at once with 503 and `Retry-After` rather than queued), or, for a
/// status read that asks to wait, a place among `max_waiting` and its
/// client's `max_waiting_per_client`. With `settings.internal_listen`, the
/// probes and `/metrics` are left to [`internal_router`].
pub fn router(state: AppState, auth: Option<Auth>, settings: &GatewaySettings) -> Router {
    let admission = waiting::Admission::new(
        settings.max_in_flight,
        settings.max_waiting,
        settings.max_waiting_per_client,
        state.retry_after_s,
    );
    let limits = BodyLimits {
        max_bytes: settings.max_body_bytes,
        max_batch_bytes: settings.max_batch_body_bytes,
        timeout: settings.http.body_read_timeout_ms.duration(),
        reading: Arc::new(Semaphore::new(settings.max_bodies_reading)),
        places: u32::try_from(settings.max_bodies_reading).unwrap_or(u32::MAX),
        retry_after_s: state.retry_after_s,
    };
    if auth.is_none() && state.quotas.is_some() {
        tracing::warn!(
            "Quotas are advisory while authentication is off: a request is metered by the ownerId it names, which any caller chooses."
        );
    }
    skyport_runtime::metrics::global().gateway_started();
    let operators = auth.is_some() || settings.admin_without_auth;
    let dashboard = settings.dashboard == Some(true);
    let mut api = deliveries(operators);
    let mut reports = axum::Router::new();
    if operators {
        reports = reports.merge(admin::reports());
    }
    if dashboard {
        let top_clients = state
            .quotas
            .clone()
            .map(|quotas| quotas as Arc<dyn dashboard::TopClients>);
        reports = reports.merge(dashboard::data(top_clients));
    }
    // Route layers: each runs for requests that match one of its routes, so
    // an unknown path or method is still a 404 or 405. The last one added
    // runs first. (A router with no route takes no route layer.)
    let has_reports = operators || dashboard;
    if has_reports {
        reports = reports.route_layer(middleware::from_fn_with_state(
            admission.clone(),
            waiting::admit,
        ));
    }
    api = api
        .route_layer(middleware::from_fn_with_state(admission, waiting::admit))
        .route_layer(middleware::from_fn_with_state(limits, body::read));
    if let Some(auth) = auth {
        if has_reports {
            reports = reports.route_layer(middleware::from_fn_with_state(
                auth.clone(),
                auth::require_credentials,
            ));
        }
        api = api.route_layer(middleware::from_fn_with_state(
            auth,
            auth::require_credentials,
        ));
    }
    if dashboard {
        reports = reports.merge(dashboard::page());
    }
    let mut routes = OpenApiRouter::with_openapi(ApiDoc::openapi()).merge(api);
    routes = if settings.internal_listen.is_some() {
        routes.routes(routes!(admin::probe))
    } else {
        routes.merge(operations())
    };
    let (routes, spec) = routes.split_for_parts();
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

/// The probes and `/metrics` alone, for `gateway.internal_listen`: a port
/// apart from the API's, which an exhausted API cannot starve and which
/// only the cluster (the kubelet, the scraper) needs to reach.
pub fn internal_router(state: &AppState) -> Router {
    admin::internal_router(state.admin.clone())
}

/// One of the gateway's listeners could not be bound.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen on {key} = {address}")]
pub struct BindError {
    key: &'static str,
    address: SocketAddr,
    #[source]
    source: std::io::Error,
}

/// A gateway bound to its address (and its internal one), ready to serve.
#[derive(Debug)]
pub struct Gateway {
    listener: TcpListener,
    router: Router,
    /// `gateway.internal_listen`'s listener and the probes and metrics it serves.
    internal: Option<(TcpListener, Router)>,
    server: Server,
    http: skyport_runtime::config::HttpSettings,
    /// What wakes the status reads that wait.
    waiters: Arc<Waiters>,
    changes: Arc<dyn ChangeSource>,
    wait_poll_interval: std::time::Duration,
}

impl Gateway {
    /// Builds the routes over `ports`, checking credentials with `auth`
    /// (from [`Auth::from_settings`]), and binds `settings.listen` (and
    /// `settings.internal_listen`); `/readyz` also reports what
    /// `diagnostics` say.
    ///
    /// # Errors
    /// [`BindError`] when an address cannot be bound.
    pub async fn bind(
        ports: &Ports,
        settings: &GatewaySettings,
        callbacks: CallbackAcceptance,
        auth: Option<Auth>,
        diagnostics: Vec<Arc<dyn Diagnostics>>,
    ) -> Result<Self, BindError> {
        let bind = |key, address| {
            listen(address, settings.listen_backlog).map_err(|source| BindError {
                key,
                address,
                source,
            })
        };
        let listener = bind("gateway.listen", settings.listen)?;
        let state = AppState::new(ports, settings, callbacks, diagnostics);
        let internal = match settings.internal_listen {
            Some(address) => Some((
                bind("gateway.internal_listen", address)?,
                internal_router(&state),
            )),
            None => None,
        };
        Ok(Self {
            listener,
            waiters: Arc::clone(&state.waiters),
            router: router(state, auth, settings),
            internal,
            server: Server::new(&settings.http, settings.shutdown_grace_period_ms.duration()),
            http: settings.http.clone(),
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

    /// The internal address actually bound, when `gateway.internal_listen` is set.
    ///
    /// # Errors
    /// When the socket cannot say.
    pub fn internal_addr(&self) -> std::io::Result<Option<SocketAddr>> {
        self.internal
            .as_ref()
            .map(|(listener, _)| listener.local_addr())
            .transpose()
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
        // The internal listener answers the probes until the API has drained.
        let internal_shutdown = CancellationToken::new();
        let internal = self.internal.map(|(listener, router)| {
            let http = self.http.clone();
            let shutdown = internal_shutdown.clone();
            tokio::spawn(async move { admin::serve(listener, router, &http, shutdown).await })
        });
        self.server
            .serve(self.listener, self.router, shutdown)
            .await;
        internal_shutdown.cancel();
        if let Some(internal) = internal
            && let Err(e) = internal.await
        {
            tracing::warn!(error = %e, "The gateway's internal listener panicked.");
        }
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
