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
    /// Client-chosen id; the gateway generates one when absent (or `null`,
    /// as the reference implementation's clients send it). Posting the same
    /// id again returns the same delivery (a different body is a 409).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = true, pattern = r"^[A-Za-z0-9._-]{1,64}$", max_length = 64)]
    pub delivery_id: Option<String>,
    #[schema(schema_with = text::<256>)]
    pub owner_id: String,
    #[schema(schema_with = text::<256>)]
    pub pickup_location: String,
    /// RFC 3339, or milliseconds since 1970-01-01T00:00:00Z (as the
    /// reference implementation's Java clients send a `Date`); answered in
    /// RFC 3339.
    #[serde(
        serialize_with = "time::serde::rfc3339::serialize",
        deserialize_with = "instant"
    )]
    #[schema(schema_with = pickup_time_schema)]
    pub pickup_time: OffsetDateTime,
    /// Must be later than `pickupTime`; RFC 3339 or milliseconds since the
    /// epoch, as `pickupTime`.
    #[serde(
        serialize_with = "time::serde::rfc3339::serialize",
        deserialize_with = "instant"
    )]
    #[schema(schema_with = deadline_schema)]
    pub deadline: OffsetDateTime,
    /// Also accepted as `dropOffLocation`, the reference implementation's
    /// spelling (one of the two, not both).
    #[serde(alias = "dropOffLocation")]
    #[schema(schema_with = dropoff_schema)]
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
    /// Absent or `null` when the package has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(schema_with = nullable_text::<64>)]
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

/// A reschedule: a JSON merge patch (RFC 7396) of a delivery request's
/// times and places, and of nothing else. Each field given replaces the
/// request's; none may be removed (`null`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(example = json!({"pickupTime": "2026-11-21T11:00:00Z", "deadline": "2026-11-21T13:00:00Z"}))]
pub struct Reschedule {
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        serialize_with = "optional_rfc3339",
        deserialize_with = "some_instant"
    )]
    #[schema(schema_with = pickup_time_schema)]
    pub pickup_time: Option<OffsetDateTime>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        serialize_with = "optional_rfc3339",
        deserialize_with = "some_instant"
    )]
    #[schema(schema_with = deadline_schema)]
    pub deadline: Option<OffsetDateTime>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    #[schema(schema_with = text::<256>)]
    pub pickup_location: Option<String>,
    #[serde(
        default,
        alias = "dropOffLocation",
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    #[schema(schema_with = dropoff_schema)]
    pub dropoff_location: Option<String>,
}

impl Reschedule {
    /// Checks what the patch alone can show: text fields, a deadline after a
    /// pickup time given beside it, and that it changes something.
    ///
    /// # Errors
    /// Every field that breaks a rule.
    pub fn validate(&self) -> Result<(), Vec<FieldError>> {
        let mut errors = Vec::new();
        if self.fields().is_empty() {
            errors.push(FieldError::new(
                "",
                "the patch changes nothing: give pickupTime, deadline, pickupLocation or dropoffLocation",
            ));
        }
        if let Some(location) = &self.pickup_location {
            check_text(&mut errors, "pickupLocation", location, MAX_TEXT_LEN);
        }
        if let Some(location) = &self.dropoff_location {
            check_text(&mut errors, "dropoffLocation", location, MAX_TEXT_LEN);
        }
        if let (Some(pickup), Some(deadline)) = (self.pickup_time, self.deadline)
            && deadline <= pickup
        {
            errors.push(FieldError::new("deadline", "must be later than pickupTime"));
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors)
        }
    }

    /// The names of the fields the patch gives.
    pub fn fields(&self) -> Vec<String> {
        [
            ("pickupTime", self.pickup_time.is_some()),
            ("deadline", self.deadline.is_some()),
            ("pickupLocation", self.pickup_location.is_some()),
            ("dropoffLocation", self.dropoff_location.is_some()),
        ]
        .into_iter()
        .filter(|(_, given)| *given)
        .map(|(name, _)| name.to_owned())
        .collect()
    }

    /// `request` with the patch applied.
    ///
    /// # Errors
    /// The rules the patched request breaks (a deadline no longer after the
    /// pickup time).
    pub fn apply(&self, request: &DeliveryRequest) -> Result<DeliveryRequest, Vec<FieldError>> {
        let mut patched = request.clone();
        if let Some(at) = self.pickup_time {
            patched.pickup_time = at;
        }
        if let Some(at) = self.deadline {
            patched.deadline = at;
        }
        if let Some(location) = &self.pickup_location {
            patched.pickup_location.clone_from(location);
        }
        if let Some(location) = &self.dropoff_location {
            patched.dropoff_location.clone_from(location);
        }
        patched.validate()?;
        Ok(patched)
    }
}

