//! Composition: the adapters the settings choose, opened and bundled as the
//! [`Ports`] that the gateway and the worker run on. The only place besides
//! the binaries that knows the adapter crates.
//!
//! The stream is the embedded log, Event Hubs or Kafka (with an Entra ID
//! token on Event Hubs' Kafka endpoint, [`crate::kafka_entra`]); status,
//! dead letters and reservations live together in the embedded store or
//! Cosmos DB, and so do the Event Hubs processor's leases. The embedded
//! store opens when the stream or the store is embedded, and then also keeps
//! the receipt key unless one is configured; as the store, it runs its
//! retention sweeper.

use std::sync::Arc;

use secrecy::ExposeSecret;
use skyport_azure::cosmos::{CosmosOpenError, CosmosStore};
use skyport_azure::eventhubs::{EventHubsConsumer, EventHubsOpenError, EventHubsPublisher};
use skyport_core::ports::{
    ChangeSource, Consumer, DeadLetterStore, IdempotencyStore, LeaseStore, Ports, Publisher,
    StatusStore, Timers,
};
use skyport_embedded::{EmbeddedConsumer, EmbeddedStore, OpenError, Retention};
use skyport_kafka::{KafkaConsumer, KafkaOpenError, KafkaPublisher};
use skyport_runtime::config::{ConfigError, Settings, StoreBackend, StreamBackend};

use crate::kafka_entra::bearer_token;

