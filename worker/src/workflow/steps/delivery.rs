//! Delivery: create the delivery, by the delivery id.

use reqwest::Method;
use serde_json::json;
use skyport_shared::event::DeliveryRequested;

use super::rfc3339;
use crate::workflow::client::Call;

/// Where the resource lives, under the services' base URL.
pub(super) fn resource(id: &str) -> Vec<String> {
    vec![
        "delivery".into(),
        "api".into(),
        "deliveries".into(),
        id.to_owned(),
    ]
}

pub(super) fn call(event: &DeliveryRequested) -> Call {
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