#[allow(
    clippy::ref_option,
    reason = "serde's serialize_with passes a reference to the field"
)]
fn optional_rfc3339<S: serde::Serializer>(
    at: &Option<OffsetDateTime>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    time::serde::rfc3339::option::serialize(at, serializer)
}

fn some_instant<'de, D>(deserializer: D) -> Result<Option<OffsetDateTime>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    instant(deserializer).map(Some)
}

/// The earliest and latest instants a request may name, as milliseconds
/// since the epoch: what RFC 3339's four-digit years can say.
const EARLIEST_MS: i64 = -62_167_219_200_000;
const LATEST_MS: i64 = 253_402_300_799_999;

/// An instant in RFC 3339, or in milliseconds since 1970-01-01T00:00:00Z.
fn instant<'de, D>(deserializer: D) -> Result<OffsetDateTime, D::Error>
where
    D: serde::Deserializer<'de>,
{
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Instant {
        Text(String),
        Millis(i64),
        /// A whole number written with a fraction (`7763841288.0`) is still
        /// an integer to JSON Schema.
        Float(f64),
    }
    let invalid = || {
        serde::de::Error::custom(
            "expected an RFC 3339 date-time or milliseconds since 1970-01-01T00:00:00Z",
        )
    };
    match Instant::deserialize(deserializer).map_err(|_: D::Error| invalid())? {
        Instant::Text(text) => {
            OffsetDateTime::parse(&text, &time::format_description::well_known::Rfc3339)
                .map_err(serde::de::Error::custom)
        }
        Instant::Millis(ms) if (EARLIEST_MS..=LATEST_MS).contains(&ms) => {
            OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
                .map_err(serde::de::Error::custom)
        }
        #[allow(clippy::cast_possible_truncation, clippy::cast_precision_loss)]
        Instant::Float(ms)
            if ms.fract() == 0.0 && (EARLIEST_MS as f64..=LATEST_MS as f64).contains(&ms) =>
        {
            OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms as i64) * 1_000_000)
                .map_err(serde::de::Error::custom)
        }
        Instant::Float(ms) if ms.fract() != 0.0 => Err(invalid()),
        Instant::Millis(_) | Instant::Float(_) => Err(serde::de::Error::custom(
            "milliseconds since the epoch out of range (years 0000 to 9999)",
        )),
    }
}

fn pickup_time_schema() -> utoipa::openapi::Object {
    instant_schema(
        "RFC 3339, or milliseconds since 1970-01-01T00:00:00Z (as the reference \
         implementation's Java clients send a `Date`); answered in RFC 3339.",
    )
}

fn deadline_schema() -> utoipa::openapi::Object {
    instant_schema(
        "Must be later than `pickupTime`; RFC 3339, or milliseconds since \
         1970-01-01T00:00:00Z; answered in RFC 3339.",
    )
}

fn dropoff_schema() -> utoipa::openapi::Object {
    let mut schema = text::<256>();
    schema.description = Some(
        "Also accepted as `dropOffLocation`, the reference implementation's spelling \
         (one of the two, not both)."
            .to_owned(),
    );
    schema
}

/// The schema of an instant described by `description`: an RFC 3339
/// date-time, which is how the API answers and what its clients send. The
/// milliseconds the reference implementation's clients send are accepted
/// too, as the description and `x-also-accepts` say, and left out of the
/// type, so that the clients generated from the document keep a date-time.
fn instant_schema(description: &str) -> utoipa::openapi::Object {
    use utoipa::openapi::extensions::ExtensionsBuilder;
    use utoipa::openapi::schema::{KnownFormat, ObjectBuilder, SchemaFormat, Type};
    ObjectBuilder::new()
        .schema_type(Type::String)
        .format(Some(SchemaFormat::KnownFormat(KnownFormat::DateTime)))
        .description(Some(description))
        .extensions(Some(
            ExtensionsBuilder::new()
                .add(
                    "x-also-accepts",
                    serde_json::json!({
                        "type": "integer",
                        "format": "int64",
                        "minimum": EARLIEST_MS,
                        "maximum": LATEST_MS,
                        "description": "Milliseconds since 1970-01-01T00:00:00Z."
                    }),
                )
                .build(),
        ))
        .build()
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
    text_of::<MAX>(utoipa::openapi::Type::String.into())
}

