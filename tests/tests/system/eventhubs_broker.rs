//! The Event Hubs test broker, driven through the real SDK
//! (`azure_messaging_eventhubs` 0.15); only what the SDK cannot put on the wire
//! (an owner level, SASL PLAIN) goes through fe2o3-amqp directly. Then
//! Skyport's publisher and gateway over the broker's answers that do not mean
//! stored (Released, Modified, Rejected) and over a lost answer. Every wait is
//! bounded, so a hang fails fast.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use azure_messaging_eventhubs::error::ErrorKind;
use azure_messaging_eventhubs::models::{
    AmqpSimpleValue, EventData, ReceivedEventData, StartPositions,
};
use azure_messaging_eventhubs::{
    CheckpointStore, ConsumerClient, EventDataBatchOptions, EventProcessor, EventReceiver,
    InMemoryCheckpointStore, OpenReceiverOptions, ProcessorStrategy, ProducerClient, StartLocation,
    StartPosition,
};
use bytes::Bytes;
use fe2o3_amqp::sasl_profile::SaslProfile;
use fe2o3_amqp::types::definitions::{AmqpError, ErrorCondition, LinkError};
use futures_util::{Stream, StreamExt};
use skyport_azure::eventhubs::EventHubsPublisher;
use skyport_core::event::Event;
use skyport_core::ports::{EventProperties, Lane, OutboundEvent, PublishError, Publisher};
use skyport_runtime::config::Millis;
use skyport_tests::eventhubs_broker::{EventHubsBroker, Refusal, test_credential};
use skyport_tests::{TestApp, delivery_request};

const WAIT: Duration = Duration::from_secs(15);

/// Awaits `future`, failing the test after [`WAIT`].
async fn bounded<T>(what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(WAIT, future)
        .await
        .unwrap_or_else(|_| panic!("{what} did not finish within {WAIT:?}"))
}

async fn producer(broker: &EventHubsBroker, hub: &str) -> ProducerClient {
    bounded(
        "opening a producer",
        ProducerClient::builder()
            .with_custom_endpoint(broker.endpoint())
            .open(&broker.namespace(), hub, test_credential()),
    )
    .await
    .unwrap()
}

async fn consumer(broker: &EventHubsBroker, hub: &str) -> ConsumerClient {
    bounded(
        "opening a consumer",
        ConsumerClient::builder()
            .with_custom_endpoint(broker.endpoint())
            .open(&broker.namespace(), hub.to_owned(), test_credential()),
    )
    .await
    .unwrap()
}

fn event(body: &str) -> EventData {
    EventData::builder()
        .with_body(body.as_bytes().to_vec())
        .add_property("kind".to_owned(), "test")
        .add_property("attempt".to_owned(), 3)
        .build()
}

/// Sends `bodies` as one batch with `options`.
async fn try_send_batch(
    producer: &ProducerClient,
    options: EventDataBatchOptions,
    bodies: &[&str],
) -> azure_messaging_eventhubs::Result<()> {
    bounded("sending a batch", async {
        let batch = producer.create_batch(Some(options)).await?;
        for body in bodies {
            assert!(batch.try_add_event_data(event(body), None).unwrap());
        }
        producer.send_batch(batch, None).await
    })
    .await
}

async fn send_batch(producer: &ProducerClient, options: EventDataBatchOptions, bodies: &[&str]) {
    try_send_batch(producer, options, bodies).await.unwrap();
}

fn to_partition(id: u32) -> EventDataBatchOptions {
    EventDataBatchOptions {
        partition_id: Some(id.to_string()),
        ..Default::default()
    }
}

fn with_key(key: &str) -> EventDataBatchOptions {
    EventDataBatchOptions {
        partition_key: Some(key.to_owned()),
        ..Default::default()
    }
}

async fn open_receiver(
    consumer: &ConsumerClient,
    partition: u32,
    location: StartLocation,
    inclusive: bool,
    owner_level: Option<i64>,
) -> EventReceiver {
    bounded(
        "opening a receiver",
        consumer.open_receiver_on_partition(
            partition.to_string(),
            Some(OpenReceiverOptions {
                start_position: Some(StartPosition {
                    location,
                    inclusive,
                }),
                owner_level,
                ..Default::default()
            }),
        ),
    )
    .await
    .unwrap()
}

type Events = azure_messaging_eventhubs::Result<ReceivedEventData>;

/// The next `count` events of a stream.
async fn next_events(
    stream: &mut (impl Stream<Item = Events> + Unpin),
    count: usize,
) -> Vec<ReceivedEventData> {
    let mut events = Vec::with_capacity(count);
    while events.len() < count {
        let next = bounded("receiving an event", stream.next()).await;
        events.push(next.expect("the stream ended").unwrap());
    }
    events
}

