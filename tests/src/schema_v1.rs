//! The event codec of the last build before schema version 2 (commit
//! e38028d), kept as it was: what a worker of that build reads, and how a
//! gateway of that build writes. A rolling upgrade's test holds this build's
//! events against it, so that the rollout rule's promise — a worker of
//! either build reads what a gateway writes during the rollout — is checked
//! against the old code, not against a description of it.

use serde::{Deserialize, Serialize};
use skyport_core::request::DeliveryRequest;
use time::OffsetDateTime;

/// The only version the old build reads and writes.
pub const SCHEMA_VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum Event {
    DeliveryRequested(Box<DeliveryRequested>),
    CancellationRequested(CancellationRequested),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CancellationRequested {
    pub delivery_id: String,
    #[serde(with = "time::serde::rfc3339")]
    pub requested_at: OffsetDateTime,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeliveryRequested {
    pub delivery_id: String,
    #[serde(with = "time::serde::rfc3339")]
    pub accepted_at: OffsetDateTime,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    pub request: DeliveryRequest,
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
struct EnvelopeIn {
    #[serde(rename = "schemaVersion")]
    _schema_version: u32,
    #[serde(flatten)]
    event: Event,
}

impl Event {
    /// The old build's encoding.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(&EnvelopeOut {
            schema_version: SCHEMA_VERSION,
            event: self,
        })
        .unwrap_or_else(|e| unreachable!("an event always serializes: {e}"))
    }

    /// The old build's decoding: version 1 only; an error is what it dead-letters.
    ///
    /// # Errors
    /// Why the old build would dead-letter the bytes.
    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        let probe: VersionProbe = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        match probe.schema_version {
            Some(v) if v.as_u64() == Some(u64::from(SCHEMA_VERSION)) => {
                let envelope: EnvelopeIn =
                    serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
                Ok(envelope.event)
            }
            other => Err(format!("schema version {other:?} is not supported")),
        }
    }
}
