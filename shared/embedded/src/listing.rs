//! Listing status documents newest first ([`StatusStore::list`]): an index
//! `listing` of (scope, accepted time, id) written in the transaction that
//! writes the document, under three scopes — every delivery, its owner's, and
//! its principal's — so that a page for one owner or one principal reads
//! only theirs.
//!
//! [`StatusStore::list`]: skyport_core::ports::StatusStore::list

use redb::ReadableDatabase;
use skyport_core::ports::{ListCursor, ListPage, ListQuery, StatusStoreError};
use skyport_core::status::StatusDocument;

use crate::codec;
use crate::tables::{LISTING, STATUS, Tables, unix_ms};

/// The most index entries one page reads past the ones it hands out, so
/// that a filter matching little cannot make one request read everything.
const SCAN_PAST: usize = 2_000;

/// The scope of every delivery.
const ALL: &str = "";

/// Where a document is listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Listed {
    owner: Option<String>,
    principal: Option<String>,
    created_ms: i64,
}

impl Listed {
    pub(crate) fn of(document: &StatusDocument) -> Self {
        Self {
            owner: document.owner_id.clone(),
            principal: document.principal.clone(),
            created_ms: unix_ms(document.created_at),
        }
    }

    /// Whether a document stored as `previous` must be listed again to be
    /// listed as this says: it was written before its owner or principal
    /// was known (a cancellation that arrived first).
    pub(crate) fn adds_to(&self, previous: &[u8]) -> bool {
        let (owner, principal) = codec::names(previous);
        (self.owner.is_some() && !owner) || (self.principal.is_some() && !principal)
    }

    fn scopes(&self) -> Vec<String> {
        let mut scopes = vec![ALL.to_owned()];
        scopes.extend(self.owner.as_deref().map(owner_scope));
        scopes.extend(self.principal.as_deref().map(principal_scope));
        scopes
    }
}

fn owner_scope(owner: &str) -> String {
    format!("o:{owner}")
}

fn principal_scope(principal: &str) -> String {
    format!("p:{principal}")
}

impl Tables<'_> {
    /// Lists document `id` where `listed` says (again, when it already is).
    pub(crate) fn list(&mut self, id: &str, listed: &Listed) -> Result<(), redb::Error> {
        for scope in listed.scopes() {
            self.listing
                .insert((scope.as_str(), listed.created_ms, id), ())?;
        }
        Ok(())
    }

    /// Takes document `id`, stored as `body`, out of the listing.
    pub(crate) fn unlist(&mut self, id: &str, body: &[u8]) -> Result<(), redb::Error> {
        let Ok(document) = codec::decode(body) else {
            return Ok(());
        };
        let listed = Listed::of(&document);
        for scope in listed.scopes() {
            self.listing
                .remove((scope.as_str(), listed.created_ms, id))?;
        }
        Ok(())
    }
}

pub(crate) type Page = Result<ListPage, StatusStoreError>;

pub(crate) fn read_page(db: &redb::Database, query: &ListQuery) -> Result<Page, redb::Error> {
    let scope = match (&query.principal, &query.owner) {
        (Some(principal), _) => principal_scope(principal),
        (None, Some(owner)) => owner_scope(owner),
        (None, None) => ALL.to_owned(),
    };
    let txn = db.begin_read()?;
    let (listing, status) = match (txn.open_table(LISTING), txn.open_table(STATUS)) {
        (Ok(listing), Ok(status)) => (listing, status),
        (Err(redb::TableError::TableDoesNotExist(_)), _)
        | (_, Err(redb::TableError::TableDoesNotExist(_))) => {
            return Ok(Ok(ListPage {
                items: Vec::new(),
                next: None,
            }));
        }
        (Err(e), _) | (_, Err(e)) => return Err(e.into()),
    };
    let lowest = query.since.map_or(i64::MIN, unix_ms);
    let mut upper_ms = query.until.map_or(i64::MAX, unix_ms);
    let mut upper_id = "";
    if let Some(after) = &query.after
        && (after.created_ms, after.id.as_str()) < (upper_ms, upper_id)
    {
        upper_ms = after.created_ms;
        upper_id = after.id.as_str();
    }
    let range =
        listing.range((scope.as_str(), lowest, "")..(scope.as_str(), upper_ms, upper_id))?;
    let mut items = Vec::new();
    let mut last = None;
    let mut read = 0;
    let mut entries = range.rev();
    let more = loop {
        if items.len() >= query.limit || read >= query.limit + SCAN_PAST {
            break entries.next().is_some();
        }
        let Some(entry) = entries.next() else {
            break false;
        };
        let (key, ()) = entry.map(|(key, value)| (key, value.value()))?;
        let (_, created_ms, id) = key.value();
        read += 1;
        last = Some(ListCursor {
            created_ms,
            id: id.to_owned(),
        });
        let Some(stored) = status.get(id)? else {
            continue;
        };
        let document = match codec::decode(stored.value().3) {
            Ok(document) => document,
            Err(e) => {
                return Ok(Err(StatusStoreError::Corrupt {
                    id: id.to_owned(),
                    source: Box::new(e),
                }));
            }
        };
        let wanted = query.state.is_none_or(|state| document.state == state)
            && query
                .owner
                .as_ref()
                .is_none_or(|owner| document.owner_id.as_ref() == Some(owner));
        if wanted {
            items.push(document);
        }
    };
    Ok(Ok(ListPage {
        items,
        next: if more { last } else { None },
    }))
}
