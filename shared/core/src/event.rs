//! The events that travel through the stream, and their codec.
//!
//! The envelope is self-describing JSON with a `schemaVersion` and a `type`;
//! the decoder refuses versions it does not know instead of guessing, so the
//! worker can dead-letter them and move on. Every event of a delivery is keyed
//! by its id, so they share a partition and keep their order.
//!
//! Versions:
//! - 1: `DeliveryRequested` and `CancellationRequested`.
//! - 2: both carry the `principal` that asked (when auth is on), and a
//!   delivery request its `epoch` (its attempt epoch: 0 until a redrive
//!   starts the next) and, for a redrive, why (`redrive`). A version 1 reader ignores the fields it does not know, but
//!   refuses a version 2 envelope as a whole.
//! - 3: `DeliveryRescheduled`, a client's change of a delivery's times and
//!   places. The other events are as in version 2.
//! - 4: `DeliveryDue`, a Waiting delivery's timer firing (the worker writes
//!   it). The other events are as in version 3.
//!
//! The rollout rule: a build reads every version in [`READS`] and writes the
//! one it is told (`gateway.event_schema_version`); every worker must read a
//! version before any gateway writes it. So a rolling upgrade that brings a
//! new version upgrades the workers first, with the gateways still writing
//! the old one, and only then lets the gateways write the new one.

use std::ops::RangeInclusive;

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use crate::lane::Lane;
use crate::ports::{EventProperties, OutboundEvent};
use crate::request::{DeliveryRequest, Reschedule};
use crate::status::QueuedRedrive;

/// The newest schema version, the one this build writes unless told otherwise.
pub const SCHEMA_VERSION: u32 = 4;
/// The versions this build reads.
pub const READS: RangeInclusive<u32> = 1..=SCHEMA_VERSION;

/// Content type of an envelope of `version` (an application property on
/// brokers that have them).
pub fn content_type(version: u32) -> String {
    format!("application/vnd.skyport.event+json; v={version}")
}

/// What travels through the stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum Event {
    DeliveryRequested(Box<DeliveryRequested>),
    CancellationRequested(CancellationRequested),
    DeliveryRescheduled(DeliveryRescheduled),
    DeliveryDue(DeliveryDue),
}

/// A Waiting delivery's time came (version 4): its steps run if its status
/// is still Waiting at `revision`. A timer writes it, at least once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeliveryDue {
    pub delivery_id: String,
    /// The status's revision the timer was set at: a reschedule since then
    /// set another.
    pub revision: u32,
    /// When the steps were to run.
    #[serde(with = "time::serde::rfc3339")]
    pub runs_at: OffsetDateTime,
}

/// A client asked to change a delivery's times or places (version 3).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeliveryRescheduled {
    pub delivery_id: String,
    /// The change's own id: a retried PATCH carries the same one, so the
    /// worker applies it once.
    pub change_id: String,
    #[serde(with = "time::serde::rfc3339")]
    pub requested_at: OffsetDateTime,
    pub changes: Reschedule,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    /// Who asked (with auth on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principal: Option<String>,
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
    /// Who asked (version 2; with auth on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principal: Option<String>,
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
    /// Who asked (version 2; with auth on). The owner is the request's `ownerId`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principal: Option<String>,
    /// The attempt epoch this event runs (version 2): 0 for the request as
    /// accepted.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub epoch: u32,
    /// Why the epoch runs, for a redrive (version 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redrive: Option<QueuedRedrive>,
    pub request: DeliveryRequest,
}

#[allow(
    clippy::trivially_copy_pass_by_ref,
    reason = "serde's skip_serializing_if passes a reference"
)]
fn is_zero(value: &u32) -> bool {
    *value == 0
}

