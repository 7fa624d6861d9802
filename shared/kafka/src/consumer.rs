//! The Kafka consumer: one member of `worker.consumer_group`, cooperative-sticky
//! rebalancing, each assigned partition read through a queue of its own by
//! the worker's partition loop, acknowledged offsets stored as the loop
//! checkpoints them and committed asynchronously every
//! `kafka.commit_interval_ms`. A checkpoint at or below one the reader has
//! already stored is ignored: librdkafka stores whatever it is given, and
//! would move the committed offset back.
//!
//! A thread of its own polls the consumer all the time (never held by the
//! work, so the group never sees the member stall), and runs the rebalance
//! callbacks: an assigned partition gets its queue before its first fetch; a
//! revoked one is told to stop, and the revocation completes once its
//! in-flight work has drained and its offsets are committed, or after
//! `kafka.drain_timeout_ms`. The partitions kept go on meanwhile. Each
//! partition's queue holds at most [`PREFETCH_MESSAGES`] fetched ahead of
//! the worker, whose read-ahead takes from it as its window frees. While
//! the worker's intake is paused, its partitions are paused: not fetched,
//! while the poll thread keeps the membership alive. They are never paused
//! as the window fills and frees: librdkafka drops what it fetched for a
//! paused partition and fetches it again on resuming, so, event by event,
//! each completion waited for a fetch round trip before the next could start.
//!
//! The consumer joins the group on the first [`Consumer::next_partition`],
//! so a process that only publishes never becomes a member.

use std::collections::HashMap;
use std::error::Error;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak, mpsc as std_mpsc};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use rdkafka::client::{ClientContext, OAuthToken};
use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer as _, ConsumerContext, Rebalance, StreamConsumer,
};
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, Producer as _};
use rdkafka::statistics::Statistics;
use rdkafka::topic_partition_list::TopicPartitionList;
use skyport_core::ports::{ConsumeError, Consumer, PartitionReader};
use skyport_runtime::config::KafkaSettings;
use tokio::sync::{Mutex as AsyncMutex, mpsc};
use tokio_util::sync::CancellationToken;

use crate::KafkaOpenError;
use crate::client::{Topics, client_config, creation_error};
use crate::reader::{KafkaPartitionReader, Marks, Place};
use crate::token::{BearerToken, Login};

/// How often the poll thread polls the consumer when nothing wakes it, and
/// how often librdkafka reports the partitions' high watermarks.
const POLL_INTERVAL: Duration = Duration::from_secs(1);

/// Messages librdkafka keeps fetched ahead in each assigned partition's
/// queue (`queued.min.messages`, 100,000 by default): twice the worker's
/// default read-ahead, about half a megabyte of deliveries a partition.
/// `kafka.properties.queued.min.messages` sets another.
const PREFETCH_MESSAGES: u32 = 1_000;

type GroupConsumer = StreamConsumer<Context>;

/// A partition's reader, on this member's consumer.
type Reader = KafkaPartitionReader<Context>;

/// A partition this member reads, as the rebalance callbacks see it.
#[derive(Debug)]
struct Assigned {
    /// Fired when the partition is revoked: its reader answers `Revoked`.
    revoked: CancellationToken,
    /// Disconnected when the reader is dropped (its loop has drained and checkpointed).
    done: Mutex<std_mpsc::Receiver<()>>,
    /// Where the partition stands, from the latest statistics.
    marks: Arc<Marks>,
}

/// This member of the consumer group: its topics, the partitions assigned to
/// it now, and where their readers go.
#[derive(Debug)]
struct Membership {
    topics: Topics,
    consumer: OnceLock<Weak<GroupConsumer>>,
    assigned: Mutex<HashMap<(String, i32), Assigned>>,
    readers: mpsc::UnboundedSender<Reader>,
    drain_timeout: Duration,
    /// Whether a partition without a committed offset starts at its end
    /// (`auto.offset.reset` set to latest) rather than its beginning.
    reset_to_latest: bool,
    /// Partitions revoked from this member since it joined.
    revoked: AtomicU64,
}

/// The callbacks of the consumer, run on its poll thread.
#[derive(Debug, Clone)]
struct Context {
    shared: Arc<Membership>,
    login: Login,
}

impl ClientContext for Context {
    const ENABLE_REFRESH_OAUTH_TOKEN: bool = true;

    fn generate_oauth_token(&self, _config: Option<&str>) -> Result<OAuthToken, Box<dyn Error>> {
        self.login.oauth_token()
    }

