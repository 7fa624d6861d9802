//! How to reach an Event Hubs namespace: its name, a credential, where to
//! dial, and the SDK clients opened on it.

use std::sync::Arc;

use azure_core::credentials::TokenCredential;
use azure_messaging_eventhubs::{ConsumerClient, ProducerClient, RetryOptions};
use secrecy::ExposeSecret;
use skyport_core::ports::BoxError;
use skyport_runtime::config::{
    ConnectionString, ConnectionStringError, EventHubsAuth, EventHubsSettings,
};

use super::sas::SasCredential;

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
pub(crate) struct Namespace {
    pub(crate) name: String,
    credential: Arc<dyn TokenCredential>,
    custom_endpoint: Option<String>,
}

impl Namespace {
    pub(crate) fn new(settings: &EventHubsSettings) -> Result<Self, EventHubsOpenError> {
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
                crate::entra::credential()
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

    pub(crate) fn credential(&self) -> Arc<dyn TokenCredential> {
        Arc::clone(&self.credential)
    }

    /// Where to dial instead of the namespace (`amqp://HOST:PORT` dials plain TCP).
    pub(crate) fn custom_endpoint(&self) -> Option<&str> {
        self.custom_endpoint.as_deref()
    }

    pub(crate) fn open_error(&self, hub: &str, source: impl Into<BoxError>) -> EventHubsOpenError {
        EventHubsOpenError::Hub {
            namespace: self.name.clone(),
            hub: hub.to_owned(),
            source: source.into(),
        }
    }

    pub(crate) async fn producer(&self, hub: &str) -> Result<ProducerClient, EventHubsOpenError> {
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
    pub(crate) async fn consumer(
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
pub(crate) fn sorted_partition_ids(
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
