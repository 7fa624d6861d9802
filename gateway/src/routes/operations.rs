//! The operators' routes, behind the admin scope when authentication is on:
//! `POST /admin/redrive` runs Failed deliveries again in a new attempt epoch
//! and publishes dead-lettered events again; `POST /admin/callbacks/resend`
//! marks callbacks pending again so that the notifier sends them.
//!
//! Both find what they act on through the status store's listing (every
//! client's deliveries, newest first) or by explicit ids, and write each
//! document on the version they read, so a document that moved meanwhile is
//! left to what moved it.
//!
//! A search goes a listing page at a time: it acts on a page's matches
//! (publish, then mark) before it reads the next, so memory holds one page
//! however many match. A call stops once it has matched `limit` (or read
//! [`PAGES_PER_CALL`] pages) and answers `next`, an opaque token the operator
//! sends back as `cursor` to go on: through the Failed deliveries, then, with
//! `deadLetters`, the dead-lettered events. A call with `ids` is one call.

use axum::Extension;
use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use futures_util::{StreamExt, TryStreamExt, stream};
use serde::{Deserialize, Serialize};
use skyport_core::event::{DeliveryRequested, Event};
use skyport_core::ports::{Lane, ListCursor, ListQuery, Precondition, StatusStoreError, Versioned};
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
/// The most listing pages one call reads (25,000 documents), so that a
/// filter that matches little still answers soon, with `next`.
const PAGES_PER_CALL: usize = 50;
/// Dead-lettered events read at once (each holds its raw event).
const DEAD_LETTER_PAGE: usize = 100;
/// The most dead-letter pages one call reads.
const DEAD_LETTER_PAGES_PER_CALL: usize = 50;
/// What one call matches unless `limit` says otherwise.
const DEFAULT_LIMIT: usize = 1_000;
/// The most one call may match: its memory is a page whatever the limit,
/// so this bounds its time (BENCHMARKS.md: a call of 10,000 on the
/// embedded store takes seconds, well within a client's timeout).
const MAX_LIMIT: usize = 10_000;
/// The longest cursor this API gives out is well within this.
const MAX_CURSOR_LEN: usize = 256;
/// The longest reason a redrive may give.
const MAX_REASON_LEN: usize = 256;
/// Deliveries an operation writes at once (a store like Cosmos DB batches
/// writes, so one at a time would wait for a batch each).
const AT_ONCE: usize = 64;

/// Whether to act or only count, and which part of the matches this call takes.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct OperationParams {
    /// Count what would be done, and do nothing.
    #[serde(default)]
    dry_run: bool,
    /// The most deliveries (and, for a redrive, dead-lettered events) this
    /// call matches: 1 to 10,000, 1,000 when absent. Not with `ids`.
    #[param(minimum = 1, maximum = 10000)]
    limit: Option<usize>,
    /// Where this call goes on: the `next` of the previous answer, sent
    /// with the same body. Not with `ids`.
    #[param(max_length = 256)]
    cursor: Option<String>,
}

/// The operation a continuation token belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Operation {
    Redrive,
    Resend,
}

impl Operation {
    fn tag(self) -> &'static str {
        match self {
            Self::Redrive => "r",
            Self::Resend => "c",
        }
    }
}

/// Where an operation goes on: what its continuation token holds.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Position {
    /// In the listing, after this document.
    Listing(ListCursor),
    /// In the dead-lettered events, after the one at this position (from
    /// the first when `None`); only a redrive's.
    DeadLetters(Option<(u32, u64)>),
}

impl Position {
    /// The token as the operator holds it: opaque, URL-safe.
    fn encode(&self, operation: Operation) -> String {
        let tag = operation.tag();
        let text = match self {
            Self::Listing(cursor) => format!("{tag}.d.{}.{}", cursor.created_ms, cursor.id),
            Self::DeadLetters(None) => format!("{tag}.l"),
            Self::DeadLetters(Some((partition, offset))) => {
                format!("{tag}.l.{partition}.{offset}")
            }
        };
        URL_SAFE_NO_PAD.encode(text)
    }

