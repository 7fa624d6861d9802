//! The issuer's signing keys, from its JWKS URL: fetched at start (a failure
//! stops the start), again when older than `jwks_refresh_s`, and when a token
//! names a key id not among them — but never twice within a minute, so tokens
//! with made-up key ids cannot make the gateway hammer the issuer. A failed
//! fetch keeps the keys it had.
//!
//! Fetches happen in the request that finds them due (no background task);
//! the lock is never held across the fetch, and requests that arrive meanwhile
//! use the keys already held.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, KeyAlgorithm, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey};
use reqwest::Url;
use serde::Deserialize;
use tokio::time::Instant;

/// The shortest time between two fetches, whatever asks for them.
const MIN_REFETCH: Duration = Duration::from_secs(60);
/// How long one fetch may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);

/// A key that verifies tokens signed with `algorithm`.
#[derive(Debug, Clone)]
pub(super) struct VerifyingKey {
    pub(super) key: DecodingKey,
    pub(super) algorithm: Algorithm,
}

/// The JWKS could not be fetched, or held no key this gateway can use.
#[derive(Debug, thiserror::Error)]
pub enum JwksError {
    #[error("cannot create an HTTP client")]
    Client(#[source] reqwest::Error),
    #[error("the request failed")]
    Request(#[source] reqwest::Error),
    #[error("the answer is not a JWKS document")]
    Malformed(#[source] serde_json::Error),
    #[error("it holds no RS256 or ES256 signing key with a key id (kid)")]
    NoKeys,
}

/// The signing keys of one issuer, by key id.
#[derive(Debug)]
pub(super) struct Jwks {
    url: Url,
    http: reqwest::Client,
    refresh: Duration,
    cache: Mutex<Cache>,
}

#[derive(Debug)]
struct Cache {
    keys: Arc<HashMap<String, VerifyingKey>>,
    fetched_at: Instant,
    attempted_at: Instant,
}

impl Cache {
    /// Whether to fetch again at `now`: the keys are older than `refresh`, or
    /// lack the key a token names, and the last attempt was a minute ago or more.
    fn due(&self, now: Instant, refresh: Duration, kid_known: bool) -> bool {
        now.duration_since(self.attempted_at) >= MIN_REFETCH
            && (!kid_known || now.duration_since(self.fetched_at) >= refresh)
    }
}

impl Jwks {
    /// Fetches the keys at `url` for the first time.
    ///
    /// # Errors
    /// [`JwksError`] when they cannot be fetched or none is usable.
    pub(super) async fn fetch(url: Url, refresh: Duration) -> Result<Self, JwksError> {
        let http = reqwest::Client::builder()
            .timeout(FETCH_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(JwksError::Client)?;
        let keys = download(&http, &url).await?;
        tracing::info!(url = %url, keys = keys.len(), "Fetched the token issuer's signing keys.");
        let now = Instant::now();
        Ok(Self {
            url,
            http,
            refresh,
            cache: Mutex::new(Cache {
                keys: Arc::new(keys),
                fetched_at: now,
                attempted_at: now,
            }),
        })
    }

    /// The key named `kid`, fetching the keys again first when that is due.
    pub(super) async fn key(&self, kid: &str) -> Option<VerifyingKey> {
        let now = Instant::now();
        let known = {
            let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
            let key = cache.keys.get(kid).cloned();
            if !cache.due(now, self.refresh, key.is_some()) {
                return key;
            }
            // Claimed before fetching, so concurrent requests do not fetch too.
            cache.attempted_at = now;
            key
        };
        match download(&self.http, &self.url).await {
            Ok(keys) => {
                tracing::info!(url = %self.url, keys = keys.len(), "Fetched the token issuer's signing keys again.");
                let keys = Arc::new(keys);
                let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
                cache.keys = Arc::clone(&keys);
                cache.fetched_at = now;
                drop(cache);
                keys.get(kid).cloned()
            }
            Err(e) => {
                let e = anyhow::Error::new(e);
                tracing::warn!(url = %self.url, error = format!("{e:#}"), "Cannot fetch the token issuer's signing keys; keeping the ones held.");
                known
            }
        }
    }
}

async fn download(
    http: &reqwest::Client,
    url: &Url,
) -> Result<HashMap<String, VerifyingKey>, JwksError> {
    let body = http
        .get(url.clone())
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .map_err(JwksError::Request)?
        .bytes()
        .await
        .map_err(JwksError::Request)?;
    let keys = usable_keys(&body)?;
    if keys.is_empty() {
        return Err(JwksError::NoKeys);
    }
    Ok(keys)
}

/// The keys of a JWKS document that can verify tokens here; the rest (other
/// algorithms, encryption keys, keys without an id) are skipped one by one.
fn usable_keys(body: &[u8]) -> Result<HashMap<String, VerifyingKey>, JwksError> {
    #[derive(Deserialize)]
    struct Document {
        keys: Vec<serde_json::Value>,
    }
    let document: Document = serde_json::from_slice(body).map_err(JwksError::Malformed)?;
    Ok(document
        .keys
        .into_iter()
        .filter_map(|key| serde_json::from_value::<Jwk>(key).ok())
        .filter_map(|jwk| {
            let kid = jwk.common.key_id.clone()?;
            if matches!(
                jwk.common.public_key_use,
                Some(PublicKeyUse::Encryption | PublicKeyUse::Other(_))
            ) {
                return None;
            }
            let algorithm = match (&jwk.common.key_algorithm, &jwk.algorithm) {
                (Some(KeyAlgorithm::RS256) | None, AlgorithmParameters::RSA(_)) => Algorithm::RS256,
                (Some(KeyAlgorithm::ES256) | None, AlgorithmParameters::EllipticCurve(ec))
                    if ec.curve == EllipticCurve::P256 =>
                {
                    Algorithm::ES256
                }
                _ => return None,
            };
            let key = DecodingKey::from_jwk(&jwk).ok()?;
            Some((kid, VerifyingKey { key, algorithm }))
        })
        .collect())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn cache_fetched_at(at: Instant) -> Cache {
        Cache {
            keys: Arc::new(HashMap::new()),
            fetched_at: at,
            attempted_at: at,
        }
    }

    const HOUR: Duration = Duration::from_secs(3_600);

    #[test]
    fn keys_are_fetched_again_once_older_than_the_refresh_interval() {
        let start = Instant::now();
        let cache = cache_fetched_at(start);
        assert!(!cache.due(start + HOUR - Duration::from_secs(1), HOUR, true));
        assert!(cache.due(start + HOUR, HOUR, true));
    }

    #[test]
    fn an_unknown_key_id_fetches_again_at_most_once_a_minute() {
        let start = Instant::now();
        let mut cache = cache_fetched_at(start);
        assert!(!cache.due(start + Duration::from_secs(59), HOUR, false));
        assert!(cache.due(start + MIN_REFETCH, HOUR, false));
        cache.attempted_at = start + MIN_REFETCH;
        assert!(!cache.due(start + Duration::from_secs(90), HOUR, false));
    }

    #[test]
    fn a_failed_fetch_is_retried_a_minute_later_not_at_once() {
        let start = Instant::now();
        let mut cache = cache_fetched_at(start);
        // The hourly refresh was attempted and failed: the keys stay old.
        cache.attempted_at = start + HOUR;
        assert!(!cache.due(start + HOUR + Duration::from_secs(30), HOUR, true));
        assert!(cache.due(start + HOUR + MIN_REFETCH, HOUR, true));
    }

    #[test]
    fn only_signing_keys_with_an_id_and_a_supported_algorithm_are_kept() {
        let rsa = serde_json::json!({"kty": "RSA", "n": "AQAB", "e": "AQAB"});
        let with = |extra: serde_json::Value| {
            let mut key = rsa.clone();
            key.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            key
        };
        let document = serde_json::json!({"keys": [
            with(serde_json::json!({"kid": "plain"})),
            with(serde_json::json!({"kid": "rs256", "alg": "RS256", "use": "sig", "x5t": "ignored"})),
            with(serde_json::json!({"kid": "ps256", "alg": "PS256"})),
            with(serde_json::json!({"kid": "enc", "use": "enc"})),
            rsa.clone(),
            {"kty": "EC", "crv": "P-384", "kid": "p384", "x": "AQAB", "y": "AQAB"},
            {"kty": "EC", "crv": "P-256", "kid": "p256", "x": "AQAB", "y": "AQAB"},
            {"kty": "oct", "kid": "hmac", "k": "c2VjcmV0"},
            {"kty": "made-up", "kid": "odd"},
        ]});
        let keys = usable_keys(document.to_string().as_bytes()).unwrap();
        let mut found: Vec<(&str, Algorithm)> = keys
            .iter()
            .map(|(kid, key)| (kid.as_str(), key.algorithm))
            .collect();
        found.sort_by_key(|(kid, _)| *kid);
        assert_eq!(
            found,
            [
                ("p256", Algorithm::ES256),
                ("plain", Algorithm::RS256),
                ("rs256", Algorithm::RS256)
            ]
        );
    }

    #[test]
    fn a_document_that_is_not_a_jwks_is_refused() {
        assert!(matches!(
            usable_keys(b"<html>sign in</html>"),
            Err(JwksError::Malformed(_))
        ));
    }
}
