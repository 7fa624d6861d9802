//! A protocol-level Event Hubs test broker: an AMQP 1.0 server on 127.0.0.1
//! that stands in for the service when `azure_messaging_eventhubs` (0.15) is
//! pointed at it with `with_custom_endpoint(broker.endpoint())`.
//!
//! # What it implements
//!
//! - SASL ANONYMOUS and PLAIN (any credentials), many concurrent connections,
//!   sessions and links. Link addresses may be full URLs
//!   (`amqps://<namespace>/<hub>/...`, which is what the SDK sends) or bare paths;
//!   only the path counts.
//! - CBS: `put-token` requests on `$cbs` are all accepted (status-code 202);
//!   [`EventHubsBroker::tokens_put`] lists the names they were put for.
//! - `$management` `READ` of `com.microsoft:eventhub` and `com.microsoft:partition`
//!   (status-code 200), with the keys and AMQP types the SDK's parser insists on:
//!   the SDK panics on a wrong value type and rejects a partition answer without
//!   `type` and `last_enqueued_sequence_number_epoch`. An unknown hub or partition
//!   answers 404.
//! - Senders to `<hub>` and `<hub>/Partitions/<n>`. A transfer with message format
//!   `0x80013700` is an `EventDataBatch`: its body is Data sections, each an encoded
//!   AMQP message, stored as separate events that share one `transfer` id and one
//!   partition. A send to the hub goes to partition `fnv1a64(x-opt-partition-key) %
//!   partition_count` when the (first) event carries the annotation, otherwise
//!   round-robin per transfer. Each delivery is settled Accepted once stored (see
//!   below for when). Links advertise a max-message-size of 1 MiB (the SDK sizes
//!   batches from it and refuses to batch without it).
//! - Receivers on `<hub>/ConsumerGroups/<cg>/Partitions/<n>`, starting where the
//!   source's `apache.org:selector-filter:string` says (`amqp.annotation.x-opt-offset`,
//!   `x-opt-sequence-number` or `x-opt-enqueued-time` with `>` or `>=`; `> '-1'` is
//!   the start, `> '@latest'` is after the last event stored at attach), then waiting
//!   for new events. Events go out pre-settled, one per unit of link credit, with the
//!   message annotations below plus everything the sender gave.
//! - Owner level (`com.microsoft:epoch`, a long link property): a receiver that
//!   attaches with an owner level ≥ every owner level held on its (hub, consumer
//!   group, partition) detaches all receivers there (those without an owner level
//!   too) with `amqp:link:stolen`; one with a lower owner level, or without one while
//!   an owner-level receiver holds the partition, is refused with `amqp:link:stolen`.
//! - Anything addressed to an unknown hub, partition or node is refused with
//!   `amqp:not-found`; a malformed start filter with `amqp:invalid-field`. "Refused"
//!   means the link is attached and then at once closed with that error (the
//!   acceptor API has no refusing attach).
//! - Transfers answered without being stored, switched on by the test:
//!   [`EventHubsBroker::refuse_next`] answers the next n transfers with a
//!   [`Refusal`] (released; modified with `delivery-failed` and
//!   `undeliverable-here`; or rejected with `amqp:internal-error`),
//!   [`EventHubsBroker::refuse_all`] every transfer while it is on, and
//!   [`EventHubsBroker::refuse_sends`] is `refuse_all` with rejected.
//!   (`com.microsoft:server-busy` would be closer to the service's rejection,
//!   but the SDK retries that with backoff for up to a minute, while it returns
//!   `amqp:internal-error` at once. The SDK's `send_batch` answers `Ok` to a
//!   released or modified transfer.) [`EventHubsBroker::refused`] counts them.
//! - [`EventHubsBroker::withhold_outcomes`]: transfers are stored but never
//!   settled, as when the service wrote an event and its answer was lost.
//! - [`EventHubsBroker::detach_publishers`]: every sender link attached now is
//!   closed with `amqp:link:detach-forced`, as the service does to a sender
//!   link idle for ten minutes; the connection stays open.
//!
//! # What the SDK does that shapes this
//!
//! - Any `fully_qualified_namespace` works: the SDK dials the custom endpoint and
//!   only puts the namespace in link addresses and the AMQP open's hostname.
//!   [`EventHubsBroker::namespace`] gives `127.0.0.1`.
//! - Each link is authorised first with a CBS `put-token` (type `jwt`, name the
//!   link's URL) on a new session; management requests carry a `security_token`
//!   application property, which is ignored.
//! - The owner level never reaches the wire: the SDK sets `com.microsoft:epoch` on
//!   fe2o3-amqp's link builder before naming the link, and fe2o3-amqp 0.14.1's
//!   `Builder::name` resets the link properties. So SDK receivers never steal from
//!   each other; only a client that sends the property does.
//! - A receiver displaced with `amqp:link:stolen` does not surface as
//!   `ErrorKind::ConsumerDisconnected`: fe2o3 reports the detach as a link-state
//!   error, which the SDK's `translate_receive_error` does not look into, so the
//!   SDK re-attaches (here refused, having no owner level) up to its retry limit
//!   and then yields `ErrorKind::AmqpError` with the condition inside.
//! - A `ConsumerClient` keeps one receiver link per partition until that
//!   `EventReceiver` is closed: opening another receiver on the same client and
//!   partition reuses the link, and its position.
//! - fe2o3-amqp 0.14.1's client counts on its peer being a network round trip
//!   away, so the broker never answers faster than `ROUND_TRIP` (10 ms, in
//!   links.rs): it settles a transfer that long after it arrived, reads a request
//!   link's next frame that long after the response went out, and answers a detach
//!   the client started on a link the broker sends on that long after it arrived
//!   (not at all if the client ends the session meanwhile). Answered at once:
//!   - A sender registers a delivery for its settlement only after handing the
//!     transfer to its session, so a settlement that comes back first is lost and
//!     `send` (a management call, a CBS `put-token`, `send_batch`) never returns.
//!   - The SDK drops its CBS client, with both links and their session, as soon
//!     as it has the `put-token` response. The client session counts an answer to
//!     the detach of a dropped link as an unattached handle; after the second one
//!     it stops without waiting for the session's end, and when that end arrives
//!     the client connection closes itself with `amqp:not-found` ("Session is not
//!     found"). The SDK then reports "Connection dropped: Illegal session state" or
//!     "Connection must have been closed" from whatever uses the connection next.
//!     The client does not set TCP_NODELAY, so its end can wait in its socket
//!     until the broker sends something, such as the answer to a detach.
//!
//! # What it deliberately doesn't
//!
//! TLS, token validation or expiry, geo-replication, idempotent publishing,
//! retention (events are kept until the broker is dropped), the five-receivers
//! limit per consumer group, consumer group existence (any name works), runtime
//! metrics on receivers, drain, link recovery, transactions, and management
//! operations other than `READ`.
//!
//! # Sequence numbers, offsets and times
//!
//! Per partition, the n-th stored event (from 0) has `x-opt-sequence-number` n (a
//! long). Its `x-opt-offset` is a string holding its byte position in a notional
//! log in which each event takes [`RECORD_HEADER`] bytes plus its body's length:
//! the first event is at `"0"`, and offsets strictly increase and never equal the
//! sequence number past the first event. An empty partition reports
//! `last_enqueued_offset` `"-1"` and `last_enqueued_sequence_number` -1.
//! `x-opt-enqueued-time` is the store time as an AMQP timestamp (milliseconds),
//! never earlier than the previous event's in the partition.

