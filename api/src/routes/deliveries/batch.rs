//! `POST /api/deliveryrequests/batch`: up to `gateway.max_batch` delivery
//! requests in one request, each answered on its own, in order.
//!
//! Each item is submitted as a POST of it alone would be (the same
//! validation, names, quota and 202), and the items are submitted at once,
//! so that the stream's own batching (a group commit, one sender per
//! partition, Kafka's linger) packs them. The answer is sent once every item
//! has its own: an item answered 202 is durable then, and one answered with
//! a problem was not published (but for `PublishOutcomeUnknown`, which says
//! it may run).

use std::collections::HashMap;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use futures_util::StreamExt;
use futures_util::stream::FuturesOrdered;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use skyport_core::ports::{Reservation, Reserved};
use skyport_core::request::{DeliveryRequest, FieldError};
use skyport_runtime::metrics::{AcceptedLabels, RefusedLabels};
use time::OffsetDateTime;
use utoipa::ToSchema;

use super::create::{Submitted, Submitter};
use super::resources::Accepted;
use super::{Reply, accepted_body, idempotency_key, with};
use crate::auth::Principal;
use crate::error::{ApiError, Problem};
use crate::extract::{json_body, parse_delivery_request};
use crate::idempotency::{self, Name};
use crate::openapi::Refusals;
use crate::quotas::Charged;
use crate::state::AppState;

/// The batch route (its body has its own limit, `gateway.max_batch_body_bytes`).
pub const BATCH_ROUTE: &str = "/api/deliveryrequests/batch";

/// A batch of delivery requests.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DeliveryRequestBatch {
    /// The delivery requests, each the body `POST /api/deliveryrequests`
    /// takes: from 1 to `gateway.max_batch` (1,000 by default).
    #[schema(value_type = Vec<DeliveryRequest>, min_items = 1)]
    requests: Vec<Box<RawValue>>,
}

/// Each request's answer, in the batch's order.
#[derive(Debug, Serialize, ToSchema)]
pub struct BatchResults {
    pub results: Vec<BatchResult>,
}

/// One request's answer: what a POST of it alone would have been answered.
#[derive(Debug, Serialize, ToSchema)]
pub struct BatchResult {
    /// 202 when the request is durable (`accepted`), else its problem's
    /// status (`problem`).
    #[schema(minimum = 202, maximum = 599)]
    pub status: u16,
    /// The accepted delivery, as the 202 of a POST names it.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub accepted: Option<Accepted>,
    /// Why the request was not accepted. It was not published, unless its
    /// `code` is `PublishOutcomeUnknown`: it may run then, and a retry of
    /// the batch (the same `Idempotency-Key` and body), or of the request
    /// under its `deliveryId`, learns its fate.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub problem: Option<Problem>,
}

