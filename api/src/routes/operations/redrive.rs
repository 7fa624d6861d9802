//! `POST /admin/redrive`: Failed deliveries run again, each in its next
//! attempt epoch, and dead-lettered events published again.

use axum::Extension;
use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use futures_util::{StreamExt, TryStreamExt, stream};
use serde::{Deserialize, Serialize};
use skyport_core::event::{DeliveryRequested, Event};
use skyport_core::ports::{Lane, Versioned};
use skyport_core::request::DeliveryRequest;
use skyport_core::status::{DeliveryState, QueuedRedrive, StatusDocument, Step, StepResult};
use time::OffsetDateTime;
use utoipa::ToSchema;

use super::{
    AT_ONCE, DEAD_LETTER_PAGE, DEAD_LETTER_PAGES_PER_CALL, MAX_REASON_LEN, Operation,
    OperationParams, Paging, Position, Walk, by_ids, check_ids, delivery_ids, in_window, invalid,
    mark, unavailable,
};
use crate::auth::Principal;
use crate::error::ApiError;
use crate::extract::JsonBody;
use crate::openapi::{OperationRefusals, Refusals};
use crate::routes::deliveries::publish;
use crate::state::AppState;

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

/// The lane of a dead-lettered event's delivery: the one its status
/// records, else (a request the worker never recorded) the one it asked for.
async fn lane_of(state: &AppState, event: &Event) -> Result<Lane, ApiError> {
    Ok(match state.status.get(event.delivery_id()).await? {
        Some(stored) => stored.document.lane,
        None => match event {
            Event::DeliveryRequested(requested) => state.lane_of(requested.request.expedited),
            Event::CancellationRequested(_)
            | Event::DeliveryRescheduled(_)
            | Event::DeliveryDue(_) => Lane::Normal,
        },
    })
}
