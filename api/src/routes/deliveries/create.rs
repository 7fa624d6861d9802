//! `POST /api/deliveryrequests`: a delivery request made durable, or the
//! delivery a retry names.

use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use skyport_core::event::{DeliveryRequested, Event};
use skyport_core::ports::{Lane, Reserved};
use skyport_core::request::{DeliveryRequest, FieldError};
use skyport_core::status::{DeliveryState, StatusDocument};
use skyport_runtime::metrics::AcceptedLabels;
use time::OffsetDateTime;

use super::resources::Accepted;
use super::{Reply, accepted, accepted_body, idempotency_key, publish, status, traceparent, with};
use crate::auth::Principal;
use crate::error::ApiError;
use crate::extract::ValidDeliveryRequest;
use crate::idempotency::Name;
use crate::ids;
use crate::openapi::{QuotaRefusal, Refusals};
use crate::quotas::Charged;
use crate::state::AppState;
use crate::waiting::Hold;

/// Accepts a delivery request: answers 202 once the request is durable in the stream.
///
/// The body may be compressed: `Content-Encoding: gzip`, `br`, `zstd` or `deflate`.
///
/// With `Prefer: wait=N` (N from 1 to 30 seconds) the answer is held until
/// the delivery reaches its outcome or N seconds pass: 200 with its status
/// as `outcome` if it ended in time, else the 202. Such a POST takes a place among
/// `gateway.max_waiting` held requests (and its client's
/// `gateway.max_waiting_per_client`), which it shares with held status
/// reads; past them it is answered at once.
#[utoipa::path(
    post,
    path = "/api/deliveryrequests",
    operation_id = "createDeliveryRequest",
    tag = "deliveries",
    params(
        ("Idempotency-Key" = Option<String>, Header, max_length = 255, pattern = r"^[\x21-\x7E]{1,255}$",
            description = "Makes a retry safe: the same key (for the same client) returns the same delivery and status URL; reusing it with another body is a 409. Keys are remembered for `gateway.idempotency_retention_s` (24 h by default)."),
        ("Prefer" = Option<String>, Header,
            description = "`respond-async` (RFC 7240): answer as the start of an Azure long-running operation, with `Operation-Location` naming a status URL that answers 202 while the delivery runs and 200 with `status` Succeeded, Failed or Canceled once it is over. `wait=N` (1 to 30 seconds): hold the answer until the delivery is terminal (200 with its status) or N seconds pass (the 202); with both, a delivery over within N is answered 200 and any other as the long-running operation's start."),
    ),
    request_body(content = DeliveryRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "With `Prefer: wait=N`: the delivery reached its outcome within N seconds. The 202's body, with its terminal `status` and the whole status as `outcome`.", body = Accepted,
            headers(
                ("Location" = String, description = "The status URL."),
            )),
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
        (status = 422, description = "The body has invalid fields (a `callbackUrl` callbacks may not reach, or a `deliveryId` of the gateway's own shapes — starting `sp-`, `k-` and 32 hex digits, or `batch` — among them); `errors` lists them."),
        QuotaRefusal,
        Refusals,
        (status = 503, description = "Overloaded, or the stream cannot take the request now (`code` Unavailable: it was not stored), or the stream did not say whether it stored it (`code` PublishOutcomeUnknown: it may still run, and its name stays taken; a named request retried unchanged learns its fate); retry after `Retry-After`."),
    ),
    security(("apiKey" = []), ("bearer" = ["deliveries.write"])),
)]
pub async fn create(
    State(state): State<AppState>,
    principal: Option<Extension<Principal>>,
    hold: Option<Extension<Hold>>,
    headers: HeaderMap,
    ValidDeliveryRequest(request): ValidDeliveryRequest,
) -> Result<Response, ApiError> {
    let key = idempotency_key(&headers)?;
    let principal = principal.as_deref();
    let reply = Reply::to(&state, &headers, principal)?;
    let submitter = Submitter {
        state: &state,
        principal,
        headers: &headers,
        via: AcceptedLabels::POST,
    };
    let mut submitted = submitter.submit(key, request).await?;
    let charged = submitted.charged.take();
    if let Some(Extension(hold)) = hold
        && let Some(ended) = ended_within(&state, &reply, &submitted, hold.wait).await
    {
        return Ok(with(ended, charged));
    }
    let Submitted {
        id,
        state: current,
        accepted_at,
        lane,
        ..
    } = submitted;
    accepted(&state, &reply, id, current, accepted_at, lane).map(|r| with(r, charged))
}

/// A delivery request made durable (or found durable: the delivery a retry
/// names), with where it is now and the quota charge it made.
pub(crate) struct Submitted {
    pub(crate) id: String,
    pub(crate) state: DeliveryState,
    pub(crate) accepted_at: OffsetDateTime,
    pub(crate) lane: Lane,
    pub(crate) charged: Option<Charged>,
}

/// Who submits delivery requests, and with which headers: one POST, or each
/// item of a batch.
pub(crate) struct Submitter<'a> {
    pub(crate) state: &'a AppState,
    pub(crate) principal: Option<&'a Principal>,
    pub(crate) headers: &'a HeaderMap,
    /// How the requests came, as `skyport_deliveries_accepted_total` counts them.
    pub(crate) via: AcceptedLabels,
}

