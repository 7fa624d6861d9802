//! The admin routes every Skyport server mounts: `/healthz` (the process is
//! up), `/readyz` (what the process needs answers; what is degraded is listed
//! without making it unready) and `/metrics` (this process's registry, as
//! Prometheus text or OpenMetrics), and the operators' `/dashboard` over it. The gateway serves them beside its API,
//! `skyport-worker` on `worker.listen`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use axum::extract::rejection::QueryRejection;
use axum::extract::{FromRef, Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use skyport_core::ports::{ReportError, ReportQuery};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::config::HttpSettings;
use crate::http::Server;
use crate::problem::Problem;
use crate::{dashboard, metrics};

/// What `/readyz` asks of a process.
#[async_trait]
pub trait ReadinessCheck: std::fmt::Debug + Send + Sync + 'static {
    /// What is degraded without making the process unready (one sentence
    /// each), or why it is unready.
    ///
    /// # Errors
    /// The reason the process cannot serve now.
    async fn check(&self) -> Result<Vec<String>, String>;

    /// Summaries by name for `/readyz`'s `details` (the change-feed processor's).
    fn details(&self) -> BTreeMap<String, Value> {
        BTreeMap::new()
    }

    /// The JSON document served at `/admin/{path}`, if the process serves
    /// `path`; a report that lists documents answers the page `query` asks.
    async fn inspect(
        &self,
        _path: &str,
        _query: &ReportQuery,
    ) -> Option<Result<Value, ReportError>> {
        None
    }
}

/// The state of the admin routes; a router whose state holds one mounts them.
#[derive(Debug, Clone)]
pub struct Admin {
    readiness: Arc<dyn ReadinessCheck>,
    retry_after_s: u32,
}

impl Admin {
    /// Admin routes over `readiness`; an unready answer asks to retry after `retry_after_s`.
    pub fn new(readiness: Arc<dyn ReadinessCheck>, retry_after_s: u32) -> Self {
        Self {
            readiness,
            retry_after_s,
        }
    }
}

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
    /// Summaries of the process's background parts, by name (`changeFeed`:
    /// the change-feed processor's leases and pending changes).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schema(value_type = Object)]
    pub details: BTreeMap<String, Value>,
}

/// `/healthz` and `/readyz` (documented: they are part of the gateway's
/// OpenAPI document) and `/metrics`, on any router whose state gives an [`Admin`].
pub fn routes<S>() -> OpenApiRouter<S>
where
    Admin: FromRef<S>,
    S: Clone + Send + Sync + 'static,
{
    OpenApiRouter::new()
        .routes(routes!(healthz))
        .routes(routes!(readyz))
        .route("/metrics", get(render_metrics))
}

/// `/admin/{path}`: what the process's background parts report (the
/// change-feed processor's leases, the dead-lettered callbacks). Their data
/// is the clients', so the gateway puts these behind its credentials.
pub fn reports<S>() -> axum::Router<S>
where
    Admin: FromRef<S>,
    S: Clone + Send + Sync + 'static,
{
    axum::Router::new().route("/admin/{*path}", get(inspect))
}

/// The admin routes and reports alone, as `skyport-worker` serves them on
/// its internal listener, with the operators' page at `/dashboard` when
/// `dashboard` is set: anything else is a 404 problem.
pub fn router(admin: Admin, dashboard: bool) -> Router {
    let mut router = Router::from(routes()).merge(reports());
    if dashboard {
        router = router.merge(dashboard::page()).merge(dashboard::data(None));
    }
    served(router, admin)
}

/// The probes and `/metrics` alone, as the gateway serves them on
/// `gateway.internal_listen`: anything else is a 404 problem.
pub fn internal_router(admin: Admin) -> Router {
    served(Router::from(routes()), admin)
}

/// `routes` over `admin`, with a 404 problem for any other path.
fn served(routes: Router<Admin>, admin: Admin) -> Router {
    routes
        .fallback(|| async {
            Problem::new(
                StatusCode::NOT_FOUND,
                "Not found",
                "NotFound",
                "no such route".into(),
            )
            .respond(None)
        })
        .with_state(admin)
}

/// How long probes in progress may take to finish once the admin listener stops.
const GRACE: Duration = Duration::from_secs(1);

