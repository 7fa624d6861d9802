//! Drone: book a drone for the pickup, by the delivery id; the answer names
//! the drone. Undone by cancelling the booking.

use reqwest::Method;
use serde_json::{Value, json};
use skyport_core::event::DeliveryRequested;
use skyport_core::request::DeliveryRequest;
use skyport_core::status;

use super::step::{Progress, Step, UndoTarget, delete, invalid_response, patch, rfc3339};
use crate::resilience::client::{Call, StepError};

#[derive(Debug)]
pub(super) struct Drone;

/// Where the resource lives, under the services' base URL.
fn resource(id: &str) -> Vec<String> {
    vec![
        "drone".into(),
        "api".into(),
        "bookings".into(),
        id.to_owned(),
    ]
}

impl Step for Drone {
    fn id(&self) -> status::Step {
        status::Step::Drone
    }

    fn request(&self, event: &DeliveryRequested, progress: &Progress) -> Call {
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

    fn record(&self, answer: &Value, progress: &mut Progress) -> Result<Option<String>, StepError> {
        let drone_id = answer
            .get("droneId")
            .and_then(Value::as_str)
            .filter(|id| !id.is_empty())
            .ok_or_else(|| invalid_response("`droneId`"))?;
        progress.drone_id = Some(drone_id.to_owned());
        Ok(Some(drone_id.to_owned()))
    }

    fn undo(&self, target: &UndoTarget<'_>) -> Option<Call> {
        Some(delete(resource(target.delivery_id)))
    }

    fn update(&self, delivery_id: &str, request: &DeliveryRequest) -> Option<Call> {
        Some(patch(
            resource(delivery_id),
            json!({
                "pickupLocation": request.pickup_location,
                "pickupTime": rfc3339(request.pickup_time),
                "dropoffLocation": request.dropoff_location,
            }),
        ))
    }
}
