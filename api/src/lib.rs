//! Skyport's gateway: accepts delivery requests, makes each one durable in the
//! stream before answering 202, and serves their status.
//!
//! Library + thin binary: [`router`] builds the axum app from ports, [`serve`]
//! runs it until the shutdown token fires and drains it within a grace period.

pub mod error;
pub mod extract;
pub mod receipt;
pub mod routes;
pub mod state;

use std::time::Duration;

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::{Extension, Router};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower_http::trace::TraceLayer;

use crate::error::ApiError;
use crate::extract::BodyLimit;
use crate::routes::deliveries::{self, DELIVERY_REQUESTS};
use crate::routes::health;
pub use crate::state::AppState;

/// The gateway's routes over `state`, with bodies limited to `max_body_bytes`.
pub fn router(state: AppState, max_body_bytes: usize) -> Router {
    Router::new()
        .route(DELIVERY_REQUESTS, post(deliveries::create))
        .route(
            &format!("{DELIVERY_REQUESTS}/{{id}}/status"),
            get(deliveries::status),
        )
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .fallback(|| async { ApiError::NotFound("no such route".into()) })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .layer(Extension(BodyLimit(max_body_bytes)))
        .layer(TraceLayer::new_for_http())
        .with_state(state)
}

/// Serves `router` on `listener` until `shutdown` is cancelled, then lets
/// in-flight requests finish for at most `grace`.
///
/// # Errors
/// The listener's I/O error, if accepting fails.
pub async fn serve(
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
