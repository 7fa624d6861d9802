//! Global groups: the processes running a group share its budget through
//! the control container (partition key `/groupId`, one partition per
//! group). The partition holds one config item (`id` `config`: the group's
//! budget, as the latest process to join computed it) and one item per
//! process (`id` a random UUID: its load factor, its allocation and when it
//! last renewed). Every renewal interval each process writes its item, reads
//! the partition, counts as live the processes that renewed within the
//! expiry (judged by the time in the item, not by the container's TTL, which
//! the emulator does not model; the `ttl` is set too so a real account
//! deletes them), deletes those that did not, and takes the share its load
//! factor gives it. A process that stops deletes its item; one that is
//! killed is dropped once its item expires.

use std::sync::Arc;
use std::time::Duration;

use azure_data_cosmos::{ContainerClient, CosmosError, FeedScope, Query};
use serde::{Deserialize, Serialize};
use skyport_core::ports::BoxError;
use skyport_runtime::config::GlobalControlSettings;
use skyport_runtime::error_chain::error_chain;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::super::charge::{Paged, charge, error_charge};
use super::super::request_units::{Operation, RequestUnits, Spend};
use super::Group;
use super::budget::share;

const CONFIG: &str = "config";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Kind {
    Config,
    Client,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Item {
    id: String,
    group_id: String,
    kind: Kind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    target_ru_per_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    load_factor: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    allocated_ru_per_s: Option<f64>,
    /// Milliseconds since the Unix epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    renewed_at_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ttl: Option<i64>,
}

/// This process in one global group.
pub(crate) struct Member {
    container: ContainerClient,
    group: Arc<Group>,
    group_id: String,
    id: String,
    renew: Duration,
    expire: Duration,
    units: Arc<RequestUnits>,
}

impl std::fmt::Debug for Member {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Member")
            .field("group_id", &self.group_id)
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

fn now_ms() -> i64 {
    i64::try_from(time::OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000)
        .unwrap_or(i64::MAX)
}

impl Member {
    /// Writes the group's config item, joins with this process's item, and
    /// takes its first share, so that it never starts on the whole budget.
    pub(super) async fn join(
        container: ContainerClient,
        database: &str,
        group: Arc<Group>,
        settings: &GlobalControlSettings,
        units: Arc<RequestUnits>,
    ) -> Result<Self, BoxError> {
        let member = Self {
            container,
            group_id: format!("{database}/{}", group.name),
            group,
            id: uuid::Uuid::new_v4().to_string(),
            renew: settings.renew_interval_ms.duration(),
            expire: settings.expire_interval_ms.duration(),
            units,
        };
        let target = member
            .group
            .group_ru()
            .ok_or("the group has no budget to share")?;
        member.group.take_offer_change();
        let stored = member.items().await?;
        let previous = stored
            .iter()
            .find(|item| item.kind == Kind::Config)
            .and_then(|item| item.target_ru_per_s);
        if previous != Some(target) {
            if let Some(previous) = previous {
                tracing::warn!(group = %member.group.name, previous, target, "The global group's budget differs from the one its other processes use; this process's, the latest, now applies to all of them.");
            }
            member.agree(target).await?;
        }
        member.renew_once().await?;
        tracing::info!(group = %member.group.name, client = %member.id, share = member.group.lock().share, "Joined the global throughput control group.");
        Ok(member)
    }

    /// Makes `target` the budget every process of the group uses (its config item).
    async fn agree(&self, target: f64) -> Result<(), BoxError> {
        let config = Item {
            id: CONFIG.into(),
            group_id: self.group_id.clone(),
            kind: Kind::Config,
            target_ru_per_s: Some(target),
            load_factor: None,
            allocated_ru_per_s: None,
            renewed_at_ms: Some(now_ms()),
            ttl: None,
        };
        self.upsert(&config).await?;
        Ok(())
    }

    /// Writes this process's item, reads the others', and takes the share
    /// its load factor gives it. When this process saw the container's offer
    /// change the budget, the new budget becomes the group's (a process that
    /// reads the offer later writes the same).
    async fn renew_once(&self) -> Result<(), BoxError> {
        if self.group.take_offer_change()
            && let Some(target) = self.group.group_ru()
        {
            tracing::info!(group = %self.group.name, target, "The container's offer changed the global group's budget; the group's processes take it at their next renewal.");
            self.agree(target).await?;
        }
        let load = self.group.take_load_factor();
        let now = now_ms();
        let own = Item {
            id: self.id.clone(),
            group_id: self.group_id.clone(),
            kind: Kind::Client,
            target_ru_per_s: None,
            load_factor: Some(load),
            allocated_ru_per_s: Some(self.group.allocation()),
            renewed_at_ms: Some(now),
            ttl: Some(
                i64::try_from(self.expire.as_secs())
                    .unwrap_or(i64::MAX)
                    .max(1),
            ),
        };
        self.upsert(&own).await?;
        let expire = i64::try_from(self.expire.as_millis()).unwrap_or(i64::MAX);
        let mut others = Vec::new();
        let mut target = None;
        for item in self.items().await? {
            match item.kind {
                Kind::Config => target = item.target_ru_per_s,
                Kind::Client if item.id == self.id => {}
                Kind::Client => {
                    let renewed = item.renewed_at_ms.unwrap_or(0);
                    if renewed.saturating_add(expire) >= now {
                        others.push(item.load_factor.unwrap_or(1.0));
                    } else {
                        self.remove(&item.id).await;
                    }
                }
            }
        }
        if let Some(target) = target
            && self.group.group_ru() != Some(target)
        {
            self.group.set_group_budget(target);
        }
        let processes = others.len() + 1;
        self.group.set_share(share(load, others));
        tracing::debug!(group = %self.group.name, processes, load, share = self.group.lock().share, "Renewed this process's share of the global group.");
        Ok(())
    }

    /// Removes this process's item: the others take its share at their next renewal.
    pub(super) async fn leave(&self) {
        self.remove(&self.id).await;
    }

    async fn remove(&self, id: &str) {
        match self
            .container
            .delete_item(self.group_id.clone(), id, None)
            .await
        {
            Ok(response) => self.units.record(
                Spend::ThroughputControl,
                Operation::Delete,
                charge(response.headers()),
            ),
            Err(error) => {
                self.units.record(
                    Spend::ThroughputControl,
                    Operation::Delete,
                    error_charge(&error),
                );
                if error.status().status_code() != azure_core::http::StatusCode::NotFound {
                    tracing::warn!(group = %self.group.name, item = id, error = %error_chain(&error), "Cannot remove an item of the global throughput control group.");
                }
            }
        }
    }

    async fn upsert(&self, item: &Item) -> Result<(), CosmosError> {
        let result = self
            .container
            .upsert_item(self.group_id.clone(), &item.id, item, None)
            .await;
        match result {
            Ok(response) => {
                self.units.record(
                    Spend::ThroughputControl,
                    Operation::Write,
                    charge(response.headers()),
                );
                Ok(())
            }
            Err(error) => {
                self.units.record(
                    Spend::ThroughputControl,
                    Operation::Write,
                    error_charge(&error),
                );
                Err(error)
            }
        }
    }

    /// Every item of the group's partition.
    async fn items(&self) -> Result<Vec<Item>, CosmosError> {
        let query = self
            .container
            .query_items::<Item>(
                Query::from("SELECT * FROM c"),
                FeedScope::partition(self.group_id.clone()),
                None,
            )
            .await?;
        let paged = Paged::read_all(query).await?;
        self.units
            .record(Spend::ThroughputControl, Operation::Query, paged.charge);
        Ok(paged.items)
    }
}

/// Renews `member` every renewal interval until `stop`.
pub(super) fn renew(member: Arc<Member>, stop: CancellationToken) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticks =
            tokio::time::interval_at(tokio::time::Instant::now() + member.renew, member.renew);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = ticks.tick() => {}
            }
            if let Err(error) = member.renew_once().await {
                tracing::warn!(group = %member.group.name, error = %error_chain(&*error), "Cannot renew this process's share of the global throughput control group; it keeps its share and tries again.");
            }
        }
    })
}