    /// A token `operation` gave out; anything else (another operation's, a
    /// redrive's dead-letter position for a resend, a forged one) is a 400.
    fn decode(operation: Operation, token: &str) -> Result<Self, ApiError> {
        let refused = || ApiError::BadRequest("cursor is not one this operation gave out".into());
        if token.len() > MAX_CURSOR_LEN {
            return Err(refused());
        }
        let text = URL_SAFE_NO_PAD
            .decode(token)
            .ok()
            .and_then(|bytes| String::from_utf8(bytes).ok())
            .ok_or_else(refused)?;
        let mut parts = text.splitn(4, '.');
        if parts.next() != Some(operation.tag()) {
            return Err(refused());
        }
        let position = match (operation, parts.next(), parts.next(), parts.next()) {
            (_, Some("d"), Some(created_ms), Some(id)) => {
                let created_ms = created_ms.parse().ok().ok_or_else(refused)?;
                if !is_valid_id(id) {
                    return Err(refused());
                }
                Self::Listing(ListCursor {
                    created_ms,
                    id: id.to_owned(),
                })
            }
            (Operation::Redrive, Some("l"), None, None) => Self::DeadLetters(None),
            (Operation::Redrive, Some("l"), Some(partition), Some(offset)) => {
                let partition = partition.parse().ok().ok_or_else(refused)?;
                let offset = offset.parse().ok().ok_or_else(refused)?;
                Self::DeadLetters(Some((partition, offset)))
            }
            _ => return Err(refused()),
        };
        Ok(position)
    }
}

/// What a call of a search takes: at most `limit` matches, from `from`
/// (the start when `None`).
struct Paging {
    dry_run: bool,
    limit: usize,
    from: Option<Position>,
}

impl Paging {
    /// `params` checked for `operation`; `named`: the body names its ids,
    /// which is one call, so a limit or a cursor is refused.
    fn of(params: OperationParams, operation: Operation, named: bool) -> Result<Self, ApiError> {
        if named && (params.limit.is_some() || params.cursor.is_some()) {
            return Err(ApiError::BadRequest(
                "limit and cursor page a search; a call with ids acts on those ids at once".into(),
            ));
        }
        let limit = params.limit.unwrap_or(DEFAULT_LIMIT);
        if !(1..=MAX_LIMIT).contains(&limit) {
            return Err(ApiError::BadRequest(format!(
                "limit must be from 1 to {MAX_LIMIT}"
            )));
        }
        let from = params
            .cursor
            .as_deref()
            .map(|token| Position::decode(operation, token))
            .transpose()?;
        Ok(Self {
            dry_run: params.dry_run,
            limit,
            from,
        })
    }
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

/// What a redrive did (or, dry, would do) in this call.
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
    /// Where the redrive goes on: send it back as `cursor` with the same
    /// body. Absent once it is done.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

/// Runs Failed deliveries again, each in a new attempt epoch.
///
/// Every match is published again as a delivery request of its next epoch,
/// to its own partition; the worker runs it as a new attempt whose calls
/// carry the epoch in their idempotency keys (a booking that was undone is
/// booked anew; a replay of the same epoch books nothing twice). A delivery
/// already queued for a redrive is left as it is, so a repeated redrive
/// changes nothing. Workers start at most `worker.redrive_per_s` a second.
///
/// Without `ids`, a call matches at most `limit` (Failed deliveries, then
/// dead-lettered events) and answers `next` while there may be more: send
/// the same body again with `cursor` set to it until an answer has none. A
/// call may match fewer than `limit` and still answer `next`.
#[utoipa::path(
    post,
    path = "/admin/redrive",
    operation_id = "redriveDeliveries",
    tag = "operations",
    params(OperationParams),
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
    query: Result<Query<OperationParams>, QueryRejection>,
    JsonBody(request): JsonBody<RedriveRequest>,
) -> Result<(StatusCode, Json<RedriveAnswer>), ApiError> {
    let Query(params) = query.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    check_ids(request.ids.as_deref())?;
    let paging = Paging::of(params, Operation::Redrive, request.ids.is_some())?;
    if matches!(paging.from, Some(Position::DeadLetters(_))) && !request.dead_letters {
        return Err(ApiError::BadRequest(
            "cursor goes on in the dead-lettered events, which this body does not ask for \
             (deadLetters)"
                .into(),
        ));
    }
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
    let dry_run = paging.dry_run;
    // Each delivery's redrive is this one for the epoch after its own.
    let queued = QueuedRedrive {
        epoch: 0,
        requested_at: OffsetDateTime::now_utc(),
        reason: request.reason.clone().unwrap_or_else(|| "redrive".into()),
        requested_by: principal.map(|Extension(p)| p.name),
    };
    let mut answer = RedriveAnswer {
        matched: 0,
        queued: 0,
        already_queued: 0,
        without_request: 0,
        dead_letters: 0,
        unreadable_dead_letters: 0,
        dry_run,
        next: None,
    };
    let failed = |document: &StatusDocument| redrive_matches(&request, document);
    if let Some(ids) = &request.ids {
        let found = by_ids(&state, ids, Some(DeliveryState::Failed), &failed).await?;
        redrive_found(&state, found, &queued, dry_run, &mut answer).await?;
        if request.dead_letters {
            let mut letters = DeadLetterWalk {
                after: None,
                room: usize::MAX,
                pages: usize::MAX,
            };
            redrive_dead_letters(&state, &request, dry_run, &mut letters, &mut answer).await?;
        }
    } else {
        let mut room = paging.limit;
        let mut next = None;
        let letters_from = match paging.from {
            Some(Position::DeadLetters(after)) => Some(after),
            from => {
                let after = match from {
                    Some(Position::Listing(cursor)) => Some(cursor),
                    _ => None,
                };
                let mut walk = Walk::new(
                    &state,
                    Some(DeliveryState::Failed),
                    request.failed_until,
                    after,
                    &failed,
                    room,
                );
                while let Some(found) = walk.next().await? {
                    redrive_found(&state, found, &queued, dry_run, &mut answer).await?;
                }
                room = walk.room;
                match walk.resume() {
                    Some(cursor) => {
                        next = Some(Position::Listing(cursor));
                        None
                    }
                    None => request.dead_letters.then_some(None),
                }
            }
        };
        if let Some(after) = letters_from {
            next = if room == 0 {
                Some(Position::DeadLetters(after))
            } else {
                let mut letters = DeadLetterWalk {
                    after,
                    room,
                    pages: DEAD_LETTER_PAGES_PER_CALL,
                };
                let done =
                    redrive_dead_letters(&state, &request, dry_run, &mut letters, &mut answer)
                        .await?;
                (!done).then_some(Position::DeadLetters(letters.after))
            };
        }
        answer.next = next.map(|position| position.encode(Operation::Redrive));
    }
    tracing::info!(?answer, requested_by = ?queued.requested_by, "Redrive.");
    let status = if dry_run {
        StatusCode::OK
    } else {
        StatusCode::ACCEPTED
    };
    Ok((status, Json(answer)))
}

