//! The Event Hubs publisher: one batching sender task per (hub, partition).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use azure_messaging_eventhubs::models::EventData;
use azure_messaging_eventhubs::{EventDataBatchOptions, ProducerClient};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tracing::Instrument;

use skyport_core::event::content_type;
use skyport_core::partitioning::shard_for;
use skyport_core::ports::{BoxError, Lane, OutboundEvent, Position, PublishError, Publisher};
use skyport_runtime::config::EventHubsSettings;
use skyport_runtime::metrics::{self, StreamLabels};

use super::namespace::{EventHubsOpenError, Namespace, sorted_partition_ids};

/// Application property with the envelope's schema version.
pub const SCHEMA_VERSION_PROPERTY: &str = "schemaVersion";
/// Application property with the W3C trace context.
pub const TRACEPARENT_PROPERTY: &str = "traceparent";
/// Application property with the request's idempotency key.
pub const IDEMPOTENCY_KEY_PROPERTY: &str = "idempotencyKey";

/// Publishes to Event Hubs, sharded over the configured hubs; the
/// expedited lane's events over `eventhubs.expedited_hubs` when it lists any.
#[derive(Debug)]
pub struct EventHubsPublisher {
    normal: Shards,
    expedited: Option<Shards>,
    healthy: Arc<AtomicBool>,
    stats: Arc<PublishStats>,
    _senders: JoinSet<()>,
}

/// One lane's hubs.
#[derive(Debug, Default)]
struct Shards {
    /// Per hub, the queue of each partition's sender task.
    hubs: Vec<Vec<mpsc::Sender<Pending>>>,
    /// Partitions of the hubs listed before each hub (the worker's numbering).
    first: Vec<u32>,
}

/// Batches acknowledged by Event Hubs and the events they carried.
#[derive(Debug, Default)]
pub struct PublishStats {
    pub batches: AtomicU64,
    pub events: AtomicU64,
}

impl PublishStats {
    /// Events per acknowledged batch, on average.
    pub fn mean_batch_size(&self) -> f64 {
        let batches = self.batches.load(Ordering::Relaxed);
        if batches == 0 {
            return 0.0;
        }
        // Counts stay far below 2^52, where f64 is exact.
        #[allow(clippy::cast_precision_loss)]
        let mean = self.events.load(Ordering::Relaxed) as f64 / batches as f64;
        mean
    }
}

#[derive(Debug)]
struct Pending {
    event: OutboundEvent,
    reply: oneshot::Sender<Result<(), Arc<BoxError>>>,
}

#[derive(Debug, Clone, Copy)]
struct Limits {
    linger: Duration,
    max_bytes: u64,
    max_events: usize,
    send_timeout: Duration,
}

impl EventHubsPublisher {
    /// Connects to every hub and starts a sender per partition.
    ///
    /// # Errors
    /// [`EventHubsOpenError`] names the hub that cannot be opened.
    pub async fn open(settings: &EventHubsSettings) -> Result<Self, EventHubsOpenError> {
        let namespace = Namespace::new(settings)?;
        metrics::global().stream_started(STREAM);
        let limits = Limits {
            linger: settings.linger_ms.duration(),
            max_bytes: settings.max_batch_bytes,
            max_events: settings.max_batch_events,
            send_timeout: settings.send_timeout_ms.duration(),
        };
        let healthy = Arc::new(AtomicBool::new(true));
        let stats = Arc::new(PublishStats::default());
        let mut senders = JoinSet::new();
        let mut normal = Shards::default();
        let mut expedited = Shards::default();
        let mut numbered = 0u32;
        for (hub, lane) in &settings.lane_hubs() {
            let client = Arc::new(HubClient::open(&namespace, hub).await?);
            let properties = client
                .current()
                .1
                .get_eventhub_properties()
                .await
                .map_err(|e| namespace.open_error(hub, e))?;
            let ids = sorted_partition_ids(hub, properties.partition_ids)?;
            let mut queues = Vec::with_capacity(ids.len());
            for id in ids {
                let (tx, rx) = mpsc::channel(settings.queue_capacity);
                let span = tracing::info_span!("eventhubs_sender", hub = %hub, partition = %id);
                senders.spawn(
                    send_loop(
                        Arc::clone(&client),
                        id,
                        rx,
                        limits,
                        Arc::clone(&healthy),
                        Arc::clone(&stats),
                    )
                    .instrument(span),
                );
                queues.push(tx);
            }
            let shards = match lane {
                Lane::Normal => &mut normal,
                Lane::Expedited => &mut expedited,
            };
            shards.first.push(numbered);
            numbered += u32::try_from(queues.len()).unwrap_or(u32::MAX);
            shards.hubs.push(queues);
            tracing::info!(hub = %hub, namespace = %namespace.name, lane = lane.as_str(), "Publishing to the event hub.");
        }
        Ok(Self {
            normal,
            expedited: (!expedited.hubs.is_empty()).then_some(expedited),
            healthy,
            stats,
            _senders: senders,
        })
    }

