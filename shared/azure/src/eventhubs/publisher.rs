//! The Event Hubs publisher: one batching sender task per (hub, partition),
//! answering each request with what the hub said of its batch: stored
//! (Accepted), not stored (Released, Modified, Rejected, or never sent), or
//! unknown (sent, and no outcome came back).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use azure_core_amqp::AmqpMessage;
use azure_messaging_eventhubs::models::EventData;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tracing::Instrument;

use skyport_core::event::content_type;
use skyport_core::partitioning::shard_for;
use skyport_core::ports::{BoxError, Lane, OutboundEvent, Position, PublishError, Publisher};
use skyport_runtime::config::EventHubsSettings;
use skyport_runtime::metrics::{self, StreamLabels};

use super::batch::Batch;
use super::connection::{HubConnection, Outcome, PartitionSender};
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
    reply: oneshot::Sender<Result<(), Failed>>,
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
            let ids = partition_ids(&namespace, hub).await?;
            let client = Arc::new(HubClient::open(&namespace, hub).await?);
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
            Ok(Err(failed)) => Err(failed.into()),
            // The sender ended without an answer (it panicked), maybe after the batch left.
            Err(_) => Err(PublishError::Unknown(
                "the Event Hubs sender ended before it answered".into(),
            )),
        }
    }

    async fn ready(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    fn has_expedited_lane(&self) -> bool {
        self.expedited.is_some()
    }
}

/// Why a batch's requests were refused; shared by every request in it.
#[derive(Debug, Clone)]
struct Failed {
    fate: Fate,
    error: Arc<BoxError>,
}

/// Whether a refused batch may yet be in the hub.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// It never left, or the service answered that it did not store it.
    NotStored,
    /// It was sent and no outcome came back.
    Unknown,
}

impl Failed {
    fn not_stored(error: BoxError) -> Self {
        Self {
            fate: Fate::NotStored,
            error: Arc::new(error),
        }
    }

    fn unknown(error: BoxError) -> Self {
        Self {
            fate: Fate::Unknown,
            error: Arc::new(error),
        }
    }
}

