//! Who may read or change a delivery: whoever holds its receipt, when the
//! receipt was signed for them, and, with authentication on, only the
//! principal that made it or one with the admin scope. Anyone else is
//! answered exactly as for an id nobody ever used (404), before anything of
//! the delivery is read into the answer or changed.

use skyport_core::ports::{Lane, Versioned};
use skyport_core::status::StatusDocument;
use time::OffsetDateTime;

use crate::auth::Principal;
use crate::error::ApiError;
use crate::receipt::Verified;
use crate::state::AppState;

/// A delivery as its caller may see it: what its receipt says, and its
/// status document as read now (`None` while the delivery is queued).
#[derive(Debug)]
pub(crate) struct Opened {
    pub(crate) accepted_at: OffsetDateTime,
    pub(crate) lane: Lane,
    pub(crate) stored: Option<Versioned>,
}

/// Reads `id` for `caller` (`None` with auth off) holding `receipt`.
///
/// The receipt must verify for the caller — or, for a caller with the admin
/// scope and for a delivery made without a principal (with auth off), for
/// the principal its document records — and the document, once there,
/// must be the caller's to touch ([`may_touch`]).
///
/// # Errors
/// The 404 of an unknown id when it is not; [`ApiError::Unavailable`] when
/// the store cannot be read.
pub(crate) async fn open(
    state: &AppState,
    id: &str,
    receipt: Option<&str>,
    caller: Option<&Principal>,
) -> Result<Opened, ApiError> {
    let receipt = receipt.ok_or_else(|| unknown(id))?;
    let name = caller.map(|caller| caller.name.as_str());
    if let Some(verified) = state.receipts.verify(id, receipt, name) {
        let stored = state.status.get(id).await?;
        if stored
            .as_ref()
            .is_some_and(|stored| !may_touch(caller, &stored.document))
        {
            return Err(unknown(id));
        }
        return Ok(opened(verified, stored));
    }
    // Not signed for the caller: an admin may use the owner's receipt (a
    // listing hands it out), and a delivery made with auth off has no owner.
    let Some(caller) = caller else {
        return Err(unknown(id));
    };
    let stored = state.status.get(id).await?.ok_or_else(|| unknown(id))?;
    let owner = stored.document.principal.as_deref();
    if !(caller.admin || owner.is_none()) {
        return Err(unknown(id));
    }
    let verified = state
        .receipts
        .verify(id, receipt, owner)
        .ok_or_else(|| unknown(id))?;
    Ok(opened(verified, Some(stored)))
}

fn opened(verified: Verified, stored: Option<Versioned>) -> Opened {
    Opened {
        accepted_at: verified.accepted_at,
        lane: verified.lane,
        stored,
    }
}

/// Whether `caller` may read and change `document`: with auth off anyone
/// holding its receipt; else its owner, a caller with the admin scope, or,
/// for a delivery made with auth off (no principal), whoever holds its
/// receipt.
pub(crate) fn may_touch(caller: Option<&Principal>, document: &StatusDocument) -> bool {
    let owner = document.principal.as_deref();
    caller.is_none_or(|caller| owner.is_none() || caller.may_touch(owner))
}

/// The status of an opened delivery with no document: Accepted while it may
/// still be queued, else gone, since its document has outlived the
/// retention (`store.status_retention_s`; the worker starts every delivery
/// within `worker.allow_backlog_to_ms`).
pub(crate) fn not_yet_written(
    state: &AppState,
    id: String,
    accepted_at: OffsetDateTime,
    lane: Lane,
) -> Result<StatusDocument, ApiError> {
    match state.status_gone_after {
        Some(after) if OffsetDateTime::now_utc() - accepted_at > after => {
            let accepted_at = accepted_at
                .format(&time::format_description::well_known::Rfc3339)
                .unwrap_or_default();
            Err(ApiError::Gone(format!(
                "delivery request {id} was accepted at {accepted_at}; its status was removed \
                 once it had ended longer ago than store.status_retention_s"
            )))
        }
        _ => Ok(StatusDocument {
            lane,
            ..StatusDocument::accepted(id, accepted_at)
        }),
    }
}

/// The answer to an id nobody may see: never used, or not the caller's.
pub(crate) fn unknown(id: &str) -> ApiError {
    ApiError::NotFound(format!("no delivery request {id} is known"))
}
