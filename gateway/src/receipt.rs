//! Signed status receipts: how the gateway knows that it accepted a request
//! without writing anything but the event itself.
//!
//! A receipt of the normal lane is `base64url(accepted_at_ms as 8 big-endian
//! bytes ‖ the first 16 bytes of HMAC-SHA256(key, "v1|" ‖ id ‖ "|" ‖
//! accepted_at_ms))`. One of the expedited lane has a byte more after the
//! time, 1, and signs `"v2|" ‖ id ‖ "|" ‖ accepted_at_ms ‖ "|expedited"`:
//! the lane travels with the status URL, so that a cancellation or a
//! reschedule goes where its delivery went, and receipts given out before
//! lanes existed still verify (as the normal lane's). A receipt rides in
//! the status URL, so that URL cannot be guessed, and a status read that
//! finds no document yet answers Accepted when the receipt verifies.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use skyport_core::ports::Lane;
use time::OffsetDateTime;

type HmacSha256 = Hmac<Sha256>;

const MAC_LEN: usize = 16;
const RECEIPT_LEN: usize = 8 + MAC_LEN;
/// An expedited receipt's length: the lane's byte after the time.
const LANE_RECEIPT_LEN: usize = RECEIPT_LEN + 1;
const EXPEDITED: u8 = 1;

/// Signs and verifies receipts with one key.
#[derive(Clone)]
pub struct Receipts {
    /// HMAC keyed once (its inner and outer pads hashed): each receipt clones it.
    keyed: HmacSha256,
}

impl std::fmt::Debug for Receipts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Receipts").finish_non_exhaustive()
    }
}

impl Receipts {
    pub fn new(key: &[u8]) -> Self {
        Self {
            keyed: HmacSha256::new_from_slice(key)
                .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length")),
        }
    }

    fn mac(&self, id: &str, millis: i64, lane: Lane) -> HmacSha256 {
        let mut mac = self.keyed.clone();
        mac.update(if lane.is_normal() { b"v1|" } else { b"v2|" });
        mac.update(id.as_bytes());
        mac.update(b"|");
        mac.update(millis.to_string().as_bytes());
        if !lane.is_normal() {
            mac.update(b"|");
            mac.update(lane.as_str().as_bytes());
        }
        mac
    }

    /// The receipt for `id` accepted at `accepted_at` in the normal lane.
    pub fn sign(&self, id: &str, accepted_at: OffsetDateTime) -> String {
        self.sign_in(id, accepted_at, Lane::Normal)
    }

    /// The receipt for `id` accepted at `accepted_at` in `lane`.
    pub fn sign_in(&self, id: &str, accepted_at: OffsetDateTime, lane: Lane) -> String {
        let millis = unix_millis(accepted_at);
        let tag = self.mac(id, millis, lane).finalize().into_bytes();
        let mut bytes = Vec::with_capacity(LANE_RECEIPT_LEN);
        bytes.extend_from_slice(&millis.to_be_bytes());
        if !lane.is_normal() {
            bytes.push(EXPEDITED);
        }
        bytes.extend_from_slice(&tag[..MAC_LEN]);
        URL_SAFE_NO_PAD.encode(bytes)
    }

    /// When `id` was accepted, if `receipt` is one this key signed for it.
    pub fn verify(&self, id: &str, receipt: &str) -> Option<OffsetDateTime> {
        self.verify_lane(id, receipt).map(|(at, _)| at)
    }

    /// When `id` was accepted and in which lane, if `receipt` is one this
    /// key signed for it.
    pub fn verify_lane(&self, id: &str, receipt: &str) -> Option<(OffsetDateTime, Lane)> {
        let bytes = URL_SAFE_NO_PAD.decode(receipt).ok()?;
        let (lane, tag) = match bytes.len() {
            RECEIPT_LEN => (Lane::Normal, &bytes[8..]),
            LANE_RECEIPT_LEN if bytes[8] == EXPEDITED => (Lane::Expedited, &bytes[9..]),
            _ => return None,
        };
        let millis = i64::from_be_bytes(bytes[..8].try_into().ok()?);
        self.mac(id, millis, lane).verify_truncated_left(tag).ok()?;
        let at = OffsetDateTime::from_unix_timestamp_nanos(i128::from(millis) * 1_000_000).ok()?;
        Some((at, lane))
    }
}

fn unix_millis(at: OffsetDateTime) -> i64 {
    i64::try_from(at.unix_timestamp_nanos() / 1_000_000).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::datetime;

    #[test]
    fn a_receipt_verifies_for_its_id_only() {
        let receipts = Receipts::new(b"0123456789abcdef0123456789abcdef");
        let at = datetime!(2026-11-21 10:00:00.123 UTC);
        let receipt = receipts.sign("d-1", at);
        assert_eq!(receipts.verify("d-1", &receipt), Some(at));
        assert_eq!(receipts.verify("d-2", &receipt), None);
    }

    #[test]
    fn another_key_or_a_tampered_receipt_fails() {
        let receipts = Receipts::new(b"0123456789abcdef0123456789abcdef");
        let receipt = receipts.sign("d-1", OffsetDateTime::UNIX_EPOCH);
        let other = Receipts::new(b"fedcba9876543210fedcba9876543210");
        assert_eq!(other.verify("d-1", &receipt), None);
        let mut tampered = receipt.into_bytes();
        tampered[2] = if tampered[2] == b'A' { b'B' } else { b'A' };
        let tampered = String::from_utf8(tampered).expect("ascii");
        assert_eq!(receipts.verify("d-1", &tampered), None);
        assert_eq!(receipts.verify("d-1", "not base64!"), None);
    }

    #[test]
    fn an_expedited_receipt_carries_its_lane_and_a_normal_one_is_unchanged() {
        let receipts = Receipts::new(b"0123456789abcdef0123456789abcdef");
        let at = datetime!(2026-11-21 10:00:00.123 UTC);
        let normal = receipts.sign_in("d-1", at, Lane::Normal);
        assert_eq!(normal, receipts.sign("d-1", at));
        assert_eq!(normal.len(), 32);
        assert_eq!(
            receipts.verify_lane("d-1", &normal),
            Some((at, Lane::Normal))
        );
        let expedited = receipts.sign_in("d-1", at, Lane::Expedited);
        assert_eq!(
            receipts.verify_lane("d-1", &expedited),
            Some((at, Lane::Expedited))
        );
        // The lane is signed: flipping its byte, or dropping it, breaks the receipt.
        let mut bytes = URL_SAFE_NO_PAD.decode(&expedited).expect("base64url");
        bytes[8] = 0;
        assert_eq!(
            receipts.verify_lane("d-1", &URL_SAFE_NO_PAD.encode(&bytes)),
            None
        );
        bytes.remove(8);
        assert_eq!(
            receipts.verify_lane("d-1", &URL_SAFE_NO_PAD.encode(&bytes)),
            None
        );
    }
}
