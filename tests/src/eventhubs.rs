//! Event Hubs scenarios, written once and run against the test broker
//! ([`crate::eventhubs_broker`]) and, with the `live` feature, against a real
//! namespace: the sharded publisher, two workers sharing a hub, and the whole
//! system end to end.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use azure_messaging_eventhubs::models::AmqpSimpleValue;
use azure_messaging_eventhubs::{
    CheckpointStore, ConsumerClient, OpenReceiverOptions, StartLocation, StartPosition,
};
use futures_util::StreamExt;
use serde_json::Value;
use skyport::App;
use skyport::Backends;
use skyport_azure::cosmos::CosmosStore;
use skyport_azure::eventhubs::{
    EventHubsPublisher, IDEMPOTENCY_KEY_PROPERTY, LeaseCheckpointStore, SCHEMA_VERSION_PROPERTY,
    TRACEPARENT_PROPERTY,
};
use skyport_core::event::{DeliveryRequested, Event, SCHEMA_VERSION, content_type};
use skyport_core::ports::{Lane, Publisher};
use skyport_core::request::DeliveryRequest;
use skyport_core::status::DeliveryState;
use skyport_runtime::config::{ConnectionString, EventHubsSettings, Settings};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::{CONCURRENCY, Client, delivery_request};

/// The namespace the settings name, as ownership and checkpoint records carry it.
pub fn namespace(settings: &EventHubsSettings) -> String {
    settings.namespace.clone().unwrap_or_else(|| {
        let text = settings
            .connection_string
            .as_ref()
            .expect("a connection string");
        ConnectionString::parse(secrecy::ExposeSecret::expose_secret(text))
            .expect("a valid connection string")
            .namespace
    })
}

async fn consumer(settings: &EventHubsSettings, hub: &str) -> ConsumerClient {
    let credential: Arc<dyn azure_core::credentials::TokenCredential> =
        Arc::new(skyport_azure::eventhubs::SasCredential::new(
            &ConnectionString::parse(secrecy::ExposeSecret::expose_secret(
                settings
                    .connection_string
                    .as_ref()
                    .expect("a connection string"),
            ))
            .expect("a valid connection string"),
        ));
    let mut builder = ConsumerClient::builder();
    if let Some(endpoint) = &settings.custom_endpoint {
        builder = builder.with_custom_endpoint(endpoint.to_string());
    }
    builder
        .open(&namespace(settings), hub.to_owned(), credential)
        .await
        .expect("the hub opens")
}

/// Each hub's partitions (in the publisher's order) with the sequence number
/// of the last event they hold (-1: empty).
async fn last_sequence_numbers(settings: &EventHubsSettings) -> Vec<Vec<(String, i64)>> {
    let mut hubs = Vec::new();
    for hub in &settings.hubs {
        let client = consumer(settings, hub).await;
        let mut ids = client
            .get_eventhub_properties()
            .await
            .unwrap()
            .partition_ids;
        ids.sort_by_key(|id| id.parse::<u64>().unwrap_or(u64::MAX));
        let mut partitions = Vec::new();
        for id in ids {
            let properties = client.get_partition_properties(&id).await.unwrap();
            let last = if properties.is_empty {
                -1
            } else {
                properties.last_enqueued_sequence_number
            };
            partitions.push((id, last));
        }
        client.close().await.unwrap();
        hubs.push(partitions);
    }
    hubs
}

