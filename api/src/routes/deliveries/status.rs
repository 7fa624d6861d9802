//! `GET /api/deliveryrequests/{id}/status`: a delivery's status, as JSON or
//! a page, at once or held until it changes.

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Deserialize;
use skyport_core::status::StatusDocument;
use time::OffsetDateTime;
use utoipa::{IntoParams, ToSchema};

use super::resources::{DeliveryStatus, Links};
use super::{DeliveryPath, StatusQuery, entity_tag, id_and_query, status_page};
use crate::auth::Principal;
use crate::error::ApiError;
use crate::openapi::{DeliveryRefusals, Refusals};
use crate::pacing;
use crate::prefer;
use crate::routes::access::{self, not_yet_written, unknown};
use crate::state::AppState;
use crate::waiting::Hold;

/// Reads a delivery's status.
///
/// Answers 200 from the moment the request is accepted: with `Retry-After`
/// while the delivery is in flight, without it once `terminal` is true. A
/// Scheduled delivery names its drone (`droneId`) and package (`packageId`);
/// a Failed one says which step failed and why (`failure`). A browser gets
/// the same status as a page (state, the steps on a timeline, the failure,
/// the callback), reloading itself while the delivery is in flight.
///
/// With a wait (`Prefer: wait=N` or `?wait=N`, N from 1 to 30 seconds) the
/// read is held until the status differs from the client's copy or N seconds
/// pass, and answers the status then (304 when the copy named is still
/// current): no blind polling, and a held read takes no place among
/// `gateway.max_in_flight`. The client's copy is the one `If-None-Match`
/// names, held for even once the delivery is terminal (a Scheduled one may
/// still be rescheduled or cancelled); without it, the one current when the
/// read arrived, and a terminal status is answered at once.
#[utoipa::path(
    get,
    path = "/api/deliveryrequests/{id}/status",
    operation_id = "getDeliveryStatus",
    tag = "deliveries",
    params(
        DeliveryPath,
        StatusQuery,
        ReadQuery,
        ("If-None-Match" = Option<String>, Header, description = "Entity tags of copies the client holds (or `*`): when one is current the answer is 304 without a body. With a wait, the read is held while one of them is current."),
        ("Prefer" = Option<String>, Header, description = "`wait=N` (RFC 7240): hold the read up to N seconds (at most 30) until the status differs from the client's copy, as `?wait=N` does. Past `gateway.max_waiting` held reads, the answer is immediate."),
    ),
    responses(
        (status = 200, description = "The delivery's status: JSON, or a page for a browser (one whose `Accept` names `text/html` above JSON).",
            content(
                (DeliveryStatus = "application/json"),
                (String = "text/html", example = json!("<!DOCTYPE html><html lang=\"en\">…</html>")),
            ),
            headers(
                ("Retry-After" = u32, description = "Present while the delivery is not terminal: seconds to wait before polling again, from when deliveries have recently been reaching their outcome (at least 1); while it is Waiting, until its `runsAt` (at most an hour)."),
                ("retry-after-ms" = u64, description = "Present while the delivery is not terminal: the same wait in milliseconds, as Azure's long-running-operation pollers read it."),
                ("Vary" = String, description = "`Accept`: the answer depends on it."),
                ("ETag" = String, description = "The version of this answer: it changes with every write of the delivery's status (`\"accepted\"` until the worker has written one)."),
            )),
        (status = 202, description = "With `respond=async` (the `Operation-Location` of a POST made with `Prefer: respond-async`) or `gateway.respond_async`: the delivery is still running (`status` NotStarted or Running). Poll again after `Retry-After`.",
            body = DeliveryStatus,
            headers(
                ("Retry-After" = u32, description = "Seconds to wait before polling again (at least 1)."),
                ("retry-after-ms" = u64, description = "The same wait in milliseconds."),
                ("ETag" = String, description = "The version of this answer."),
            )),
        (status = 304, description = "The copy named in `If-None-Match` is current.",
            headers(
                ("ETag" = String, description = "The current version."),
                ("Retry-After" = u32, description = "Present while the delivery is not terminal, as on a 200."),
                ("retry-after-ms" = u64, description = "Present while the delivery is not terminal, as on a 200."),
            )),
        (status = 403, description = "The credentials lack the read scope."),
        DeliveryRefusals,
        (status = 410, description = "The delivery ended longer ago than `store.status_retention_s` and its status was removed."),
        Refusals,
        (status = 503, description = "The status store is unavailable; retry after `Retry-After`."),
    ),
    security(("apiKey" = []), ("bearer" = ["deliveries.read"])),
)]
pub async fn status(
    State(state): State<AppState>,
    principal: Option<Extension<Principal>>,
    hold: Option<Extension<Hold>>,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<StatusQuery>, QueryRejection>,
    read: Result<Query<ReadQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let (id, query) = id_and_query(path, query)?;
    let Query(read) = read.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    if read
        .wait
        .is_some_and(|s| !(1..=prefer::MAX_WAIT_S).contains(&u64::from(s)))
    {
        return Err(ApiError::BadRequest(format!(
            "wait must be whole seconds from 1 to {}",
            prefer::MAX_WAIT_S
        )));
    }
    let base = state.base_url(&headers)?;
    let caller = principal.as_deref();
    let html = status_page::prefers_html(&headers);
    // Registered before the first read, so that no write after it goes unseen.
    let mut held = hold.map(|Extension(hold)| {
        (
            state.waiters.watch(&id),
            tokio::time::Instant::now() + hold.wait,
        )
    });
    let opened = access::open(&state, &id, query.receipt.as_deref(), caller).await?;
    let (accepted_at, lane) = (opened.accepted_at, opened.lane);
    let mut stored = opened.stored;
    let mut at_arrival = None;
    let (document, etag) = loop {
        let (document, version) = match stored.take() {
            Some(stored) => (stored.document, Some(stored.etag)),
            None => (
                not_yet_written(&state, id.clone(), accepted_at, lane)?,
                None,
            ),
        };
        let etag = entity_tag(version.as_ref(), html);
        let Some((watch, until)) = held.as_mut() else {
            break (document, etag);
        };
        // The client's copy: the one it names (held until that is no longer
        // current, even once the delivery is terminal: a Scheduled one may
        // still be rescheduled or cancelled), else the one it would have been
        // answered at arrival (held until the delivery is terminal).
        let current = if headers.contains_key(header::IF_NONE_MATCH) {
            none_match(&headers, &etag)
        } else {
            !document.state.is_terminal() && *at_arrival.get_or_insert_with(|| etag.clone()) == etag
        };
        if !current {
            break (document, etag);
        }
        if tokio::time::timeout_at(*until, watch.changed())
            .await
            .is_err()
        {
            break (document, etag);
        }
        stored = state.status.get(&id).await?;
        if stored
            .as_ref()
            .is_some_and(|stored| !access::may_touch(caller, &stored.document))
        {
            return Err(unknown(&id));
        }
    };
    drop(held);
    let receipt = query.receipt.unwrap_or_default();
    let status = representation(&state, &base, &receipt, document);
    let terminal = status.terminal;
    let wait = (!terminal)
        .then(|| pacing::wait_for(&state.pacing, &status.document, OffsetDateTime::now_utc()));
    // A long-running operation's poller reads a 202 as "still running".
    let running = if terminal || !(read.respond_async() || state.respond_async) {
        StatusCode::OK
    } else {
        StatusCode::ACCEPTED
    };
    let mut response = if none_match(&headers, &etag) {
        StatusCode::NOT_MODIFIED.into_response()
    } else if html {
        status_page::respond(&status, wait.map(pacing::seconds))
    } else {
        (running, Json(status)).into_response()
    };
    let response_headers = response.headers_mut();
    response_headers.append(header::VARY, HeaderValue::from_static("accept"));
    response_headers.insert(header::ETAG, etag);
    if let Some(wait) = wait {
        response_headers.extend(pacing::headers(wait));
    }
    Ok(response)
}

