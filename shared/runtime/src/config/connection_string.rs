//! An Event Hubs connection string (`eventhubs.connection_string`), parsed:
//! the namespace, the key's name and the key, and the hub a hub-level key is
//! limited to. Checked when the settings load; the Event Hubs adapter signs
//! its tokens with it.

use std::fmt;

use secrecy::SecretString;
use url::Url;

/// The parts of an Event Hubs connection string.
#[derive(Clone)]
pub struct ConnectionString {
    /// The namespace host, from `Endpoint=sb://HOST/`.
    pub namespace: String,
    pub key_name: String,
    pub key: SecretString,
    /// The hub a hub-level key is limited to.
    pub entity_path: Option<String>,
}

impl fmt::Debug for ConnectionString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnectionString")
            .field("namespace", &self.namespace)
            .field("key_name", &self.key_name)
            .field("entity_path", &self.entity_path)
            .finish_non_exhaustive()
    }
}

/// What is wrong with a connection string (never its key).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConnectionStringError {
    #[error("has no {0}= part")]
    Missing(&'static str),
    #[error("has an Endpoint that is not an sb:// URL with a host")]
    Endpoint,
    #[error("has a part that is not Name=Value")]
    Malformed,
}

impl ConnectionString {
    /// Parses `Endpoint=sb://HOST/;SharedAccessKeyName=NAME;SharedAccessKey=KEY[;EntityPath=HUB]`.
    ///
    /// # Errors
    /// [`ConnectionStringError`] names the part that is missing or malformed.
    pub fn parse(text: &str) -> Result<Self, ConnectionStringError> {
        let (mut endpoint, mut key_name, mut key, mut entity_path) = (None, None, None, None);
        for part in text.split(';').map(str::trim).filter(|p| !p.is_empty()) {
            let (name, value) = part
                .split_once('=')
                .ok_or(ConnectionStringError::Malformed)?;
            let slot = match name.trim().to_ascii_lowercase().as_str() {
                "endpoint" => &mut endpoint,
                "sharedaccesskeyname" => &mut key_name,
                "sharedaccesskey" => &mut key,
                "entitypath" => &mut entity_path,
                _ => continue,
            };
            *slot = Some(value.trim().to_owned());
        }
        let endpoint = endpoint.ok_or(ConnectionStringError::Missing("Endpoint"))?;
        let namespace = Url::parse(&endpoint)
            .ok()
            .filter(|url| url.scheme() == "sb")
            .and_then(|url| url.host_str().map(str::to_owned))
            .ok_or(ConnectionStringError::Endpoint)?;
        Ok(Self {
            namespace,
            key_name: key_name.ok_or(ConnectionStringError::Missing("SharedAccessKeyName"))?,
            key: key
                .ok_or(ConnectionStringError::Missing("SharedAccessKey"))?
                .into(),
            entity_path: entity_path.filter(|e| !e.is_empty()),
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use secrecy::ExposeSecret;

    use super::*;

    const TEXT: &str = "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=send;SharedAccessKey=c2VjcmV0";

    #[test]
    fn a_connection_string_names_namespace_key_and_hub() {
        let parsed = ConnectionString::parse(&format!("{TEXT};EntityPath=d-0")).unwrap();
        assert_eq!(parsed.namespace, "ns.servicebus.windows.net");
        assert_eq!(parsed.key_name, "send");
        assert_eq!(parsed.key.expose_secret(), "c2VjcmV0");
        assert_eq!(parsed.entity_path.as_deref(), Some("d-0"));
        assert!(!format!("{parsed:?}").contains("c2VjcmV0"));
    }

    #[test]
    fn a_broken_connection_string_says_what_is_missing() {
        assert_eq!(
            ConnectionString::parse("Endpoint=sb://ns/;SharedAccessKey=k").unwrap_err(),
            ConnectionStringError::Missing("SharedAccessKeyName")
        );
        assert_eq!(
            ConnectionString::parse("Endpoint=https://ns/;SharedAccessKeyName=a;SharedAccessKey=k")
                .unwrap_err(),
            ConnectionStringError::Endpoint
        );
        assert_eq!(
            ConnectionString::parse("nonsense").unwrap_err(),
            ConnectionStringError::Malformed
        );
    }
}
