//! The Event Hubs processor's ownership and checkpoint store, in the embedded
//! store: what a single machine running against Event Hubs keeps its
//! partitions' progress in.
//!
//! Keys are the SDK's blob names (`{namespace}/{hub}/{group}/ownership/{id}`
//! and `…/checkpoint/{id}`), so one prefix scan lists a processor group. The
//! value's version is the ETag: a claim without one creates the lease, a claim
//! with one replaces it only at that version, and a claim that loses is left
//! out of the answer (never an error for the whole claim). The last-modified
//! time, which expiry is judged by, is the commit's clock.

use std::sync::Arc;

use async_trait::async_trait;
use azure_core::error::ErrorKind;
use azure_core::http::Etag;
use azure_messaging_eventhubs::CheckpointStore;
use azure_messaging_eventhubs::models::{Checkpoint, Ownership};
use redb::ReadableDatabase;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use super::committer::{Applied, Expected, OpKind};
use super::{EmbeddedStore, LEASES, blocking};

/// [`CheckpointStore`] on an [`EmbeddedStore`].
#[derive(Debug, Clone)]
pub struct EmbeddedCheckpointStore {
    store: Arc<EmbeddedStore>,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Progress {
    offset: Option<String>,
    sequence_number: Option<i64>,
}

struct Lease {
    name: String,
    version: u64,
    modified_ms: i64,
    body: Vec<u8>,
}

impl EmbeddedCheckpointStore {
    pub(super) fn new(store: Arc<EmbeddedStore>) -> Self {
        Self { store }
    }

    async fn put(
        &self,
        key: String,
        expected: Expected,
        body: Vec<u8>,
    ) -> azure_core::Result<Option<u64>> {
        match self
            .store
            .submit(OpKind::PutLease {
                key,
                expected,
                body,
            })
            .await
        {
            Ok(Applied::Written(version)) => Ok(Some(version)),
            Ok(Applied::PreconditionFailed) => Ok(None),
            Ok(other) => unreachable!("a lease write is answered with its version, not {other:?}"),
            Err(e) => Err(azure_core::Error::new(ErrorKind::Io, e)),
        }
    }

    /// Every lease whose name starts with `prefix`.
    async fn list(&self, prefix: String) -> azure_core::Result<Vec<Lease>> {
        let db = Arc::clone(&self.store.db);
        blocking(move || {
            let txn = db.begin_read()?;
            let table = txn.open_table(LEASES)?;
            let mut leases = Vec::new();
            for entry in table.range(prefix.as_str()..)? {
                let (key, value) = entry?;
                let name = key.value();
                if !name.starts_with(&prefix) {
                    break;
                }
                let (version, modified_ms, body) = value.value();
                leases.push(Lease {
                    name: name[prefix.len()..].to_owned(),
                    version,
                    modified_ms,
                    body: body.to_vec(),
                });
            }
            Ok(leases)
        })
        .await
        .map_err(|e| azure_core::Error::new(ErrorKind::Io, e))
    }
}

#[async_trait]
impl CheckpointStore for EmbeddedCheckpointStore {
    async fn claim_ownership(
        &self,
        ownerships: &[Ownership],
    ) -> azure_core::Result<Vec<Ownership>> {
        let mut won = Vec::with_capacity(ownerships.len());
        for claim in ownerships {
            let key = Ownership::get_ownership_name(
                &claim.fully_qualified_namespace,
                &claim.event_hub_name,
                &claim.consumer_group,
                &claim.partition_id,
            )?;
            let expected = match &claim.etag {
                None => Expected::Absent,
                // A tag this store never issued cannot match.
                Some(etag) => match etag.to_string().parse() {
                    Ok(version) => Expected::Version(version),
                    Err(_) => continue,
                },
            };
            let body = claim.owner_id.clone().unwrap_or_default().into_bytes();
            if let Some(version) = self.put(key, expected, body).await? {
                won.push(Ownership {
                    etag: Some(Etag::from(version.to_string())),
                    last_modified_time: Some(OffsetDateTime::now_utc()),
                    ..claim.clone()
                });
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
        let prefix =
            Checkpoint::get_checkpoint_blob_prefix_name(namespace, event_hub_name, consumer_group)?;
        let mut checkpoints = Vec::new();
        for lease in self.list(prefix).await? {
            let progress: Progress = serde_json::from_slice(&lease.body)
                .map_err(|e| azure_core::Error::new(ErrorKind::DataConversion, e))?;
            checkpoints.push(Checkpoint {
                fully_qualified_namespace: namespace.to_owned(),
                event_hub_name: event_hub_name.to_owned(),
                consumer_group: consumer_group.to_owned(),
                partition_id: lease.name,
                offset: progress.offset,
                sequence_number: progress.sequence_number,
            });
        }
        Ok(checkpoints)
    }

    async fn list_ownerships(
        &self,
        namespace: &str,
        event_hub_name: &str,
        consumer_group: &str,
    ) -> azure_core::Result<Vec<Ownership>> {
        let prefix =
            Ownership::get_ownership_prefix_name(namespace, event_hub_name, consumer_group)?;
        Ok(self
            .list(prefix)
            .await?
            .into_iter()
            .map(|lease| Ownership {
                fully_qualified_namespace: namespace.to_owned(),
                event_hub_name: event_hub_name.to_owned(),
                consumer_group: consumer_group.to_owned(),
                owner_id: String::from_utf8(lease.body).ok().filter(|o| !o.is_empty()),
                etag: Some(Etag::from(lease.version.to_string())),
                last_modified_time: OffsetDateTime::from_unix_timestamp_nanos(
                    i128::from(lease.modified_ms) * 1_000_000,
                )
                .ok(),
                partition_id: lease.name,
            })
            .collect())
    }

    async fn update_checkpoint(&self, checkpoint: Checkpoint) -> azure_core::Result<()> {
        let key = Checkpoint::get_checkpoint_blob_name(
            &checkpoint.fully_qualified_namespace,
            &checkpoint.event_hub_name,
            &checkpoint.consumer_group,
            &checkpoint.partition_id,
        )?;
        let body = serde_json::to_vec(&Progress {
            offset: checkpoint.offset,
            sequence_number: checkpoint.sequence_number,
        })
        .unwrap_or_else(|e| unreachable!("progress always serializes: {e}"));
        self.put(key, Expected::Any, body).await?;
        Ok(())
    }
}