    /// What has been sent so far.
    pub fn stats(&self) -> &PublishStats {
        &self.stats
    }
}

#[async_trait]
impl Publisher for EventHubsPublisher {
    async fn publish(&self, event: OutboundEvent) -> Result<Position, PublishError> {
        let shards = match (&self.expedited, event.lane) {
            (Some(expedited), Lane::Expedited) => expedited,
            _ => &self.normal,
        };
        let hubs = u32::try_from(shards.hubs.len()).unwrap_or(u32::MAX);
        let (hub, partition) = shard_for(&event.key, hubs, |hub| {
            u32::try_from(shards.hubs[hub as usize].len()).unwrap_or(u32::MAX)
        });
        let (reply, answer) = oneshot::channel();
        shards.hubs[hub as usize][partition as usize]
            .send(Pending { event, reply })
            .await
            .map_err(|_| PublishError::Closed)?;
        match answer.await {
            Ok(Ok(())) => Ok(Position {
                partition: shards.first[hub as usize] + partition,
                offset: None,
            }),
            Ok(Err(e)) => Err(PublishError::Unavailable(Box::new(SendFailed(e)))),
            Err(_) => Err(PublishError::Closed),
        }
    }

    async fn ready(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    fn has_expedited_lane(&self) -> bool {
        self.expedited.is_some()
    }
}

/// A batch that was not acknowledged; shared by every request in it.
#[derive(Debug, thiserror::Error)]
#[error("the batch was not acknowledged by Event Hubs")]
struct SendFailed(#[source] Arc<BoxError>);

/// Takes what is queued for one partition, lingers for more, sends it, and
/// answers each request; one batch in flight at a time keeps each key's order.
async fn send_loop(
    client: Arc<HubClient>,
    partition_id: String,
    mut queue: mpsc::Receiver<Pending>,
    limits: Limits,
    healthy: Arc<AtomicBool>,
    stats: Arc<PublishStats>,
) {
    let mut waiting: Vec<Pending> = Vec::new();
    loop {
        if waiting.is_empty() {
            match queue.recv().await {
                Some(first) => waiting.push(first),
                None => return,
            }
        }
        let deadline = Instant::now() + limits.linger;
        while waiting.len() < limits.max_events {
            match tokio::time::timeout_at(deadline, queue.recv()).await {
                Ok(Some(next)) => waiting.push(next),
                Ok(None) | Err(_) => break,
            }
        }
        let (generation, producer) = client.current();
        let sent = send_batch(&producer, &partition_id, &mut waiting, limits).await;
        drop(producer);
        match sent {
            Ok((batch, events)) => {
                healthy.store(true, Ordering::Relaxed);
                stats.batches.fetch_add(1, Ordering::Relaxed);
                stats.events.fetch_add(events as u64, Ordering::Relaxed);
                tracing::trace!(events, "Sent a batch.");
                for pending in batch {
                    let _ = pending.reply.send(Ok(()));
                }
            }
            Err((batch, e)) => {
                healthy.store(false, Ordering::Relaxed);
                tracing::warn!(events = batch.len(), error = %e, "A batch was not acknowledged; its requests are refused.");
                let e = Arc::new(e);
                for pending in batch {
                    let _ = pending.reply.send(Err(Arc::clone(&e)));
                }
                client.reconnect(generation, limits.send_timeout).await;
            }
        }
    }
}

/// One hub's producer, replaced by a fresh connection after a failed send:
/// the SDK keeps a dropped connection and fails every send on it.
struct HubClient {
    namespace: Namespace,
    hub: String,
    /// The producer and how many times it has been replaced.
    current: std::sync::RwLock<(u64, Arc<ProducerClient>)>,
    /// Held while one partition's sender reconnects; the others go on.
    reconnecting: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for HubClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HubClient")
            .field("hub", &self.hub)
            .finish_non_exhaustive()
    }
}

impl HubClient {
    async fn open(namespace: &Namespace, hub: &str) -> Result<Self, EventHubsOpenError> {
        let producer = namespace.producer(hub).await?;
        Ok(Self {
            namespace: namespace.clone(),
            hub: hub.to_owned(),
            current: std::sync::RwLock::new((0, Arc::new(producer))),
            reconnecting: tokio::sync::Mutex::new(()),
        })
    }

