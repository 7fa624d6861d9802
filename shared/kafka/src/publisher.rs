//! The Kafka publisher: an idempotent producer (`acks=all`), each event sent
//! to the partition Skyport's own key mapping chooses, the request answered
//! once the brokers have acknowledged its record.
//!
//! While no broker is reachable, requests are refused at once (503) instead
//! of waiting out the delivery timeout; the producer's statistics tell when
//! a broker is back. A producer that cannot go on — a fatal error, a state
//! the brokers no longer know (fenced, out of sequence), or records left
//! unacknowledged past the delivery timeout while a broker is up — is
//! replaced by a new one.
//!
//! A record that failed is [`PublishError::Unavailable`] (certainly not
//! written: the request's name may be freed) only when it never reached
//! librdkafka (refused at once, or no broker up), or when a broker refused
//! its content, as it refuses every attempt. Any other failure may come
//! after librdkafka sent the record (its own `message.timeout.ms` fires on
//! records in flight too, and a retry's error does not tell what became of
//! the attempt before it): [`PublishError::Unknown`]. librdkafka keeps a
//! per-record persistence status for exactly this (`rd_kafka_message_status`),
//! but rdkafka 0.39 exposes it only through its unsafe FFI.

use std::error::Error;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use rdkafka::ClientConfig;
use rdkafka::client::{ClientContext, OAuthToken};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::statistics::Statistics;
use skyport_core::event::content_type;
use skyport_core::partitioning::{partition_for, shard_for};
use skyport_core::ports::{Lane, OutboundEvent, Position, PublishError, Publisher};
use skyport_runtime::config::KafkaSettings;

use crate::client::{Topic, Topics, client_config, creation_error};
use crate::token::{BearerToken, Login};
use crate::{KafkaOpenError, headers};

/// How often the producer reports its brokers' states.
const STATISTICS_INTERVAL: Duration = Duration::from_secs(1);

/// What the producer's callbacks tell the publisher.
#[derive(Debug, Default)]
struct Health {
    /// No broker is up: the latest statistics showed none, or librdkafka
    /// reported every broker down since.
    brokers_down: AtomicBool,
}

#[derive(Debug, Clone)]
struct ProducerContext {
    health: Arc<Health>,
    login: Login,
}

impl ClientContext for ProducerContext {
    const ENABLE_REFRESH_OAUTH_TOKEN: bool = true;

    fn generate_oauth_token(&self, _config: Option<&str>) -> Result<OAuthToken, Box<dyn Error>> {
        self.login.oauth_token()
    }

    fn stats(&self, statistics: Statistics) {
        // librdkafka's own internal and logical brokers are always "UP".
        let up = statistics.brokers.values().any(|broker| {
            broker.state == "UP" && matches!(broker.source.as_str(), "configured" | "learned")
        });
        self.health.brokers_down.store(!up, Ordering::Relaxed);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        if error.rdkafka_error_code() == Some(RDKafkaErrorCode::AllBrokersDown) {
            self.health.brokers_down.store(true, Ordering::Relaxed);
        }
        tracing::warn!(%error, reason, "The Kafka producer reported an error.");
    }
}

type KafkaProducer = FutureProducer<ProducerContext>;

/// Publishes to Kafka, sharded over the configured topics; the expedited
/// lane's events to `kafka.expedited_topic` when it is set.
pub struct KafkaPublisher {
    config: ClientConfig,
    context: ProducerContext,
    producer: RwLock<Arc<KafkaProducer>>,
    /// Held while a failed producer is being replaced, so only one caller does it.
    rebuilding: Mutex<()>,
    topics: Vec<Topic>,
    expedited: Option<Topic>,
    delivery_timeout: Duration,
    rebuilt: AtomicU64,
}

impl std::fmt::Debug for KafkaPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaPublisher")
            .field("topics", &self.topics)
            .field("expedited", &self.expedited)
            .field("rebuilt", &self.rebuilt)
            .finish_non_exhaustive()
    }
}

impl KafkaPublisher {
    /// Creates the producer and reads the topics' partitions.
    ///
    /// # Errors
    /// [`KafkaOpenError`]: a property librdkafka refuses (naming its key), a
    /// topic that does not exist, or brokers that do not answer within
    /// `kafka.delivery_timeout_ms`.
    pub async fn open(settings: &KafkaSettings) -> Result<Self, KafkaOpenError> {
        Self::open_with(settings, None).await
    }

