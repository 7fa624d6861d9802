//! Shared access signatures: the connection string's key turned into the
//! tokens the Event Hubs clients present on `$cbs`.
//!
//! A token is `SharedAccessSignature sr={resource}&sig={signature}&se={expiry}&skn={key name}`,
//! where the signature is base64(HMAC-SHA256(key, url-encoded resource + "\n" + expiry))
//! and the resource is the namespace (`https://NAMESPACE/`), so one token
//! covers every hub the key may reach. Tokens live an hour; the client asks for
//! a new one before that.

use std::fmt;

use async_trait::async_trait;
use azure_core::credentials::{AccessToken, Secret, TokenCredential, TokenRequestOptions};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, Mac};
use secrecy::{ExposeSecret, SecretString};
use sha2::Sha256;
use skyport_runtime::config::ConnectionString;
use time::{Duration, OffsetDateTime};

const TOKEN_LIFETIME: Duration = Duration::hours(1);

/// A [`TokenCredential`] that signs shared access signatures with a connection string's key.
#[derive(Clone)]
pub struct SasCredential {
    resource: String,
    key_name: String,
    key: SecretString,
}

impl fmt::Debug for SasCredential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SasCredential")
            .field("resource", &self.resource)
            .field("key_name", &self.key_name)
            .finish_non_exhaustive()
    }
}

impl SasCredential {
    pub fn new(connection: &ConnectionString) -> Self {
        Self {
            resource: format!("https://{}/", connection.namespace),
            key_name: connection.key_name.clone(),
            key: connection.key.clone(),
        }
    }

    /// The token for the namespace, valid until `expires_on`.
    pub fn token(&self, expires_on: OffsetDateTime) -> String {
        let resource = encode(&self.resource);
        let expiry = expires_on.unix_timestamp();
        let mut mac = Hmac::<Sha256>::new_from_slice(self.key.expose_secret().as_bytes())
            .unwrap_or_else(|_| unreachable!("HMAC takes a key of any length"));
        mac.update(format!("{resource}\n{expiry}").as_bytes());
        let signature = STANDARD.encode(mac.finalize().into_bytes());
        format!(
            "SharedAccessSignature sr={resource}&sig={}&se={expiry}&skn={}",
            encode(&signature),
            encode(&self.key_name)
        )
    }
}

#[async_trait]
impl TokenCredential for SasCredential {
    async fn get_token(
        &self,
        _scopes: &[&str],
        _options: Option<TokenRequestOptions<'_>>,
    ) -> azure_core::Result<AccessToken> {
        let expires_on = OffsetDateTime::now_utc() + TOKEN_LIFETIME;
        Ok(AccessToken::new(
            Secret::new(self.token(expires_on)),
            expires_on,
        ))
    }
}

fn encode(text: &str) -> String {
    url::form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const TEXT: &str = "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=send;SharedAccessKey=c2VjcmV0";

    #[test]
    fn a_token_is_signed_over_the_encoded_resource_and_expiry() {
        // The signature was computed independently (Python's hmac and urllib).
        let credential = SasCredential::new(&ConnectionString::parse(TEXT).unwrap());
        let expiry = OffsetDateTime::from_unix_timestamp(1_700_000_000).unwrap();
        assert_eq!(
            credential.token(expiry),
            "SharedAccessSignature sr=https%3A%2F%2Fns.servicebus.windows.net%2F\
             &sig=7Hsj%2BhIunAFyf63mjdpm5%2B1qTNBY8nvZlY%2BVWHOm6E4%3D&se=1700000000&skn=send"
        );
    }
}
