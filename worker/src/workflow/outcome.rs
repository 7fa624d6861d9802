//! What became of an event, and the tally of outcomes since the process started.

use std::sync::atomic::{AtomicU64, Ordering};

use super::retry::Interrupted;

/// What became of one event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Scheduled,
    Failed,
    Cancelled,
    /// A running delivery was flagged; it cancels itself at its next step.
    CancelRequested,
    /// A delivery recorded Waiting: its pickup is further away than
    /// `worker.booking_lead_s`, and a timer runs its steps.
    Waiting,
    /// A timer's event for a delivery no longer Waiting at the timer's
    /// revision (started, cancelled, or moved by a reschedule): nothing to do.
    NotDue,
    /// A reschedule applied: the bookings hold the new times and places.
    Rescheduled,
    /// A reschedule refused (the delivery had ended otherwise, or the new
    /// values break a rule) or failed (a service refused the update).
    RescheduleRefused,
    /// A replay of a delivery whose terminal state was already recorded.
    AlreadyTerminal,
    DeadLettered,
    /// Given up at shutdown before completing; it will be read again.
    Abandoned,
    /// Handed back to the stream (a nack) after its writes failed too often
    /// in a row: this worker reads it again from there.
    Nacked,
}

/// Whether a redrive runs (its epoch begun on the document) or why not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Begin {
    /// The epoch began now, or had begun (a replay): run it.
    Run,
    /// No document, a later epoch, or a delivery that did not fail.
    Skip(&'static str),
}

/// What became of a reschedule event.
pub(super) enum Handled {
    Done(Outcome),
    /// It cannot be applied, and goes to the dead letters with this reason.
    GiveUp(String),
}

impl Outcome {
    /// Whether the event is done with, so that the checkpoint may pass it.
    pub fn is_completed(self) -> bool {
        !matches!(self, Self::Abandoned | Self::Nacked)
    }
}

impl From<Interrupted> for Outcome {
    fn from(interrupted: Interrupted) -> Self {
        match interrupted {
            Interrupted::Abandoned => Self::Abandoned,
            Interrupted::Redeliver => Self::Nacked,
        }
    }
}

/// What the workflow has done since the process started.
#[derive(Debug, Default)]
pub struct Tally {
    pub scheduled: AtomicU64,
    pub failed: AtomicU64,
    pub cancelled: AtomicU64,
    pub cancel_requested: AtomicU64,
    pub waiting: AtomicU64,
    pub not_due: AtomicU64,
    pub rescheduled: AtomicU64,
    pub reschedules_refused: AtomicU64,
    /// Events of deliveries that an earlier attempt had already started or finished.
    pub replayed: AtomicU64,
    pub dead_lettered: AtomicU64,
    pub abandoned: AtomicU64,
    /// Events handed back to the stream to be read again (nacks and panics).
    pub nacked: AtomicU64,
}

impl std::fmt::Display for Tally {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        write!(
            f,
            "scheduled={} failed={} cancelled={} cancel_requested={} waiting={} not_due={} rescheduled={} reschedules_refused={} replayed={} dead_lettered={} abandoned={} nacked={}",
            get(&self.scheduled),
            get(&self.failed),
            get(&self.cancelled),
            get(&self.cancel_requested),
            get(&self.waiting),
            get(&self.not_due),
            get(&self.rescheduled),
            get(&self.reschedules_refused),
            get(&self.replayed),
            get(&self.dead_lettered),
            get(&self.abandoned),
            get(&self.nacked)
        )
    }
}
