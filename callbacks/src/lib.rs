//! Skyport's callbacks: a change-feed processor over the status store's
//! change feed ([`change_feed`]) and the notifier it hands each batch to
//! ([`notify`]), which POSTs a delivery's terminal status, signed, to the
//! `callbackUrl` its client gave.
//!
//! Written against the ports of `skyport-core` and the runtime of
//! `skyport-runtime` only: the workflow never calls in here, and this crate
//! never calls the workflow. Delivery is at least once: a batch is
//! checkpointed only after its handler succeeded or gave it up to the dead
//! letters.

pub mod change_feed;
pub mod metrics;
pub mod notify;
