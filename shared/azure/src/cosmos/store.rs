//! The Cosmos DB store: opening it, and the ports it implements directly
//! (status, dead letters); reservations, leases and listing have files of
//! their own.

use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use azure_core::credentials::Secret;
use azure_data_cosmos::options::{
    ItemReadOptions, ItemWriteOptions, QueryOptions, Region, RoutingStrategy,
};
use azure_data_cosmos::{
    AccountEndpoint, AccountReference, ContainerClient, CosmosClient, CosmosClientBuilder,
    CosmosError, FeedScope, Query,
};
use base64::Engine;
use secrecy::ExposeSecret;
use skyport_core::ports::{
    BoxError, ChangeDeadLetter, DeadLetter, DeadLetterError, DeadLetterStore, ETag, ListPage,
    ListQuery, Precondition, StatusStore, StatusStoreError, Versioned,
};
use skyport_core::status::StatusDocument;
use skyport_runtime::config::{CosmosAuth, CosmosSettings, StoreSettings, Work};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::bulk::{Bulk, BulkSettings};
use super::charge::Paged;
use super::control::{Control, GroupReport, Targets};
use super::error::CosmosOpenError;
use super::provision;
use super::request_units::{Operation, RequestUnits};
use super::status_writes::{StatusBatches, StatusWrite};
use super::throttle::{Requests, no_throttle_retry};
use super::timer_writes::TimerWrites;

/// The Cosmos DB store; cheap to share behind an [`Arc`].
pub struct CosmosStore {
    pub(crate) status: ContainerClient,
    pub(crate) dead_letters: ContainerClient,
    pub(crate) leases: ContainerClient,
    pub(crate) reservations: ContainerClient,
    pub(crate) timers: ContainerClient,
    /// `cosmos.timer_shards`.
    pub(crate) timer_shards: u32,
    pub(crate) requests: Arc<Requests>,
    /// `store.dead_letter_retention_s`: the `ttl` of every dead letter,
    /// counted by Cosmos DB from the letter's last write.
    pub(super) dead_letter_ttl: u64,
    writes: Bulk<StatusWrite, Result<ETag, StatusStoreError>>,
    dispatcher: Mutex<Option<JoinHandle<()>>>,
    shutdown: CancellationToken,
}

impl std::fmt::Debug for CosmosStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CosmosStore")
            .field("request_units", &self.requests.units)
            .finish_non_exhaustive()
    }
}

impl CosmosStore {
    /// Connects to the account in `settings`, provisions (or checks) the
    /// database and containers, and starts the bulk dispatcher. Settled status
    /// documents and dead letters expire after `store`'s retentions.
    ///
    /// # Errors
    /// [`CosmosOpenError`] names the setting or the resource in the way.
    pub async fn open(
        settings: &CosmosSettings,
        store: &StoreSettings,
    ) -> Result<Arc<Self>, CosmosOpenError> {
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
        Self::on_client(client, settings, store).await
    }

