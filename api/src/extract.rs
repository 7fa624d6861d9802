//! The JSON body extractor: content type, size limit, parse with the path of
//! the offending field, then the request's own validation.
//!
//! Syntax errors are 400; well-formed JSON of the wrong shape (types, missing
//! or unknown fields) and rule violations are 422 with the fields named.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::header;
use serde::de::DeserializeOwned;
use serde_json::error::Category;
use skyport_core::request::{DeliveryRequest, FieldError};

use crate::error::ApiError;

/// A request body that is a JSON object of type `T`.
#[derive(Debug)]
pub struct JsonBody<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    /// The body has been read whole and bounded by the gateway's body stage
    /// ([`crate::body`]) before this runs.
    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        check_content_type(req.headers().get(header::CONTENT_TYPE))?;
        let bytes = Bytes::from_request(req, state)
            .await
            .map_err(|rejection| ApiError::BadRequest(rejection.body_text()))?;
        parse(&bytes).map(JsonBody)
    }
}

/// A body already read whole (`bytes`) as a JSON object of type `T`, after
/// its `Content-Type` in `headers`.
///
/// # Errors
/// 415 for a type that is not JSON, else as a [`JsonBody`] is refused.
pub fn json_body<T: DeserializeOwned>(
    headers: &header::HeaderMap,
    bytes: &[u8],
) -> Result<T, ApiError> {
    check_content_type(headers.get(header::CONTENT_TYPE))?;
    parse(bytes)
}

/// A [`DeliveryRequest`] that parsed and passed validation.
#[derive(Debug)]
pub struct ValidDeliveryRequest(pub DeliveryRequest);

impl<S: Send + Sync> FromRequest<S> for ValidDeliveryRequest {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let JsonBody(request) = JsonBody::<DeliveryRequest>::from_request(req, state).await?;
        validated(request).map(Self)
    }
}

/// A delivery request from a body's bytes: parsed, then validated, with the
/// errors a POST answers with.
///
/// # Errors
/// [`ApiError::MalformedJson`] for bytes that are not one JSON object,
/// [`ApiError::Validation`] naming each field of the wrong shape or against the rules.
pub fn parse_delivery_request(bytes: &[u8]) -> Result<DeliveryRequest, ApiError> {
    parse(bytes).and_then(validated)
}

fn validated(request: DeliveryRequest) -> Result<DeliveryRequest, ApiError> {
    request.validate().map_err(ApiError::Validation)?;
    Ok(request)
}

fn check_content_type(value: Option<&header::HeaderValue>) -> Result<(), ApiError> {
    let Some(value) = value else {
        return Err(ApiError::UnsupportedMediaType(
            "a body without a Content-Type".into(),
        ));
    };
    let text = value.to_str().unwrap_or_default();
    let essence = text
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    let json = essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"));
    if json {
        Ok(())
    } else {
        Err(ApiError::UnsupportedMediaType(if text.is_empty() {
            "an empty Content-Type".into()
        } else {
            text.to_owned()
        }))
    }
}

fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    // serde would read a struct from a positional array; an API body is an object.
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(
            match serde_json::from_slice::<serde::de::IgnoredAny>(bytes) {
                Ok(_) => {
                    ApiError::Validation(vec![FieldError::new("(body)", "must be a JSON object")])
                }
                Err(e) => ApiError::MalformedJson(e.to_string()),
            },
        );
    }
    // Almost every body parses: only a failed parse pays for tracking the
    // path of the field it failed at (it is parsed again to find it).
    if let Ok(value) = serde_json::from_slice(bytes) {
        return Ok(value);
    }
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut deserializer).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        match inner.classify() {
            // serde_json reports a `null` where an enum belongs as a syntax
            // error; JSON that parses is a shape error all the same.
            Category::Syntax if serde_json::from_slice::<serde_json::Value>(bytes).is_ok() => {
                ApiError::Validation(vec![field_error(&path, &inner)])
            }
            Category::Syntax | Category::Eof | Category::Io => {
                ApiError::MalformedJson(inner.to_string())
            }
            Category::Data => ApiError::Validation(vec![field_error(&path, &inner)]),
        }
    })?;
    deserializer
        .end()
        .map_err(|e| ApiError::MalformedJson(e.to_string()))?;
    Ok(value)
}

