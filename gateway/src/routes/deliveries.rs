//! `POST /api/deliveryrequests`, `GET /api/deliveryrequests/{id}/status` and
//! `DELETE /api/deliveryrequests/{id}`.
//!
//! A 202 is sent only after the event is durable in the stream. The status URL
//! carries a signed receipt, so a status read before the worker has written
//! anything still answers Accepted, never 404.

use std::fmt::Write as _;

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{AppendHeaders, IntoResponse, Response};
use axum::{Extension, Json};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use skyport_core::event::{CancellationRequested, DeliveryRequested, Event};
use skyport_core::ports::{ETag, Lane, Reserved};
use skyport_core::request::{DeliveryRequest, FieldError, is_valid_id};
use skyport_core::status::{DeliveryState, StatusDocument};
use skyport_runtime::{telemetry, trace_span};
use time::OffsetDateTime;
use tracing::Instrument;
use utoipa::{IntoParams, ToSchema};

use crate::auth::Principal;
use crate::error::ApiError;
use crate::extract::ValidDeliveryRequest;
use crate::idempotency::Name;
use crate::ids;
use crate::openapi::{DeliveryRefusals, QuotaRefusal, Refusals};
use crate::pacing;
use crate::prefer;
use crate::quotas::Charged;
use crate::routes::access::{self, not_yet_written, unknown};
use crate::routes::resources::{Accepted, DeliveryStatus, Links};
use crate::routes::status_page;
use crate::state::AppState;
use crate::waiting::Hold;

const MAX_IDEMPOTENCY_KEY_LEN: usize = 255;

/// Where an Azure long-running-operation poller reads the operation's status.
const OPERATION_LOCATION: &str = "operation-location";

/// The header that makes a POST safe to retry.
const IDEMPOTENCY_KEY: &str = "Idempotency-Key";