/// The status resource of `document`, its links with `receipt` under `base`
/// (the delivery's time to its outcome observed for the pacing of polls).
pub(crate) fn representation(
    state: &AppState,
    base: &str,
    receipt: &str,
    document: StatusDocument,
) -> DeliveryStatus {
    state.pacing.observe(&document);
    let links = Links::new(base, &document.id, receipt, document.state);
    DeliveryStatus {
        status: document.state.into(),
        terminal: document.state.is_terminal(),
        document,
        links,
    }
}

/// How a status read is answered: how long it may wait for a change, and
/// whether it answers as a long-running operation.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ReadQuery {
    /// Seconds to hold the read until the status differs from the client's
    /// copy: the one `If-None-Match` names, else the one current when the
    /// read arrived (a terminal status is then answered at once). The same
    /// as `Prefer: wait=N`, which it wins over.
    #[param(minimum = 1, maximum = 30)]
    wait: Option<u32>,
    /// `async`: answer 202 while the delivery runs and 200 once it is
    /// terminal, as Azure's long-running-operation pollers expect. The
    /// `Operation-Location` of a POST made with `Prefer: respond-async`
    /// carries it.
    #[param(inline)]
    respond: Option<Respond>,
}

impl ReadQuery {
    fn respond_async(&self) -> bool {
        self.respond == Some(Respond::Async)
    }
}

/// How a status read answers a delivery still running.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Respond {
    /// 202 while the delivery runs.
    Async,
}

/// Whether `If-None-Match` names `etag` (or is `*`), compared weakly as RFC
/// 9110 asks of a GET: the client's copy is current.
fn none_match(headers: &HeaderMap, etag: &HeaderValue) -> bool {
    let Ok(ours) = etag.to_str() else {
        return false;
    };
    headers
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .map(str::trim)
        .any(|theirs| theirs == "*" || theirs.trim_start_matches("W/") == ours)
}
