//! What `skyport-worker` serves its operator on `worker.listen`: `/healthz`
//! (the process is up), `/readyz` (the status store answers and the worker is
//! not stopping; paused intake is listed, not fatal) and `/metrics`.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::json;
use skyport_shared::metrics;
use skyport_shared::ports::{Diagnostics, StatusStore};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

#[derive(Debug, Clone)]
struct Ops {
    status: Arc<dyn StatusStore>,
    diagnostics: Arc<dyn Diagnostics>,
    stopping: CancellationToken,
}

/// The routes; `stopping` fires when the worker begins to drain, which makes it unready.
pub fn router(
    status: Arc<dyn StatusStore>,
    diagnostics: Arc<dyn Diagnostics>,
    stopping: CancellationToken,
) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(render_metrics))
        .fallback(|| async { problem(StatusCode::NOT_FOUND, "no such route") })
        .with_state(Ops {
            status,
            diagnostics,
            stopping,
        })
}

/// Serves `router` on `listener` until `shutdown` fires.
///
/// # Errors
/// The listener's I/O error, if accepting fails.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
}

async fn healthz() -> Response {
    axum::Json(json!({ "status": "ok" })).into_response()
}

async fn readyz(State(ops): State<Ops>) -> Response {
    if ops.stopping.is_cancelled() {
        return problem(StatusCode::SERVICE_UNAVAILABLE, "the worker is stopping");
    }
    if !ops.status.ready().await {
        return problem(
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: status store unavailable",
        );
    }
    let degraded = ops.diagnostics.degraded();
    axum::Json(json!({ "status": "ready", "degraded": degraded })).into_response()
}

async fn render_metrics(headers: HeaderMap) -> Response {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    let (content_type, text) = metrics::global().exposition(accept);
    ([(header::CONTENT_TYPE, content_type)], text).into_response()
}

fn problem(status: StatusCode, detail: &str) -> Response {
    let body = json!({
        "type": "about:blank",
        "title": status.canonical_reason().unwrap_or_default(),
        "status": status.as_u16(),
        "detail": detail,
    });
    (
        status,
        [(header::CONTENT_TYPE, "application/problem+json")],
        body.to_string(),
    )
        .into_response()
}
