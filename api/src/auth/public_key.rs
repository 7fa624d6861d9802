//! `gateway.auth.jwt.public_key_pem`, parsed: an RSA (RS256) or P-256 EC
//! (ES256) public key, its kind picking the algorithm tokens are checked with.

use jsonwebtoken::{Algorithm, DecodingKey};

/// A public key that verifies bearer tokens, parsed from PEM; its kind picks
/// the algorithm.
#[derive(Debug, Clone)]
pub(super) struct PublicKeyPem {
    key: DecodingKey,
    algorithm: Algorithm,
}

/// A `public_key_pem` that cannot verify tokens.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum PublicKeyError {
    #[error(
        "must be a public key in PEM (-----BEGIN PUBLIC KEY-----), not a private key or a certificate"
    )]
    NotPublic,
    #[error("is not a readable RSA or EC public key in PEM")]
    Malformed,
    #[error("is an EC key on a curve other than P-256 (only ES256 is supported)")]
    UnsupportedCurve,
}

impl PublicKeyPem {
    /// Reads an RSA (RS256) or P-256 EC (ES256) public key.
    ///
    /// # Errors
    /// [`PublicKeyError`] when `pem` is not one.
    pub(super) fn parse(pem: &str) -> Result<Self, PublicKeyError> {
        let label = pem
            .trim_start()
            .strip_prefix("-----BEGIN ")
            .and_then(|rest| rest.split_once("-----"))
            .map(|(label, _)| label);
        match label {
            Some("PUBLIC KEY" | "RSA PUBLIC KEY") => {}
            Some(_) => return Err(PublicKeyError::NotPublic),
            None => return Err(PublicKeyError::Malformed),
        }
        if let Ok(key) = DecodingKey::from_rsa_pem(pem.as_bytes()) {
            return Ok(Self {
                key,
                algorithm: Algorithm::RS256,
            });
        }
        let key =
            DecodingKey::from_ec_pem(pem.as_bytes()).map_err(|_| PublicKeyError::Malformed)?;
        // An uncompressed SEC1 point on P-256: 0x04, then 32 bytes each of x and y.
        if key.as_bytes().len() != 65 {
            return Err(PublicKeyError::UnsupportedCurve);
        }
        Ok(Self {
            key,
            algorithm: Algorithm::ES256,
        })
    }

    pub(super) fn key(&self) -> &DecodingKey {
        &self.key
    }

    pub(super) fn algorithm(&self) -> Algorithm {
        self.algorithm
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RS256_PUBLIC: &str = include_str!("../../../tests/fixtures/jwt/rs256-public.pem");
    const ES256_PUBLIC: &str = include_str!("../../../tests/fixtures/jwt/es256-public.pem");
    const ES256_PRIVATE: &str = include_str!("../../../tests/fixtures/jwt/es256-private.pem");
    const P384_PUBLIC: &str = "-----BEGIN PUBLIC KEY-----
MHYwEAYHKoZIzj0CAQYFK4EEACIDYgAEIO2NbBMfgyRmtKFYk70HzBVnVNxjHLHq
DFpWCLWPNuhfU7GfqqBfYXMjE5voDlIR8UQaj+Li8LvhNHsjfhws31GbYOxOb/Fc
3MFv7FvMXW4LonhiY4fp8YHpKXtY5PZk
-----END PUBLIC KEY-----
";

    #[test]
    fn a_public_key_picks_its_algorithm() {
        let rs256 = PublicKeyPem::parse(RS256_PUBLIC).expect("RSA");
        assert_eq!(rs256.algorithm(), Algorithm::RS256);
        let es256 = PublicKeyPem::parse(ES256_PUBLIC).expect("P-256");
        assert_eq!(es256.algorithm(), Algorithm::ES256);
        for (pem, error) in [
            (ES256_PRIVATE, PublicKeyError::NotPublic),
            (P384_PUBLIC, PublicKeyError::UnsupportedCurve),
            ("", PublicKeyError::Malformed),
            (
                "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n",
                PublicKeyError::Malformed,
            ),
        ] {
            assert_eq!(PublicKeyPem::parse(pem).expect_err(pem), error);
        }
    }
}