/// Reads `count` events after sequence number `after` from one partition.
async fn read_events(
    settings: &EventHubsSettings,
    hub: &str,
    partition: &str,
    after: i64,
    count: usize,
) -> Vec<Vec<u8>> {
    let client = consumer(settings, hub).await;
    let receiver = client
        .open_receiver_on_partition(
            partition.to_owned(),
            Some(OpenReceiverOptions {
                start_position: Some(StartPosition {
                    location: if after < 0 {
                        StartLocation::Earliest
                    } else {
                        StartLocation::SequenceNumber(after)
                    },
                    inclusive: false,
                }),
                ..OpenReceiverOptions::default()
            }),
        )
        .await
        .unwrap();
    let mut bodies = Vec::with_capacity(count);
    {
        let mut events = receiver.stream_events();
        while bodies.len() < count {
            let event = tokio::time::timeout(Duration::from_secs(30), events.next())
                .await
                .expect("the partition's events arrive")
                .expect("the stream goes on")
                .unwrap();
            let data = event.event_data();
            assert_eq!(
                data.content_type(),
                Some(content_type(SCHEMA_VERSION).as_str()),
                "the envelope's content type"
            );
            let properties = data.properties().expect("application properties");
            for (name, expected) in [
                (
                    SCHEMA_VERSION_PROPERTY,
                    Some(AmqpSimpleValue::from(SCHEMA_VERSION)),
                ),
                (IDEMPOTENCY_KEY_PROPERTY, None),
                (TRACEPARENT_PROPERTY, None),
            ] {
                let value = properties
                    .get(name)
                    .unwrap_or_else(|| panic!("no {name} property"));
                if let Some(expected) = expected {
                    assert_eq!(value, &expected, "{name}");
                }
            }
            bodies.push(data.body().unwrap_or_default().to_vec());
        }
    }
    receiver.close().await.unwrap();
    client.close().await.unwrap();
    bodies
}

/// What the publisher scenario saw.
#[derive(Debug)]
pub struct PublisherReport {
    /// The 10,000 single-key requests each partition received, by hub.
    pub per_partition: Vec<Vec<usize>>,
    pub mean_batch_size: f64,
}

/// Publishes 10,000 requests with keys of their own and, meanwhile, 400
/// keys five times in a row, 256 publishes in flight, and checks that each
/// partition got within 10 % of an even share of the 10,000, that each
/// repeated key's events kept their order, and that concurrent requests
/// shared batches. Keys start with `run`: a fixed one makes the spread
/// repeatable, a fresh one ([`run_tag`]) keeps a shared namespace's runs apart.
pub async fn publisher_spreads_keys_and_keeps_their_order(
    settings: &EventHubsSettings,
    run: &str,
) -> PublisherReport {
    const SINGLE: usize = 10_000;
    const REPEATED: usize = 400;
    const REPEATS: usize = 5;
    let before = last_sequence_numbers(settings).await;
    let publisher = Arc::new(EventHubsPublisher::open(settings).await.unwrap());
    let permits = Arc::new(Semaphore::new(256));
    let mut publishes = JoinSet::new();
    let keys: Vec<(String, usize)> = (0..SINGLE)
        .map(|i| (format!("{run}-single-{i}"), 1))
        .chain((0..REPEATED).map(|i| (format!("{run}-repeated-{i}"), REPEATS)))
        .collect();
    for (key, times) in keys {
        let publisher = Arc::clone(&publisher);
        let permit = Arc::clone(&permits).acquire_owned().await.unwrap();
        publishes.spawn(async move {
            for seq in 0..times {
                publisher
                    .publish(event(&key, seq).outbound(Lane::Normal))
                    .await
                    .unwrap();
            }
            drop(permit);
        });
    }
    publishes.join_all().await;
    let after = last_sequence_numbers(settings).await;
    let partitions: usize = after.iter().map(Vec::len).sum();
    let share = SINGLE / partitions;
    let mut per_partition = Vec::new();
    let mut order: HashMap<String, Vec<usize>> = HashMap::new();
    for (hub, (before, after)) in settings.hubs.iter().zip(before.iter().zip(&after)) {
        let mut counts = Vec::new();
        for ((id, from), (_, to)) in before.iter().zip(after) {
            let count = usize::try_from(to - from).unwrap();
            let mut singles = 0usize;
            for body in read_events(settings, hub, id, *from, count).await {
                let Ok(Event::DeliveryRequested(e)) = Event::decode(&body) else {
                    panic!("an event this run wrote");
                };
                if e.delivery_id.contains("-single-") {
                    singles += 1;
                } else {
                    let seq = e
                        .request
                        .package_info
                        .tag
                        .as_deref()
                        .unwrap()
                        .parse()
                        .unwrap();
                    order.entry(e.delivery_id).or_default().push(seq);
                }
            }
            assert!(
                singles.abs_diff(share) * 10 <= share,
                "{hub}/{id} got {singles} single-key requests; an even share is {share}"
            );
            counts.push(singles);
        }
        per_partition.push(counts);
    }
    assert_eq!(order.len(), REPEATED);
    for (key, seqs) in &order {
        assert_eq!(
            *seqs,
            (0..REPEATS).collect::<Vec<_>>(),
            "{key} lost its order"
        );
    }
    let mean_batch_size = publisher.stats().mean_batch_size();
    assert!(mean_batch_size > 1.0, "concurrent requests shared no batch");
    PublisherReport {
        per_partition,
        mean_batch_size,
    }
}

