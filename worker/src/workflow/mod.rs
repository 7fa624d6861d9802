//! The workflow run for every event. A delivery request: mark Processing,
//! call the five services in [`steps::ORDER`], record Scheduled or Failed (a
//! permanent failure first undoes the steps that succeeded). A cancellation:
//! cancel what has not started, flag what is running (it stops at its next
//! step), undo what was scheduled; all end Cancelled.
//!
//! A redrive: a delivery request of a later attempt epoch, begun on a Failed
//! delivery ([`redrive`]).
//!
//! A reschedule: applied in its delivery's stream order ([`turns`]);
//! before the steps run they use the new values, after Scheduled the
//! Delivery and Drone bookings are updated ([`reschedule`]).
//!
//! A delivery request whose pickup is further away than
//! `worker.booking_lead_s` is recorded Waiting and runs when its timer
//! fires ([`waiting`]).
//!
//! A delivery request whose id names another principal's delivery runs no
//! step and is dead-lettered ([`ownership`]).
//!
//! Invariant: an event counts as completed only once its status write (or its
//! dead letter) is durable. Replays are safe: each call is keyed by the
//! delivery id and its epoch (PUT by id, `Idempotency-Key:
//! {deliveryId}:{step}`, `{deliveryId}:e{epoch}:{step}` after the first
//! epoch), and an event whose delivery is already terminal in its epoch does
//! nothing.

mod cancel;
mod cancellations;
mod compensate;
mod dead_letter;
mod deliver;
mod engine;
mod outcome;
mod ownership;
mod redrive;
mod reschedule;
mod retry;
pub mod status;
pub mod steps;
mod turns;
mod waiting;

pub use self::engine::{Admitted, Workflow};
pub use self::outcome::{Outcome, Tally};
pub use self::retry::{Interrupted, RetryPolicy};
