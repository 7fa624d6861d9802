//! Adapters: the ports implemented on concrete backends, and [`Backends`],
//! which picks them from the settings.
//!
//! Each adapter keeps its backend's types inside its own module.

pub mod cosmos;
pub mod embedded;

use std::sync::Arc;

use secrecy::ExposeSecret;

use self::cosmos::{CosmosOpenError, CosmosStore};
use self::embedded::{EmbeddedStore, OpenError};
use crate::config::{Settings, StoreBackend, StreamBackend};
use crate::ports::{Consumer, DeadLetterStore, Publisher, StatusStore};

/// Why a backend did not open.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error(transparent)]
    Embedded(#[from] OpenError),
    #[error(transparent)]
    Cosmos(#[from] CosmosOpenError),
}

/// The ports a Skyport process runs on, as the settings choose them.
#[derive(Debug, Clone)]
pub struct Backends {
    pub publisher: Arc<dyn Publisher>,
    pub consumer: Arc<dyn Consumer>,
    pub status: Arc<dyn StatusStore>,
    pub dead_letters: Arc<dyn DeadLetterStore>,
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
        Self::open_with(settings, cosmos)
    }

    /// Opens the stream the settings name, with status and dead letters in
    /// `cosmos` when given (tests hand in one on the SDK's emulator).
    ///
    /// # Errors
    /// [`BackendError`] when the embedded store cannot be opened.
    pub fn open_with(
        settings: &Settings,
        cosmos: Option<Arc<CosmosStore>>,
    ) -> Result<Self, BackendError> {
        let store = match settings.stream.backend {
            StreamBackend::Embedded => {
                EmbeddedStore::open(&settings.embedded, settings.stream.partitions)?
            }
        };
        let receipt_key = settings.gateway.receipt_key.as_ref().map_or_else(
            || store.receipt_key().to_vec(),
            |key| key.expose_secret().as_bytes().to_vec(),
        );
        let (status, dead_letters): (Arc<dyn StatusStore>, Arc<dyn DeadLetterStore>) = match &cosmos
        {
            Some(cosmos) => (cosmos.clone(), cosmos.clone()),
            None => (store.clone(), store.clone()),
        };
        Ok(Self {
            publisher: store.clone(),
            consumer: Arc::new(store.consumer(&settings.worker.consumer_group)),
            status,
            dead_letters,
            receipt_key,
            embedded: Some(store),
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
