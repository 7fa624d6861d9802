//! Liveness and readiness.

use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::error::{ApiError, Problem};
use crate::state::AppState;

/// The process is up.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Health {
    #[schema(example = "ok")]
    pub status: String,
}

/// The stream and the status store can be used.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Readiness {
    #[schema(example = "ready")]
    pub status: String,
    /// What is degraded without making the gateway unready (an open circuit that paused the worker).
    pub degraded: Vec<String>,
}

/// Liveness: the process is up.
#[utoipa::path(
    get,
    path = "/healthz",
    operation_id = "healthz",
    tag = "operations",
    responses((status = 200, description = "The process is up.", body = Health)),
    security(()),
)]
pub async fn healthz() -> Json<Health> {
    Json(Health {
        status: "ok".into(),
    })
}

/// Readiness: the stream and the status store can be used.
///
/// What else is degraded is listed but does not make the gateway unready:
/// taking requests while a backend is down is what the stream is for.
#[utoipa::path(
    get,
    path = "/readyz",
    operation_id = "readyz",
    tag = "operations",
    responses(
        (status = 200, description = "Ready to take requests.", body = Readiness),
        (status = 503, description = "The stream or the status store is unavailable.", body = Problem, content_type = "application/problem+json",
            headers(("Retry-After" = u32, description = "Seconds to wait before asking again."))),
    ),
    security(()),
)]
pub async fn readyz(State(state): State<AppState>) -> Result<Json<Readiness>, ApiError> {
    let stream = state.publisher.ready().await;
    let store = state.status.ready().await;
    if stream && store {
        let degraded: Vec<String> = state
            .diagnostics
            .iter()
            .flat_map(|d| d.degraded())
            .collect();
        Ok(Json(Readiness {
            status: "ready".into(),
            degraded,
        }))
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
