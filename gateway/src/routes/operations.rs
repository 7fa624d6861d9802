//! The operators' routes, behind the admin scope when authentication is on:
//! `POST /admin/redrive` runs Failed deliveries again in a new attempt epoch
//! and publishes dead-lettered events again; `POST /admin/callbacks/resend`
//! marks callbacks pending again so that the notifier sends them.
//!
//! Both find what they act on through the status store's listing (every
//! client's deliveries, newest first) or by explicit ids, and write each
//! document on the version they read, so a document that moved meanwhile is
//! left to what moved it.

use axum::Extension;
use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use futures_util::{StreamExt, TryStreamExt, stream};
use serde::{Deserialize, Serialize};
use skyport_core::event::{DeliveryRequested, Event};
use skyport_core::ports::{Lane, ListQuery, Precondition, StatusStoreError, Versioned};
use skyport_core::request::{DeliveryRequest, is_valid_id};
use skyport_core::status::{
    CallbackOutcome, CallbackState, DeliveryState, QueuedRedrive, StatusDocument, Step, StepResult,
};
use time::OffsetDateTime;
use utoipa::{IntoParams, ToSchema};

use crate::auth::Principal;
use crate::error::ApiError;
use crate::extract::JsonBody;
use crate::openapi::{OperationRefusals, Refusals};
use crate::state::AppState;

/// The most ids one request may name (so that a body stays well within
/// `gateway.max_body_bytes`).
const MAX_IDS: usize = 500;
/// The listing's page size while an operation looks for what it acts on.
const PAGE: usize = 500;
/// The longest reason a redrive may give.
const MAX_REASON_LEN: usize = 256;
/// Deliveries an operation writes at once (a store like Cosmos DB batches
/// writes, so one at a time would wait for a batch each).
const AT_ONCE: usize = 64;

/// Whether to act or only count.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct DryRun {
    /// Count what would be done, and do nothing.
    #[serde(default)]
    dry_run: bool,
}

/// Which Failed deliveries (and dead-lettered events) to run again. The
/// filters narrow each other; `ids` names deliveries instead of searching.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RedriveRequest {
    /// Only deliveries that failed at this step.
    #[serde(default)]
    failed_step: Option<Step>,
    /// Only deliveries that failed at or after this time.
    #[serde(default, with = "time::serde::rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    failed_since: Option<OffsetDateTime>,
    /// Only deliveries that failed before this time.
    #[serde(default, with = "time::serde::rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    failed_until: Option<OffsetDateTime>,
    /// These deliveries (each must have failed), instead of a search.
    #[serde(default)]
    #[schema(schema_with = delivery_ids)]
    ids: Option<Vec<String>>,
    /// Also publish the dead-lettered events again (those dead-lettered
    /// within `failedSince` and `failedUntil`), and forget them.
    #[serde(default)]
    dead_letters: bool,
    /// Why, kept on each delivery's new epoch.
    #[serde(default)]
    #[schema(max_length = 256)]
    reason: Option<String>,
}

/// The schema of `ids`: at most [`MAX_IDS`] delivery ids.
fn delivery_ids() -> utoipa::openapi::schema::Array {
    let id = utoipa::openapi::ObjectBuilder::new()
        .schema_type(utoipa::openapi::Type::String)
        .min_length(Some(1))
        .max_length(Some(64))
        .pattern(Some(r"^[A-Za-z0-9._-]{1,64}$"));
    utoipa::openapi::schema::ArrayBuilder::new()
        .items(id)
        .max_items(Some(MAX_IDS))
        .description(Some("Delivery ids (at most 500)."))
        .build()
}

/// What a redrive did (or, dry, would do).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RedriveAnswer {
    /// Failed deliveries the filter matched.
    pub matched: usize,
    /// Of those, queued now as a new attempt epoch.
    pub queued: usize,
    /// Of those, already queued for a redrive that has not begun: left as they are.
    pub already_queued: usize,
    /// Of those, kept from before the request was recorded on its status,
    /// so there is nothing to run again.
    pub without_request: usize,
    /// Dead-lettered events published again.
    pub dead_letters: usize,
    /// Dead-lettered events that still cannot be read, left as they are.
    pub unreadable_dead_letters: usize,
    pub dry_run: bool,
}

