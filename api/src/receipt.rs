//! Signed status receipts: how the gateway knows that it accepted a request,
//! and for whom, without writing anything but the event itself.
//!
//! A receipt is `base64url(key id ‖ accepted_at_ms as 8 big-endian bytes ‖
//! lane ‖ the first 16 bytes of HMAC-SHA256(key, "v3|" ‖ key id ‖ "|" ‖ id ‖
//! "|" ‖ accepted_at_ms ‖ "|" ‖ lane ‖ "|" ‖ principal))`: bound to the
//! principal that made the delivery (empty with auth off), so that a receipt
//! in someone else's hands opens nothing, and named by its key's id, so that
//! several keys verify side by side while the newest signs (rotation).
//!
//! Receipts signed before principals and key ids (24 bytes for the normal
//! lane, `"v1|" ‖ id ‖ "|" ‖ ms`; 25 for the expedited, with a lane byte and
//! `"v2|…|expedited"`) still verify, with any key, as [`Binding::Unbound`]:
//! whoever checks them compares the principal on the status document.
//! A receipt rides in the status URL, so that URL cannot be guessed, and a
//! status read that finds no document yet answers Accepted when the receipt
//! verifies.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use skyport_core::ports::Lane;
use time::OffsetDateTime;

type HmacSha256 = Hmac<Sha256>;

const MAC_LEN: usize = 16;
/// A receipt of the first format: the time, then the tag.
const V1_LEN: usize = 8 + MAC_LEN;
/// The second format's: the lane's byte after the time.
const V2_LEN: usize = V1_LEN + 1;
/// Today's: the key id, the time, the lane's byte, the tag.
const V3_LEN: usize = 1 + 8 + 1 + MAC_LEN;
const NORMAL: u8 = 0;
const EXPEDITED: u8 = 1;

/// What a verified receipt says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verified {
    pub accepted_at: OffsetDateTime,
    pub lane: Lane,
    pub binding: Binding,
}

/// Whom a verified receipt was issued to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Binding {
    /// The principal it was verified for.
    Principal,
    /// Nobody in particular: issued before receipts named their principal.
    Unbound,
}

/// One key of the ring, keyed once (its inner and outer pads hashed).
#[derive(Clone)]
struct Key {
    id: u8,
    keyed: HmacSha256,
}

/// Signs receipts with the newest key and verifies them with every key.
#[derive(Clone)]
pub struct Receipts {
    /// Newest first; never empty.
    keys: Vec<Key>,
}

impl std::fmt::Debug for Receipts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Receipts")
            .field("keys", &self.keys.len())
            .finish_non_exhaustive()
    }
}

impl Receipts {
    /// A ring of `keys`, newest first: the first signs.
    ///
    /// # Panics
    /// When `keys` is empty (the ports always hold one).
    pub fn new<K: AsRef<[u8]>>(keys: &[K]) -> Self {
        assert!(!keys.is_empty(), "a receipt ring needs a key");
        Self {
            keys: keys
                .iter()
                .map(|key| Key {
                    id: key_id(key.as_ref()),
                    keyed: HmacSha256::new_from_slice(key.as_ref())
                        .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length")),
                })
                .collect(),
        }
    }

    /// The receipt for `id`, accepted at `accepted_at` in `lane` for
    /// `principal` (`None` with auth off).
    pub fn sign(
        &self,
        id: &str,
        accepted_at: OffsetDateTime,
        lane: Lane,
        principal: Option<&str>,
    ) -> String {
        let key = &self.keys[0];
        let millis = unix_millis(accepted_at);
        let tag = mac(key, id, millis, lane, principal.unwrap_or_default())
            .finalize()
            .into_bytes();
        let mut bytes = Vec::with_capacity(V3_LEN);
        bytes.push(key.id);
        bytes.extend_from_slice(&millis.to_be_bytes());
        bytes.push(lane_byte(lane));
        bytes.extend_from_slice(&tag[..MAC_LEN]);
        URL_SAFE_NO_PAD.encode(bytes)
    }

