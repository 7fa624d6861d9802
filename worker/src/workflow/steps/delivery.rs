//! Delivery: create the delivery, by the delivery id; undone by deleting it.

use reqwest::Method;
use serde_json::json;
use skyport_core::event::DeliveryRequested;
use skyport_core::request::DeliveryRequest;
use skyport_core::status;

use super::step::{Progress, Step, UndoTarget, delete, patch, rfc3339};
use crate::resilience::client::Call;

#[derive(Debug)]
pub(super) struct Delivery;

/// Where the resource lives, under the services' base URL.
fn resource(id: &str) -> Vec<String> {
    vec![
        "delivery".into(),
        "api".into(),
        "deliveries".into(),
        id.to_owned(),
    ]
}

impl Step for Delivery {
    fn id(&self) -> status::Step {
        status::Step::Delivery
    }

    fn request(&self, event: &DeliveryRequested, _progress: &Progress) -> Call {
        let request = &event.request;
        Call {
            method: Method::PUT,
            path: resource(&event.delivery_id),
            body: json!({
                "ownerId": request.owner_id,
                "pickupLocation": request.pickup_location,
                "pickupTime": rfc3339(request.pickup_time),
                "deadline": rfc3339(request.deadline),
                "dropoffLocation": request.dropoff_location,
                "expedited": request.expedited,
                "confirmationRequired": request.confirmation_required,
                "packageId": request.package_info.package_id,
            }),
        }
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
                "deadline": rfc3339(request.deadline),
                "dropoffLocation": request.dropoff_location,
            }),
        ))
    }
}
