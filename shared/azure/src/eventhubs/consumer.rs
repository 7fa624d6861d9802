//! The Event Hubs consumer: a processor per hub, and their partition loops, on
//! a `LocalSet` on a thread of their own.
//!
//! The thread starts when the worker asks for its first partition, so a
//! gateway that never consumes never claims a partition. At shutdown (after
//! every partition has drained and written its final checkpoint) the thread
//! gives up this instance's ownerships, so other workers take them over at
//! their next balancing instead of after the expiry.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use azure_messaging_eventhubs::models::{Ownership, StartPositions};
use azure_messaging_eventhubs::{
    CheckpointStore, ConsumerClient, EventProcessor, ProcessorStrategy, StartLocation,
    StartPosition,
};
use skyport_core::ports::{ConsumeError, Consumer, LeaseStore, PartitionReader};
use skyport_runtime::config::EventHubsSettings;
use tokio::sync::{Mutex, mpsc};
use tokio::task::LocalSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::checkpoints::{Checkpoints, LeaseCheckpointStore};
use super::hub::HubContext;
use super::namespace::{EventHubsOpenError, Namespace, sorted_partition_ids};
use super::reader::{EventHubsPartitionReader, Owners, pump};
use super::tails::Tails;

/// How long a failed processor or connection waits before it is tried again, at most.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// How long opening a hub's client may take before it is tried again.
const OPEN_TIMEOUT: Duration = Duration::from_secs(30);

/// Hands out the partitions this worker's processors win, one per hub.
pub struct EventHubsConsumer {
    settings: EventHubsSettings,
    consumer_group: String,
    store: Checkpoints,
    running: Mutex<Option<Running>>,
}

impl std::fmt::Debug for EventHubsConsumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventHubsConsumer")
            .field("hubs", &self.settings.hubs)
            .field("expedited_hubs", &self.settings.expedited_hubs)
            .field("consumer_group", &self.consumer_group)
            .finish_non_exhaustive()
    }
}

#[derive(Debug)]
struct Running {
    readers: mpsc::Receiver<EventHubsPartitionReader>,
    stop: CancellationToken,
    thread: std::thread::JoinHandle<()>,
}

impl EventHubsConsumer {
    /// A consumer in `consumer_group` keeping its ownerships and checkpoints in `leases`.
    pub fn new(
        settings: &EventHubsSettings,
        consumer_group: &str,
        leases: Arc<dyn LeaseStore>,
    ) -> Self {
        Self {
            settings: settings.clone(),
            consumer_group: consumer_group.to_owned(),
            store: Arc::new(LeaseCheckpointStore::across_hubs(
                leases,
                settings
                    .lane_hubs()
                    .into_iter()
                    .map(|(hub, _)| hub)
                    .collect(),
                settings.partition_expiration_ms.duration(),
            )),
            running: Mutex::new(None),
        }
    }

    fn start(&self) -> std::io::Result<Running> {
        let owner = self
            .settings
            .instance_id
            .clone()
            .unwrap_or_else(random_owner_id);
        let capacity = self.settings.lane_hubs().len() * 64;
        let (readers, rx) = mpsc::channel(capacity);
        let stop = CancellationToken::new();
        let processors = Processors {
            settings: self.settings.clone(),
            consumer_group: self.consumer_group.clone(),
            owner,
            store: Arc::clone(&self.store),
            readers,
            stop: stop.clone(),
        };
        let thread = std::thread::Builder::new()
            .name("skyport-eventhubs".into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(e) => {
                        tracing::error!(error = %e, "Cannot start the Event Hubs consumer's runtime.");
                        return;
                    }
                };
                LocalSet::new().block_on(&runtime, processors.run());
            })?;
        Ok(Running {
            readers: rx,
            stop,
            thread,
        })
    }
}

#[async_trait]
impl Consumer for EventHubsConsumer {
    async fn next_partition(&self) -> Result<Box<dyn PartitionReader>, ConsumeError> {
        let mut running = self.running.lock().await;
        if running.is_none() {
            *running = Some(
                self.start()
                    .map_err(|e| ConsumeError::Unavailable(Box::new(e)))?,
            );
        }
        let Some(Running { readers, .. }) = running.as_mut() else {
            unreachable!("started above");
        };
        match readers.recv().await {
            Some(reader) => Ok(Box::new(reader)),
            None => Err(ConsumeError::Unavailable(
                "the Event Hubs consumer thread has stopped".into(),
            )),
        }
    }

