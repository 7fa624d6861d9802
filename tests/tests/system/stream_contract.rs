//! The partition-reader contract (`skyport_tests::stream_contract`) on each
//! stream: the embedded log over a temporary directory, Kafka on a tansu
//! broker and Event Hubs on the protocol-level test broker, both on
//! 127.0.0.1 and a free port and stopped by the test.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use async_trait::async_trait;
use skyport_azure::eventhubs::{EventHubsConsumer, EventHubsPublisher};
use skyport_core::ports::{Consumer, LeaseStore, Publisher};
use skyport_embedded::{EmbeddedConsumer, EmbeddedStore};
use skyport_kafka::{KafkaConsumer, KafkaPublisher};
use skyport_runtime::config::{EmbeddedSettings, EventHubsSettings, KafkaSettings, Millis};
use skyport_tests::eventhubs_broker::EventHubsBroker;
use skyport_tests::kafka::Broker;
use skyport_tests::stream_contract::{
    Handover, LANES, Lane, StreamFixture, partition_reader_contract,
};

/// How long a stream's whole run may take.
const RUN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

fn embedded_store(dir: &tempfile::TempDir, partitions: u32) -> Arc<EmbeddedStore> {
    let settings = EmbeddedSettings {
        data_dir: dir.path().to_path_buf(),
        segment_size_mb: 1,
        ..EmbeddedSettings::default()
    };
    EmbeddedStore::open(&settings, partitions).unwrap()
}

/// The embedded log: a store of its own per lane.
struct Embedded;

struct EmbeddedLane {
    store: Arc<EmbeddedStore>,
    group: String,
    _dir: tempfile::TempDir,
}

#[async_trait]
impl StreamFixture for Embedded {
    fn stream(&self) -> &'static str {
        "embedded"
    }

    fn handover(&self) -> Option<Handover> {
        None
    }

    async fn lane(&self, name: &str, partitions: u32) -> Box<dyn Lane> {
        let dir = tempfile::tempdir().unwrap();
        Box::new(EmbeddedLane {
            store: embedded_store(&dir, partitions),
            group: name.to_owned(),
            _dir: dir,
        })
    }
}

impl Lane for EmbeddedLane {
    fn partitions(&self) -> u32 {
        self.store.partitions()
    }

    fn publisher(&self) -> Arc<dyn Publisher> {
        self.store.clone()
    }

    fn consumer(&self) -> Arc<dyn Consumer> {
        Arc::new(EmbeddedConsumer::new(Arc::clone(&self.store), &self.group))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_embedded_readers_keep_the_partition_reader_contract() {
    tokio::time::timeout(RUN_TIMEOUT, partition_reader_contract(&Embedded))
        .await
        .expect("the embedded run within its bound");
}

/// Kafka: a topic of its own per lane, on one broker; the lane's name is its group.
struct Kafka {
    broker: Broker,
}

struct KafkaLane {
    settings: KafkaSettings,
    group: String,
    partitions: u32,
    publisher: Arc<KafkaPublisher>,
}

#[async_trait]
impl StreamFixture for Kafka {
    fn stream(&self) -> &'static str {
        "kafka"
    }

    fn handover(&self) -> Option<Handover> {
        Some(Handover::AfterFinalCheckpoint)
    }

    async fn lane(&self, name: &str, partitions: u32) -> Box<dyn Lane> {
        self.broker.create_topics(&[name], partitions).await;
        let mut settings = self.broker.settings(&[name]);
        settings.session_timeout_ms = Millis::new(10_000);
        settings.drain_timeout_ms = Millis::new(10_000);
        let publisher = Arc::new(KafkaPublisher::open(&settings).await.unwrap());
        Box::new(KafkaLane {
            settings,
            group: name.to_owned(),
            partitions,
            publisher,
        })
    }
}

impl Lane for KafkaLane {
    fn partitions(&self) -> u32 {
        self.partitions
    }

    fn publisher(&self) -> Arc<dyn Publisher> {
        self.publisher.clone()
    }

    fn consumer(&self) -> Arc<dyn Consumer> {
        Arc::new(KafkaConsumer::new(&self.settings, &self.group))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kafka_readers_keep_the_partition_reader_contract() {
    let kafka = Kafka {
        broker: Broker::start(&[], 1).await,
    };
    tokio::time::timeout(RUN_TIMEOUT, partition_reader_contract(&kafka))
        .await
        .expect("the Kafka run within its bound");
}

/// Event Hubs: a hub of its own per lane (all created when the broker
/// starts), ownerships and checkpoints in an embedded store.
struct EventHubs {
    broker: EventHubsBroker,
    leases: Arc<EmbeddedStore>,
}

struct EventHubsLane {
    settings: EventHubsSettings,
    partitions: u32,
    leases: Arc<dyn LeaseStore>,
    publisher: Arc<EventHubsPublisher>,
}

#[async_trait]
impl StreamFixture for EventHubs {
    fn stream(&self) -> &'static str {
        "eventhubs"
    }

    fn handover(&self) -> Option<Handover> {
        Some(Handover::AtOrBeforeFinalCheckpoint)
    }

    async fn lane(&self, name: &str, partitions: u32) -> Box<dyn Lane> {
        let settings = EventHubsSettings {
            hubs: vec![name.to_owned()],
            connection_string: Some(
                format!(
                    "Endpoint=sb://{}/;SharedAccessKeyName=skyport;SharedAccessKey=dGVzdC1rZXk=",
                    self.broker.namespace()
                )
                .into(),
            ),
            custom_endpoint: Some(self.broker.endpoint().parse().unwrap()),
            update_interval_ms: Millis::new(250),
            partition_expiration_ms: Millis::new(5_000),
            ..EventHubsSettings::default()
        };
        let publisher = Arc::new(EventHubsPublisher::open(&settings).await.unwrap());
        Box::new(EventHubsLane {
            settings,
            partitions,
            leases: self.leases.clone(),
            publisher,
        })
    }
}

impl Lane for EventHubsLane {
    fn partitions(&self) -> u32 {
        self.partitions
    }

    fn publisher(&self) -> Arc<dyn Publisher> {
        self.publisher.clone()
    }

    fn consumer(&self) -> Arc<dyn Consumer> {
        Arc::new(EventHubsConsumer::new(
            &self.settings,
            "$Default",
            Arc::clone(&self.leases),
        ))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_eventhubs_readers_keep_the_partition_reader_contract() {
    let dir = tempfile::tempdir().unwrap();
    let eventhubs = EventHubs {
        broker: EventHubsBroker::start(LANES).await.unwrap(),
        leases: embedded_store(&dir, 1),
    };
    tokio::time::timeout(RUN_TIMEOUT, partition_reader_contract(&eventhubs))
        .await
        .expect("the Event Hubs run within its bound");
    eventhubs.broker.stop().await;
}
