//! Listing ([`StatusStore::list`] on Cosmos DB): a query on the status
//! container, newest first.
//!
//! Every status document is stored with `createdMs`, its `createdAt` in Unix
//! milliseconds (a number, so that it sorts; [`unix_ms`]), and the
//! container is indexed for the listing's filters and its order
//! ([`status_indexing`]): `ownerId`, `principal`, `state` and `createdMs`,
//! with composite indexes on (`createdMs`, `id`) alone and after `ownerId`
//! or `principal`. Nothing else of a document is indexed.
//!
//! The status container's partitions are deliveries (`/id`), so a page is a
//! cross-partition query: it fans out to every physical partition, each
//! answering from its index, merged by the SDK in order. A delivery costs
//! nothing to list, and is listed as soon as its status is written; a page
//! costs a query on each physical partition (see docs/capacity.md). The
//! SDK's guard on fan-out (100 physical partitions by default) is lifted for
//! this query, which fans out by design.
//!
//! A document written before this layout has no `createdMs` and is not
//! listed until [`CosmosStore::backfill_created_ms`] has given it one.
//!
//! [`StatusStore::list`]: skyport_core::ports::StatusStore::list
//! [`status_indexing`]: super::provision::status_indexing

use std::collections::HashSet;

use azure_core::http::Etag;
use azure_data_cosmos::options::{
    ItemWriteOptions, Precondition as CosmosPrecondition, QueryOptions,
};
use azure_data_cosmos::{FeedScope, Query};
use serde_json::Value;
use skyport_core::ports::{BoxError, ListCursor, ListPage, ListQuery, StatusStoreError};
use skyport_core::status::StatusDocument;
use skyport_runtime::config::Work;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::charge::Paged;
use super::request_units::Operation;
use super::status_writes::unix_ms;
use super::store::{CosmosStore, READ_PATIENCE};

/// Documents a backfill reads at a time.
const BACKFILL_PAGE: usize = 100;

fn unavailable(e: impl Into<BoxError>) -> StatusStoreError {
    StatusStoreError::Unavailable(e.into())
}

impl CosmosStore {
    /// A page of the listing `query` asks for, newest first: one
    /// cross-partition query of the status container.
    ///
    /// The query asks for `TOP limit + 1`, ordered by `createdMs` then `id`,
    /// both descending: the extra row only says there is a next page.
    /// Requests are [`Work::StatusReads`] (a client waits on them: after
    /// two 429s it answers unavailable, as a status read does), accounted as
    /// [`Operation::Query`].
    ///
    /// # Errors
    /// [`StatusStoreError::Unavailable`] when the container cannot be read
    /// (or the throughput control refused the query);
    /// [`StatusStoreError::Corrupt`] when a row is not a status document.
    pub(super) async fn list_documents(
        &self,
        query: &ListQuery,
    ) -> Result<ListPage, StatusStoreError> {
        let sql = listing_query(query).map_err(StatusStoreError::Unavailable)?;
        let rows = self
            .query_status(&sql, Work::StatusReads, READ_PATIENCE)
            .await?;
        let more = rows.items.len() > query.limit;
        let mut items = Vec::with_capacity(query.limit.min(rows.items.len()));
        let mut next = None;
        for row in rows.items.into_iter().take(query.limit) {
            let created = row.get("createdMs").and_then(Value::as_i64);
            let id = row.get("id").and_then(Value::as_str).map(str::to_owned);
            let document: StatusDocument =
                serde_json::from_value(row).map_err(|e| StatusStoreError::Corrupt {
                    id: id.unwrap_or_default(),
                    source: Box::new(e),
                })?;
            next = Some(ListCursor {
                created_ms: created.unwrap_or_else(|| unix_ms(document.created_at)),
                id: document.id.clone(),
            });
            items.push(document);
        }
        Ok(ListPage {
            items,
            next: if more { next } else { None },
        })
    }

    /// Gives every status document stored without `createdMs` (written
    /// before listing read the status container) its `createdMs`, so that it
    /// is listed; its `ttl` keeps counting from its last write. Each is
    /// replaced on its ETag: one written meanwhile already has its own.
    /// Returns how many it gave one. Idempotent, and cheap once done: one
    /// query that finds nothing.
    ///
    /// # Errors
    /// [`StatusStoreError::Unavailable`] when the container cannot be read
    /// or written; a document without a readable `createdAt` is skipped
    /// and logged.
    pub async fn backfill_created_ms(&self) -> Result<usize, StatusStoreError> {
        let sql = Query::from(format!(
            "SELECT TOP {BACKFILL_PAGE} * FROM c WHERE NOT IS_DEFINED(c.createdMs)"
        ));
        let mut seen = HashSet::new();
        let mut given = 0;
        loop {
            let rows = self
                .query_status(&sql, Work::StatusWrites, u32::MAX)
                .await?;
            let fresh: Vec<Value> = rows
                .items
                .into_iter()
                .filter(|row| {
                    row.get("id")
                        .and_then(Value::as_str)
                        .is_some_and(|id| seen.insert(id.to_owned()))
                })
                .collect();
            if fresh.is_empty() {
                return Ok(given);
            }
            for row in fresh {
                if self.give_created_ms(row).await? {
                    given += 1;
                }
            }
        }
    }

    /// Every row `sql` finds in the status container, as `work` waiting out
    /// `patience` 429s, accounted as [`Operation::Query`]. A query across
    /// every physical partition by design: the SDK's guard on fan-out is
    /// lifted.
    async fn query_status(
        &self,
        sql: &Query,
        work: Work,
        patience: u32,
    ) -> Result<Paged<Value>, StatusStoreError> {
        self.requests
            .run(work, Operation::Query, patience, |options| async {
                let mut options = QueryOptions::default().with_operation_options(options);
                options.feed = options.feed.with_max_fan_out(u32::MAX);
                let rows = self
                    .status
                    .query_items::<Value>(sql.clone(), FeedScope::full_container(), Some(options))
                    .await?;
                Paged::read_all(rows).await
            })
            .await
            .map_err(|e| unavailable(e.into_box()))
    }

