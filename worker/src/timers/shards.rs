//! The timer shards this worker reads, held through leases in the store's
//! lease group [`GROUP`] (one lease per shard, `shard-{n}`), balanced as the
//! change-feed processor balances its ranges ([`skyport_runtime::balance`]):
//! each worker takes free shards up to its equal share, steals one a round
//! from the busiest when none is free, renews its own every round, and
//! releases them when it stops. A shard whose owner stopped renewing (killed)
//! is free once the expiry has passed. Every write is conditional on the
//! version read, so two workers never both keep a shard past a round; while
//! a steal is not yet seen both may fire it, which the workflow's revision
//! check makes harmless.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use skyport_core::ports::{ETag, Lease, LeaseCondition, LeaseError, LeaseFields, LeaseStore};
use skyport_runtime::balance::{Held, choose};
use time::OffsetDateTime;

/// The lease group of the timer shards.
const GROUP: &str = "timers";
const PREFIX: &str = "shard-";
const OWNER: &str = "owner";

/// The shards this worker holds, with the version of each one's lease.
#[derive(Debug)]
pub(super) struct Shards {
    leases: Arc<dyn LeaseStore>,
    count: u32,
    me: String,
    expiry: Duration,
    held: BTreeMap<u32, ETag>,
}

fn name(shard: u32) -> String {
    format!("{PREFIX}{shard}")
}

fn owner(lease: &Lease) -> Option<&str> {
    lease.fields.get(OWNER).and_then(Value::as_str)
}

fn fields(owner: Option<&str>) -> LeaseFields {
    let mut fields = LeaseFields::new();
    fields.insert(OWNER.into(), owner.map_or(Value::Null, Value::from));
    fields
}

impl Shards {
    pub(super) fn new(
        leases: Arc<dyn LeaseStore>,
        count: u32,
        me: String,
        expiry: Duration,
    ) -> Self {
        Self {
            leases,
            count,
            me,
            expiry,
            held: BTreeMap::new(),
        }
    }

    /// The shards held now, in order.
    pub(super) fn held(&self) -> impl Iterator<Item = u32> + '_ {
        self.held.keys().copied()
    }

    /// One round: creates the missing leases, renews this worker's, drops
    /// those another took, and takes its share of the rest.
    pub(super) async fn balance(&mut self) -> Result<(), LeaseError> {
        let mut leases = self.leases.list(GROUP, PREFIX).await?;
        let missing: Vec<u32> = (0..self.count)
            .filter(|shard| !leases.iter().any(|lease| lease.name == name(*shard)))
            .collect();
        if !missing.is_empty() {
            for shard in missing {
                match self.put(shard, None, LeaseCondition::Absent).await {
                    Ok(_) | Err(LeaseError::Conflict) => {}
                    Err(e) => return Err(e),
                }
            }
            leases = self.leases.list(GROUP, PREFIX).await?;
        }
        let shard_of = |lease: &Lease| {
            lease
                .name
                .strip_prefix(PREFIX)
                .and_then(|n| n.parse::<u32>().ok())
                .filter(|n| *n < self.count)
        };
        let now = OffsetDateTime::now_utc();
        let expiry = time::Duration::try_from(self.expiry).unwrap_or(time::Duration::MAX);
        let mut held = BTreeMap::new();
        for lease in &leases {
            let Some(shard) = shard_of(lease) else {
                continue;
            };
            if owner(lease) == Some(self.me.as_str()) {
                let condition = LeaseCondition::Matches(lease.version.etag.clone());
                match self.put(shard, Some(&self.me), condition).await {
                    Ok(etag) => {
                        held.insert(shard, etag);
                    }
                    Err(LeaseError::Conflict) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        for shard in self.held.keys() {
            if !held.contains_key(shard) {
                tracing::info!(shard, "Another worker took a timer shard.");
            }
        }
        let views: Vec<Held<'_>> = leases
            .iter()
            .filter(|lease| shard_of(lease).is_some())
            .map(|lease| Held {
                name: &lease.name,
                live_owner: owner(lease).filter(|_| lease.version.modified + expiry > now),
            })
            .collect();
        for wanted in choose(&views, &self.me) {
            let Some(lease) = leases.iter().find(|lease| lease.name == wanted) else {
                continue;
            };
            let Some(shard) = shard_of(lease) else {
                continue;
            };
            let condition = LeaseCondition::Matches(lease.version.etag.clone());
            match self.put(shard, Some(&self.me), condition).await {
                Ok(etag) => {
                    match owner(lease) {
                        Some(from) => tracing::info!(shard, from, "Took a timer shard."),
                        None => tracing::debug!(shard, "Took a free timer shard."),
                    }
                    held.insert(shard, etag);
                }
                Err(LeaseError::Conflict) => {}
                Err(e) => return Err(e),
            }
        }
        self.held = held;
        Ok(())
    }

    /// Gives every held shard up, so that the others take them at once.
    pub(super) async fn release(&mut self) {
        for (shard, etag) in std::mem::take(&mut self.held) {
            if let Err(e) = self.put(shard, None, LeaseCondition::Matches(etag)).await {
                tracing::debug!(shard, error = %e, "Could not release a timer shard; it expires.");
            }
        }
    }

    async fn put(
        &self,
        shard: u32,
        owner: Option<&str>,
        condition: LeaseCondition,
    ) -> Result<ETag, LeaseError> {
        let version = self
            .leases
            .put(GROUP, &name(shard), &fields(owner), condition)
            .await?;
        Ok(version.etag)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::Arc;
    use std::time::Duration;

    use skyport_core::ports::LeaseStore;
    use skyport_embedded::EmbeddedStore;
    use skyport_runtime::config::EmbeddedSettings;

    use super::Shards;

    const EXPIRY: Duration = Duration::from_secs(1);

    fn held(shards: &Shards) -> Vec<u32> {
        shards.held().collect()
    }

    #[tokio::test]
    async fn workers_share_the_shards_take_a_dead_ones_and_give_theirs_up() {
        let dir = tempfile::tempdir().unwrap();
        let settings = EmbeddedSettings {
            data_dir: dir.path().to_path_buf(),
            segment_size_mb: 1,
            ..EmbeddedSettings::default()
        };
        let store: Arc<dyn LeaseStore> = EmbeddedStore::open(&settings, 1).unwrap();
        let mut a = Shards::new(Arc::clone(&store), 4, "a".into(), EXPIRY);
        let mut b = Shards::new(Arc::clone(&store), 4, "b".into(), EXPIRY);
        a.balance().await.unwrap();
        assert_eq!(held(&a), [0, 1, 2, 3], "the first takes every shard");
        // The second steals one a round until each holds its share.
        b.balance().await.unwrap();
        a.balance().await.unwrap();
        b.balance().await.unwrap();
        a.balance().await.unwrap();
        assert_eq!((held(&a).len(), held(&b).len()), (2, 2));
        assert!(held(&a).iter().all(|shard| !held(&b).contains(shard)));
        // b is killed: once its leases expire, a takes its shards.
        tokio::time::sleep(EXPIRY + Duration::from_millis(1_100)).await;
        a.balance().await.unwrap();
        assert_eq!(held(&a), [0, 1, 2, 3]);
        // a stops: its shards are free at once.
        a.release().await;
        assert!(held(&a).is_empty());
        let mut c = Shards::new(store, 4, "c".into(), Duration::from_secs(60));
        c.balance().await.unwrap();
        assert_eq!(held(&c), [0, 1, 2, 3]);
    }
}