mod filter;
mod links;
mod management;
mod server;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use azure_core::credentials::{AccessToken, TokenCredential, TokenRequestOptions};
use fe2o3_amqp::types::definitions::{self, AmqpError, LinkError};
use fe2o3_amqp::types::messaging::annotations::OwnedKey;
use fe2o3_amqp::types::messaging::{Body, Message, MessageAnnotations};
use fe2o3_amqp::types::primitives::{OrderedMap, SimpleValue, Symbol, Timestamp, Value};
use time::OffsetDateTime;
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The bytes each event takes in the notional log that offsets count, besides its body.
pub const RECORD_HEADER: i64 = 16;

const SEQUENCE_NUMBER: &str = "x-opt-sequence-number";
const OFFSET: &str = "x-opt-offset";
const ENQUEUED_TIME: &str = "x-opt-enqueued-time";
const PARTITION_KEY: &str = "x-opt-partition-key";

/// A running broker. Dropping it stops every task (without waiting for them).
#[derive(Debug)]
pub struct EventHubsBroker {
    addr: SocketAddr,
    state: Arc<State>,
    shutdown: CancellationToken,
    tasks: TaskTracker,
}

/// An event as the broker stored it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredEvent {
    /// From 0 in each partition.
    pub sequence_number: i64,
    /// See the module docs for how offsets are assigned.
    pub offset: String,
    /// The event's `x-opt-partition-key` annotation.
    pub partition_key: Option<String>,
    /// The Data section(s) of the event's body, concatenated; empty for a body
    /// of another kind (which is still delivered to receivers as sent).
    pub body: Vec<u8>,
    /// The string-valued application properties (others are delivered, not listed here).
    pub properties: BTreeMap<String, String>,
    /// The store time, to the millisecond (`x-opt-enqueued-time`).
    pub enqueued_time: OffsetDateTime,
    /// The id of the AMQP transfer the event arrived in; the events of one batch share it.
    pub transfer: u64,
}