    /// Builds the store on a connected client.
    pub(crate) async fn on_client(
        client: CosmosClient,
        settings: &CosmosSettings,
        store: &StoreSettings,
    ) -> Result<Arc<Self>, CosmosOpenError> {
        let containers = provision::ensure(&client, settings).await?;
        let units = Arc::new(RequestUnits::default());
        let targets = Targets {
            client: &client,
            containers: [
                (settings.status_container.as_str(), &containers.status),
                (
                    settings.dead_letter_container.as_str(),
                    &containers.dead_letters,
                ),
                (
                    settings.reservations_container.as_str(),
                    &containers.reservations,
                ),
                (settings.leases_container.as_str(), &containers.leases),
                (settings.timers_container.as_str(), &containers.timers),
            ]
            .into(),
            control: containers.control.as_ref(),
        };
        let control = Control::start(settings, &targets, &units).await?;
        let requests = Arc::new(Requests::new(
            units,
            settings.throttle_retry_ms.duration(),
            control,
        ));
        let shutdown = CancellationToken::new();
        let writer = StatusBatches::new(
            containers.status.clone(),
            Arc::clone(&requests),
            store.status_retention_s.count(),
            TimerWrites::new(
                containers.timers.clone(),
                Arc::clone(&requests),
                settings.timer_shards,
                store.status_retention_s.count(),
            ),
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
            timers: containers.timers,
            timer_shards: settings.timer_shards,
            requests,
            dead_letter_ttl: store.dead_letter_retention_s.count(),
            writes,
            dispatcher: Mutex::new(Some(dispatcher)),
            shutdown,
        }))
    }

    /// At most `limit` dead letters of events after the one at `after`, by
    /// id (`{partition}-{offset}`, in the order of strings): a query with
    /// `TOP` and `ORDER BY c.id` across partitions, so that however many
    /// there are a page reads at most `limit`. After [`READ_PATIENCE`] 429s
    /// it answers unavailable: an operator asks again.
    async fn dead_letters_after(
        &self,
        after: Option<(u32, u64)>,
        limit: usize,
    ) -> Result<Vec<DeadLetter>, DeadLetterError> {
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
        let after = after.map(|(partition, offset)| event_letter_id(partition, offset));
        let query = Query::from(format!(
            "SELECT TOP {limit} * FROM c WHERE NOT IS_DEFINED(c.kind) AND c.id > @after \
             ORDER BY c.id"
        ))
        .with_parameter("@after", after.unwrap_or_default())
        .map_err(|e| unavailable(Box::new(e)))?;
        let stored: Paged<Stored> = self
            .requests
            .run(
                Work::DeadLetters,
                Operation::Query,
                READ_PATIENCE,
                |options| async {
                    let options = QueryOptions::default().with_operation_options(options);
                    let query = self
                        .dead_letters
                        .query_items::<Stored>(
                            query.clone(),
                            FeedScope::full_container(),
                            Some(options),
                        )
                        .await?;
                    Paged::read_all(query).await
                },
            )
            .await
            .map_err(|e| unavailable(e.into_box()))?;
        stored
            .items
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
        &self.requests.units
    }

    /// The throughput control groups, as this process sees them now.
    pub fn throughput_groups(&self) -> Vec<GroupReport> {
        self.requests.control().reports()
    }

    /// Stops this store's throughput control as a killed process's stops:
    /// its global groups' items stay behind until they expire.
    #[cfg(feature = "cosmos-emulator")]
    pub fn halt_throughput_control(&self) {
        self.requests.control().halt();
    }

    /// Writes what is queued, stops the dispatcher, leaves the global
    /// throughput control groups and logs the request-unit summary.
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
        self.requests.control().close().await;
        tracing::info!(request_units = %self.requests.units, "Cosmos DB request units spent.");
    }
}

