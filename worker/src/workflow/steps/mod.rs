//! The five steps: what each asks of its service and what it keeps from the answer.
//!
//! [`ORDER`] is the one place the order of the workflow is written.

mod account;
mod delivery;
mod drone;
mod package;
mod third_party;

use serde_json::Value;
use skyport_shared::event::DeliveryRequested;
use skyport_shared::status::Step;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::client::{Call, StepError};

/// The workflow, in order.
pub const ORDER: [Step; 5] = [
    Step::Account,
    Step::Package,
    Step::Delivery,
    Step::ThirdParty,
    Step::Drone,
];

/// What the steps learned so far, for the status document and later steps.
#[derive(Debug, Default, Clone)]
pub struct Progress {
    pub third_party_required: Option<bool>,
    pub drone_id: Option<String>,
}

/// The request `step` sends for `event`.
pub fn call(step: Step, event: &DeliveryRequested, progress: &Progress) -> Call {
    match step {
        Step::Account => account::call(event),
        Step::Package => package::call(event),
        Step::Delivery => delivery::call(event),
        Step::ThirdParty => third_party::call(event),
        Step::Drone => drone::call(event, progress),
    }
}

/// The request that undoes `step`, for the steps that leave something behind
/// (`None` for the package when its id is not known).
pub fn undo(step: Step, delivery_id: &str, package_id: Option<&str>) -> Option<Call> {
    let resource = match step {
        Step::Account | Step::ThirdParty => return None,
        Step::Package => package::resource(package_id?),
        Step::Delivery => delivery::resource(delivery_id),
        Step::Drone => drone::resource(delivery_id),
    };
    // Deleting what is not there succeeds, so an undo can be repeated.
    Some(Call {
        method: reqwest::Method::DELETE,
        path: resource,
        body: Value::Null,
    })
}

/// Whether `step` leaves something behind that a cancellation must undo.
pub fn is_undoable(step: Step) -> bool {
    matches!(step, Step::Package | Step::Delivery | Step::Drone)
}

/// Keeps what `step`'s answer says in `progress`; returns a detail for the status document.
///
/// # Errors
/// [`StepError::Permanent`] when the answer refuses the delivery or breaks the contract.
pub fn record(
    step: Step,
    answer: &Value,
    progress: &mut Progress,
) -> Result<Option<String>, StepError> {
    match step {
        Step::Account => account::record(answer),
        Step::Package => Ok(None),
        Step::Delivery => Ok(None),
        Step::ThirdParty => third_party::record(answer, progress),
        Step::Drone => drone::record(answer, progress),
    }
}

fn rfc3339(at: OffsetDateTime) -> String {
    at.format(&Rfc3339)
        .unwrap_or_else(|e| unreachable!("a parsed RFC 3339 time formats again: {e}"))
}

fn invalid_response(what: &str) -> StepError {
    StepError::Permanent {
        code: "InvalidResponse".into(),
        message: format!("the service's answer has no {what}"),
    }
}
