//! [`Timers`] on Cosmos DB: the timers container (partition key `/shard`,
//! TTL on), one item per Waiting delivery, `{id, shard, runsAtMs, revision,
//! lane, ttl}`, in the shard [`shard_of`](skyport_core::ports::shard_of) its id (`cosmos.timer_shards`
//! logical partitions; a worker reads each through a lease).
//!
//! The status document is the truth and the timer a hint. A status write
//! that leaves a document Waiting upserts its timer right after, in the
//! same bulk batch ([`super::timer_writes`]); a reschedule replaces it in place (the
//! same id, the same shard). Nothing removes a timer when its document
//! leaves Waiting otherwise: a fire removes it once the `DeliveryDue` is
//! durable in the stream (a delete conditional on its ETag, so a timer moved
//! meanwhile stays), and a stale one (a cancelled delivery's) fires at its
//! time and finds nothing to do. A timer lost between the two writes is
//! found from the documents: the status container indexes `runsAtMs`, and
//! [`Timers::overdue`] queries the Waiting ones whose time has passed.
//!
//! A due read is one single-partition query ordered by `runsAtMs` then `id`
//! (a composite index), charged by the timers it returns, so an idle shard
//! costs one small query per poll and a timer for 2030 costs nothing until
//! 2030. Each item's `ttl` is its wait plus `store.status_retention_s`: a
//! timer nobody fired still goes away.

use async_trait::async_trait;
use azure_core::http::Etag;
use azure_data_cosmos::ContainerClient;
use azure_data_cosmos::options::{ItemWriteOptions, Precondition, QueryOptions};
use azure_data_cosmos::{FeedScope, Query};
use futures_util::future::join_all;
use serde::Deserialize;
use skyport_core::ports::{Due, ETag, Lane, StatusStoreError, Timers};
use skyport_runtime::config::Work;
use time::OffsetDateTime;

use super::charge::Paged;
use super::request_units::Operation;
use super::status_writes::unix_ms;
use super::store::{CosmosStore, READ_PATIENCE};
use super::timer_writes::partition;

/// A timer (or a Waiting document) as a due read returns it.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Read {
    id: String,
    runs_at_ms: i64,
    #[serde(default)]
    revision: u32,
    #[serde(default)]
    lane: Lane,
    #[serde(rename = "_etag", default)]
    etag: Option<String>,
}

impl Read {
    fn due(self) -> Due {
        Due {
            runs_at: OffsetDateTime::from_unix_timestamp_nanos(
                i128::from(self.runs_at_ms) * 1_000_000,
            )
            .unwrap_or(OffsetDateTime::UNIX_EPOCH),
            delivery_id: self.id,
            revision: self.revision,
            lane: self.lane,
            version: self.etag.map(ETag),
        }
    }
}

fn unavailable(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> StatusStoreError {
    StatusStoreError::Unavailable(e.into())
}

impl CosmosStore {
    async fn query_due(
        &self,
        container: &ContainerClient,
        query: Query,
        scope: FeedScope,
    ) -> Result<Vec<Due>, StatusStoreError> {
        let read: Paged<Read> = self
            .requests
            .run(Work::Timers, Operation::Query, READ_PATIENCE, |options| {
                let options = QueryOptions::default().with_operation_options(options);
                let query = query.clone();
                let scope = scope.clone();
                async move {
                    let items = container
                        .query_items::<Read>(query, scope, Some(options))
                        .await?;
                    Paged::read_all(items).await
                }
            })
            .await
            .map_err(|e| unavailable(e.into_box()))?;
        Ok(read.items.into_iter().map(Read::due).collect())
    }
}

#[async_trait]
impl Timers for CosmosStore {
    fn shards(&self) -> u32 {
        self.timer_shards
    }

    async fn due(
        &self,
        shard: u32,
        after: Option<&Due>,
        up_to: OffsetDateTime,
        limit: usize,
    ) -> Result<Vec<Due>, StatusStoreError> {
        let (at, id) = after.map_or((i64::MIN, String::new()), |due| {
            (unix_ms(due.runs_at), due.delivery_id.clone())
        });
        let query = Query::from(format!(
            "SELECT TOP {limit} c.id, c.runsAtMs, c.revision, c.lane, c._etag FROM c \
             WHERE c.runsAtMs <= @upTo AND (c.runsAtMs > @at OR (c.runsAtMs = @at AND c.id > @id)) \
             ORDER BY c.runsAtMs, c.id"
        ))
        .with_parameter("@upTo", unix_ms(up_to))
        .and_then(|q| q.with_parameter("@at", at))
        .and_then(|q| q.with_parameter("@id", id))
        .map_err(unavailable)?;
        self.query_due(&self.timers, query, FeedScope::partition(partition(shard)))
            .await
    }

    async fn fired(&self, shard: u32, fired: &[Due]) -> Result<(), StatusStoreError> {
        let deletes = fired.iter().map(|due| async move {
            let result = self
                .requests
                .run(Work::Timers, Operation::Delete, u32::MAX, |options| {
                    let mut options = ItemWriteOptions::default().with_operation_options(options);
                    if let Some(ETag(etag)) = &due.version {
                        options = options
                            .with_precondition(Precondition::if_match(Etag::from(etag.clone())));
                    }
                    self.timers
                        .delete_item(partition(shard), &due.delivery_id, Some(options))
                })
                .await;
            match result {
                // Moved since (a reschedule), or gone already: kept, or nothing to do.
                Ok(_) => Ok(()),
                Err(e) if e.lost_race() => Ok(()),
                Err(e) => Err(unavailable(e.into_box())),
            }
        });
        join_all(deletes).await.into_iter().collect()
    }

    async fn overdue(
        &self,
        before: OffsetDateTime,
        limit: usize,
    ) -> Result<Vec<Due>, StatusStoreError> {
        let query = Query::from(format!(
            "SELECT TOP {limit} c.id, c.runsAtMs, c.revision, c.lane FROM c \
             WHERE c.state = 'Waiting' AND c.runsAtMs < @before"
        ))
        .with_parameter("@before", unix_ms(before))
        .map_err(unavailable)?;
        // No `_etag` read: these have no timer to remove.
        self.query_due(&self.status, query, FeedScope::full_container())
            .await
    }

    async fn waiting(&self, shard: u32) -> Result<u64, StatusStoreError> {
        let query = Query::from("SELECT VALUE COUNT(1) FROM c");
        let counted: Paged<u64> = self
            .requests
            .run(Work::Timers, Operation::Query, READ_PATIENCE, |options| {
                let options = QueryOptions::default().with_operation_options(options);
                let query = query.clone();
                async move {
                    let items = self
                        .timers
                        .query_items::<u64>(
                            query,
                            FeedScope::partition(partition(shard)),
                            Some(options),
                        )
                        .await?;
                    Paged::read_all(items).await
                }
            })
            .await
            .map_err(|e| unavailable(e.into_box()))?;
        Ok(counted.items.into_iter().sum())
    }
}

#[cfg(all(test, feature = "cosmos-emulator"))]
mod emulator_tests;