/// Why a backend did not open.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error(transparent)]
    Embedded(#[from] OpenError),
    #[error(transparent)]
    Cosmos(#[from] CosmosOpenError),
    #[error(transparent)]
    EventHubs(#[from] EventHubsOpenError),
    #[error(transparent)]
    Kafka(#[from] KafkaOpenError),
    /// A setting that does not fit the data already stored.
    #[error("{0}")]
    Config(#[source] ConfigError),
}

/// Where status, dead letters, reservations and leases live.
#[derive(Debug, Clone)]
pub enum Store {
    Embedded(Arc<EmbeddedStore>),
    Cosmos(Arc<CosmosStore>),
}

/// The ports a process runs on, and the stores behind them (to close them,
/// and for tests and operators to inspect).
#[derive(Debug, Clone)]
pub struct Backends {
    pub ports: Ports,
    pub store: Store,
    /// The embedded store, when the stream or the store is embedded.
    pub embedded: Option<Arc<EmbeddedStore>>,
}

impl Backends {
    /// Opens the stream and the store the settings name.
    ///
    /// # Errors
    /// [`BackendError`] when a backend cannot be opened.
    pub async fn open(settings: &Settings) -> Result<Self, BackendError> {
        let cosmos = match settings.store_backend() {
            StoreBackend::Embedded => None,
            StoreBackend::Cosmos => {
                Some(CosmosStore::open(&settings.cosmos, &settings.store).await?)
            }
        };
        Self::open_with(settings, cosmos).await
    }

    /// Opens the stream the settings name, with status, dead letters and
    /// leases in `cosmos` when given (tests hand in one on the SDK's
    /// emulator), else in the embedded store.
    ///
    /// # Errors
    /// [`BackendError`] when a backend cannot be opened.
    pub async fn open_with(
        settings: &Settings,
        cosmos: Option<Arc<CosmosStore>>,
    ) -> Result<Self, BackendError> {
        let store = match cosmos {
            Some(cosmos) => Store::Cosmos(cosmos),
            None => {
                let embedded = open_embedded(settings)?;
                embedded.spawn_sweeper(Retention::from_settings(
                    &settings.store,
                    &settings.embedded,
                ));
                Store::Embedded(embedded)
            }
        };
        let embedded = match (settings.stream_backend(), store.embedded()) {
            (StreamBackend::Embedded, None) => Some(open_embedded(settings)?),
            (_, store) => store,
        };
        // The configured keys sign; the embedded store's keeps verifying the
        // receipts it signed before they were configured.
        let receipt_keys: Vec<Arc<[u8]>> = settings
            .gateway
            .receipt_keys
            .iter()
            .map(|key| Arc::from(key.expose_secret().as_bytes()))
            .chain(
                embedded
                    .iter()
                    .map(|embedded| Arc::from(embedded.receipt_key())),
            )
            .collect();
        let group = &settings.worker.consumer_group;
        let (publisher, consumer): (Arc<dyn Publisher>, Arc<dyn Consumer>) =
            match (settings.stream_backend(), &embedded) {
                (StreamBackend::Embedded, Some(embedded)) => (
                    Arc::clone(embedded) as Arc<dyn Publisher>,
                    Arc::new(EmbeddedConsumer::new(Arc::clone(embedded), group)),
                ),
                (StreamBackend::Kafka, _) => {
                    // Before any client: the first connection never waits for a token.
                    let token = bearer_token(&settings.kafka).await?;
                    (
                        Arc::new(KafkaPublisher::open_with(&settings.kafka, token.clone()).await?),
                        Arc::new(KafkaConsumer::new_with(&settings.kafka, group, token)),
                    )
                }
                _ => (
                    Arc::new(EventHubsPublisher::open(&settings.eventhubs).await?),
                    Arc::new(EventHubsConsumer::new(
                        &settings.eventhubs,
                        group,
                        store.leases(),
                    )),
                ),
            };
        let (status, dead_letters, idempotency) = store.ports();
        let ports = Ports {
            publisher,
            consumer,
            status,
            dead_letters,
            idempotency,
            changes: store.changes(),
            timers: Some(store.timers()),
            leases: store.leases(),
            receipt_keys,
        };
        Ok(Self {
            ports,
            store,
            embedded,
        })
    }

    /// The ports as the worker uses them: on Cosmos DB its status reads
    /// count with its status writes ([`CosmosStore::for_worker`]).
    pub fn worker_ports(&self) -> Ports {
        let mut ports = self.ports.clone();
        if let Store::Cosmos(cosmos) = &self.store {
            ports.status = cosmos.for_worker();
        }
        ports
    }

    /// Flushes what the backends buffer and logs what they spent.
    pub async fn close(&self) {
        if let Store::Cosmos(cosmos) = &self.store {
            cosmos.close().await;
        }
    }
}

impl Store {
    /// The embedded store, when it is the store.
    pub fn embedded(&self) -> Option<Arc<EmbeddedStore>> {
        match self {
            Self::Embedded(store) => Some(Arc::clone(store)),
            Self::Cosmos(_) => None,
        }
    }

    /// The status, dead-letter and idempotency stores, which live together.
    fn ports(
        &self,
    ) -> (
        Arc<dyn StatusStore>,
        Arc<dyn DeadLetterStore>,
        Arc<dyn IdempotencyStore>,
    ) {
        match self {
            Self::Embedded(store) => (store.clone(), store.clone(), store.clone()),
            Self::Cosmos(store) => (store.clone(), store.clone(), store.clone()),
        }
    }

    /// The change feed of the status documents.
    pub fn changes(&self) -> Arc<dyn ChangeSource> {
        match self {
            Self::Embedded(store) => store.clone(),
            Self::Cosmos(store) => store.clone(),
        }
    }

    /// The timers of Waiting deliveries, which the store keeps beside their status.
    pub fn timers(&self) -> Arc<dyn Timers> {
        match self {
            Self::Embedded(store) => store.clone(),
            Self::Cosmos(store) => store.clone(),
        }
    }

    /// The lease store of a partition-balancing stream and of the change-feed processor.
    pub fn leases(&self) -> Arc<dyn LeaseStore> {
        match self {
            Self::Embedded(store) => store.clone(),
            Self::Cosmos(store) => store.clone(),
        }
    }
}

/// The embedded store; a partition count that does not match its data is a
/// configuration error naming `stream.partitions`.
fn open_embedded(settings: &Settings) -> Result<Arc<EmbeddedStore>, BackendError> {
    EmbeddedStore::open(&settings.embedded, settings.stream.partitions).map_err(|e| match e {
        OpenError::PartitionMismatch { .. } => {
            BackendError::Config(ConfigError::new("stream.partitions", e.to_string()))
        }
        other => BackendError::Embedded(other),
    })
}
