//! The `DeliveryRequest` a client posts, and its validation.
//!
//! Parsing (types, required and unknown fields) is serde's job; [`DeliveryRequest::validate`]
//! checks what types cannot say and reports every offending field at once.

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use utoipa::ToSchema;

/// The longest id (delivery, package) the system accepts.
pub const MAX_ID_LEN: usize = 64;
const MAX_TEXT_LEN: usize = 256;
const MAX_TAG_LEN: usize = 64;
const MAX_URL_LEN: usize = 2048;
/// The heaviest package a drone carries, in kilograms.
pub const MAX_WEIGHT_KG: f64 = 100.0;

/// A client's request to schedule a drone delivery.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(example = json!({
    "deliveryId": "d-2026-11-21-0001",
    "ownerId": "owner-42",
    "pickupLocation": "47.6405,-122.1297",
    "pickupTime": "2026-11-21T10:00:00Z",
    "deadline": "2026-11-21T12:00:00Z",
    "dropoffLocation": "47.6101,-122.2015",
    "expedited": false,
    "confirmationRequired": "Picture",
    "packageInfo": {"packageId": "pkg-0001", "size": "Small", "weight": 2.5, "tag": "fragile"}
}))]
///
/// Text fields must hold something besides whitespace and no control
/// characters: their `pattern` says so, and [`DeliveryRequest::validate`] checks it.
pub struct DeliveryRequest {
    /// Client-chosen id; the gateway generates one when absent. Posting the
    /// same id again returns the same delivery (a different body is a 409).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    #[schema(nullable = false, pattern = r"^[A-Za-z0-9._-]{1,64}$", max_length = 64)]
    pub delivery_id: Option<String>,
    #[schema(schema_with = text::<256>)]
    pub owner_id: String,
    #[schema(schema_with = text::<256>)]
    pub pickup_location: String,
    #[serde(with = "time::serde::rfc3339")]
    pub pickup_time: OffsetDateTime,
    /// Must be later than `pickupTime`.
    #[serde(with = "time::serde::rfc3339")]
    pub deadline: OffsetDateTime,
    #[schema(schema_with = text::<256>)]
    pub dropoff_location: String,
    #[serde(default)]
    pub expedited: bool,
    #[serde(default)]
    pub confirmation_required: ConfirmationType,
    pub package_info: PackageInfo,
    /// Where the terminal status is delivered, if the client wants a callback:
    /// a POST signed as Standard Webhooks specifies (`webhooks.deliveryStatus`)
    /// per terminal state. Refused (422) when callbacks are off, or when the
    /// host is a literal loopback, private, link-local, multicast or
    /// unspecified address that `callbacks.allow` does not name; a host name
    /// is checked on the addresses it resolves to when the callback is sent.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    #[schema(
        nullable = false,
        format = "uri",
        max_length = 2048,
        pattern = r"^[Hh][Tt][Tt][Pp][Ss]?://[^/?#]"
    )]
    pub callback_url: Option<String>,
}

/// How the recipient confirms the drop-off.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub enum ConfirmationType {
    #[default]
    None,
    FingerPrint,
    Picture,
    Voice,
}

/// The package to be carried.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PackageInfo {
    #[schema(pattern = r"^[A-Za-z0-9._-]{1,64}$", max_length = 64)]
    pub package_id: String,
    pub size: PackageSize,
    /// Kilograms.
    #[schema(exclusive_minimum = 0.0, maximum = 100.0)]
    pub weight: f64,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    #[schema(schema_with = text::<64>)]
    pub tag: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub enum PackageSize {
    Small,
    Medium,
    Large,
}

/// One field that failed validation, named by its JSON path (`packageInfo.weight`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

impl FieldError {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }
}

impl DeliveryRequest {
    /// Checks the rules that types cannot express.
    ///
    /// # Errors
    /// Every field that breaks a rule, in document order.
    pub fn validate(&self) -> Result<(), Vec<FieldError>> {
        let mut errors = Vec::new();
        if let Some(id) = &self.delivery_id {
            check_id(&mut errors, "deliveryId", id);
        }
        check_text(&mut errors, "ownerId", &self.owner_id, MAX_TEXT_LEN);
        check_text(
            &mut errors,
            "pickupLocation",
            &self.pickup_location,
            MAX_TEXT_LEN,
        );
        if self.deadline <= self.pickup_time {
            errors.push(FieldError::new("deadline", "must be later than pickupTime"));
        }
        check_text(
            &mut errors,
            "dropoffLocation",
            &self.dropoff_location,
            MAX_TEXT_LEN,
        );
        check_id(
            &mut errors,
            "packageInfo.packageId",
            &self.package_info.package_id,
        );
        let weight = self.package_info.weight;
        if !(weight.is_finite() && weight > 0.0 && weight <= MAX_WEIGHT_KG) {
            errors.push(FieldError::new(
                "packageInfo.weight",
                format!("must be more than 0 and at most {MAX_WEIGHT_KG} kg"),
            ));
        }
        if let Some(tag) = &self.package_info.tag {
            check_text(&mut errors, "packageInfo.tag", tag, MAX_TAG_LEN);
        }
        if let Some(url) = &self.callback_url {
            check_callback_url(&mut errors, url);
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors)
        }
    }
}