/// Accepts a delivery request: answers 202 once the request is durable in the stream.
///
/// The body may be compressed: `Content-Encoding: gzip`, `br`, `zstd` or `deflate`.
#[utoipa::path(
    post,
    path = "/api/deliveryrequests",
    operation_id = "createDeliveryRequest",
    tag = "deliveries",
    params(
        ("Idempotency-Key" = Option<String>, Header, max_length = 255, pattern = r"^[\x21-\x7E]{1,255}$",
            description = "Makes a retry safe: the same key (for the same client) returns the same delivery and status URL; reusing it with another body is a 409. Keys are remembered for `gateway.idempotency_retention_s` (24 h by default)."),
        ("Prefer" = Option<String>, Header,
            description = "`respond-async` (RFC 7240): answer as the start of an Azure long-running operation, with `Operation-Location` naming a status URL that answers 202 while the delivery runs and 200 with `status` Succeeded, Failed or Canceled once it is over."),
    ),
    request_body(content = DeliveryRequest, content_type = "application/json"),
    responses(
        (status = 202, description = "Durable in the stream; poll the status URL.", body = Accepted,
            headers(
                ("Location" = String, description = "The status URL."),
                ("Retry-After" = u32, description = "Seconds to wait before the first poll: when deliveries have recently been taking to reach their outcome, at least 1."),
                ("retry-after-ms" = u64, description = "The same wait in milliseconds, as Azure's long-running-operation pollers read it."),
                ("Operation-Location" = String, description = "With `Prefer: respond-async` (or `gateway.respond_async`): the status URL with `respond=async`, which answers 202 while the delivery runs."),
                ("Preference-Applied" = String, description = "`respond-async` when `Operation-Location` is given."),
                ("RateLimit-Policy" = String, description = "When quotas are on (`gateway.quotas`): the client's quota, `\"default\";q=BURST;w=SECONDS` (`\"client\"` for a quota of its own)."),
                ("RateLimit" = String, description = "When quotas are on: `\"default\";r=LEFT;t=SECONDS`, the requests left now and the seconds until the quota is whole again."),
            ),
            links(
                ("GetStatus" = (operation_id = "getDeliveryStatus",
                    parameters(("id" = "$response.body#/deliveryId"), ("receipt" = "$response.body#/receipt")),
                    description = "The status of the accepted delivery.")),
                ("Cancel" = (operation_id = "cancelDeliveryRequest",
                    parameters(("id" = "$response.body#/deliveryId"), ("receipt" = "$response.body#/receipt")),
                    description = "Cancels the accepted delivery.")),
            )),
        (status = 400, description = "Malformed JSON, a body that is not what its Content-Encoding says, a malformed Idempotency-Key or Host header."),
        (status = 403, description = "The credentials lack the write scope."),
        (status = 409, description = "The Idempotency-Key or deliveryId is taken: used before with a different body, or by another principal (the answer says only that it is taken). A name stays taken for as long as its delivery's status can be read."),
        (status = 408, description = "The body did not arrive within `gateway.http.body_read_timeout_ms`; the connection is closed."),
        (status = 413, description = "The body, once decoded, is larger than `gateway.max_body_bytes`."),
        (status = 415, description = "The body is not JSON, or its Content-Encoding is not one the gateway decodes (listed in `Accept-Encoding`).",
            headers(("Accept-Encoding" = String, description = "The content codings the gateway decodes, on an encoding refusal."))),
        (status = 422, description = "The body has invalid fields (a `callbackUrl` callbacks may not reach, or a `deliveryId` of the gateway's own shapes — starting `sp-`, or `k-` and 32 hex digits — among them); `errors` lists them."),
        QuotaRefusal,
        Refusals,
        (status = 503, description = "Overloaded, or the stream cannot take the request now (`code` Unavailable: it was not stored), or the stream did not say whether it stored it (`code` PublishOutcomeUnknown: it may still run, and its name stays taken; a named request retried unchanged learns its fate); retry after `Retry-After`."),
    ),
    security(("apiKey" = []), ("bearer" = ["deliveries.write"])),
)]
pub async fn create(
    State(state): State<AppState>,
    principal: Option<Extension<Principal>>,
    headers: HeaderMap,
    ValidDeliveryRequest(request): ValidDeliveryRequest,
) -> Result<Response, ApiError> {
    let key = idempotency_key(&headers)?;
    if let Some(id) = &request.delivery_id
        && let Some(refusal) = ids::refusal(id)
    {
        return Err(ApiError::Validation(vec![FieldError::new(
            "deliveryId",
            refusal,
        )]));
    }
    if let Some(url) = &request.callback_url
        && let Some(refusal) = state.callbacks.refusal(url)
    {
        return Err(ApiError::Validation(vec![FieldError::new(
            "callbackUrl",
            refusal,
        )]));
    }
    let base = state.base_url(&headers)?;
    let reply = Reply {
        base,
        respond_async: state.respond_async || prefer::respond_async(&headers),
        principal: principal.as_deref().map(|p| p.name.clone()),
    };
    // With auth off every caller is the same client.
    let client = principal.as_ref().map_or("", |p| p.name.as_str());
    let now = OffsetDateTime::now_utc();
    let lane = state.lane_of(request.expedited);
    // A client is its principal's when auth is on, else the request's owner
    // (which the client chooses: with auth off, quotas are advisory).
    let metered = match principal.as_deref().map(Principal::client) {
        Some(metered) if !metered.is_empty() => metered.to_owned(),
        _ => request.owner_id.clone(),
    };
    let Some(name) = Name::of(&request, key.as_deref(), client) else {
        // Nothing to retry by: no write but the event itself.
        let charged = state.charge(&metered)?;
        let id = ids::generated();
        let event = requested(&headers, &id, now, key, principal.as_deref(), request);
        publish(&state, event, lane).await?;
        return accepted(&state, &reply, id, DeliveryState::Accepted, now, lane)
            .map(|r| with(r, charged));
    };
    let id = name.delivery_id().to_owned();
    let reservation = name.reservation(
        &request,
        key.as_deref(),
        client,
        now,
        state.idempotency_retention,
    );
    match state.idempotency.reserve(&reservation).await? {
        // A name stays taken for as long as its delivery can be read, longer
        // than its reservation: the status decides.
        Reserved::Recorded(stored) => {
            let document = stored.document;
            if is_retry_of(&document, principal.as_deref(), &id, request) {
                let lane = document.lane;
                accepted(
                    &state,
                    &reply,
                    id,
                    document.state,
                    document.created_at,
                    lane,
                )
            } else {
                Err(ApiError::Conflict(name.conflict()))
            }
        }
        Reserved::New => {
            let charged = match state.charge(&metered) {
                Ok(charged) => charged,
                Err(refused) => {
                    release(&state, &reservation, &id).await;
                    return Err(refused);
                }
            };
            let event = requested(&headers, &id, now, key, principal.as_deref(), request);
            if let Err(e) = publish(&state, event, lane).await {
                // Never durable, so the name is free for the client's retry;
                // unless the stream could not say, when it may yet run.
                if !matches!(e, ApiError::PublishUnknown { .. }) {
                    release(&state, &reservation, &id).await;
                }
                return Err(e);
            }
            accepted(&state, &reply, id, DeliveryState::Accepted, now, lane)
                .map(|r| with(r, charged))
        }
        Reserved::Existing(held) if held.fingerprint == reservation.fingerprint => {
            // A retry. Once the worker has written a status the event is surely
            // durable; before that, publishing it again is safe (the worker runs
            // one delivery per id) and makes sure a first attempt that failed
            // after reserving is not lost. That costs the stream a write, so
            // it is charged as a new request is.
            let mut charged = None;
            let current = match state.status.get(&id).await? {
                // A name is its owner's even when a reservation outlived a
                // failed release.
                Some(stored) if !owned_by(&stored.document, principal.as_deref()) => {
                    return Err(ApiError::Conflict(name.conflict()));
                }
                Some(stored) => stored.document.state,
                None => {
                    charged = state.charge(&metered)?;
                    let event = requested(
                        &headers,
                        &id,
                        held.accepted_at,
                        key,
                        principal.as_deref(),
                        request,
                    );
                    publish(&state, event, lane).await?;
                    DeliveryState::Accepted
                }
            };
            accepted(&state, &reply, id, current, held.accepted_at, lane).map(|r| with(r, charged))
        }
        Reserved::Existing(_) => Err(ApiError::Conflict(name.conflict())),
    }
}

