//! Azure Event Hubs: the stream, sharded over one or more hubs of a namespace.
//!
//! - [`EventHubsPublisher`]: a key goes to hub `h mod n` and to partition
//!   `(h div n) mod p` inside it ([`skyport_core::partitioning::shard_for`]). Each
//!   (hub, partition) has one sender task that batches what is queued
//!   (`linger_ms`, `max_batch_bytes`, `max_batch_events`), sends one batch at a
//!   time (so a key's events keep their order) and answers each request when
//!   the hub has answered its own batch. The sends go on `azure_core_amqp`'s
//!   sender (a connection per hub, `connection.rs`), not the SDK's
//!   `ProducerClient`, whose `send_batch` answers `Ok` for Released and
//!   Modified: only Accepted means stored. A batch the hub did not store
//!   (Released, Modified, Rejected, or never sent) fails its requests as
//!   [`PublishError::Unavailable`](skyport_core::ports::PublishError::Unavailable);
//!   one sent with no outcome back (the link or connection failed, or the
//!   send timed out) as [`PublishError::Unknown`](skyport_core::ports::PublishError::Unknown),
//!   after one more send on a new connection when there is time. A connection
//!   on which a send or an attach failed is replaced by a new one.
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
//!   revoked. A task per hub reads the ends of the partitions this instance
//!   reads from their properties (`tails.rs`), so each reader tells what is
//!   unread (the worker's `skyport_consumer_lag_events`); each instance
//!   reports only the partitions it owns, so the lag adds up once across a
//!   fleet.
//!
//! The envelope travels as AMQP properties: content type
//! [`content_type`](skyport_core::event::content_type), and the application properties
//! `schemaVersion`, `traceparent` and `idempotencyKey` (when known).
//!
//! Partitions are numbered for the worker across hubs: hub `i`'s partition `j`
//! is `first(i) + j`, where `first(i)` adds up the partition counts of the
//! hubs listed before it. An event's offset is its sequence number.

mod batch;
mod checkpoints;
mod connection;
mod consumer;
mod hub;
mod namespace;
mod publisher;
mod reader;
mod sas;
mod tails;

pub use self::checkpoints::LeaseCheckpointStore;
pub use self::consumer::EventHubsConsumer;
pub use self::namespace::EventHubsOpenError;
pub use self::publisher::{
    EventHubsPublisher, IDEMPOTENCY_KEY_PROPERTY, PublishStats, SCHEMA_VERSION_PROPERTY,
    TRACEPARENT_PROPERTY,
};
pub use self::sas::SasCredential;
