//! Azure Cosmos DB: the status store the gateway reads and the worker writes,
//! the lease store of the Event Hubs processor, and the
//! dead-letter container.
//!
//! Containers (created when missing if `cosmos.create_if_missing`; those
//! marked TTL on have their default time to live on, -1, so that each item's
//! own `ttl` is honoured, and Cosmos DB removes expired items itself, in the
//! background, with spare RUs):
//! - `status` (partition key `/id`, TTL on): one [`StatusDocument`] per
//!   delivery, its `_etag` the version conditional writes are made on; a
//!   settled one (terminal, its callback, if any, delivered or dead-lettered)
//!   with a `ttl` of `store.status_retention_s`, an unsettled one without;
//!   each with `createdMs`, indexed with its owner, principal and state for
//!   listing, which queries this container; see [`listing`].
//! - `leases` (partition key `/partitionKey` = the lease group, such as
//!   `{namespace}/{event hub}/{consumer group}`): one document per lease,
//!   `id` its name (`ownership-{partition}`, `checkpoint-{partition}`); see [`leases`].
//! - `deadletters` (partition key `/id`, TTL on): poison events (`id` =
//!   `{partition}-{offset}`) with the reason, the time and the raw payload
//!   (base64); and changes of the status feed a change-feed handler gave up
//!   on (`kind: "change"`, `id` = `change.{processor}.{key}`), with the
//!   reason, the time and the payload (JSON); each with a `ttl` of
//!   `store.dead_letter_retention_s`.
//! - `reservations` (partition key `/id` = delivery id, TTL on): what a retried
//!   POST is matched against; see [`reservations`].
//! - the throughput control container (partition key `/groupId`), when a
//!   throughput control group is global; see [`control`].
//!
//! A TTL-on container found with its default time to live off is turned on,
//! or, when `cosmos.create_if_missing` is false, stops the open; see
//! [`provision`].
//!
//! The status container's change feed is read by feed range; see [`changes`].
//!
//! The SDK's own 429 retries are off: this adapter waits out a 429 after the
//! server's `x-ms-retry-after-ms` (or `cosmos.throttle_retry_ms`) and tries
//! again for as long as its caller waits, counting it, never treating it as
//! done. Every response's request charge is recorded ([`RequestUnits`]).
//!
//! [`StatusDocument`]: skyport_core::status::StatusDocument
//! [`RequestUnits`]: request_units::RequestUnits

mod bulk;
mod changes;
mod charge;
mod control;
#[cfg(feature = "cosmos-emulator")]
pub mod emulator;
mod error;
mod leases;
mod listing;
mod metrics;
mod provision;
pub mod request_units;
mod reservations;
mod status_writes;
mod store;
mod throttle;
mod timer_writes;
mod timers;

pub use self::control::GroupReport;
pub use self::error::CosmosOpenError;
pub use self::store::CosmosStore;
