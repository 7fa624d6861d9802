//! Azure Event Hubs: the stream, sharded over one or more hubs of a namespace.
//!
//! - [`EventHubsPublisher`]: a key goes to hub `h mod n` and to partition
//!   `(h div n) mod p` inside it ([`crate::partitioning::shard_for`]). Each
//!   (hub, partition) has one sender task that batches what is queued
//!   (`linger_ms`, `max_batch_bytes`, `max_batch_events`), sends one batch at a
//!   time (so a key's events keep their order) and answers each request when
//!   its own batch is acknowledged. A failed or timed-out send fails exactly
//!   the requests in that batch, and the hub's producer is replaced by one on
//!   a new connection (the SDK keeps a dropped connection and fails every send
//!   on it).
//! - [`EventHubsConsumer`]: one `EventProcessor` per hub (Balanced strategy)
//!   on an ownership and checkpoint store (Cosmos DB, or the embedded store on
//!   one machine). The processors and their partition loops run on a
//!   `LocalSet` on a thread of their own, because the SDK's event streams are
//!   not `Send`; each partition reaches the worker as a
//!   [`PartitionReader`](crate::ports::PartitionReader) fed by a bounded channel.
//!   A processor whose `run` fails is rebuilt on a new connection after a
//!   back-off (the SDK does not reconnect a dropped one). A partition
//!   whose stream ends (taken over: `ConsumerDisconnected`, or a broken link)
//!   is reported to the worker as revoked.
//!
//! The envelope travels as AMQP properties: content type
//! [`CONTENT_TYPE`](crate::event::CONTENT_TYPE), and the application properties
//! `schemaVersion`, `traceparent` and `idempotencyKey` (when known).
//!
//! Partitions are numbered for the worker across hubs: hub `i`'s partition `j`
//! is `first(i) + j`, where `first(i)` adds up the partition counts of the
//! hubs listed before it. An event's offset is its sequence number.

mod consumer;
mod publisher;
mod sas;

use std::sync::Arc;

use azure_core::credentials::TokenCredential;
use azure_messaging_eventhubs::{ConsumerClient, ProducerClient, RetryOptions};
use secrecy::ExposeSecret;

pub use self::consumer::EventHubsConsumer;
pub use self::publisher::{EventHubsPublisher, PublishStats};
pub use self::sas::{ConnectionString, ConnectionStringError, SasCredential};
use crate::config::{EventHubsAuth, EventHubsSettings};
use crate::ports::BoxError;

/// Where the processors keep ownership claims and checkpoints.
pub type Leases = Arc<dyn azure_messaging_eventhubs::CheckpointStore + Send + Sync>;

/// Application property with the envelope's schema version.
pub const SCHEMA_VERSION_PROPERTY: &str = "schemaVersion";
/// Application property with the W3C trace context.
pub const TRACEPARENT_PROPERTY: &str = "traceparent";
/// Application property with the request's idempotency key.
pub const IDEMPOTENCY_KEY_PROPERTY: &str = "idempotencyKey";

/// Why the Event Hubs stream did not open.
#[derive(Debug, thiserror::Error)]
pub enum EventHubsOpenError {
    #[error("eventhubs.connection_string {0}")]
    ConnectionString(#[from] ConnectionStringError),
    #[error("eventhubs.connection_string is not set (eventhubs.auth = \"connection_string\")")]
    MissingConnectionString,
    #[error("eventhubs.namespace is not set")]
    MissingNamespace,
    #[error("no Entra ID credential could be built (eventhubs.auth = \"entra\")")]
    Credential(#[source] BoxError),
    #[error("cannot open event hub {hub} in {namespace}")]
    Hub {
        namespace: String,
        hub: String,
        #[source]
        source: BoxError,
    },
    #[error("event hub {hub} reports no partitions")]
    NoPartitions { hub: String },
}

/// How to reach the namespace: its name, a credential, and where to dial.
#[derive(Debug, Clone)]
struct Namespace {
    name: String,
    credential: Arc<dyn TokenCredential>,
    custom_endpoint: Option<String>,
}

impl Namespace {
    fn new(settings: &EventHubsSettings) -> Result<Self, EventHubsOpenError> {
        let (name, credential): (String, Arc<dyn TokenCredential>) = match settings.auth {
            EventHubsAuth::ConnectionString => {
                let text = settings
                    .connection_string
                    .as_ref()
                    .ok_or(EventHubsOpenError::MissingConnectionString)?;
                let parsed = ConnectionString::parse(text.expose_secret())?;
                let name = settings
                    .namespace
                    .clone()
                    .unwrap_or_else(|| parsed.namespace.clone());
                (name, Arc::new(SasCredential::new(&parsed)))
            }
            EventHubsAuth::Entra => (
                settings
                    .namespace
                    .clone()
                    .ok_or(EventHubsOpenError::MissingNamespace)?,
                super::entra::credential()
                    .map_err(|e| EventHubsOpenError::Credential(Box::new(e)))?,
            ),
        };
        Ok(Self {
            name,
            credential,
            custom_endpoint: settings.custom_endpoint.as_ref().map(ToString::to_string),
        })
    }

    /// The SDK retries a failed operation a few times quickly; longer outages
    /// are ours to handle (a 503 for the request, a restart for the processor).
    fn retry_options() -> RetryOptions {
        RetryOptions {
            initial_delay: azure_core::time::Duration::milliseconds(100),
            max_delay: azure_core::time::Duration::seconds(2),
            max_total_elapsed: azure_core::time::Duration::seconds(10),
            max_retries: 3,
        }
    }

    fn open_error(&self, hub: &str, source: impl Into<BoxError>) -> EventHubsOpenError {
        EventHubsOpenError::Hub {
            namespace: self.name.clone(),
            hub: hub.to_owned(),
            source: source.into(),
        }
    }

    async fn producer(&self, hub: &str) -> Result<ProducerClient, EventHubsOpenError> {
        let mut builder = ProducerClient::builder()
            .with_application_id("skyport".into())
            .with_retry_options(Self::retry_options());
        if let Some(endpoint) = &self.custom_endpoint {
            builder = builder.with_custom_endpoint(endpoint.clone());
        }
        builder
            .open(&self.name, hub, Arc::clone(&self.credential))
            .await
            .map_err(|e| self.open_error(hub, e))
    }

    /// A consumer client whose connection is named `owner`: the SDK's
    /// processor claims partitions under its connection's name.
    async fn consumer(
        &self,
        hub: &str,
        consumer_group: &str,
        owner: &str,
    ) -> Result<ConsumerClient, EventHubsOpenError> {
        let mut builder = ConsumerClient::builder()
            .with_application_id(owner.to_owned())
            .with_instance_id(owner.to_owned())
            .with_consumer_group(consumer_group.to_owned())
            .with_retry_options(Self::retry_options());
        if let Some(endpoint) = &self.custom_endpoint {
            builder = builder.with_custom_endpoint(endpoint.clone());
        }
        builder
            .open(&self.name, hub.to_owned(), Arc::clone(&self.credential))
            .await
            .map_err(|e| self.open_error(hub, e))
    }
}

/// A hub's partition ids in numeric order (the order the service numbers them in).
fn sorted_partition_ids(
    hub: &str,
    mut ids: Vec<String>,
) -> Result<Vec<String>, EventHubsOpenError> {
    if ids.is_empty() {
        return Err(EventHubsOpenError::NoPartitions {
            hub: hub.to_owned(),
        });
    }
    ids.sort_by(|a, b| {
        (a.parse::<u64>().ok(), a.as_str()).cmp(&(b.parse::<u64>().ok(), b.as_str()))
    });
    Ok(ids)
}
