//! The operators' routes, behind the admin scope when authentication is on:
//! `POST /admin/redrive` runs Failed deliveries again in a new attempt epoch
//! and publishes dead-lettered events again; `POST /admin/callbacks/resend`
//! marks callbacks pending again so that the notifier sends them.
//!
//! Both find what they act on through the status store's listing (every
//! client's deliveries, newest first) or by explicit ids, and write each
//! document on the version they read, so a document that moved meanwhile is
//! left to what moved it.
//!
//! A search goes a listing page at a time: it acts on a page's matches
//! (publish, then mark) before it reads the next, so memory holds one page
//! however many match. A call stops once it has matched `limit` (or read
//! [`PAGES_PER_CALL`] pages) and answers `next`, an opaque token the operator
//! sends back as `cursor` to go on: through the Failed deliveries, then, with
//! `deadLetters`, the dead-lettered events. A call with `ids` is one call.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::Deserialize;
use skyport_core::ports::{ListCursor, ListQuery, Precondition, StatusStoreError, Versioned};
use skyport_core::request::is_valid_id;
use skyport_core::status::{DeliveryState, StatusDocument};
use time::OffsetDateTime;
use utoipa::IntoParams;

use crate::error::ApiError;
use crate::state::AppState;

/// The most ids one request may name (so that a body stays well within
/// `gateway.max_body_bytes`).
const MAX_IDS: usize = 500;
/// The listing's page size while an operation looks for what it acts on.
const PAGE: usize = 500;
/// The most listing pages one call reads (25,000 documents), so that a
/// filter that matches little still answers soon, with `next`.
const PAGES_PER_CALL: usize = 50;
/// Dead-lettered events read at once (each holds its raw event).
const DEAD_LETTER_PAGE: usize = 100;
/// The most dead-letter pages one call reads.
const DEAD_LETTER_PAGES_PER_CALL: usize = 50;
/// What one call matches unless `limit` says otherwise.
const DEFAULT_LIMIT: usize = 1_000;
/// The most one call may match: its memory is a page whatever the limit,
/// so this bounds its time (BENCHMARKS.md: a call of 10,000 on the
/// embedded store takes seconds, well within a client's timeout).
const MAX_LIMIT: usize = 10_000;
/// The longest cursor this API gives out is well within this.
const MAX_CURSOR_LEN: usize = 256;
/// The longest reason a redrive may give.
const MAX_REASON_LEN: usize = 256;
/// Deliveries an operation writes at once (a store like Cosmos DB batches
/// writes, so one at a time would wait for a batch each).
const AT_ONCE: usize = 64;

/// Whether to act or only count, and which part of the matches this call takes.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct OperationParams {
    /// Count what would be done, and do nothing.
    #[serde(default)]
    dry_run: bool,
    /// The most deliveries (and, for a redrive, dead-lettered events) this
    /// call matches: 1 to 10,000, 1,000 when absent. Not with `ids`.
    #[param(minimum = 1, maximum = 10000)]
    limit: Option<usize>,
    /// Where this call goes on: the `next` of the previous answer, sent
    /// with the same body. Not with `ids`.
    #[param(max_length = 256)]
    cursor: Option<String>,
}

/// The operation a continuation token belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Operation {
    Redrive,
    Resend,
}

impl Operation {
    fn tag(self) -> &'static str {
        match self {
            Self::Redrive => "r",
            Self::Resend => "c",
        }
    }
}

/// Where an operation goes on: what its continuation token holds.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Position {
    /// In the listing, after this document.
    Listing(ListCursor),
    /// In the dead-lettered events, after the one at this position (from
    /// the first when `None`); only a redrive's.
    DeadLetters(Option<(u32, u64)>),
}

impl Position {
    /// The token as the operator holds it: opaque, URL-safe.
    fn encode(&self, operation: Operation) -> String {
        let tag = operation.tag();
        let text = match self {
            Self::Listing(cursor) => format!("{tag}.d.{}.{}", cursor.created_ms, cursor.id),
            Self::DeadLetters(None) => format!("{tag}.l"),
            Self::DeadLetters(Some((partition, offset))) => {
                format!("{tag}.l.{partition}.{offset}")
            }
        };
        URL_SAFE_NO_PAD.encode(text)
    }

