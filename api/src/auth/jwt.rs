//! Bearer tokens: the signature (by a configured key or one from the issuer's
//! JWKS), the issuer, the audience, the validity period, the scopes they grant
//! and the claim that names their client for quotas.
//!
//! A token is checked with the algorithm of the key it names, never the one
//! its header claims alone, so an HS256 token cannot pass as signed by an RSA
//! public key.

use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use secrecy::ExposeSecret;
use serde::Deserialize;
use serde_json::{Map, Value};
use skyport_runtime::config::{ConfigError, JwtSettings};

use super::AuthError;
use super::jwks::{Jwks, VerifyingKey};
use super::public_key::PublicKeyPem;

/// Checks bearer tokens against one issuer's keys.
#[derive(Debug)]
pub(super) struct TokenVerifier {
    keys: Keys,
    issuer: String,
    audience: String,
    leeway_s: u64,
    /// The claim that names the client (`gateway.quotas.client_claim`), when
    /// it is not `sub`.
    client_claim: Option<String>,
}

#[derive(Debug)]
enum Keys {
    /// `hs256_secret` or `public_key_pem`.
    Fixed(VerifyingKey),
    /// `jwks_url`: the token's `kid` picks the key.
    Jwks(Jwks),
}

/// What a valid token says about its bearer.
#[derive(Debug)]
pub(super) struct Claims {
    /// The token's `sub`.
    pub(super) subject: String,
    /// The value of the client claim, when one other than `sub` is configured.
    pub(super) client: Option<String>,
    scp: String,
    roles: Vec<String>,
}

impl Claims {
    /// Whether the token grants `scope`, as a delegated scope (`scp`, space
    /// separated) or as an app role (`roles`).
    pub(super) fn grants(&self, scope: &str) -> bool {
        self.scp.split_whitespace().any(|s| s == scope) || self.roles.iter().any(|r| r == scope)
    }
}

#[derive(Deserialize)]
struct TokenClaims {
    /// Optional here so that a token without one is refused by name (a
    /// required claim), not as malformed.
    sub: Option<String>,
    #[serde(default)]
    scp: String,
    #[serde(default)]
    roles: Vec<String>,
    /// Every other claim, where a configured client claim is found.
    #[serde(flatten)]
    others: Map<String, Value>,
}

/// Why a bearer token was refused; the text is what the client is told.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum TokenError {
    #[error("the bearer token is not a well-formed JWT")]
    Malformed,
    #[error("the bearer token's `{0}` claim is malformed")]
    MalformedClaim(String),
    #[error("the bearer token has no `{0}` claim")]
    MissingClaim(String),
    #[error(
        "the bearer token has no `{0}` claim with a string value, which names its client for quotas"
    )]
    ClientClaim(String),
    #[error("the bearer token names no signing key (kid)")]
    NoKeyId,
    #[error("the bearer token is signed with a key the issuer does not publish")]
    UnknownKey,
    #[error("the bearer token is signed with an algorithm that is not accepted")]
    Algorithm,
    #[error("the bearer token's signature does not verify")]
    Signature,
    #[error("the bearer token has expired")]
    Expired,
    #[error("the bearer token is not valid yet (nbf)")]
    NotYetValid,
    #[error("the bearer token's issuer (iss) is not the accepted one")]
    Issuer,
    #[error("the bearer token's audience (aud) is not this API")]
    Audience,
    #[error("the bearer token cannot be verified")]
    Unverifiable,
}

impl From<jsonwebtoken::errors::Error> for TokenError {
    fn from(e: jsonwebtoken::errors::Error) -> Self {
        match e.into_kind() {
            ErrorKind::InvalidToken
            | ErrorKind::Base64(_)
            | ErrorKind::Json(_)
            | ErrorKind::Utf8(_) => Self::Malformed,
            ErrorKind::InvalidClaimFormat(claim) => Self::MalformedClaim(claim),
            ErrorKind::MissingRequiredClaim(claim) => Self::MissingClaim(claim),
            ErrorKind::InvalidSignature => Self::Signature,
            ErrorKind::InvalidAlgorithm | ErrorKind::MissingAlgorithm => Self::Algorithm,
            ErrorKind::ExpiredSignature => Self::Expired,
            ErrorKind::ImmatureSignature => Self::NotYetValid,
            ErrorKind::InvalidIssuer => Self::Issuer,
            ErrorKind::InvalidAudience => Self::Audience,
            // A key that cannot be used (ours, not the client's) or a kind added later.
            _ => Self::Unverifiable,
        }
    }
}