    /// [`KafkaPublisher::open`] presenting `token` (`kafka.auth = "entra"`).
    ///
    /// # Errors
    /// As [`KafkaPublisher::open`], and `kafka.auth` when it is entra and
    /// `token` is `None`.
    pub async fn open_with(
        settings: &KafkaSettings,
        token: Option<BearerToken>,
    ) -> Result<Self, KafkaOpenError> {
        let login = Login::new(settings, token)?;
        let mut config = client_config(settings);
        config
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("linger.ms", settings.linger_ms.count().to_string())
            .set("batch.size", settings.batch_size.to_string())
            .set(
                "message.timeout.ms",
                settings.delivery_timeout_ms.count().to_string(),
            )
            .set(
                "statistics.interval.ms",
                STATISTICS_INTERVAL.as_millis().to_string(),
            );
        let context = ProducerContext {
            health: Arc::new(Health::default()),
            login,
        };
        let producer: KafkaProducer = config
            .create_with_context(context.clone())
            .map_err(|e| creation_error(settings, e))?;
        let names = settings.lane_topics();
        let timeout = settings.delivery_timeout_ms.duration();
        let (producer, topics) = tokio::task::spawn_blocking(move || {
            let topics = Topics::fetch(producer.client(), &names, timeout);
            (producer, topics)
        })
        .await?;
        let topics = topics?;
        for topic in &topics.0 {
            tracing::info!(topic = %topic.name, partitions = topic.partitions, lane = topic.lane.as_str(), "Publishing to the Kafka topic.");
        }
        Ok(Self {
            config,
            context,
            producer: RwLock::new(Arc::new(producer)),
            rebuilding: Mutex::new(()),
            topics: topics.of(Lane::Normal),
            expedited: topics.of(Lane::Expedited).pop(),
            delivery_timeout: settings.delivery_timeout_ms.duration(),
            rebuilt: AtomicU64::new(0),
        })
    }

    /// How many times a failed producer has been replaced.
    pub fn rebuilt(&self) -> u64 {
        self.rebuilt.load(Ordering::Relaxed)
    }