/// Runs Failed deliveries again, each in a new attempt epoch.
///
/// Every match is published again as a delivery request of its next epoch,
/// to its own partition; the worker runs it as a new attempt whose calls
/// carry the epoch in their idempotency keys (a booking that was undone is
/// booked anew; a replay of the same epoch books nothing twice). A delivery
/// already queued for a redrive is left as it is, so a repeated redrive
/// changes nothing. Workers start at most `worker.redrive_per_s` a second.
#[utoipa::path(
    post,
    path = "/admin/redrive",
    operation_id = "redriveDeliveries",
    tag = "operations",
    params(DryRun),
    request_body(content = RedriveRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "A dry run: what a redrive would do.", body = RedriveAnswer),
        (status = 202, description = "The redrives are durable in the stream.", body = RedriveAnswer),
        OperationRefusals,
        (status = 409, description = "The gateway writes events of schema version 1, which has no later epochs (`gateway.event_schema_version`)."),
        Refusals,
        (status = 503, description = "The stream or the status store is unavailable; retry after `Retry-After`."),
    ),
    security(("apiKey" = []), ("bearer" = ["deliveries.admin"])),
)]
pub async fn redrive(
    State(state): State<AppState>,
    principal: Option<Extension<Principal>>,
    query: Result<Query<DryRun>, QueryRejection>,
    JsonBody(request): JsonBody<RedriveRequest>,
) -> Result<(StatusCode, Json<RedriveAnswer>), ApiError> {
    let Query(DryRun { dry_run }) = query.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    check_ids(request.ids.as_deref())?;
    if request
        .reason
        .as_ref()
        .is_some_and(|reason| reason.len() > MAX_REASON_LEN)
    {
        return Err(invalid(
            "reason",
            format!("must be at most {MAX_REASON_LEN} bytes"),
        ));
    }
    if state.event_schema_version < 2 {
        return Err(ApiError::Conflict(
            "a redrive publishes a later attempt epoch, which needs event schema version 2; \
             gateway.event_schema_version is 1 (raise it once every worker reads version 2)"
                .into(),
        ));
    }
    let requested_by = principal.map(|Extension(p)| p.name);
    let reason = request.reason.clone().unwrap_or_else(|| "redrive".into());
    let mut answer = RedriveAnswer {
        matched: 0,
        queued: 0,
        already_queued: 0,
        without_request: 0,
        dead_letters: 0,
        unreadable_dead_letters: 0,
        dry_run,
    };
    let failed = |document: &StatusDocument| redrive_matches(&request, document);
    let matches = find(
        &state,
        request.ids.as_deref(),
        request.failed_until,
        Some(DeliveryState::Failed),
        &failed,
    )
    .await?;
    let mut due = Vec::new();
    for stored in matches {
        answer.matched += 1;
        let document = &stored.document;
        if document
            .redrive
            .as_ref()
            .is_some_and(|queued| queued.epoch > document.epoch)
        {
            answer.already_queued += 1;
            continue;
        }
        let Some(delivery) = document.request.clone() else {
            answer.without_request += 1;
            continue;
        };
        answer.queued += 1;
        due.push((stored, delivery));
    }
    if !dry_run {
        let queued_at = OffsetDateTime::now_utc();
        stream::iter(due)
            .map(|(stored, delivery)| {
                let queued = QueuedRedrive {
                    epoch: stored.document.epoch + 1,
                    requested_at: queued_at,
                    reason: reason.clone(),
                    requested_by: requested_by.clone(),
                };
                queue_redrive(&state, stored, delivery, queued)
            })
            .buffer_unordered(AT_ONCE)
            .try_collect::<Vec<()>>()
            .await?;
    }
    if request.dead_letters {
        redrive_dead_letters(&state, &request, dry_run, &mut answer).await?;
    }
    tracing::info!(?answer, ?requested_by, "Redrive.");
    let status = if dry_run {
        StatusCode::OK
    } else {
        StatusCode::ACCEPTED
    };
    Ok((status, Json(answer)))
}