/// [`text`], or `null`.
fn nullable_text<const MAX: usize>() -> utoipa::openapi::Object {
    use utoipa::openapi::Type;
    text_of::<MAX>(utoipa::openapi::schema::SchemaType::from_iter([
        Type::String,
        Type::Null,
    ]))
}

fn text_of<const MAX: usize>(
    types: utoipa::openapi::schema::SchemaType,
) -> utoipa::openapi::Object {
    utoipa::openapi::ObjectBuilder::new()
        .schema_type(types)
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
    fn an_absent_id_or_tag_may_be_null_but_a_callback_url_may_not() {
        let mut json = serde_json::to_value(sample("d-1")).expect("serialize");
        json.as_object_mut().expect("object").remove("deliveryId");
        assert_eq!(
            serde_json::from_value::<DeliveryRequest>(json.clone())
                .expect("absent is fine")
                .delivery_id,
            None
        );
        let mut with_nulls = json.clone();
        with_nulls["deliveryId"] = serde_json::Value::Null;
        with_nulls["packageInfo"]["tag"] = serde_json::Value::Null;
        let parsed = serde_json::from_value::<DeliveryRequest>(with_nulls).expect("null is absent");
        assert_eq!((parsed.delivery_id, parsed.package_info.tag), (None, None));
        json["callbackUrl"] = serde_json::Value::Null;
        assert!(serde_json::from_value::<DeliveryRequest>(json).is_err());
    }

    /// A body as the reference implementation's Java clients send it
    /// (Jackson's default serialization of its `ExternalDelivery`) is the
    /// same request as Skyport's own spelling of it.
    #[test]
    fn the_reference_implementations_spelling_is_the_same_request() {
        let mut own = sample("d-1");
        own.delivery_id = None;
        own.package_info.tag = None;
        let reference = serde_json::json!({
            "deliveryId": null,
            "ownerId": "owner-1",
            "pickupLocation": "47.64,-122.13",
            "dropOffLocation": "47.61,-122.20",
            "pickupTime": 1_795_255_200_000_i64,
            "deadline": "2026-11-21T12:00:00Z",
            "confirmationRequired": "Picture",
            "packageInfo": {"packageId": "pkg-d-1", "size": "Small", "weight": 2.5, "tag": null}
        });
        let parsed: DeliveryRequest = serde_json::from_value(reference).expect("accepted");
        assert_eq!(parsed, own);
        assert_eq!(parsed.validate(), Ok(()));
        let written = serde_json::to_value(&parsed).expect("serialize");
        assert_eq!(written["pickupTime"], "2026-11-21T10:00:00Z");
        assert_eq!(written["dropoffLocation"], "47.61,-122.20");
        assert!(written.get("dropOffLocation").is_none());
    }

    #[test]
    fn instants_out_of_range_fractional_or_spelled_twice_are_refused() {
        let json = serde_json::to_value(sample("d-1")).expect("serialize");
        for (field, value) in [
            ("pickupTime", serde_json::json!(LATEST_MS + 1)),
            ("pickupTime", serde_json::json!(EARLIEST_MS - 1)),
            ("deadline", serde_json::json!(1.5)),
            ("deadline", serde_json::json!(1.0e300)),
            ("deadline", serde_json::json!("LineOfDeadlyZombiatedPeople")),
            ("deadline", serde_json::json!(true)),
        ] {
            let mut bad = json.clone();
            bad[field] = value.clone();
            assert!(
                serde_json::from_value::<DeliveryRequest>(bad).is_err(),
                "{field}: {value}"
            );
        }
        for edge in [
            serde_json::json!(EARLIEST_MS),
            serde_json::json!(LATEST_MS),
            serde_json::json!(7_763_841_288.0),
        ] {
            let mut ok = json.clone();
            ok["pickupTime"] = edge.clone();
            assert!(
                serde_json::from_value::<DeliveryRequest>(ok).is_ok(),
                "{edge}"
            );
        }
        let mut twice = json;
        twice["dropOffLocation"] = "47.61,-122.20".into();
        assert!(serde_json::from_value::<DeliveryRequest>(twice).is_err());
    }

    #[test]
    fn unknown_fields_are_rejected_by_the_parser() {
        let mut json = serde_json::to_value(sample("d-1")).expect("serialize");
        json["colour"] = "red".into();
        assert!(serde_json::from_value::<DeliveryRequest>(json).is_err());
    }
}
