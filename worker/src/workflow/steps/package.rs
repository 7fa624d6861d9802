//! Package: create the package, by its id.

use reqwest::Method;
use serde_json::json;
use skyport_shared::event::DeliveryRequested;

use crate::workflow::client::Call;

/// Where the resource lives, under the services' base URL.
fn resource(id: &str) -> Vec<String> {
    vec![
        "package".into(),
        "api".into(),
        "packages".into(),
        id.to_owned(),
    ]
}

/// Deletes what [`call`] created (deleting what is not there succeeds).
pub(super) fn undo(id: &str) -> Call {
    Call {
        method: Method::DELETE,
        path: resource(id),
        body: serde_json::Value::Null,
    }
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