/// Why bytes from the stream are not an event this build can process.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("the event is not a JSON envelope: {0}")]
    Malformed(#[source] serde_json::Error),
    #[error("the envelope has no schemaVersion")]
    MissingVersion,
    #[error(
        "schema version {0} is not supported (this build reads versions {first} to {last})",
        first = READS.start(),
        last = READS.end()
    )]
    UnsupportedVersion(u64),
    #[error("the version {version} envelope does not match its schema: {source}")]
    Invalid {
        version: u32,
        #[source]
        source: serde_json::Error,
    },
}

/// Why an event cannot be written at the version asked for.
#[derive(Debug, thiserror::Error)]
pub enum EncodeError {
    #[error(
        "schema version {0} is not one this build writes (versions {first} to {last})",
        first = READS.start(),
        last = READS.end()
    )]
    UnsupportedVersion(u32),
    #[error("{what} needs schema version {needs}; gateway.event_schema_version is {asked}")]
    NeedsVersion {
        what: &'static str,
        needs: u32,
        asked: u32,
    },
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

/// The envelope of version 1 after decoding: version 2's fields are not
/// part of it, whatever the bytes held.
fn as_version_1(mut event: Event) -> Event {
    match &mut event {
        Event::DeliveryRequested(e) => {
            e.principal = None;
            e.epoch = 0;
            e.redrive = None;
        }
        Event::CancellationRequested(e) => e.principal = None,
        Event::DeliveryRescheduled(_) | Event::DeliveryDue(_) => {}
    }
    event
}

impl Event {
    /// The delivery the event is about; also its partition key.
    pub fn delivery_id(&self) -> &str {
        match self {
            Self::DeliveryRequested(e) => &e.delivery_id,
            Self::CancellationRequested(e) => &e.delivery_id,
            Self::DeliveryRescheduled(e) => &e.delivery_id,
            Self::DeliveryDue(e) => &e.delivery_id,
        }
    }

    /// The event as the stream takes it in `lane`, at the newest schema version.
    pub fn outbound(&self, lane: Lane) -> OutboundEvent {
        self.outbound_as(SCHEMA_VERSION, lane)
            .unwrap_or_else(|e| unreachable!("every event is written at the newest version: {e}"))
    }

    /// The event as the stream takes it at schema `version`, in `lane` (its
    /// delivery's): keyed by delivery, encoded, with its trace context,
    /// idempotency key and version beside the payload.
    ///
    /// # Errors
    /// [`EncodeError`] when the event cannot be written at `version`.
    pub fn outbound_as(&self, version: u32, lane: Lane) -> Result<OutboundEvent, EncodeError> {
        let (traceparent, idempotency_key) = match self {
            Self::DeliveryRequested(e) => (e.traceparent.clone(), e.idempotency_key.clone()),
            Self::CancellationRequested(e) => (e.traceparent.clone(), None),
            Self::DeliveryRescheduled(e) => (e.traceparent.clone(), None),
            Self::DeliveryDue(_) => (None, None),
        };
        Ok(OutboundEvent {
            key: self.delivery_id().to_owned(),
            payload: self.encode_as(version)?.into(),
            properties: EventProperties {
                traceparent,
                idempotency_key,
                schema_version: version,
            },
            lane,
        })
    }

    /// Encodes the event with the newest schema version.
    pub fn encode(&self) -> Vec<u8> {
        self.encode_as(SCHEMA_VERSION)
            .unwrap_or_else(|e| unreachable!("every event is written at the newest version: {e}"))
    }

