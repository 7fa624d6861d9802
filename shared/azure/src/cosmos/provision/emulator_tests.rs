//! Provisioning on the SDK's in-memory emulator: the containers whose items
//! carry a `ttl` have their default time to live on (-1). The emulator keeps
//! a container's `defaultTtl` as Cosmos DB does, but never expires an item,
//! so these tests read the containers' properties back.

#![allow(clippy::unwrap_used)]

use azure_data_cosmos::ContainerClient;
use azure_data_cosmos::models::{
    CompositeIndexOrder, ContainerProperties, IndexingPolicy, TimeToLive, UniqueKey,
    UniqueKeyPolicy,
};
use skyport_runtime::config::{CosmosSettings, Millis};

use crate::cosmos::CosmosOpenError;
use crate::cosmos::emulator::Emulator;

fn settings() -> CosmosSettings {
    CosmosSettings {
        bulk_max_wait_ms: Millis::new(5),
        ..CosmosSettings::default()
    }
}

async fn properties(container: &ContainerClient) -> ContainerProperties {
    container.read(None).await.unwrap().into_model().unwrap()
}

/// Creates the database and the status container without a default time
/// to live (and with an indexing and a unique key policy of its own), and
/// the other containers as the store would.
async fn provisioned_without_ttl(emulator: &Emulator) -> ContainerClient {
    let client = emulator.client().await.unwrap();
    let settings = settings();
    client
        .create_database(&settings.database, None)
        .await
        .unwrap();
    let database = client.database_client(&settings.database);
    let status = ContainerProperties::new(settings.status_container.clone(), "/id".into())
        .with_indexing_policy(IndexingPolicy::default().with_included_path("/state/?"))
        .with_unique_key_policy(
            UniqueKeyPolicy::default().with_unique_key(UniqueKey::default().with_path("/ownerId")),
        );
    let others = [
        (settings.dead_letter_container, "/id"),
        (settings.reservations_container, "/id"),
        (settings.leases_container, "/partitionKey"),
        (settings.listing_container, "/scope"),
    ]
    .map(|(name, key)| {
        ContainerProperties::new(name, key.into()).with_default_ttl(TimeToLive::NoDefault)
    });
    for properties in std::iter::once(status).chain(others) {
        database.create_container(properties, None).await.unwrap();
    }
    database
        .container_client(settings.status_container.as_str(), None)
        .await
        .unwrap()
}

#[tokio::test]
async fn the_containers_whose_items_expire_are_created_with_no_default_ttl() {
    let store = Emulator::new(false)
        .unwrap()
        .store(&settings())
        .await
        .unwrap();
    for container in [
        &store.status,
        &store.dead_letters,
        &store.reservations,
        &store.listing,
    ] {
        let properties = properties(container).await;
        assert_eq!(
            properties.default_ttl,
            TimeToLive::NoDefault,
            "{}",
            properties.id
        );
    }
    assert_eq!(
        properties(&store.leases).await.default_ttl,
        TimeToLive::Forever
    );
    store.close().await;
}

#[tokio::test]
async fn the_listing_container_is_keyed_by_scope_and_indexed_for_its_queries() {
    let store = Emulator::new(false)
        .unwrap()
        .store(&settings())
        .await
        .unwrap();
    let properties = properties(&store.listing).await;
    assert_eq!(properties.id, "listing");
    let key: Vec<&str> = properties
        .partition_key
        .paths()
        .iter()
        .map(|path| path.as_ref())
        .collect();
    assert_eq!(key, ["/scope"]);
    let indexing = properties.indexing_policy.unwrap();
    let excluded: Vec<&str> = indexing
        .excluded_paths
        .iter()
        .map(|p| p.path.as_str())
        .collect();
    assert!(excluded.contains(&"/*"), "{excluded:?}");
    let composite: Vec<(&str, CompositeIndexOrder)> = indexing.composite_indexes[0]
        .properties
        .iter()
        .map(|p| (p.path.as_str(), p.order.clone()))
        .collect();
    assert_eq!(
        composite,
        [
            ("/createdMs", CompositeIndexOrder::Descending),
            ("/id", CompositeIndexOrder::Descending)
        ]
    );
    store.close().await;
}

#[tokio::test]
async fn a_container_without_default_ttl_has_it_turned_on_and_keeps_the_rest() {
    let emulator = Emulator::new(false).unwrap();
    let status = provisioned_without_ttl(&emulator).await;
    assert_eq!(properties(&status).await.default_ttl, TimeToLive::Forever);
    let store = emulator.store(&settings()).await.unwrap();
    let properties = properties(&store.status).await;
    assert_eq!(properties.default_ttl, TimeToLive::NoDefault);
    let indexed = properties.indexing_policy.unwrap().included_paths;
    assert!(
        indexed.iter().any(|path| path.path == "/state/?"),
        "{indexed:?}"
    );
    let unique = properties.unique_key_policy.unwrap().unique_keys;
    assert_eq!(unique[0].paths, ["/ownerId"]);
    store.close().await;
}

#[tokio::test]
async fn a_container_without_default_ttl_stops_the_open_when_it_may_not_be_changed() {
    let emulator = Emulator::new(false).unwrap();
    let status = provisioned_without_ttl(&emulator).await;
    let error = emulator
        .store(&CosmosSettings {
            create_if_missing: false,
            ..settings()
        })
        .await
        .unwrap_err();
    assert!(
        matches!(error, CosmosOpenError::NoDefaultTtl { .. }),
        "{error:?}"
    );
    assert_eq!(
        error.to_string(),
        "cosmos.status_container: container status in database skyport has no default time \
         to live, so the items' ttl would be ignored and nothing would expire \
         (store.status_retention_s); enable it (defaultTtl = -1) or set \
         cosmos.create_if_missing = true"
    );
    assert_eq!(properties(&status).await.default_ttl, TimeToLive::Forever);
}