/// Serves `router` (from [`router`]) on `listener` with `settings`' limits
/// until `shutdown` fires.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    settings: &HttpSettings,
    shutdown: CancellationToken,
) {
    Server::new(settings, GRACE)
        .serve(listener, router, shutdown)
        .await;
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
        (status = 503, description = "The stream or the status store is unavailable.",
            headers(("Retry-After" = u32, description = "Seconds to wait before asking again."))),
    ),
    security(()),
)]
pub async fn readyz(State(admin): State<Admin>) -> Response {
    match admin.readiness.check().await {
        Ok(degraded) => Json(Readiness {
            status: "ready".into(),
            degraded,
            details: admin.readiness.details(),
        })
        .into_response(),
        Err(reason) => unready(&admin, "/readyz", reason),
    }
}

/// Readiness as the reference implementation's ingestion service answered
/// it (`GET /api/probe`, its Kubernetes readiness probe), for the probes and
/// clients written against it: the JSON string `"OK"` when ready, else what
/// `/readyz` answers.
#[utoipa::path(
    get,
    path = "/api/probe",
    operation_id = "probe",
    tag = "operations",
    responses(
        (status = 200, description = "Ready to take requests.", body = String, content_type = "application/json", example = json!("OK")),
        (status = 503, description = "The stream or the status store is unavailable.",
            headers(("Retry-After" = u32, description = "Seconds to wait before asking again."))),
    ),
    security(()),
)]
pub async fn probe(State(admin): State<Admin>) -> Response {
    match admin.readiness.check().await {
        Ok(_) => Json("OK").into_response(),
        Err(reason) => unready(&admin, "/api/probe", reason),
    }
}

/// The 503 of a readiness route that found the process unready.
fn unready(admin: &Admin, route: &str, reason: String) -> Response {
    tracing::warn!(%reason, route, "Answered a readiness probe: not ready.");
    Problem::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "Service unavailable",
        "Unavailable",
        reason,
    )
    .respond(Some(admin.retry_after_s))
}

/// The items a report's page holds unless `limit` says otherwise.
const REPORT_LIMIT: usize = 100;
/// The most items a report's page may hold.
const REPORT_MAX_LIMIT: usize = 500;
/// The longest cursor a report takes (those given out are far shorter).
const REPORT_MAX_CURSOR_LEN: usize = 2_048;

/// What a report's query may say: a page.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReportParams {
    limit: Option<usize>,
    cursor: Option<String>,
}

/// What a background part of the process reports to operators
/// (`/admin/change-feed`, `/admin/change-feed/dead-letters`): a report
/// that lists documents answers a page of at most `limit` (1 to 500, 100
/// when absent) with `next`, the `cursor` of the page after it. An unknown
/// or malformed parameter is a 400 problem.
async fn inspect(
    State(admin): State<Admin>,
    Path(path): Path<String>,
    params: Result<Query<ReportParams>, QueryRejection>,
) -> Response {
    let bad_request = |detail: String| {
        Problem::new(StatusCode::BAD_REQUEST, "Bad request", "BadRequest", detail).respond(None)
    };
    let params = match params {
        Ok(Query(params)) => params,
        Err(rejection) => return bad_request(rejection.body_text()),
    };
    let limit = params.limit.unwrap_or(REPORT_LIMIT);
    if !(1..=REPORT_MAX_LIMIT).contains(&limit) {
        return bad_request(format!("limit must be from 1 to {REPORT_MAX_LIMIT}"));
    }
    if params
        .cursor
        .as_ref()
        .is_some_and(|cursor| cursor.is_empty() || cursor.len() > REPORT_MAX_CURSOR_LEN)
    {
        return bad_request("cursor is not one this report gave out".into());
    }
    let query = ReportQuery {
        limit,
        cursor: params.cursor,
    };
    match admin.readiness.inspect(&path, &query).await {
        Some(Ok(document)) => Json(document).into_response(),
        Some(Err(ReportError::Invalid(reason))) => bad_request(reason),
        Some(Err(ReportError::Unavailable(reason))) => Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "Service unavailable",
            "Unavailable",
            reason,
        )
        .respond(Some(admin.retry_after_s)),
        None => Problem::new(
            StatusCode::NOT_FOUND,
            "Not found",
            "NotFound",
            format!("this process reports nothing at /admin/{path}"),
        )
        .respond(None),
    }
}