    /// A token `operation` gave out; anything else (another operation's, a
    /// redrive's dead-letter position for a resend, a forged one) is a 400.
    fn decode(operation: Operation, token: &str) -> Result<Self, ApiError> {
        let refused = || ApiError::BadRequest("cursor is not one this operation gave out".into());
        if token.len() > MAX_CURSOR_LEN {
            return Err(refused());
        }
        let text = URL_SAFE_NO_PAD
            .decode(token)
            .ok()
            .and_then(|bytes| String::from_utf8(bytes).ok())
            .ok_or_else(refused)?;
        let mut parts = text.splitn(4, '.');
        if parts.next() != Some(operation.tag()) {
            return Err(refused());
        }
        let position = match (operation, parts.next(), parts.next(), parts.next()) {
            (_, Some("d"), Some(created_ms), Some(id)) => {
                let created_ms = created_ms.parse().ok().ok_or_else(refused)?;
                if !is_valid_id(id) {
                    return Err(refused());
                }
                Self::Listing(ListCursor {
                    created_ms,
                    id: id.to_owned(),
                })
            }
            (Operation::Redrive, Some("l"), None, None) => Self::DeadLetters(None),
            (Operation::Redrive, Some("l"), Some(partition), Some(offset)) => {
                let partition = partition.parse().ok().ok_or_else(refused)?;
                let offset = offset.parse().ok().ok_or_else(refused)?;
                Self::DeadLetters(Some((partition, offset)))
            }
            _ => return Err(refused()),
        };
        Ok(position)
    }
}

/// What a call of a search takes: at most `limit` matches, from `from`
/// (the start when `None`).
struct Paging {
    dry_run: bool,
    limit: usize,
    from: Option<Position>,
}

impl Paging {
    /// `params` checked for `operation`; `named`: the body names its ids,
    /// which is one call, so a limit or a cursor is refused.
    fn of(params: OperationParams, operation: Operation, named: bool) -> Result<Self, ApiError> {
        if named && (params.limit.is_some() || params.cursor.is_some()) {
            return Err(ApiError::BadRequest(
                "limit and cursor page a search; a call with ids acts on those ids at once".into(),
            ));
        }
        let limit = params.limit.unwrap_or(DEFAULT_LIMIT);
        if !(1..=MAX_LIMIT).contains(&limit) {
            return Err(ApiError::BadRequest(format!(
                "limit must be from 1 to {MAX_LIMIT}"
            )));
        }
        let from = params
            .cursor
            .as_deref()
            .map(|token| Position::decode(operation, token))
            .transpose()?;
        Ok(Self {
            dry_run: params.dry_run,
            limit,
            from,
        })
    }
}

pub mod redrive;
pub mod resend;

/// The schema of `ids`: at most [`MAX_IDS`] delivery ids.
pub(super) fn delivery_ids() -> utoipa::openapi::schema::Array {
    let id = utoipa::openapi::ObjectBuilder::new()
        .schema_type(utoipa::openapi::Type::String)
        .min_length(Some(1))
        .max_length(Some(64))
        .pattern(Some(r"^[A-Za-z0-9._-]{1,64}$"));
    utoipa::openapi::schema::ArrayBuilder::new()
        .items(id)
        .max_items(Some(MAX_IDS))
        .description(Some("Delivery ids (at most 500)."))
        .build()
}

fn in_window(
    at: OffsetDateTime,
    since: Option<OffsetDateTime>,
    until: Option<OffsetDateTime>,
) -> bool {
    since.is_none_or(|since| at >= since) && until.is_none_or(|until| at < until)
}

/// The documents `ids` name that are in `in_state` and `wanted`.
async fn by_ids(
    state: &AppState,
    ids: &[String],
    in_state: Option<DeliveryState>,
    wanted: &(dyn Fn(&StatusDocument) -> bool + Sync),
) -> Result<Vec<Versioned>, ApiError> {
    let mut found = Vec::new();
    for id in ids {
        if let Some(stored) = state.status.get(id).await?
            && in_state.is_none_or(|s| stored.document.state == s)
            && wanted(&stored.document)
        {
            found.push(stored);
        }
    }
    Ok(found)
}

/// A search through the listing (every client's deliveries, newest first),
/// a page at a time from a position, for one call's matches.
struct Walk<'a> {
    state: &'a AppState,
    query: ListQuery,
    wanted: &'a (dyn Fn(&StatusDocument) -> bool + Sync),
    /// How many more this call may match.
    room: usize,
    /// How many more pages this call may read.
    pages: usize,
    /// The listing holds nothing after `query.after`.
    done: bool,
}

impl<'a> Walk<'a> {
    /// The documents in `in_state` accepted before `until`, after `after`,
    /// that are `wanted`: at most `room` of them.
    fn new(
        state: &'a AppState,
        in_state: Option<DeliveryState>,
        until: Option<OffsetDateTime>,
        after: Option<ListCursor>,
        wanted: &'a (dyn Fn(&StatusDocument) -> bool + Sync),
        room: usize,
    ) -> Self {
        Self {
            state,
            query: ListQuery {
                principal: None,
                owner: None,
                state: in_state,
                since: None,
                until,
                limit: PAGE,
                after,
            },
            wanted,
            room,
            pages: PAGES_PER_CALL,
            done: false,
        }
    }

