//! Standard Webhooks signatures and the secrets behind them: the
//! `webhook-signature` header that lets a receiver check that a callback came
//! from Skyport and was not altered or replayed with another id or time, and
//! the `webhook-id` no one can guess without the master secret.
//!
//! The master secrets (`callbacks.secrets`, or the one the embedded store
//! keeps) never sign a tenant's callbacks themselves: a delivery made by the
//! principal P is signed with each master M's derived secret
//! `HMAC-SHA256(M, "skyport-callback-secret-v1\0" ‖ P)`, all that P's receiver
//! holds, so that one tenant cannot forge another's callbacks. Without a
//! principal (auth off) the masters sign. Each key signs
//! `{webhook-id}.{webhook-timestamp}.{body}` with HMAC-SHA256; the header
//! lists one `v1,<base64>` per master, separated by spaces, so that a master
//! can be rotated without receivers missing a callback.

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use hmac::{Hmac, Mac};
use secrecy::SecretString;
use sha2::Sha256;
use skyport_runtime::config::SECRET_PREFIX;

type HmacSha256 = Hmac<Sha256>;

/// What a derived secret is a MAC of, before the principal.
const SECRET_LABEL: &[u8] = b"skyport-callback-secret-v1\0";
/// What a `webhook-id` is a MAC of, before the message's fields.
const ID_LABEL: &[u8] = b"skyport-webhook-id-v1\0";
/// The bytes of the MAC a `webhook-id` keeps.
const ID_BYTES: usize = 16;

/// The master secrets, newest (first configured) first, each keyed once
/// (its pads hashed): a derivation or an id clones it.
#[derive(Clone)]
pub struct MasterSecrets {
    keyed: Vec<HmacSha256>,
}

impl std::fmt::Debug for MasterSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MasterSecrets")
            .field("count", &self.keyed.len())
            .finish_non_exhaustive()
    }
}

impl MasterSecrets {
    /// The masters over `keys`, the decoded secrets (`CallbackSettings::keys`);
    /// `None` when there is none.
    pub fn new(keys: &[Vec<u8>]) -> Option<Self> {
        (!keys.is_empty()).then(|| Self {
            keyed: keys.iter().map(|key| keyed(key)).collect(),
        })
    }

    /// The principal's secret under each master, newest first, as its
    /// receiver verifies with it (`whsec_` + base64).
    pub fn principal_secrets(&self, principal: &str) -> Vec<SecretString> {
        self.keyed
            .iter()
            .map(|master| {
                let key = derive(master, principal);
                SecretString::from(format!("{SECRET_PREFIX}{}", STANDARD.encode(key)))
            })
            .collect()
    }

    /// The signer of the callbacks of a delivery made by `principal`: its
    /// derived secrets, or the masters themselves without a principal.
    pub(crate) fn signer(&self, principal: Option<&str>) -> Signer {
        let keyed = match principal {
            Some(principal) => self
                .keyed
                .iter()
                .map(|master| keyed(&derive(master, principal)))
                .collect(),
            None => self.keyed.clone(),
        };
        Signer { keyed }
    }

    /// The `webhook-id` of the callback announcing `state` (its name) of
    /// `delivery_id` in attempt epoch `epoch`: `msg_` and the base64url of
    /// the first 16 bytes of an HMAC-SHA256 of those under the first master.
    /// The same for every attempt and resend of one message, another for
    /// each message, and not to be guessed without the master.
    pub(crate) fn webhook_id(&self, delivery_id: &str, state: &str, epoch: u32) -> String {
        let mut mac = self.keyed[0].clone();
        mac.update(ID_LABEL);
        mac.update(delivery_id.as_bytes());
        mac.update(b"\0");
        mac.update(state.as_bytes());
        mac.update(b"\0");
        mac.update(epoch.to_string().as_bytes());
        let digest = mac.finalize().into_bytes();
        format!("msg_{}", URL_SAFE_NO_PAD.encode(&digest[..ID_BYTES]))
    }
}

fn keyed(key: &[u8]) -> HmacSha256 {
    HmacSha256::new_from_slice(key)
        .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"))
}

/// `principal`'s secret under `master`.
fn derive(master: &HmacSha256, principal: &str) -> [u8; 32] {
    let mut mac = master.clone();
    mac.update(SECRET_LABEL);
    mac.update(principal.as_bytes());
    mac.finalize().into_bytes().into()
}

/// Signs the callbacks of one delivery with each of its keys.
#[derive(Clone)]
pub(crate) struct Signer {
    /// One HMAC per key, keyed once: each signature clones it.
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
    use secrecy::ExposeSecret;
    use skyport_runtime::config::decode_secret;

