//! Authentication of the `/api` routes: an API key in `X-API-Key` or a JWT in
//! `Authorization: Bearer`, and the scope the request's method needs (`GET`
//! reads; `POST` and `DELETE` write).
//!
//! Missing or invalid credentials are a 401 with `WWW-Authenticate`; valid ones
//! without the scope are a 403. A request that passes carries its [`Principal`]
//! in its extensions. API keys are looked up by their SHA-256 digest, so no
//! comparison ever runs over the key itself.

mod jwks;
mod jwt;
mod public_key;

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, header};
use axum::middleware::Next;
use axum::response::Response;
use reqwest::Url;
use secrecy::ExposeSecret;
use sha2::{Digest, Sha256};
use skyport_runtime::config::{ConfigError, Scope, Settings};

use crate::error::ApiError;
pub use jwks::JwksError;
use jwt::TokenVerifier;

/// The header API keys are sent in.
pub const API_KEY_HEADER: &str = "x-api-key";

/// Who made a request: the name of its API key, or `jwt:` and its token's
/// `sub` (a key's name cannot hold a `:`, so the two never meet).
///
/// Present in the request's extensions only when authentication is on; a
/// handler takes it as `Option<Extension<Principal>>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Principal {
    pub name: String,
    /// Whether the credentials also grant the admin scope: a listing then
    /// holds every client's deliveries.
    pub admin: bool,
    /// The client quotas charge when it is not `name`: `jwt:` and the value
    /// of the token's `gateway.quotas.client_claim`.
    pub client: Option<String>,
    /// A bearer token's subject as deliveries made before principals were
    /// namespaced recorded it, unless an API key has that name: such a
    /// delivery is still this principal's.
    pub legacy: Option<String>,
}

/// What a bearer token's principal starts with.
pub const TOKEN_PREFIX: &str = "jwt:";

impl Principal {
    /// The client quotas charge for this principal's requests.
    pub fn client(&self) -> &str {
        self.client.as_deref().unwrap_or(&self.name)
    }

    /// Whether a delivery that records `owner` as its principal is this
    /// principal's to read and change: its own, or any with the admin scope.
    pub fn may_touch(&self, owner: Option<&str>) -> bool {
        self.admin
            || owner
                .is_some_and(|owner| owner == self.name || self.legacy.as_deref() == Some(owner))
    }
}

/// Authentication could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("cannot fetch the token signing keys at gateway.auth.jwt.jwks_url = {url}")]
    Jwks {
        url: Url,
        #[source]
        source: JwksError,
    },
    #[error("gateway.auth.jwt: set one of hs256_secret, public_key_pem and jwks_url")]
    NoKeySource,
    /// A setting the gateway cannot use (a public key that is not one).
    #[error("{0}")]
    Config(#[from] ConfigError),
}

/// The credentials the gateway accepts; cheap to clone.
#[derive(Debug, Clone)]
pub struct Auth(Arc<Credentials>);

#[derive(Debug)]
struct Credentials {
    /// By the SHA-256 digest of the key.
    api_keys: HashMap<[u8; 32], ApiKey>,
    /// The API keys' names, which a token's bare subject is never taken for.
    key_names: std::collections::HashSet<String>,
    tokens: Option<TokenVerifier>,
    read_scope: String,
    write_scope: String,
    admin_scope: String,
}

#[derive(Debug)]
struct ApiKey {
    name: String,
    scopes: Vec<Scope>,
}