/// An optional field that, when present, has a value: `null` is refused
/// rather than read as absent, as the OpenAPI document says.
fn present<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    T::deserialize(deserializer).map(Some)
}

/// Whether `id` may name a delivery or package: it travels in URL paths and store keys.
pub fn is_valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_ID_LEN
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

fn check_id(errors: &mut Vec<FieldError>, field: &str, id: &str) {
    if !is_valid_id(id) {
        errors.push(FieldError::new(
            field,
            format!("must be 1 to {MAX_ID_LEN} characters of A-Z, a-z, 0-9, '-', '_' or '.'"),
        ));
    }
}

/// The schema of a text field of at most `MAX` characters: what
/// [`check_text`] checks, as a JSON-schema pattern (something besides
/// whitespace, and no C0, DEL or C1 control character).
fn text<const MAX: usize>() -> utoipa::openapi::Object {
    utoipa::openapi::ObjectBuilder::new()
        .schema_type(utoipa::openapi::Type::String)
        .min_length(Some(1))
        .max_length(Some(MAX))
        .pattern(Some(
            r"^[^\x00-\x1F\x7F-\x9F]*[^\s\x00-\x1F\x7F-\x9F][^\x00-\x1F\x7F-\x9F]*$",
        ))
        .build()
}

fn check_text(errors: &mut Vec<FieldError>, field: &str, value: &str, max: usize) {
    // U+FEFF counts as blank, as `\s` in the schema's pattern (ECMA-262) says.
    if value.chars().all(|c| c.is_whitespace() || c == '\u{feff}') {
        errors.push(FieldError::new(field, "must not be empty"));
    } else if value.chars().count() > max {
        errors.push(FieldError::new(
            field,
            format!("must be at most {max} characters"),
        ));
    } else if value.chars().any(char::is_control) {
        errors.push(FieldError::new(
            field,
            "must not contain control characters",
        ));
    }
}

fn check_callback_url(errors: &mut Vec<FieldError>, url: &str) {
    let ok = url.len() <= MAX_URL_LEN
        && url::Url::parse(url)
            .is_ok_and(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some());
    if !ok {
        errors.push(FieldError::new(
            "callbackUrl",
            format!("must be an absolute http or https URL of at most {MAX_URL_LEN} characters"),
        ));
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use time::macros::datetime;

    pub(crate) fn sample(id: &str) -> DeliveryRequest {
        DeliveryRequest {
            delivery_id: Some(id.to_owned()),
            owner_id: "owner-1".into(),
            pickup_location: "47.64,-122.13".into(),
            pickup_time: datetime!(2026-11-21 10:00 UTC),
            deadline: datetime!(2026-11-21 12:00 UTC),
            dropoff_location: "47.61,-122.20".into(),
            expedited: false,
            confirmation_required: ConfirmationType::Picture,
            package_info: PackageInfo {
                package_id: format!("pkg-{id}"),
                size: PackageSize::Small,
                weight: 2.5,
                tag: Some("fragile".into()),
            },
            callback_url: None,
        }
    }

    #[test]
    fn a_complete_request_is_valid() {
        assert_eq!(sample("d-1").validate(), Ok(()));
    }

    #[test]
    fn every_broken_field_is_reported_at_once() {
        let mut request = sample("bad id!");
        request.owner_id = " ".into();
        request.deadline = request.pickup_time;
        request.package_info.weight = -1.0;
        request.callback_url = Some("ftp://example.com".into());
        let fields: Vec<_> = request
            .validate()
            .expect_err("invalid")
            .into_iter()
            .map(|e| e.field)
            .collect();
        assert_eq!(
            fields,
            [
                "deliveryId",
                "ownerId",
                "deadline",
                "packageInfo.packageId",
                "packageInfo.weight",
                "callbackUrl"
            ]
        );
    }

    #[test]
    fn nan_weight_is_rejected() {
        let mut request = sample("d-1");
        request.package_info.weight = f64::NAN;
        assert!(request.validate().is_err());
    }

    #[test]
    fn an_optional_field_may_be_absent_but_not_null() {
        let mut json = serde_json::to_value(sample("d-1")).expect("serialize");
        json.as_object_mut().expect("object").remove("deliveryId");
        assert_eq!(
            serde_json::from_value::<DeliveryRequest>(json.clone())
                .expect("absent is fine")
                .delivery_id,
            None
        );
        for field in ["deliveryId", "callbackUrl"] {
            let mut with_null = json.clone();
            with_null[field] = serde_json::Value::Null;
            assert!(serde_json::from_value::<DeliveryRequest>(with_null).is_err());
        }
        json["packageInfo"]["tag"] = serde_json::Value::Null;
        assert!(serde_json::from_value::<DeliveryRequest>(json).is_err());
    }

    #[test]
    fn unknown_fields_are_rejected_by_the_parser() {
        let mut json = serde_json::to_value(sample("d-1")).expect("serialize");
        json["colour"] = "red".into();
        assert!(serde_json::from_value::<DeliveryRequest>(json).is_err());
    }
}