fn event(key: &str, seq: usize) -> Event {
    let request: Value = delivery_request(seq);
    let mut request: DeliveryRequest = serde_json::from_value(request).unwrap();
    request.package_info.tag = Some(seq.to_string());
    Event::DeliveryRequested(Box::new(DeliveryRequested {
        delivery_id: key.to_owned(),
        accepted_at: time::OffsetDateTime::now_utc(),
        traceparent: Some(format!("00-{:032x}-{:016x}-01", seq + 1, seq + 1)),
        idempotency_key: Some(key.to_owned()),
        principal: None,
        epoch: 0,
        redrive: None,
        request,
    }))
}

/// A tag that keeps this run's ids apart from earlier runs' on a shared namespace.
pub fn run_tag() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("r{:x}", nanos % (1 << 40))
}

/// A valid delivery request with ids unique to `run`.
pub fn tagged_request(run: &str, n: usize) -> Value {
    let mut request = delivery_request(n);
    request["deliveryId"] = Value::from(format!("{run}-delivery-{n}"));
    request["packageInfo"]["packageId"] = Value::from(format!("{run}-package-{n}"));
    request
}

/// Posts `count` requests tagged with `run`, `CONCURRENCY` at a time; returns their status URLs.
pub async fn post_tagged(client: &Client, run: &str, count: usize) -> Vec<String> {
    let permits = Arc::new(Semaphore::new(CONCURRENCY));
    let mut posts = JoinSet::new();
    for n in 0..count {
        let client = client.clone();
        let request = tagged_request(run, n);
        let permit = Arc::clone(&permits).acquire_owned().await.unwrap();
        posts.spawn(async move {
            let accepted = client.post_delivery(&request).await;
            drop(permit);
            accepted.status_url
        });
    }
    posts.join_all().await
}

/// Owners of `hub`'s partitions whose claims have not expired, with how many each has.
pub async fn owners(
    leases: &(dyn CheckpointStore + Send + Sync),
    settings: &Settings,
    hub: &str,
) -> BTreeMap<String, usize> {
    let expiry = time::Duration::milliseconds(
        i64::try_from(settings.eventhubs.partition_expiration_ms.count()).unwrap(),
    );
    let now = time::OffsetDateTime::now_utc();
    let mut owners = BTreeMap::new();
    for ownership in leases
        .list_ownerships(
            &namespace(&settings.eventhubs),
            hub,
            &settings.worker.consumer_group,
        )
        .await
        .unwrap()
    {
        let live = ownership
            .last_modified_time
            .is_some_and(|t| t + expiry >= now);
        if let (Some(owner), true) = (ownership.owner_id, live) {
            *owners.entry(owner).or_default() += 1;
        }
    }
    owners
}

