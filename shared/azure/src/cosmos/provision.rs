//! Databases and containers: created when missing, or a clear error that
//! names what is missing when creating is not allowed. A container whose
//! items carry a `ttl` (status, dead letters, reservations, timers) has its
//! default time to live on (-1: no default, each item its own), without which
//! Cosmos DB ignores the `ttl` and nothing expires; one found without it is
//! turned on, or, when creating is not allowed, refused with the setting to
//! fix.
//!
//! The status container is indexed for listing ([`status_indexing`]): one
//! found without the composite indexes the listing's order needs is given
//! that policy, or, when creating is not allowed, refused with the setting
//! to fix; likewise `runsAtMs`, which lost timers are found by, and the
//! timers container's order ([`timers_indexing`]). The reservations
//! container is created indexing nothing ([`point_reads_only`]).

use azure_core::http::StatusCode;
use azure_data_cosmos::models::{
    CompositeIndex, CompositeIndexOrder, CompositeIndexProperty, ContainerProperties, IndexingMode,
    IndexingPolicy, ThroughputProperties, TimeToLive,
};
use azure_data_cosmos::options::CreateContainerOptions;
use azure_data_cosmos::{ContainerClient, CosmosClient};

use skyport_runtime::config::CosmosSettings;

use super::error::CosmosOpenError;

pub(super) struct Containers {
    pub(super) status: ContainerClient,
    pub(super) dead_letters: ContainerClient,
    pub(super) leases: ContainerClient,
    pub(super) reservations: ContainerClient,
    pub(super) timers: ContainerClient,
    /// The throughput control container, when a group is global.
    pub(super) control: Option<ContainerClient>,
}

pub(super) async fn ensure(
    client: &CosmosClient,
    settings: &CosmosSettings,
) -> Result<Containers, CosmosOpenError> {
    let database = &settings.database;
    let what = format!("database {database}");
    match client.database_client(database).read(None).await {
        Ok(_) => {}
        Err(e) if e.status().status_code() == StatusCode::NotFound => {
            if !settings.create_if_missing {
                return Err(CosmosOpenError::Missing { what });
            }
            match client.create_database(database, None).await {
                Ok(_) => tracing::info!(%database, "Created the Cosmos DB database."),
                Err(e) if e.status().is_conflict() => {}
                Err(e) => {
                    return Err(CosmosOpenError::Create {
                        what,
                        source: Box::new(e),
                    });
                }
            }
        }
        Err(e) => return Err(CosmosOpenError::Connect(Box::new(e))),
    }
    Ok(Containers {
        status: expiring(
            client,
            settings,
            Expiring {
                key: "cosmos.status_container",
                name: &settings.status_container,
                partition_key: "/id",
                retention: "store.status_retention_s",
                indexing: Some(status_indexing()),
                needs: "a listing needs ((createdMs DESC, id DESC), alone and after ownerId and \
                        principal) and lost timers are found by (runsAtMs), so every listing \
                        would fail",
            },
        )
        .await?,
        dead_letters: expiring(
            client,
            settings,
            Expiring {
                key: "cosmos.dead_letter_container",
                name: &settings.dead_letter_container,
                partition_key: "/id",
                retention: "store.dead_letter_retention_s",
                indexing: None,
                needs: "",
            },
        )
        .await?,
        leases: container(
            client,
            settings,
            &settings.leases_container,
            "/partitionKey",
            None,
            None,
        )
        .await?,
        reservations: expiring(
            client,
            settings,
            Expiring {
                key: "cosmos.reservations_container",
                name: &settings.reservations_container,
                partition_key: "/id",
                retention: "gateway.idempotency_retention_s",
                indexing: Some(point_reads_only()),
                needs: "",
            },
        )
        .await?,
        timers: expiring(
            client,
            settings,
            Expiring {
                key: "cosmos.timers_container",
                name: &settings.timers_container,
                partition_key: "/shard",
                retention: "store.status_retention_s",
                indexing: Some(timers_indexing()),
                needs: "a due read needs (runsAtMs, and (runsAtMs ASC, id ASC)), so no timer \
                        would fire",
            },
        )
        .await?,
        // Global throughput control groups: the processes' items carry a `ttl`.
        control: if settings.has_global_groups() {
            Some(
                container(
                    client,
                    settings,
                    &settings.throughput_control.container,
                    "/groupId",
                    Some(TimeToLive::NoDefault),
                    None,
                )
                .await?,
            )
        } else {
            None
        },
    })
}

