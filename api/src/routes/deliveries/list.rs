//! `GET /api/deliveryrequests`: a client's deliveries, newest first, a page
//! at a time.
//!
//! With authentication on, a caller sees the deliveries it made (its
//! principal), and a caller with the admin scope every client's; each item
//! carries its links, with a receipt signed for the delivery's owner. With
//! authentication off every caller is the same client, so a listing must not
//! hand out the capability to read and cancel, directly or by a replay: the
//! items carry no links, no request (whose body, posted again under its id,
//! would be a retry answered with a receipt) and no callback URL (often a
//! bearer secret of its own). A delivery still queued in the stream has no
//! status document yet and appears once the worker has read it.

use axum::Extension;
use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::Deserialize;
use skyport_core::ports::{ListCursor, ListQuery};
use skyport_core::request::is_valid_id;
use skyport_core::status::DeliveryState;
use time::OffsetDateTime;
use utoipa::IntoParams;

use super::resources::{DeliveryList, Links, ListedDelivery};
use crate::auth::Principal;
use crate::error::ApiError;
use crate::openapi::Refusals;
use crate::state::AppState;

/// The items a page holds unless `limit` says otherwise.
const DEFAULT_LIMIT: usize = 50;
/// The most items a page may hold.
const MAX_LIMIT: usize = 500;
/// The longest `ownerId` a request may carry.
const MAX_OWNER_LEN: usize = 256;

/// What a listing asks for.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListParams {
    /// Only this owner's deliveries.
    #[param(min_length = 1, max_length = 256)]
    owner_id: Option<String>,
    /// Only deliveries in this state.
    #[param(inline)]
    state: Option<DeliveryState>,
    /// Only deliveries accepted at or after this time (RFC 3339).
    #[serde(default, with = "time::serde::rfc3339::option")]
    #[param(value_type = Option<String>, format = DateTime)]
    since: Option<OffsetDateTime>,
    /// Only deliveries accepted before this time (RFC 3339).
    #[serde(default, with = "time::serde::rfc3339::option")]
    #[param(value_type = Option<String>, format = DateTime)]
    until: Option<OffsetDateTime>,
    /// The most items the page holds (1 to 500; 50 when absent).
    #[param(minimum = 1, maximum = 500)]
    limit: Option<usize>,
    /// Where the page starts: the `next` of the previous page.
    #[param(max_length = 128)]
    cursor: Option<String>,
}

/// Lists delivery requests, newest first.
///
/// A page holds at most `limit` items; `next`, when present, is the cursor
/// of the page after it (a page may hold fewer items and still have one).
/// A cursor stays valid while new deliveries arrive: they sort before it.
#[utoipa::path(
    get,
    path = "/api/deliveryrequests",
    operation_id = "listDeliveryRequests",
    tag = "deliveries",
    params(ListParams),
    responses(
        (status = 200, description = "A page of the caller's deliveries (every client's with the admin scope).", body = DeliveryList),
        (status = 400, description = "A parameter is malformed or out of range, or the cursor is not one this API gave out."),
        (status = 403, description = "The credentials lack the read scope."),
        Refusals,
        (status = 503, description = "The status store is unavailable; retry after `Retry-After`."),
    ),
    security(("apiKey" = []), ("bearer" = ["deliveries.read"])),
)]
pub async fn list(
    State(state): State<AppState>,
    principal: Option<Extension<Principal>>,
    headers: HeaderMap,
    query: Result<Query<ListParams>, QueryRejection>,
) -> Result<Json<DeliveryList>, ApiError> {
    let Query(params) = query.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    let limit = params.limit.unwrap_or(DEFAULT_LIMIT);
    if !(1..=MAX_LIMIT).contains(&limit) {
        return Err(ApiError::BadRequest(format!(
            "limit must be from 1 to {MAX_LIMIT}"
        )));
    }
    if params
        .owner_id
        .as_ref()
        .is_some_and(|owner| owner.is_empty() || owner.len() > MAX_OWNER_LEN)
    {
        return Err(ApiError::BadRequest(format!(
            "ownerId must be 1 to {MAX_OWNER_LEN} characters"
        )));
    }
    let after = params.cursor.as_deref().map(decode_cursor).transpose()?;
    let base = state.base_url(&headers)?;
    let principal = principal.map(|Extension(principal)| principal);
    let query = ListQuery {
        principal: principal
            .as_ref()
            .filter(|principal| !principal.admin)
            .map(|principal| principal.name.clone()),
        owner: params.owner_id,
        state: params.state,
        since: params.since,
        until: params.until,
        limit,
        after,
    };
    let page = state.status.list(&query).await?;
    let items = page
        .items
        .into_iter()
        .map(|mut document| {
            // Only an authenticated caller is handed the capability (for
            // the owner: an admin may use it too).
            let links = principal.as_ref().map(|caller| {
                let owner = document.principal.as_deref().unwrap_or(&caller.name);
                let receipt = state.receipts.sign(
                    &document.id,
                    document.created_at,
                    document.lane,
                    Some(owner),
                );
                Links::new(&base, &document.id, &receipt, document.state)
            });
            if principal.is_none() {
                document.request = None;
                document.callback_url = None;
            }
            ListedDelivery {
                terminal: document.state.is_terminal(),
                document,
                links,
            }
        })
        .collect();
    Ok(Json(DeliveryList {
        items,
        next: page.next.as_ref().map(encode_cursor),
    }))
}

/// A cursor as clients hold it: opaque, URL-safe.
fn encode_cursor(cursor: &ListCursor) -> String {
    URL_SAFE_NO_PAD.encode(format!("{}.{}", cursor.created_ms, cursor.id))
}

fn decode_cursor(text: &str) -> Result<ListCursor, ApiError> {
    URL_SAFE_NO_PAD
        .decode(text)
        .ok()
        .and_then(|bytes| String::from_utf8(bytes).ok())
        .and_then(|text| {
            let (created_ms, id) = text.split_once('.')?;
            let created_ms = created_ms.parse().ok()?;
            is_valid_id(id).then(|| ListCursor {
                created_ms,
                id: id.to_owned(),
            })
        })
        .ok_or_else(|| ApiError::BadRequest("cursor is not one this API gave out".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_reads_back_as_it_was_given_out_and_anything_else_is_refused() {
        let cursor = ListCursor {
            created_ms: 1_764_150_000_123,
            id: "d-2026.11.26_1".into(),
        };
        assert_eq!(
            decode_cursor(&encode_cursor(&cursor)).expect("read back"),
            cursor
        );
        for forged in [
            "",
            "not base64!",
            &URL_SAFE_NO_PAD.encode("12"),
            &URL_SAFE_NO_PAD.encode("x.d-1"),
            &URL_SAFE_NO_PAD.encode("1.bad id"),
        ] {
            assert!(decode_cursor(forged).is_err(), "{forged:?}");
        }
    }
}
