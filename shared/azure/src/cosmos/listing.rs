//! The listing view ([`StatusStore::list`] on Cosmos DB): the status
//! documents again, in the listing container (partition key `/scope`), one
//! item per scope a document has — its owner's, `o:{ownerId}`, and, when it
//! has one, its principal's, `p:{principal}` — so that a page of one owner's
//! or one principal's deliveries is a query of one logical partition, never
//! a fan-out over every delivery's own.
//!
//! An item is `{id, scope, createdMs, state, ownerId, principal, document,
//! ttl}`: `id` the delivery's, `createdMs` its `createdAt` in Unix
//! milliseconds (a number, so it sorts), `document` the whole status
//! document (a page needs no point reads), and `ttl` the one its status
//! document is stored with, so the two expire together.
//!
//! The view is kept by a change-feed processor of its own over the status
//! container, whose handler calls [`CosmosStore::update_listing`]: upserts,
//! so a change handed over twice is harmless. It follows the status
//! container by that processor's lag: a delivery is listed once its change
//! has been read. A document written before its owner is known (a
//! cancellation that arrived before the request; it carries
//! `cancelRequestedAt`) is listed under `o:` until it is; the change that
//! brings the owner takes it out of there.
//!
//! [`StatusStore::list`]: skyport_core::ports::StatusStore::list

use std::collections::HashMap;

use azure_core::http::StatusCode;
use azure_data_cosmos::options::{ItemWriteOptions, QueryOptions};
use azure_data_cosmos::{FeedScope, Query};
use futures_util::TryStreamExt;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use skyport_core::ports::{BoxError, Change, ListCursor, ListPage, ListQuery, StatusStoreError};
use skyport_core::status::{DeliveryState, StatusDocument};
use skyport_runtime::config::Work;
use time::OffsetDateTime;

use super::charge::{Charged, Paged, error_charge};
use super::request_units::Operation;
use super::status_writes::ttl_of;
use super::store::{CosmosStore, READ_PATIENCE};

/// Documents whose view items are written at once, per batch of changes.
const DOCUMENTS_IN_FLIGHT: usize = 8;

/// The start of every owner's scope; alone, the scope of a document whose
/// owner is not known yet (a request's `ownerId` is never blank).
const OWNERS: &str = "o:";

fn owner_scope(owner: &str) -> String {
    format!("{OWNERS}{owner}")
}

fn principal_scope(principal: &str) -> String {
    format!("p:{principal}")
}

/// `at` in Unix milliseconds, as the view sorts and a [`ListCursor`] counts.
fn unix_ms(at: OffsetDateTime) -> i64 {
    i64::try_from(at.unix_timestamp_nanos() / 1_000_000).unwrap_or(i64::MAX)
}

/// One item of the view.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct ViewItem<'a> {
    id: &'a str,
    scope: String,
    created_ms: i64,
    state: DeliveryState,
    #[serde(skip_serializing_if = "Option::is_none")]
    owner_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    principal: Option<&'a str>,
    document: &'a StatusDocument,
    #[serde(skip_serializing_if = "Option::is_none")]
    ttl: Option<u64>,
}

/// The view items of `document`, written at `now`, to expire with it
/// ([`ttl_of`]: `settled_ttl` seconds after it settles).
fn view_items(
    document: &StatusDocument,
    settled_ttl: u64,
    now: OffsetDateTime,
) -> Vec<ViewItem<'_>> {
    let mut scopes = vec![owner_scope(document.owner_id.as_deref().unwrap_or(""))];
    scopes.extend(document.principal.as_deref().map(principal_scope));
    scopes
        .into_iter()
        .map(|scope| ViewItem {
            id: &document.id,
            scope,
            created_ms: unix_ms(document.created_at),
            state: document.state,
            owner_id: document.owner_id.as_deref(),
            principal: document.principal.as_deref(),
            document,
            ttl: ttl_of(document, settled_ttl, now),
        })
        .collect()
}

/// A row of a listing query.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Row {
    id: String,
    created_ms: i64,
    document: Value,
}

/// What a delete was charged, found or not.
struct Deleted(f64);

impl Charged for Deleted {
    fn request_charge(&self) -> f64 {
        self.0
    }
}