/// A container whose items each carry their own `ttl`.
struct Expiring<'a> {
    /// The setting that names the container.
    key: &'static str,
    name: &'a str,
    partition_key: &'static str,
    /// The setting the items' `ttl` comes from.
    retention: &'static str,
    /// The indexing policy it is created with; `None`: Cosmos DB's default
    /// (every path).
    indexing: Option<IndexingPolicy>,
    /// What the indexing is for, as an error says it when it is missing.
    needs: &'static str,
}

/// The status container's indexing: only the fields a listing filters and
/// sorts on (the rest of a document, most of its bytes, is not indexed,
/// which keeps a write's charge down), and the composite indexes a query
/// ordered by `createdMs` then `id` needs on Cosmos DB, alone and after the
/// owner or the principal it is filtered by (each serves the descending
/// order as well).
pub(super) fn status_indexing() -> IndexingPolicy {
    let mut policy = IndexingPolicy::default()
        .with_indexing_mode(IndexingMode::Consistent)
        .with_excluded_path("/*");
    policy.automatic = true;
    for path in [
        "/ownerId/?",
        "/principal/?",
        "/state/?",
        "/createdMs/?",
        "/runsAtMs/?",
    ] {
        policy = policy.with_included_path(path);
    }
    for first in [None, Some("/ownerId"), Some("/principal")] {
        let mut composite = CompositeIndex::default();
        if let Some(path) = first {
            composite = composite.with_property(CompositeIndexProperty::new(
                path,
                CompositeIndexOrder::Ascending,
            ));
        }
        policy = policy.with_composite_index(
            composite
                .with_property(CompositeIndexProperty::new(
                    "/createdMs",
                    CompositeIndexOrder::Descending,
                ))
                .with_property(CompositeIndexProperty::new(
                    "/id",
                    CompositeIndexOrder::Descending,
                )),
        );
    }
    policy
}

/// The timers container's indexing: `runsAtMs` alone, and the composite
/// index a due read's order (`runsAtMs`, then `id`) needs.
pub(super) fn timers_indexing() -> IndexingPolicy {
    let mut policy = IndexingPolicy::default()
        .with_indexing_mode(IndexingMode::Consistent)
        .with_excluded_path("/*")
        .with_included_path("/runsAtMs/?");
    policy.automatic = true;
    policy.with_composite_index(
        CompositeIndex::default()
            .with_property(CompositeIndexProperty::new(
                "/runsAtMs",
                CompositeIndexOrder::Ascending,
            ))
            .with_property(CompositeIndexProperty::new(
                "/id",
                CompositeIndexOrder::Ascending,
            )),
    )
}

/// The indexing of a container read only by id (the reservations): no
/// path, so a create pays no index work on Azure. A container created
/// before keeps what it has: it works either way.
pub(super) fn point_reads_only() -> IndexingPolicy {
    let mut policy = IndexingPolicy::default()
        .with_indexing_mode(IndexingMode::Consistent)
        .with_excluded_path("/*");
    policy.automatic = true;
    policy
}

/// Whether `found` has every path and composite index `wanted` asks for.
fn has_indexes(found: Option<&IndexingPolicy>, wanted: &IndexingPolicy) -> bool {
    wanted
        .included_paths
        .iter()
        .all(|path| found.is_some_and(|found| found.included_paths.contains(path)))
        && has_composites(found, wanted)
}

/// Whether `found` has every composite index `wanted` asks for.
fn has_composites(found: Option<&IndexingPolicy>, wanted: &IndexingPolicy) -> bool {
    wanted
        .composite_indexes
        .iter()
        .all(|composite| found.is_some_and(|found| found.composite_indexes.contains(composite)))
}