/// Accepts up to `gateway.max_batch` delivery requests in one request.
///
/// Each request is answered on its own, in order, as a POST of it alone
/// would be: 202 once durable, or its own problem (an invalid field, a
/// quota spent, a `deliveryId` taken or named twice in the batch, the
/// stream unavailable). The batch is answered 200 once every request has
/// its answer; the batch itself is refused only when it is malformed, too
/// large or its `Idempotency-Key` is taken by another body. Quotas charge
/// each request. The body may be compressed, as a POST's may.
#[utoipa::path(
    post,
    path = "/api/deliveryrequests/batch",
    operation_id = "createDeliveryRequestBatch",
    tag = "deliveries",
    params(
        ("Idempotency-Key" = Option<String>, Header, max_length = 255, pattern = r"^[\x21-\x7E]{1,255}$",
            description = "Makes a retry of the whole batch safe: the same key and body (for the same client) answer the same delivery for every request accepted before, and submit the others again; the same key with another body is a 409. A request with a `deliveryId` is named by it, as in a POST of it alone."),
    ),
    request_body(content = DeliveryRequestBatch, content_type = "application/json"),
    responses(
        (status = 200, description = "Every request's answer, in order.", body = BatchResults,
            headers(
                ("Retry-After" = u32, description = "When a request was refused for now (429, 503): the longest of their waits, in seconds."),
                ("RateLimit-Policy" = String, description = "When quotas are on: the client's quota, as on a POST."),
                ("RateLimit" = String, description = "When quotas are on: the requests left after this batch, as on a POST."),
            )),
        (status = 400, description = "Malformed JSON, or a malformed Idempotency-Key or Host header."),
        (status = 403, description = "The credentials lack the write scope."),
        (status = 409, description = "The Idempotency-Key was used before with another body."),
        (status = 408, description = "The body did not arrive within `gateway.http.body_read_timeout_ms`; the connection is closed."),
        (status = 413, description = "The body, once decoded, is larger than `gateway.max_batch_body_bytes`."),
        (status = 415, description = "The body is not JSON, or its Content-Encoding is not one the gateway decodes."),
        (status = 422, description = "The body is not an object with `requests`, or holds none or more than `gateway.max_batch`."),
        Refusals,
        (status = 503, description = "Overloaded, or the idempotency store is unavailable; nothing was submitted. Retry after `Retry-After`."),
    ),
    security(("apiKey" = []), ("bearer" = ["deliveries.write"])),
)]
pub async fn batch(
    State(state): State<AppState>,
    principal: Option<Extension<Principal>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let DeliveryRequestBatch { requests } = json_body(&headers, &body)?;
    if requests.is_empty() || requests.len() > state.max_batch {
        return Err(ApiError::Validation(vec![FieldError::new(
            "requests",
            format!(
                "must hold from 1 to {} delivery requests (gateway.max_batch)",
                state.max_batch
            ),
        )]));
    }
    let key = idempotency_key(&headers)?;
    let principal = principal.as_deref();
    let reply = Reply::to(&state, &headers, principal)?;
    let client = principal.map_or("", |p| p.name.as_str());
    if let Some(key) = &key {
        claim(&state, client, key, &body).await?;
    }
    let submitter = Submitter {
        state: &state,
        principal,
        headers: &headers,
        via: AcceptedLabels::BATCH,
    };
    let mut named = HashMap::new();
    let items = requests.iter().enumerate().map(|(index, raw)| {
        let item = parse_delivery_request(raw.get().as_bytes()).and_then(|request| {
            let name = request.delivery_id.clone();
            match name.and_then(|id| named.insert(id.clone(), index).map(|first| (id, first))) {
                Some((id, first)) => Err(ApiError::Conflict(format!(
                    "deliveryId {id} is named by request {first} (from 0) of this batch too"
                ))),
                None => Ok(request),
            }
        });
        // A request with a deliveryId is named by it alone, so that a POST of
        // it on its own (with no key) is its retry, and the other way round.
        let key = match &item {
            Ok(request) if request.delivery_id.is_some() => None,
            _ => key.as_ref().map(|key| item_key(key, index)),
        };
        let submitter = &submitter;
        // On the heap once: a submission's future is a few kilobytes, which
        // the set of futures would otherwise move again.
        Box::pin(async move { submitter.submit(key, item?).await })
    });
    let outcomes: Vec<_> = items.collect::<FuturesOrdered<_>>().collect().await;
    let mut retry_after = None;
    let mut last_charge = None;
    let results = outcomes
        .into_iter()
        .map(|outcome| match outcome {
            Ok(submitted) => accepted_result(&state, &reply, submitted, &mut last_charge),
            Err(refused) => {
                let (problem, wait) = refused.into_problem();
                let class = if problem.status >= 500 { "5xx" } else { "4xx" };
                skyport_runtime::metrics::global()
                    .batch_refused
                    .get_or_create(&RefusedLabels { class })
                    .inc();
                retry_after = retry_after.max(wait);
                BatchResult {
                    status: problem.status,
                    accepted: None,
                    problem: Some(problem),
                }
            }
        })
        .collect();
    let mut response = (StatusCode::OK, Json(BatchResults { results })).into_response();
    if let Some(seconds) = retry_after {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    }
    Ok(with(response, last_charge))
}

/// The result of a request accepted as `submitted`; its quota charge is
/// kept in `last_charge` (the batch answers the latest's headers).
fn accepted_result(
    state: &AppState,
    reply: &Reply,
    submitted: Submitted,
    last_charge: &mut Option<Charged>,
) -> BatchResult {
    let Submitted {
        id,
        state: current,
        accepted_at,
        lane,
        charged,
    } = submitted;
    if charged.is_some() {
        *last_charge = charged;
    }
    BatchResult {
        status: StatusCode::ACCEPTED.as_u16(),
        accepted: Some(accepted_body(state, reply, id, current, accepted_at, lane)),
        problem: None,
    }
}

/// The key of request `index` of a batch sent with `key`: never a key a
/// header can carry (a space is not a visible character), so never one a
/// POST of its own uses.
fn item_key(key: &str, index: usize) -> String {
    format!("{key} {index}")
}

/// Claims `key` for this batch's `body` (sent by `client`): a batch retried
/// with the same body goes on, and each of its requests finds the delivery
/// it made before under its own key.
///
/// # Errors
/// [`ApiError::Conflict`] when another body holds the key; what the
/// idempotency store answers when it cannot say.
async fn claim(state: &AppState, client: &str, key: &str, body: &[u8]) -> Result<(), ApiError> {
    let now = OffsetDateTime::now_utc();
    let reservation = Reservation {
        delivery_id: Name::batch(client, key),
        fingerprint: idempotency::batch_fingerprint(client, key, body),
        accepted_at: now,
        expires_at: now + state.idempotency_retention,
    };
    match state.idempotency.reserve(&reservation).await? {
        Reserved::New => Ok(()),
        Reserved::Existing(held) if held.fingerprint == reservation.fingerprint => Ok(()),
        Reserved::Existing(_) | Reserved::Recorded(_) => Err(ApiError::Conflict(format!(
            "Idempotency-Key {key} is taken by another batch; a retry must repeat its first request exactly"
        ))),
    }
}
