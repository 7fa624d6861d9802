//! `DELETE /api/deliveryrequests/{id}`: a cancellation made durable.

use axum::Extension;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::Response;
use skyport_core::event::{CancellationRequested, Event};
use skyport_core::status::DeliveryState;
use time::OffsetDateTime;

use super::resources::Accepted;
use super::{
    DeliveryPath, Reply, StatusQuery, accepted, client_of, id_and_query, publish,
    receipt_principal, traceparent, with,
};
use crate::auth::Principal;
use crate::error::ApiError;
use crate::openapi::{DeliveryRefusals, QuotaRefusal, Refusals};
use crate::routes::access::{self, not_yet_written};
use crate::state::AppState;

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
        DeliveryState::Accepted
        | DeliveryState::Waiting
        | DeliveryState::Processing
        | DeliveryState::Scheduled => {
            charged = state.charge(client_of(caller, &document))?;
            let event = Event::CancellationRequested(CancellationRequested {
                delivery_id: id.clone(),
                requested_at: OffsetDateTime::now_utc(),
                traceparent: traceparent(&headers),
                principal: caller.map(|p| p.name.clone()),
            });
            publish(&state, &event, lane).await?;
        }
    }
    let reply = Reply {
        base,
        respond_async: false,
        principal: receipt_principal(caller, &document),
    };
    accepted(&state, &reply, id, current, accepted_at, lane).map(|r| with(r, charged))
}