/// Counts `found` (Failed deliveries a redrive matched) into `answer` and,
/// unless `dry_run`, queues each that has a request and is not queued yet
/// as the epoch after its own, [`AT_ONCE`] at a time.
async fn redrive_found(
    state: &AppState,
    found: Vec<Versioned>,
    queued: &QueuedRedrive,
    dry_run: bool,
    answer: &mut RedriveAnswer,
) -> Result<(), ApiError> {
    let mut due = Vec::with_capacity(found.len());
    for stored in found {
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
    if dry_run {
        return Ok(());
    }
    stream::iter(due)
        .map(|(stored, delivery)| {
            let queued = QueuedRedrive {
                epoch: stored.document.epoch + 1,
                ..queued.clone()
            };
            queue_redrive(state, stored, delivery, queued)
        })
        .buffer_unordered(AT_ONCE)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
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

/// Where a call reads the dead-lettered events: after `after` (from the
/// first when `None`), until `room` have matched or it has read `pages` pages.
struct DeadLetterWalk {
    after: Option<(u32, u64)>,
    room: usize,
    pages: usize,
}

/// Publishes each dead-lettered event the window (and `ids`) holds again
/// (re-encoded at the gateway's schema version), then forgets it, a page at
/// a time, moving `walk` on past each one read. Answers whether it read
/// them all (else the next call goes on after `walk.after`).
async fn redrive_dead_letters(
    state: &AppState,
    request: &RedriveRequest,
    dry_run: bool,
    walk: &mut DeadLetterWalk,
    answer: &mut RedriveAnswer,
) -> Result<bool, ApiError> {
    for _ in 0..walk.pages {
        let letters = state
            .dead_letters
            .events(walk.after, DEAD_LETTER_PAGE)
            .await
            .map_err(|e| unavailable(Box::new(e)))?;
        let last_page = letters.len() < DEAD_LETTER_PAGE;
        for letter in letters {
            if walk.room == 0 {
                return Ok(false);
            }
            walk.after = Some((letter.partition, letter.offset));
            if !in_window(letter.at, request.failed_since, request.failed_until) {
                continue;
            }
            let Ok(event) = Event::decode(&letter.payload) else {
                answer.unreadable_dead_letters += 1;
                walk.room -= 1;
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
            walk.room -= 1;
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
        if last_page {
            return Ok(true);
        }
    }
    Ok(false)
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

/// The documents `ids` name that are in `in_state` and `wanted`.
async fn by_ids(
    state: &AppState,
    ids: &[String],
    in_state: Option<DeliveryState>,
    wanted: &(dyn Fn(&StatusDocument) -> bool + Sync),
) -> Result<Vec<Versioned>, ApiError> {
    let mut found = Vec::new();
    for id in ids {
        if let Some(stored) = state.status.get(id).await?
            && in_state.is_none_or(|s| stored.document.state == s)
            && wanted(&stored.document)
        {
            found.push(stored);
        }
    }
    Ok(found)
}

/// A search through the listing (every client's deliveries, newest first),
/// a page at a time from a position, for one call's matches.
struct Walk<'a> {
    state: &'a AppState,
    query: ListQuery,
    wanted: &'a (dyn Fn(&StatusDocument) -> bool + Sync),
    /// How many more this call may match.
    room: usize,
    /// How many more pages this call may read.
    pages: usize,
    /// The listing holds nothing after `query.after`.
    done: bool,
}

impl<'a> Walk<'a> {
    /// The documents in `in_state` accepted before `until`, after `after`,
    /// that are `wanted`: at most `room` of them.
    fn new(
        state: &'a AppState,
        in_state: Option<DeliveryState>,
        until: Option<OffsetDateTime>,
        after: Option<ListCursor>,
        wanted: &'a (dyn Fn(&StatusDocument) -> bool + Sync),
        room: usize,
    ) -> Self {
        Self {
            state,
            query: ListQuery {
                principal: None,
                owner: None,
                state: in_state,
                since: None,
                until,
                limit: PAGE,
                after,
            },
            wanted,
            room,
            pages: PAGES_PER_CALL,
            done: false,
        }
    }

    /// The matches of the next page, each read again now (the listing's
    /// copy may be behind) and still in the state and wanted; `None` once the call has
    /// matched its `room`, read its pages, or the listing is done.
    async fn next(&mut self) -> Result<Option<Vec<Versioned>>, ApiError> {
        if self.done || self.room == 0 || self.pages == 0 {
            return Ok(None);
        }
        self.pages -= 1;
        let page = self.state.status.list(&self.query).await?;
        let mut found = Vec::new();
        for document in page.items {
            if self.room == 0 {
                // The next call goes on after the last match.
                return Ok(Some(found));
            }
            if !(self.wanted)(&document) {
                continue;
            }
            // Still in the state asked for: one that moved on since (a
            // redrive the worker began) is left to what moved it.
            if let Some(stored) = self.state.status.get(&document.id).await?
                && self
                    .query
                    .state
                    .is_none_or(|state| stored.document.state == state)
                && (self.wanted)(&stored.document)
            {
                found.push(stored);
                self.room -= 1;
                self.query.after = Some(ListCursor::of(&document));
            }
        }
        match page.next {
            Some(next) => self.query.after = Some(next),
            None => self.done = true,
        }
        Ok(Some(found))
    }

    /// Where the next call goes on in the listing; `None` once it is done.
    fn resume(self) -> Option<ListCursor> {
        if self.done { None } else { self.query.after }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_reads_back_for_its_operation_and_anything_else_is_refused() {
        let positions = [
            Position::Listing(ListCursor {
                created_ms: 1_764_150_000_123,
                id: "d-2026.11.26_1".into(),
            }),
            Position::Listing(ListCursor {
                created_ms: -5,
                id: "d".into(),
            }),
            Position::DeadLetters(None),
            Position::DeadLetters(Some((u32::MAX, u64::MAX))),
        ];
        for position in &positions {
            let token = position.encode(Operation::Redrive);
            assert!(token.len() <= MAX_CURSOR_LEN);
            assert_eq!(
                Position::decode(Operation::Redrive, &token).expect("read back"),
                *position
            );
        }
        let listing = positions[0].encode(Operation::Resend);
        assert_eq!(
            Position::decode(Operation::Resend, &listing).expect("read back"),
            positions[0]
        );
        let forged = [
            String::new(),
            "not base64!".into(),
            URL_SAFE_NO_PAD.encode("r"),
            URL_SAFE_NO_PAD.encode("r.d.12"),
            URL_SAFE_NO_PAD.encode("r.d.x.d-1"),
            URL_SAFE_NO_PAD.encode("r.d.1.bad id"),
            URL_SAFE_NO_PAD.encode("r.l.1"),
            URL_SAFE_NO_PAD.encode("r.l.-1.2"),
            URL_SAFE_NO_PAD.encode("r.l.1.2.3"),
            URL_SAFE_NO_PAD.encode("r.x.1.d-1"),
            URL_SAFE_NO_PAD.encode([0xff, 0xfe]),
            "A".repeat(MAX_CURSOR_LEN + 1),
            // Another operation's.
            positions[0].encode(Operation::Resend),
        ];
        for token in &forged {
            assert!(
                Position::decode(Operation::Redrive, token).is_err(),
                "{token:?}"
            );
        }
        for position in &positions[2..] {
            let token = position.encode(Operation::Resend);
            assert!(
                Position::decode(Operation::Resend, &token).is_err(),
                "a resend has no dead letters: {position:?}"
            );
        }
    }
}