/// Nothing arrives on the stream for a while.
async fn assert_quiet(stream: &mut (impl Stream<Item = Events> + Unpin)) {
    if let Ok(next) = tokio::time::timeout(Duration::from_millis(300), stream.next()).await {
        let sequence_number = next.map(|event| event.map(|event| event.sequence_number()));
        panic!("expected no event, got {sequence_number:?}");
    }
}

fn bodies(events: &[ReceivedEventData]) -> Vec<String> {
    events
        .iter()
        .map(|event| String::from_utf8(event.event_data().body().unwrap().to_vec()).unwrap())
        .collect()
}

/// The SDK's errors keep the AMQP condition only in their debug form.
fn assert_mentions(error: &impl Debug, condition: &str) {
    let debug = format!("{error:?}");
    assert!(debug.contains(condition), "{condition} not in {debug}");
}

#[tokio::test]
async fn properties_before_and_after_sends() {
    let broker = EventHubsBroker::start(&[("orders", 4)]).await.unwrap();
    let producer = producer(&broker, "orders").await;

    let hub = bounded("hub properties", producer.get_eventhub_properties())
        .await
        .unwrap();
    assert_eq!(hub.name, "orders");
    assert_eq!(hub.partition_ids, ["0", "1", "2", "3"]);
    assert!(hub.created_on.is_some());

    let empty = bounded(
        "partition properties",
        producer.get_partition_properties("2"),
    )
    .await
    .unwrap();
    assert_eq!(
        (empty.id.as_str(), empty.eventhub.as_str()),
        ("2", "orders")
    );
    assert!(empty.is_empty);
    assert_eq!(empty.beginning_sequence_number, 0);
    assert_eq!(empty.last_enqueued_sequence_number, -1);
    assert_eq!(empty.last_enqueued_offset, "-1");
    assert_eq!(empty.last_enqueued_time_utc, None);

    send_batch(&producer, to_partition(2), &["a", "b", "c"]).await;
    let stored = broker.events("orders", 2);
    let filled = bounded(
        "partition properties",
        producer.get_partition_properties("2"),
    )
    .await
    .unwrap();
    assert!(!filled.is_empty);
    assert_eq!(filled.beginning_sequence_number, 0);
    assert_eq!(filled.last_enqueued_sequence_number, 2);
    assert_eq!(filled.last_enqueued_offset, stored[2].offset);
    assert_eq!(
        filled
            .last_enqueued_time_utc
            .map(time::OffsetDateTime::from),
        Some(stored[2].enqueued_time)
    );

    // A consumer client reads the same.
    let consumer = consumer(&broker, "orders").await;
    let seen = bounded(
        "partition properties",
        consumer.get_partition_properties("2"),
    )
    .await
    .unwrap();
    assert_eq!(seen.last_enqueued_offset, stored[2].offset);
}

/// Many short-lived clients in a row, as a service polling partition properties
/// would open them, on a multi-threaded runtime. Each drops the CBS session it
/// authorised on together with both of its links, and awaits the settlement of
/// every request; fe2o3-amqp's client gets both wrong when the peer answers
/// faster than a network round trip (see the broker's module docs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_lived_clients_query_and_close_cleanly() {
    let broker = EventHubsBroker::start(&[("orders", 4)]).await.unwrap();
    for _ in 0..20 {
        let consumer = consumer(&broker, "orders").await;
        let hub = bounded("hub properties", consumer.get_eventhub_properties())
            .await
            .unwrap();
        for id in &hub.partition_ids {
            bounded(
                "partition properties",
                consumer.get_partition_properties(id),
            )
            .await
            .unwrap();
        }
        bounded("closing a consumer", consumer.close())
            .await
            .unwrap();
    }
    broker.stop().await;
}