/// Whether a request that names `id`, whose reservation has expired, is the
/// retry of the delivery `document` records: the same principal (none with
/// auth off) and the same body.
fn is_retry_of(
    document: &StatusDocument,
    principal: Option<&Principal>,
    id: &str,
    mut request: DeliveryRequest,
) -> bool {
    request.delivery_id = Some(id.to_owned());
    owned_by(document, principal) && document.request.as_ref() == Some(&request)
}

/// Whether `document` is the delivery of `principal` (none with auth off).
fn owned_by(document: &StatusDocument, principal: Option<&Principal>) -> bool {
    match (principal, document.principal.as_deref()) {
        (Some(principal), Some(owner)) => {
            owner == principal.name || principal.legacy.as_deref() == Some(owner)
        }
        (None, None) => true,
        _ => false,
    }
}

/// Frees a name that was reserved for a request that was not published.
async fn release(state: &AppState, reservation: &skyport_core::ports::Reservation, id: &str) {
    if let Err(release) = state.idempotency.release(reservation).await {
        tracing::warn!(delivery_id = %id, error = %release, "Could not release the reservation of a request that was not published; a retry with another body gets a 409 until it expires.");
    }
}

/// `response` with the quota headers of a metered request.
pub(super) fn with(mut response: Response, charged: Option<Charged>) -> Response {
    if let Some(charged) = charged {
        response.headers_mut().extend(charged.headers);
    }
    response
}

/// The event of a delivery request accepted as `id` at `accepted_at`.
fn requested(
    headers: &HeaderMap,
    id: &str,
    accepted_at: OffsetDateTime,
    idempotency_key: Option<String>,
    principal: Option<&Principal>,
    mut request: DeliveryRequest,
) -> Event {
    request.delivery_id = Some(id.to_owned());
    Event::DeliveryRequested(Box::new(DeliveryRequested {
        delivery_id: id.to_owned(),
        accepted_at,
        traceparent: traceparent(headers),
        idempotency_key,
        principal: principal.map(|p| p.name.clone()),
        epoch: 0,
        redrive: None,
        request,
    }))
}

