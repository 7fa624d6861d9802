//! Adapters: the ports implemented on concrete backends, and [`Backends`],
//! which picks them from the settings.
//!
//! Each adapter keeps its backend's types inside its own module.

pub mod cosmos;
pub mod embedded;

use std::sync::Arc;

use secrecy::ExposeSecret;

use self::embedded::{EmbeddedStore, OpenError};
use crate::config::{Settings, StoreBackend, StreamBackend};
use crate::ports::{Consumer, DeadLetterStore, Publisher, StatusStore};

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
}

impl Backends {
    /// Opens the stream and the store the settings name.
    ///
    /// # Errors
    /// [`OpenError`] when a backend cannot be opened.
    pub fn open(settings: &Settings) -> Result<Self, OpenError> {
        match (settings.stream.backend, settings.store.backend) {
            (StreamBackend::Embedded, StoreBackend::Embedded) => {
                let store = EmbeddedStore::open(&settings.embedded, settings.stream.partitions)?;
                let receipt_key = settings.gateway.receipt_key.as_ref().map_or_else(
                    || store.receipt_key().to_vec(),
                    |key| key.expose_secret().as_bytes().to_vec(),
                );
                Ok(Self {
                    publisher: store.clone(),
                    consumer: Arc::new(store.consumer(&settings.worker.consumer_group)),
                    status: store.clone(),
                    dead_letters: store.clone(),
                    receipt_key,
                    embedded: Some(store),
                })
            }
        }
    }
}
