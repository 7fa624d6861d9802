//! Third-party: assess whether pickup or drop-off needs third-party transport.

use reqwest::Method;
use serde_json::{Value, json};
use skyport_core::event::DeliveryRequested;
use skyport_core::status;

use super::step::{Progress, Step, invalid_response};
use crate::resilience::client::{Call, StepError};

#[derive(Debug)]
pub(super) struct ThirdParty;

impl Step for ThirdParty {
    fn id(&self) -> status::Step {
        status::Step::ThirdParty
    }

    fn request(&self, event: &DeliveryRequested, _progress: &Progress) -> Call {
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

    fn record(&self, answer: &Value, progress: &mut Progress) -> Result<Option<String>, StepError> {
        let required = answer
            .get("required")
            .and_then(Value::as_bool)
            .ok_or_else(|| invalid_response("`required` flag"))?;
        progress.third_party_required = Some(required);
        Ok(answer
            .get("carrier")
            .and_then(Value::as_str)
            .filter(|_| required)
            .map(|carrier| format!("carrier {carrier}")))
    }
}
