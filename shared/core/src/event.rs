//! The events that travel through the stream, and their codec.
//!
//! The envelope is self-describing JSON with a `schemaVersion` and a `type`;
//! the decoder refuses versions it does not know instead of guessing, so the
//! worker can dead-letter them and move on. Both events of a delivery are keyed
//! by its id, so they share a partition and keep their order.

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use crate::ports::{EventProperties, OutboundEvent};
use crate::request::DeliveryRequest;

/// The schema version this build writes and reads.
pub const SCHEMA_VERSION: u32 = 1;
/// Content type of an encoded envelope (an application property on brokers that have them).
pub const CONTENT_TYPE: &str = "application/vnd.skyport.event+json; v=1";

/// What travels through the stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum Event {
    DeliveryRequested(Box<DeliveryRequested>),
    CancellationRequested(CancellationRequested),
}

/// A client asked to cancel a delivery.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CancellationRequested {
    pub delivery_id: String,
    #[serde(with = "time::serde::rfc3339")]
    pub requested_at: OffsetDateTime,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
}

/// A delivery request the gateway accepted, as it travels through the stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeliveryRequested {
    pub delivery_id: String,
    #[serde(with = "time::serde::rfc3339")]
    pub accepted_at: OffsetDateTime,
    /// W3C trace context of the inbound HTTP request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    pub request: DeliveryRequest,
}

/// Why bytes from the stream are not an event this build can process.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("the event is not a JSON envelope: {0}")]
    Malformed(#[source] serde_json::Error),
    #[error("the envelope has no schemaVersion")]
    MissingVersion,
    #[error("schema version {0} is not supported (this build reads version {SCHEMA_VERSION})")]
    UnsupportedVersion(u64),
    #[error("the version {SCHEMA_VERSION} envelope does not match its schema: {0}")]
    Invalid(#[source] serde_json::Error),
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct EnvelopeOut<'a> {
    schema_version: u32,
    #[serde(flatten)]
    event: &'a Event,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct VersionProbe {
    schema_version: Option<serde_json::Value>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct EnvelopeIn {
    #[serde(rename = "schemaVersion")]
    _schema_version: u32,
    #[serde(flatten)]
    event: Event,
}

impl Event {
    /// The delivery the event is about; also its partition key.
    pub fn delivery_id(&self) -> &str {
        match self {
            Self::DeliveryRequested(e) => &e.delivery_id,
            Self::CancellationRequested(e) => &e.delivery_id,
        }
    }

    /// The event as the stream takes it: keyed by delivery, encoded, with its
    /// trace context and idempotency key beside the payload.
    pub fn outbound(&self) -> OutboundEvent {
        let (traceparent, idempotency_key) = match self {
            Self::DeliveryRequested(e) => (e.traceparent.clone(), e.idempotency_key.clone()),
            Self::CancellationRequested(e) => (e.traceparent.clone(), None),
        };
        OutboundEvent {
            key: self.delivery_id().to_owned(),
            payload: self.encode().into(),
            properties: EventProperties {
                traceparent,
                idempotency_key,
            },
        }
    }

    /// Encodes the event with the current schema version.
    pub fn encode(&self) -> Vec<u8> {
        let envelope = EnvelopeOut {
            schema_version: SCHEMA_VERSION,
            event: self,
        };
        serde_json::to_vec(&envelope)
            .unwrap_or_else(|e| unreachable!("a DeliveryRequested always serializes to JSON: {e}"))
    }

    /// Decodes an envelope written by [`Event::encode`].
    ///
    /// # Errors
    /// [`DecodeError`] says whether the bytes are not JSON, carry an unknown
    /// version, or do not match the version's schema.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let probe: VersionProbe = serde_json::from_slice(bytes).map_err(DecodeError::Malformed)?;
        match probe.schema_version {
            None => Err(DecodeError::MissingVersion),
            Some(v) if v.as_u64() == Some(u64::from(SCHEMA_VERSION)) => {
                let envelope: EnvelopeIn =
                    serde_json::from_slice(bytes).map_err(DecodeError::Invalid)?;
                Ok(envelope.event)
            }
            Some(v) => Err(DecodeError::UnsupportedVersion(
                v.as_u64().unwrap_or(u64::MAX),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::tests::sample;
    use time::macros::datetime;

    fn event() -> Event {
        Event::DeliveryRequested(Box::new(DeliveryRequested {
            delivery_id: "d-1".into(),
            accepted_at: datetime!(2026-11-21 09:59:59.123 UTC),
            traceparent: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into()),
            idempotency_key: Some("key-1".into()),
            request: sample("d-1"),
        }))
    }

    #[test]
    fn an_encoded_event_decodes_to_itself() {
        let event = event();
        assert_eq!(Event::decode(&event.encode()).expect("decode"), event);
    }

    #[test]
    fn the_envelope_names_its_schema_version() {
        let json: serde_json::Value = serde_json::from_slice(&event().encode()).expect("json");
        assert_eq!(json["schemaVersion"], 1);
        assert_eq!(json["deliveryId"], "d-1");
        assert_eq!(json["type"], "DeliveryRequested");
    }

    #[test]
    fn a_cancellation_round_trips() {
        let event = Event::CancellationRequested(CancellationRequested {
            delivery_id: "d-1".into(),
            requested_at: datetime!(2026-11-21 10:00 UTC),
            traceparent: None,
        });
        assert_eq!(Event::decode(&event.encode()).expect("decode"), event);
        assert_eq!(event.delivery_id(), "d-1");
    }

    #[test]
    fn an_unknown_event_type_is_invalid() {
        let bytes = br#"{"schemaVersion":1,"type":"DeliveryTeleported","deliveryId":"d-1"}"#;
        assert!(matches!(Event::decode(bytes), Err(DecodeError::Invalid(_))));
    }

    #[test]
    fn garbage_is_malformed() {
        assert!(matches!(
            Event::decode(b"\x00\x01not json"),
            Err(DecodeError::Malformed(_))
        ));
    }

    #[test]
    fn an_unknown_version_is_refused() {
        let mut json: serde_json::Value = serde_json::from_slice(&event().encode()).expect("json");
        json["schemaVersion"] = 2.into();
        let bytes = serde_json::to_vec(&json).expect("bytes");
        assert!(matches!(
            Event::decode(&bytes),
            Err(DecodeError::UnsupportedVersion(2))
        ));
    }

    #[test]
    fn a_missing_version_is_refused() {
        let mut json: serde_json::Value = serde_json::from_slice(&event().encode()).expect("json");
        json.as_object_mut()
            .expect("object")
            .remove("schemaVersion");
        let bytes = serde_json::to_vec(&json).expect("bytes");
        assert!(matches!(
            Event::decode(&bytes),
            Err(DecodeError::MissingVersion)
        ));
    }

    #[test]
    fn a_known_version_with_a_broken_body_is_invalid() {
        let bytes = br#"{"schemaVersion":1,"deliveryId":"d-1"}"#;
        assert!(matches!(Event::decode(bytes), Err(DecodeError::Invalid(_))));
    }
}