    fn stats(&self, statistics: Statistics) {
        let assigned = self
            .shared
            .assigned
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for (name, topic) in &statistics.topics {
            for (partition, stats) in &topic.partitions {
                if let Some(assigned) = assigned.get(&(name.clone(), *partition)) {
                    let start = if stats.committed_offset >= 0 {
                        stats.committed_offset
                    } else if self.shared.reset_to_latest {
                        stats.hi_offset
                    } else {
                        stats.lo_offset
                    };
                    assigned.marks.start.store(start, Ordering::Relaxed);
                    assigned
                        .marks
                        .high
                        .store(stats.hi_offset, Ordering::Relaxed);
                }
            }
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        tracing::warn!(%error, reason, "The Kafka consumer reported an error.");
    }
}

impl ConsumerContext for Context {
    fn pre_rebalance(&self, base: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(partitions) => self.assign(partitions),
            Rebalance::Revoke(partitions) => self.revoke(base, partitions),
            Rebalance::Error(error) => {
                tracing::error!(%error, "A rebalance of the consumer group failed.");
            }
        }
    }

    fn commit_callback(&self, result: KafkaResult<()>, offsets: &TopicPartitionList) {
        match result {
            Ok(()) => tracing::trace!(partitions = offsets.count(), "Committed offsets."),
            Err(KafkaError::ConsumerCommit(RDKafkaErrorCode::NoOffset)) => {}
            Err(error) => {
                tracing::warn!(%error, "An offset commit failed; the next one covers it.");
            }
        }
    }
}

impl Context {
    /// Gives each newly assigned partition its own queue, before the
    /// assignment starts fetching, and hands its reader to the worker.
    fn assign(&self, partitions: &TopicPartitionList) {
        let Some(consumer) = self.shared.consumer.get().and_then(Weak::upgrade) else {
            return;
        };
        for element in partitions.elements() {
            let (topic, partition) = (element.topic().to_owned(), element.partition());
            let Some((number, lane)) = self.shared.topics.number(&topic, partition) else {
                tracing::warn!(%topic, partition, "Assigned a partition outside the configured topics; it is not read.");
                continue;
            };
            let Some(queue) = consumer.split_partition_queue(&topic, partition) else {
                tracing::error!(%topic, partition, "Cannot read the assigned partition.");
                continue;
            };
            let (done_tx, done_rx) = std_mpsc::sync_channel(0);
            let revoked = CancellationToken::new();
            let marks = Arc::new(Marks::unknown());
            self.shared
                .assigned
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(
                    (topic.clone(), partition),
                    Assigned {
                        revoked: revoked.clone(),
                        done: Mutex::new(done_rx),
                        marks: Arc::clone(&marks),
                    },
                );
            tracing::info!(%topic, partition, number, lane = lane.as_str(), "Assigned a Kafka partition.");
            let place = Place {
                topic,
                partition,
                number,
                lane,
            };
            let reader = KafkaPartitionReader::new(
                queue,
                Arc::clone(&consumer),
                place,
                revoked,
                marks,
                done_tx,
            );
            if self.shared.readers.send(reader).is_err() {
                tracing::debug!("The worker no longer takes partitions.");
            }
        }
    }

    /// Stops the revoked partitions' readers, waits (at most the drain
    /// timeout) until their loops have drained and checkpointed, and commits
    /// what they stored before the partitions go.
    fn revoke(&self, base: &BaseConsumer<Self>, partitions: &TopicPartitionList) {
        let revoked: Vec<Assigned> = {
            let mut assigned = self
                .shared
                .assigned
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            partitions
                .elements()
                .iter()
                .filter_map(|e| assigned.remove(&(e.topic().to_owned(), e.partition())))
                .collect()
        };
        if revoked.is_empty() {
            return;
        }
        self.shared
            .revoked
            .fetch_add(revoked.len() as u64, Ordering::Relaxed);
        tracing::info!(
            partitions = revoked.len(),
            "Partitions are being revoked; draining their work."
        );
        for partition in &revoked {
            partition.revoked.cancel();
        }
        let deadline = Instant::now() + self.shared.drain_timeout;
        let mut drained = 0;
        for partition in &revoked {
            let remaining = deadline.saturating_duration_since(Instant::now());
            let done = partition
                .done
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .recv_timeout(remaining);
            if matches!(done, Err(std_mpsc::RecvTimeoutError::Disconnected)) {
                drained += 1;
            }
        }
        if drained < revoked.len() {
            tracing::warn!(
                drained,
                revoked = revoked.len(),
                drain_timeout_ms = self.shared.drain_timeout.as_millis(),
                "The drain timed out; the undrained partitions' unacknowledged work will be read again by their new owner."
            );
        }
        match base.commit_consumer_state(CommitMode::Sync) {
            Ok(()) | Err(KafkaError::ConsumerCommit(RDKafkaErrorCode::NoOffset)) => {}
            Err(error) => {
                tracing::warn!(%error, "Cannot commit the revoked partitions' offsets; their new owner reads again from the last commit.");
            }
        }
    }
}