/// Names the field of a data error: serde reports a missing field, and one
/// given twice (`dropoffLocation` and its alias `dropOffLocation`), at its
/// parent's path, with the field's name in backticks.
fn field_error(path: &str, error: &serde_json::Error) -> FieldError {
    let message = error.to_string();
    let message = message
        .rsplit_once(" at line ")
        .map_or(message.as_str(), |(m, _)| m)
        .to_owned();
    let named = ["missing field `", "duplicate field `"]
        .iter()
        .find_map(|prefix| message.strip_prefix(prefix))
        .and_then(|rest| rest.split('`').next());
    let parent = if path == "." { "" } else { path };
    let field = match named {
        Some(name) if parent.is_empty() => name.to_owned(),
        Some(name) => format!("{parent}.{name}"),
        None if parent.is_empty() => "(body)".to_owned(),
        None => parent.to_owned(),
    };
    FieldError::new(field, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(body: &str) -> Vec<String> {
        match parse::<DeliveryRequest>(body.as_bytes()) {
            Err(ApiError::Validation(errors)) => errors.into_iter().map(|e| e.field).collect(),
            other => panic!("expected a validation error, got {other:?}"),
        }
    }

    #[test]
    fn a_missing_top_level_field_is_named() {
        assert_eq!(fields(r#"{"pickupLocation":"a"}"#), ["ownerId"]);
    }

    #[test]
    fn a_wrong_nested_type_is_named_by_its_path() {
        let body = r#"{"ownerId":"o","pickupLocation":"a","pickupTime":"2026-01-01T00:00:00Z",
            "deadline":"2026-01-02T00:00:00Z","dropoffLocation":"b",
            "packageInfo":{"packageId":"p","size":"Small","weight":"heavy"}}"#;
        assert_eq!(fields(body), ["packageInfo.weight"]);
    }

    #[test]
    fn an_unknown_nested_field_is_named() {
        let body = r#"{"ownerId":"o","pickupLocation":"a","pickupTime":"2026-01-01T00:00:00Z",
            "deadline":"2026-01-02T00:00:00Z","dropoffLocation":"b",
            "packageInfo":{"packageId":"p","size":"Small","weight":1,"colour":"red"}}"#;
        assert_eq!(fields(body), ["packageInfo.colour"]);
    }

    #[test]
    fn null_where_an_enum_belongs_is_a_validation_error() {
        let body = r#"{"ownerId":"o","pickupLocation":"a","pickupTime":"2026-01-01T00:00:00Z",
            "deadline":"2026-01-02T00:00:00Z","dropoffLocation":"b","confirmationRequired":null,
            "packageInfo":{"packageId":"p","size":null,"weight":1}}"#;
        assert_eq!(fields(body), ["confirmationRequired"]);
    }

    #[test]
    fn truncated_json_is_malformed() {
        assert!(matches!(
            parse::<DeliveryRequest>(br#"{"ownerId": "#),
            Err(ApiError::MalformedJson(_))
        ));
    }

    #[test]
    fn trailing_garbage_is_malformed() {
        assert!(matches!(
            parse::<serde_json::Value>(br#"{} {}"#),
            Err(ApiError::MalformedJson(_))
        ));
    }

    #[test]
    fn json_content_types_are_recognised() {
        for ok in [
            "application/json",
            "application/json; charset=utf-8",
            "application/problem+json",
            "APPLICATION/JSON",
        ] {
            assert!(
                check_content_type(Some(&header::HeaderValue::from_static(ok))).is_ok(),
                "{ok}"
            );
        }
        for bad in ["text/plain", "application/xml", ""] {
            assert!(
                check_content_type(Some(&header::HeaderValue::from_static(bad))).is_err(),
                "{bad}"
            );
        }
        assert!(check_content_type(None).is_err());
    }
}
