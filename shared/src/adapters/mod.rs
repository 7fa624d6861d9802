//! Adapters: the ports implemented on concrete backends, and [`Backends`],
//! which picks them from the settings.
//!
//! Each adapter keeps its backend's types inside its own module.

pub mod cosmos;
pub mod embedded;
pub mod entra;
pub mod eventhubs;

use std::sync::Arc;

use secrecy::ExposeSecret;

use self::cosmos::{CosmosOpenError, CosmosStore};
use self::embedded::{EmbeddedStore, OpenError};
use self::eventhubs::{EventHubsConsumer, EventHubsOpenError, EventHubsPublisher, Leases};
use crate::config::{Settings, StoreBackend, StreamBackend};
use crate::ports::{Consumer, DeadLetterStore, IdempotencyStore, Publisher, StatusStore};

/// The status, dead-letter and idempotency stores, which always live together.
type Stores = (
    Arc<dyn StatusStore>,
    Arc<dyn DeadLetterStore>,
    Arc<dyn IdempotencyStore>,
);

/// Why a backend did not open.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error(transparent)]
    Embedded(#[from] OpenError),
    #[error(transparent)]
    Cosmos(#[from] CosmosOpenError),
    #[error(transparent)]
    EventHubs(#[from] EventHubsOpenError),
    #[error("gateway.receipt_key is not set, and no embedded store keeps one")]
    NoReceiptKey,
}

/// The ports a Skyport process runs on, as the settings choose them.
#[derive(Debug, Clone)]
pub struct Backends {
    pub publisher: Arc<dyn Publisher>,
    pub consumer: Arc<dyn Consumer>,
    pub status: Arc<dyn StatusStore>,
    pub dead_letters: Arc<dyn DeadLetterStore>,
    /// Where retried requests find the delivery they made (beside the status).
    pub idempotency: Arc<dyn IdempotencyStore>,
    /// The configured receipt key, else the one the embedded store keeps.
    pub receipt_key: Vec<u8>,
    /// The embedded store, when one is open (tests and operators inspect it).
    pub embedded: Option<Arc<EmbeddedStore>>,
    /// The Cosmos DB store, when status lives there.
    pub cosmos: Option<Arc<CosmosStore>>,
}

impl Backends {
    /// Opens the stream and the store the settings name.
    ///
    /// # Errors
    /// [`BackendError`] when a backend cannot be opened.
    pub async fn open(settings: &Settings) -> Result<Self, BackendError> {
        let cosmos = match settings.store_backend() {
            StoreBackend::Embedded => None,
            StoreBackend::Cosmos => Some(CosmosStore::open(&settings.cosmos).await?),
        };
        Self::open_with(settings, cosmos).await
    }

    /// Opens the stream the settings name, with status, dead letters and
    /// Event Hubs checkpoints in `cosmos` when given (tests hand in one on the
    /// SDK's emulator).
    ///
    /// # Errors
    /// [`BackendError`] when a backend cannot be opened.
    pub async fn open_with(
        settings: &Settings,
        cosmos: Option<Arc<CosmosStore>>,
    ) -> Result<Self, BackendError> {
        let stream = settings.stream_backend();
        let embedded = if stream == StreamBackend::Embedded || cosmos.is_none() {
            Some(EmbeddedStore::open(
                &settings.embedded,
                settings.stream.partitions,
            )?)
        } else {
            None
        };
        let receipt_key = match (&settings.gateway.receipt_key, &embedded) {
            (Some(key), _) => key.expose_secret().as_bytes().to_vec(),
            (None, Some(store)) => store.receipt_key().to_vec(),
            (None, None) => return Err(BackendError::NoReceiptKey),
        };
        let (status, dead_letters, idempotency): Stores = match (&cosmos, &embedded) {
            (Some(cosmos), _) => (cosmos.clone(), cosmos.clone(), cosmos.clone()),
            (None, Some(store)) => (store.clone(), store.clone(), store.clone()),
            (None, None) => unreachable!("the embedded store opens when Cosmos DB does not"),
        };
        let (publisher, consumer): (Arc<dyn Publisher>, Arc<dyn Consumer>) = match stream {
            StreamBackend::Embedded => {
                let store = embedded
                    .as_ref()
                    .unwrap_or_else(|| unreachable!("an embedded stream opens the embedded store"));
                (
                    store.clone(),
                    Arc::new(store.consumer(&settings.worker.consumer_group)),
                )
            }
            StreamBackend::EventHubs => {
                let leases: Leases = match (&cosmos, &embedded) {
                    (Some(cosmos), _) => Arc::new(cosmos.checkpoint_store()),
                    (None, Some(store)) => Arc::new(store.checkpoint_store()),
                    (None, None) => {
                        unreachable!("the embedded store opens when Cosmos DB does not")
                    }
                };
                (
                    Arc::new(EventHubsPublisher::open(&settings.eventhubs).await?),
                    Arc::new(EventHubsConsumer::new(
                        &settings.eventhubs,
                        &settings.worker.consumer_group,
                        leases,
                    )),
                )
            }
        };
        Ok(Self {
            publisher,
            consumer,
            status,
            dead_letters,
            idempotency,
            receipt_key,
            embedded,
            cosmos,
        })
    }

    /// Flushes what the backends buffer and logs what they spent.
    pub async fn close(&self) {
        if let Some(cosmos) = &self.cosmos {
            cosmos.close().await;
        }
    }
}