/// Cancels a delivery request.
///
/// Before the drone is scheduled the delivery stops at its next step; after,
/// its steps are undone. Either way it ends Cancelled; a second DELETE changes
/// nothing.
#[utoipa::path(
    delete,
    path = "/api/deliveryrequests/{id}",
    operation_id = "cancelDeliveryRequest",
    tag = "deliveries",
    params(DeliveryPath, StatusQuery),
    responses(
        (status = 202, description = "The cancellation is durable in the stream (or the delivery was already cancelled).", body = Accepted,
            headers(
                ("Location" = String, description = "The status URL."),
                ("Retry-After" = u32, description = "Seconds to wait before polling."),
                ("RateLimit-Policy" = String, description = "When quotas are on (`gateway.quotas`): the client's quota, `\"default\";q=BURST;w=SECONDS` (`\"client\"` for a quota of its own)."),
                ("RateLimit" = String, description = "When quotas are on: `\"default\";r=LEFT;t=SECONDS`, the requests left now and the seconds until the quota is whole again."),
            )),
        (status = 403, description = "The credentials lack the write scope."),
        DeliveryRefusals,
        (status = 409, description = "The delivery already failed; there is nothing to cancel."),
        QuotaRefusal,
        (status = 410, description = "The delivery ended longer ago than `store.status_retention_s` and its status was removed."),
        Refusals,
        (status = 503, description = "Overloaded, or a backend is unavailable; retry after `Retry-After`."),
    ),
    security(("apiKey" = []), ("bearer" = ["deliveries.write"])),
)]
pub async fn cancel(
    State(state): State<AppState>,
    principal: Option<Extension<Principal>>,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<StatusQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let (id, query) = id_and_query(path, query)?;
    let base = state.base_url(&headers)?;
    let caller = principal.as_deref();
    let opened = access::open(&state, &id, query.receipt.as_deref(), caller).await?;
    let (accepted_at, lane) = (opened.accepted_at, opened.lane);
    let document = match opened.stored {
        Some(stored) => stored.document,
        None => not_yet_written(&state, id.clone(), accepted_at, lane)?,
    };
    let current = document.state;
    let mut charged = None;
    match current {
        DeliveryState::Failed => {
            return Err(ApiError::Conflict(format!(
                "delivery request {id} already failed; there is nothing to cancel"
            )));
        }
        DeliveryState::Cancelled => {}
        DeliveryState::Accepted | DeliveryState::Processing | DeliveryState::Scheduled => {
            charged = state.charge(client_of(caller, &document))?;
            let event = Event::CancellationRequested(CancellationRequested {
                delivery_id: id.clone(),
                requested_at: OffsetDateTime::now_utc(),
                traceparent: traceparent(&headers),
                principal: caller.map(|p| p.name.clone()),
            });
            publish(&state, event, lane).await?;
        }
    }
    let reply = Reply {
        base,
        respond_async: false,
        principal: receipt_principal(caller, &document),
    };
    accepted(&state, &reply, id, current, accepted_at, lane).map(|r| with(r, charged))
}

/// Whom the receipt of an answer about `document` is signed for: its owner
/// (an admin's answer hands out the owner's, as a listing does), else the
/// caller.
pub(super) fn receipt_principal(
    caller: Option<&Principal>,
    document: &StatusDocument,
) -> Option<String> {
    document
        .principal
        .clone()
        .or_else(|| caller.map(|caller| caller.name.clone()))
}

/// Who a request about an accepted delivery is metered as: its principal's
/// client when auth is on, else the delivery's owner as its status records it
/// (before the worker has written one, nobody: the anonymous client).
pub(super) fn client_of<'a>(
    principal: Option<&'a Principal>,
    document: &'a StatusDocument,
) -> &'a str {
    principal.map_or_else(
        || document.owner_id.as_deref().unwrap_or_default(),
        Principal::client,
    )
}

/// Makes `event` durable in `lane`, its delivery's.
pub(super) async fn publish(state: &AppState, event: Event, lane: Lane) -> Result<(), ApiError> {
    let span = trace_span!("publish", otel.kind = "producer");
    let outbound = event
        .outbound_as(state.event_schema_version, lane)
        .map_err(|e| ApiError::Internal(Box::new(e)))?;
    state.publisher.publish(outbound).instrument(span).await?;
    Ok(())
}

/// How a 202 is answered: the base of its URLs, whether as the start of a
/// long-running operation, and whom its receipt is signed for.
pub(super) struct Reply {
    pub(super) base: String,
    /// `Operation-Location` names the status URL that answers 202 while the
    /// delivery runs (`Prefer: respond-async`, or `gateway.respond_async`).
    pub(super) respond_async: bool,
    /// The principal the receipt opens the delivery to (`None` with auth off).
    pub(super) principal: Option<String>,
}