impl EventHubsBroker {
    /// Binds 127.0.0.1:0 and serves hubs given as (name, partition count).
    pub async fn start(hubs: &[(&str, u32)]) -> std::io::Result<Self> {
        Self::start_on(SocketAddr::from(([127, 0, 0, 1], 0)), hubs).await
    }

    /// Serves hubs on `addr`: a stopped broker's address, to bring "the
    /// service" back where its clients are reconnecting to (its events are not
    /// carried over).
    pub async fn start_on(addr: SocketAddr, hubs: &[(&str, u32)]) -> std::io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(State::new(hubs));
        let shutdown = CancellationToken::new();
        let tasks = TaskTracker::new();
        tasks.spawn(server::listen(
            listener,
            server::Context {
                state: Arc::clone(&state),
                shutdown: shutdown.clone(),
                tasks: tasks.clone(),
            },
        ));
        Ok(Self {
            addr,
            state,
            shutdown,
            tasks,
        })
    }

    /// Where the broker listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `amqp://127.0.0.1:PORT`, for the SDK builders' `with_custom_endpoint`.
    pub fn endpoint(&self) -> String {
        format!("amqp://{}", self.addr)
    }

    /// What to pass as `fully_qualified_namespace` to the SDK's `open()`. The SDK
    /// only builds link addresses (`amqps://<namespace>/<hub>/...`) and the AMQP
    /// open's hostname from it and dials the custom endpoint instead.
    pub fn namespace(&self) -> String {
        self.addr.ip().to_string()
    }

    /// The events stored in a partition, in order (empty for an unknown hub or partition).
    pub fn events(&self, hub: &str, partition: u32) -> Vec<StoredEvent> {
        self.state
            .partition(hub, partition)
            .map(|partition| {
                lock(&partition.log)
                    .records
                    .iter()
                    .map(|record| record.event.clone())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// How many receiver links are attached to the partition for the consumer group now.
    pub fn receivers(&self, hub: &str, consumer_group: &str, partition: u32) -> usize {
        self.state
            .partition(hub, partition)
            .and_then(|partition| {
                lock(&partition.consumers)
                    .get(&consumer_group.to_ascii_lowercase())
                    .map(Vec::len)
            })
            .unwrap_or(0)
    }

    /// While true, every incoming transfer is rejected with `amqp:internal-error`,
    /// so that `send_batch` fails; turning it back off lets sends succeed again.
    pub fn refuse_sends(&self, refuse: bool) {
        self.refuse_all(refuse.then_some(Refusal::Rejected));
    }

    /// While `Some`, every incoming transfer is answered with that refusal and
    /// not stored (after those [`refuse_next`](Self::refuse_next) queued);
    /// `None` stores them again.
    pub fn refuse_all(&self, refusal: Option<Refusal>) {
        lock(&self.state.refusals).all = refusal;
    }

    /// Answers the next `count` incoming transfers with `refusal`, storing none of them.
    pub fn refuse_next(&self, refusal: Refusal, count: usize) {
        lock(&self.state.refusals)
            .next
            .extend(std::iter::repeat_n(refusal, count));
    }

    /// While true, every incoming transfer is stored but not answered (no
    /// disposition ever comes for it); false answers the transfers after it again.
    pub fn withhold_outcomes(&self, withhold: bool) {
        self.state.withhold.store(withhold, Ordering::SeqCst);
    }

    /// Closes every link the clients send events on with
    /// `amqp:link:detach-forced`; links attached later are not affected.
    pub fn detach_publishers(&self) {
        self.state
            .detach_publishers
            .send_modify(|round| *round += 1);
    }

    /// The names (the addresses they authorise) of the CBS tokens put so far, in order.
    pub fn tokens_put(&self) -> Vec<String> {
        lock(&self.state.tokens).clone()
    }

    /// How many transfers have been answered with a refusal so far.
    pub fn refused(&self) -> u64 {
        lock(&self.state.refusals).answered
    }

    /// Closes the listener and every connection, and waits for every task to end.
    pub async fn stop(self) {
        self.shutdown.cancel();
        self.tasks.close();
        self.tasks.wait().await;
    }
}

impl Drop for EventHubsBroker {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// A credential whose token (valid for an hour from each call) the broker accepts
/// like any other.
pub fn test_credential() -> Arc<dyn TokenCredential> {
    Arc::new(FixedTokenCredential)
}

#[derive(Debug)]
struct FixedTokenCredential;

#[async_trait::async_trait]
impl TokenCredential for FixedTokenCredential {
    async fn get_token(
        &self,
        _scopes: &[&str],
        _options: Option<TokenRequestOptions<'_>>,
    ) -> azure_core::Result<AccessToken> {
        Ok(AccessToken::new(
            "skyport-eventhubs-test-token",
            OffsetDateTime::now_utc() + time::Duration::hours(1),
        ))
    }
}

/// An answer to a transfer that says it was not stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// `released`: the transfer was not and will not be acted upon.
    Released,
    /// `modified`, with `delivery-failed` and `undeliverable-here` set.
    Modified,
    /// `rejected`, with `amqp:internal-error`.
    Rejected,
}

/// The refusals the test has switched on.
#[derive(Debug, Default)]
struct Refusals {
    next: VecDeque<Refusal>,
    all: Option<Refusal>,
    answered: u64,
}

#[derive(Debug)]
struct State {
    hubs: Vec<Hub>,
    refusals: Mutex<Refusals>,
    /// Stored transfers are left unsettled.
    withhold: AtomicBool,
    /// The name of each CBS token put.
    tokens: Mutex<Vec<String>>,
    /// Bumped to close the publishers' links attached before.
    detach_publishers: watch::Sender<u64>,
    next_transfer: AtomicU64,
}

impl State {
    fn new(hubs: &[(&str, u32)]) -> Self {
        let created_at = OffsetDateTime::now_utc();
        Self {
            hubs: hubs
                .iter()
                .map(|&(name, partitions)| Hub {
                    name: name.to_owned(),
                    created_at,
                    partitions: (0..partitions)
                        .map(|_| Arc::new(Partition::new()))
                        .collect(),
                    round_robin: AtomicU32::new(0),
                })
                .collect(),
            refusals: Mutex::new(Refusals::default()),
            withhold: AtomicBool::new(false),
            tokens: Mutex::new(Vec::new()),
            detach_publishers: watch::Sender::new(0),
            next_transfer: AtomicU64::new(0),
        }
    }

    /// The refusal the next transfer gets, if the test switched one on.
    fn refusal(&self) -> Option<Refusal> {
        let mut refusals = lock(&self.refusals);
        let refusal = refusals.next.pop_front().or(refusals.all)?;
        refusals.answered += 1;
        Some(refusal)
    }

    /// Hub names compare case-insensitively, as on the service.
    fn hub(&self, name: &str) -> Option<&Hub> {
        self.hubs
            .iter()
            .find(|hub| hub.name.eq_ignore_ascii_case(name))
    }

    fn partition(&self, hub: &str, partition: u32) -> Option<&Arc<Partition>> {
        self.hub(hub)?
            .partitions
            .get(usize::try_from(partition).ok()?)
    }
}

#[derive(Debug)]
struct Hub {
    name: String,
    created_at: OffsetDateTime,
    partitions: Vec<Arc<Partition>>,
    round_robin: AtomicU32,
}

impl Hub {
    /// The index of partition `id` ("0", "1", ...), if the hub has it.
    fn partition_index(&self, id: &str) -> Option<usize> {
        id.parse()
            .ok()
            .filter(|&index| index < self.partitions.len())
    }

    fn partition(&self, id: &str) -> Option<&Arc<Partition>> {
        self.partitions.get(self.partition_index(id)?)
    }

    /// Stores the events of one transfer in one partition: `partition` if the link
    /// named one, else by the first event's partition key, else round-robin.
    fn publish(
        &self,
        state: &State,
        partition: Option<usize>,
        events: Vec<Message<Body<Value>>>,
    ) -> Result<(), definitions::Error> {
        let count = self.partitions.len();
        let index = match (partition, events.first().and_then(partition_key)) {
            (Some(index), _) => index,
            (None, Some(key)) => {
                usize::try_from(fnv1a64(key.as_bytes()) % count.max(1) as u64).unwrap_or_default()
            }
            (None, None) => {
                self.round_robin.fetch_add(1, Ordering::Relaxed) as usize % count.max(1)
            }
        };
        let Some(partition) = self.partitions.get(index) else {
            return Err(not_found(format!(
                "event hub {:?} has no partition {index}",
                self.name
            )));
        };
        let transfer = state.next_transfer.fetch_add(1, Ordering::SeqCst);
        let stored = {
            let mut log = lock(&partition.log);
            for message in events {
                log.append(message, transfer);
            }
            log.records.len()
        };
        partition.appended.send_replace(stored);
        Ok(())
    }
}

#[derive(Debug)]
struct Partition {
    log: Mutex<Log>,
    /// The number of stored records, bumped after each append.
    appended: watch::Sender<usize>,
    /// The receivers attached now, by lower-cased consumer group.
    consumers: Mutex<HashMap<String, Vec<Consumer>>>,
}

impl Partition {
    fn new() -> Self {
        Self {
            log: Mutex::new(Log::default()),
            appended: watch::Sender::new(0),
            consumers: Mutex::new(HashMap::new()),
        }
    }

    /// Registers a receiver, stealing the partition from the receivers it outranks,
    /// or explains why it may not attach.
    fn register(
        self: &Arc<Self>,
        consumer_group: &str,
        owner_level: Option<i64>,
        id: u64,
    ) -> Result<Registration, definitions::Error> {
        let consumer_group = consumer_group.to_ascii_lowercase();
        let mut consumers = lock(&self.consumers);
        let attached = consumers.entry(consumer_group.clone()).or_default();
        let held = attached
            .iter()
            .filter_map(|consumer| consumer.owner_level)
            .max();
        match (owner_level, held) {
            (None, Some(held)) => {
                return Err(stolen(format!(
                    "a receiver with owner level {held} holds the partition; \
                     a receiver without an owner level cannot be created"
                )));
            }
            (Some(level), Some(held)) if level < held => {
                return Err(stolen(format!(
                    "a receiver with a higher owner level of {held} holds the partition; \
                     a receiver with owner level {level} cannot be created"
                )));
            }
            (Some(level), _) => {
                for consumer in attached.drain(..) {
                    tracing::debug!(
                        stolen = consumer.id,
                        by = id,
                        level,
                        "eventhubs broker: receiver displaced by an equal or higher owner level"
                    );
                    // The receiver may be gone already; then there is no one to tell.
                    let _ = consumer.steal.send(level);
                }
            }
            (None, None) => {}
        }
        let (steal, stolen) = oneshot::channel();
        attached.push(Consumer {
            id,
            owner_level,
            steal,
        });
        Ok(Registration {
            partition: Arc::clone(self),
            consumer_group,
            id,
            stolen,
        })
    }
}

#[derive(Debug)]
struct Consumer {
    id: u64,
    owner_level: Option<i64>,
    /// Tells the receiver the owner level that took the partition from it.
    steal: oneshot::Sender<i64>,
}

/// A receiver's place among the partition's receivers; leaves it when dropped.
#[derive(Debug)]
struct Registration {
    partition: Arc<Partition>,
    consumer_group: String,
    id: u64,
    /// The owner level of the receiver that took the partition from this one.
    stolen: oneshot::Receiver<i64>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Some(attached) = lock(&self.partition.consumers).get_mut(&self.consumer_group) {
            attached.retain(|consumer| consumer.id != self.id);
        }
    }
}

#[derive(Debug, Default)]
struct Log {
    records: Vec<Record>,
    /// The offset the next record gets.
    next_offset: i64,
    last_enqueued_ms: i64,
}

impl Log {
    fn append(&mut self, mut message: Message<Body<Value>>, transfer: u64) {
        let sequence_number = i64::try_from(self.records.len()).unwrap_or(i64::MAX);
        let offset = self.next_offset;
        let enqueued_ms = unix_ms(OffsetDateTime::now_utc()).max(self.last_enqueued_ms);
        let body = match &message.body {
            Body::Data(sections) => sections
                .iter()
                .flat_map(|data| data.0.iter().copied())
                .collect(),
            _ => Vec::new(),
        };
        let properties = message
            .application_properties
            .iter()
            .flat_map(|properties| properties.0.iter())
            .filter_map(|(key, value)| match value {
                SimpleValue::String(value) => Some((key.clone(), value.clone())),
                _ => None,
            })
            .collect();
        let partition_key = partition_key(&message).map(str::to_owned);
        let annotations = &mut message
            .message_annotations
            .get_or_insert_with(|| MessageAnnotations(OrderedMap::new()))
            .0;
        annotations.insert(symbol_key(SEQUENCE_NUMBER), Value::Long(sequence_number));
        annotations.insert(symbol_key(OFFSET), Value::String(offset.to_string()));
        annotations.insert(
            symbol_key(ENQUEUED_TIME),
            Value::Timestamp(Timestamp::from_milliseconds(enqueued_ms)),
        );
        self.next_offset = offset
            .saturating_add(RECORD_HEADER)
            .saturating_add(i64::try_from(body.len()).unwrap_or(i64::MAX));
        self.last_enqueued_ms = enqueued_ms;
        self.records.push(Record {
            event: StoredEvent {
                sequence_number,
                offset: offset.to_string(),
                partition_key,
                body,
                properties,
                enqueued_time: OffsetDateTime::UNIX_EPOCH
                    + time::Duration::milliseconds(enqueued_ms),
                transfer,
            },
            offset,
            enqueued_ms,
            message,
        });
    }
}

/// A stored event and the message receivers get for it.
#[derive(Debug)]
struct Record {
    event: StoredEvent,
    offset: i64,
    enqueued_ms: i64,
    /// The event as sent, plus the broker's annotations.
    message: Message<Body<Value>>,
}

/// The `x-opt-partition-key` message annotation, if it is a string.
fn partition_key<B>(message: &Message<B>) -> Option<&str> {
    message
        .message_annotations
        .iter()
        .flat_map(|annotations| annotations.0.iter())
        .find_map(|(key, value)| match (key, value) {
            (OwnedKey::Symbol(key), Value::String(value) | Value::Symbol(Symbol(value)))
                if key.as_str() == PARTITION_KEY =>
            {
                Some(value.as_str())
            }
            _ => None,
        })
}

/// Milliseconds since the Unix epoch, the unit of AMQP timestamps.
fn unix_ms(time: OffsetDateTime) -> i64 {
    i64::try_from(time.unix_timestamp_nanos() / 1_000_000).unwrap_or(i64::MAX)
}

fn symbol_key(name: &str) -> OwnedKey {
    OwnedKey::Symbol(Symbol::from(name))
}

/// FNV-1a, 64 bits: stable across runs and platforms.
fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn stolen(description: String) -> definitions::Error {
    definitions::Error::new(LinkError::Stolen, description, None)
}

fn not_found(description: String) -> definitions::Error {
    definitions::Error::new(AmqpError::NotFound, description, None)
}

/// A poisoned lock only means a panic elsewhere; the data is still consistent
/// enough for a test double.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
