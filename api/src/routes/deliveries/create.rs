//! `POST /api/deliveryrequests`: a delivery request made durable, or the
//! delivery a retry names.

use axum::Extension;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use skyport_core::event::{DeliveryRequested, Event};
use skyport_core::ports::Reserved;
use skyport_core::request::{DeliveryRequest, FieldError};
use skyport_core::status::{DeliveryState, StatusDocument};
use time::OffsetDateTime;

use super::resources::Accepted;
use super::{Reply, accepted, idempotency_key, publish, traceparent, with};
use crate::auth::Principal;
use crate::error::ApiError;
use crate::extract::ValidDeliveryRequest;
use crate::idempotency::Name;
use crate::ids;
use crate::openapi::{QuotaRefusal, Refusals};
use crate::prefer;
use crate::state::AppState;

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
        publish(&state, &event, lane).await?;
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
            if let Err(e) = publish(&state, &event, lane).await {
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
                    publish(&state, &event, lane).await?;
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
