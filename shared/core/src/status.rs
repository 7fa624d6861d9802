//! The status document a client polls, and the rules for how its state may move.
//!
//! Invariant: within an attempt epoch a terminal state never goes back; the
//! one move out of one is a cancelled Scheduled delivery becoming Cancelled
//! (after its steps were undone). A Failed delivery moves on only into a new
//! epoch (a redrive). [`DeliveryState::can_become`] and
//! [`StatusDocument::may_become`] are the places that say so.

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use utoipa::ToSchema;

use crate::lane::Lane;
use crate::request::DeliveryRequest;

/// Where a delivery request is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub enum DeliveryState {
    /// Durable in the stream; the worker has not started it.
    Accepted,
    Processing,
    Scheduled,
    Failed,
    Cancelled,
    /// Recorded, its pickup further away than `worker.booking_lead_s`: its
    /// steps run at `runsAt`, and nothing is booked before.
    Waiting,
}

impl DeliveryState {
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Scheduled | Self::Failed | Self::Cancelled)
    }

    /// Whether a document in state `self` may be rewritten in state `next`.
    ///
    /// Processing may follow Processing (a replayed event starts a new attempt);
    /// nothing goes back to Accepted, nor to Waiting once started (Waiting
    /// follows Waiting when a reschedule moves `runsAt`); of the terminal
    /// states only Scheduled moves on: to Cancelled, or to Scheduled again
    /// when a reschedule updated its bookings (a new revision).
    pub fn can_become(self, next: Self) -> bool {
        match self {
            Self::Accepted | Self::Waiting => next != Self::Accepted,
            Self::Processing => !matches!(next, Self::Accepted | Self::Waiting),
            Self::Scheduled => matches!(next, Self::Scheduled | Self::Cancelled),
            Self::Failed | Self::Cancelled => false,
        }
    }
}

/// The five backend services, named as steps of the workflow.
///
/// The order they run in is written once, in the worker's workflow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
pub enum Step {
    Account,
    Package,
    Delivery,
    ThirdParty,
    Drone,
}

impl Step {
    /// Every step, for what is kept per step (the simulated services, one
    /// each). The order the workflow runs them in is the worker's.
    pub const ALL: [Self; 5] = [
        Self::Account,
        Self::Package,
        Self::Delivery,
        Self::ThirdParty,
        Self::Drone,
    ];

    /// The name used in idempotency keys, logs, metrics and the services' paths.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Account => "account",
            Self::Package => "package",
            Self::Delivery => "delivery",
            Self::ThirdParty => "thirdparty",
            Self::Drone => "drone",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub enum StepResult {
    Succeeded,
    Failed,
    /// Succeeded, then undone because a later step failed or the delivery was cancelled.
    Compensated,
}

/// What one step did, and when.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct StepOutcome {
    pub step: Step,
    pub result: StepResult,
    #[serde(with = "time::serde::rfc3339")]
    pub at: OffsetDateTime,
    /// How many calls the step took, retries included.
    pub calls: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// Why a delivery failed: the step, a machine-readable code and a message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Failure {
    pub step: Step,
    pub code: String,
    pub message: String,
}