    fn current(&self) -> Arc<KafkaProducer> {
        Arc::clone(&self.producer.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// Replaces `failed` with a new producer, unless another caller already has.
    fn rebuild(&self, failed: &Arc<KafkaProducer>) {
        let _one = self
            .rebuilding
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if !Arc::ptr_eq(&self.current(), failed) {
            return;
        }
        match self
            .config
            .create_with_context::<_, KafkaProducer>(self.context.clone())
        {
            Ok(producer) => {
                *self
                    .producer
                    .write()
                    .unwrap_or_else(PoisonError::into_inner) = Arc::new(producer);
                self.rebuilt.fetch_add(1, Ordering::Relaxed);
                tracing::warn!("Replaced the Kafka producer after a fatal error.");
            }
            Err(error) => {
                tracing::error!(%error, "Cannot replace the failed Kafka producer; trying again on the next request.");
            }
        }
    }
}

#[async_trait]
impl Publisher for KafkaPublisher {
    async fn publish(&self, event: OutboundEvent) -> Result<Position, PublishError> {
        if self.context.health.brokers_down.load(Ordering::Relaxed) {
            return Err(PublishError::Unavailable(
                "no Kafka broker is reachable".into(),
            ));
        }
        let (topic, partition) = match (&self.expedited, event.lane) {
            (Some(expedited), Lane::Expedited) => {
                (expedited, partition_for(&event.key, expedited.partitions))
            }
            _ => {
                let topics = u32::try_from(self.topics.len()).unwrap_or(u32::MAX);
                let (index, partition) = shard_for(&event.key, topics, |topic| {
                    self.topics[topic as usize].partitions
                });
                (&self.topics[index as usize], partition)
            }
        };
        let schema_version = event.properties.schema_version.to_string();
        let content_type = content_type(event.properties.schema_version);
        let mut record_headers = OwnedHeaders::new_with_capacity(4)
            .insert(Header {
                key: headers::CONTENT_TYPE,
                value: Some(&content_type),
            })
            .insert(Header {
                key: headers::SCHEMA_VERSION,
                value: Some(&schema_version),
            });
        if let Some(traceparent) = &event.properties.traceparent {
            record_headers = record_headers.insert(Header {
                key: headers::TRACEPARENT,
                value: Some(traceparent),
            });
        }
        if let Some(key) = &event.properties.idempotency_key {
            record_headers = record_headers.insert(Header {
                key: headers::IDEMPOTENCY_KEY,
                value: Some(key),
            });
        }
        let record = FutureRecord::to(&topic.name)
            .partition(i32::try_from(partition).unwrap_or(i32::MAX))
            .key(&event.key)
            .payload(event.payload.as_ref())
            .headers(record_headers);
        let producer = self.current();
        let delivery = match producer.send_result(record) {
            Ok(delivery) => delivery,
            // Not enqueued (queue full, too large, a fatal error): never sent.
            Err((error, _)) => {
                self.failed(&producer, &error);
                return Err(PublishError::Unavailable(Box::new(error)));
            }
        };
        // librdkafka cannot time out a record already sent on a connection
        // that died until the request times out; the caller waits no longer
        // than the delivery timeout, and the record's fate is then unknown.
        match tokio::time::timeout(self.delivery_timeout, delivery).await {
            Ok(Ok(Ok(delivered))) => Ok(Position {
                partition: topic.first + partition,
                offset: u64::try_from(delivered.offset).ok(),
            }),
            Ok(Ok(Err((error, _)))) => {
                self.failed(&producer, &error);
                Err(reported(error))
            }
            Ok(Err(_)) => Err(PublishError::Unknown(
                "the Kafka producer went away before it reported the record's fate".into(),
            )),
            Err(_) => {
                // With a broker up, a record left unacknowledged this long
                // means the producer is stuck (its in-flight requests died
                // with a broker that came back without their state).
                if !self.context.health.brokers_down.load(Ordering::Relaxed) {
                    self.rebuild(&producer);
                }
                Err(PublishError::Unknown(
                    "the Kafka brokers did not acknowledge the record within kafka.delivery_timeout_ms; it may yet be written"
                        .into(),
                ))
            }
        }
    }

    fn has_expedited_lane(&self) -> bool {
        self.expedited.is_some()
    }

    async fn ready(&self) -> bool {
        !self.context.health.brokers_down.load(Ordering::Relaxed)
    }
}

impl KafkaPublisher {
    /// Replaces the producer when librdkafka says, with `error` for a record,
    /// that it cannot go on.
    fn failed(&self, producer: &Arc<KafkaProducer>, error: &KafkaError) {
        let lost_state = matches!(
            error.rdkafka_error_code(),
            Some(
                RDKafkaErrorCode::ProducerFenced
                    | RDKafkaErrorCode::OutOfOrderSequenceNumber
                    | RDKafkaErrorCode::UnknownProducerId
                    | RDKafkaErrorCode::InvalidProducerEpoch
                    | RDKafkaErrorCode::InvalidProducerIdMapping
            )
        );
        if lost_state || producer.client().fatal_error().is_some() {
            self.rebuild(producer);
        }
        tracing::debug!(%error, "A record was not acknowledged; its request is refused.");
    }
}

/// What a delivery report's error says of a record librdkafka took.
fn reported(error: KafkaError) -> PublishError {
    if error.rdkafka_error_code().is_some_and(refused_content) {
        PublishError::Unavailable(Box::new(error))
    } else {
        PublishError::Unknown(Box::new(error))
    }
}

/// Whether a broker refused the record for what it holds, which it does on
/// every attempt: so no attempt was written. Errors of the moment (no
/// leader, not enough replicas, authorisation, storage, time-outs,
/// transport) are retried by librdkafka after attempts that may have been
/// written, and so tell nothing of the record's fate.
fn refused_content(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::InvalidMessage
            | RDKafkaErrorCode::InvalidMessageSize
            | RDKafkaErrorCode::MessageSizeTooLarge
            | RDKafkaErrorCode::MessageBatchTooLarge
            | RDKafkaErrorCode::InvalidTimestamp
            | RDKafkaErrorCode::UnsupportedForMessageFormat
            | RDKafkaErrorCode::UnsupportedCompressionType
            | RDKafkaErrorCode::InvalidRecord
            | RDKafkaErrorCode::InvalidDifferentRecord
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(code: RDKafkaErrorCode) -> PublishError {
        reported(KafkaError::MessageProduction(code))
    }

    #[test]
    fn a_record_whose_content_a_broker_refused_was_not_written_and_any_other_failure_may_have_been()
    {
        for code in [
            RDKafkaErrorCode::MessageSizeTooLarge,
            RDKafkaErrorCode::InvalidRecord,
            RDKafkaErrorCode::InvalidMessage,
        ] {
            assert!(
                matches!(report(code), PublishError::Unavailable(_)),
                "{code:?}"
            );
        }
        for code in [
            RDKafkaErrorCode::MessageTimedOut,
            RDKafkaErrorCode::PurgeInflight,
            RDKafkaErrorCode::PurgeQueue,
            RDKafkaErrorCode::NotEnoughReplicas,
            RDKafkaErrorCode::NotEnoughReplicasAfterAppend,
            RDKafkaErrorCode::RequestTimedOut,
            RDKafkaErrorCode::OutOfOrderSequenceNumber,
            RDKafkaErrorCode::Fatal,
            RDKafkaErrorCode::BrokerTransportFailure,
            RDKafkaErrorCode::TopicAuthorizationFailed,
        ] {
            assert!(matches!(report(code), PublishError::Unknown(_)), "{code:?}");
        }
    }
}
