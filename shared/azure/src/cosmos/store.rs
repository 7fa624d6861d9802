//! The Cosmos DB store: opening it, and the ports it implements directly
//! (status, dead letters); reservations and leases have files of their own.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use azure_core::credentials::Secret;
use azure_data_cosmos::options::{Region, RoutingStrategy};
use azure_data_cosmos::{
    AccountEndpoint, AccountReference, ContainerClient, CosmosClient, CosmosClientBuilder,
    CosmosError,
};
use base64::Engine;
use secrecy::ExposeSecret;
use skyport_core::ports::{
    BoxError, DeadLetter, DeadLetterError, DeadLetterStore, ETag, Precondition, StatusStore,
    StatusStoreError, Versioned,
};
use skyport_core::status::StatusDocument;
use skyport_runtime::config::{CosmosAuth, CosmosSettings};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::bulk::{Bulk, BulkSettings};
use super::error::CosmosOpenError;
use super::provision;
use super::request_units::{Operation, RequestUnits};
use super::status_writes::{StatusBatches, StatusWrite};
use super::throttle::{
    charge, error_charge, no_throttle_retry, retry_throttled, retry_throttled_up_to,
};

/// The Cosmos DB store; cheap to share behind an [`Arc`].
pub struct CosmosStore {
    status: ContainerClient,
    dead_letters: ContainerClient,
    pub(crate) leases: ContainerClient,
    pub(crate) reservations: ContainerClient,
    pub(crate) units: Arc<RequestUnits>,
    writes: Bulk<StatusWrite, Result<ETag, StatusStoreError>>,
    dispatcher: Mutex<Option<JoinHandle<()>>>,
    shutdown: CancellationToken,
    pub(crate) throttle_retry: Duration,
}

impl std::fmt::Debug for CosmosStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CosmosStore")
            .field("request_units", &self.units)
            .finish_non_exhaustive()
    }
}

impl CosmosStore {
    /// Connects to the account in `settings`, provisions (or checks) the
    /// database and containers, and starts the bulk dispatcher.
    ///
    /// # Errors
    /// [`CosmosOpenError`] names the setting or the resource in the way.
    pub async fn open(settings: &CosmosSettings) -> Result<Arc<Self>, CosmosOpenError> {
        let endpoint = settings
            .endpoint
            .as_ref()
            .ok_or_else(|| CosmosOpenError::Endpoint("it is not set".into()))?;
        let endpoint: AccountEndpoint = endpoint
            .as_str()
            .parse()
            .map_err(|e: CosmosError| CosmosOpenError::Endpoint(e.to_string()))?;
        let account = match (settings.auth, &settings.key) {
            (CosmosAuth::Key, Some(key)) => AccountReference::with_authentication_key(
                endpoint,
                Secret::new(key.expose_secret().to_owned()),
            ),
            (CosmosAuth::Key, None) => {
                return Err(CosmosOpenError::Endpoint("cosmos.key is not set".into()));
            }
            (CosmosAuth::Entra, _) => AccountReference::with_credential(
                endpoint,
                crate::entra::credential().map_err(|e| CosmosOpenError::Credential(Box::new(e)))?,
            ),
        };
        let client = CosmosClientBuilder::new()
            .with_default_operation_options(no_throttle_retry())
            .build(
                account,
                RoutingStrategy::ProximityTo(Region::from(settings.region.clone())),
            )
            .await
            .map_err(|e| CosmosOpenError::Connect(Box::new(e)))?;
        Self::on_client(client, settings).await
    }

    /// Builds the store on a connected client.
    pub(crate) async fn on_client(
        client: CosmosClient,
        settings: &CosmosSettings,
    ) -> Result<Arc<Self>, CosmosOpenError> {
        let containers = provision::ensure(&client, settings).await?;
        let units = Arc::new(RequestUnits::default());
        let shutdown = CancellationToken::new();
        let writer = StatusBatches::new(
            containers.status.clone(),
            Arc::clone(&units),
            settings.throttle_retry_ms.duration(),
        );
        let (writes, dispatcher) = Bulk::start(
            BulkSettings {
                max_items: settings.bulk_max_items,
                max_wait: settings.bulk_max_wait_ms.duration(),
                max_in_flight: settings.bulk_max_in_flight,
            },
            Arc::new(writer),
            shutdown.clone(),
        );
        tracing::info!(database = %settings.database, "Opened the Cosmos DB store.");
        Ok(Arc::new(Self {
            status: containers.status,
            dead_letters: containers.dead_letters,
            leases: containers.leases,
            reservations: containers.reservations,
            units,
            writes,
            dispatcher: Mutex::new(Some(dispatcher)),
            shutdown,
            throttle_retry: settings.throttle_retry_ms.duration(),
        }))
    }

