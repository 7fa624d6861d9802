//! Safe retries of `POST /api/deliveryrequests`: a request that names its
//! delivery — by a client-chosen `deliveryId`, or by an `Idempotency-Key` the
//! id is derived from — reserves that id in the idempotency store before it is
//! published. A retry finds the reservation and gets the same delivery and the
//! same status URL; the same name with a different body is a conflict.
//!
//! Keys are scoped by the client (the authenticated principal), so two clients
//! can use the same `Idempotency-Key`; delivery ids are global, and a name
//! stays taken for as long as its delivery's status can be read (the POST
//! checks the status when a reservation is new).

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use sha2::{Digest, Sha256};
use skyport_core::ports::Reservation;
use skyport_core::request::DeliveryRequest;
use time::{Duration, OffsetDateTime};

use crate::ids::{DERIVED_HEX, DERIVED_PREFIX};

/// How a request names its delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Name {
    /// The client chose the delivery id.
    DeliveryId(String),
    /// The id is derived from the client's `Idempotency-Key`.
    Key { key: String, delivery_id: String },
}

impl Name {
    /// The name of `request`, if it has one: its `deliveryId` wins over `key`.
    pub fn of(request: &DeliveryRequest, key: Option<&str>, client: &str) -> Option<Self> {
        match (&request.delivery_id, key) {
            (Some(id), _) => Some(Self::DeliveryId(id.clone())),
            (None, Some(key)) => Some(Self::Key {
                key: key.to_owned(),
                delivery_id: derived_id(client, key),
            }),
            (None, None) => None,
        }
    }

    pub fn delivery_id(&self) -> &str {
        match self {
            Self::DeliveryId(id)
            | Self::Key {
                delivery_id: id, ..
            } => id,
        }
    }

    /// The reservation of this name for `request` by `client`, accepted at `at`.
    pub fn reservation(
        &self,
        request: &DeliveryRequest,
        key: Option<&str>,
        client: &str,
        at: OffsetDateTime,
        retention: Duration,
    ) -> Reservation {
        Reservation {
            delivery_id: self.delivery_id().to_owned(),
            fingerprint: fingerprint(request, key, client),
            accepted_at: at,
            expires_at: at + retention,
        }
    }

    /// The name a batch sent with `key` by `client` reserves: the id `key`
    /// would stand for were it followed by a line feed, which a header
    /// cannot carry, so never a delivery's.
    pub fn batch(client: &str, key: &str) -> String {
        derived_id(client, &format!("{key}\n"))
    }

    /// Why a request under this name is not a retry of the one that holds
    /// it: the name is taken, and nothing of whose it is or what it holds.
    pub fn conflict(&self) -> String {
        match self {
            Self::DeliveryId(id) => {
                format!("deliveryId {id} is taken; a retry must repeat its first request exactly")
            }
            Self::Key { key, .. } => format!(
                "Idempotency-Key {key} is taken; a retry must repeat its first request exactly"
            ),
        }
    }
}

/// The delivery id an `Idempotency-Key` stands for: the same for every retry,
/// different for every client.
fn derived_id(client: &str, key: &str) -> String {
    let digest = Sha256::new()
        .chain_update(b"skyport-idempotency-v1\0")
        .chain_update(client.as_bytes())
        .chain_update(b"\0")
        .chain_update(key.as_bytes())
        .finalize();
    let hex: String = digest[..DERIVED_HEX / 2]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("{DERIVED_PREFIX}{hex}")
}

/// What the retry of a batch must repeat: the client, the key and the body,
/// byte for byte.
pub fn batch_fingerprint(client: &str, key: &str, body: &[u8]) -> String {
    let digest = Sha256::new()
        .chain_update(b"skyport-batch-v1\0")
        .chain_update(client.as_bytes())
        .chain_update(b"\0")
        .chain_update(key.as_bytes())
        .chain_update(b"\0")
        .chain_update(body)
        .finalize();
    URL_SAFE_NO_PAD.encode(digest)
}

/// What a retry must repeat: the client, the key and the body as sent.
fn fingerprint(request: &DeliveryRequest, key: Option<&str>, client: &str) -> String {
    let body = serde_json::to_vec(request)
        .unwrap_or_else(|e| unreachable!("a delivery request always serializes: {e}"));
    let digest = Sha256::new()
        .chain_update(client.as_bytes())
        .chain_update(b"\0")
        .chain_update(key.unwrap_or_default().as_bytes())
        .chain_update(b"\0")
        .chain_update(&body)
        .finalize();
    URL_SAFE_NO_PAD.encode(digest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use skyport_core::request::{ConfirmationType, PackageInfo, PackageSize};
    use time::macros::datetime;

    fn request(delivery_id: Option<&str>, weight: f64) -> DeliveryRequest {
        DeliveryRequest {
            delivery_id: delivery_id.map(str::to_owned),
            owner_id: "owner-1".into(),
            pickup_location: "a".into(),
            pickup_time: datetime!(2026-11-21 10:00 UTC),
            deadline: datetime!(2026-11-21 12:00 UTC),
            dropoff_location: "b".into(),
            expedited: false,
            confirmation_required: ConfirmationType::None,
            package_info: PackageInfo {
                package_id: "p-1".into(),
                size: PackageSize::Small,
                weight,
                tag: None,
            },
            callback_url: None,
        }
    }

    #[test]
    fn a_key_names_the_same_delivery_for_its_client_only() {
        let body = request(None, 1.0);
        let a = Name::of(&body, Some("k1"), "alice").expect("named");
        assert_eq!(Name::of(&body, Some("k1"), "alice"), Some(a.clone()));
        let b = Name::of(&body, Some("k1"), "bob").expect("named");
        assert_ne!(a.delivery_id(), b.delivery_id());
        assert!(skyport_core::request::is_valid_id(a.delivery_id()));
    }

    #[test]
    fn a_client_chosen_id_wins_and_an_unnamed_request_has_no_name() {
        let named = Name::of(&request(Some("d-1"), 1.0), Some("k1"), "alice");
        assert_eq!(named, Some(Name::DeliveryId("d-1".into())));
        assert_eq!(Name::of(&request(None, 1.0), None, "alice"), None);
    }

    #[test]
    fn a_retry_has_the_same_fingerprint_and_another_body_does_not() {
        let at = datetime!(2026-11-21 10:00 UTC);
        let name = Name::DeliveryId("d-1".into());
        let reserve = |body: &DeliveryRequest, client| {
            name.reservation(body, None, client, at, Duration::DAY)
                .fingerprint
        };
        let first = reserve(&request(Some("d-1"), 1.0), "alice");
        assert_eq!(first, reserve(&request(Some("d-1"), 1.0), "alice"));
        assert_ne!(first, reserve(&request(Some("d-1"), 2.0), "alice"));
        assert_ne!(first, reserve(&request(Some("d-1"), 1.0), "bob"));
    }
}