#[tokio::test]
async fn batches_are_stored_per_event_and_routed() {
    let broker = EventHubsBroker::start(&[("orders", 4), ("audit", 2)])
        .await
        .unwrap();
    let producer = producer(&broker, "orders").await;

    send_batch(&producer, to_partition(1), &["one", "two", "three"]).await;
    send_batch(&producer, to_partition(1), &["four"]).await;
    let stored = broker.events("orders", 1);
    let sequence_numbers: Vec<i64> = stored.iter().map(|e| e.sequence_number).collect();
    assert_eq!(sequence_numbers, [0, 1, 2, 3]);
    let offsets: Vec<i64> = stored.iter().map(|e| e.offset.parse().unwrap()).collect();
    assert_eq!(offsets[0], 0);
    assert!(offsets.windows(2).all(|o| o[0] < o[1]), "{offsets:?}");
    assert!(
        stored
            .windows(2)
            .all(|e| e[0].enqueued_time <= e[1].enqueued_time)
    );
    assert_eq!(stored[0].body, b"one");
    assert_eq!(stored[3].body, b"four");
    assert_eq!(
        stored[0].properties.get("kind").map(String::as_str),
        Some("test")
    );
    // Only string-valued properties are listed.
    assert!(!stored[0].properties.contains_key("attempt"));
    assert_eq!(stored[0].partition_key, None);
    assert!(stored[..3].iter().all(|e| e.transfer == stored[0].transfer));
    assert_ne!(stored[3].transfer, stored[0].transfer);
    for other in [0, 2, 3] {
        assert!(broker.events("orders", other).is_empty());
    }

    // A key picks one partition, the same for every batch; several keys spread.
    let mut partitions_of_keys = Vec::new();
    for key in [
        "alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta",
    ] {
        send_batch(&producer, with_key(key), &[key, key]).await;
        send_batch(&producer, with_key(key), &[key]).await;
        let holding: Vec<u32> = (0..4)
            .filter(|&p| {
                broker
                    .events("orders", p)
                    .iter()
                    .any(|e| e.partition_key.as_deref() == Some(key))
            })
            .collect();
        assert_eq!(holding.len(), 1, "{key} is in partitions {holding:?}");
        let events: Vec<_> = broker
            .events("orders", holding[0])
            .into_iter()
            .filter(|e| e.partition_key.as_deref() == Some(key))
            .collect();
        assert_eq!(events.len(), 3);
        assert_eq!(events[0].transfer, events[1].transfer);
        assert_ne!(events[1].transfer, events[2].transfer);
        partitions_of_keys.push(holding[0]);
    }
    let mut spread = partitions_of_keys.clone();
    spread.sort_unstable();
    spread.dedup();
    assert!(spread.len() > 1, "every key went to {spread:?}");

    // Without a key or a partition, batches go round-robin.
    let audit = self::producer(&broker, "audit").await;
    for n in 0..4 {
        send_batch(
            &audit,
            EventDataBatchOptions::default(),
            &[&format!("audit-{n}")],
        )
        .await;
    }
    assert_eq!(broker.events("audit", 0).len(), 2);
    assert_eq!(broker.events("audit", 1).len(), 2);

    // A consumer sees the broker's annotations and the sender's properties and body.
    let consumer = consumer(&broker, "orders").await;
    let receiver = open_receiver(&consumer, 1, StartLocation::Earliest, false, None).await;
    let mut stream = receiver.stream_events();
    let received = next_events(&mut stream, 4).await;
    assert_eq!(bodies(&received), ["one", "two", "three", "four"]);
    for (event, stored) in received.iter().zip(&stored) {
        assert_eq!(event.sequence_number(), Some(stored.sequence_number));
        assert_eq!(event.offset().as_deref(), Some(stored.offset.as_str()));
        assert_eq!(
            event.enqueued_time().map(time::OffsetDateTime::from),
            Some(stored.enqueued_time)
        );
        assert_eq!(event.partition_key(), &None);
        let properties = event.event_data().properties().unwrap();
        assert_eq!(properties.get("kind"), Some(&AmqpSimpleValue::from("test")));
        assert_eq!(properties.get("attempt"), Some(&AmqpSimpleValue::from(3)));
    }
    drop(stream);
    // The SDK shares one link per partition and consumer client until it is closed.
    bounded("closing a receiver", receiver.close())
        .await
        .unwrap();

    let keyed_partition = partitions_of_keys[0];
    let keyed = broker.events("orders", keyed_partition);
    let receiver = open_receiver(
        &consumer,
        keyed_partition,
        StartLocation::Earliest,
        false,
        None,
    )
    .await;
    let mut stream = receiver.stream_events();
    let received = next_events(&mut stream, keyed.len()).await;
    for (event, stored) in received.iter().zip(&keyed) {
        assert_eq!(event.partition_key(), &stored.partition_key);
    }
    assert!(
        received
            .iter()
            .any(|e| e.partition_key().as_deref() == Some("alpha"))
    );
}

