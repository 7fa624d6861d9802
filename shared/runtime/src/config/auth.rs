//! `[gateway.auth]`: who may call the `/api` routes — API keys, JWT bearer
//! tokens, or both. The keys are checked here; the gateway turns them into
//! verifiers (a public key in PEM is parsed there, as a key for its algorithm).

use std::collections::BTreeMap;

use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use url::Url;

use super::checks::Checks;
use super::duration::Seconds;

/// Authentication of the gateway's `/api` routes: API keys, JWT bearer tokens, or both.
#[derive(Debug, Clone, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields)]
pub struct AuthSettings {
    /// Unset: the profile's (embedded → off, azure → on).
    pub enabled: Option<bool>,
    /// API keys by name (the name becomes the caller's principal: letters,
    /// digits, `.`, `_` and `-`, so that it can never be a bearer token's,
    /// which is `jwt:` and the token's subject); sent in `X-API-Key`.
    pub api_keys: BTreeMap<String, ApiKeySettings>,
    /// Bearer tokens (`Authorization: Bearer …`), for example Entra ID access tokens.
    pub jwt: Option<JwtSettings>,
    /// The scope (in `scp`) or app role (in `roles`) a token needs to read status.
    pub read_scope: String,
    /// The scope or app role a token needs to post and cancel delivery requests.
    pub write_scope: String,
    /// The scope or app role that lists every client's deliveries and runs
    /// the `/admin` operations (redrive, callback resend).
    pub admin_scope: String,
}

impl Default for AuthSettings {
    fn default() -> Self {
        Self {
            enabled: None,
            api_keys: BTreeMap::new(),
            jwt: None,
            read_scope: "deliveries.read".into(),
            write_scope: "deliveries.write".into(),
            admin_scope: "deliveries.admin".into(),
        }
    }
}

/// One API key and what it may do.
#[derive(Debug, Clone, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct ApiKeySettings {
    /// The key itself (at least 32 characters).
    #[cfg_attr(test, schemars(with = "String"))]
    pub key: SecretString,
    /// Unset: read and write (admin is granted only by name).
    #[serde(default = "Scope::all")]
    pub scopes: Vec<Scope>,
}

/// What a caller may do with delivery requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
pub enum Scope {
    /// Read status (`GET`).
    #[serde(rename = "deliveries.read")]
    Read,
    /// Post and cancel delivery requests (`POST`, `DELETE`).
    #[serde(rename = "deliveries.write")]
    Write,
    /// List every client's deliveries, and the `/admin` operations.
    #[serde(rename = "deliveries.admin")]
    Admin,
}

impl Scope {
    pub fn all() -> Vec<Self> {
        vec![Self::Read, Self::Write]
    }
}

impl std::fmt::Display for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Read => "deliveries.read",
            Self::Write => "deliveries.write",
            Self::Admin => "deliveries.admin",
        })
    }
}

/// How bearer tokens are checked: their issuer, audience and exactly one
/// source of signing keys.
#[derive(Debug, Clone, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields)]
pub struct JwtSettings {
    /// The `iss` tokens must carry (Entra ID: `https://login.microsoftonline.com/TENANT/v2.0`).
    pub issuer: String,
    /// The `aud` tokens must carry (Entra ID: the API's application id URI or client id).
    pub audience: String,
    /// A shared secret for HS256 (at least 32 characters).
    #[cfg_attr(test, schemars(with = "Option<String>"))]
    pub hs256_secret: Option<SecretString>,
    /// A public key in PEM: RSA (RS256) or EC on P-256 (ES256).
    pub public_key_pem: Option<String>,
    /// Where the issuer publishes its signing keys (a JWKS document).
    pub jwks_url: Option<Url>,
    /// How often the JWKS is fetched again.
    pub jwks_refresh_s: Seconds,
    /// Clock skew allowed when checking `exp` and `nbf`.
    pub leeway_s: Seconds,
}

impl Default for JwtSettings {
    fn default() -> Self {
        Self {
            issuer: String::new(),
            audience: String::new(),
            hs256_secret: None,
            public_key_pem: None,
            jwks_url: None,
            jwks_refresh_s: Seconds::new(3_600),
            leeway_s: Seconds::new(60),
        }
    }
}