    /// Writes `stored` back with its `createdMs`, on its ETag; `false` when
    /// it changed or went meanwhile, or has no readable `createdAt`.
    async fn give_created_ms(&self, stored: Value) -> Result<bool, StatusStoreError> {
        let Some(backfill) = Backfill::of(stored, OffsetDateTime::now_utc()) else {
            return Ok(false);
        };
        let written = self
            .requests
            .run(
                Work::StatusWrites,
                Operation::Write,
                u32::MAX,
                |options| async {
                    let options = ItemWriteOptions::default()
                        .with_operation_options(options)
                        .with_precondition(CosmosPrecondition::if_match(Etag::from(
                            backfill.etag.clone(),
                        )));
                    self.status
                        .replace_item(
                            backfill.id.clone(),
                            &backfill.id,
                            &backfill.item,
                            Some(options),
                        )
                        .await
                },
            )
            .await;
        match written {
            Ok(_) => Ok(true),
            Err(e) if e.lost_race() => Ok(false),
            Err(e) => Err(unavailable(e.into_box())),
        }
    }
}

/// A stored status document made ready to be written back with its
/// `createdMs`: without the system fields, its `ttl` (if any) less the time
/// since its last write, so that it expires when it would have.
#[derive(Debug)]
struct Backfill {
    id: String,
    etag: String,
    item: Value,
}

impl Backfill {
    fn of(mut stored: Value, now: OffsetDateTime) -> Option<Self> {
        let fields = stored.as_object_mut()?;
        let id = fields.get("id")?.as_str()?.to_owned();
        let etag = fields.get("_etag")?.as_str()?.to_owned();
        let Some(created) = fields
            .get("createdAt")
            .and_then(Value::as_str)
            .and_then(|at| OffsetDateTime::parse(at, &Rfc3339).ok())
        else {
            tracing::warn!(%id, "A status document has no readable createdAt: it stays unlisted.");
            return None;
        };
        let written = fields.get("_ts").and_then(Value::as_i64).unwrap_or(0);
        if let Some(ttl) = fields.get("ttl").and_then(Value::as_i64) {
            let since = now.unix_timestamp().saturating_sub(written).max(0);
            fields.insert("ttl".into(), Value::from(ttl.saturating_sub(since).max(1)));
        }
        fields.retain(|key, _| !key.starts_with('_'));
        fields.insert("createdMs".into(), Value::from(unix_ms(created)));
        Some(Self {
            id,
            etag,
            item: stored,
        })
    }
}

/// The query of a listing: its filters on the status container's indexed
/// fields, and its order.
fn listing_query(query: &ListQuery) -> Result<Query, BoxError> {
    let mut conditions = vec!["IS_DEFINED(c.createdMs)"];
    let mut parameters: Vec<(&str, Value)> = Vec::new();
    if let Some(principal) = &query.principal {
        conditions.push("c.principal = @principal");
        parameters.push(("@principal", Value::from(principal.as_str())));
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
        "SELECT TOP {top} * FROM c WHERE {} ORDER BY c.createdMs DESC, c.id DESC",
        conditions.join(" AND ")
    ));
    for (name, value) in parameters {
        sql = sql.with_parameter(name, value)?;
    }
    Ok(sql)
}

#[cfg(all(test, feature = "cosmos-emulator"))]
mod emulator_tests;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde_json::json;
    use time::macros::datetime;

    use super::*;

    #[test]
    fn a_backfilled_document_keeps_its_fields_and_the_ttl_it_had_left() {
        let stored = json!({
            "id": "d-1",
            "state": "Scheduled",
            "createdAt": "2030-01-01T00:00:01.5Z",
            "ttl": 600,
            "_etag": "\"e-1\"",
            "_ts": 1_893_456_000,
            "_rid": "r",
        });
        let backfill = Backfill::of(stored, datetime!(2030-01-01 00:01:40 UTC)).unwrap();
        assert_eq!(backfill.id, "d-1");
        assert_eq!(backfill.etag, "\"e-1\"");
        assert_eq!(
            backfill.item,
            json!({
                "id": "d-1",
                "state": "Scheduled",
                "createdAt": "2030-01-01T00:00:01.5Z",
                "createdMs": 1_893_456_001_500_i64,
                "ttl": 500,
            })
        );
    }

    #[test]
    fn a_backfill_never_shortens_a_ttl_below_a_second_nor_gives_one() {
        let stored = |ttl: Option<i64>| {
            let mut stored = json!({
                "id": "d-1", "createdAt": "2030-01-01T00:00:00Z", "_etag": "e", "_ts": 0,
            });
            if let Some(ttl) = ttl {
                stored["ttl"] = json!(ttl);
            }
            stored
        };
        let now = datetime!(2030-01-01 00:00 UTC);
        assert_eq!(Backfill::of(stored(Some(60)), now).unwrap().item["ttl"], 1);
        assert!(
            Backfill::of(stored(None), now)
                .unwrap()
                .item
                .get("ttl")
                .is_none()
        );
    }

    #[test]
    fn a_document_without_a_readable_creation_time_is_left_as_it_is() {
        let stored = json!({"id": "d-1", "createdAt": "yesterday", "_etag": "e", "_ts": 0});
        assert!(Backfill::of(stored, OffsetDateTime::UNIX_EPOCH).is_none());
    }
}
