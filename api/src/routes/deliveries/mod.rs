//! The delivery resource: one file per verb (`create`, `cancel`, `status`,
//! `reschedule`, `list`), its representations (`resources`, the browser's
//! `status_page`), and what the verbs share: the receipt and path they
//! read, the 202 they answer and the publish that makes an event durable.
//!
//! A 202 is sent only after the event is durable in the stream. The status URL
//! carries a signed receipt, so a status read before the worker has written
//! anything still answers Accepted, never 404.

use std::fmt::Write as _;

use axum::Json;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{AppendHeaders, IntoResponse, Response};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use skyport_core::event::Event;
use skyport_core::ports::{ETag, Lane};
use skyport_core::request::is_valid_id;
use skyport_core::status::{DeliveryState, StatusDocument};
use skyport_runtime::{telemetry, trace_span};
use time::OffsetDateTime;
use tracing::Instrument;
use utoipa::IntoParams;

use self::resources::{Accepted, Links};
use crate::auth::Principal;
use crate::error::ApiError;
use crate::pacing;
use crate::prefer;
use crate::quotas::Charged;
use crate::routes::access::unknown;
use crate::state::AppState;

pub mod batch;
pub mod cancel;
pub mod create;
pub mod list;
pub mod reschedule;
pub mod resources;
pub mod status;
pub mod status_page;

const MAX_IDEMPOTENCY_KEY_LEN: usize = 255;

/// Where an Azure long-running-operation poller reads the operation's status.
const OPERATION_LOCATION: &str = "operation-location";

/// The header that makes a POST safe to retry.
const IDEMPOTENCY_KEY: &str = "Idempotency-Key";

/// `response` with the quota headers of a metered request.
pub(crate) fn with(mut response: Response, charged: Option<Charged>) -> Response {
    if let Some(charged) = charged {
        response.headers_mut().extend(charged.headers);
    }
    response
}

/// Whom the receipt of an answer about `document` is signed for: its owner
/// (an admin's answer hands out the owner's, as a listing does), else the
/// caller.
pub(crate) fn receipt_principal(
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
pub(crate) fn client_of<'a>(
    principal: Option<&'a Principal>,
    document: &'a StatusDocument,
) -> &'a str {
    principal.map_or_else(
        || document.owner_id.as_deref().unwrap_or_default(),
        Principal::client,
    )
}

/// Makes `event` durable in `lane`, its delivery's.
pub(crate) async fn publish(state: &AppState, event: &Event, lane: Lane) -> Result<(), ApiError> {
    let span = trace_span!("publish", otel.kind = "producer");
    let outbound = event
        .outbound_as(state.event_schema_version, lane)
        .map_err(|e| ApiError::Internal(Box::new(e)))?;
    state.publisher.publish(outbound).instrument(span).await?;
    Ok(())
}

/// How a 202 is answered: the base of its URLs, whether as the start of a
/// long-running operation, and whom its receipt is signed for.
pub(crate) struct Reply {
    pub(crate) base: String,
    /// `Operation-Location` names the status URL that answers 202 while the
    /// delivery runs (`Prefer: respond-async`, or `gateway.respond_async`).
    pub(crate) respond_async: bool,
    /// The principal the receipt opens the delivery to (`None` with auth off).
    pub(crate) principal: Option<String>,
}

impl Reply {
    /// How a POST by `principal` with `headers` is answered.
    ///
    /// # Errors
    /// [`ApiError::BadRequest`] when status URLs have no base (see
    /// [`AppState::base_url`]).
    pub(crate) fn to(
        state: &AppState,
        headers: &HeaderMap,
        principal: Option<&Principal>,
    ) -> Result<Self, ApiError> {
        Ok(Self {
            base: state.base_url(headers)?,
            respond_async: state.respond_async || prefer::respond_async(headers),
            principal: principal.map(|p| p.name.clone()),
        })
    }
}

/// The 202 of a request that is now durable in the stream.
pub(crate) fn accepted(
    state: &AppState,
    reply: &Reply,
    id: String,
    status: DeliveryState,
    accepted_at: OffsetDateTime,
    lane: Lane,
) -> Result<Response, ApiError> {
    let body = accepted_body(state, reply, id, status, accepted_at, lane);
    let header_value =
        |url: &str| HeaderValue::from_str(url).map_err(|e| ApiError::Internal(Box::new(e)));
    let location = header_value(&body.status_url)?;
    let operation = if reply.respond_async {
        vec![
            (
                HeaderName::from_static(OPERATION_LOCATION),
                header_value(&format!("{}&respond=async", body.status_url))?,
            ),
            (
                HeaderName::from_static(prefer::PREFERENCE_APPLIED),
                HeaderValue::from_static("respond-async"),
            ),
        ]
    } else {
        Vec::new()
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

/// What a 202 says of a request now durable in the stream: its delivery,
/// where it is now and its status URL, with a receipt signed for the
/// principal `reply` names.
pub(crate) fn accepted_body(
    state: &AppState,
    reply: &Reply,
    id: String,
    status: DeliveryState,
    accepted_at: OffsetDateTime,
    lane: Lane,
) -> Accepted {
    let receipt = state
        .receipts
        .sign(&id, accepted_at, lane, reply.principal.as_deref());
    Accepted {
        status_url: Links::status_url(&reply.base, &id, &receipt),
        delivery_id: id,
        status,
        receipt,
        outcome: None,
    }
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
    pub(crate) receipt: Option<String>,
}

/// The delivery id of the path (404 when it cannot be one) and the query.
pub(crate) fn id_and_query(
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
pub(crate) fn entity_tag(version: Option<&ETag>, html: bool) -> HeaderValue {
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

pub(crate) fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
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
pub(crate) fn traceparent(headers: &HeaderMap) -> Option<String> {
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
