//! `PATCH /api/deliveryrequests/{id}`: reschedule a delivery with a JSON
//! merge patch (RFC 7396) of its times and places.
//!
//! The gateway checks what the patch alone shows (types, the fields it may
//! name, a patched deadline after a patched pickup time), `If-Match` against
//! the status resource's `ETag`, and that the delivery has not ended Failed or
//! Cancelled; the worker checks the rest against the request it holds and
//! records the outcome in the status's `changes`. The patch travels as a
//! `DeliveryRescheduled` event on the delivery's partition, after its request.

use axum::Extension;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, header};
use axum::response::Response;
use sha2::{Digest, Sha256};
use skyport_core::event::{DeliveryRescheduled, Event};
use skyport_core::ports::{Reservation, Reserved};
use skyport_core::request::Reschedule;
use skyport_core::status::DeliveryState;
use time::OffsetDateTime;

use super::{
    DeliveryPath, Reply, StatusQuery, accepted, client_of, entity_tag, id_and_query,
    idempotency_key, publish, receipt_principal, traceparent, with,
};
use crate::auth::Principal;
use crate::error::ApiError;
use crate::extract::JsonBody;
use crate::openapi::{DeliveryRefusals, QuotaRefusal, Refusals};
use crate::routes::access::{self, not_yet_written};
use crate::state::AppState;

/// The first schema version with `DeliveryRescheduled`.
const RESCHEDULE_VERSION: u32 = 3;

/// Reschedules a delivery: changes its pickup time, deadline, pickup or
/// drop-off location.
///
/// The body is a JSON merge patch (RFC 7396) of those four fields and no
/// others; none may be removed. Before the steps it changes have run, they
/// use the new values; once the delivery is Scheduled, its Delivery and Drone
/// bookings are updated and it stays Scheduled at a new `revision` (when a
/// service refuses, the previous booking stands and the change says why).
/// Every change and what became of it is in the status's `changes`.
#[utoipa::path(
    patch,
    path = "/api/deliveryrequests/{id}",
    operation_id = "rescheduleDeliveryRequest",
    tag = "deliveries",
    params(
        DeliveryPath,
        StatusQuery,
        ("If-Match" = Option<String>, Header, description = "The status's `ETag` the change was decided on (or `*`): when the status has changed since, the answer is 412 and nothing is changed."),
        ("Idempotency-Key" = Option<String>, Header, max_length = 255, pattern = r"^[\x21-\x7E]{1,255}$",
            description = "Makes a retry safe: the same key (for the same client and delivery) is the same change, applied once; reusing it with another patch is a 409."),
    ),
    request_body(content = Reschedule, content_type = "application/merge-patch+json",
        description = "The fields to change (`application/json` is taken too)."),
    responses(
        (status = 202, description = "The change is durable in the stream; the status's `changes` will say what became of it.", body = super::resources::Accepted,
            headers(
                ("Location" = String, description = "The status URL."),
                ("Retry-After" = u32, description = "Seconds to wait before polling."),
                ("retry-after-ms" = u64, description = "The same wait in milliseconds."),
                ("RateLimit-Policy" = String, description = "When quotas are on (`gateway.quotas`): the client's quota, `\"default\";q=BURST;w=SECONDS` (`\"client\"` for a quota of its own)."),
                ("RateLimit" = String, description = "When quotas are on: `\"default\";r=LEFT;t=SECONDS`, the requests left now and the seconds until the quota is whole again."),
            )),
        (status = 403, description = "The credentials lack the write scope."),
        DeliveryRefusals,
        (status = 409, description = "The delivery ended Failed or Cancelled (or is being cancelled), or the Idempotency-Key was used for another change."),
        (status = 410, description = "The delivery ended longer ago than `store.status_retention_s` and its status was removed."),
        (status = 412, description = "`If-Match` names a version of the status that is not the current one."),
        (status = 415, description = "The body is not JSON."),
        (status = 422, description = "The patch names a field it may not change, removes one, has a value of the wrong type or breaks a rule (a deadline before the pickup time), or changes nothing; `errors` lists them."),
        QuotaRefusal,
        Refusals,
        (status = 503, description = "Overloaded, a backend is unavailable, or the gateways still write an event schema version before 3 (a rolling upgrade); retry after `Retry-After`."),
    ),
    security(("apiKey" = []), ("bearer" = ["deliveries.write"])),
)]
pub async fn reschedule(
    State(state): State<AppState>,
    principal: Option<Extension<Principal>>,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<StatusQuery>, QueryRejection>,
    JsonBody(changes): JsonBody<Reschedule>,
) -> Result<Response, ApiError> {
    let (id, query) = id_and_query(path, query)?;
    changes.validate().map_err(ApiError::Validation)?;
    let key = idempotency_key(&headers)?;
    let base = state.base_url(&headers)?;
    let caller = principal.as_deref();
    let opened = access::open(&state, &id, query.receipt.as_deref(), caller).await?;
    let (accepted_at, lane) = (opened.accepted_at, opened.lane);
    if state.event_schema_version < RESCHEDULE_VERSION {
        return Err(ApiError::Unavailable {
            retry_after_s: state.retry_after_s,
            source: Some(
                format!(
                    "a reschedule needs event schema version {RESCHEDULE_VERSION}; \
                     gateway.event_schema_version is {} until every worker reads it",
                    state.event_schema_version
                )
                .into(),
            ),
        });
    }
    let (document, version) = match opened.stored {
        Some(stored) => (stored.document, Some(stored.etag)),
        None => (
            not_yet_written(&state, id.clone(), accepted_at, lane)?,
            None,
        ),
    };
    if let Some(expected) = headers.get(header::IF_MATCH) {
        let current = entity_tag(version.as_ref(), false);
        if !matches(expected.to_str().unwrap_or_default(), &current) {
            return Err(ApiError::PreconditionFailed(format!(
                "the status of delivery request {id} is now {}; read it again and decide on that",
                current.to_str().unwrap_or_default()
            )));
        }
    }
    match document.state {
        DeliveryState::Failed | DeliveryState::Cancelled => {
            return Err(ApiError::Conflict(format!(
                "delivery request {id} ended {:?}; there is nothing to reschedule",
                document.state
            )));
        }
        _ if document.cancel_requested_at.is_some() => {
            return Err(ApiError::Conflict(format!(
                "delivery request {id} is being cancelled; there is nothing to reschedule"
            )));
        }
        DeliveryState::Accepted
        | DeliveryState::Waiting
        | DeliveryState::Processing
        | DeliveryState::Scheduled => {}
    }
    let charged = state.charge(client_of(caller, &document))?;
    let client = caller.map_or("", |p| p.name.as_str());
    let now = OffsetDateTime::now_utc();
    // The reservation of a new key, released when the change is not published.
    let mut reserved = None;
    let change_id = match &key {
        Some(key) => {
            let reservation = Reservation {
                delivery_id: change_name(client, &id, key),
                fingerprint: fingerprint(client, &id, key, &changes),
                accepted_at: now,
                expires_at: now + state.idempotency_retention,
            };
            match state.idempotency.reserve(&reservation).await? {
                // A retry publishes again: the worker applies a change once.
                Reserved::Existing(held) if held.fingerprint == reservation.fingerprint => {
                    reservation.delivery_id
                }
                // (A change's name is never a delivery's: `Recorded` cannot
                // answer it, and would mean a name in use all the same.)
                Reserved::Existing(_) | Reserved::Recorded(_) => {
                    return Err(ApiError::Conflict(format!(
                        "Idempotency-Key {key} was already used for a different change; \
                         a retry must repeat the patch exactly"
                    )));
                }
                Reserved::New => {
                    let name = reservation.delivery_id.clone();
                    reserved = Some(reservation);
                    name
                }
            }
        }
        None => uuid::Uuid::new_v4().to_string(),
    };
    let event = Event::DeliveryRescheduled(DeliveryRescheduled {
        delivery_id: id.clone(),
        change_id,
        requested_at: now,
        changes,
        traceparent: traceparent(&headers),
        principal: caller.map(|p| p.name.clone()),
    });
    if let Err(e) = publish(&state, &event, lane).await {
        if let Some(reservation) = reserved
            && let Err(release) = state.idempotency.release(&reservation).await
        {
            tracing::warn!(delivery_id = %id, error = %release, "Could not release the key of a change that was not published; a retry with another patch gets a 409 until it expires.");
        }
        return Err(e);
    }
    let reply = Reply {
        base,
        respond_async: false,
        principal: receipt_principal(caller, &document),
    };
    accepted(&state, &reply, id, document.state, accepted_at, lane).map(|r| with(r, charged))
}