impl AuthSettings {
    pub(super) fn validate(&self, checks: &mut Checks<'_>, enabled: bool) {
        if enabled && self.api_keys.is_empty() && self.jwt.is_none() {
            let why = match self.enabled {
                Some(_) => "auth is on (gateway.auth.enabled = true)",
                None => "auth is on (profile azure)",
            };
            checks.fail(
                "",
                format!(
                    "{why} but neither gateway.auth.api_keys nor gateway.auth.jwt is set; set one, or gateway.auth.enabled = false"
                ),
            );
        }
        for (index, (name, api_key)) in self.api_keys.iter().enumerate() {
            checks.check(
                is_key_name(name),
                &format!("api_keys.{name}"),
                "a key's name is 1 to 64 letters, digits, '.', '_' or '-' (a bearer token's \
                 principal is jwt: and its subject, so the two never meet)",
            );
            let mut checks = checks.section(&format!("api_keys.{name}"));
            let key = api_key.key.expose_secret();
            checks.check(key.len() >= 32, "key", "must be at least 32 characters");
            if let Some((other, _)) = self
                .api_keys
                .iter()
                .take(index)
                .find(|(_, other)| other.key.expose_secret() == key)
            {
                checks.fail(
                    "key",
                    format!(
                        "is the same as gateway.auth.api_keys.{other}.key; each key must be unique"
                    ),
                );
            }
            checks.check(
                !api_key.scopes.is_empty(),
                "scopes",
                "must list deliveries.read, deliveries.write or both",
            );
        }
        let scopes = [
            ("read_scope", &self.read_scope),
            ("write_scope", &self.write_scope),
            ("admin_scope", &self.admin_scope),
        ];
        for (index, (key, scope)) in scopes.iter().enumerate() {
            checks.check(
                !scope.is_empty() && !scope.contains(char::is_whitespace),
                key,
                "must be one scope name, without spaces",
            );
            if let Some((other, _)) = scopes[..index].iter().find(|(_, other)| other == scope) {
                checks.fail(key, format!("must differ from gateway.auth.{other}"));
            }
        }
        if let Some(jwt) = &self.jwt {
            jwt.validate(&mut checks.section("jwt"));
        }
    }
}

/// The most clock skew `leeway_s` may allow: five minutes, Kerberos' and
/// most identity providers' bound.
const MAX_LEEWAY_S: u64 = 300;

/// Whether `name` may name an API key: it then never looks like a bearer
/// token's principal (`jwt:…`).
pub fn is_key_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Whether `url`'s host is a loopback address (or `localhost`).
fn is_loopback(url: &Url) -> bool {
    match url.host() {
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        Some(url::Host::Domain(domain)) => domain.eq_ignore_ascii_case("localhost"),
        None => false,
    }
}

impl JwtSettings {
    fn validate(&self, checks: &mut Checks<'_>) {
        checks.check(
            !self.issuer.trim().is_empty(),
            "issuer",
            "must be set to the `iss` tokens carry",
        );
        checks.check(
            !self.audience.trim().is_empty(),
            "audience",
            "must be set to the `aud` tokens carry",
        );
        let sources = [
            self.hs256_secret.is_some(),
            self.public_key_pem.is_some(),
            self.jwks_url.is_some(),
        ];
        checks.check(
            sources.iter().filter(|set| **set).count() == 1,
            "",
            "must set exactly one of hs256_secret, public_key_pem and jwks_url",
        );
        if let Some(secret) = &self.hs256_secret {
            checks.check(
                secret.expose_secret().len() >= 32,
                "hs256_secret",
                "must be at least 32 characters",
            );
        }
        if let Some(url) = &self.jwks_url {
            checks.check(
                url.scheme() == "https" && url.host().is_some()
                    || url.scheme() == "http" && is_loopback(url),
                "jwks_url",
                "must be an https URL with a host (http only on a loopback address): whoever \
                 can alter the keys it serves can sign tokens",
            );
        }
        checks.at_least(self.jwks_refresh_s.count(), 60, "jwks_refresh_s");
        checks.check(
            self.leeway_s.count() <= MAX_LEEWAY_S,
            "leeway_s",
            format!("must be at most {MAX_LEEWAY_S} (clock skew, not a token's lifetime)"),
        );
    }
}