/// The container `expiring` names, created with its default time to live on
/// and no default (-1), or found and checked to have it on (turned on when
/// `cosmos.create_if_missing`).
async fn expiring(
    client: &CosmosClient,
    settings: &CosmosSettings,
    expiring: Expiring<'_>,
) -> Result<ContainerClient, CosmosOpenError> {
    let container = container(
        client,
        settings,
        expiring.name,
        expiring.partition_key,
        Some(TimeToLive::NoDefault),
        expiring.indexing.clone(),
    )
    .await?;
    let connect = |e: azure_data_cosmos::CosmosError| CosmosOpenError::Connect(Box::new(e));
    let mut properties: ContainerProperties = container
        .read(None)
        .await
        .map_err(connect)?
        .into_model()
        .map_err(connect)?;
    let ttl_off = properties.default_ttl.is_forever();
    let unindexed = expiring
        .indexing
        .filter(|wanted| !has_indexes(properties.indexing_policy.as_ref(), wanted));
    let indexed_now = unindexed.is_some();
    if !ttl_off && unindexed.is_none() {
        return Ok(container);
    }
    let what = format!(
        "container {} in database {}",
        expiring.name, settings.database
    );
    if !settings.create_if_missing {
        return Err(if ttl_off {
            CosmosOpenError::NoDefaultTtl {
                key: expiring.key,
                what,
                retention: expiring.retention,
            }
        } else {
            CosmosOpenError::NotIndexed {
                key: expiring.key,
                what,
                needs: expiring.needs,
            }
        });
    }
    // What was read is written back whole, with only these changed.
    properties.default_ttl = TimeToLive::NoDefault;
    if let Some(wanted) = unindexed {
        properties.indexing_policy = Some(wanted);
    }
    container
        .replace(properties, None)
        .await
        .map_err(|e| CosmosOpenError::Reconfigure {
            key: expiring.key,
            what,
            source: Box::new(e),
        })?;
    tracing::info!(
        container = %expiring.name,
        default_ttl_turned_on = ttl_off,
        indexed_for_listing = indexed_now,
        "Reconfigured a Cosmos DB container (a default time to live of -1: each item its own; \
         the indexing its queries need)."
    );
    Ok(container)
}

async fn container(
    client: &CosmosClient,
    settings: &CosmosSettings,
    name: &str,
    partition_key: &'static str,
    ttl: Option<TimeToLive>,
    indexing: Option<IndexingPolicy>,
) -> Result<ContainerClient, CosmosOpenError> {
    let database = client.database_client(&settings.database);
    let what = format!("container {name} in database {}", settings.database);
    match database.container_client(name, None).await {
        Ok(container) => return Ok(container),
        Err(e) if e.status().status_code() == StatusCode::NotFound => {}
        Err(e) => return Err(CosmosOpenError::Connect(Box::new(e))),
    }
    if !settings.create_if_missing {
        return Err(CosmosOpenError::Missing { what });
    }
    let options = settings.throughput.map(|ru| {
        CreateContainerOptions::default()
            .with_throughput(ThroughputProperties::manual(u64::from(ru)))
    });
    let mut properties = ContainerProperties::new(name.to_owned(), partition_key.into());
    if let Some(ttl) = ttl {
        properties = properties.with_default_ttl(ttl);
    }
    if let Some(indexing) = indexing {
        properties = properties.with_indexing_policy(indexing);
    }
    match database.create_container(properties, options).await {
        Ok(_) => tracing::info!(container = %name, partition_key, "Created a Cosmos DB container."),
        Err(e) if e.status().is_conflict() => {}
        Err(e) => {
            return Err(CosmosOpenError::Create {
                what,
                source: Box::new(e),
            });
        }
    }
    database
        .container_client(name, None)
        .await
        .map_err(|e| CosmosOpenError::Connect(Box::new(e)))
}

#[cfg(all(test, feature = "cosmos-emulator"))]
mod emulator_tests;