impl CosmosStore {
    /// Reads item `id` (its own partition key) from `container` with its ETag,
    /// for `work`, waiting out at most `patience` 429s; `None` when there is
    /// no such item.
    pub(crate) async fn read_versioned<T: serde::de::DeserializeOwned>(
        &self,
        container: &ContainerClient,
        id: &str,
        work: Work,
        patience: u32,
    ) -> Result<Option<(T, azure_core::http::Etag)>, StatusStoreError> {
        let read = self
            .requests
            .run(work, Operation::Read, patience, |options| {
                let options = ItemReadOptions::default().with_operation_options(options);
                container.read_item(id.to_owned(), id, Some(options))
            })
            .await;
        let response = match read {
            Ok(response) => response,
            Err(e) if e.status_code() == azure_core::http::StatusCode::NotFound => {
                return Ok(None);
            }
            Err(e) => return Err(StatusStoreError::Unavailable(e.into_box())),
        };
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

/// How many 429s a status read (or a listing's query) waits out before
/// answering unavailable.
pub(super) const READ_PATIENCE: u32 = 2;

impl CosmosStore {
    async fn get_status(
        &self,
        id: &str,
        work: Work,
    ) -> Result<Option<Versioned>, StatusStoreError> {
        let read = self
            .read_versioned(&self.status, id, work, READ_PATIENCE)
            .await?;
        Ok(read.map(|(document, etag)| Versioned {
            document,
            etag: ETag(etag.to_string()),
        }))
    }

    /// The status store as the worker uses it: its reads, made to decide its
    /// writes, count as [`Work::StatusWrites`] (held over budget, never
    /// refused), where the store itself serves a client's status reads
    /// ([`Work::StatusReads`]).
    pub fn for_worker(self: &Arc<Self>) -> Arc<dyn StatusStore> {
        Arc::new(WorkerStatus(Arc::clone(self)))
    }
}

/// See [`CosmosStore::for_worker`].
#[derive(Debug)]
struct WorkerStatus(Arc<CosmosStore>);

#[async_trait]
impl StatusStore for WorkerStatus {
    async fn get(&self, id: &str) -> Result<Option<Versioned>, StatusStoreError> {
        self.0.get_status(id, Work::StatusWrites).await
    }

    async fn put(
        &self,
        document: &StatusDocument,
        condition: Precondition,
    ) -> Result<ETag, StatusStoreError> {
        StatusStore::put(&*self.0, document, condition).await
    }

    async fn list(&self, query: &ListQuery) -> Result<ListPage, StatusStoreError> {
        StatusStore::list(&*self.0, query).await
    }

    async fn ready(&self) -> bool {
        self.0.ready().await
    }
}

#[async_trait]
impl StatusStore for CosmosStore {
    async fn get(&self, id: &str) -> Result<Option<Versioned>, StatusStoreError> {
        self.get_status(id, Work::StatusReads).await
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

    /// A query on the status container: a delivery is listed as soon as its
    /// status is written.
    async fn list(&self, query: &ListQuery) -> Result<ListPage, StatusStoreError> {
        self.list_documents(query).await
    }

    async fn ready(&self) -> bool {
        !self.shutdown.is_cancelled()
    }
}

impl CosmosStore {
    /// Keeps `document` as the dead letter `id` (replacing one kept before).
    pub(super) async fn upsert_dead_letter(
        &self,
        id: String,
        document: &serde_json::Value,
    ) -> Result<(), DeadLetterError> {
        self.requests
            .run(Work::DeadLetters, Operation::Write, u32::MAX, |options| {
                let options = ItemWriteOptions::default().with_operation_options(options);
                self.dead_letters
                    .upsert_item(id.clone(), &id, document, Some(options))
            })
            .await
            .map_err(|e| DeadLetterError::Unavailable(e.into_box()))?;
        Ok(())
    }
}

/// The id of the dead letter of the event at `partition` and `offset`.
fn event_letter_id(partition: u32, offset: u64) -> String {
    format!("{partition}-{offset}")
}

#[async_trait]
impl DeadLetterStore for CosmosStore {
    async fn put(&self, letter: DeadLetter) -> Result<(), DeadLetterError> {
        let id = event_letter_id(letter.partition, letter.offset);
        let document = serde_json::json!({
            "id": id,
            "partition": letter.partition,
            "offset": letter.offset,
            "reason": letter.reason,
            "at": letter.at.format(&time::format_description::well_known::Rfc3339).unwrap_or_default(),
            "payload": base64::engine::general_purpose::STANDARD.encode(&letter.payload),
            "ttl": self.dead_letter_ttl,
        });
        self.upsert_dead_letter(id, &document).await
    }

    async fn put_change(&self, letter: ChangeDeadLetter) -> Result<(), DeadLetterError> {
        self.put_change_dead_letter(letter).await
    }

    async fn events(
        &self,
        after: Option<(u32, u64)>,
        limit: usize,
    ) -> Result<Vec<DeadLetter>, DeadLetterError> {
        self.dead_letters_after(after, limit).await
    }

    async fn remove(&self, partition: u32, offset: u64) -> Result<(), DeadLetterError> {
        let id = event_letter_id(partition, offset);
        let deleted = self
            .requests
            .run(Work::DeadLetters, Operation::Delete, u32::MAX, |options| {
                let options = ItemWriteOptions::default().with_operation_options(options);
                self.dead_letters
                    .delete_item(id.clone(), &id, Some(options))
            })
            .await;
        match deleted {
            Ok(_) => Ok(()),
            Err(e) if e.status_code() == azure_core::http::StatusCode::NotFound => Ok(()),
            Err(e) => Err(DeadLetterError::Unavailable(e.into_box())),
        }
    }

    async fn changes(
        &self,
        processor: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<ChangeDeadLetter>, DeadLetterError> {
        self.change_dead_letters(processor, after, limit).await
    }
}

#[cfg(all(test, feature = "cosmos-emulator"))]
mod emulator_tests;