/// The 202 of a request that is now durable in the stream.
pub(super) fn accepted(
    state: &AppState,
    reply: &Reply,
    id: String,
    status: DeliveryState,
    accepted_at: OffsetDateTime,
    lane: Lane,
) -> Result<Response, ApiError> {
    let receipt = state
        .receipts
        .sign(&id, accepted_at, lane, reply.principal.as_deref());
    let links = Links::new(&reply.base, &id, &receipt, status);
    let header_value =
        |url: &str| HeaderValue::from_str(url).map_err(|e| ApiError::Internal(Box::new(e)));
    let location = header_value(&links.status)?;
    let operation = if reply.respond_async {
        vec![
            (
                HeaderName::from_static(OPERATION_LOCATION),
                header_value(&format!("{}&respond=async", links.status))?,
            ),
            (
                HeaderName::from_static(prefer::PREFERENCE_APPLIED),
                HeaderValue::from_static("respond-async"),
            ),
        ]
    } else {
        Vec::new()
    };
    let body = Accepted {
        delivery_id: id,
        status,
        status_url: links.status,
        receipt,
    };
    let wait = state.pacing.wait(accepted_at, OffsetDateTime::now_utc());
    Ok((
        StatusCode::ACCEPTED,
        [(header::LOCATION, location)],
        AppendHeaders(operation),
        pacing::headers(wait),
        Json(body),
    )
        .into_response())
}

/// The delivery a path names.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct DeliveryPath {
    /// The delivery id.
    #[param(pattern = r"^[A-Za-z0-9._-]{1,64}$", max_length = 64)]
    pub id: String,
}

/// The receipt that proves a client was given this delivery's status URL.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct StatusQuery {
    /// The receipt from the status URL (also in the 202 body), signed for
    /// the principal that made the delivery. Without the right one, or
    /// (with authentication on) from another principal without the admin
    /// scope, the delivery is not found.
    #[param(required = true)]
    pub(super) receipt: Option<String>,
}

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
                ("Retry-After" = u32, description = "Present while the delivery is not terminal: seconds to wait before polling again, from when deliveries have recently been reaching their outcome (at least 1)."),
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
    state.pacing.observe(&document);
    let receipt = query.receipt.unwrap_or_default();
    let links = Links::new(&base, &id, &receipt, document.state);
    let terminal = document.state.is_terminal();
    let wait = (!terminal).then(|| {
        state
            .pacing
            .wait(document.created_at, OffsetDateTime::now_utc())
    });
    let status = DeliveryStatus {
        status: document.state.into(),
        document,
        terminal,
        links,
    };
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

/// The delivery id of the path (404 when it cannot be one) and the query.
pub(super) fn id_and_query(
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<StatusQuery>, QueryRejection>,
) -> Result<(String, StatusQuery), ApiError> {
    let Path(id) = path.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    let Query(query) = query.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    if is_valid_id(&id) {
        Ok((id, query))
    } else {
        Err(unknown(&id))
    }
}

/// The status resource's entity tag: its stored document's version, hashed
/// into a tag HTTP can carry, or `"accepted"` while the worker has written
/// nothing (so it changes with the first write); the page a browser gets is
/// another representation, with a tag of its own.
pub(super) fn entity_tag(version: Option<&ETag>, html: bool) -> HeaderValue {
    let opaque = version.map_or_else(
        || "accepted".to_owned(),
        |version| {
            let digest = Sha256::digest(version.0.as_bytes());
            digest[..12]
                .iter()
                .fold(String::from("v"), |mut tag, byte| {
                    let _ = write!(tag, "{byte:02x}");
                    tag
                })
        },
    );
    let suffix = if html { "-html" } else { "" };
    HeaderValue::from_str(&format!("\"{opaque}{suffix}\""))
        .unwrap_or_else(|_| HeaderValue::from_static("\"accepted\""))
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

pub(super) fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(value) = headers.get(IDEMPOTENCY_KEY) else {
        return Ok(None);
    };
    let bytes = value.as_bytes();
    let visible = bytes.iter().all(|b| (0x21..=0x7e).contains(b));
    match std::str::from_utf8(bytes) {
        Ok(key) if visible && !key.is_empty() && key.len() <= MAX_IDEMPOTENCY_KEY_LEN => {
            Ok(Some(key.to_owned()))
        }
        _ => Err(ApiError::BadRequest(format!(
            "Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY_LEN} visible ASCII characters"
        ))),
    }
}

/// The `traceparent` the event carries: the current span's when spans are
/// exported, else the caller's well-formed one, passed on.
pub(super) fn traceparent(headers: &HeaderMap) -> Option<String> {
    telemetry::traceparent_or(caller_traceparent(headers))
}

/// The W3C trace context of the request, when it has a well-formed one.
fn caller_traceparent(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(telemetry::TRACEPARENT)?.to_str().ok()?;
    let parts: Vec<&str> = value.split('-').collect();
    let well_formed = parts.len() == 4
        && [2, 32, 16, 2]
            .iter()
            .zip(&parts)
            .all(|(len, part)| part.len() == *len && part.bytes().all(|b| b.is_ascii_hexdigit()));
    well_formed.then_some(value)
}