    /// What `receipt` says of `id`, if one of the keys signed it for
    /// `principal` (`None` with auth off) — or, an older receipt, for
    /// nobody in particular.
    pub fn verify(&self, id: &str, receipt: &str, principal: Option<&str>) -> Option<Verified> {
        if receipt.len() > 64 {
            return None;
        }
        let bytes = URL_SAFE_NO_PAD.decode(receipt).ok()?;
        match bytes.len() {
            V3_LEN => {
                let millis = i64::from_be_bytes(bytes[1..9].try_into().ok()?);
                let lane = lane_of(bytes[9])?;
                let tag = &bytes[10..];
                let principal = principal.unwrap_or_default();
                self.keys
                    .iter()
                    .filter(|key| key.id == bytes[0])
                    .find(|key| {
                        mac(key, id, millis, lane, principal)
                            .verify_truncated_left(tag)
                            .is_ok()
                    })?;
                verified(millis, lane, Binding::Principal)
            }
            V1_LEN | V2_LEN => {
                let lane = match bytes.len() {
                    V2_LEN if bytes[8] == EXPEDITED => Lane::Expedited,
                    V2_LEN => return None,
                    _ => Lane::Normal,
                };
                let millis = i64::from_be_bytes(bytes[..8].try_into().ok()?);
                let tag = &bytes[bytes.len() - MAC_LEN..];
                self.keys.iter().find(|key| {
                    unbound_mac(key, id, millis, lane)
                        .verify_truncated_left(tag)
                        .is_ok()
                })?;
                verified(millis, lane, Binding::Unbound)
            }
            _ => None,
        }
    }
}

/// A key's id: a byte of its digest, so that a receipt names the key that
/// signed it without saying anything of it (two keys sharing a byte are
/// both tried).
fn key_id(key: &[u8]) -> u8 {
    Sha256::new()
        .chain_update(b"skyport-receipt-key-id\0")
        .chain_update(key)
        .finalize()[0]
}

fn mac(key: &Key, id: &str, millis: i64, lane: Lane, principal: &str) -> HmacSha256 {
    let mut mac = key.keyed.clone();
    mac.update(b"v3|");
    mac.update(&[key.id]);
    mac.update(b"|");
    mac.update(id.as_bytes());
    mac.update(b"|");
    mac.update(millis.to_string().as_bytes());
    mac.update(b"|");
    mac.update(lane.as_str().as_bytes());
    mac.update(b"|");
    mac.update(principal.as_bytes());
    mac
}