#[tokio::test]
async fn receivers_start_where_asked_and_wait_at_the_head() {
    let broker = EventHubsBroker::start(&[("orders", 2)]).await.unwrap();
    let producer = producer(&broker, "orders").await;
    send_batch(&producer, to_partition(0), &["e0", "e1", "e2"]).await;
    send_batch(&producer, to_partition(0), &["e3", "e4"]).await;
    let stored = broker.events("orders", 0);
    let consumer = consumer(&broker, "orders").await;

    let first_time = stored[0].enqueued_time.into();
    let cases = [
        (StartLocation::Earliest, false, 0),
        (StartLocation::SequenceNumber(2), true, 2),
        (StartLocation::SequenceNumber(2), false, 3),
        (StartLocation::Offset(stored[1].offset.clone()), true, 1),
        (StartLocation::Offset(stored[1].offset.clone()), false, 2),
        (StartLocation::EnqueuedTime(first_time), true, 0),
    ];
    for (location, inclusive, first) in cases {
        let receiver = open_receiver(&consumer, 0, location.clone(), inclusive, None).await;
        let mut stream = receiver.stream_events();
        let received = next_events(&mut stream, 5 - first).await;
        let expected: Vec<String> = (first..5).map(|n| format!("e{n}")).collect();
        assert_eq!(
            bodies(&received),
            expected,
            "{location:?}, inclusive {inclusive}"
        );
        assert_quiet(&mut stream).await;
        drop(stream);
        bounded("closing a receiver", receiver.close())
            .await
            .unwrap();
    }

    // From the head: only what is sent after the receiver attached, which waits for it.
    let receiver = open_receiver(&consumer, 0, StartLocation::Latest, false, None).await;
    let mut stream = receiver.stream_events();
    assert_quiet(&mut stream).await;
    let (received, ()) = tokio::join!(next_events(&mut stream, 1), async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        send_batch(&producer, to_partition(0), &["late"]).await;
    });
    assert_eq!(bodies(&received), ["late"]);
    assert_eq!(received[0].sequence_number(), Some(5));
}

#[tokio::test]
async fn owner_levels_steal_and_refuse() {
    let broker = EventHubsBroker::start(&[("orders", 1)]).await.unwrap();
    let producer = producer(&broker, "orders").await;
    send_batch(&producer, to_partition(0), &["e0"]).await;

    // The SDK sets `com.microsoft:epoch` on its receiver link builder before naming
    // the link, and fe2o3-amqp 0.14.1's `Builder::name` resets the link properties:
    // the owner level never reaches the wire, so two SDK receivers with owner
    // level 1 coexist.
    let first_client = consumer(&broker, "orders").await;
    let first = open_receiver(&first_client, 0, StartLocation::Earliest, false, Some(1)).await;
    let mut first_stream = first.stream_events();
    next_events(&mut first_stream, 1).await;
    let second_client = consumer(&broker, "orders").await;
    let second = open_receiver(&second_client, 0, StartLocation::Earliest, false, Some(1)).await;
    let mut second_stream = second.stream_events();
    next_events(&mut second_stream, 1).await;
    assert_eq!(broker.receivers("orders", "$Default", 0), 2);
    drop(second_stream);
    bounded("closing a receiver", second.close()).await.unwrap();
    wait_for_receivers(&broker, 0, 1).await;

    // A receiver that does carry an owner level takes the partition from the SDK's.
    // The SDK does not surface that as `ConsumerDisconnected`: its fe2o3 receiver
    // reports the detach as a link-state error (the `amqp:link:stolen` condition is
    // only inside it), which `translate_receive_error` does not look into; so the
    // SDK re-attaches (refused: without an owner level) up to its retry limit and
    // then yields that error.
    let mut holder =
        RawReceiver::attach(&broker, PARTITION_0, Some(1), SaslProfile::Anonymous).await;
    holder.receive().await.unwrap();
    let error = bounded("the displaced receiver", first_stream.next())
        .await
        .expect("the displaced stream ended")
        .expect_err("the displaced receiver got an event");
    assert!(matches!(error.kind, ErrorKind::AmqpError(_)), "{error:?}");
    assert_mentions(&error, "LinkError(Stolen)");
    assert_eq!(broker.receivers("orders", "$Default", 0), 1);

    // A lower owner level is refused; an equal one steals.
    let mut lower =
        RawReceiver::attach(&broker, PARTITION_0, Some(0), SaslProfile::Anonymous).await;
    assert_eq!(lower.receive().await, Err(Some(LinkError::Stolen.into())));
    let mut equal =
        RawReceiver::attach(&broker, PARTITION_0, Some(1), SaslProfile::Anonymous).await;
    equal.receive().await.unwrap();
    assert_eq!(holder.receive().await, Err(Some(LinkError::Stolen.into())));
    assert_eq!(broker.receivers("orders", "$Default", 0), 1);
    // Another consumer group is another partition owner.
    let mut elsewhere = RawReceiver::attach(
        &broker,
        "orders/ConsumerGroups/audit/Partitions/0",
        Some(0),
        SaslProfile::Anonymous,
    )
    .await;
    elsewhere.receive().await.unwrap();
    assert_eq!(broker.receivers("orders", "audit", 0), 1);
}

const PARTITION_0: &str = "orders/ConsumerGroups/$Default/Partitions/0";