impl Submitter<'_> {
    /// Makes `request` durable under its name (its `deliveryId`, else the
    /// id `key` stands for, else a new id), or finds the delivery a retry
    /// of it names.
    ///
    /// # Errors
    /// What a POST of `request` alone would be answered with: 422 for an id
    /// or callback URL refused, 409 for a name taken, 429 over the quota,
    /// 503 when the stream cannot take it or did not say.
    pub(crate) async fn submit(
        &self,
        key: Option<String>,
        request: DeliveryRequest,
    ) -> Result<Submitted, ApiError> {
        let (state, principal) = (self.state, self.principal);
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
        // With auth off every caller is the same client.
        let client = principal.map_or("", |p| p.name.as_str());
        let now = OffsetDateTime::now_utc();
        let lane = state.lane_of(request.expedited);
        // A client is its principal's when auth is on, else the request's owner
        // (which the client chooses: with auth off, quotas are advisory).
        let metered = match principal.map(Principal::client) {
            Some(metered) if !metered.is_empty() => metered.to_owned(),
            _ => request.owner_id.clone(),
        };
        let submitted = |id: String, current, accepted_at, lane, charged| Submitted {
            id,
            state: current,
            accepted_at,
            lane,
            charged,
        };
        let Some(name) = Name::of(&request, key.as_deref(), client) else {
            // Nothing to retry by: no write but the event itself.
            let charged = state.charge(&metered)?;
            let id = ids::generated();
            let event = self.requested(&id, now, key, request);
            publish(state, &event, lane).await?;
            self.accepted();
            return Ok(submitted(id, DeliveryState::Accepted, now, lane, charged));
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
                if is_retry_of(&document, principal, &id, request) {
                    let lane = document.lane;
                    Ok(submitted(
                        id,
                        document.state,
                        document.created_at,
                        lane,
                        None,
                    ))
                } else {
                    Err(ApiError::Conflict(name.conflict()))
                }
            }
            Reserved::New => {
                let charged = match state.charge(&metered) {
                    Ok(charged) => charged,
                    Err(refused) => {
                        release(state, &reservation, &id).await;
                        return Err(refused);
                    }
                };
                let event = self.requested(&id, now, key, request);
                if let Err(e) = publish(state, &event, lane).await {
                    // Never durable, so the name is free for the client's retry;
                    // unless the stream could not say, when it may yet run.
                    if !matches!(e, ApiError::PublishUnknown { .. }) {
                        release(state, &reservation, &id).await;
                    }
                    return Err(e);
                }
                self.accepted();
                Ok(submitted(id, DeliveryState::Accepted, now, lane, charged))
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
                    Some(stored) if !owned_by(&stored.document, principal) => {
                        return Err(ApiError::Conflict(name.conflict()));
                    }
                    Some(stored) => stored.document.state,
                    None => {
                        charged = state.charge(&metered)?;
                        let event = self.requested(&id, held.accepted_at, key, request);
                        publish(state, &event, lane).await?;
                        DeliveryState::Accepted
                    }
                };
                Ok(submitted(id, current, held.accepted_at, lane, charged))
            }
            Reserved::Existing(_) => Err(ApiError::Conflict(name.conflict())),
        }
    }

    /// Counts a new delivery made durable.
    fn accepted(&self) {
        skyport_runtime::metrics::global()
            .deliveries_accepted
            .get_or_create(&self.via)
            .inc();
    }

    /// The event of a delivery request accepted as `id` at `accepted_at`.
    fn requested(
        &self,
        id: &str,
        accepted_at: OffsetDateTime,
        idempotency_key: Option<String>,
        mut request: DeliveryRequest,
    ) -> Event {
        request.delivery_id = Some(id.to_owned());
        Event::DeliveryRequested(Box::new(DeliveryRequested {
            delivery_id: id.to_owned(),
            accepted_at,
            traceparent: traceparent(self.headers),
            idempotency_key,
            principal: self.principal.map(|p| p.name.clone()),
            epoch: 0,
            redrive: None,
            request,
        }))
    }
}

/// The answer of a POST held for up to `wait` (`Prefer: wait=N`) once its
/// delivery is terminal: 200 with the 202's body and its status as
/// `outcome`, and `Location`; `None` when it is still running as the wait
/// ends, or its status cannot be read (the request is durable: its 202 is
/// answered then).
async fn ended_within(
    state: &AppState,
    reply: &Reply,
    submitted: &Submitted,
    wait: Duration,
) -> Option<Response> {
    let until = tokio::time::Instant::now() + wait;
    // Registered before the first read, so that no write after it goes unseen.
    let mut watch = state.waiters.watch(&submitted.id);
    let document = loop {
        match state.status.get(&submitted.id).await {
            Ok(Some(stored)) if stored.document.state.is_terminal() => break stored.document,
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(delivery_id = %submitted.id, error = %e, "Cannot read the status of a delivery whose POST waits for its outcome; answering 202.");
                return None;
            }
        }
        tokio::time::timeout_at(until, watch.changed()).await.ok()?;
    };
    drop(watch);
    let mut body = accepted_body(
        state,
        reply,
        submitted.id.clone(),
        document.state,
        submitted.accepted_at,
        submitted.lane,
    );
    let outcome = status::representation(state, &reply.base, &body.receipt, document);
    body.outcome = Some(Box::new(outcome));
    let location = HeaderValue::from_str(&body.status_url).ok()?;
    Some((StatusCode::OK, [(header::LOCATION, location)], Json(body)).into_response())
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