/// The tag of a receipt of the first two formats.
fn unbound_mac(key: &Key, id: &str, millis: i64, lane: Lane) -> HmacSha256 {
    let mut mac = key.keyed.clone();
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

fn lane_byte(lane: Lane) -> u8 {
    if lane.is_normal() { NORMAL } else { EXPEDITED }
}

fn lane_of(byte: u8) -> Option<Lane> {
    match byte {
        NORMAL => Some(Lane::Normal),
        EXPEDITED => Some(Lane::Expedited),
        _ => None,
    }
}

fn verified(millis: i64, lane: Lane, binding: Binding) -> Option<Verified> {
    let accepted_at =
        OffsetDateTime::from_unix_timestamp_nanos(i128::from(millis) * 1_000_000).ok()?;
    Some(Verified {
        accepted_at,
        lane,
        binding,
    })
}

fn unix_millis(at: OffsetDateTime) -> i64 {
    i64::try_from(at.unix_timestamp_nanos() / 1_000_000).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::datetime;

    const KEY: &[u8] = b"0123456789abcdef0123456789abcdef";
    const NEWER: &[u8] = b"fedcba9876543210fedcba9876543210";

    fn ring(keys: &[&[u8]]) -> Receipts {
        Receipts::new(keys)
    }

    /// A receipt as the gateway signed them before principals and key ids.
    fn unbound(key: &[u8], id: &str, at: OffsetDateTime, lane: Lane) -> String {
        let key = Key {
            id: 0,
            keyed: HmacSha256::new_from_slice(key).expect("any length"),
        };
        let millis = unix_millis(at);
        let tag = unbound_mac(&key, id, millis, lane).finalize().into_bytes();
        let mut bytes = millis.to_be_bytes().to_vec();
        if !lane.is_normal() {
            bytes.push(EXPEDITED);
        }
        bytes.extend_from_slice(&tag[..MAC_LEN]);
        URL_SAFE_NO_PAD.encode(bytes)
    }

    #[test]
    fn a_receipt_verifies_for_its_id_and_principal_only() {
        let receipts = ring(&[KEY]);
        let at = datetime!(2026-11-21 10:00:00.123 UTC);
        let receipt = receipts.sign("d-1", at, Lane::Normal, Some("alice"));
        assert_eq!(
            receipts.verify("d-1", &receipt, Some("alice")),
            Some(Verified {
                accepted_at: at,
                lane: Lane::Normal,
                binding: Binding::Principal
            })
        );
        assert_eq!(receipts.verify("d-2", &receipt, Some("alice")), None);
        assert_eq!(receipts.verify("d-1", &receipt, Some("bob")), None);
        assert_eq!(receipts.verify("d-1", &receipt, None), None);
        let anonymous = receipts.sign("d-1", at, Lane::Normal, None);
        assert!(receipts.verify("d-1", &anonymous, None).is_some());
        assert_eq!(receipts.verify("d-1", &anonymous, Some("alice")), None);
    }

    #[test]
    fn another_key_or_a_tampered_receipt_fails() {
        let receipts = ring(&[KEY]);
        let receipt = receipts.sign("d-1", OffsetDateTime::UNIX_EPOCH, Lane::Normal, None);
        assert_eq!(ring(&[NEWER]).verify("d-1", &receipt, None), None);
        for index in 0..receipt.len() {
            let mut tampered = receipt.clone().into_bytes();
            tampered[index] = if tampered[index] == b'A' { b'B' } else { b'A' };
            let tampered = String::from_utf8(tampered).expect("ascii");
            assert_eq!(receipts.verify("d-1", &tampered, None), None, "{index}");
        }
        assert_eq!(receipts.verify("d-1", "not base64!", None), None);
        assert_eq!(receipts.verify("d-1", "", None), None);
    }

    #[test]
    fn the_newest_key_signs_and_every_key_verifies() {
        let at = datetime!(2026-11-21 10:00 UTC);
        let before = ring(&[KEY]).sign("d-1", at, Lane::Expedited, Some("alice"));
        let rotated = ring(&[NEWER, KEY]);
        let after = rotated.sign("d-1", at, Lane::Expedited, Some("alice"));
        assert_ne!(before, after);
        for receipt in [&before, &after] {
            let verified = rotated.verify("d-1", receipt, Some("alice"));
            assert_eq!(verified.map(|v| v.lane), Some(Lane::Expedited));
        }
        // Once the old key is dropped, what it signed no longer verifies.
        assert_eq!(ring(&[NEWER]).verify("d-1", &before, Some("alice")), None);
    }

    #[test]
    fn receipts_issued_before_principals_still_verify_unbound() {
        let at = datetime!(2026-11-21 10:00:00.123 UTC);
        let receipts = ring(&[NEWER, KEY]);
        for lane in [Lane::Normal, Lane::Expedited] {
            let old = unbound(KEY, "d-1", at, lane);
            for principal in [None, Some("alice"), Some("bob")] {
                assert_eq!(
                    receipts.verify("d-1", &old, principal),
                    Some(Verified {
                        accepted_at: at,
                        lane,
                        binding: Binding::Unbound
                    }),
                );
            }
            assert_eq!(receipts.verify("d-2", &old, None), None);
            assert_eq!(ring(&[NEWER]).verify("d-1", &old, None), None);
        }
        // The lane is signed: flipping its byte, or dropping it, breaks the receipt.
        let old = unbound(KEY, "d-1", at, Lane::Expedited);
        let mut bytes = URL_SAFE_NO_PAD.decode(&old).expect("base64url");
        bytes[8] = 0;
        assert_eq!(
            receipts.verify("d-1", &URL_SAFE_NO_PAD.encode(&bytes), None),
            None
        );
        bytes.remove(8);
        assert_eq!(
            receipts.verify("d-1", &URL_SAFE_NO_PAD.encode(&bytes), None),
            None
        );
    }
}
