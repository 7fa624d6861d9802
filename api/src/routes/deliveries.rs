//! `POST /api/deliveryrequests`, `GET /api/deliveryrequests/{id}/status` and
//! `DELETE /api/deliveryrequests/{id}`.
//!
//! A 202 is sent only after the event is durable in the stream. The status URL
//! carries a signed receipt, so a status read before the worker has written
//! anything still answers Accepted, never 404.

use axum::Json;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use skyport_shared::event::{CancellationRequested, DeliveryRequested, Event};
use skyport_shared::request::is_valid_id;
use skyport_shared::status::{DeliveryState, StatusDocument};
use time::OffsetDateTime;

use crate::error::ApiError;
use crate::extract::ValidDeliveryRequest;
use crate::state::AppState;

/// The path every delivery request is posted to.
pub const DELIVERY_REQUESTS: &str = "/api/deliveryrequests";
const MAX_IDEMPOTENCY_KEY_LEN: usize = 255;

/// The answer to an accepted request.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Accepted {
    pub delivery_id: String,
    pub status: DeliveryState,
    pub status_url: String,
}

/// `POST /api/deliveryrequests`
pub async fn create(
    State(state): State<AppState>,
    headers: HeaderMap,
    ValidDeliveryRequest(mut request): ValidDeliveryRequest,
) -> Result<Response, ApiError> {
    let idempotency_key = idempotency_key(&headers)?;
    let id = request
        .delivery_id
        .get_or_insert_with(|| uuid::Uuid::new_v4().to_string())
        .clone();
    let accepted_at = OffsetDateTime::now_utc();
    let event = Event::DeliveryRequested(Box::new(DeliveryRequested {
        delivery_id: id.clone(),
        accepted_at,
        traceparent: traceparent(&headers),
        idempotency_key,
        request,
    }));
    publish(&state, event).await?;
    accepted(&state, &headers, id, DeliveryState::Accepted, accepted_at)
}

/// `DELETE /api/deliveryrequests/{id}`: asks the worker to cancel. Before the
/// drone is scheduled the delivery stops at its next step; after, its steps
/// are undone. Either way it ends Cancelled; a second DELETE changes nothing.
pub async fn cancel(
    State(state): State<AppState>,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<StatusQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let (id, query) = id_and_query(path, query)?;
    let stored = state.status.get(&id).await?;
    let (current, accepted_at) = match &stored {
        Some(stored) => (stored.document.state, stored.document.created_at),
        None => (DeliveryState::Accepted, verified(&state, &id, &query)?),
    };
    match current {
        DeliveryState::Failed => {
            return Err(ApiError::Conflict(format!(
                "delivery request {id} already failed; there is nothing to cancel"
            )));
        }
        DeliveryState::Cancelled => {}
        DeliveryState::Accepted | DeliveryState::Processing | DeliveryState::Scheduled => {
            let event = Event::CancellationRequested(CancellationRequested {
                delivery_id: id.clone(),
                requested_at: OffsetDateTime::now_utc(),
                traceparent: traceparent(&headers),
            });
            publish(&state, event).await?;
        }
    }
    accepted(&state, &headers, id, current, accepted_at)
}

async fn publish(state: &AppState, event: Event) -> Result<(), ApiError> {
    state.publisher.publish(event.outbound()).await?;
    Ok(())
}

/// The 202 of a request that is now durable in the stream.
fn accepted(
    state: &AppState,
    headers: &HeaderMap,
    id: String,
    status: DeliveryState,
    accepted_at: OffsetDateTime,
) -> Result<Response, ApiError> {
    let receipt = state.receipts.sign(&id, accepted_at);
    let status_url = format!(
        "{}{DELIVERY_REQUESTS}/{id}/status?receipt={receipt}",
        state.base_url(headers)
    );
    let location =
        HeaderValue::from_str(&status_url).map_err(|e| ApiError::Internal(Box::new(e)))?;
    let body = Accepted {
        delivery_id: id,
        status,
        status_url,
    };
    Ok((
        StatusCode::ACCEPTED,
        [
            (header::LOCATION, location),
            (header::RETRY_AFTER, HeaderValue::from(state.retry_after_s)),
        ],
        Json(body),
    )
        .into_response())
}

#[derive(Debug, Deserialize)]
pub struct StatusQuery {
    receipt: Option<String>,
}

/// `GET /api/deliveryrequests/{id}/status`
pub async fn status(
    State(state): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<StatusQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let (id, query) = id_and_query(path, query)?;
    let document = match state.status.get(&id).await? {
        Some(stored) => stored.document,
        None => StatusDocument::accepted(id.clone(), verified(&state, &id, &query)?),
    };
    let mut response = Json(&document).into_response();
    if !document.state.is_terminal() {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(state.retry_after_s));
    }
    Ok(response)
}

/// The delivery id of the path (404 when it cannot be one) and the query.
fn id_and_query(
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

/// When `id` was accepted, according to the query's receipt; 404 without a valid one.
fn verified(state: &AppState, id: &str, query: &StatusQuery) -> Result<OffsetDateTime, ApiError> {
    query
        .receipt
        .as_deref()
        .and_then(|receipt| state.receipts.verify(id, receipt))
        .ok_or_else(|| unknown(id))
}

fn unknown(id: &str) -> ApiError {
    ApiError::NotFound(format!("no delivery request {id} is known"))
}

fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(value) = headers.get("idempotency-key") else {
        return Ok(None);
    };
    match value.to_str() {
        Ok(key) if !key.is_empty() && key.len() <= MAX_IDEMPOTENCY_KEY_LEN => {
            Ok(Some(key.to_owned()))
        }
        _ => Err(ApiError::BadRequest(format!(
            "Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY_LEN} visible ASCII characters"
        ))),
    }
}

/// The W3C trace context of the request, when it has a well-formed one.
fn traceparent(headers: &HeaderMap) -> Option<String> {
    let value = headers.get("traceparent")?.to_str().ok()?;
    let parts: Vec<&str> = value.split('-').collect();
    let well_formed = parts.len() == 4
        && [2, 32, 16, 2]
            .iter()
            .zip(&parts)
            .all(|(len, part)| part.len() == *len && part.bytes().all(|b| b.is_ascii_hexdigit()));
    well_formed.then(|| value.to_owned())
}