impl From<Failed> for PublishError {
    fn from(failed: Failed) -> Self {
        match failed.fate {
            Fate::NotStored => Self::Unavailable(Box::new(BatchNotStored(failed.error))),
            Fate::Unknown => Self::Unknown(Box::new(BatchFateUnknown(failed.error))),
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("Event Hubs did not store the batch")]
struct BatchNotStored(#[source] Arc<BoxError>);

#[derive(Debug, thiserror::Error)]
#[error("Event Hubs did not say whether it stored the batch")]
struct BatchFateUnknown(#[source] Arc<BoxError>);

/// The hub's partitions, read with the SDK's management client on a
/// connection of its own (the sends go on another, see [`HubConnection`]).
async fn partition_ids(
    namespace: &Namespace,
    hub: &str,
) -> Result<Vec<String>, EventHubsOpenError> {
    let producer = namespace.producer(hub).await?;
    let properties = producer
        .get_eventhub_properties()
        .await
        .map_err(|e| namespace.open_error(hub, e));
    if let Err(error) = producer.close().await {
        tracing::debug!(hub, %error, "The event hub's management connection did not close cleanly.");
    }
    sorted_partition_ids(hub, properties?.partition_ids)
}

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
    let mut link: Option<Arc<PartitionSender>> = None;
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
        let (batch, sent) =
            send_batch(&client, &partition_id, &mut link, &mut waiting, limits).await;
        match sent {
            Ok(()) => {
                healthy.store(true, Ordering::Relaxed);
                stats.batches.fetch_add(1, Ordering::Relaxed);
                stats
                    .events
                    .fetch_add(batch.len() as u64, Ordering::Relaxed);
                tracing::trace!(events = batch.len(), "Sent a batch.");
                for pending in batch {
                    let _ = pending.reply.send(Ok(()));
                }
            }
            Err(failed) => {
                healthy.store(false, Ordering::Relaxed);
                let stored = match failed.fate {
                    Fate::NotStored => "no",
                    Fate::Unknown => "unknown",
                };
                tracing::warn!(events = batch.len(), stored, error = %failed.error, "A batch was not acknowledged; its requests are refused.");
                for pending in batch {
                    let _ = pending.reply.send(Err(failed.clone()));
                }
                // A broken connection is replaced now rather than on the next request.
                if let Err(error) = client
                    .connection(Instant::now() + limits.send_timeout)
                    .await
                {
                    tracing::warn!(%error, "Cannot reconnect to the event hub yet.");
                }
            }
        }
    }
}

/// Sends as many of `waiting` (from the front) as fit in one batch, and
/// hands them back with what became of them; the rest stay waiting. A send
/// that got no outcome because its link or connection failed is made once
/// more on a new connection within the send timeout, as the SDK retried it:
/// the hub may then hold the batch twice, which the worker allows for (it
/// runs one delivery per id).
async fn send_batch(
    client: &HubClient,
    partition_id: &str,
    link: &mut Option<Arc<PartitionSender>>,
    waiting: &mut Vec<Pending>,
    limits: Limits,
) -> (Vec<Pending>, Result<(), Failed>) {
    let deadline = Instant::now() + limits.send_timeout;
    let sender = match linked(client, partition_id, link, deadline).await {
        Ok(sender) => sender,
        Err(failed) => return (std::mem::take(waiting), Err(failed)),
    };
    let (batch, message) = match take_batch(waiting, sender.max_message_size(), limits) {
        Ok(taken) => taken,
        Err((refused, error)) => return (refused, Err(Failed::not_stored(error))),
    };
    let started = Instant::now();
    let mut sent = send(&sender, &message, deadline).await;
    if matches!(
        sent,
        Sent::NoOutcome {
            timed_out: false,
            ..
        }
    ) && let Ok(sender) = linked(client, partition_id, link, deadline).await
        && let Sent::Stored = send(&sender, &message, deadline).await
    {
        sent = Sent::Stored;
    }
    let metrics = metrics::global();
    let result = match sent {
        Sent::Stored => {
            metrics.published(STREAM, batch.len(), started.elapsed().as_secs_f64());
            Ok(())
        }
        Sent::NotStored(error) => Err(Failed::not_stored(error)),
        // Even when a second send was refused, the first may have been stored.
        Sent::NoOutcome { error, .. } => Err(Failed::unknown(error)),
    };
    if result.is_err() {
        metrics
            .publish_failures
            .get_or_create(&StreamLabels { stream: STREAM })
            .inc();
    }
    (batch, result)
}

/// What became of one send of a batch.
#[derive(Debug)]
enum Sent {
    /// The service accepted it.
    Stored,
    /// The service answered that it did not store it.
    NotStored(BoxError),
    /// No outcome came back: the link or connection failed, or the send timed out.
    NoOutcome { error: BoxError, timed_out: bool },
}

/// Sends `message` and waits for its outcome until `deadline`; a send with
/// no outcome takes its connection out of use.
async fn send(sender: &PartitionSender, message: &AmqpMessage, deadline: Instant) -> Sent {
    let sent = tokio::time::timeout_at(deadline, sender.send(message)).await;
    if !matches!(sent, Ok(Ok(_))) {
        sender.connection().set_broken();
    }
    match sent {
        Ok(Ok(Outcome::Stored)) => Sent::Stored,
        Ok(Ok(Outcome::NotStored(refusal))) => Sent::NotStored(Box::new(refusal)),
        Ok(Err(error)) => Sent::NoOutcome {
            error: Box::new(error),
            timed_out: false,
        },
        Err(elapsed) => Sent::NoOutcome {
            error: Box::new(elapsed),
            timed_out: true,
        },
    }
}

/// The partition's sender: the one it has unless its connection broke, or
/// one attached anew. An attach that fails on a connection opened earlier
/// (which may have died meanwhile) is tried once more on a new connection.
async fn linked(
    client: &HubClient,
    partition_id: &str,
    link: &mut Option<Arc<PartitionSender>>,
    deadline: Instant,
) -> Result<Arc<PartitionSender>, Failed> {
    if let Some(sender) = link
        .as_ref()
        .filter(|sender| !sender.connection().is_broken())
    {
        return Ok(Arc::clone(sender));
    }
    *link = None;
    loop {
        let (connection, opened) = client
            .connection(deadline)
            .await
            .map_err(Failed::not_stored)?;
        let attached = tokio::time::timeout_at(deadline, connection.attach(partition_id)).await;
        let error: BoxError = match attached {
            Ok(Ok(sender)) => {
                let sender = Arc::new(sender);
                *link = Some(Arc::clone(&sender));
                return Ok(sender);
            }
            Ok(Err(error)) => Box::new(error),
            Err(elapsed) => Box::new(elapsed),
        };
        connection.set_broken();
        if opened || Instant::now() >= deadline {
            return Err(Failed::not_stored(error));
        }
    }
}

/// Moves the front of `waiting` into one batch for a link that takes
/// messages up to `max_message_size`. An event too large to go even alone
/// is refused by itself; one that cannot be encoded refuses every request.
fn take_batch(
    waiting: &mut Vec<Pending>,
    max_message_size: Option<u64>,
    limits: Limits,
) -> Result<(Vec<Pending>, AmqpMessage), (Vec<Pending>, BoxError)> {
    let mut batch = Batch::new(max_message_size.unwrap_or(u64::MAX));
    for pending in waiting.iter() {
        if batch.size() >= limits.max_bytes {
            break;
        }
        match batch.try_add(AmqpMessage::from(event_data(&pending.event))) {
            Ok(true) => {}
            Ok(false) => break,
            Err(e) => return Err((std::mem::take(waiting), Box::new(e))),
        }
    }
    let taken = batch.len();
    let Some(message) = batch.into_message() else {
        let refused = waiting.remove(0);
        let e: BoxError = "the event is larger than the event hub accepts".into();
        return Err((vec![refused], e));
    };
    let rest = waiting.split_off(taken);
    Ok((std::mem::replace(waiting, rest), message))
}

/// A hub's connection for publishing, replaced by a new one once a send or
/// an attach on it failed.
struct HubClient {
    namespace: Namespace,
    hub: String,
    current: std::sync::RwLock<Arc<HubConnection>>,
    /// Held while a new connection is being opened, so that only one is.
    connecting: tokio::sync::Mutex<()>,
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
        let connection = HubConnection::open(namespace, hub)
            .await
            .map_err(|e| namespace.open_error(hub, e))?;
        Ok(Self {
            namespace: namespace.clone(),
            hub: hub.to_owned(),
            current: std::sync::RwLock::new(connection),
            connecting: tokio::sync::Mutex::new(()),
        })
    }

    fn live(&self) -> Option<Arc<HubConnection>> {
        let current = self
            .current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        (!current.is_broken()).then(|| Arc::clone(&current))
    }

    /// The connection to send on, and whether it was opened just now: the
    /// current one, or a new one in its place if it broke.
    ///
    /// # Errors
    /// When no connection opens before `deadline`.
    async fn connection(&self, deadline: Instant) -> Result<(Arc<HubConnection>, bool), BoxError> {
        if let Some(live) = self.live() {
            return Ok((live, false));
        }
        let _one = tokio::time::timeout_at(deadline, self.connecting.lock()).await?;
        if let Some(live) = self.live() {
            return Ok((live, false));
        }
        let opened =
            tokio::time::timeout_at(deadline, HubConnection::open(&self.namespace, &self.hub))
                .await??;
        *self
            .current
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::clone(&opened);
        tracing::info!("Connected to the event hub again.");
        Ok((opened, true))
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