impl TokenVerifier {
    /// The verifier `settings` describe, naming clients by `client_claim`
    /// (`None`: by `sub`); with a JWKS URL, its keys are fetched now.
    ///
    /// # Errors
    /// [`AuthError`] when the JWKS cannot be fetched or holds no usable key,
    /// or when no source of keys is set.
    pub(super) async fn from_settings(
        settings: &JwtSettings,
        client_claim: Option<&str>,
    ) -> Result<Self, AuthError> {
        let keys = if let Some(secret) = &settings.hs256_secret {
            Keys::Fixed(VerifyingKey {
                key: DecodingKey::from_secret(secret.expose_secret().as_bytes()),
                algorithm: Algorithm::HS256,
            })
        } else if let Some(pem) = &settings.public_key_pem {
            let pem = PublicKeyPem::parse(pem)
                .map_err(|e| ConfigError::new("gateway.auth.jwt.public_key_pem", e.to_string()))?;
            Keys::Fixed(VerifyingKey {
                key: pem.key().clone(),
                algorithm: pem.algorithm(),
            })
        } else if let Some(url) = &settings.jwks_url {
            let jwks = Jwks::fetch(url.clone(), settings.jwks_refresh_s.duration())
                .await
                .map_err(|source| AuthError::Jwks {
                    url: url.clone(),
                    source,
                })?;
            Keys::Jwks(jwks)
        } else {
            return Err(AuthError::NoKeySource);
        };
        Ok(Self {
            keys,
            issuer: settings.issuer.clone(),
            audience: settings.audience.clone(),
            leeway_s: settings.leeway_s.count(),
            client_claim: client_claim
                .filter(|claim| *claim != "sub")
                .map(str::to_owned),
        })
    }

