//! Skyport's stream on Kafka: a cluster, or Event Hubs' Kafka endpoint,
//! behind the same ports as the embedded log and Event Hubs. The
//! [`KafkaPublisher`] is an idempotent producer that answers once the
//! brokers have acknowledged a record; the [`KafkaConsumer`] is a member of
//! the worker's consumer group that hands each assigned partition to the
//! worker's partition loop and commits what it acknowledges. With
//! `kafka.auth = "entra"` both present a [`BearerToken`] that a task keeps
//! fresh.

mod client;
mod consumer;
mod publisher;
mod reader;
pub mod token;

pub use self::client::client_config;
pub use self::consumer::KafkaConsumer;
pub use self::publisher::KafkaPublisher;
pub use self::token::BearerToken;

use skyport_runtime::config::ConfigError;

/// Record headers beside the payload (which carries them too).
pub mod headers {
    pub const CONTENT_TYPE: &str = "content-type";
    pub const SCHEMA_VERSION: &str = "schemaVersion";
    pub const TRACEPARENT: &str = "traceparent";
    pub const IDEMPOTENCY_KEY: &str = "idempotencyKey";
}

/// Why the Kafka clients could not start.
#[derive(Debug, thiserror::Error)]
pub enum KafkaOpenError {
    /// A setting librdkafka refuses, named by its key (exit 64: the
    /// [`ConfigError`] is this error's source, where the binaries look for it).
    #[error("{0}")]
    Config(#[from] ConfigError),
    /// No OAUTHBEARER token could be had for `kafka.auth = "entra"`.
    #[error("cannot get an Entra ID token for Kafka (kafka.auth = \"entra\")")]
    Token(#[source] token::TokenError),
    #[error("cannot create the Kafka client")]
    Client(#[source] rdkafka::error::KafkaError),
    #[error("cannot read the metadata of Kafka topic {topic} (are kafka.brokers reachable?)")]
    Metadata {
        topic: String,
        #[source]
        source: rdkafka::error::KafkaError,
    },
    /// A configured topic the brokers do not have, and the key that names it.
    #[error("Kafka topic {0} does not exist or has no partitions ({1})")]
    NoTopic(String, &'static str),
    #[error("cannot start the Kafka consumer's poll thread")]
    Thread(#[source] std::io::Error),
    #[error("the Kafka client's start was interrupted")]
    Task(#[from] tokio::task::JoinError),
}