    async fn stop(&self) {
        let Some(running) = self.running.lock().await.take() else {
            return;
        };
        let Running {
            readers,
            stop,
            thread,
        } = running;
        // Partitions handed over but never started are dropped, which ends their loops.
        drop(readers);
        stop.cancel();
        let joined = tokio::task::spawn_blocking(move || thread.join()).await;
        if !matches!(joined, Ok(Ok(()))) {
            tracing::error!("The Event Hubs consumer thread did not stop cleanly.");
        }
    }
}

/// Everything the consumer thread runs.
struct Processors {
    settings: EventHubsSettings,
    consumer_group: String,
    owner: String,
    store: Checkpoints,
    readers: mpsc::Sender<EventHubsPartitionReader>,
    stop: CancellationToken,
}

impl Processors {
    async fn run(self) {
        let namespace = match Namespace::new(&self.settings) {
            Ok(namespace) => namespace,
            Err(e) => {
                tracing::error!(error = %e, "Cannot consume from Event Hubs.");
                return;
            }
        };
        let Some(opened) = self.open_hubs(&namespace).await else {
            return;
        };
        let mut loops = tokio::task::JoinSet::new();
        let mut hubs = Vec::with_capacity(opened.len());
        for (client, context) in opened {
            let span = tracing::info_span!("eventhubs_processor", hub = %context.hub);
            let tails = Arc::new(Tails::default());
            loops.spawn_local({
                let (tails, namespace, context, stop) = (
                    Arc::clone(&tails),
                    namespace.clone(),
                    context.clone(),
                    self.stop.clone(),
                );
                async move { tails.run(&namespace, &context, &stop).await }.instrument(span.clone())
            });
            loops.spawn_local(
                supervise(
                    client,
                    namespace.clone(),
                    Hub {
                        context: context.clone(),
                        tails,
                    },
                    self.settings.clone(),
                    Arc::clone(&self.store),
                    self.readers.clone(),
                    self.stop.clone(),
                )
                .instrument(span),
            );
            hubs.push(context);
        }
        tracing::info!(owner = %self.owner, hubs = hubs.len(), "Consuming from Event Hubs.");
        self.stop.cancelled().await;
        while loops.join_next().await.is_some() {}
        for context in &hubs {
            relinquish(self.store.as_ref(), context).await;
        }
    }

    /// Opens a client per hub and learns its partitions, retrying until every
    /// hub answers or the consumer stops.
    async fn open_hubs(&self, namespace: &Namespace) -> Option<Vec<(ConsumerClient, HubContext)>> {
        let hubs = self.settings.lane_hubs();
        let mut opened = Vec::with_capacity(hubs.len());
        let mut first = 0u32;
        for (hub, lane) in &hubs {
            let mut delay = RestartDelay::default();
            let (client, partition_ids) = loop {
                let attempt = async {
                    let client = namespace
                        .consumer(hub, &self.consumer_group, &self.owner)
                        .await?;
                    let properties = client
                        .get_eventhub_properties()
                        .await
                        .map_err(|e| namespace.open_error(hub, e))?;
                    let ids = sorted_partition_ids(hub, properties.partition_ids)?;
                    Ok::<_, EventHubsOpenError>((client, ids))
                };
                let attempt = tokio::select! {
                    () = self.stop.cancelled() => return None,
                    attempt = tokio::time::timeout(OPEN_TIMEOUT, attempt) => attempt,
                };
                match attempt
                    .unwrap_or_else(|_| Err(namespace.open_error(hub, "no answer within 30 s")))
                {
                    Ok(opened) => break opened,
                    Err(e) => {
                        tracing::error!(error = %e, retry_in_ms = delay.delay.as_millis(), "Cannot open the event hub for consuming.");
                        if !delay.wait(&self.stop).await {
                            return None;
                        }
                    }
                }
            };
            let count = u32::try_from(partition_ids.len()).unwrap_or(u32::MAX);
            opened.push((
                client,
                HubContext {
                    namespace: namespace.name.clone(),
                    hub: hub.clone(),
                    consumer_group: self.consumer_group.clone(),
                    owner: self.owner.clone(),
                    first,
                    partition_ids,
                    lane: *lane,
                },
            ));
            first = first.saturating_add(count);
        }
        Some(opened)
    }
}