/// The running member: the consumer and its poll thread.
struct Member {
    consumer: Arc<GroupConsumer>,
    shared: Arc<Membership>,
    readers: AsyncMutex<mpsc::UnboundedReceiver<Reader>>,
    stop: CancellationToken,
    poller: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl std::fmt::Debug for Member {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Member")
            .field("stopped", &self.stop.is_cancelled())
            .finish_non_exhaustive()
    }
}

/// Consumes the configured topics as a member of the worker's consumer group.
#[derive(Debug)]
pub struct KafkaConsumer {
    settings: KafkaSettings,
    group: String,
    token: Option<BearerToken>,
    member: tokio::sync::OnceCell<Member>,
}

impl KafkaConsumer {
    /// A consumer for `group`; it joins on the first `next_partition`.
    pub fn new(settings: &KafkaSettings, group: &str) -> Self {
        Self::new_with(settings, group, None)
    }

    /// [`KafkaConsumer::new`] presenting `token` (`kafka.auth = "entra"`).
    pub fn new_with(settings: &KafkaSettings, group: &str, token: Option<BearerToken>) -> Self {
        Self {
            settings: settings.clone(),
            group: group.to_owned(),
            token,
            member: tokio::sync::OnceCell::new(),
        }
    }

    /// The partitions (the worker's numbers) this member reads now.
    pub fn assignment(&self) -> Vec<u32> {
        let Some(member) = self.member.get() else {
            return Vec::new();
        };
        let topics = &member.shared.topics;
        let mut numbers: Vec<u32> = member
            .shared
            .assigned
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .keys()
            .filter_map(|(topic, partition)| topics.number(topic, *partition).map(|(n, _)| n))
            .collect();
        numbers.sort_unstable();
        numbers
    }

    /// Partitions revoked from this member since it joined.
    pub fn revoked(&self) -> u64 {
        self.member
            .get()
            .map_or(0, |member| member.shared.revoked.load(Ordering::Relaxed))
    }

    async fn member(&self) -> Result<&Member, ConsumeError> {
        self.member
            .get_or_try_init(|| self.join())
            .await
            .map_err(|e| ConsumeError::Unavailable(Box::new(e)))
    }