    use super::*;

    const MASTER: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const OLDER: &str = "whsec_AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";

    fn key(secret: &str) -> Vec<u8> {
        decode_secret(secret).expect("a whsec_ secret")
    }

    fn masters(secrets: &[&str]) -> MasterSecrets {
        MasterSecrets::new(&secrets.iter().map(|s| key(s)).collect::<Vec<_>>()).expect("a master")
    }

    #[test]
    fn the_signature_matches_the_reference_implementation() {
        // The reference libraries' own test vector, signed by the master (no principal).
        let signer = masters(&[MASTER]).signer(None);
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
    fn every_master_adds_a_signature() {
        let signer = masters(&[MASTER, OLDER]).signer(None);
        assert_eq!(
            signer.sign("msg_2", 1_700_000_000, br#"{"status":"Delivered"}"#),
            "v1,18G02rmPPmozQC44a7+79VnrI8aHrEz9omwN9zw/RU0= \
             v1,mX2g5fTpF68AG0ZYWlbYRsy+RHAJipcDdg7sULek2Jw="
        );
    }

    #[test]
    fn the_id_and_timestamp_are_signed() {
        let signer = masters(&[MASTER]).signer(None);
        let signature = signer.sign("msg_1", 1_700_000_000, b"{}");
        assert_ne!(signature, signer.sign("msg_2", 1_700_000_000, b"{}"));
        assert_ne!(signature, signer.sign("msg_1", 1_700_000_001, b"{}"));
    }

    /// The derivation as docs/operations.md states it, computed with
    /// Python's `hmac`:
    /// `hmac.new(base64.b64decode(M), b"skyport-callback-secret-v1\0" + b"alice", "sha256")`.
    #[test]
    fn a_principal_secret_is_the_hmac_of_its_name_under_each_master() {
        let secrets = masters(&[MASTER, OLDER]).principal_secrets("alice");
        let texts: Vec<&str> = secrets.iter().map(|s| s.expose_secret()).collect();
        assert_eq!(
            texts,
            [
                "whsec_wnLR1IKpBKd6K2mUCh602gCxdkuYGRLbBWssmXz+OTw=",
                "whsec_8z/gw8gAqCIXqYu5Hbh/Mq1BjNf3bJ8Es1DtflVhtFE=",
            ]
        );
    }

    #[test]
    fn a_principal_signs_with_its_derived_secrets_and_no_one_elses() {
        let both = masters(&[MASTER, OLDER]);
        let body = br#"{"type":"delivery.scheduled"}"#;
        let sign = |signer: Signer| signer.sign("msg_a", 1_700_000_000, body);
        let signature = sign(both.signer(Some("alice")));
        let alice: Vec<String> = both
            .principal_secrets("alice")
            .iter()
            .map(|secret| sign(masters(&[secret.expose_secret()]).signer(None)))
            .collect();
        assert_eq!(signature, alice.join(" "), "one signature per master");
        for master in [MASTER, OLDER] {
            let by_master = sign(masters(&[master]).signer(None));
            assert!(
                !signature.contains(&by_master),
                "a master signs alice's callbacks"
            );
        }
        let bob = sign(both.signer(Some("bob")));
        assert!(
            signature
                .split(' ')
                .all(|alices| !bob.split(' ').any(|bobs| bobs == alices)),
            "alice and bob share a signature"
        );
    }

    /// `msg_` + base64url of the first 16 bytes of
    /// `hmac.new(M, b"skyport-webhook-id-v1\0d-1\0scheduled\0" + b"0", "sha256")`, from Python.
    #[test]
    fn the_webhook_id_is_the_hmac_of_the_message_under_the_first_master() {
        let both = masters(&[MASTER, OLDER]);
        let id = both.webhook_id("d-1", "scheduled", 0);
        assert_eq!(id, "msg_L25nPE0g1QKApOoLgD0LNA");
        assert!(!id.contains("d-1"));
        assert_eq!(id, both.webhook_id("d-1", "scheduled", 0), "stable");
        let others = [
            both.webhook_id("d-1", "cancelled", 0),
            both.webhook_id("d-2", "scheduled", 0),
            both.webhook_id("d-1", "scheduled", 1),
            masters(&[OLDER]).webhook_id("d-1", "scheduled", 0),
        ];
        for other in &others {
            assert_ne!(&id, other);
        }
    }

    #[test]
    fn no_master_is_no_secrets() {
        assert!(MasterSecrets::new(&[]).is_none());
    }
}