/// Publishes a Failed delivery again as a request of the epoch `queued`
/// names, then marks it queued. Published first: a redrive is never marked
/// queued without its event. The mark lets a repeated redrive skip it until
/// it begins (a worker that began it first has moved the document on).
async fn queue_redrive(
    state: &AppState,
    stored: Versioned,
    delivery: DeliveryRequest,
    queued: QueuedRedrive,
) -> Result<(), ApiError> {
    let document = &stored.document;
    let event = Event::DeliveryRequested(Box::new(DeliveryRequested {
        delivery_id: document.id.clone(),
        accepted_at: document.created_at,
        traceparent: document.traceparent.clone(),
        idempotency_key: None,
        principal: document.principal.clone(),
        epoch: queued.epoch,
        redrive: Some(queued.clone()),
        request: delivery,
    }));
    publish(state, &event, document.lane).await?;
    let mut marked = stored.document.clone();
    marked.redrive = Some(queued);
    mark(state, &marked, stored.etag).await
}

/// Whether a Failed document is one `request` asks for.
fn redrive_matches(request: &RedriveRequest, document: &StatusDocument) -> bool {
    let failure = document.failure.as_ref();
    let step_matches = request
        .failed_step
        .is_none_or(|step| failure.is_some_and(|f| f.step == step));
    let failed_at = failed_at(document);
    step_matches && in_window(failed_at, request.failed_since, request.failed_until)
}

/// When a Failed delivery failed: its failed step's time, else its last write.
fn failed_at(document: &StatusDocument) -> OffsetDateTime {
    document
        .steps
        .iter()
        .find(|outcome| outcome.result == StepResult::Failed)
        .map_or(document.updated_at, |outcome| outcome.at)
}

fn in_window(
    at: OffsetDateTime,
    since: Option<OffsetDateTime>,
    until: Option<OffsetDateTime>,
) -> bool {
    since.is_none_or(|since| at >= since) && until.is_none_or(|until| at < until)
}

/// Publishes each dead-lettered event the window holds again (re-encoded at
/// the gateway's schema version), then forgets it.
async fn redrive_dead_letters(
    state: &AppState,
    request: &RedriveRequest,
    dry_run: bool,
    answer: &mut RedriveAnswer,
) -> Result<(), ApiError> {
    let letters = state
        .dead_letters
        .events()
        .await
        .map_err(|e| unavailable(Box::new(e)))?;
    for letter in letters {
        if !in_window(letter.at, request.failed_since, request.failed_until) {
            continue;
        }
        let Ok(event) = Event::decode(&letter.payload) else {
            answer.unreadable_dead_letters += 1;
            continue;
        };
        if request
            .ids
            .as_ref()
            .is_some_and(|ids| !ids.iter().any(|id| id == event.delivery_id()))
        {
            continue;
        }
        answer.dead_letters += 1;
        if dry_run {
            continue;
        }
        let lane = lane_of(state, &event).await?;
        publish(state, &event, lane).await?;
        state
            .dead_letters
            .remove(letter.partition, letter.offset)
            .await
            .map_err(|e| unavailable(Box::new(e)))?;
    }
    Ok(())
}

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

/// What a resend did (or, dry, would do).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResendAnswer {
    /// Callbacks marked pending again: the notifier sends them, signed as before.
    pub resent: usize,
    pub dry_run: bool,
}

/// Sends callbacks again.
///
/// Each matching delivery's callback is marked pending again on its status;
/// the notifier (wherever it runs) reads the change and sends it, signed as
/// before, retrying for `callbacks.retry_for_ms`. With `ids`, those
/// deliveries' callbacks whatever became of them (each must be terminal with
/// a `callbackUrl`); without, every callback dead-lettered within the window.
#[utoipa::path(
    post,
    path = "/admin/callbacks/resend",
    operation_id = "resendCallbacks",
    tag = "operations",
    params(DryRun),
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
    query: Result<Query<DryRun>, QueryRejection>,
    JsonBody(request): JsonBody<ResendRequest>,
) -> Result<(StatusCode, Json<ResendAnswer>), ApiError> {
    let Query(DryRun { dry_run }) = query.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    check_ids(request.ids.as_deref())?;
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
    let mut answer = ResendAnswer { resent: 0, dry_run };
    let due = find(&state, request.ids.as_deref(), None, None, &wanted).await?;
    answer.resent = due.len();
    if !dry_run {
        stream::iter(due)
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
                let state = &state;
                async move { mark(state, &pending, stored.etag).await }
            })
            .buffer_unordered(AT_ONCE)
            .try_collect::<Vec<()>>()
            .await?;
    }
    tracing::info!(?answer, "Callback resend.");
    let status = if dry_run {
        StatusCode::OK
    } else {
        StatusCode::ACCEPTED
    };
    Ok((status, Json(answer)))
}