    /// The claims of `token` when it is valid.
    ///
    /// # Errors
    /// [`TokenError`] says what is wrong with it.
    pub(super) async fn verify(&self, token: &str) -> Result<Claims, TokenError> {
        let header = jsonwebtoken::decode_header(token)?;
        let key = match &self.keys {
            Keys::Fixed(key) => key.clone(),
            Keys::Jwks(jwks) => {
                let kid = header.kid.ok_or(TokenError::NoKeyId)?;
                jwks.key(&kid).await.ok_or(TokenError::UnknownKey)?
            }
        };
        let mut validation = Validation::new(key.algorithm);
        validation.set_issuer(&[&self.issuer]);
        validation.set_audience(&[&self.audience]);
        validation.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        validation.leeway = self.leeway_s;
        validation.validate_nbf = true;
        let mut claims = jsonwebtoken::decode::<TokenClaims>(token, &key.key, &validation)?.claims;
        let client = match &self.client_claim {
            Some(name) => match claims.others.remove(name) {
                Some(Value::String(client)) if !client.is_empty() => Some(client),
                _ => return Err(TokenError::ClientClaim(name.clone())),
            },
            None => None,
        };
        Ok(Claims {
            subject: claims
                .sub
                .ok_or_else(|| TokenError::MissingClaim("sub".into()))?,
            client,
            scp: claims.scp,
            roles: claims.roles,
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use jsonwebtoken::{EncodingKey, Header, encode, get_current_timestamp};
    use secrecy::SecretString;
    use serde_json::{Value, json};
    use skyport_runtime::config::Seconds;

    use super::*;

    const SECRET: &str = "an HS256 secret of at least 32 characters";
    const RS256_PRIVATE: &str = include_str!("../../../tests/fixtures/jwt/rs256-private.pem");
    const RS256_PUBLIC: &str = include_str!("../../../tests/fixtures/jwt/rs256-public.pem");
    const ES256_PRIVATE: &str = include_str!("../../../tests/fixtures/jwt/es256-private.pem");
    const ES256_PUBLIC: &str = include_str!("../../../tests/fixtures/jwt/es256-public.pem");

    fn settings() -> JwtSettings {
        JwtSettings {
            issuer: "https://issuer.example/".into(),
            audience: "api://skyport".into(),
            leeway_s: Seconds::new(0),
            ..JwtSettings::default()
        }
    }

    async fn hs256_verifier() -> TokenVerifier {
        naming_clients_by(None).await
    }

    /// An HS256 verifier that names clients by `client_claim`.
    async fn naming_clients_by(client_claim: Option<&str>) -> TokenVerifier {
        TokenVerifier::from_settings(
            &JwtSettings {
                hs256_secret: Some(SecretString::from(SECRET)),
                ..settings()
            },
            client_claim,
        )
        .await
        .unwrap()
    }

    async fn pem_verifier(pem: &str) -> TokenVerifier {
        TokenVerifier::from_settings(
            &JwtSettings {
                public_key_pem: Some(pem.to_owned()),
                ..settings()
            },
            None,
        )
        .await
        .unwrap()
    }

    /// Claims that pass, with `changes` merged in (a null removes a claim).
    fn claims(changes: Value) -> Value {
        let mut claims = json!({
            "iss": "https://issuer.example/",
            "aud": "api://skyport",
            "sub": "client-1",
            "exp": get_current_timestamp() + 600,
            "scp": "deliveries.read deliveries.write",
        });
        for (name, value) in changes.as_object().unwrap() {
            if value.is_null() {
                claims.as_object_mut().unwrap().remove(name);
            } else {
                claims[name] = value.clone();
            }
        }
        claims
    }

    fn hs256(claims: &Value, secret: &str) -> String {
        encode(
            &Header::new(Algorithm::HS256),
            claims,
            &EncodingKey::from_secret(secret.as_bytes()),
        )
        .unwrap()
    }

    #[tokio::test]
    async fn a_valid_token_names_its_subject_and_scopes() {
        let verifier = hs256_verifier().await;
        let valid = verifier
            .verify(&hs256(&claims(json!({})), SECRET))
            .await
            .unwrap();
        assert_eq!(valid.subject, "client-1");
        assert_eq!(valid.client, None, "the client is the subject");
        assert!(valid.grants("deliveries.read") && valid.grants("deliveries.write"));
        assert!(!valid.grants("deliveries"));
    }

    #[tokio::test]
    async fn a_configured_claim_names_the_client_whatever_the_subject() {
        let verifier = naming_clients_by(Some("azp")).await;
        for app in ["mobile-app", "partner-portal"] {
            let token = hs256(&claims(json!({"azp": app})), SECRET);
            let valid = verifier.verify(&token).await.unwrap();
            assert_eq!(valid.subject, "client-1");
            assert_eq!(valid.client.as_deref(), Some(app));
        }
        // A custom claim as well as a registered one.
        let custom = naming_clients_by(Some("client_id")).await;
        let token = hs256(&claims(json!({"client_id": "fleet-7"})), SECRET);
        let valid = custom.verify(&token).await.unwrap();
        assert_eq!(valid.client.as_deref(), Some("fleet-7"));
        // `sub` named outright is the subject, as when unset.
        let by_sub = naming_clients_by(Some("sub")).await;
        let token = hs256(&claims(json!({})), SECRET);
        assert_eq!(by_sub.verify(&token).await.unwrap().client, None);
    }

    #[tokio::test]
    async fn a_token_without_the_client_claim_as_a_string_is_refused_by_its_name() {
        let verifier = naming_clients_by(Some("azp")).await;
        for azp in [
            Value::Null,
            json!(""),
            json!(42),
            json!(["mobile-app"]),
            json!({"id": "mobile-app"}),
            json!(true),
        ] {
            let token = hs256(&claims(json!({"azp": azp})), SECRET);
            let error = verifier.verify(&token).await.unwrap_err();
            assert_eq!(error, TokenError::ClientClaim("azp".into()), "{azp}");
            assert_eq!(
                error.to_string(),
                "the bearer token has no `azp` claim with a string value, which names its client for quotas"
            );
        }
        // A bad token is still refused for what is wrong with it first.
        let expired = hs256(
            &claims(json!({"exp": get_current_timestamp() - 10})),
            SECRET,
        );
        assert_eq!(
            verifier.verify(&expired).await.unwrap_err(),
            TokenError::Expired
        );
    }

    #[tokio::test]
    async fn scopes_come_from_scp_or_app_roles() {
        let verifier = hs256_verifier().await;
        let token = hs256(
            &claims(json!({"scp": null, "roles": ["deliveries.read"]})),
            SECRET,
        );
        let by_role = verifier.verify(&token).await.unwrap();
        assert!(by_role.grants("deliveries.read"));
        assert!(!by_role.grants("deliveries.write"));
        let token = hs256(&claims(json!({"scp": null})), SECRET);
        let none = verifier.verify(&token).await.unwrap();
        assert!(!none.grants("deliveries.read"));
    }

    #[tokio::test]
    async fn each_bad_token_says_what_is_wrong() {
        let verifier = hs256_verifier().await;
        let now = get_current_timestamp();
        for (token, error) in [
            (
                hs256(&claims(json!({"exp": now - 10})), SECRET),
                TokenError::Expired,
            ),
            (
                hs256(&claims(json!({"nbf": now + 600})), SECRET),
                TokenError::NotYetValid,
            ),
            (
                hs256(&claims(json!({"iss": "https://other.example/"})), SECRET),
                TokenError::Issuer,
            ),
            (
                hs256(&claims(json!({"aud": "api://other"})), SECRET),
                TokenError::Audience,
            ),
            (
                hs256(&claims(json!({"sub": null})), SECRET),
                TokenError::MissingClaim("sub".into()),
            ),
            (
                hs256(&claims(json!({"exp": null})), SECRET),
                TokenError::MissingClaim("exp".into()),
            ),
            (
                hs256(&claims(json!({})), "another secret of at least 32 chars"),
                TokenError::Signature,
            ),
            ("not.a.token".to_owned(), TokenError::Malformed),
            ("garbage".to_owned(), TokenError::Malformed),
        ] {
            assert_eq!(verifier.verify(&token).await.unwrap_err(), error, "{token}");
        }
    }

    #[tokio::test]
    async fn the_leeway_forgives_a_recent_expiry() {
        let verifier = TokenVerifier::from_settings(
            &JwtSettings {
                hs256_secret: Some(SecretString::from(SECRET)),
                leeway_s: Seconds::new(60),
                ..settings()
            },
            None,
        )
        .await
        .unwrap();
        let expired = |seconds_ago| {
            hs256(
                &claims(json!({"exp": get_current_timestamp() - seconds_ago})),
                SECRET,
            )
        };
        assert!(verifier.verify(&expired(30)).await.is_ok());
        assert_eq!(
            verifier.verify(&expired(120)).await.unwrap_err(),
            TokenError::Expired
        );
    }

    #[tokio::test]
    async fn rs256_and_es256_tokens_verify_with_their_public_key() {
        for (private, public, algorithm) in [
            (
                EncodingKey::from_rsa_pem(RS256_PRIVATE.as_bytes()).unwrap(),
                RS256_PUBLIC,
                Algorithm::RS256,
            ),
            (
                EncodingKey::from_ec_pem(ES256_PRIVATE.as_bytes()).unwrap(),
                ES256_PUBLIC,
                Algorithm::ES256,
            ),
        ] {
            let verifier = pem_verifier(public).await;
            let token = encode(&Header::new(algorithm), &claims(json!({})), &private).unwrap();
            let valid = verifier.verify(&token).await.unwrap();
            assert_eq!(valid.subject, "client-1", "{algorithm:?}");
            let mut forged = token.clone();
            forged.truncate(token.len() - 4);
            forged.push_str("AAAA");
            assert_eq!(
                verifier.verify(&forged).await.unwrap_err(),
                TokenError::Signature,
                "{algorithm:?}"
            );
        }
    }

    #[tokio::test]
    async fn a_token_signed_with_another_algorithm_is_refused() {
        let rsa = pem_verifier(RS256_PUBLIC).await;
        // The classic confusion: HMAC keyed with the RSA public key.
        let token = hs256(&claims(json!({})), RS256_PUBLIC);
        assert_eq!(rsa.verify(&token).await.unwrap_err(), TokenError::Algorithm);
        let es256 = encode(
            &Header::new(Algorithm::ES256),
            &claims(json!({})),
            &EncodingKey::from_ec_pem(ES256_PRIVATE.as_bytes()).unwrap(),
        )
        .unwrap();
        assert_eq!(rsa.verify(&es256).await.unwrap_err(), TokenError::Algorithm);
    }
}