/// One delivery's status; the partition key is its id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct StatusDocument {
    pub id: String,
    pub state: DeliveryState,
    #[serde(default)]
    pub steps: Vec<StepOutcome>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drone_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub third_party_required: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<Failure>,
    /// The package the delivery carries, so that compensation can find it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub package_id: Option<String>,
    /// When a client asked to cancel; the worker cancels at its next step.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "time::serde::rfc3339::option"
    )]
    pub cancel_requested_at: Option<OffsetDateTime>,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339")]
    pub updated_at: OffsetDateTime,
    /// How many times the worker has started this delivery (replays count).
    pub attempt: u32,
    /// Where the terminal status is delivered (the request's `callbackUrl`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(format = "uri")]
    pub callback_url: Option<String>,
    /// The W3C trace context of the request; the callback's span continues it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    /// How the callback announcing the terminal state went, once it had to
    /// be retried: Pending while it is, then Delivered or DeadLettered. A
    /// callback delivered at its first attempt leaves this absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callback: Option<CallbackOutcome>,
    /// The request's `ownerId`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_id: Option<String>,
    /// Who made the request, when the gateway authenticates (an API key's
    /// name or a token's subject).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principal: Option<String>,
    /// The attempt epoch the steps belong to: 0 for the request as accepted.
    #[serde(default)]
    pub epoch: u32,
    /// The epochs after the first: when and why each began.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub epochs: Vec<Epoch>,
    /// A redrive queued for this delivery and not yet begun.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redrive: Option<QueuedRedrive>,
    /// The request as it was accepted, with the reschedules applied since,
    /// so that a redrive can run it again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<DeliveryRequest>,
    /// How many reschedules changed the delivery: 0 as it was requested.
    #[serde(default)]
    pub revision: u32,
    /// The reschedules asked for, in the order they were handled, each
    /// with what became of it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub changes: Vec<ChangeRecord>,
    /// The lane the delivery runs in: expedited when it asked to be and the
    /// stream has the lane.
    #[serde(default)]
    pub lane: Lane,
    /// When a Waiting delivery's steps run: `worker.booking_lead_s` before
    /// its pickup.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "time::serde::rfc3339::option"
    )]
    pub runs_at: Option<OffsetDateTime>,
}

/// A reschedule (`PATCH`) and what became of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ChangeRecord {
    /// The change's id (a retried PATCH carries the same one).
    pub change_id: String,
    /// When the client asked.
    #[serde(with = "time::serde::rfc3339")]
    pub requested_at: OffsetDateTime,
    /// When the worker decided.
    #[serde(with = "time::serde::rfc3339")]
    pub at: OffsetDateTime,
    /// The fields the patch gave.
    pub fields: Vec<String>,
    pub outcome: ChangeOutcome,
    /// The revision the change made (when applied).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<u32>,
    /// Why it was refused or failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// Who asked (with auth on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_by: Option<String>,
}

/// What became of a reschedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub enum ChangeOutcome {
    /// The new values hold: the steps still to run used them, or the
    /// bookings made were updated.
    Applied,
    /// Not applied: the delivery had ended Failed or Cancelled, or the
    /// patched request broke a rule (a deadline before the pickup).
    Refused,
    /// A service refused the update; the previous booking stands.
    Failed,
}

/// An attempt epoch after the first: a Failed delivery moves on only into a
/// new epoch (a redrive), never by a replay, and the calls of each epoch
/// carry it in their idempotency keys.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Epoch {
    pub epoch: u32,
    #[serde(with = "time::serde::rfc3339")]
    pub began_at: OffsetDateTime,
    /// Why it began, as the redrive said.
    pub reason: String,
    /// Who asked for it (with auth on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_by: Option<String>,
    /// How the epoch before it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<Failure>,
}

/// A redrive the gateway queued: the epoch it asked for, when, why and by whom.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueuedRedrive {
    pub epoch: u32,
    #[serde(with = "time::serde::rfc3339")]
    pub requested_at: OffsetDateTime,
    pub reason: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_by: Option<String>,
}

/// Where a delivery's callback is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub enum CallbackState {
    /// Being sent, or waiting for its next attempt.
    Pending,
    /// The receiver answered 2xx.
    Delivered,
    /// Given up on (refused destination, permanent error, or the retry time
    /// ran out); kept with the dead-lettered callbacks.
    DeadLettered,
}

/// The outcome of the callback that announced a terminal state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CallbackOutcome {
    pub state: CallbackState,
    /// The terminal state the callback announced.
    pub announced: DeliveryState,
    /// POSTs made, retries included (while Pending, as last recorded: it is
    /// written at the first failure and then every 10 s).
    pub attempts: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "time::serde::rfc3339::option"
    )]
    pub delivered_at: Option<OffsetDateTime>,
    /// When the first attempt failed: the callback is retried until
    /// `callbacks.retry_for_ms` after it, across restarts.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "time::serde::rfc3339::option"
    )]
    pub retrying_since: Option<OffsetDateTime>,
}

