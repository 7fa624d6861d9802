//! Provisioning on the SDK's in-memory emulator: the containers whose items
//! carry a `ttl` have their default time to live on (-1), and the status
//! container is indexed for listing. The emulator keeps
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
use crate::cosmos::provision::{point_reads_only, status_indexing, timers_indexing};

fn settings() -> CosmosSettings {
    CosmosSettings {
        bulk_max_wait_ms: Millis::new(5),
        ..CosmosSettings::default()
    }
}

async fn properties(container: &ContainerClient) -> ContainerProperties {
    container.read(None).await.unwrap().into_model().unwrap()
}

/// Creates the database and the status container with a unique key policy
/// of its own, with a default time to live or without, and indexed by
/// `indexing`; and the other containers as the store would.
async fn provisioned(
    emulator: &Emulator,
    ttl: Option<TimeToLive>,
    indexing: IndexingPolicy,
) -> ContainerClient {
    let client = emulator.client().await.unwrap();
    let settings = settings();
    client
        .create_database(&settings.database, None)
        .await
        .unwrap();
    let database = client.database_client(&settings.database);
    let mut status = ContainerProperties::new(settings.status_container.clone(), "/id".into())
        .with_indexing_policy(indexing)
        .with_unique_key_policy(
            UniqueKeyPolicy::default().with_unique_key(UniqueKey::default().with_path("/ownerId")),
        );
    if let Some(ttl) = ttl {
        status = status.with_default_ttl(ttl);
    }
    let others = [
        (settings.dead_letter_container, "/id"),
        (settings.reservations_container, "/id"),
        (settings.leases_container, "/partitionKey"),
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
        &store.timers,
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
    assert_eq!(
        properties(&store.reservations).await.indexing_policy,
        Some(point_reads_only()),
        "reservations are read by id alone"
    );
    let timers = properties(&store.timers).await;
    assert_eq!(timers.indexing_policy, Some(timers_indexing()));
    let key: Vec<&str> = timers
        .partition_key
        .paths()
        .iter()
        .map(|path| path.as_ref())
        .collect();
    assert_eq!(key, ["/shard"]);
    store.close().await;
}

/// Why a store that may not change the containers did not open.
async fn refused(emulator: &Emulator) -> CosmosOpenError {
    emulator
        .store(&CosmosSettings {
            create_if_missing: false,
            ..settings()
        })
        .await
        .unwrap_err()
}

/// The composite indexes of `indexing`, as (path, order) lists.
fn composites(indexing: &IndexingPolicy) -> Vec<Vec<(&str, CompositeIndexOrder)>> {
    indexing
        .composite_indexes
        .iter()
        .map(|composite| {
            composite
                .properties
                .iter()
                .map(|p| (p.path.as_str(), p.order.clone()))
                .collect()
        })
        .collect()
}

#[tokio::test]
async fn the_status_container_is_keyed_by_id_and_indexed_for_listing_only() {
    let store = Emulator::new(false)
        .unwrap()
        .store(&settings())
        .await
        .unwrap();
    let properties = properties(&store.status).await;
    let key: Vec<&str> = properties
        .partition_key
        .paths()
        .iter()
        .map(|path| path.as_ref())
        .collect();
    assert_eq!(key, ["/id"]);
    let indexing = properties.indexing_policy.unwrap();
    let excluded: Vec<&str> = indexing
        .excluded_paths
        .iter()
        .map(|p| p.path.as_str())
        .collect();
    assert_eq!(excluded, ["/*"]);
    let included: Vec<&str> = indexing
        .included_paths
        .iter()
        .map(|p| p.path.as_str())
        .collect();
    assert_eq!(
        included,
        [
            "/ownerId/?",
            "/principal/?",
            "/state/?",
            "/createdMs/?",
            "/runsAtMs/?"
        ]
    );
    let newest = [
        ("/createdMs", CompositeIndexOrder::Descending),
        ("/id", CompositeIndexOrder::Descending),
    ];
    let after = |path| {
        let mut composite = vec![(path, CompositeIndexOrder::Ascending)];
        composite.extend(newest.clone());
        composite
    };
    assert_eq!(
        composites(&indexing),
        [newest.to_vec(), after("/ownerId"), after("/principal")]
    );
    store.close().await;
}

#[tokio::test]
async fn a_status_container_without_the_listings_indexes_is_given_them_or_refused() {
    let emulator = Emulator::new(false).unwrap();
    let indexed = IndexingPolicy::default().with_included_path("/state/?");
    let status = provisioned(&emulator, Some(TimeToLive::NoDefault), indexed).await;
    let error = refused(&emulator).await;
    assert!(
        matches!(error, CosmosOpenError::NotIndexed { .. }),
        "{error:?}"
    );
    assert!(
        error.to_string().starts_with(
            "cosmos.status_container: container status in database skyport lacks the \
             indexes a listing needs"
        ),
        "{error}"
    );
    assert!(composites(&properties(&status).await.indexing_policy.unwrap()).is_empty());
    let store = emulator.store(&settings()).await.unwrap();
    let properties = properties(&store.status).await;
    assert_eq!(properties.indexing_policy.unwrap(), status_indexing());
    assert_eq!(
        properties.unique_key_policy.unwrap().unique_keys[0].paths,
        ["/ownerId"]
    );
    store.close().await;
}

#[tokio::test]
async fn a_container_without_default_ttl_has_it_turned_on_and_keeps_the_rest() {
    let emulator = Emulator::new(false).unwrap();
    let status = provisioned(&emulator, None, status_indexing()).await;
    assert_eq!(properties(&status).await.default_ttl, TimeToLive::Forever);
    let store = emulator.store(&settings()).await.unwrap();
    let properties = properties(&store.status).await;
    assert_eq!(properties.default_ttl, TimeToLive::NoDefault);
    assert_eq!(properties.indexing_policy.unwrap(), status_indexing());
    let unique = properties.unique_key_policy.unwrap().unique_keys;
    assert_eq!(unique[0].paths, ["/ownerId"]);
    store.close().await;
}

#[tokio::test]
async fn a_container_without_default_ttl_stops_the_open_when_it_may_not_be_changed() {
    let emulator = Emulator::new(false).unwrap();
    let status = provisioned(&emulator, None, status_indexing()).await;
    let error = refused(&emulator).await;
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