impl Auth {
    /// The checks `settings` ask for, or `None` when authentication is off.
    /// With a JWKS URL, the issuer's keys are fetched now.
    ///
    /// # Errors
    /// [`AuthError`] when the JWKS cannot be fetched or holds no usable key.
    pub async fn from_settings(settings: &Settings) -> Result<Option<Self>, AuthError> {
        if !settings.auth_enabled() {
            tracing::info!(
                "Authentication is off: the /api routes take requests without credentials."
            );
            return Ok(None);
        }
        let auth = &settings.gateway.auth;
        let tokens = match &auth.jwt {
            Some(jwt) => Some(
                TokenVerifier::from_settings(jwt, settings.gateway.quotas.client_claim.as_deref())
                    .await?,
            ),
            None => None,
        };
        let api_keys = auth
            .api_keys
            .iter()
            .map(|(name, key)| {
                let entry = ApiKey {
                    name: name.clone(),
                    scopes: key.scopes.clone(),
                };
                (digest(key.key.expose_secret().as_bytes()), entry)
            })
            .collect::<HashMap<_, _>>();
        tracing::info!(
            api_keys = api_keys.len(),
            bearer_tokens = tokens.is_some(),
            "Requests to the /api routes need credentials."
        );
        Ok(Some(Self(Arc::new(Credentials {
            key_names: auth.api_keys.keys().cloned().collect(),
            api_keys,
            tokens,
            read_scope: auth.read_scope.clone(),
            write_scope: auth.write_scope.clone(),
            admin_scope: auth.admin_scope.clone(),
        }))))
    }

    /// Who sent `headers`, when they carry valid credentials with `scope`.
    async fn authenticate(&self, headers: &HeaderMap, scope: Scope) -> Result<Principal, ApiError> {
        let api_key = headers.get(API_KEY_HEADER);
        let authorization = headers.get(header::AUTHORIZATION);
        match (api_key, authorization) {
            (Some(key), None) => self.check_api_key(key, scope),
            (None, Some(authorization)) => self.check_bearer(authorization, scope).await,
            (Some(_), Some(_)) => Err(self
                .unauthorized("send one credential: either X-API-Key or Authorization, not both")),
            (None, None) => Err(self.unauthorized(format!(
                "this request needs credentials: {}",
                self.accepted()
            ))),
        }
    }

    fn check_api_key(&self, key: &HeaderValue, scope: Scope) -> Result<Principal, ApiError> {
        if self.0.api_keys.is_empty() {
            return Err(self.unauthorized(format!(
                "API keys are not accepted here; send {}",
                self.accepted()
            )));
        }
        let Some(key) = self.0.api_keys.get(&digest(key.as_bytes())) else {
            return Err(self.unauthorized("the API key is not known"));
        };
        if !key.scopes.contains(&scope) {
            return Err(ApiError::Forbidden(format!(
                "the API key {} does not have the {scope} scope",
                key.name
            )));
        }
        Ok(Principal {
            name: key.name.clone(),
            admin: key.scopes.contains(&Scope::Admin),
            client: None,
            legacy: None,
        })
    }

    async fn check_bearer(
        &self,
        authorization: &HeaderValue,
        scope: Scope,
    ) -> Result<Principal, ApiError> {
        let Some(tokens) = &self.0.tokens else {
            return Err(self.unauthorized(format!(
                "bearer tokens are not accepted here; send {}",
                self.accepted()
            )));
        };
        let token = authorization
            .to_str()
            .ok()
            .and_then(|value| value.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token.trim())
            .filter(|token| !token.is_empty())
            .ok_or_else(|| {
                self.unauthorized("the Authorization header must be `Bearer <token>`")
            })?;
        let claims = tokens
            .verify(token)
            .await
            .map_err(|e| self.unauthorized(e.to_string()))?;
        let needed = match scope {
            Scope::Read => &self.0.read_scope,
            Scope::Write => &self.0.write_scope,
            Scope::Admin => &self.0.admin_scope,
        };
        if !claims.grants(needed) {
            return Err(ApiError::Forbidden(format!(
                "the bearer token grants {needed} neither as a scope (scp) nor as an app role (roles)"
            )));
        }
        let admin = claims.grants(&self.0.admin_scope);
        let legacy = (!self.0.key_names.contains(&claims.subject)).then(|| claims.subject.clone());
        Ok(Principal {
            name: format!("{TOKEN_PREFIX}{}", claims.subject),
            admin,
            client: claims
                .client
                .map(|client| format!("{TOKEN_PREFIX}{client}")),
            legacy,
        })
    }