impl StatusDocument {
    /// Whether the terminal state this document is in may still wait for
    /// its callback: it has a `callbackUrl` and no final outcome for this
    /// state. A callback delivered at its first attempt records no outcome,
    /// so a later change of the document announces the state again, under
    /// the same message id.
    pub fn awaits_callback(&self) -> bool {
        self.state.is_terminal()
            && self.callback_url.is_some()
            && !self.callback.as_ref().is_some_and(|outcome| {
                outcome.announced == self.state && outcome.state != CallbackState::Pending
            })
    }
}

impl StatusDocument {
    /// Whether the callback announcing this document's state is being
    /// retried: its outcome for this state is recorded Pending.
    pub fn callback_retrying(&self) -> bool {
        self.callback.as_ref().is_some_and(|outcome| {
            outcome.announced == self.state && outcome.state == CallbackState::Pending
        })
    }

    /// When this document, written at `written`, is settled: `None` while
    /// it is not terminal or its callback is being retried (a callback
    /// delivered at its first attempt records nothing, so one not yet sent
    /// does not hold the document back); a Scheduled delivery not
    /// before its deadline (the current one, a reschedule moves it), since
    /// until then it may still be cancelled or rescheduled and its bookings
    /// stand; anything else at `written`. Retention counts from then. A
    /// Scheduled document kept from before the request was recorded on it
    /// has no deadline to wait for: it is settled at `written`.
    pub fn settled_at(&self, written: OffsetDateTime) -> Option<OffsetDateTime> {
        if !self.state.is_terminal() || self.callback_retrying() {
            return None;
        }
        let deadline = match (&self.state, &self.request) {
            (DeliveryState::Scheduled, Some(request)) => Some(request.deadline),
            _ => None,
        };
        Some(deadline.map_or(written, |deadline| deadline.max(written)))
    }

    /// The document of a request that is durable but not yet started.
    pub fn accepted(id: impl Into<String>, accepted_at: OffsetDateTime) -> Self {
        Self {
            id: id.into(),
            state: DeliveryState::Accepted,
            steps: Vec::new(),
            drone_id: None,
            third_party_required: None,
            failure: None,
            package_id: None,
            cancel_requested_at: None,
            created_at: accepted_at,
            updated_at: accepted_at,
            attempt: 0,
            callback_url: None,
            traceparent: None,
            callback: None,
            owner_id: None,
            principal: None,
            epoch: 0,
            epochs: Vec::new(),
            redrive: None,
            request: None,
            revision: 0,
            changes: Vec::new(),
            lane: Lane::Normal,
            runs_at: None,
        }
    }

    /// When a timer should start this document's steps: its `runsAt` while
    /// it is Waiting.
    pub fn due_at(&self) -> Option<OffsetDateTime> {
        (self.state == DeliveryState::Waiting)
            .then_some(self.runs_at)
            .flatten()
    }

