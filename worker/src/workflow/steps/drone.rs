//! Drone: book a drone for the pickup, by the delivery id; the answer names the drone.

use reqwest::Method;
use serde_json::{Value, json};
use skyport_shared::event::DeliveryRequested;

use super::{Progress, rfc3339};
use crate::workflow::client::{Call, StepError};

/// Where the resource lives, under the services' base URL.
pub(super) fn resource(id: &str) -> Vec<String> {
    vec![
        "drone".into(),
        "api".into(),
        "bookings".into(),
        id.to_owned(),
    ]
}

pub(super) fn call(event: &DeliveryRequested, progress: &Progress) -> Call {
    let request = &event.request;
    Call {
        method: Method::PUT,
        path: resource(&event.delivery_id),
        body: json!({
            "pickupLocation": request.pickup_location,
            "pickupTime": rfc3339(request.pickup_time),
            "dropoffLocation": request.dropoff_location,
            "packageSize": request.package_info.size,
            "expedited": request.expedited,
            "thirdPartyRequired": progress.third_party_required,
        }),
    }
}

pub(super) fn record(answer: &Value, progress: &mut Progress) -> Result<Option<String>, StepError> {
    let drone_id = answer
        .get("droneId")
        .and_then(Value::as_str)
        .filter(|id| !id.is_empty())
        .ok_or_else(|| super::invalid_response("`droneId`"))?;
    progress.drone_id = Some(drone_id.to_owned());
    Ok(Some(drone_id.to_owned()))
}
