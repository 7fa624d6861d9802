//! The status document a client polls, and the rules for how its state may move.
//!
//! Invariant: a terminal state (Scheduled, Failed, Cancelled) never changes;
//! [`DeliveryState::can_become`] is the one place that says so.

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

/// Where a delivery request is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum DeliveryState {
    /// Durable in the stream; the worker has not started it.
    Accepted,
    Processing,
    Scheduled,
    Failed,
    Cancelled,
}

impl DeliveryState {
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Scheduled | Self::Failed | Self::Cancelled)
    }

    /// Whether a document in state `self` may be rewritten in state `next`.
    ///
    /// Processing may follow Processing (a replayed event starts a new attempt);
    /// nothing follows a terminal state, and nothing goes back to Accepted.
    pub fn can_become(self, next: Self) -> bool {
        !self.is_terminal() && next != Self::Accepted
    }
}

/// The five backend services, named as steps of the workflow.
///
/// The order they run in is written once, in the worker's workflow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Step {
    Account,
    Package,
    Delivery,
    ThirdParty,
    Drone,
}

impl Step {
    /// The name used in idempotency keys, logs and metrics.
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum StepResult {
    Succeeded,
    Failed,
    /// Succeeded, then undone because a later step failed or the delivery was cancelled.
    Compensated,
}

/// What one step did, and when.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Failure {
    pub step: Step,
    pub code: String,
    pub message: String,
}

/// One delivery's status; the partition key is its id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339")]
    pub updated_at: OffsetDateTime,
    /// How many times the worker has started this delivery (replays count).
    pub attempt: u32,
}

impl StatusDocument {
    /// The document of a request that is durable but not yet started.
    pub fn accepted(id: impl Into<String>, accepted_at: OffsetDateTime) -> Self {
        Self {
            id: id.into(),
            state: DeliveryState::Accepted,
            steps: Vec::new(),
            drone_id: None,
            third_party_required: None,
            failure: None,
            created_at: accepted_at,
            updated_at: accepted_at,
            attempt: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::DeliveryState::{self, *};

    const ALL: [DeliveryState; 5] = [Accepted, Processing, Scheduled, Failed, Cancelled];

    #[test]
    fn terminal_states_never_change() {
        for from in [Scheduled, Failed, Cancelled] {
            for to in ALL {
                assert!(!from.can_become(to), "{from:?} -> {to:?}");
            }
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
        for from in [Accepted, Processing] {
            for to in [Processing, Scheduled, Failed, Cancelled] {
                assert!(from.can_become(to), "{from:?} -> {to:?}");
            }
        }
    }

    #[test]
    fn states_serialize_by_name() {
        assert_eq!(
            serde_json::to_string(&Scheduled).expect("json"),
            "\"Scheduled\""
        );
    }
}