/// Waits until `count` receivers are attached to the partition (links close asynchronously).
async fn wait_for_receivers(broker: &EventHubsBroker, partition: u32, count: usize) {
    bounded("the receivers to settle", async {
        while broker.receivers("orders", "$Default", partition) != count {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

/// A receiver straight on fe2o3-amqp, which puts the owner level on the wire
/// (and speaks SASL PLAIN if asked).
struct RawReceiver {
    _connection: fe2o3_amqp::connection::ConnectionHandle<()>,
    _session: fe2o3_amqp::session::SessionHandle<()>,
    receiver: fe2o3_amqp::Receiver,
}

impl RawReceiver {
    async fn attach(
        broker: &EventHubsBroker,
        source: &str,
        owner_level: Option<i64>,
        sasl: SaslProfile,
    ) -> Self {
        use fe2o3_amqp::types::primitives::{OrderedMap, Symbol, Value};
        bounded("attaching a raw receiver", async {
            let mut connection = fe2o3_amqp::Connection::builder()
                .container_id("raw-receiver")
                .sasl_profile(sasl)
                .open(broker.endpoint().as_str())
                .await
                .unwrap();
            let mut session = fe2o3_amqp::Session::begin(&mut connection).await.unwrap();
            let mut properties = OrderedMap::new();
            if let Some(level) = owner_level {
                properties.insert(Symbol::from("com.microsoft:epoch"), Value::Long(level));
            }
            // Properties last: the builder's `name` and `source` would reset them.
            let receiver = fe2o3_amqp::Receiver::builder()
                .name("raw-receiver")
                .source(source)
                .properties(properties)
                .attach(&mut session)
                .await
                .unwrap();
            Self {
                _connection: connection,
                _session: session,
                receiver,
            }
        })
        .await
    }

    /// Receives one event; on error, the condition the broker closed the link with.
    async fn receive(&mut self) -> Result<(), Option<ErrorCondition>> {
        use fe2o3_amqp::link::{LinkStateError, RecvError};
        use fe2o3_amqp::types::messaging::Body;
        use fe2o3_amqp::types::primitives::Value;
        match bounded("a raw receive", self.receiver.recv::<Body<Value>>()).await {
            Ok(_) => Ok(()),
            Err(RecvError::LinkStateError(
                LinkStateError::RemoteClosedWithError(error)
                | LinkStateError::RemoteDetachedWithError(error),
            )) => Err(Some(error.condition)),
            Err(_) => Err(None),
        }
    }
}

/// Runs an `EventProcessor` until it has handed out a client for every partition;
/// each client's first `per_partition` events come back by partition, and each
/// client checkpoints its last one.
async fn process(
    broker: &EventHubsBroker,
    store: Arc<InMemoryCheckpointStore>,
    per_partition: usize,
) -> BTreeMap<String, Vec<String>> {
    // The application id is the owner id: a second processor owns what the first did.
    let consumer = bounded(
        "opening a consumer",
        ConsumerClient::builder()
            .with_custom_endpoint(broker.endpoint())
            .with_application_id("skyport-broker-test-processor".to_owned())
            .open(&broker.namespace(), "orders".to_owned(), test_credential()),
    )
    .await
    .unwrap();
    // `InMemoryCheckpointStore` keeps an ownership's first `last_modified_time` when
    // it is renewed, so ownerships lapse after the expiration duration however often
    // they are renewed: keep that longer than the test.
    let processor = bounded(
        "building a processor",
        EventProcessor::builder()
            .with_load_balancing_strategy(ProcessorStrategy::Balanced)
            .with_update_interval(azure_core::time::Duration::milliseconds(100))
            .with_partition_expiration_duration(azure_core::time::Duration::seconds(60))
            .with_start_positions(StartPositions {
                default: StartPosition {
                    location: StartLocation::Earliest,
                    inclusive: false,
                },
                ..Default::default()
            })
            .build(consumer, store),
    )
    .await
    .unwrap();
    let running = tokio::task::spawn_local({
        let processor = Arc::clone(&processor);
        async move { processor.run().await }
    });
    let mut readers = tokio::task::JoinSet::new();
    for _ in 0..4 {
        let client = bounded("a partition client", processor.next_partition_client())
            .await
            .unwrap();
        readers.spawn_local(async move {
            let mut stream = client.stream_events();
            let events = next_events(&mut stream, per_partition).await;
            let last = events.last().unwrap();
            bounded("a checkpoint", client.update_checkpoint(last))
                .await
                .unwrap();
            (client.get_partition_id().to_owned(), bodies(&events))
        });
    }
    let received = bounded("the partition readers", readers.join_all())
        .await
        .into_iter()
        .collect();
    for partition in 0..4 {
        wait_for_receivers(broker, partition, 1).await;
    }
    processor.shutdown().await.unwrap();
    bounded("the processor's end", running)
        .await
        .unwrap()
        .unwrap();
    received
}

#[tokio::test]
async fn an_event_processor_claims_every_partition_and_resumes_from_checkpoints() {
    let broker = EventHubsBroker::start(&[("orders", 4)]).await.unwrap();
    let producer = producer(&broker, "orders").await;
    for partition in 0..4 {
        let bodies = [format!("p{partition}-0"), format!("p{partition}-1")];
        send_batch(
            &producer,
            to_partition(partition),
            &[&bodies[0], &bodies[1]],
        )
        .await;
    }
    let store = Arc::new(InMemoryCheckpointStore::new());

    // `PartitionClient::stream_events` is not Send: read on this thread.
    let local = tokio::task::LocalSet::new();
    let first = local
        .run_until(process(&broker, Arc::clone(&store), 2))
        .await;
    let expected: BTreeMap<String, Vec<String>> = (0..4)
        .map(|p| (p.to_string(), vec![format!("p{p}-0"), format!("p{p}-1")]))
        .collect();
    assert_eq!(first, expected);
    let checkpoints = bounded(
        "the checkpoints",
        store.list_checkpoints(&broker.namespace(), "orders", "$Default"),
    )
    .await
    .unwrap();
    assert_eq!(checkpoints.len(), 4);
    for checkpoint in &checkpoints {
        let partition: u32 = checkpoint.partition_id.parse().unwrap();
        let stored = broker.events("orders", partition);
        assert_eq!(checkpoint.sequence_number, Some(1));
        assert_eq!(
            checkpoint.offset.as_deref(),
            Some(stored[1].offset.as_str())
        );
    }

    // A new processor on the same store resumes after each checkpoint (at its offset).
    for partition in 0..4 {
        send_batch(
            &producer,
            to_partition(partition),
            &[&format!("p{partition}-2")],
        )
        .await;
    }
    let second = local
        .run_until(process(&broker, Arc::clone(&store), 1))
        .await;
    let expected: BTreeMap<String, Vec<String>> = (0..4)
        .map(|p| (p.to_string(), vec![format!("p{p}-2")]))
        .collect();
    assert_eq!(second, expected);
}

#[tokio::test]
async fn refused_sends_fail_and_a_stopped_broker_fails_its_clients() {
    let broker = EventHubsBroker::start(&[("orders", 2)]).await.unwrap();
    let producer = producer(&broker, "orders").await;
    send_batch(&producer, to_partition(0), &["before"]).await;

    broker.refuse_sends(true);
    let refused = try_send_batch(&producer, to_partition(0), &["refused"]).await;
    assert_mentions(&refused.unwrap_err(), "InternalError");
    broker.refuse_sends(false);
    send_batch(&producer, to_partition(0), &["after"]).await;
    let stored: Vec<Vec<u8>> = broker
        .events("orders", 0)
        .into_iter()
        .map(|e| e.body)
        .collect();
    assert_eq!(stored, [b"before".to_vec(), b"after".to_vec()]);

    // Stopping closes every connection: a waiting receiver and the producer fail
    // (they redial the old port), with another broker running meanwhile.
    let consumer = consumer(&broker, "orders").await;
    let receiver = open_receiver(&consumer, 0, StartLocation::Latest, false, None).await;
    let mut stream = receiver.stream_events();
    assert_quiet(&mut stream).await;
    bounded("stopping the broker", broker.stop()).await;
    let replacement = EventHubsBroker::start(&[("orders", 2)]).await.unwrap();
    let received = bounded("a receive from a stopped broker", stream.next()).await;
    assert!(matches!(received, Some(Err(_))), "{received:?}");
    let sent = try_send_batch(&producer, to_partition(0), &["lost"]).await;
    assert!(sent.is_err(), "{sent:?}");
    let fresh = self::producer(&replacement, "orders").await;
    send_batch(&fresh, to_partition(1), &["fresh"]).await;
    assert_eq!(replacement.events("orders", 1).len(), 1);
}

#[tokio::test]
async fn unknown_hubs_and_partitions_fail_cleanly() {
    let broker = EventHubsBroker::start(&[("orders", 2)]).await.unwrap();

    let nowhere = producer(&broker, "no-such-hub").await;
    let error = bounded(
        "an unknown hub's properties",
        nowhere.get_eventhub_properties(),
    )
    .await
    .unwrap_err();
    assert_mentions(&error, "404");
    let sent = try_send_batch(&nowhere, EventDataBatchOptions::default(), &["lost"]).await;
    assert_mentions(&sent.unwrap_err(), "NotFound");

    let producer = producer(&broker, "orders").await;
    let error = bounded(
        "an unknown partition's properties",
        producer.get_partition_properties("7"),
    )
    .await
    .unwrap_err();
    assert_mentions(&error, "404");
    let sent = try_send_batch(&producer, to_partition(7), &["lost"]).await;
    assert_mentions(&sent.unwrap_err(), "NotFound");

    let consumer = consumer(&broker, "orders").await;
    let receiver = open_receiver(&consumer, 7, StartLocation::Earliest, false, None).await;
    let mut stream = receiver.stream_events();
    let received = bounded("a receive from an unknown partition", stream.next()).await;
    assert_mentions(
        &received.expect("the stream ended").unwrap_err(),
        "NotFound",
    );

    // The same from a client that authenticates with SASL PLAIN.
    let plain = SaslProfile::Plain {
        username: "anyone".to_owned(),
        password: "anything".to_owned(),
    };
    let source = "no-such-hub/ConsumerGroups/$Default/Partitions/0";
    let mut raw = RawReceiver::attach(&broker, source, None, plain).await;
    assert_eq!(raw.receive().await, Err(Some(AmqpError::NotFound.into())));
    for partition in 0..2 {
        assert!(broker.events("orders", partition).is_empty());
    }
}

/// The delivery ids of the events stored in `hub`'s partitions, in partition order.
fn stored_ids(broker: &EventHubsBroker, hub: &str, partitions: u32) -> Vec<String> {
    (0..partitions)
        .flat_map(|partition| broker.events(hub, partition))
        .map(|event| Event::decode(&event.body).unwrap().delivery_id().to_owned())
        .collect()
}

/// A 503 problem with `Retry-After` and the problem code `code`.
async fn assert_refused(response: reqwest::Response, code: &str) {
    assert_eq!(response.status(), 503);
    assert!(response.headers().contains_key("retry-after"));
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json"
    );
    let problem: serde_json::Value = response.json().await.unwrap();
    assert_eq!(problem["code"], code, "{problem}");
}

/// Released and Modified do not mean stored: a POST whose batch the hub
/// answers so gets a 503 that says the request was not taken, not a 202,
/// and nothing of it is kept; the same request once the hub stores again is
/// accepted and runs, as does one accepted at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_post_whose_send_the_hub_releases_or_modifies_gets_no_202_and_its_retry_runs() {
    let broker = EventHubsBroker::start(&[("deliveries", 2)]).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let app = TestApp::spawn_with(crate::eventhubs::settings_on(
        &broker,
        &dir,
        &["deliveries"],
    ))
    .await;
    let first = app.client.post_delivery(&delivery_request(1)).await;

    let request = delivery_request(2);
    broker.refuse_all(Some(Refusal::Released));
    for _ in 0..2 {
        let response = app
            .client
            .post_raw("application/json", request.to_string())
            .await;
        assert_refused(response, "Unavailable").await;
    }
    broker.refuse_all(None);
    broker.refuse_next(Refusal::Modified, 1);
    let response = app
        .client
        .post_raw("application/json", request.to_string())
        .await;
    assert_refused(response, "Unavailable").await;
    assert_eq!(broker.refused(), 3, "each POST was one refused transfer");
    assert_eq!(stored_ids(&broker, "deliveries", 2), ["delivery-1"]);

    let retried = app.client.post_delivery(&request).await;
    app.expect_all_scheduled_once(
        &[first.status_url, retried.status_url],
        Duration::from_secs(60),
    )
    .await;
    let mut stored = stored_ids(&broker, "deliveries", 2);
    stored.sort();
    assert_eq!(stored, ["delivery-1", "delivery-2"]);
    assert_eq!(broker.refused(), 3);
    app.app.stop().await.unwrap();
    broker.stop().await;
}

/// A POST whose batch the hub stored but never answered gets a 503 of its
/// own (`PublishOutcomeUnknown`), and its name stays taken: another body
/// under it is a 409, not a second delivery, and the same request again
/// learns its fate (accepted, as it was) and runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_post_whose_fate_the_hub_does_not_tell_keeps_its_name() {
    let broker = EventHubsBroker::start(&[("deliveries", 2)]).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut settings = crate::eventhubs::settings_on(&broker, &dir, &["deliveries"]);
    settings.eventhubs.send_timeout_ms = Millis::new(1_000);
    // The worker writes no status for a while: only the reservation keeps
    // the name taken meanwhile.
    settings.simulator.latency_ms = Millis::new(2_000);
    settings.worker.processing_after_ms = Millis::new(30_000);
    let app = TestApp::spawn_with(settings).await;
    let request = delivery_request(1);
    broker.withhold_outcomes(true);
    let response = app
        .client
        .post_raw("application/json", request.to_string())
        .await;
    assert_refused(response, "PublishOutcomeUnknown").await;
    broker.withhold_outcomes(false);
    let mut another = request.clone();
    another["pickupLocation"] = "47.9999,-122.1368".into();
    let response = app
        .client
        .post_raw("application/json", another.to_string())
        .await;
    assert_eq!(response.status(), 409, "the name is still taken");
    let retried = app.client.post_delivery(&request).await;
    app.expect_all_scheduled_once(&[retried.status_url], Duration::from_secs(60))
        .await;
    app.app.stop().await.unwrap();
    broker.stop().await;
}

/// Skyport's publisher on `broker`'s hub `deliveries` (with `send_timeout`,
/// if given), once it has stored `first`.
async fn publisher_on(
    broker: &EventHubsBroker,
    dir: &tempfile::TempDir,
    first: &str,
    send_timeout: Option<Millis>,
) -> EventHubsPublisher {
    let mut settings = crate::eventhubs::settings_on(broker, dir, &["deliveries"]);
    if let Some(timeout) = send_timeout {
        settings.eventhubs.send_timeout_ms = timeout;
    }
    let publisher = bounded(
        "opening the publisher",
        EventHubsPublisher::open(&settings.eventhubs),
    )
    .await
    .unwrap();
    bounded("a publish", publisher.publish(outbound(first)))
        .await
        .unwrap();
    publisher
}

fn outbound(body: &str) -> OutboundEvent {
    OutboundEvent {
        key: format!("key-{body}"),
        payload: Bytes::from(body.to_owned()),
        properties: EventProperties::default(),
        lane: Lane::Normal,
    }
}

/// Skyport's publisher tells the three fates of a batch apart: Accepted is
/// stored; Released, Modified and Rejected are not (`Unavailable`: the
/// request may be retried with any body); a batch the hub stored but whose
/// answer never came is `Unknown`, and it is indeed in the hub.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_publisher_tells_stored_from_not_stored_from_unknown() {
    let broker = EventHubsBroker::start(&[("deliveries", 1)]).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let publisher = publisher_on(&broker, &dir, "stored", Some(Millis::new(1_000))).await;
    for refusal in [Refusal::Released, Refusal::Modified, Refusal::Rejected] {
        broker.refuse_next(refusal, 1);
        let outcome = bounded("a publish", publisher.publish(outbound("refused"))).await;
        assert!(
            matches!(outcome, Err(PublishError::Unavailable(_))),
            "{refusal:?}: {outcome:?}"
        );
    }
    assert_eq!(broker.refused(), 3);

    broker.withhold_outcomes(true);
    let outcome = bounded("a publish", publisher.publish(outbound("unanswered"))).await;
    assert!(
        matches!(outcome, Err(PublishError::Unknown(_))),
        "{outcome:?}"
    );
    broker.withhold_outcomes(false);
    bounded("a publish", publisher.publish(outbound("after")))
        .await
        .unwrap();
    let bodies: Vec<Vec<u8>> = broker
        .events("deliveries", 0)
        .into_iter()
        .map(|event| event.body)
        .collect();
    assert_eq!(
        bodies,
        [
            b"stored".to_vec(),
            b"unanswered".to_vec(),
            b"after".to_vec()
        ]
    );
    broker.stop().await;
}

