//! Account: authorize the delivery on the owner's account, which must be active.

use reqwest::Method;
use serde_json::{Value, json};
use skyport_core::event::DeliveryRequested;
use skyport_core::status;

use super::step::{Progress, Step, invalid_response};
use crate::resilience::client::{Call, StepError};

#[derive(Debug)]
pub(super) struct Account;

impl Step for Account {
    fn id(&self) -> status::Step {
        status::Step::Account
    }

    fn request(&self, event: &DeliveryRequested, _progress: &Progress) -> Call {
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

    fn record(
        &self,
        answer: &Value,
        _progress: &mut Progress,
    ) -> Result<Option<String>, StepError> {
        match answer.get("active").and_then(Value::as_bool) {
            Some(true) => Ok(None),
            Some(false) => Err(StepError::Permanent {
                code: "AccountInactive".into(),
                message: "the owner's account is not active".into(),
            }),
            None => Err(invalid_response("`active` flag")),
        }
    }
}
