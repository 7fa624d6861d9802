//! Azure Cosmos DB: the status store the gateway reads and the worker writes,
//! the checkpoint and ownership store of the Event Hubs processor, and the
//! dead-letter container.
//!
//! Containers (created when missing if `cosmos.create_if_missing`):
//! - `status` (partition key `/id`): one [`StatusDocument`] per delivery, its
//!   `_etag` the version conditional writes are made on.
//! - `leases` (partition key `/partitionKey` = `{namespace}/{event hub}/{consumer group}`):
//!   `ownership-{partition}` and `checkpoint-{partition}` documents; see [`checkpoints`].
//! - `deadletters` (partition key `/id` = `{partition}-{offset}`): poison events with
//!   the reason, the time and the raw payload (base64).
//! - `reservations` (partition key `/id` = delivery id, TTL on): what a retried
//!   POST is matched against; see [`reservations`].
//!
//! The SDK's own 429 retries are off: this adapter waits out a 429 after the
//! server's `x-ms-retry-after-ms` (or `cosmos.throttle_retry_ms`) and tries
//! again for as long as its caller waits, counting it, never treating it as
//! done. Every response's request charge is recorded ([`RequestUnits`]).
//!
//! [`StatusDocument`]: crate::status::StatusDocument

pub mod bulk;
pub mod checkpoints;
mod provision;
pub mod request_units;
mod reservations;
mod status;

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use azure_core::credentials::Secret;
use azure_data_cosmos::options::{
    OperationOptions, OperationOptionsBuilder, Region, RoutingStrategy,
    ThrottlingRetryOptionsBuilder,
};
use azure_data_cosmos::{
    AccountEndpoint, AccountReference, ContainerClient, CosmosClient, CosmosClientBuilder,
    CosmosError,
};
use base64::Engine;
use secrecy::ExposeSecret;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use self::bulk::{Bulk, BulkSettings};
pub use self::checkpoints::CosmosCheckpointStore;
use self::request_units::{Operation, RequestUnits};
use self::status::{StatusWrite, StatusWriter};
use crate::config::{CosmosAuth, CosmosSettings};
use crate::ports::{
    BoxError, DeadLetter, DeadLetterError, DeadLetterStore, ETag, IdempotencyStore, Precondition,
    Reservation, Reserved, StatusStore, StatusStoreError, Versioned,
};
use crate::status::StatusDocument;

/// Why the Cosmos DB store did not open.
#[derive(Debug, thiserror::Error)]
pub enum CosmosOpenError {
    #[error("cosmos.endpoint is not a Cosmos DB account endpoint: {0}")]
    Endpoint(String),
    #[error("no Entra ID credential could be built (cosmos.auth = \"entra\")")]
    Credential(#[source] BoxError),
    #[error("cannot reach the Cosmos DB account")]
    Connect(#[source] BoxError),
    #[error("{what} does not exist and cosmos.create_if_missing is false")]
    Missing { what: String },
    #[error("cannot create {what}")]
    Create {
        what: String,
        #[source]
        source: BoxError,
    },
}

/// The Cosmos DB store; cheap to share behind an [`Arc`].
pub struct CosmosStore {
    status: ContainerClient,
    dead_letters: ContainerClient,
    leases: ContainerClient,
    reservations: ContainerClient,
    units: Arc<RequestUnits>,
    writes: Bulk<StatusWrite, Result<ETag, StatusStoreError>>,
    dispatcher: Mutex<Option<JoinHandle<()>>>,
    shutdown: CancellationToken,
    throttle_retry: Duration,
}

impl std::fmt::Debug for CosmosStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CosmosStore")
            .field("request_units", &self.units)
            .finish_non_exhaustive()
    }
}

/// Operation options that turn the SDK's own 429 retries off: this adapter retries them itself.
fn no_throttle_retry() -> OperationOptions {
    OperationOptionsBuilder::new()
        .with_throttling_retry_options(
            ThrottlingRetryOptionsBuilder::new()
                .with_max_retry_count(0)
                .build(),
        )
        .build()
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
                super::entra::credential().map_err(|e| CosmosOpenError::Credential(Box::new(e)))?,
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
    async fn on_client(
        client: CosmosClient,
        settings: &CosmosSettings,
    ) -> Result<Arc<Self>, CosmosOpenError> {
        let containers = provision::ensure(&client, settings).await?;
        let units = Arc::new(RequestUnits::default());
        let shutdown = CancellationToken::new();
        let writer = StatusWriter::new(
            containers.status.clone(),
            Arc::clone(&units),
            settings.throttle_retry(),
        );
        let (writes, dispatcher) = Bulk::start(
            BulkSettings {
                max_items: settings.bulk_max_items,
                max_wait: settings.bulk_max_wait(),
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
            throttle_retry: settings.throttle_retry(),
        }))
    }

    /// The checkpoint and ownership store of the Event Hubs processor.
    pub fn checkpoint_store(&self) -> CosmosCheckpointStore {
        CosmosCheckpointStore::new(
            self.leases.clone(),
            Arc::clone(&self.units),
            self.throttle_retry,
        )
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

/// Runs `call` until it is not throttled: a 429 is counted, waited out
/// (`x-ms-retry-after-ms`, else `default_wait`) and tried again.
async fn retry_throttled<T, F, Fut>(
    units: &RequestUnits,
    default_wait: Duration,
    call: F,
) -> Result<T, CosmosError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, CosmosError>>,
{
    retry_throttled_up_to(units, default_wait, u32::MAX, call).await
}

/// Like [`retry_throttled`], but answers the 429 after waiting out `patience`
/// of them: a client's status read is better served a fast 503 than a wait.
async fn retry_throttled_up_to<T, F, Fut>(
    units: &RequestUnits,
    default_wait: Duration,
    patience: u32,
    mut call: F,
) -> Result<T, CosmosError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, CosmosError>>,
{
    let mut throttled = 0;
    loop {
        match call().await {
            Err(e) if e.status().is_throttled() && throttled < patience => {
                throttled += 1;
                units.throttled();
                let wait = e
                    .response()
                    .and_then(|r| r.headers().retry_after_ms)
                    .map_or(default_wait, Duration::from_millis);
                tracing::debug!(
                    wait_ms = wait.as_millis(),
                    "Cosmos DB throttled a request; waiting it out."
                );
                tokio::time::sleep(wait).await;
            }
            other => return other,
        }
    }
}

impl CosmosStore {
    /// Reads item `id` (its own partition key) from `container` with its ETag,
    /// waiting out at most `patience` 429s; `None` when there is no such item.
    async fn read_versioned<T: serde::de::DeserializeOwned>(
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

/// The request charge a response carried (`x-ms-request-charge`).
fn charge(headers: &azure_data_cosmos::models::ResponseHeaders) -> f64 {
    headers.request_charge().map_or(0.0, |c| c.value())
}

/// The request charge an error response carried, if any.
fn error_charge(error: &CosmosError) -> f64 {
    error
        .response()
        .and_then(|r| r.headers().request_charge)
        .map_or(0.0, |charge| charge.value())
}

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
impl IdempotencyStore for CosmosStore {
    async fn reserve(&self, reservation: &Reservation) -> Result<Reserved, StatusStoreError> {
        self.reserve_item(reservation).await
    }

    async fn release(&self, reservation: &Reservation) -> Result<(), StatusStoreError> {
        self.release_item(reservation).await
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

#[cfg(feature = "cosmos-emulator")]
pub mod emulator;
