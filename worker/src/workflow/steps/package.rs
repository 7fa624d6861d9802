//! Package: create the package, by its id; undone by deleting it.

use reqwest::Method;
use serde_json::json;
use skyport_core::event::DeliveryRequested;
use skyport_core::status;

use super::step::{Progress, Step, UndoTarget, delete};
use crate::resilience::client::Call;

#[derive(Debug)]
pub(super) struct Package;

/// Where the resource lives, under the services' base URL.
fn resource(id: &str) -> Vec<String> {
    vec![
        "package".into(),
        "api".into(),
        "packages".into(),
        id.to_owned(),
    ]
}

impl Step for Package {
    fn id(&self) -> status::Step {
        status::Step::Package
    }

    fn request(&self, event: &DeliveryRequested, _progress: &Progress) -> Call {
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

    fn undo(&self, target: &UndoTarget<'_>) -> Option<Call> {
        Some(delete(resource(target.package_id?)))
    }
}
