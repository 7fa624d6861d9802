//! Package: create the package, by its id.

use reqwest::Method;
use serde_json::json;
use skyport_shared::event::DeliveryRequested;

use crate::workflow::client::Call;

/// Where the resource lives, under the services' base URL.
pub(super) fn resource(id: &str) -> Vec<String> {
    vec![
        "package".into(),
        "api".into(),
        "packages".into(),
        id.to_owned(),
    ]
}

pub(super) fn call(event: &DeliveryRequested) -> Call {
    let package = &event.request.package_info;
    Call {
        method: Method::PUT,
        path: resource(&package.package_id),
        body: json!({
            "deliveryId": event.delivery_id,
            "size": package.size,
            "weight": package.weight,
            "tag": package.tag,
        }),
    }
}
