//! Account: authorize the delivery on the owner's account, which must be active.

use reqwest::Method;
use serde_json::{Value, json};
use skyport_shared::event::DeliveryRequested;

use crate::workflow::client::{Call, StepError};

pub(super) fn call(event: &DeliveryRequested) -> Call {
    Call {
        method: Method::PUT,
        path: vec![
            "account".into(),
            "api".into(),
            "accounts".into(),
            event.request.owner_id.clone(),
            "authorizations".into(),
            event.delivery_id.clone(),
        ],
        body: json!({ "deliveryId": event.delivery_id }),
    }
}

pub(super) fn record(answer: &Value) -> Result<Option<String>, StepError> {
    match answer.get("active").and_then(Value::as_bool) {
        Some(true) => Ok(None),
        Some(false) => Err(StepError::Permanent {
            code: "AccountInactive".into(),
            message: "the owner's account is not active".into(),
        }),
        None => Err(super::invalid_response("`active` flag")),
    }
}
