//! What the producer and the consumer share: the client configuration built
//! from `[kafka]`, and the topics with their partitions in the worker's
//! numbering.
//!
//! Over TLS, librdkafka trusts the same certificate authorities as the rest
//! of the process (native-tls under the HTTPS and AMQP clients): those of
//! `SSL_CERT_FILE` or `SSL_CERT_DIR` when set, else the system's bundle. The
//! OpenSSL linked in is built from source, and its compiled-in default
//! directory holds no certificates on a real system.

use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::client::{Client, ClientContext};
use rdkafka::error::KafkaError;
use secrecy::ExposeSecret;
use skyport_core::ports::Lane;
use skyport_runtime::config::{ConfigError, KafkaAuth, KafkaSaslMechanism, KafkaSettings};

use crate::KafkaOpenError;

/// The pass-through properties that choose the certificate authorities
/// themselves.
const CA_PROPERTIES: [&str; 3] = ["ssl.ca.location", "ssl.ca.pem", "ssl.ca.certificate.stores"];

/// The librdkafka configuration common to the producer and the consumer:
/// brokers, client id, security, the certificate authorities, then the
/// pass-through properties (for tools that reach the same cluster as Skyport
/// does).
pub fn client_config(settings: &KafkaSettings) -> ClientConfig {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", settings.brokers.join(","))
        .set("client.id", &settings.client_id)
        .set("security.protocol", settings.security_protocol().as_str())
        // Topics are created by their operators, with the partitions they
        // choose; a missing one is a configuration error, not a new topic.
        .set("allow.auto.create.topics", "false");
    match settings.auth {
        // The token comes from the client's context (`token::Login`).
        KafkaAuth::Entra => {
            config.set("sasl.mechanism", KafkaSaslMechanism::OAuthBearer.as_str());
        }
        KafkaAuth::Password => {
            if let Some((user, password)) = settings.sasl_credentials() {
                let mechanism = settings.sasl_mechanism.unwrap_or_default();
                config
                    .set("sasl.mechanism", mechanism.as_str())
                    .set("sasl.username", user)
                    .set("sasl.password", password.expose_secret());
            }
        }
    }
    if settings.security_protocol().uses_tls()
        && !CA_PROPERTIES
            .iter()
            .any(|key| settings.properties.contains_key(*key))
    {
        config.set("ssl.ca.location", ca_location(&openssl_probe::probe()));
    }
    for (key, value) in &settings.properties {
        config.set(key, value);
    }
    config
}

/// The file or directory of trusted certificates that `probe` found
/// (environment first, then the system's usual places), or librdkafka's own
/// probe of those places when it found none.
fn ca_location(probe: &openssl_probe::ProbeResult) -> String {
    probe
        .cert_file
        .iter()
        .chain(&probe.cert_dir)
        .next()
        .map_or_else(|| "probe".to_owned(), |path| path.display().to_string())
}

/// A client that librdkafka refused to create: a pass-through property it
/// does not know or a value it does not take is a configuration error that
/// names the key (exit 64); anything else is not.
pub(crate) fn creation_error(settings: &KafkaSettings, error: KafkaError) -> KafkaOpenError {
    if let KafkaError::ClientConfig(_, description, key, _) = &error {
        let name = if settings.properties.contains_key(key) {
            format!("kafka.properties.{key}")
        } else {
            format!("kafka ({key})")
        };
        return KafkaOpenError::Config(ConfigError::new(name, description.clone()));
    }
    if let KafkaError::ClientCreation(description) = &error
        && let Some(key) = settings
            .properties
            .keys()
            .find(|key| description.contains(key.as_str()))
    {
        return KafkaOpenError::Config(ConfigError::new(
            format!("kafka.properties.{key}"),
            description.clone(),
        ));
    }
    KafkaOpenError::Client(error)
}

/// A topic the stream is sharded over.
#[derive(Debug, Clone)]
pub(crate) struct Topic {
    pub(crate) name: String,
    pub(crate) partitions: u32,
    /// The worker's number of this topic's partition 0: the partitions of
    /// the topics listed before it.
    pub(crate) first: u32,
    pub(crate) lane: Lane,
}

/// The configured topics, in order (the expedited lane's last), with their
/// partition counts.
#[derive(Debug, Clone)]
pub(crate) struct Topics(pub(crate) Vec<Topic>);

impl Topics {
    /// Reads every topic's partition count from the brokers (a blocking call:
    /// run it off the async threads).
    pub(crate) fn fetch<C: ClientContext>(
        client: &Client<C>,
        names: &[(String, Lane)],
        timeout: Duration,
    ) -> Result<Self, KafkaOpenError> {
        let mut topics = Vec::with_capacity(names.len());
        let mut first = 0u32;
        for (name, lane) in names {
            let metadata = client
                .fetch_metadata(Some(name), timeout)
                .map_err(|source| KafkaOpenError::Metadata {
                    topic: name.clone(),
                    source,
                })?;
            let found = metadata.topics().iter().find(|t| t.name() == name);
            let partitions = match found {
                Some(topic) if topic.error().is_none() && !topic.partitions().is_empty() => {
                    u32::try_from(topic.partitions().len()).unwrap_or(u32::MAX)
                }
                _ => {
                    let key = match lane {
                        Lane::Normal => "kafka.topics",
                        Lane::Expedited => "kafka.expedited_topic",
                    };
                    return Err(KafkaOpenError::NoTopic(name.clone(), key));
                }
            };
            topics.push(Topic {
                name: name.clone(),
                partitions,
                first,
                lane: *lane,
            });
            first = first.saturating_add(partitions);
        }
        Ok(Self(topics))
    }

