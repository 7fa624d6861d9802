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
mod tests;
