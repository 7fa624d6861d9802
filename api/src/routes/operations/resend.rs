//! `POST /admin/callbacks/resend`: callbacks marked pending again, so that
//! the notifier sends them.

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use futures_util::{StreamExt, TryStreamExt, stream};
use serde::{Deserialize, Serialize};
use skyport_core::ports::Versioned;
use skyport_core::status::{CallbackOutcome, CallbackState, StatusDocument};
use time::OffsetDateTime;
use utoipa::ToSchema;

use super::{
    AT_ONCE, Operation, OperationParams, Paging, Position, Walk, by_ids, check_ids, delivery_ids,
    in_window, mark,
};
use crate::error::ApiError;
use crate::extract::JsonBody;
use crate::openapi::{OperationRefusals, Refusals};
use crate::state::AppState;

/// Which callbacks to send again: these deliveries', or every callback
/// dead-lettered (given up on) within the window.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ResendRequest {
    /// These deliveries' callbacks, whatever became of them.
    #[serde(default)]
    #[schema(schema_with = delivery_ids)]
    ids: Option<Vec<String>>,
    /// Callbacks given up on at or after this time.
    #[serde(default, with = "time::serde::rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    since: Option<OffsetDateTime>,
    /// Callbacks given up on before this time.
    #[serde(default, with = "time::serde::rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    until: Option<OffsetDateTime>,
}

/// What a resend did (or, dry, would do) in this call.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResendAnswer {
    /// Callbacks marked pending again: the notifier sends them, signed as before.
    pub resent: usize,
    pub dry_run: bool,
    /// Where the resend goes on: send it back as `cursor` with the same
    /// body. Absent once it is done.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

/// Sends callbacks again.
///
/// Each matching delivery's callback is marked pending again on its status;
/// the notifier (wherever it runs) reads the change and sends it, signed as
/// before, retrying for `callbacks.retry_for_ms`. With `ids`, those
/// deliveries' callbacks whatever became of them (each must be terminal with
/// a `callbackUrl`); without, every callback dead-lettered within the
/// window, at most `limit` a call: follow `next` as for a redrive.
#[utoipa::path(
    post,
    path = "/admin/callbacks/resend",
    operation_id = "resendCallbacks",
    tag = "operations",
    params(OperationParams),
    request_body(content = ResendRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "A dry run: what a resend would do.", body = ResendAnswer),
        (status = 202, description = "The callbacks are pending again.", body = ResendAnswer),
        OperationRefusals,
        Refusals,
        (status = 503, description = "The status store is unavailable; retry after `Retry-After`."),
    ),
    security(("apiKey" = []), ("bearer" = ["deliveries.admin"])),
)]
pub async fn resend(
    State(state): State<AppState>,
    query: Result<Query<OperationParams>, QueryRejection>,
    JsonBody(request): JsonBody<ResendRequest>,
) -> Result<(StatusCode, Json<ResendAnswer>), ApiError> {
    let Query(params) = query.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    check_ids(request.ids.as_deref())?;
    let paging = Paging::of(params, Operation::Resend, request.ids.is_some())?;
    let dry_run = paging.dry_run;
    let named = request.ids.is_some();
    let wanted = |document: &StatusDocument| {
        document.state.is_terminal()
            && document.callback_url.is_some()
            && (named
                || document.callback.as_ref().is_some_and(|callback| {
                    callback.state == CallbackState::DeadLettered
                        && in_window(document.updated_at, request.since, request.until)
                }))
    };
    let mut answer = ResendAnswer {
        resent: 0,
        dry_run,
        next: None,
    };
    if let Some(ids) = &request.ids {
        let found = by_ids(&state, ids, None, &wanted).await?;
        resend_found(&state, found, dry_run, &mut answer).await?;
    } else {
        let after = match paging.from {
            Some(Position::Listing(cursor)) => Some(cursor),
            Some(Position::DeadLetters(_)) => {
                return Err(ApiError::BadRequest(
                    "cursor is not one this operation gave out".into(),
                ));
            }
            None => None,
        };
        // A callback is given up on after its delivery was accepted.
        let mut walk = Walk::new(&state, None, request.until, after, &wanted, paging.limit);
        while let Some(found) = walk.next().await? {
            resend_found(&state, found, dry_run, &mut answer).await?;
        }
        answer.next = walk
            .resume()
            .map(|cursor| Position::Listing(cursor).encode(Operation::Resend));
    }
    tracing::info!(?answer, "Callback resend.");
    let status = if dry_run {
        StatusCode::OK
    } else {
        StatusCode::ACCEPTED
    };
    Ok((status, Json(answer)))
}

/// Counts `found` into `answer` and, unless `dry_run`, marks each one's
/// callback pending again, [`AT_ONCE`] at a time.
async fn resend_found(
    state: &AppState,
    found: Vec<Versioned>,
    dry_run: bool,
    answer: &mut ResendAnswer,
) -> Result<(), ApiError> {
    answer.resent += found.len();
    if dry_run {
        return Ok(());
    }
    stream::iter(found)
        .map(|stored| {
            let mut pending = stored.document.clone();
            pending.callback = Some(CallbackOutcome {
                state: CallbackState::Pending,
                announced: pending.state,
                attempts: 0,
                last_error: None,
                delivered_at: None,
                retrying_since: None,
            });
            pending.updated_at = OffsetDateTime::now_utc();
            async move { mark(state, &pending, stored.etag).await }
        })
        .buffer_unordered(AT_ONCE)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}
