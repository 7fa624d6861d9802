//! What a step is: its request, what it keeps of the answer, its undo, and
//! what the steps share while a delivery runs.

use serde_json::Value;
use skyport_core::event::DeliveryRequested;
use skyport_core::request::DeliveryRequest;
use skyport_core::status;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::resilience::client::{Call, StepError};

/// One step of the workflow.
pub trait Step: std::fmt::Debug + Send + Sync {
    /// The step, as the status document names it.
    fn id(&self) -> status::Step;

    /// The request this step sends for `event`.
    fn request(&self, event: &DeliveryRequested, progress: &Progress) -> Call;

    /// Keeps what the service's `answer` says in `progress`; returns a detail
    /// for the status document.
    ///
    /// # Errors
    /// [`StepError::Permanent`] when the answer refuses the delivery or
    /// breaks the contract.
    fn record(
        &self,
        _answer: &Value,
        _progress: &mut Progress,
    ) -> Result<Option<String>, StepError> {
        Ok(None)
    }

    /// The request that undoes what this step left behind for `target`;
    /// `None` for a step that leaves nothing (or whose resource is not known).
    /// Deleting what is not there succeeds, so an undo can be repeated.
    fn undo(&self, _target: &UndoTarget<'_>) -> Option<Call> {
        None
    }

    /// The request that changes what this step booked for `delivery_id` to
    /// `request`'s times and places (a reschedule); `None` for a step whose
    /// resource does not hold them.
    fn update(&self, _delivery_id: &str, _request: &DeliveryRequest) -> Option<Call> {
        None
    }
}

/// A `PATCH` of `path` with `body`: what a reschedule sends a booking.
pub(super) fn patch(path: Vec<String>, body: Value) -> Call {
    Call {
        method: reqwest::Method::PATCH,
        path,
        body,
    }
}

/// What the steps learned so far, for the status document and later steps.
#[derive(Debug, Default, Clone)]
pub struct Progress {
    pub third_party_required: Option<bool>,
    pub drone_id: Option<String>,
}

/// The delivery whose steps are undone.
#[derive(Debug, Clone, Copy)]
pub struct UndoTarget<'a> {
    pub delivery_id: &'a str,
    /// The attempt epoch whose steps are undone (their calls' keys carry it).
    pub epoch: u32,
    /// The package, when the delivery's document knows it.
    pub package_id: Option<&'a str>,
}

/// A `DELETE` of `path`: what undoes a step that created a resource.
pub(super) fn delete(path: Vec<String>) -> Call {
    Call {
        method: reqwest::Method::DELETE,
        path,
        body: Value::Null,
    }
}

pub(super) fn rfc3339(at: OffsetDateTime) -> String {
    at.format(&Rfc3339)
        .unwrap_or_else(|e| unreachable!("a parsed RFC 3339 time formats again: {e}"))
}

pub(super) fn invalid_response(what: &str) -> StepError {
    StepError::Permanent {
        code: "InvalidResponse".into(),
        message: format!("the service's answer has no {what}"),
    }
}