/// Waits until `check` holds for the owners of `hub`; panics after `timeout`.
async fn wait_for_owners(
    leases: &(dyn CheckpointStore + Send + Sync),
    settings: &Settings,
    hub: &str,
    timeout: Duration,
    check: impl Fn(&BTreeMap<String, usize>) -> bool,
) -> Duration {
    let started = Instant::now();
    loop {
        let owners = owners(leases, settings, hub).await;
        if check(&owners) {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < timeout,
            "owners are {owners:?} after {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What the two-worker scenario saw.
#[derive(Debug)]
pub struct TakeoverReport {
    /// From the second worker stopping to the first owning every partition.
    pub takeover: Duration,
    /// Events of deliveries an earlier attempt had already started or finished.
    pub duplicates: u64,
    /// The most duplicates the in-flight windows allow.
    pub bound: u64,
}

/// Two workers on one hub: ownership settles at an even split; one stops
/// while 1,000 requests are in flight; the other owns every partition within
/// the expiry, every request reaches Scheduled, and duplicates stay within
/// the in-flight windows. `open_store` opens a client of the one shared
/// Cosmos DB account.
pub async fn two_workers_share_a_hub_and_one_takes_over(
    settings: Settings,
    open_store: impl AsyncFn() -> Arc<CosmosStore>,
) -> TakeoverReport {
    let hub = settings.eventhubs.hubs[0].clone();
    let run = run_tag();
    let store_a = open_store().await;
    let leases: Arc<dyn CheckpointStore + Send + Sync> =
        Arc::new(LeaseCheckpointStore::new(store_a.clone()));
    let a = start(&settings, store_a).await;
    let mut settings_b = settings.clone();
    settings_b.services.base_url = Some(a.services_url.clone());
    let b = start(&settings_b, open_store().await).await;
    let partitions =
        u32::try_from(last_sequence_numbers(&settings.eventhubs).await[0].len()).unwrap();
    let half = usize::try_from(partitions / 2).unwrap();
    let settle = settings.eventhubs.update_interval_ms.duration() * (partitions * 4);
    wait_for_owners(leases.as_ref(), &settings, &hub, settle, |owners| {
        owners.len() == 2 && owners.values().all(|&n| n == half)
    })
    .await;

    let client = Client::new(format!("http://{}", a.gateway_addr));
    let urls = post_tagged(&client, &run, 1_000).await;
    let b_tally = Arc::clone(&b.tally);
    b.stop().await.unwrap();
    let all = usize::try_from(partitions).unwrap();
    let expiry = settings.eventhubs.partition_expiration_ms.duration();
    let takeover = wait_for_owners(leases.as_ref(), &settings, &hub, expiry, |owners| {
        owners.len() == 1 && owners.values().all(|&n| n == all)
    })
    .await;
    let documents = client
        .wait_for_terminal(&urls, Duration::from_secs(120))
        .await;
    assert!(
        documents
            .iter()
            .all(|d| d.state == DeliveryState::Scheduled)
    );
    let duplicates = a.tally.replayed.load(std::sync::atomic::Ordering::Relaxed)
        + b_tally.replayed.load(std::sync::atomic::Ordering::Relaxed);
    let bound = u64::from(partitions) * settings.worker.max_in_flight as u64;
    assert!(
        duplicates <= bound,
        "{duplicates} duplicates; the in-flight windows allow {bound}"
    );
    a.stop().await.unwrap();
    TakeoverReport {
        takeover,
        duplicates,
        bound,
    }
}

async fn start(settings: &Settings, store: Arc<CosmosStore>) -> App {
    let backends = Backends::open_with(settings, Some(store)).await.unwrap();
    App::start_with(settings.clone(), backends, CancellationToken::new())
        .await
        .unwrap()
}

/// Gateway → Event Hubs → worker → status: `count` requests reach Scheduled
/// and their status reads back through the gateway.
pub async fn requests_reach_scheduled_end_to_end(app: &App, count: usize) -> Duration {
    let run = run_tag();
    let client = Client::new(format!("http://{}", app.gateway_addr));
    let started = Instant::now();
    let urls = post_tagged(&client, &run, count).await;
    let documents = client
        .wait_for_terminal(&urls, Duration::from_secs(180))
        .await;
    let states: BTreeMap<String, usize> = documents.iter().fold(BTreeMap::new(), |mut m, d| {
        *m.entry(format!("{:?}", d.state)).or_default() += 1;
        m
    });
    assert_eq!(states.get("Scheduled"), Some(&count), "{states:?}");
    started.elapsed()
}