    /// The credentials accepted, for a 401's detail.
    fn accepted(&self) -> &'static str {
        match (self.0.api_keys.is_empty(), self.0.tokens.is_some()) {
            (false, true) => "an X-API-Key header or an Authorization: Bearer token",
            (true, true) => "an Authorization: Bearer token",
            (_, false) => "an X-API-Key header",
        }
    }

    fn unauthorized(&self, detail: impl Into<String>) -> ApiError {
        let challenge = match (self.0.api_keys.is_empty(), self.0.tokens.is_some()) {
            (false, true) => "Bearer realm=\"skyport\", ApiKey",
            (true, true) => "Bearer realm=\"skyport\"",
            (_, false) => "ApiKey",
        };
        ApiError::Unauthorized {
            detail: detail.into(),
            challenge,
        }
    }
}

fn digest(key: &[u8]) -> [u8; 32] {
    Sha256::digest(key).into()
}

/// The scope a request needs: anything under `/admin/` (redrive, callback
/// resend, the reports, which hold every client's documents) and the
/// dashboard's data (every client's figures) need the admin scope; else
/// `GET` reads and the other methods write.
fn scope_for(method: &Method, path: &str) -> Scope {
    if path.starts_with("/admin/") || path.starts_with("/dashboard/") {
        Scope::Admin
    } else if method == Method::GET || method == Method::HEAD {
        Scope::Read
    } else {
        Scope::Write
    }
}

