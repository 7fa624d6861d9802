//! Liveness and readiness.

use axum::Json;
use axum::extract::State;
use serde_json::{Value, json};

use crate::error::ApiError;
use crate::state::AppState;

/// `GET /healthz`: the process is up.
pub async fn healthz() -> Json<Value> {
    Json(json!({ "status": "ok" }))
}

/// `GET /readyz`: the stream and the status store can be used. What else is
/// degraded (an open circuit that paused the worker) is listed but does not
/// make the gateway unready: taking requests while a backend is down is what
/// the stream is for.
pub async fn readyz(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    let stream = state.publisher.ready().await;
    let store = state.status.ready().await;
    if stream && store {
        let degraded: Vec<String> = state
            .diagnostics
            .iter()
            .flat_map(|d| d.degraded())
            .collect();
        Ok(Json(json!({ "status": "ready", "degraded": degraded })))
    } else {
        let mut down = Vec::new();
        if !stream {
            down.push("stream");
        }
        if !store {
            down.push("status store");
        }
        Err(ApiError::Unavailable {
            retry_after_s: state.retry_after_s,
            source: Some(format!("not ready: {} unavailable", down.join(" and ")).into()),
        })
    }
}
