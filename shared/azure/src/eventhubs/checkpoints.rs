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
//!
//! The SDK balances each hub's partitions on its own, so over several hubs
//! one instance can end up with the extra partition of every hub (8
//! partitions in 2 hubs over 3 instances: 4, 2, 2). Built
//! [`LeaseCheckpointStore::across_hubs`], the store keeps each instance
//! within its share of all the hubs' partitions (their number over the live
//! owners', rounded up): it leaves out a new claim past the share, and hands
//! back (owner cleared) a partition whose renewal would keep the instance
//! past it, which another instance then claims at its next balancing.
//!
//! The SDK also steals within a hub to even that hub alone (an instance with
//! none of a hub's partitions takes one from an instance with two), which
//! moves a partition, and replays its in-flight events, without evening the
//! load at all when the victim holds no more partitions overall. So a steal
//! goes ahead only when the victim holds at least two more partitions of all
//! the hubs than the thief. The instance's hubs decide one at a time, each
//! on what the one before it left, so that two hubs renewing together never
//! both hand a partition back for the same excess.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

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
    /// The hubs whose partitions are shared out together, and how long a
    /// claim lasts unrenewed (`eventhubs.partition_expiration_ms`).
    across: Option<(Vec<String>, Duration)>,
    /// Held while one hub's processor decides and writes its claims.
    balancing: Arc<tokio::sync::Mutex<()>>,
}

impl LeaseCheckpointStore {
    /// A store that leaves balancing to the SDK, hub by hub.
    pub fn new(leases: Arc<dyn LeaseStore>) -> Self {
        Self {
            leases,
            across: None,
            balancing: Arc::default(),
        }
    }

    /// A store that keeps each instance within its share of the partitions
    /// of all of `hubs`, claims lasting `expiry` unrenewed.
    pub fn across_hubs(leases: Arc<dyn LeaseStore>, hubs: Vec<String>, expiry: Duration) -> Self {
        Self {
            leases,
            across: Some((hubs, expiry)),
            balancing: Arc::default(),
        }
    }

    /// `claims` (one instance's, for one hub) cut to the instance's share of
    /// every hub's partitions; the renewals cut are handed back. When the
    /// ownerships cannot be listed, the claims go ahead as the SDK made them.
    async fn within_share(
        &self,
        hubs: &[String],
        expiry: Duration,
        claims: &[Ownership],
    ) -> Vec<Ownership> {
        let Some(first) = claims.first() else {
            return Vec::new();
        };
        let Some(me) = first.owner_id.clone().filter(|o| !o.is_empty()) else {
            return claims.to_vec();
        };
        let mut records = Vec::new();
        for hub in hubs {
            match self
                .list(
                    &first.fully_qualified_namespace,
                    hub,
                    &first.consumer_group,
                    OWNERSHIP,
                )
                .await
            {
                Ok(listed) => records.extend(listed),
                Err(_) => return claims.to_vec(),
            }
        }
        let now = time::OffsetDateTime::now_utc();
        let live = |fields: &Fields, version: &LeaseVersion| {
            fields.owner_id.as_ref().is_some_and(|o| !o.is_empty())
                && version.modified + expiry > now
        };
        let mut held_by: BTreeMap<&str, usize> = BTreeMap::new();
        for (fields, _) in records.iter().filter(|(f, v)| live(f, v)) {
            if let Some(owner) = fields.owner_id.as_deref() {
                *held_by.entry(owner).or_default() += 1;
            }
        }
        let owners = held_by.len() + usize::from(!held_by.contains_key(me.as_str()));
        let unrecorded = claims
            .iter()
            .filter(|c| {
                !records.iter().any(|(f, _)| {
                    f.event_hub_name == c.event_hub_name && f.partition_id == c.partition_id
                })
            })
            .count();
        let share = (records.len() + unrecorded).div_ceil(owners);
        // The live owner of `claim`'s partition, if any.
        let owner_of = |claim: &Ownership| {
            records
                .iter()
                .find(|(f, v)| {
                    live(f, v)
                        && f.event_hub_name == claim.event_hub_name
                        && f.partition_id == claim.partition_id
                })
                .and_then(|(f, _)| f.owner_id.as_deref())
        };
        // What this instance holds and does not claim again here: its
        // partitions of the other hubs, and any of this hub left out of the
        // claims (held until they expire).
        let held_apart = records
            .iter()
            .filter(|(f, v)| {
                live(f, v)
                    && f.owner_id.as_deref() == Some(me.as_str())
                    && !claims.iter().any(|c| {
                        c.event_hub_name == f.event_hub_name && c.partition_id == f.partition_id
                    })
            })
            .count();
        let (renewals, new): (Vec<&Ownership>, Vec<&Ownership>) = claims
            .iter()
            .partition(|c| owner_of(c) == Some(me.as_str()));
        let mut kept = Vec::with_capacity(claims.len());
        for claim in renewals {
            if held_apart + kept.len() >= share {
                tracing::info!(hub = %claim.event_hub_name, partition = %claim.partition_id, share, "Handing a partition back: this instance holds more than its share of all the hubs' partitions.");
                self.claim(&Ownership {
                    owner_id: Some(String::new()),
                    ..claim.clone()
                })
                .await;
                continue;
            }
            kept.push(claim.clone());
        }
        for claim in new {
            let mine = held_apart + kept.len();
            if mine >= share {
                break;
            }
            if let Some(victim) = owner_of(claim) {
                let theirs = held_by.get(victim).copied().unwrap_or_default();
                if theirs <= mine + 1 {
                    tracing::debug!(hub = %claim.event_hub_name, partition = %claim.partition_id, victim, theirs, mine, "Not stealing a partition: it would move without evening the load.");
                    continue;
                }
                held_by.insert(victim, theirs - 1);
            }
            kept.push(claim.clone());
        }
        kept
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
        if ownerships.iter().any(|claim| claim.partition_id.is_empty()) {
            return Err(azure_core::Error::with_message(
                ErrorKind::Other,
                "a claim has no partition id",
            ));
        }
        let _one_hub_at_a_time;
        let claims = match &self.across {
            Some((hubs, expiry)) => {
                _one_hub_at_a_time = self.balancing.lock().await;
                self.within_share(hubs, *expiry, ownerships).await
            }
            None => ownerships.to_vec(),
        };
        let mut won = Vec::with_capacity(claims.len());
        for claim in &claims {
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
