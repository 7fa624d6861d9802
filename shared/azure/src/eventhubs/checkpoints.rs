//! The Event Hubs processor's ownership and checkpoint store, written once
//! over any [`LeaseStore`] (Cosmos DB, or the embedded store on one machine).
//!
//! One lease group per processor group (`{namespace}/{event hub}/{consumer
//! group}`, so listing it is one partition's read), two leases per partition:
//! `ownership-{partition id}` (`ownerId`) and `checkpoint-{partition id}`
//! (`offset`, `sequenceNumber`). A claim without an ETag creates the
//! ownership; one with an ETag replaces it only at that version. A claim that
//! loses is left out of the answer and never fails the whole claim (the
//! processor stops on any error).

use std::sync::Arc;

use async_trait::async_trait;
use azure_core::error::ErrorKind;
use azure_core::http::Etag;
use azure_messaging_eventhubs::CheckpointStore;
use azure_messaging_eventhubs::models::{Checkpoint, Ownership};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use skyport_core::ports::{
    ETag, Lease, LeaseCondition, LeaseError, LeaseFields, LeaseStore, LeaseVersion,
};

const OWNERSHIP: &str = "ownership";
const CHECKPOINT: &str = "checkpoint";

/// What the processor keeps its ownerships and checkpoints in.
pub(crate) type Checkpoints = Arc<dyn CheckpointStore + Send + Sync>;

/// What a lease of this store holds, as the documents of earlier versions
/// held it in Cosmos DB.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Fields {
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
}

impl Fields {
    fn into_map(self) -> LeaseFields {
        match serde_json::to_value(self) {
            Ok(Value::Object(map)) => map,
            _ => unreachable!("a struct of strings serializes to a JSON object"),
        }
    }

    fn from_lease(lease: Lease) -> azure_core::Result<(Self, LeaseVersion)> {
        let fields = serde_json::from_value(Value::Object(lease.fields))
            .map_err(|e| azure_core::Error::new(ErrorKind::DataConversion, e))?;
        Ok((fields, lease.version))
    }
}

fn group(namespace: &str, event_hub: &str, consumer_group: &str) -> String {
    format!("{namespace}/{event_hub}/{consumer_group}")
}

fn io(error: LeaseError) -> azure_core::Error {
    azure_core::Error::new(ErrorKind::Io, error)
}

/// [`CheckpointStore`] over a [`LeaseStore`].
#[derive(Debug, Clone)]
pub struct LeaseCheckpointStore {
    leases: Arc<dyn LeaseStore>,
}

impl LeaseCheckpointStore {
    pub fn new(leases: Arc<dyn LeaseStore>) -> Self {
        Self { leases }
    }

    /// Every lease of one kind in a processor group.
    async fn list(
        &self,
        namespace: &str,
        event_hub_name: &str,
        consumer_group: &str,
        kind: &str,
    ) -> azure_core::Result<Vec<(Fields, LeaseVersion)>> {
        self.leases
            .list(
                &group(namespace, event_hub_name, consumer_group),
                &format!("{kind}-"),
            )
            .await
            .map_err(io)?
            .into_iter()
            .map(Fields::from_lease)
            .collect()
    }

    /// Tries one claim; `None` when another processor got there first, or
    /// when the store failed (the claim is tried again at the next balancing).
    async fn claim(&self, claim: &Ownership) -> Option<Ownership> {
        let condition = match &claim.etag {
            None => LeaseCondition::Absent,
            Some(etag) => LeaseCondition::Matches(ETag(etag.to_string())),
        };
        let fields = Fields {
            kind: OWNERSHIP.into(),
            fully_qualified_namespace: claim.fully_qualified_namespace.clone(),
            event_hub_name: claim.event_hub_name.clone(),
            consumer_group: claim.consumer_group.clone(),
            partition_id: claim.partition_id.clone(),
            owner_id: claim.owner_id.clone(),
            ..Fields::default()
        };
        let written = self
            .leases
            .put(
                &group(
                    &claim.fully_qualified_namespace,
                    &claim.event_hub_name,
                    &claim.consumer_group,
                ),
                &format!("{OWNERSHIP}-{}", claim.partition_id),
                &fields.into_map(),
                condition,
            )
            .await;
        match written {
            Ok(version) => Some(Ownership {
                etag: Some(Etag::from(version.etag.0)),
                last_modified_time: Some(version.modified),
                ..claim.clone()
            }),
            Err(LeaseError::Conflict) => None,
            Err(e) => {
                tracing::warn!(partition = %claim.partition_id, error = %e, "A partition claim failed; it is tried again at the next balancing round.");
                None
            }
        }
    }
}

#[async_trait]
impl CheckpointStore for LeaseCheckpointStore {
    async fn claim_ownership(
        &self,
        ownerships: &[Ownership],
    ) -> azure_core::Result<Vec<Ownership>> {
        let mut won = Vec::with_capacity(ownerships.len());
        for claim in ownerships {
            if claim.partition_id.is_empty() {
                return Err(azure_core::Error::with_message(
                    ErrorKind::Other,
                    "a claim has no partition id",
                ));
            }
            if let Some(claimed) = self.claim(claim).await {
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
        let listed = self
            .list(namespace, event_hub_name, consumer_group, CHECKPOINT)
            .await?;
        Ok(listed
            .into_iter()
            .map(|(fields, _)| Checkpoint {
                fully_qualified_namespace: fields.fully_qualified_namespace,
                event_hub_name: fields.event_hub_name,
                consumer_group: fields.consumer_group,
                partition_id: fields.partition_id,
                offset: fields.offset,
                sequence_number: fields.sequence_number,
            })
            .collect())
    }

    async fn list_ownerships(
        &self,
        namespace: &str,
        event_hub_name: &str,
        consumer_group: &str,
    ) -> azure_core::Result<Vec<Ownership>> {
        let listed = self
            .list(namespace, event_hub_name, consumer_group, OWNERSHIP)
            .await?;
        Ok(listed
            .into_iter()
            .map(|(fields, version)| Ownership {
                fully_qualified_namespace: fields.fully_qualified_namespace,
                event_hub_name: fields.event_hub_name,
                consumer_group: fields.consumer_group,
                partition_id: fields.partition_id,
                owner_id: fields.owner_id.filter(|owner| !owner.is_empty()),
                etag: Some(Etag::from(version.etag.0)),
                last_modified_time: Some(version.modified),
            })
            .collect())
    }

    async fn update_checkpoint(&self, checkpoint: Checkpoint) -> azure_core::Result<()> {
        let name = format!("{CHECKPOINT}-{}", checkpoint.partition_id);
        let group = group(
            &checkpoint.fully_qualified_namespace,
            &checkpoint.event_hub_name,
            &checkpoint.consumer_group,
        );
        let fields = Fields {
            kind: CHECKPOINT.into(),
            fully_qualified_namespace: checkpoint.fully_qualified_namespace,
            event_hub_name: checkpoint.event_hub_name,
            consumer_group: checkpoint.consumer_group,
            partition_id: checkpoint.partition_id,
            offset: checkpoint.offset,
            sequence_number: checkpoint.sequence_number,
            ..Fields::default()
        };
        self.leases
            .put(&group, &name, &fields.into_map(), LeaseCondition::Any)
            .await
            .map_err(io)?;
        Ok(())
    }
}