/// The documents `ids` name, or (without ids) those the listing holds that
/// are in `state` and were accepted before `until`; each only when `wanted`.
async fn find(
    state: &AppState,
    ids: Option<&[String]>,
    until: Option<OffsetDateTime>,
    in_state: Option<DeliveryState>,
    wanted: &(dyn Fn(&StatusDocument) -> bool + Sync),
) -> Result<Vec<Versioned>, ApiError> {
    let mut found = Vec::new();
    if let Some(ids) = ids {
        for id in ids {
            if let Some(stored) = state.status.get(id).await?
                && in_state.is_none_or(|s| stored.document.state == s)
                && wanted(&stored.document)
            {
                found.push(stored);
            }
        }
        return Ok(found);
    }
    let mut query = ListQuery {
        principal: None,
        owner: None,
        state: in_state,
        since: None,
        // A delivery is accepted before it fails or calls back.
        until,
        limit: PAGE,
        after: None,
    };
    loop {
        let page = state.status.list(&query).await?;
        for document in page.items {
            if wanted(&document) {
                // The listing's copy may be behind: act on the version read now.
                if let Some(stored) = state.status.get(&document.id).await?
                    && wanted(&stored.document)
                {
                    found.push(stored);
                }
            }
        }
        match page.next {
            Some(next) => query.after = Some(next),
            None => return Ok(found),
        }
    }
}

/// Writes `document` on `etag`; one that moved meanwhile is left to what moved it.
async fn mark(
    state: &AppState,
    document: &StatusDocument,
    etag: skyport_core::ports::ETag,
) -> Result<(), ApiError> {
    match state
        .status
        .put(document, Precondition::IfMatch(etag))
        .await
    {
        Ok(_) | Err(StatusStoreError::PreconditionFailed) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The lane of a dead-lettered event's delivery: the one its status
/// records, else (a request the worker never recorded) the one it asked for.
async fn lane_of(state: &AppState, event: &Event) -> Result<Lane, ApiError> {
    Ok(match state.status.get(event.delivery_id()).await? {
        Some(stored) => stored.document.lane,
        None => match event {
            Event::DeliveryRequested(requested) => state.lane_of(requested.request.expedited),
            Event::CancellationRequested(_) | Event::DeliveryRescheduled(_) => Lane::Normal,
        },
    })
}

async fn publish(state: &AppState, event: &Event, lane: Lane) -> Result<(), ApiError> {
    let outbound = event
        .outbound_as(state.event_schema_version, lane)
        .map_err(|e| ApiError::Internal(Box::new(e)))?;
    state.publisher.publish(outbound).await?;
    Ok(())
}

fn check_ids(ids: Option<&[String]>) -> Result<(), ApiError> {
    let Some(ids) = ids else {
        return Ok(());
    };
    if ids.len() > MAX_IDS {
        return Err(invalid(
            "ids",
            format!("must name at most {MAX_IDS} deliveries"),
        ));
    }
    match ids.iter().find(|id| !is_valid_id(id)) {
        Some(id) => Err(invalid("ids", format!("{id:?} is not a delivery id"))),
        None => Ok(()),
    }
}

fn invalid(field: &str, message: String) -> ApiError {
    ApiError::Validation(vec![skyport_core::request::FieldError::new(field, message)])
}

fn unavailable(source: Box<dyn std::error::Error + Send + Sync>) -> ApiError {
    ApiError::Unavailable {
        retry_after_s: 1,
        source: Some(source),
    }
}