async fn render_metrics(headers: HeaderMap) -> Response {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    let (content_type, text) = metrics::global().exposition(accept);
    ([(header::CONTENT_TYPE, content_type)], text).into_response()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use axum::body::Body;
    use axum::http::Request;
    use serde_json::json;
    use tower::ServiceExt;

    use super::*;

    #[derive(Debug)]
    struct Fixed(Result<Vec<String>, String>);

    #[async_trait]
    impl ReadinessCheck for Fixed {
        async fn check(&self) -> Result<Vec<String>, String> {
            self.0.clone()
        }
    }

    /// Reports the page it was asked for at `echo`; refuses the cursor
    /// `forged` and is down at `down`.
    #[derive(Debug)]
    struct Reports;

    #[async_trait]
    impl ReadinessCheck for Reports {
        async fn check(&self) -> Result<Vec<String>, String> {
            Ok(Vec::new())
        }

        async fn inspect(
            &self,
            path: &str,
            query: &ReportQuery,
        ) -> Option<Result<Value, ReportError>> {
            match (path, query.cursor.as_deref()) {
                (_, Some("forged")) => Some(Err(ReportError::Invalid("not a cursor".into()))),
                ("echo", cursor) => Some(Ok(json!({"limit": query.limit, "cursor": cursor}))),
                ("down", _) => Some(Err(ReportError::Unavailable("the store is down".into()))),
                _ => None,
            }
        }
    }

    #[tokio::test]
    async fn a_report_is_asked_for_the_page_in_its_query_and_a_bad_query_is_a_400() {
        let ask = |uri: &'static str| async move {
            let response = Router::from(OpenApiRouter::new())
                .merge(reports())
                .with_state(Admin::new(Arc::new(Reports), 3))
                .oneshot(Request::get(uri).body(Body::empty()).unwrap())
                .await
                .unwrap();
            let status = response.status();
            let bytes = axum::body::to_bytes(response.into_body(), 1 << 16)
                .await
                .unwrap();
            (status, serde_json::from_slice::<Value>(&bytes).unwrap())
        };
        assert_eq!(
            ask("/admin/echo").await,
            (StatusCode::OK, json!({"limit": 100, "cursor": null}))
        );
        assert_eq!(
            ask("/admin/echo?limit=7&cursor=abc").await,
            (StatusCode::OK, json!({"limit": 7, "cursor": "abc"}))
        );
        for uri in [
            "/admin/echo?limit=0",
            "/admin/echo?limit=501",
            "/admin/echo?limit=many",
            "/admin/echo?cursor=",
            "/admin/echo?after=abc",
            "/admin/echo?cursor=forged",
        ] {
            let (status, problem) = ask(uri).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{uri}: {problem}");
            assert_eq!(problem["code"], "BadRequest", "{uri}: {problem}");
        }
        assert_eq!(ask("/admin/down").await.0, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(ask("/admin/other").await.0, StatusCode::NOT_FOUND);
    }

    #[tokio::test]
    async fn the_reference_probe_answers_ok_when_ready_and_as_readyz_when_not() {
        let router = |check| {
            Router::from(routes().routes(routes!(probe))).with_state(Admin::new(Arc::new(check), 3))
        };
        let ask = |check: Fixed, path: &'static str| async move {
            let response = router(check)
                .oneshot(Request::get(path).body(Body::empty()).unwrap())
                .await
                .unwrap();
            let (parts, body) = response.into_parts();
            let bytes = axum::body::to_bytes(body, 1 << 16).await.unwrap();
            (parts, serde_json::from_slice::<Value>(&bytes).unwrap())
        };
        let (ready, body) = ask(Fixed(Ok(vec!["degraded".into()])), "/api/probe").await;
        assert_eq!((ready.status, body), (StatusCode::OK, json!("OK")));
        for path in ["/api/probe", "/readyz"] {
            let (unready, body) = ask(Fixed(Err("the stream is down".into())), path).await;
            assert_eq!(unready.status, StatusCode::SERVICE_UNAVAILABLE, "{path}");
            assert_eq!(unready.headers[header::RETRY_AFTER], "3");
            assert_eq!(
                unready.headers[header::CONTENT_TYPE],
                "application/problem+json"
            );
            assert_eq!(body["detail"], "the stream is down");
        }
    }
}
