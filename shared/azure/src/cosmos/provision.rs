//! Databases and containers: created when missing, or a clear error that
//! names what is missing when creating is not allowed. A container whose
//! items carry a `ttl` (status, dead letters, reservations, listing) has its
//! default time to live on (-1: no default, each item its own), without which
//! Cosmos DB ignores the `ttl` and nothing expires; one found without it is
//! turned on, or, when creating is not allowed, refused with the setting to
//! fix.
//!
//! The listing container is created with the indexing policy its queries
//! need ([`listing_indexing`]); one found with another is left as it is.

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
    pub(super) listing: ContainerClient,
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
                indexing: None,
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
                indexing: None,
            },
        )
        .await?,
        // The listing view's items expire with their status documents.
        listing: expiring(
            client,
            settings,
            Expiring {
                key: "cosmos.listing_container",
                name: &settings.listing_container,
                partition_key: "/scope",
                retention: "store.status_retention_s",
                indexing: Some(listing_indexing()),
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
}

/// The listing view's indexing: only the fields its queries filter and sort
/// on (`document`, the copy of the status document, is not indexed, which
/// keeps an upsert's charge down), and the composite index that a query
/// ordered by `createdMs` then `id` needs on Cosmos DB (it serves the
/// descending order as well).
pub(super) fn listing_indexing() -> IndexingPolicy {
    let mut policy = IndexingPolicy::default()
        .with_indexing_mode(IndexingMode::Consistent)
        .with_excluded_path("/*");
    policy.automatic = true;
    for path in ["/scope/?", "/createdMs/?", "/state/?", "/ownerId/?"] {
        policy = policy.with_included_path(path);
    }
    policy.with_composite_index(
        CompositeIndex::default()
            .with_property(CompositeIndexProperty::new(
                "/createdMs",
                CompositeIndexOrder::Descending,
            ))
            .with_property(CompositeIndexProperty::new(
                "/id",
                CompositeIndexOrder::Descending,
            )),
    )
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
        expiring.indexing,
    )
    .await?;
    let connect = |e: azure_data_cosmos::CosmosError| CosmosOpenError::Connect(Box::new(e));
    let mut properties: ContainerProperties = container
        .read(None)
        .await
        .map_err(connect)?
        .into_model()
        .map_err(connect)?;
    if !properties.default_ttl.is_forever() {
        return Ok(container);
    }
    let what = format!(
        "container {} in database {}",
        expiring.name, settings.database
    );
    if !settings.create_if_missing {
        return Err(CosmosOpenError::NoDefaultTtl {
            key: expiring.key,
            what,
            retention: expiring.retention,
        });
    }
    // What was read is written back whole, so only the default TTL changes.
    properties.default_ttl = TimeToLive::NoDefault;
    container
        .replace(properties, None)
        .await
        .map_err(|e| CosmosOpenError::EnableTtl {
            key: expiring.key,
            what,
            source: Box::new(e),
        })?;
    tracing::info!(
        container = %expiring.name,
        "Turned on the default time to live of a Cosmos DB container (-1: each item its own)."
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