    /// The dead letters kept so far (in no particular order).
    ///
    /// # Errors
    /// [`DeadLetterError`] when the container cannot be read.
    pub async fn dead_letters(&self) -> Result<Vec<DeadLetter>, DeadLetterError> {
        #[derive(serde::Deserialize)]
        struct Stored {
            partition: u32,
            offset: u64,
            reason: String,
            #[serde(with = "time::serde::rfc3339")]
            at: time::OffsetDateTime,
            payload: String,
        }
        let unavailable = |e: BoxError| DeadLetterError::Unavailable(e);
        let stored: Vec<Stored> = retry_throttled(&self.units, self.throttle_retry, || async {
            let mut pages = self
                .dead_letters
                .query_items::<Stored>(
                    "SELECT * FROM c",
                    azure_data_cosmos::FeedScope::full_container(),
                    None,
                )
                .await?
                .into_pages();
            let mut stored = Vec::new();
            while let Some(page) = futures_util::TryStreamExt::try_next(&mut pages).await? {
                self.units.record(Operation::Query, charge(page.headers()));
                stored.extend(page.into_items());
            }
            Ok(stored)
        })
        .await
        .map_err(|e| unavailable(Box::new(e)))?;
        stored
            .into_iter()
            .map(|s| {
                let payload = base64::engine::general_purpose::STANDARD
                    .decode(&s.payload)
                    .map_err(|e| unavailable(Box::new(e)))?;
                Ok(DeadLetter {
                    partition: s.partition,
                    offset: s.offset,
                    reason: s.reason,
                    payload: payload.into(),
                    at: s.at,
                })
            })
            .collect()
    }

    /// Request units spent so far, by operation, and the 429s.
    pub fn request_units(&self) -> &RequestUnits {
        &self.units
    }

    /// Writes what is queued, stops the dispatcher and logs the request-unit summary.
    pub async fn close(&self) {
        self.shutdown.cancel();
        let dispatcher = self
            .dispatcher
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(dispatcher) = dispatcher
            && let Err(e) = dispatcher.await
        {
            tracing::error!(error = %e, "The Cosmos DB bulk dispatcher failed.");
        }
        tracing::info!(request_units = %self.units, "Cosmos DB request units spent.");
    }
}

impl CosmosStore {
    /// Reads item `id` (its own partition key) from `container` with its ETag,
    /// waiting out at most `patience` 429s; `None` when there is no such item.
    pub(crate) async fn read_versioned<T: serde::de::DeserializeOwned>(
        &self,
        container: &ContainerClient,
        id: &str,
        patience: u32,
    ) -> Result<Option<(T, azure_core::http::Etag)>, StatusStoreError> {
        let read = retry_throttled_up_to(&self.units, self.throttle_retry, patience, || {
            container.read_item(id.to_owned(), id, None)
        })
        .await;
        let response = match read {
            Ok(response) => response,
            Err(e) if e.status().status_code() == azure_core::http::StatusCode::NotFound => {
                self.units.record(Operation::Read, error_charge(&e));
                return Ok(None);
            }
            Err(e) => {
                if e.status().is_throttled() {
                    self.units.throttled();
                }
                return Err(StatusStoreError::Unavailable(Box::new(e)));
            }
        };
        self.units
            .record(Operation::Read, charge(response.headers()));
        let etag = response.headers().etag().cloned();
        let item: T = response
            .into_model()
            .map_err(|e| StatusStoreError::Corrupt {
                id: id.to_owned(),
                source: Box::new(e),
            })?;
        let etag = etag.ok_or_else(|| StatusStoreError::Corrupt {
            id: id.to_owned(),
            source: "the read carried no ETag".into(),
        })?;
        Ok(Some((item, etag)))
    }
}

/// How many 429s a status read waits out before answering unavailable.
const READ_PATIENCE: u32 = 2;

#[async_trait]
impl StatusStore for CosmosStore {
    async fn get(&self, id: &str) -> Result<Option<Versioned>, StatusStoreError> {
        let read = self.read_versioned(&self.status, id, READ_PATIENCE).await?;
        Ok(read.map(|(document, etag)| Versioned {
            document,
            etag: ETag(etag.to_string()),
        }))
    }

    async fn put(
        &self,
        document: &StatusDocument,
        condition: Precondition,
    ) -> Result<ETag, StatusStoreError> {
        let write = StatusWrite {
            document: document.clone(),
            condition,
        };
        self.writes
            .submit(document.id.clone(), write)
            .await
            .map_err(|e| StatusStoreError::Unavailable(Box::new(e)))?
    }

    async fn ready(&self) -> bool {
        !self.shutdown.is_cancelled()
    }
}

#[async_trait]
impl DeadLetterStore for CosmosStore {
    async fn put(&self, letter: DeadLetter) -> Result<(), DeadLetterError> {
        let id = format!("{}-{}", letter.partition, letter.offset);
        let document = serde_json::json!({
            "id": id,
            "partition": letter.partition,
            "offset": letter.offset,
            "reason": letter.reason,
            "at": letter.at.format(&time::format_description::well_known::Rfc3339).unwrap_or_default(),
            "payload": base64::engine::general_purpose::STANDARD.encode(&letter.payload),
        });
        let response = retry_throttled(&self.units, self.throttle_retry, || {
            self.dead_letters
                .upsert_item(id.clone(), &id, &document, None)
        })
        .await
        .map_err(|e| DeadLetterError::Unavailable(Box::new(e)))?;
        self.units
            .record(Operation::Write, charge(response.headers()));
        Ok(())
    }
}