    /// The worker's number of `topic`'s `partition`, and the topic's lane.
    pub(crate) fn number(&self, topic: &str, partition: i32) -> Option<(u32, Lane)> {
        let topic = self.0.iter().find(|t| t.name == topic)?;
        let within = u32::try_from(partition).ok()?;
        (within < topic.partitions).then(|| (topic.first + within, topic.lane))
    }

    /// The topics of `lane`, in order.
    pub(crate) fn of(&self, lane: Lane) -> Vec<Topic> {
        self.0.iter().filter(|t| t.lane == lane).cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use skyport_runtime::config::KafkaSecurity;

    use super::*;

    fn topics() -> Topics {
        Topics(vec![
            Topic {
                name: "a".into(),
                partitions: 3,
                first: 0,
                lane: Lane::Normal,
            },
            Topic {
                name: "b".into(),
                partitions: 2,
                first: 3,
                lane: Lane::Normal,
            },
            Topic {
                name: "x".into(),
                partitions: 1,
                first: 5,
                lane: Lane::Expedited,
            },
        ])
    }

    fn property(config: &ClientConfig, key: &str) -> Option<String> {
        config.get(key).map(str::to_owned)
    }

    #[test]
    fn tls_trusts_the_certificates_the_probe_finds_unless_the_properties_choose() {
        let mut settings = KafkaSettings {
            security: Some(KafkaSecurity::SaslSsl),
            ..KafkaSettings::default()
        };
        let probed = ca_location(&openssl_probe::probe());
        assert_eq!(
            property(&client_config(&settings), "ssl.ca.location"),
            Some(probed)
        );

        settings
            .properties
            .insert("ssl.ca.pem".into(), "-----BEGIN CERTIFICATE-----".into());
        assert_eq!(property(&client_config(&settings), "ssl.ca.location"), None);

        settings.properties.clear();
        settings
            .properties
            .insert("ssl.ca.location".into(), "/etc/kafka/ca.pem".into());
        assert_eq!(
            property(&client_config(&settings), "ssl.ca.location").as_deref(),
            Some("/etc/kafka/ca.pem")
        );

        settings.security = Some(KafkaSecurity::SaslPlaintext);
        settings.properties.clear();
        assert_eq!(property(&client_config(&settings), "ssl.ca.location"), None);
    }

    #[test]
    fn entra_is_oauthbearer_over_tls_without_a_user_or_password() {
        let settings = KafkaSettings {
            auth: KafkaAuth::Entra,
            brokers: vec!["ns.servicebus.windows.net:9093".into()],
            ..KafkaSettings::default()
        };
        let config = client_config(&settings);
        assert_eq!(
            property(&config, "security.protocol").as_deref(),
            Some("sasl_ssl")
        );
        assert_eq!(
            property(&config, "sasl.mechanism").as_deref(),
            Some("OAUTHBEARER")
        );
        assert_eq!(property(&config, "sasl.username"), None);
        assert_eq!(property(&config, "sasl.password"), None);
        assert!(property(&config, "ssl.ca.location").is_some());
    }

    #[test]
    fn the_ca_location_is_the_file_then_the_directory_then_librdkafkas_probe() {
        let mut probe = openssl_probe::ProbeResult {
            cert_file: Some("/etc/ssl/certs/ca-certificates.crt".into()),
            cert_dir: vec!["/etc/ssl/certs".into()],
        };
        assert_eq!(ca_location(&probe), "/etc/ssl/certs/ca-certificates.crt");
        probe.cert_file = None;
        assert_eq!(ca_location(&probe), "/etc/ssl/certs");
        probe.cert_dir.clear();
        assert_eq!(ca_location(&probe), "probe");
    }

    #[test]
    fn partitions_are_numbered_across_topics_in_order() {
        let topics = topics();
        let normal = |n| Some((n, Lane::Normal));
        assert_eq!(topics.number("a", 0), normal(0));
        assert_eq!(topics.number("a", 2), normal(2));
        assert_eq!(topics.number("b", 0), normal(3));
        assert_eq!(topics.number("b", 1), normal(4));
        assert_eq!(topics.number("x", 0), Some((5, Lane::Expedited)));
        assert_eq!(topics.number("x", 1), None);
        assert_eq!(topics.number("a", 3), None);
        assert_eq!(topics.number("b", 2), None);
        assert_eq!(topics.number("c", 0), None);
    }
}
