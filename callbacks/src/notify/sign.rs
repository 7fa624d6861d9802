//! Standard Webhooks signatures: the `webhook-signature` header that lets a
//! receiver check that a callback came from Skyport and was not altered or
//! replayed with another id or time.
//!
//! Each key signs `{webhook-id}.{webhook-timestamp}.{body}` with HMAC-SHA256;
//! the header lists one `v1,<base64>` per key, separated by spaces, so that a
//! secret can be rotated without receivers missing a callback.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// Signs callbacks with every configured key.
#[derive(Clone)]
pub(crate) struct Signer {
    /// One HMAC per key, keyed once (its pads hashed): each signature clones it.
    keyed: Vec<HmacSha256>,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signer")
            .field("keys", &self.keyed.len())
            .finish_non_exhaustive()
    }
}

impl Signer {
    /// A signer over `keys`, the decoded secrets (`CallbackSettings::keys`).
    pub(crate) fn new(keys: &[Vec<u8>]) -> Self {
        Self {
            keyed: keys
                .iter()
                .map(|key| {
                    HmacSha256::new_from_slice(key)
                        .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"))
                })
                .collect(),
        }
    }

    /// The `webhook-signature` value for the callback `id` sent at
    /// `timestamp` (Unix seconds, the `webhook-timestamp` header) with `body`.
    pub(crate) fn sign(&self, id: &str, timestamp: i64, body: &[u8]) -> String {
        let timestamp = timestamp.to_string();
        let signatures: Vec<String> = self
            .keyed
            .iter()
            .map(|keyed| {
                let mut mac = keyed.clone();
                mac.update(id.as_bytes());
                mac.update(b".");
                mac.update(timestamp.as_bytes());
                mac.update(b".");
                mac.update(body);
                format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
            })
            .collect();
        signatures.join(" ")
    }
}

#[cfg(test)]
mod tests {
    use skyport_runtime::config::decode_secret;

    use super::*;

    fn key(secret: &str) -> Vec<u8> {
        decode_secret(secret).expect("a whsec_ secret")
    }

    #[test]
    fn the_signature_matches_the_reference_implementation() {
        // The reference libraries' own test vector.
        let signer = Signer::new(&[key("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")]);
        assert_eq!(
            signer.sign(
                "msg_p5jXN8AQM9LWM0D4loKWxJek",
                1_614_265_330,
                br#"{"test": 2432232314}"#
            ),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }

    #[test]
    fn every_key_adds_a_signature() {
        let signer = Signer::new(&[
            key("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
            key("whsec_AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="),
        ]);
        assert_eq!(
            signer.sign("msg_2", 1_700_000_000, br#"{"status":"Delivered"}"#),
            "v1,18G02rmPPmozQC44a7+79VnrI8aHrEz9omwN9zw/RU0= \
             v1,mX2g5fTpF68AG0ZYWlbYRsy+RHAJipcDdg7sULek2Jw="
        );
    }

    #[test]
    fn the_id_and_timestamp_are_signed() {
        let signer = Signer::new(&[key("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")]);
        let signature = signer.sign("msg_1", 1_700_000_000, b"{}");
        assert_ne!(signature, signer.sign("msg_2", 1_700_000_000, b"{}"));
        assert_ne!(signature, signer.sign("msg_1", 1_700_000_001, b"{}"));
    }
}
