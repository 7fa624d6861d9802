//! Databases and containers: created when missing, or a clear error that
//! names what is missing when creating is not allowed.

use azure_core::http::StatusCode;
use azure_data_cosmos::models::{ContainerProperties, ThroughputProperties, TimeToLive};
use azure_data_cosmos::options::CreateContainerOptions;
use azure_data_cosmos::{ContainerClient, CosmosClient};

use skyport_runtime::config::CosmosSettings;

use super::error::CosmosOpenError;

pub(super) struct Containers {
    pub(super) status: ContainerClient,
    pub(super) dead_letters: ContainerClient,
    pub(super) leases: ContainerClient,
    pub(super) reservations: ContainerClient,
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
        status: container(client, settings, &settings.status_container, "/id", None).await?,
        dead_letters: container(
            client,
            settings,
            &settings.dead_letter_container,
            "/id",
            None,
        )
        .await?,
        leases: container(
            client,
            settings,
            &settings.leases_container,
            "/partitionKey",
            None,
        )
        .await?,
        // Each reservation carries its own `ttl`; the container only has to allow it.
        reservations: container(
            client,
            settings,
            &settings.reservations_container,
            "/id",
            Some(TimeToLive::NoDefault),
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
                )
                .await?,
            )
        } else {
            None
        },
    })
}

async fn container(
    client: &CosmosClient,
    settings: &CosmosSettings,
    name: &str,
    partition_key: &'static str,
    ttl: Option<TimeToLive>,
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
