//! A change-feed processor over any [`ChangeSource`](skyport_core::ports::ChangeSource)
//! (Cosmos DB's feed ranges, the embedded store's change sequence), as the
//! Cosmos DB .NET and Java SDKs build it — which the Rust SDK does not.
//!
//! - **Leases** ([`lease`]): one per feed range in the
//!   [`LeaseStore`](skyport_core::ports::LeaseStore) group named after the
//!   processor, created when missing (a conditional create: a second creator
//!   finds it made, no lock document needed), acquired, renewed,
//!   checkpointed and released with ETag preconditions.
//! - **Balancing** ([`skyport_runtime::balance`]): every `acquire_interval` an instance takes
//!   leases nobody renewed within `expiry`, up to its equal share, else
//!   steals one from the busiest instance ([`processor`] runs the cycle).
//! - **Per lease** ([`lease_loop`]): read a batch, hand it to the
//!   [`ChangeHandler`], and only then checkpoint the batch's continuation. A
//!   handler error hands the same batch over again from the last checkpoint,
//!   up to `max_attempts`; then each change is tried alone, the ones that
//!   still fail go to the dead letters with the error, and the lease moves
//!   on. Delivery is at least once.
//! - **Splits**: the SDK hides a split range's 410s, so each balancing cycle
//!   compares the source's ranges with the leases: the owner of a lease whose
//!   range now holds several ranges creates a child lease per range, starting
//!   from its continuation, and retires its own.
//! - **Estimator** ([`estimator`]): pending changes per lease from the
//!   source's sequence numbers, as `skyport_change_feed_lag_events`, on the
//!   admin endpoint and in `/readyz`.
//! - **Settings** ([`settings`]): `[change_feed]` resolved into what one
//!   processor instance runs with.

mod estimator;
#[cfg(test)]
pub(crate) mod fixture;
mod handler;
mod lease;
mod lease_loop;
mod processor;
mod report;
mod settings;

pub use self::estimator::Estimator;
pub use self::handler::ChangeHandler;
pub use self::processor::Processor;
pub use self::report::{LeaseEstimate, ProcessorReport};
pub use self::settings::ProcessorSettings;