/// Middleware (`axum::middleware::from_fn_with_state`): passes a request on
/// with its [`Principal`] when its credentials allow what it asks, and answers
/// 401 or 403 otherwise.
pub async fn require_credentials(
    State(auth): State<Auth>,
    mut request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let scope = scope_for(request.method(), request.uri().path());
    let principal = auth.authenticate(request.headers(), scope).await?;
    request.extensions_mut().insert(principal);
    Ok(next.run(request).await)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use axum::http::StatusCode;
    use axum::response::IntoResponse;
    use jsonwebtoken::{EncodingKey, Header, encode, get_current_timestamp};
    use secrecy::SecretString;
    use serde_json::json;
    use skyport_runtime::config::{ApiKeySettings, JwtSettings};

    use super::*;

    const WRITER: &str = "writer-key-0123456789abcdef0123456789";
    const READER: &str = "reader-key-0123456789abcdef0123456789";
    const SECRET: &str = "an HS256 secret of at least 32 characters";

    fn settings(api_keys: bool, jwt: bool) -> Settings {
        let mut settings = Settings::default();
        let auth = &mut settings.gateway.auth;
        auth.enabled = Some(true);
        if api_keys {
            for (name, key, scopes) in [
                ("portal", WRITER, Scope::all()),
                ("dashboard", READER, vec![Scope::Read]),
            ] {
                auth.api_keys.insert(
                    name.into(),
                    ApiKeySettings {
                        key: SecretString::from(key),
                        scopes,
                    },
                );
            }
        }
        if jwt {
            auth.jwt = Some(JwtSettings {
                issuer: "https://issuer.example/".into(),
                audience: "api://skyport".into(),
                hs256_secret: Some(SecretString::from(SECRET)),
                ..JwtSettings::default()
            });
        }
        settings
    }

    async fn auth(api_keys: bool, jwt: bool) -> Auth {
        Auth::from_settings(&settings(api_keys, jwt))
            .await
            .unwrap()
            .unwrap()
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(name, value)| {
                (
                    header::HeaderName::from_static(name),
                    HeaderValue::from_str(value).unwrap(),
                )
            })
            .collect()
    }

    fn token(scp: &str) -> String {
        let claims = json!({
            "iss": "https://issuer.example/",
            "aud": "api://skyport",
            "sub": "client-1",
            "exp": get_current_timestamp() + 600,
            "scp": scp,
        });
        let key = EncodingKey::from_secret(SECRET.as_bytes());
        encode(&Header::default(), &claims, &key).unwrap()
    }

    /// The status, `WWW-Authenticate` and detail of a refusal.
    fn refusal(error: ApiError) -> (StatusCode, Option<String>, String) {
        let detail = error.to_string();
        let response = error.into_response();
        let challenge = response
            .headers()
            .get(header::WWW_AUTHENTICATE)
            .map(|value| value.to_str().unwrap().to_owned());
        (response.status(), challenge, detail)
    }

    #[tokio::test]
    async fn auth_is_off_unless_enabled() {
        assert!(
            Auth::from_settings(&Settings::default())
                .await
                .unwrap()
                .is_none()
        );
    }

    #[tokio::test]
    async fn an_api_key_is_its_principal_within_its_scopes() {
        let auth = auth(true, false).await;
        let writer = headers(&[(API_KEY_HEADER, WRITER)]);
        let reader = headers(&[(API_KEY_HEADER, READER)]);
        for scope in [Scope::Read, Scope::Write] {
            let principal = auth.authenticate(&writer, scope).await.unwrap();
            assert_eq!(principal.name, "portal");
        }
        let principal = auth.authenticate(&reader, Scope::Read).await.unwrap();
        assert_eq!(principal.name, "dashboard");
        let (status, challenge, detail) =
            refusal(auth.authenticate(&reader, Scope::Write).await.unwrap_err());
        assert_eq!(status, StatusCode::FORBIDDEN);
        assert_eq!(challenge, None);
        assert_eq!(
            detail,
            "the API key dashboard does not have the deliveries.write scope"
        );
    }

    #[tokio::test]
    async fn missing_and_unknown_credentials_are_401_with_a_challenge() {
        let auth = auth(true, false).await;
        for (headers, detail) in [
            (
                headers(&[]),
                "this request needs credentials: an X-API-Key header",
            ),
            (
                headers(&[(API_KEY_HEADER, "writer-key-0123456789abcdef0123456788")]),
                "the API key is not known",
            ),
            (
                headers(&[("authorization", "Bearer abc")]),
                "bearer tokens are not accepted here; send an X-API-Key header",
            ),
            (
                headers(&[(API_KEY_HEADER, WRITER), ("authorization", "Bearer abc")]),
                "send one credential: either X-API-Key or Authorization, not both",
            ),
        ] {
            let (status, challenge, text) =
                refusal(auth.authenticate(&headers, Scope::Read).await.unwrap_err());
            assert_eq!(status, StatusCode::UNAUTHORIZED);
            assert_eq!(challenge.as_deref(), Some("ApiKey"));
            assert_eq!(text, detail);
        }
    }

    #[tokio::test]
    async fn a_bearer_token_is_its_subject_within_its_scopes() {
        let auth = auth(true, true).await;
        let bearer = |token: &str| headers(&[("authorization", &format!("Bearer {token}"))]);
        let principal = auth
            .authenticate(&bearer(&token("deliveries.write")), Scope::Write)
            .await
            .unwrap();
        // A token's principal is kept apart from every API key's name.
        assert_eq!(principal.name, "jwt:client-1");
        assert_eq!(principal.client(), "jwt:client-1");
        assert_eq!(principal.legacy.as_deref(), Some("client-1"));
        assert!(principal.may_touch(Some("jwt:client-1")));
        assert!(
            principal.may_touch(Some("client-1")),
            "made before the namespaces"
        );
        assert!(!principal.may_touch(Some("portal")));
        assert!(!principal.may_touch(None));
        let lowercase = headers(&[(
            "authorization",
            &format!("bearer {}", token("deliveries.read")),
        )]);
        assert!(auth.authenticate(&lowercase, Scope::Read).await.is_ok());
        let (status, _, detail) = refusal(
            auth.authenticate(&bearer(&token("deliveries.read")), Scope::Write)
                .await
                .unwrap_err(),
        );
        assert_eq!(status, StatusCode::FORBIDDEN);
        assert!(detail.contains("deliveries.write"), "{detail}");
        for authorization in ["Basic dXNlcjpwYXNz", "Bearer ", "Bearer"] {
            let (status, challenge, detail) = refusal(
                auth.authenticate(&headers(&[("authorization", authorization)]), Scope::Read)
                    .await
                    .unwrap_err(),
            );
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{authorization}");
            assert_eq!(
                challenge.as_deref(),
                Some("Bearer realm=\"skyport\", ApiKey")
            );
            assert_eq!(detail, "the Authorization header must be `Bearer <token>`");
        }
        let (_, _, detail) = refusal(
            auth.authenticate(&bearer("not-a-jwt"), Scope::Read)
                .await
                .unwrap_err(),
        );
        assert_eq!(detail, "the bearer token is not a well-formed JWT");
    }

    #[tokio::test]
    async fn with_a_client_claim_a_token_is_charged_to_it_and_an_api_key_to_its_name() {
        let mut settings = settings(true, true);
        settings.gateway.quotas.default_per_s = Some(10);
        settings.gateway.quotas.client_claim = Some("azp".into());
        let auth = Auth::from_settings(&settings).await.unwrap().unwrap();
        let bearer = |azp: Option<&str>| {
            let mut claims = json!({
                "iss": "https://issuer.example/",
                "aud": "api://skyport",
                "sub": "client-1",
                "exp": get_current_timestamp() + 600,
                "scp": "deliveries.write",
            });
            if let Some(azp) = azp {
                claims["azp"] = azp.into();
            }
            let key = EncodingKey::from_secret(SECRET.as_bytes());
            let token = encode(&Header::default(), &claims, &key).unwrap();
            headers(&[("authorization", &format!("Bearer {token}"))])
        };
        let principal = auth
            .authenticate(&bearer(Some("mobile-app")), Scope::Write)
            .await
            .unwrap();
        assert_eq!(principal.name, "jwt:client-1", "the subject still owns");
        assert_eq!(principal.client(), "jwt:mobile-app");
        let (status, challenge, detail) = refusal(
            auth.authenticate(&bearer(None), Scope::Write)
                .await
                .unwrap_err(),
        );
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert!(challenge.is_some());
        assert_eq!(
            detail,
            "the bearer token has no `azp` claim with a string value, which names its client for quotas"
        );
        let key = auth
            .authenticate(&headers(&[(API_KEY_HEADER, WRITER)]), Scope::Write)
            .await
            .unwrap();
        assert_eq!(key.client(), "portal");
    }

    #[tokio::test]
    async fn with_tokens_only_an_api_key_is_refused() {
        let auth = auth(false, true).await;
        let (status, challenge, detail) = refusal(
            auth.authenticate(&headers(&[(API_KEY_HEADER, WRITER)]), Scope::Read)
                .await
                .unwrap_err(),
        );
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert_eq!(challenge.as_deref(), Some("Bearer realm=\"skyport\""));
        assert_eq!(
            detail,
            "API keys are not accepted here; send an Authorization: Bearer token"
        );
    }

    #[test]
    fn reads_need_the_read_scope_admin_operations_the_admin_scope_and_the_rest_the_write_scope() {
        let api = "/api/deliveryrequests";
        assert_eq!(scope_for(&Method::GET, api), Scope::Read);
        assert_eq!(scope_for(&Method::HEAD, api), Scope::Read);
        assert_eq!(scope_for(&Method::POST, api), Scope::Write);
        assert_eq!(scope_for(&Method::DELETE, api), Scope::Write);
        assert_eq!(scope_for(&Method::POST, "/admin/redrive"), Scope::Admin);
        // The reports and the dashboard's data hold every client's.
        assert_eq!(
            scope_for(&Method::GET, "/admin/change-feed/dead-letters"),
            Scope::Admin
        );
        assert_eq!(scope_for(&Method::GET, "/dashboard/data"), Scope::Admin);
    }

    #[tokio::test]
    async fn a_token_whose_subject_is_an_api_keys_name_is_not_that_key() {
        let auth = auth(true, true).await;
        let claims = json!({
            "iss": "https://issuer.example/",
            "aud": "api://skyport",
            "sub": "portal",
            "exp": get_current_timestamp() + 600,
            "scp": "deliveries.read deliveries.write",
        });
        let token = encode(
            &Header::default(),
            &claims,
            &EncodingKey::from_secret(SECRET.as_bytes()),
        )
        .unwrap();
        let token = auth
            .authenticate(
                &headers(&[("authorization", &format!("Bearer {token}"))]),
                Scope::Read,
            )
            .await
            .unwrap();
        let key = auth
            .authenticate(&headers(&[(API_KEY_HEADER, WRITER)]), Scope::Read)
            .await
            .unwrap();
        assert_eq!(key.name, "portal");
        assert_eq!(token.name, "jwt:portal");
        assert_eq!(token.legacy, None, "an API key has that name");
        assert!(!token.may_touch(Some("portal")));
        assert!(!key.may_touch(Some("jwt:portal")));
    }
}
