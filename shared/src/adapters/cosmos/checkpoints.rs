//! The Event Hubs processor's checkpoint and ownership store on Cosmos DB.
//!
//! Layout, in the leases container (partition key `/partitionKey`):
//! - partition key `{namespace}/{event hub}/{consumer group}`, so listing one
//!   processor group is a single-partition query;
//! - `ownership-{partition id}`: `ownerId`, and `_etag`/`_ts` for claims and expiry;
//! - `checkpoint-{partition id}`: `offset` and `sequenceNumber`.
//!
//! A claim without an ETag creates the document (409: someone else was
//! first); a claim with one replaces it on that ETag (412: it changed). Either
//! way only that partition is lost: [`CheckpointStore::claim_ownership`]
//! returns the claims it won and never fails the whole claim for one conflict
//! (the processor stops on any error).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use azure_core::error::ErrorKind;
use azure_core::http::{Etag, StatusCode};
use azure_data_cosmos::options::{ItemWriteOptions, Precondition};
use azure_data_cosmos::{ContainerClient, FeedScope, Query};
use azure_messaging_eventhubs::CheckpointStore;
use azure_messaging_eventhubs::models::{Checkpoint, Ownership};
use futures_util::TryStreamExt;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use super::request_units::{Operation, RequestUnits};
use super::{charge, error_charge, retry_throttled};

const OWNERSHIP: &str = "ownership";
const CHECKPOINT: &str = "checkpoint";

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Lease {
    id: String,
    partition_key: String,
    kind: String,
    fully_qualified_namespace: String,
    event_hub_name: String,
    consumer_group: String,
    partition_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    owner_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    offset: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    sequence_number: Option<i64>,
    #[serde(rename = "_etag", default, skip_serializing)]
    etag: Option<String>,
    #[serde(rename = "_ts", default, skip_serializing)]
    modified: Option<i64>,
}

fn group_key(namespace: &str, event_hub: &str, consumer_group: &str) -> String {
    format!("{namespace}/{event_hub}/{consumer_group}")
}

impl Lease {
    fn ownership(ownership: &Ownership) -> Self {
        Self {
            id: format!("{OWNERSHIP}-{}", ownership.partition_id),
            partition_key: group_key(
                &ownership.fully_qualified_namespace,
                &ownership.event_hub_name,
                &ownership.consumer_group,
            ),
            kind: OWNERSHIP.into(),
            fully_qualified_namespace: ownership.fully_qualified_namespace.clone(),
            event_hub_name: ownership.event_hub_name.clone(),
            consumer_group: ownership.consumer_group.clone(),
            partition_id: ownership.partition_id.clone(),
            owner_id: ownership.owner_id.clone(),
            ..Self::default()
        }
    }

    fn checkpoint(checkpoint: &Checkpoint) -> Self {
        Self {
            id: format!("{CHECKPOINT}-{}", checkpoint.partition_id),
            partition_key: group_key(
                &checkpoint.fully_qualified_namespace,
                &checkpoint.event_hub_name,
                &checkpoint.consumer_group,
            ),
            kind: CHECKPOINT.into(),
            fully_qualified_namespace: checkpoint.fully_qualified_namespace.clone(),
            event_hub_name: checkpoint.event_hub_name.clone(),
            consumer_group: checkpoint.consumer_group.clone(),
            partition_id: checkpoint.partition_id.clone(),
            offset: checkpoint.offset.clone(),
            sequence_number: checkpoint.sequence_number,
            ..Self::default()
        }
    }

    fn into_ownership(self) -> Ownership {
        Ownership {
            fully_qualified_namespace: self.fully_qualified_namespace,
            event_hub_name: self.event_hub_name,
            consumer_group: self.consumer_group,
            partition_id: self.partition_id,
            owner_id: self.owner_id,
            etag: self.etag.map(Etag::from),
            last_modified_time: self
                .modified
                .and_then(|ts| OffsetDateTime::from_unix_timestamp(ts).ok()),
        }
    }

    fn into_checkpoint(self) -> Checkpoint {
        Checkpoint {
            fully_qualified_namespace: self.fully_qualified_namespace,
            event_hub_name: self.event_hub_name,
            consumer_group: self.consumer_group,
            partition_id: self.partition_id,
            offset: self.offset,
            sequence_number: self.sequence_number,
        }
    }
}

/// Checkpoints and ownership of Event Hubs partitions, in Cosmos DB.
#[derive(Clone)]
pub struct CosmosCheckpointStore {
    leases: ContainerClient,
    units: Arc<RequestUnits>,
    throttle_retry: Duration,
}

