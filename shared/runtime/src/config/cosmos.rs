//! `[cosmos]`: Azure Cosmos DB, where status, dead letters, reservations and
//! the stream's leases live in the azure profile.

use std::collections::BTreeMap;

use secrecy::SecretString;
use serde::Deserialize;
use url::Url;

use super::checks::Checks;
use super::duration::Millis;
use super::throughput::{self, GlobalControlSettings, GroupScope, ThroughputGroupSettings};

/// How the Cosmos DB client authenticates.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum CosmosAuth {
    /// The account key in `cosmos.key`.
    #[default]
    Key,
    /// An Entra ID credential: workload identity on Kubernetes, managed identity, or developer tools.
    Entra,
}

/// Azure Cosmos DB.
#[derive(Debug, Clone, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields)]
pub struct CosmosSettings {
    /// Account endpoint, `https://ACCOUNT.documents.azure.com:443/`.
    pub endpoint: Option<Url>,
    pub auth: CosmosAuth,
    /// The Azure region to route to first (the closest to this process).
    pub region: String,
    /// Account key (with `auth = "key"`).
    #[cfg_attr(test, schemars(with = "Option<String>"))]
    pub key: Option<SecretString>,
    pub database: String,
    pub status_container: String,
    pub leases_container: String,
    pub dead_letter_container: String,
    /// Idempotency reservations (partition key `/id`, per-item TTL).
    pub reservations_container: String,
    /// The timers of Waiting deliveries (partition key `/shard`, per-item TTL).
    pub timers_container: String,
    /// The shards the timers are spread over: each is one logical partition
    /// of the timers container, read by one worker at a time.
    pub timer_shards: u32,
    /// Not a key any more: refused with a message saying that listing
    /// queries the status container.
    #[cfg_attr(test, schemars(skip))]
    pub listing_container: Option<String>,
    /// Create the database and containers when missing; when false, fail naming what is missing.
    pub create_if_missing: bool,
    /// Manual RU/s of containers created here; unset: the account's default (serverless or shared).
    pub throughput: Option<u32>,
    /// A partition's queue of status writes is flushed at this many…
    pub bulk_max_items: usize,
    /// …or when its oldest write has waited this long.
    pub bulk_max_wait_ms: Millis,
    /// Batches in flight at once.
    pub bulk_max_in_flight: usize,
    /// Wait after a 429 that names no `x-ms-retry-after-ms`.
    pub throttle_retry_ms: Millis,
    /// Throughput control groups by name (none by default: uncontrolled).
    pub throughput_groups: BTreeMap<String, ThroughputGroupSettings>,
    /// How global groups are shared, and how often offers are read again.
    pub throughput_control: GlobalControlSettings,
}

impl Default for CosmosSettings {
    fn default() -> Self {
        Self {
            endpoint: None,
            auth: CosmosAuth::Key,
            region: "East US".into(),
            key: None,
            database: "skyport".into(),
            status_container: "status".into(),
            leases_container: "leases".into(),
            dead_letter_container: "deadletters".into(),
            reservations_container: "reservations".into(),
            timers_container: "timers".into(),
            timer_shards: 16,
            listing_container: None,
            create_if_missing: true,
            throughput: None,
            bulk_max_items: 100,
            bulk_max_wait_ms: Millis::new(1_000),
            bulk_max_in_flight: 32,
            throttle_retry_ms: Millis::new(2_000),
            throughput_groups: BTreeMap::new(),
            throughput_control: GlobalControlSettings::default(),
        }
    }
}

impl CosmosSettings {
    /// `in_use`: whether the store is Cosmos DB, which makes the account required.
    pub(super) fn validate(&self, checks: &mut Checks<'_>, in_use: bool) {
        if in_use {
            checks.check(
                self.endpoint.is_some(),
                "endpoint",
                "must be set to use Cosmos DB",
            );
            if self.auth == CosmosAuth::Key {
                checks.check(
                    self.key.is_some(),
                    "key",
                    "must be set with cosmos.auth = \"key\" (or use cosmos.auth = \"entra\")",
                );
            }
        }
        for (key, name) in [
            ("database", &self.database),
            ("status_container", &self.status_container),
            ("leases_container", &self.leases_container),
            ("dead_letter_container", &self.dead_letter_container),
            ("reservations_container", &self.reservations_container),
            ("timers_container", &self.timers_container),
        ] {
            checks.check(!name.trim().is_empty(), key, "must not be empty");
        }
        if self.listing_container.is_some() {
            checks.fail(
                "listing_container",
                "is gone: listing queries the status container, which is indexed for it, and \
                 no view is kept any more; remove the key, and delete the old container once \
                 this version runs (docs/operations.md, Upgrading)",
            );
        }
        checks.at_least(self.timer_shards, 1, "timer_shards");
        checks.at_least(self.bulk_max_items, 1, "bulk_max_items");
        checks.at_least(self.bulk_max_in_flight, 1, "bulk_max_in_flight");
        throughput::validate_groups(
            &self.throughput_groups,
            &self.containers(),
            &mut checks.section("throughput_groups"),
        );
        self.throughput_control
            .validate(&mut checks.section("throughput_control"));
    }

    /// The containers Skyport keeps its data in, as configured.
    pub fn containers(&self) -> [&str; 5] {
        [
            &self.status_container,
            &self.dead_letter_container,
            &self.reservations_container,
            &self.leases_container,
            &self.timers_container,
        ]
    }

    /// Whether some group shares its budget through the control container.
    pub fn has_global_groups(&self) -> bool {
        self.throughput_groups
            .values()
            .any(|group| group.scope == GroupScope::Global)
    }
}