    /// Whether this document may be replaced by `next`: within an epoch as
    /// [`DeliveryState::can_become`] says; into a later epoch only from Failed.
    pub fn may_become(&self, next: &Self) -> bool {
        match next.epoch.cmp(&self.epoch) {
            std::cmp::Ordering::Equal => {
                self.state == next.state || self.state.can_become(next.state)
            }
            std::cmp::Ordering::Greater => self.state == DeliveryState::Failed,
            std::cmp::Ordering::Less => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::DeliveryState::{self, *};

    const ALL: [DeliveryState; 6] = [Accepted, Processing, Scheduled, Failed, Cancelled, Waiting];

    #[test]
    fn failed_and_cancelled_never_change() {
        for from in [Failed, Cancelled] {
            for to in ALL {
                assert!(!from.can_become(to), "{from:?} -> {to:?}");
            }
        }
    }

    #[test]
    fn scheduled_only_moves_on_to_cancelled_or_a_new_revision() {
        for to in ALL {
            assert_eq!(
                Scheduled.can_become(to),
                matches!(to, Scheduled | Cancelled),
                "Scheduled -> {to:?}"
            );
        }
    }

    #[test]
    fn nothing_returns_to_accepted() {
        for from in ALL {
            assert!(!from.can_become(Accepted), "{from:?} -> Accepted");
        }
    }

    #[test]
    fn open_states_move_forward() {
        for from in [Accepted, Processing, Waiting] {
            for to in [Processing, Scheduled, Failed, Cancelled] {
                assert!(from.can_become(to), "{from:?} -> {to:?}");
            }
        }
    }

    #[test]
    fn a_delivery_waits_only_before_it_starts() {
        for from in ALL {
            assert_eq!(
                from.can_become(Waiting),
                matches!(from, Accepted | Waiting),
                "{from:?} -> Waiting"
            );
        }
    }

    #[test]
    fn a_failed_delivery_moves_on_only_into_a_later_epoch() {
        use super::StatusDocument;
        let at = time::OffsetDateTime::UNIX_EPOCH;
        let document = |state, epoch| StatusDocument {
            state,
            epoch,
            ..StatusDocument::accepted("d-1", at)
        };
        assert!(document(Failed, 0).may_become(&document(Processing, 1)));
        assert!(!document(Failed, 0).may_become(&document(Processing, 0)));
        assert!(!document(Scheduled, 0).may_become(&document(Processing, 1)));
        assert!(!document(Processing, 2).may_become(&document(Scheduled, 1)));
        assert!(document(Processing, 1).may_become(&document(Scheduled, 1)));
    }

    #[test]
    fn a_scheduled_delivery_is_settled_at_its_current_deadline_and_the_rest_at_their_write() {
        use super::StatusDocument;
        use time::macros::datetime;
        let written = datetime!(2026-11-21 10:00 UTC);
        let deadline = datetime!(2030-01-01 12:00 UTC);
        let request: crate::request::DeliveryRequest = serde_json::from_value(serde_json::json!({
            "ownerId": "owner-1",
            "pickupLocation": "a",
            "pickupTime": "2030-01-01T10:00:00Z",
            "deadline": "2030-01-01T12:00:00Z",
            "dropoffLocation": "b",
            "packageInfo": {"packageId": "p-1", "size": "Small", "weight": 1.0},
        }))
        .expect("a request");
        let document = |state| StatusDocument {
            state,
            request: Some(request.clone()),
            ..StatusDocument::accepted("d-1", written)
        };
        assert_eq!(document(Scheduled).settled_at(written), Some(deadline));
        // Written after its deadline (a late reschedule refused, say): settled then.
        let later = datetime!(2031-01-01 00:00 UTC);
        assert_eq!(document(Scheduled).settled_at(later), Some(later));
        let mut rescheduled = document(Scheduled);
        if let Some(request) = &mut rescheduled.request {
            request.deadline = datetime!(2032-06-01 00:00 UTC);
        }
        assert_eq!(
            rescheduled.settled_at(written),
            Some(datetime!(2032-06-01 00:00 UTC))
        );
        for state in [Failed, Cancelled] {
            assert_eq!(
                document(state).settled_at(written),
                Some(written),
                "{state:?}"
            );
        }
        for state in [Accepted, Processing] {
            assert_eq!(document(state).settled_at(written), None, "{state:?}");
        }
        let older = StatusDocument {
            state: Scheduled,
            ..StatusDocument::accepted("d-2", written)
        };
        assert_eq!(
            older.settled_at(written),
            Some(written),
            "no request: as before"
        );
        let mut awaiting = document(Failed);
        awaiting.callback_url = Some("https://example.com/hook".into());
        assert_eq!(
            awaiting.settled_at(written),
            Some(written),
            "a callback not yet tried holds nothing back"
        );
        let mut retrying = document(Cancelled);
        retrying.callback_url = awaiting.callback_url.clone();
        retrying.callback = Some(super::CallbackOutcome {
            state: super::CallbackState::Pending,
            announced: Cancelled,
            attempts: 1,
            last_error: Some("503".into()),
            delivered_at: None,
            retrying_since: Some(written),
        });
        assert_eq!(retrying.settled_at(written), None, "a callback is retried");
        if let Some(outcome) = &mut retrying.callback {
            outcome.announced = Scheduled;
        }
        assert_eq!(
            retrying.settled_at(written),
            Some(written),
            "the retried callback announced an earlier state"
        );
    }

    #[test]
    fn states_serialize_by_name() {
        assert_eq!(
            serde_json::to_string(&Scheduled).expect("json"),
            "\"Scheduled\""
        );
    }
}