    /// Encodes the event at schema `version`: at version 1 without the
    /// principal; an epoch past 0 has no version 1 form.
    ///
    /// # Errors
    /// [`EncodeError`] when the event cannot be written at `version`.
    pub fn encode_as(&self, version: u32) -> Result<Vec<u8>, EncodeError> {
        if !READS.contains(&version) {
            return Err(EncodeError::UnsupportedVersion(version));
        }
        if version < 3 && matches!(self, Self::DeliveryRescheduled(_)) {
            return Err(EncodeError::NeedsVersion {
                what: "a reschedule",
                needs: 3,
                asked: version,
            });
        }
        if version < 4 && matches!(self, Self::DeliveryDue(_)) {
            return Err(EncodeError::NeedsVersion {
                what: "a delivery's timer",
                needs: 4,
                asked: version,
            });
        }
        let event = if version == 1 {
            if let Self::DeliveryRequested(e) = self
                && e.epoch > 0
            {
                return Err(EncodeError::NeedsVersion {
                    what: "a delivery's next attempt epoch",
                    needs: 2,
                    asked: version,
                });
            }
            &as_version_1(self.clone())
        } else {
            self
        };
        let envelope = EnvelopeOut {
            schema_version: version,
            event,
        };
        Ok(serde_json::to_vec(&envelope)
            .unwrap_or_else(|e| unreachable!("an event always serializes to JSON: {e}")))
    }