    /// The matches of the next page, each read again now (the listing's
    /// copy may be behind) and still in the state and wanted; `None` once the call has
    /// matched its `room`, read its pages, or the listing is done.
    async fn next(&mut self) -> Result<Option<Vec<Versioned>>, ApiError> {
        if self.done || self.room == 0 || self.pages == 0 {
            return Ok(None);
        }
        self.pages -= 1;
        let page = self.state.status.list(&self.query).await?;
        let mut found = Vec::new();
        for document in page.items {
            if self.room == 0 {
                // The next call goes on after the last match.
                return Ok(Some(found));
            }
            if !(self.wanted)(&document) {
                continue;
            }
            // Still in the state asked for: one that moved on since (a
            // redrive the worker began) is left to what moved it.
            if let Some(stored) = self.state.status.get(&document.id).await?
                && self
                    .query
                    .state
                    .is_none_or(|state| stored.document.state == state)
                && (self.wanted)(&stored.document)
            {
                found.push(stored);
                self.room -= 1;
                self.query.after = Some(ListCursor::of(&document));
            }
        }
        match page.next {
            Some(next) => self.query.after = Some(next),
            None => self.done = true,
        }
        Ok(Some(found))
    }

    /// Where the next call goes on in the listing; `None` once it is done.
    fn resume(self) -> Option<ListCursor> {
        if self.done { None } else { self.query.after }
    }
}

/// Writes `document` on `etag`; one that moved meanwhile is left to what moved it.
async fn mark(
    state: &AppState,
    document: &StatusDocument,
    etag: skyport_core::ports::ETag,
) -> Result<(), ApiError> {
    match state
        .status
        .put(document, Precondition::IfMatch(etag))
        .await
    {
        Ok(_) | Err(StatusStoreError::PreconditionFailed) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

fn check_ids(ids: Option<&[String]>) -> Result<(), ApiError> {
    let Some(ids) = ids else {
        return Ok(());
    };
    if ids.len() > MAX_IDS {
        return Err(invalid(
            "ids",
            format!("must name at most {MAX_IDS} deliveries"),
        ));
    }
    match ids.iter().find(|id| !is_valid_id(id)) {
        Some(id) => Err(invalid("ids", format!("{id:?} is not a delivery id"))),
        None => Ok(()),
    }
}

fn invalid(field: &str, message: String) -> ApiError {
    ApiError::Validation(vec![skyport_core::request::FieldError::new(field, message)])
}

fn unavailable(source: Box<dyn std::error::Error + Send + Sync>) -> ApiError {
    ApiError::Unavailable {
        retry_after_s: 1,
        source: Some(source),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_reads_back_for_its_operation_and_anything_else_is_refused() {
        let positions = [
            Position::Listing(ListCursor {
                created_ms: 1_764_150_000_123,
                id: "d-2026.11.26_1".into(),
            }),
            Position::Listing(ListCursor {
                created_ms: -5,
                id: "d".into(),
            }),
            Position::DeadLetters(None),
            Position::DeadLetters(Some((u32::MAX, u64::MAX))),
        ];
        for position in &positions {
            let token = position.encode(Operation::Redrive);
            assert!(token.len() <= MAX_CURSOR_LEN);
            assert_eq!(
                Position::decode(Operation::Redrive, &token).expect("read back"),
                *position
            );
        }
        let listing = positions[0].encode(Operation::Resend);
        assert_eq!(
            Position::decode(Operation::Resend, &listing).expect("read back"),
            positions[0]
        );
        let forged = [
            String::new(),
            "not base64!".into(),
            URL_SAFE_NO_PAD.encode("r"),
            URL_SAFE_NO_PAD.encode("r.d.12"),
            URL_SAFE_NO_PAD.encode("r.d.x.d-1"),
            URL_SAFE_NO_PAD.encode("r.d.1.bad id"),
            URL_SAFE_NO_PAD.encode("r.l.1"),
            URL_SAFE_NO_PAD.encode("r.l.-1.2"),
            URL_SAFE_NO_PAD.encode("r.l.1.2.3"),
            URL_SAFE_NO_PAD.encode("r.x.1.d-1"),
            URL_SAFE_NO_PAD.encode([0xff, 0xfe]),
            "A".repeat(MAX_CURSOR_LEN + 1),
            // Another operation's.
            positions[0].encode(Operation::Resend),
        ];
        for token in &forged {
            assert!(
                Position::decode(Operation::Redrive, token).is_err(),
                "{token:?}"
            );
        }
        for position in &positions[2..] {
            let token = position.encode(Operation::Resend);
            assert!(
                Position::decode(Operation::Resend, &token).is_err(),
                "a resend has no dead letters: {position:?}"
            );
        }
    }
}