    fn current(&self) -> (u64, Arc<ProducerClient>) {
        let current = self
            .current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        (current.0, Arc::clone(&current.1))
    }

    /// Opens a new connection in place of generation `failed`, unless another
    /// sender already did or is doing it; a failed attempt is tried again
    /// after the next failed send.
    async fn reconnect(&self, failed: u64, timeout: Duration) {
        let Ok(_reconnecting) = self.reconnecting.try_lock() else {
            return;
        };
        if self.current().0 != failed {
            return;
        }
        match tokio::time::timeout(timeout, self.namespace.producer(&self.hub)).await {
            Ok(Ok(producer)) => {
                let mut current = self
                    .current
                    .write()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                *current = (failed + 1, Arc::new(producer));
                tracing::info!("Reconnected to the event hub.");
            }
            Ok(Err(e)) => tracing::warn!(error = %e, "Cannot reconnect to the event hub yet."),
            Err(_) => tracing::warn!("Cannot reconnect to the event hub yet: timed out."),
        }
    }
}

type Sent = (Vec<Pending>, usize);
type Failed = (Vec<Pending>, BoxError);

/// Sends as many of `waiting` (from the front) as fit in one batch, and hands
/// them back with the outcome; the rest stay waiting for the next batch.
async fn send_batch(
    client: &ProducerClient,
    partition_id: &str,
    waiting: &mut Vec<Pending>,
    limits: Limits,
) -> Result<Sent, Failed> {
    let options = EventDataBatchOptions {
        partition_id: Some(partition_id.to_owned()),
        ..EventDataBatchOptions::default()
    };
    let batch =
        match tokio::time::timeout(limits.send_timeout, client.create_batch(Some(options))).await {
            Ok(Ok(batch)) => batch,
            Ok(Err(e)) => return Err((std::mem::take(waiting), Box::new(e))),
            Err(elapsed) => return Err((std::mem::take(waiting), Box::new(elapsed))),
        };
    let mut taken = 0;
    for pending in waiting.iter() {
        if batch.size() >= limits.max_bytes {
            break;
        }
        match batch.try_add_event_data(event_data(&pending.event), None) {
            Ok(true) => taken += 1,
            Ok(false) => break,
            Err(e) => return Err((std::mem::take(waiting), Box::new(e))),
        }
    }
    if taken == 0 {
        // One event larger than the hub takes: refuse it alone.
        let refused = waiting.remove(0);
        let e: BoxError = "the event is larger than the event hub accepts".into();
        return Err((vec![refused], e));
    }
    let rest = waiting.split_off(taken);
    let batch_events = std::mem::replace(waiting, rest);
    let started = Instant::now();
    let sent = tokio::time::timeout(limits.send_timeout, client.send_batch(batch, None)).await;
    let metrics = metrics::global();
    if let Ok(Ok(())) = sent {
        metrics.published(STREAM, taken, started.elapsed().as_secs_f64());
    } else {
        metrics
            .publish_failures
            .get_or_create(&StreamLabels { stream: STREAM })
            .inc();
    }
    match sent {
        Ok(Ok(())) => Ok((batch_events, taken)),
        Ok(Err(e)) => Err((batch_events, Box::new(e))),
        Err(elapsed) => Err((batch_events, Box::new(elapsed))),
    }
}

/// The `stream` label of this stream's publish metrics.
const STREAM: &str = "eventhubs";

fn event_data(event: &OutboundEvent) -> EventData {
    let mut builder = EventData::builder()
        .with_body(event.payload.to_vec())
        .with_content_type(content_type(event.properties.schema_version))
        .add_property(
            SCHEMA_VERSION_PROPERTY.to_owned(),
            event.properties.schema_version,
        );
    if let Some(traceparent) = &event.properties.traceparent {
        builder = builder.add_property(TRACEPARENT_PROPERTY.to_owned(), traceparent.clone());
    }
    if let Some(key) = &event.properties.idempotency_key {
        builder = builder.add_property(IDEMPOTENCY_KEY_PROPERTY.to_owned(), key.clone());
    }
    builder.build()
}