impl std::fmt::Debug for CosmosCheckpointStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CosmosCheckpointStore")
            .finish_non_exhaustive()
    }
}

impl CosmosCheckpointStore {
    pub(super) fn new(
        leases: ContainerClient,
        units: Arc<RequestUnits>,
        throttle_retry: Duration,
    ) -> Self {
        Self {
            leases,
            units,
            throttle_retry,
        }
    }

    /// Tries one claim; `None` when another processor got there first.
    async fn claim(&self, ownership: &Ownership) -> Option<Ownership> {
        let lease = Lease::ownership(ownership);
        let key = lease.partition_key.clone();
        let result = retry_throttled(&self.units, self.throttle_retry, || async {
            match &ownership.etag {
                None => {
                    self.leases
                        .create_item(key.clone(), &lease.id, &lease, None)
                        .await
                }
                Some(etag) => {
                    let options = ItemWriteOptions::default()
                        .with_precondition(Precondition::if_match(etag.clone()));
                    self.leases
                        .replace_item(key.clone(), &lease.id, &lease, Some(options))
                        .await
                }
            }
        })
        .await;
        match result {
            Ok(response) => {
                self.units
                    .record(Operation::Write, charge(response.headers()));
                let mut won = ownership.clone();
                won.etag = response.headers().etag().cloned();
                won.last_modified_time = Some(OffsetDateTime::now_utc());
                Some(won)
            }
            Err(e) => {
                self.units.record(Operation::Write, error_charge(&e));
                let lost = matches!(
                    e.status().status_code(),
                    StatusCode::Conflict | StatusCode::PreconditionFailed | StatusCode::NotFound
                );
                if !lost {
                    tracing::warn!(partition = %ownership.partition_id, error = %e, "A partition claim failed; it is tried again at the next balancing round.");
                }
                None
            }
        }
    }

    async fn list(&self, key: String, kind: &'static str) -> azure_core::Result<Vec<Lease>> {
        let query =
            Query::from("SELECT * FROM c WHERE c.kind = @kind").with_parameter("@kind", kind)?;
        retry_throttled(&self.units, self.throttle_retry, || async {
            let mut pages = self
                .leases
                .query_items::<Lease>(query.clone(), FeedScope::partition(key.clone()), None)
                .await?
                .into_pages();
            let mut leases = Vec::new();
            while let Some(page) = pages.try_next().await? {
                let charge = charge(page.headers());
                self.units.record(Operation::Query, charge);
                leases.extend(page.into_items());
            }
            Ok(leases)
        })
        .await
        .map_err(azure_core::Error::from)
    }
}

#[async_trait]
impl CheckpointStore for CosmosCheckpointStore {
    async fn claim_ownership(
        &self,
        ownerships: &[Ownership],
    ) -> azure_core::Result<Vec<Ownership>> {
        let mut won = Vec::with_capacity(ownerships.len());
        for ownership in ownerships {
            if ownership.partition_id.is_empty() {
                return Err(azure_core::Error::with_message(
                    ErrorKind::Other,
                    "a claim has no partition id",
                ));
            }
            if let Some(claimed) = self.claim(ownership).await {
                won.push(claimed);
            }
        }
        Ok(won)
    }

    async fn list_checkpoints(
        &self,
        namespace: &str,
        event_hub_name: &str,
        consumer_group: &str,
    ) -> azure_core::Result<Vec<Checkpoint>> {
        let leases = self
            .list(
                group_key(namespace, event_hub_name, consumer_group),
                CHECKPOINT,
            )
            .await?;
        Ok(leases.into_iter().map(Lease::into_checkpoint).collect())
    }

    async fn list_ownerships(
        &self,
        namespace: &str,
        event_hub_name: &str,
        consumer_group: &str,
    ) -> azure_core::Result<Vec<Ownership>> {
        let leases = self
            .list(
                group_key(namespace, event_hub_name, consumer_group),
                OWNERSHIP,
            )
            .await?;
        Ok(leases.into_iter().map(Lease::into_ownership).collect())
    }

    async fn update_checkpoint(&self, checkpoint: Checkpoint) -> azure_core::Result<()> {
        let lease = Lease::checkpoint(&checkpoint);
        let key = lease.partition_key.clone();
        let response = retry_throttled(&self.units, self.throttle_retry, || {
            self.leases
                .upsert_item(key.clone(), &lease.id, &lease, None)
        })
        .await?;
        self.units
            .record(Operation::Write, charge(response.headers()));
        Ok(())
    }
}