/// The publisher puts a new token for its partition links before the one
/// it put expires (a shared access signature lives an hour), on the CBS link
/// it keeps open. The clock jumps twice to just past a renewal (54 minutes
/// into a token's hour) and runs on from there.
#[tokio::test]
async fn the_publisher_renews_its_links_tokens_before_they_expire() {
    let broker = EventHubsBroker::start(&[("deliveries", 1)]).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let publisher = publisher_on(&broker, &dir, "first", None).await;
    let for_the_partition = || {
        broker
            .tokens_put()
            .iter()
            .filter(|name| name.ends_with("/deliveries/Partitions/0"))
            .count()
    };
    assert_eq!(for_the_partition(), 1);
    for renewals in 1..=2 {
        tokio::time::pause();
        tokio::time::advance(Duration::from_secs(55 * 60)).await;
        tokio::time::resume();
        bounded("a renewal", async {
            while for_the_partition() < 1 + renewals {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
    }
    bounded("a publish", publisher.publish(outbound("later")))
        .await
        .unwrap();
    assert_eq!(for_the_partition(), 3, "{:?}", broker.tokens_put());
    assert_eq!(broker.events("deliveries", 0).len(), 2);
    broker.stop().await;
}

/// The hub closes a sender link it finds idle (ten minutes on the service).
/// The next publish on that link gets no outcome, so the publisher sends the
/// batch once more, on a new connection, and it is stored: the request is
/// answered as stored, not as unknown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_on_a_link_the_hub_closed_is_sent_again_on_a_new_connection() {
    let broker = EventHubsBroker::start(&[("deliveries", 1)]).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let publisher = publisher_on(&broker, &dir, "first", None).await;
    broker.detach_publishers();
    // The detach reaches the client before the next publish.
    tokio::time::sleep(Duration::from_millis(200)).await;
    bounded("a publish", publisher.publish(outbound("second")))
        .await
        .unwrap();
    let bodies: Vec<Vec<u8>> = broker
        .events("deliveries", 0)
        .into_iter()
        .map(|event| event.body)
        .collect();
    assert_eq!(bodies, [b"first".to_vec(), b"second".to_vec()]);
    broker.stop().await;
}
