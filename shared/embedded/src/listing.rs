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
        let lacks = |field: &[u8]| !previous.windows(field.len()).any(|window| window == field);
        (self.owner.is_some() && lacks(b"\"ownerId\":"))
            || (self.principal.is_some() && lacks(b"\"principal\":"))
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
        let Ok(document) = serde_json::from_slice::<StatusDocument>(body) else {
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
        let document: StatusDocument = match serde_json::from_slice(stored.value().1) {
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::time::Duration;

    use skyport_core::ports::{Precondition, StatusStore};
    use skyport_core::status::DeliveryState;
    use time::OffsetDateTime;

    use super::*;
    use crate::store::EmbeddedStore;
    use crate::tests::settings;

    fn document(n: usize, at: OffsetDateTime) -> StatusDocument {
        let states = [DeliveryState::Scheduled, DeliveryState::Failed];
        StatusDocument {
            state: states[n % 2],
            owner_id: Some(format!("owner-{}", n % 3)),
            principal: Some(format!("client-{}", n % 2)),
            ..StatusDocument::accepted(format!("d-{n:03}"), at)
        }
    }

    fn query() -> ListQuery {
        ListQuery {
            principal: None,
            owner: None,
            state: None,
            since: None,
            until: None,
            limit: 1_000,
            after: None,
        }
    }

    fn ids(page: &ListPage) -> Vec<&str> {
        page.items.iter().map(|d| d.id.as_str()).collect()
    }

    /// 30 documents accepted a second apart, the last newest.
    async fn thirty(store: &EmbeddedStore) -> OffsetDateTime {
        let start = OffsetDateTime::now_utc() - Duration::from_secs(60);
        for n in 0..30 {
            let at = start + Duration::from_secs(n as u64);
            StatusStore::put(store, &document(n, at), Precondition::IfNoneMatch)
                .await
                .unwrap();
        }
        start
    }

    #[tokio::test]
    async fn a_listing_is_newest_first_and_filtered_by_owner_principal_state_and_time() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(&settings(dir.path()), 1).unwrap();
        let start = thirty(&store).await;
        let all = StatusStore::list(&*store, &query()).await.unwrap();
        assert_eq!(all.items.len(), 30);
        assert_eq!(ids(&all)[..3], ["d-029", "d-028", "d-027"]);
        assert_eq!(all.next, None);

        let owner = ListQuery {
            owner: Some("owner-1".into()),
            ..query()
        };
        let page = StatusStore::list(&*store, &owner).await.unwrap();
        assert_eq!(page.items.len(), 10);
        assert!(
            page.items
                .iter()
                .all(|d| d.owner_id.as_deref() == Some("owner-1"))
        );

        let mine = ListQuery {
            principal: Some("client-0".into()),
            owner: Some("owner-0".into()),
            state: Some(DeliveryState::Scheduled),
            ..query()
        };
        let page = StatusStore::list(&*store, &mine).await.unwrap();
        // n even (client-0, Scheduled) and n % 3 == 0: 0, 6, 12, 18, 24.
        assert_eq!(ids(&page), ["d-024", "d-018", "d-012", "d-006", "d-000"]);

        let window = ListQuery {
            since: Some(start + Duration::from_secs(10)),
            until: Some(start + Duration::from_secs(13)),
            ..query()
        };
        let page = StatusStore::list(&*store, &window).await.unwrap();
        assert_eq!(ids(&page), ["d-012", "d-011", "d-010"]);
    }

    #[tokio::test]
    async fn pages_go_on_from_their_cursor_exactly_while_new_documents_arrive() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(&settings(dir.path()), 1).unwrap();
        thirty(&store).await;
        let mut seen = Vec::new();
        let mut after = None;
        let mut arrivals = 100;
        loop {
            let page = StatusStore::list(
                &*store,
                &ListQuery {
                    limit: 7,
                    after: after.clone(),
                    ..query()
                },
            )
            .await
            .unwrap();
            seen.extend(page.items.iter().map(|d| d.id.clone()));
            // A newer delivery arrives between two pages: it sorts before the cursor.
            StatusStore::put(
                &*store,
                &document(arrivals, OffsetDateTime::now_utc()),
                Precondition::IfNoneMatch,
            )
            .await
            .unwrap();
            arrivals += 1;
            match page.next {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        let expected: Vec<String> = (0..30).rev().map(|n| format!("d-{n:03}")).collect();
        assert_eq!(seen, expected);
    }

    #[tokio::test]
    async fn a_document_written_before_its_owner_was_known_is_listed_once_where_it_says_later() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(&settings(dir.path()), 1).unwrap();
        // A cancellation came first: it knows the principal, not the owner,
        // and its own time, not the accept time.
        let accepted_at = OffsetDateTime::now_utc() - Duration::from_secs(5);
        let bare = StatusDocument {
            principal: Some("client-1".into()),
            ..StatusDocument::accepted("d-1", OffsetDateTime::now_utc())
        };
        let etag = StatusStore::put(&*store, &bare, Precondition::IfNoneMatch)
            .await
            .unwrap();
        let described = StatusDocument {
            owner_id: Some("owner-9".into()),
            created_at: accepted_at,
            ..bare
        };
        StatusStore::put(&*store, &described, Precondition::IfMatch(etag))
            .await
            .unwrap();
        for scope in [
            ListQuery {
                owner: Some("owner-9".into()),
                ..query()
            },
            ListQuery {
                principal: Some("client-1".into()),
                ..query()
            },
            query(),
        ] {
            let page = StatusStore::list(&*store, &scope).await.unwrap();
            assert_eq!(ids(&page), ["d-1"], "{scope:?}");
        }
        let before = ListQuery {
            until: Some(accepted_at + Duration::from_secs(1)),
            ..query()
        };
        let page = StatusStore::list(&*store, &before).await.unwrap();
        assert_eq!(ids(&page), ["d-1"], "listed at its accept time");
    }
}
