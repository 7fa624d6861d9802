//! Azure Event Hubs: the stream, sharded over one or more hubs of a namespace.
//!
//! - [`EventHubsPublisher`]: a key goes to hub `h mod n` and to partition
//!   `(h div n) mod p` inside it ([`skyport_core::partitioning::shard_for`]). Each
//!   (hub, partition) has one sender task that batches what is queued
//!   (`linger_ms`, `max_batch_bytes`, `max_batch_events`), sends one batch at a
//!   time (so a key's events keep their order) and answers each request when
//!   its own batch is acknowledged. A failed or timed-out send fails exactly
//!   the requests in that batch, and the hub's producer is replaced by one on
//!   a new connection (the SDK keeps a dropped connection and fails every send
//!   on it).
//! - [`EventHubsConsumer`]: one `EventProcessor` per hub (Balanced strategy)
//!   on an ownership and checkpoint store ([`LeaseCheckpointStore`], written
//!   once over any [`LeaseStore`](skyport_core::ports::LeaseStore): Cosmos DB,
//!   or the embedded store on one machine). The processors and their partition loops run on a
//!   `LocalSet` on a thread of their own, because the SDK's event streams are
//!   not `Send`; each partition reaches the worker as a
//!   [`PartitionReader`](skyport_core::ports::PartitionReader) fed by a bounded channel.
//!   A processor whose `run` fails is rebuilt on a new connection after a
//!   back-off (the SDK does not reconnect a dropped one). A partition
//!   whose stream ends (taken over: `ConsumerDisconnected`, or a broken link),
//!   or whose ownership record names another processor (an idle receiver
//!   would only notice at its next event), is reported to the worker as
//!   revoked.
//!
//! The envelope travels as AMQP properties: content type
//! [`content_type`](skyport_core::event::content_type), and the application properties
//! `schemaVersion`, `traceparent` and `idempotencyKey` (when known).
//!
//! Partitions are numbered for the worker across hubs: hub `i`'s partition `j`
//! is `first(i) + j`, where `first(i)` adds up the partition counts of the
//! hubs listed before it. An event's offset is its sequence number.

mod checkpoints;
mod consumer;
mod namespace;
mod publisher;
mod reader;
mod sas;

pub use self::checkpoints::LeaseCheckpointStore;
pub use self::consumer::EventHubsConsumer;
pub use self::namespace::EventHubsOpenError;
pub use self::publisher::{
    EventHubsPublisher, IDEMPOTENCY_KEY_PROPERTY, PublishStats, SCHEMA_VERSION_PROPERTY,
    TRACEPARENT_PROPERTY,
};
pub use self::sas::SasCredential;