impl CosmosStore {
    /// Brings the listing view up to `changes` (status documents, as the
    /// change feed of the status container hands them over): each document's
    /// items upserted, the last change of a delivery winning when a batch
    /// holds several. Every request is [`Work::ChangeFeed`] (the listing
    /// processor's work), accounted as [`Operation::ListingWrite`].
    ///
    /// # Errors
    /// [`StatusStoreError::Corrupt`] when a change is not a status document;
    /// [`StatusStoreError::Unavailable`] when the view cannot be written.
    /// Items written before the error stay written: handing the batch over
    /// again writes them again, to the same effect.
    pub async fn update_listing(&self, changes: &[Change]) -> Result<(), StatusStoreError> {
        let mut latest: HashMap<&str, &Change> = HashMap::with_capacity(changes.len());
        for change in changes {
            latest.insert(change.id.as_str(), change);
        }
        let documents = latest
            .into_values()
            .map(|change| {
                serde_json::from_value::<StatusDocument>(change.document.clone()).map_err(|e| {
                    StatusStoreError::Corrupt {
                        id: change.id.clone(),
                        source: Box::new(e),
                    }
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        futures_util::stream::iter(documents.iter().map(Ok))
            .try_for_each_concurrent(DOCUMENTS_IN_FLIGHT, |document| self.list_document(document))
            .await
    }

    async fn list_document(&self, document: &StatusDocument) -> Result<(), StatusStoreError> {
        for item in view_items(document, self.status_ttl, OffsetDateTime::now_utc()) {
            self.requests
                .run(
                    Work::ChangeFeed,
                    Operation::ListingWrite,
                    u32::MAX,
                    |options| async {
                        let options = ItemWriteOptions::default().with_operation_options(options);
                        self.listing
                            .upsert_item(item.scope.clone(), item.id, &item, Some(options))
                            .await
                    },
                )
                .await
                .map_err(|e| StatusStoreError::Unavailable(e.into_box()))?;
        }
        // Only a cancellation writes a document before its owner is known;
        // once it is, the item listed under no owner goes.
        if document.owner_id.is_some() && document.cancel_requested_at.is_some() {
            self.unlist_ownerless(&document.id).await?;
        }
        Ok(())
    }

    /// Deletes the item of delivery `id` listed under no owner, if any.
    async fn unlist_ownerless(&self, id: &str) -> Result<(), StatusStoreError> {
        let deleted = self
            .requests
            .run(
                Work::ChangeFeed,
                Operation::ListingWrite,
                u32::MAX,
                |options| async {
                    let options = ItemWriteOptions::default().with_operation_options(options);
                    match self.listing.delete_item(OWNERS, id, Some(options)).await {
                        Ok(response) => Ok(Deleted(response.request_charge())),
                        Err(e) if e.status().status_code() == StatusCode::NotFound => {
                            Ok(Deleted(error_charge(&e)))
                        }
                        Err(e) => Err(e),
                    }
                },
            )
            .await;
        deleted
            .map(drop)
            .map_err(|e| StatusStoreError::Unavailable(e.into_box()))
    }

    /// A page of the listing `query` asks for, newest first.
    ///
    /// With a principal or an owner it is a query of one logical partition
    /// (`p:{principal}`, else `o:{owner}`). With neither — every delivery, an
    /// administrator's listing — it is a cross-partition query over every
    /// owner's scope: it fans out to every physical partition of the
    /// listing container, which the scoped listings never do.
    ///
    /// The query asks for `TOP limit + 1`, ordered by `createdMs` then `id`,
    /// both descending: the extra row only says there is a next page.
    /// Requests are [`Work::StatusReads`] (a client waits on them: after
    /// two 429s it answers unavailable, as a status read does), accounted as
    /// [`Operation::Query`].
    ///
    /// # Errors
    /// [`StatusStoreError::Unavailable`] when the view cannot be read (or the
    /// throughput control refused the query); [`StatusStoreError::Corrupt`]
    /// when an item does not hold a status document.
    pub(super) async fn list_documents(
        &self,
        query: &ListQuery,
    ) -> Result<ListPage, StatusStoreError> {
        let (sql, scope) = listing_query(query).map_err(StatusStoreError::Unavailable)?;
        let rows: Paged<Row> = self
            .requests
            .run(
                Work::StatusReads,
                Operation::Query,
                READ_PATIENCE,
                |options| async {
                    let options = QueryOptions::default().with_operation_options(options);
                    let rows = self
                        .listing
                        .query_items::<Row>(sql.clone(), scope.clone(), Some(options))
                        .await?;
                    Paged::read_all(rows).await
                },
            )
            .await
            .map_err(|e| StatusStoreError::Unavailable(e.into_box()))?;
        let more = rows.items.len() > query.limit;
        let mut items = Vec::with_capacity(query.limit.min(rows.items.len()));
        let mut next = None;
        for row in rows.items.into_iter().take(query.limit) {
            let document =
                serde_json::from_value(row.document).map_err(|e| StatusStoreError::Corrupt {
                    id: row.id.clone(),
                    source: Box::new(e),
                })?;
            items.push(document);
            next = Some(ListCursor {
                created_ms: row.created_ms,
                id: row.id,
            });
        }
        Ok(ListPage {
            items,
            next: if more { next } else { None },
        })
    }
}

/// The query of a listing and where it runs.
fn listing_query(query: &ListQuery) -> Result<(Query, FeedScope), BoxError> {
    let mut conditions = Vec::new();
    let mut parameters: Vec<(&str, Value)> = Vec::new();
    let scope = match (&query.principal, &query.owner) {
        (Some(principal), _) => Some(principal_scope(principal)),
        (None, Some(owner)) => Some(owner_scope(owner)),
        (None, None) => None,
    };
    match &scope {
        Some(scope) => {
            conditions.push("c.scope = @scope");
            parameters.push(("@scope", Value::from(scope.as_str())));
        }
        None => {
            conditions.push("STARTSWITH(c.scope, @owners)");
            parameters.push(("@owners", Value::from(OWNERS)));
        }
    }
    if let Some(owner) = &query.owner {
        conditions.push("c.ownerId = @owner");
        parameters.push(("@owner", Value::from(owner.as_str())));
    }
    if let Some(state) = query.state {
        conditions.push("c.state = @state");
        parameters.push(("@state", serde_json::to_value(state)?));
    }
    if let Some(since) = query.since {
        conditions.push("c.createdMs >= @since");
        parameters.push(("@since", Value::from(unix_ms(since))));
    }
    if let Some(until) = query.until {
        conditions.push("c.createdMs < @until");
        parameters.push(("@until", Value::from(unix_ms(until))));
    }
    if let Some(after) = &query.after {
        conditions.push("(c.createdMs < @afterMs OR (c.createdMs = @afterMs AND c.id < @afterId))");
        parameters.push(("@afterMs", Value::from(after.created_ms)));
        parameters.push(("@afterId", Value::from(after.id.as_str())));
    }
    let top = query.limit.saturating_add(1);
    let mut sql = Query::from(format!(
        "SELECT TOP {top} c.id, c.createdMs, c.document FROM c WHERE {} \
         ORDER BY c.createdMs DESC, c.id DESC",
        conditions.join(" AND ")
    ));
    for (name, value) in parameters {
        sql = sql.with_parameter(name, value)?;
    }
    let feed = match scope {
        Some(scope) => FeedScope::partition(scope),
        None => FeedScope::full_container(),
    };
    Ok((sql, feed))
}

#[cfg(all(test, feature = "cosmos-emulator"))]
mod emulator_tests;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use skyport_core::status::{DeliveryState, StatusDocument};
    use time::macros::datetime;

    use super::*;

    #[test]
    fn a_document_is_listed_under_its_owner_and_its_principal_with_its_ttl() {
        let mut document = StatusDocument::accepted("d-1", datetime!(2030-01-01 00:00:01.5 UTC));
        document.owner_id = Some("owner-1".into());
        document.principal = Some("portal".into());
        document.state = DeliveryState::Failed;
        let items: Vec<Value> = view_items(&document, 60, OffsetDateTime::UNIX_EPOCH)
            .iter()
            .map(|item| serde_json::to_value(item).unwrap())
            .collect();
        assert_eq!(items.len(), 2);
        assert_eq!(items[0]["scope"], "o:owner-1");
        assert_eq!(items[1]["scope"], "p:portal");
        for item in &items {
            assert_eq!(item["id"], "d-1");
            assert_eq!(item["createdMs"], 1_893_456_001_500_i64);
            assert_eq!(item["state"], "Failed");
            assert_eq!(item["ownerId"], "owner-1");
            assert_eq!(item["principal"], "portal");
            assert_eq!(item["ttl"], 60);
            let listed: StatusDocument = serde_json::from_value(item["document"].clone()).unwrap();
            assert_eq!(listed, document);
        }
    }

    #[test]
    fn a_document_whose_owner_is_not_known_is_listed_under_no_owner() {
        let document = StatusDocument::accepted("d-1", datetime!(2030-01-01 00:00 UTC));
        let items = view_items(&document, 60, OffsetDateTime::UNIX_EPOCH);
        assert_eq!(items.len(), 1);
        let item = serde_json::to_value(&items[0]).unwrap();
        assert_eq!(item["scope"], OWNERS);
        for absent in ["ownerId", "principal", "ttl"] {
            assert!(item.get(absent).is_none(), "{absent} in {item}");
        }
    }
}
