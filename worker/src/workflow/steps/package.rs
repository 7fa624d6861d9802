//! Package: create the package, by its id.

use reqwest::Method;
use serde_json::json;
use skyport_shared::event::DeliveryRequested;

use crate::workflow::client::Call;

/// Deletes what [`call`] created (deleting what is not there succeeds).
pub(super) fn undo(event: &DeliveryRequested) -> Call {
    Call {
        method: Method::DELETE,
        body: serde_json::Value::Null,
        ..call(event)
    }
}

pub(super) fn call(event: &DeliveryRequested) -> Call {
    let package = &event.request.package_info;
    Call {
        method: Method::PUT,
        path: vec![
            "package".into(),
            "api".into(),
            "packages".into(),
            package.package_id.clone(),
        ],
        body: json!({
            "deliveryId": event.delivery_id,
            "size": package.size,
            "weight": package.weight,
            "tag": package.tag,
        }),
    }
}