    /// Decodes an envelope written by [`Event::encode`].
    ///
    /// # Errors
    /// [`DecodeError`] says whether the bytes are not JSON, carry an unknown
    /// version, or do not match the version's schema.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let probe: VersionProbe = serde_json::from_slice(bytes).map_err(DecodeError::Malformed)?;
        let version = match probe.schema_version {
            None => return Err(DecodeError::MissingVersion),
            Some(v) => v.as_u64().unwrap_or(u64::MAX),
        };
        let version = u32::try_from(version)
            .ok()
            .filter(|v| READS.contains(v))
            .ok_or(DecodeError::UnsupportedVersion(version))?;
        let envelope: EnvelopeIn = serde_json::from_slice(bytes)
            .map_err(|source| DecodeError::Invalid { version, source })?;
        if version < 3 && matches!(envelope.event, Self::DeliveryRescheduled(_)) {
            return Err(DecodeError::Invalid {
                version,
                source: serde::de::Error::custom("DeliveryRescheduled is an event of version 3"),
            });
        }
        if version < 4 && matches!(envelope.event, Self::DeliveryDue(_)) {
            return Err(DecodeError::Invalid {
                version,
                source: serde::de::Error::custom("DeliveryDue is an event of version 4"),
            });
        }
        Ok(if version == 1 {
            as_version_1(envelope.event)
        } else {
            envelope.event
        })
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
            principal: Some("portal".into()),
            epoch: 0,
            redrive: None,
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
        assert_eq!(json["schemaVersion"], SCHEMA_VERSION);
        assert_eq!(json["deliveryId"], "d-1");
        assert_eq!(json["type"], "DeliveryRequested");
        assert_eq!(json["principal"], "portal");
        assert!(json.get("epoch").is_none(), "epoch 0 is not written");
    }

    #[test]
    fn version_1_is_written_without_the_fields_of_version_2() {
        let bytes = event().encode_as(1).expect("version 1");
        let json: serde_json::Value = serde_json::from_slice(&bytes).expect("json");
        assert_eq!(json["schemaVersion"], 1);
        assert!(json.get("principal").is_none());
        let Event::DeliveryRequested(read) = Event::decode(&bytes).expect("decode") else {
            panic!("a delivery request");
        };
        assert_eq!(read.principal, None);
        assert_eq!(read.request, sample("d-1"));
    }

    #[test]
    fn a_version_1_envelope_of_an_earlier_build_is_read() {
        let bytes = br#"{"schemaVersion":1,"type":"CancellationRequested","deliveryId":"d-1","requestedAt":"2026-11-21T10:00:00Z"}"#;
        let Event::CancellationRequested(read) = Event::decode(bytes).expect("decode") else {
            panic!("a cancellation");
        };
        assert_eq!(read.delivery_id, "d-1");
        assert_eq!(read.principal, None);
    }

    #[test]
    fn a_later_epoch_has_no_version_1_form() {
        let Event::DeliveryRequested(mut requested) = event() else {
            unreachable!()
        };
        requested.epoch = 2;
        let event = Event::DeliveryRequested(requested);
        assert!(matches!(
            event.encode_as(1),
            Err(EncodeError::NeedsVersion { needs: 2, .. })
        ));
        assert!(matches!(
            event.encode_as(5),
            Err(EncodeError::UnsupportedVersion(5))
        ));
        let read = Event::decode(&event.encode()).expect("decode");
        assert_eq!(read, event);
        let outbound = event.outbound_as(2, Lane::Normal).expect("version 2");
        assert_eq!(outbound.properties.schema_version, 2);
        assert_eq!(content_type(2), "application/vnd.skyport.event+json; v=2");
    }

    #[test]
    fn a_cancellation_round_trips() {
        let event = Event::CancellationRequested(CancellationRequested {
            delivery_id: "d-1".into(),
            requested_at: datetime!(2026-11-21 10:00 UTC),
            traceparent: None,
            principal: Some("portal".into()),
        });
        assert_eq!(Event::decode(&event.encode()).expect("decode"), event);
        assert_eq!(event.delivery_id(), "d-1");
    }

    #[test]
    fn a_reschedule_is_an_event_of_version_3() {
        let event = Event::DeliveryRescheduled(DeliveryRescheduled {
            delivery_id: "d-1".into(),
            change_id: "c-1".into(),
            requested_at: datetime!(2026-11-21 10:00 UTC),
            changes: Reschedule {
                pickup_time: Some(datetime!(2026-11-21 11:00 UTC)),
                dropoff_location: Some("47.6,-122.2".into()),
                ..Reschedule::default()
            },
            traceparent: None,
            principal: None,
        });
        assert_eq!(Event::decode(&event.encode()).expect("decode"), event);
        assert_eq!(event.delivery_id(), "d-1");
        assert!(matches!(
            event.encode_as(2),
            Err(EncodeError::NeedsVersion { needs: 3, .. })
        ));
        let mut json: serde_json::Value = serde_json::from_slice(&event.encode()).expect("json");
        assert_eq!(json["changes"]["pickupTime"], "2026-11-21T11:00:00Z");
        json["schemaVersion"] = 2.into();
        let bytes = serde_json::to_vec(&json).expect("bytes");
        assert!(matches!(
            Event::decode(&bytes),
            Err(DecodeError::Invalid { version: 2, .. })
        ));
    }

    #[test]
    fn an_unknown_event_type_is_invalid() {
        let bytes = br#"{"schemaVersion":2,"type":"DeliveryTeleported","deliveryId":"d-1"}"#;
        assert!(matches!(
            Event::decode(bytes),
            Err(DecodeError::Invalid { version: 2, .. })
        ));
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
        json["schemaVersion"] = 5.into();
        let bytes = serde_json::to_vec(&json).expect("bytes");
        assert!(matches!(
            Event::decode(&bytes),
            Err(DecodeError::UnsupportedVersion(5))
        ));
    }

    #[test]
    fn a_timer_is_an_event_of_version_4() {
        let due = Event::DeliveryDue(DeliveryDue {
            delivery_id: "d-1".into(),
            revision: 2,
            runs_at: datetime!(2030-01-01 09:00 UTC),
        });
        assert_eq!(Event::decode(&due.encode()).expect("decode"), due);
        assert!(matches!(
            due.encode_as(3),
            Err(EncodeError::NeedsVersion { needs: 4, .. })
        ));
        let mut json: serde_json::Value = serde_json::from_slice(&due.encode()).expect("json");
        json["schemaVersion"] = 3.into();
        let bytes = serde_json::to_vec(&json).expect("bytes");
        assert!(matches!(
            Event::decode(&bytes),
            Err(DecodeError::Invalid { version: 3, .. })
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
        assert!(matches!(
            Event::decode(bytes),
            Err(DecodeError::Invalid { version: 1, .. })
        ));
    }
}