/// Runs one hub's processor and turns each partition it wins into a reader.
/// When the processor fails, it is rebuilt on a new connection after a
/// back-off (the SDK does not reconnect a dropped one); the partitions it had
/// are given up as it stops (see `OwnershipWatch`) and won again.
async fn supervise(
    first: ConsumerClient,
    namespace: Namespace,
    hub: Hub,
    settings: EventHubsSettings,
    store: Checkpoints,
    readers: mpsc::Sender<EventHubsPartitionReader>,
    stop: CancellationToken,
) {
    let context = &hub.context;
    let mut pumps = tokio::task::JoinSet::new();
    let mut client = Some(first);
    let mut delay = RestartDelay::default();
    loop {
        let started = tokio::time::Instant::now();
        let failure = match client.take() {
            Some(client) => {
                let built = tokio::select! {
                    () = stop.cancelled() => break,
                    built = build_processor(client, &settings, Arc::clone(&store)) => built,
                };
                match built {
                    Ok(processor) => {
                        let ended = run_processor(
                            &processor, &hub, &settings, &store, &readers, &mut pumps, &stop,
                        )
                        .await;
                        if let Err(e) = processor.shutdown().await {
                            tracing::warn!(error = %e, "The event processor did not shut down cleanly.");
                        }
                        match ended {
                            Ended::Stopped => break,
                            Ended::Failed(e) => e,
                        }
                    }
                    Err(e) => format!("cannot build the event processor: {e}"),
                }
            }
            None => {
                let opened = tokio::select! {
                    () = stop.cancelled() => break,
                    opened = tokio::time::timeout(
                        OPEN_TIMEOUT,
                        namespace.consumer(&context.hub, &context.consumer_group, &context.owner),
                    ) => opened,
                };
                match opened {
                    Ok(Ok(opened)) => {
                        client = Some(opened);
                        continue;
                    }
                    Ok(Err(e)) => e.to_string(),
                    Err(_) => "no answer within 30 s".to_owned(),
                }
            }
        };
        if started.elapsed() > MAX_BACKOFF {
            delay = RestartDelay::default();
        }
        tracing::error!(error = %failure, restart_in_ms = delay.delay.as_millis(), "The event processor stopped; restarting it on a new connection.");
        if !delay.wait(&stop).await {
            break;
        }
    }
    // The worker has drained its partitions by now; let the loops give their clients back.
    while pumps.join_next().await.is_some() {}
}

/// The wait before trying again: 1 s, doubling up to [`MAX_BACKOFF`].
struct RestartDelay {
    delay: Duration,
}

impl Default for RestartDelay {
    fn default() -> Self {
        Self {
            delay: Duration::from_secs(1),
        }
    }
}

impl RestartDelay {
    /// Waits out the current delay and doubles it; false when `stop` fired first.
    async fn wait(&mut self, stop: &CancellationToken) -> bool {
        tokio::select! {
            () = stop.cancelled() => return false,
            () = tokio::time::sleep(self.delay) => {}
        }
        self.delay = (self.delay * 2).min(MAX_BACKOFF);
        true
    }
}

/// How a processor's run ended.
enum Ended {
    Stopped,
    Failed(String),
}

/// One hub as its processor runs it: where it is, and its partitions' ends.
struct Hub {
    context: HubContext,
    tails: Arc<Tails>,
}

/// The sequence number of `partition_id`'s checkpoint, when the store
/// answers and holds one.
async fn checkpoint_of(
    store: &dyn CheckpointStore,
    context: &HubContext,
    partition_id: &str,
) -> Option<i64> {
    store
        .list_checkpoints(&context.namespace, &context.hub, &context.consumer_group)
        .await
        .ok()?
        .into_iter()
        .find(|checkpoint| checkpoint.partition_id == partition_id)?
        .sequence_number
}

