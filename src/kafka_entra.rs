//! Kafka on Event Hubs with Entra ID (`kafka.auth = "entra"`): the
//! environment's credential (workload identity, managed identity, developer
//! tools: `skyport_azure::entra`) as the source of the Kafka clients'
//! OAUTHBEARER token, for the audience of the namespace in `kafka.brokers`.

use std::sync::Arc;
use std::time::SystemTime;

use async_trait::async_trait;
use azure_core::credentials::TokenCredential;
use skyport_azure::entra;
use skyport_kafka::token::{AccessToken, TokenError, TokenSource};
use skyport_kafka::{BearerToken, KafkaOpenError};
use skyport_runtime::config::{ConfigError, KafkaAuth, KafkaSettings};

/// Tokens for one scope from an Entra ID credential.
#[derive(Debug)]
pub struct EntraTokens {
    credential: Arc<dyn TokenCredential>,
    scope: String,
}

impl EntraTokens {
    /// Tokens of `credential` for `scope`
    /// (`https://NAMESPACE.servicebus.windows.net/.default`).
    pub fn new(credential: Arc<dyn TokenCredential>, scope: String) -> Self {
        Self { credential, scope }
    }
}

#[async_trait]
impl TokenSource for EntraTokens {
    async fn token(&self) -> Result<AccessToken, TokenError> {
        let token = self.credential.get_token(&[&self.scope], None).await?;
        Ok(AccessToken {
            secret: token.token.secret().to_owned().into(),
            expires_at: SystemTime::from(token.expires_on),
        })
    }
}

/// The token the Kafka clients present with `kafka.auth = "entra"`, its
/// first already fetched (so no connection waits for one); `None` otherwise.
///
/// # Errors
/// [`KafkaOpenError::Token`] when the credential cannot be built or gives no
/// token; a [`ConfigError`] naming `kafka.brokers` when they are not one
/// Event Hubs namespace (which loading the settings refuses first).
pub async fn bearer_token(settings: &KafkaSettings) -> Result<Option<BearerToken>, KafkaOpenError> {
    if settings.auth != KafkaAuth::Entra {
        return Ok(None);
    }
    let scope = settings.entra_scope().ok_or_else(|| {
        ConfigError::new(
            "kafka.brokers",
            "must all be one NAMESPACE.servicebus.windows.net:9093 with kafka.auth = \"entra\"",
        )
    })?;
    let credential = entra::credential().map_err(|e| KafkaOpenError::Token(Box::new(e)))?;
    let source = Arc::new(EntraTokens::new(credential, scope));
    BearerToken::start(source, &settings.client_id)
        .await
        .map(Some)
}