    async fn join(&self) -> Result<Member, KafkaOpenError> {
        let settings = &self.settings;
        let login = Login::new(settings, self.token.clone())?;
        let mut config = client_config(settings);
        config
            .set("group.id", &self.group)
            .set("partition.assignment.strategy", "cooperative-sticky")
            .set("enable.auto.commit", "true")
            .set("enable.auto.offset.store", "false")
            .set(
                "auto.commit.interval.ms",
                settings.commit_interval_ms.count().to_string(),
            )
            .set(
                "session.timeout.ms",
                settings.session_timeout_ms.count().to_string(),
            )
            .set(
                "max.poll.interval.ms",
                settings.max_poll_interval_ms.count().to_string(),
            )
            .set(
                "statistics.interval.ms",
                POLL_INTERVAL.as_millis().to_string(),
            )
            .set("enable.partition.eof", "false");
        if !settings.properties.contains_key("queued.min.messages") {
            config.set("queued.min.messages", PREFETCH_MESSAGES.to_string());
        }
        // A new group reads from the beginning: an event accepted before the
        // first worker joined is still work to do.
        if !settings.properties.contains_key("auto.offset.reset") {
            config.set("auto.offset.reset", "earliest");
        }
        let (readers_tx, readers_rx) = mpsc::unbounded_channel();
        let probe: BaseProducer<Login> = client_config(settings)
            .create_with_context(login.clone())
            .map_err(|e| creation_error(settings, e))?;
        let names = settings.lane_topics();
        let timeout = settings.delivery_timeout_ms.duration();
        let topics = tokio::task::spawn_blocking(move || {
            // Nothing else polls the probe: this serves the OAUTHBEARER
            // token request librdkafka queued as it created the client.
            probe.poll(Duration::ZERO);
            Topics::fetch(probe.client(), &names, timeout)
        })
        .await??;
        let shared = Arc::new(Membership {
            topics,
            consumer: OnceLock::new(),
            assigned: Mutex::new(HashMap::new()),
            readers: readers_tx,
            drain_timeout: settings.drain_timeout_ms.duration(),
            reset_to_latest: settings
                .properties
                .get("auto.offset.reset")
                .is_some_and(|reset| matches!(reset.as_str(), "latest" | "largest" | "end")),
            revoked: AtomicU64::new(0),
        });
        let consumer: GroupConsumer = config
            .create_with_context(Context {
                shared: Arc::clone(&shared),
                login,
            })
            .map_err(|e| creation_error(settings, e))?;
        let consumer = Arc::new(consumer);
        let _ = shared.consumer.set(Arc::downgrade(&consumer));
        let lanes = settings.lane_topics();
        let names: Vec<&str> = lanes.iter().map(|(topic, _)| topic.as_str()).collect();
        consumer.subscribe(&names).map_err(KafkaOpenError::Client)?;
        let stop = CancellationToken::new();
        let poller = {
            let (consumer, stop) = (Arc::clone(&consumer), stop.clone());
            // A runtime of its own: the thread outlives no runtime it borrows,
            // and the rebalance callbacks may block it.
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .map_err(KafkaOpenError::Thread)?;
            std::thread::Builder::new()
                .name("skyport-kafka-poll".into())
                .spawn(move || runtime.block_on(poll(&consumer, &stop)))
                .map_err(KafkaOpenError::Thread)?
        };
        tracing::info!(group = %self.group, topics = ?settings.topics, expedited_topic = ?settings.expedited_topic, "Joined the Kafka consumer group.");
        Ok(Member {
            consumer,
            shared,
            readers: AsyncMutex::new(readers_rx),
            stop,
            poller: Mutex::new(Some(poller)),
        })
    }
}

/// Serves the consumer's events (rebalances, statistics, commits) until
/// `stop`. Every assigned partition has its own queue, so a message here
/// came before its partition's queue existed: it is put back by seeking to
/// it, and comes again through the queue.
async fn poll(consumer: &Arc<GroupConsumer>, stop: &CancellationToken) {
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            message = consumer.recv() => match message {
                Ok(message) => {
                    let (topic, partition, offset) = (message.topic().to_owned(), message.partition(), message.offset());
                    drop(message);
                    if let Err(error) = consumer.seek(&topic, partition, rdkafka::Offset::Offset(offset), Duration::from_secs(5)) {
                        tracing::warn!(%topic, partition, offset, %error, "Cannot put back a message read before its partition's queue existed.");
                    }
                }
                Err(error) => tracing::warn!(%error, "The Kafka consumer failed to poll."),
            },
            // Each new `recv` polls at once: the group sees the member alive
            // even when no event arrives for a long time.
            () = tokio::time::sleep(POLL_INTERVAL) => {}
        }
    }
}

#[async_trait]
impl Consumer for KafkaConsumer {
    async fn next_partition(&self) -> Result<Box<dyn PartitionReader>, ConsumeError> {
        let member = self.member().await?;
        let mut readers = member.readers.lock().await;
        match readers.recv().await {
            Some(reader) => Ok(Box::new(reader)),
            None => Err(ConsumeError::Unavailable(
                "the Kafka consumer stopped".into(),
            )),
        }
    }

    async fn stop(&self) {
        let Some(member) = self.member.get() else {
            return;
        };
        let consumer = Arc::clone(&member.consumer);
        let poller = member
            .poller
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        member.stop.cancel();
        let left = tokio::task::spawn_blocking(move || {
            if let Some(poller) = poller {
                let _ = poller.join();
            }
            match consumer.commit_consumer_state(CommitMode::Sync) {
                Ok(()) | Err(KafkaError::ConsumerCommit(RDKafkaErrorCode::NoOffset)) => {}
                Err(error) => {
                    tracing::warn!(%error, "Cannot commit the final offsets; the next owner reads again from the last commit.");
                }
            }
            consumer.unsubscribe();
        })
        .await;
        if let Err(error) = left {
            tracing::warn!(%error, "Leaving the Kafka consumer group failed.");
        } else {
            tracing::info!("Left the Kafka consumer group.");
        }
    }
}