/// Runs `processor` and hands out the partitions it wins until it fails or the consumer stops.
async fn run_processor(
    processor: &EventProcessor,
    hub: &Hub,
    settings: &EventHubsSettings,
    store: &Checkpoints,
    readers: &mpsc::Sender<EventHubsPartitionReader>,
    pumps: &mut tokio::task::JoinSet<()>,
    stop: &CancellationToken,
) -> Ended {
    let context = &hub.context;
    let owners = Owners::new(
        Arc::clone(store),
        context.clone(),
        settings.update_interval_ms.duration(),
    );
    // A partition's receiver that breaks (not taken over) leaves the
    // processor's connection broken: the SDK would reopen the partition on
    // it and fail again, so the processor is rebuilt on a new connection.
    let broken = CancellationToken::new();
    let handout = async {
        loop {
            let client = match processor.next_partition_client().await {
                Ok(client) => client,
                Err(e) => return Ended::Failed(format!("no partition handed out: {e}")),
            };
            let partition_id = client.get_partition_id().to_owned();
            let start = checkpoint_of(store.as_ref(), context, &partition_id).await;
            let (reader, fed) = EventHubsPartitionReader::new(
                context,
                &partition_id,
                Arc::clone(store),
                settings.prefetch,
                (hub.tails.watch(&partition_id), start),
            );
            let ownership = owners.watch(partition_id);
            let span = tracing::info_span!("eventhubs_partition", partition = reader.partition);
            let partition = reader.partition;
            if readers.send(reader).await.is_err() {
                return Ended::Stopped;
            }
            pumps.spawn_local(
                pump(client, partition, ownership, fed, broken.clone()).instrument(span),
            );
        }
    };
    tokio::select! {
        () = stop.cancelled() => Ended::Stopped,
        ended = handout => ended,
        never = owners.run() => match never {},
        () = broken.cancelled() => Ended::Failed("a partition's receiver broke".into()),
        ran = processor.run() => match ran {
            Ok(()) => Ended::Stopped,
            Err(e) => Ended::Failed(e.to_string()),
        },
    }
}

async fn build_processor(
    client: ConsumerClient,
    settings: &EventHubsSettings,
    store: Checkpoints,
) -> azure_messaging_eventhubs::Result<Arc<EventProcessor>> {
    let duration = |d: Duration| {
        azure_core::time::Duration::try_from(d).unwrap_or(azure_core::time::Duration::MAX)
    };
    EventProcessor::builder()
        .with_load_balancing_strategy(ProcessorStrategy::Balanced)
        .with_update_interval(duration(settings.update_interval_ms.duration()))
        .with_partition_expiration_duration(duration(settings.partition_expiration_ms.duration()))
        .with_prefetch(settings.prefetch)
        .with_start_positions(StartPositions {
            // A partition nobody has checkpointed starts at its first event:
            // whatever was accepted before the first worker started is processed.
            default: StartPosition {
                location: StartLocation::Earliest,
                inclusive: false,
            },
            ..StartPositions::default()
        })
        .build(client, store)
        .await
}

/// Hands this instance's partitions of one hub back: ownership records with no
/// owner, which other processors claim at their next balancing.
async fn relinquish(store: &dyn CheckpointStore, context: &HubContext) {
    let owned: Vec<Ownership> = match store
        .list_ownerships(&context.namespace, &context.hub, &context.consumer_group)
        .await
    {
        Ok(listed) => listed
            .into_iter()
            .filter(|o| o.owner_id.as_deref() == Some(context.owner.as_str()))
            .map(|o| Ownership {
                owner_id: None,
                ..o
            })
            .collect(),
        Err(e) => {
            tracing::warn!(error = %e, hub = %context.hub, "Cannot list ownerships to give them up; they will expire.");
            return;
        }
    };
    match store.claim_ownership(&owned).await {
        Ok(released) => {
            tracing::info!(hub = %context.hub, partitions = released.len(), "Gave up the partitions.")
        }
        Err(e) => {
            tracing::warn!(error = %e, hub = %context.hub, "Cannot give up the partitions; they will expire.")
        }
    }
}

/// An owner id for ownership records: the host (the pod's name on Kubernetes) and a random suffix.
fn random_owner_id() -> String {
    let host = skyport_runtime::host::name();
    let mut bytes = [0u8; 4];
    if getrandom::fill(&mut bytes).is_err() {
        bytes = std::process::id().to_be_bytes();
    }
    format!("{host}-{:08x}", u32::from_be_bytes(bytes))
}
