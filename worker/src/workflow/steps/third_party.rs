//! Third-party: assess whether pickup or drop-off needs third-party transport.

use reqwest::Method;
use serde_json::{Value, json};
use skyport_shared::event::DeliveryRequested;

use super::Progress;
use crate::workflow::client::{Call, StepError};

pub(super) fn call(event: &DeliveryRequested) -> Call {
    Call {
        method: Method::PUT,
        path: vec![
            "thirdparty".into(),
            "api".into(),
            "assessments".into(),
            event.delivery_id.clone(),
        ],
        body: json!({
            "pickupLocation": event.request.pickup_location,
            "dropoffLocation": event.request.dropoff_location,
        }),
    }
}

pub(super) fn record(answer: &Value, progress: &mut Progress) -> Result<Option<String>, StepError> {
    let required = answer
        .get("required")
        .and_then(Value::as_bool)
        .ok_or_else(|| super::invalid_response("`required` flag"))?;
    progress.third_party_required = Some(required);
    Ok(answer
        .get("carrier")
        .and_then(Value::as_str)
        .filter(|_| required)
        .map(|carrier| format!("carrier {carrier}")))
}