/// Whether an `If-Match` value names `current` (or is `*`), compared
/// strongly as RFC 9110 asks: a weak tag never matches.
fn matches(expected: &str, current: &axum::http::HeaderValue) -> bool {
    let current = current.to_str().unwrap_or_default();
    expected
        .split(',')
        .map(str::trim)
        .any(|tag| tag == "*" || tag == current)
}

/// The change's id under an `Idempotency-Key`: the same for the same client,
/// delivery and key. A `:` keeps it apart from every delivery id.
fn change_name(client: &str, id: &str, key: &str) -> String {
    let digest = Sha256::new()
        .chain_update(b"skyport-change-v1\0")
        .chain_update(client.as_bytes())
        .chain_update(b"\0")
        .chain_update(id.as_bytes())
        .chain_update(b"\0")
        .chain_update(key.as_bytes())
        .finalize();
    let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    format!("change:{hex}")
}

/// What was asked under a key, so that a retry is told from another change.
fn fingerprint(client: &str, id: &str, key: &str, changes: &Reschedule) -> String {
    let body = serde_json::to_vec(changes)
        .unwrap_or_else(|e| unreachable!("a reschedule always serializes: {e}"));
    let digest = Sha256::new()
        .chain_update(client.as_bytes())
        .chain_update(b"\0")
        .chain_update(id.as_bytes())
        .chain_update(b"\0")
        .chain_update(key.as_bytes())
        .chain_update(b"\0")
        .chain_update(&body)
        .finalize();
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    #[test]
    fn if_match_compares_strongly_and_takes_a_list_or_a_star() {
        let current = HeaderValue::from_static("\"v1\"");
        assert!(matches("\"v1\"", &current));
        assert!(matches("\"v0\", \"v1\"", &current));
        assert!(matches("*", &current));
        assert!(!matches("W/\"v1\"", &current));
        assert!(!matches("\"v0\"", &current));
    }

    #[test]
    fn a_key_names_one_change_of_one_delivery_for_one_client() {
        let a = change_name("alice", "d-1", "k");
        assert_eq!(a, change_name("alice", "d-1", "k"));
        assert_ne!(a, change_name("bob", "d-1", "k"));
        assert_ne!(a, change_name("alice", "d-2", "k"));
        assert!(a.starts_with("change:"));
    }
}
