//! `[kafka]`: the stream on a Kafka cluster, or on Event Hubs' Kafka
//! endpoint, sharded over one or more topics.

use std::collections::BTreeMap;

use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;

use skyport_core::ports::Lane;

use super::checks::Checks;
use super::duration::Millis;

/// How the Kafka clients authenticate to the brokers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum KafkaAuth {
    /// With a SASL `security` protocol, a user and password: `sasl_username`
    /// and `sasl_password`, or `connection_string` (PLAIN or SCRAM).
    #[default]
    Password,
    /// SASL OAUTHBEARER over TLS with an Entra ID token for the Event Hubs
    /// namespace of `brokers`: workload identity on Kubernetes, managed
    /// identity, or developer tools. No secret.
    Entra,
}

/// The DNS suffix of an Event Hubs namespace (the public Azure cloud).
const EVENT_HUBS_SUFFIX: &str = ".servicebus.windows.net";

/// The port of Event Hubs' Kafka endpoint.
const EVENT_HUBS_KAFKA_PORT: &str = "9093";

/// How the Kafka clients reach the brokers (librdkafka's `security.protocol`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum KafkaSecurity {
    /// No TLS, no authentication: a local or private cluster.
    #[default]
    Plaintext,
    /// TLS without authentication.
    Ssl,
    /// SASL without TLS.
    SaslPlaintext,
    /// SASL over TLS: Event Hubs' Kafka endpoint (port 9093) and most managed clusters.
    SaslSsl,
}

impl KafkaSecurity {
    /// librdkafka's name for it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Plaintext => "plaintext",
            Self::Ssl => "ssl",
            Self::SaslPlaintext => "sasl_plaintext",
            Self::SaslSsl => "sasl_ssl",
        }
    }

    fn uses_sasl(self) -> bool {
        matches!(self, Self::SaslPlaintext | Self::SaslSsl)
    }

    /// Whether the connections to the brokers are TLS.
    pub fn uses_tls(self) -> bool {
        matches!(self, Self::Ssl | Self::SaslSsl)
    }
}

/// The SASL mechanism (librdkafka's `sasl.mechanism`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
pub enum KafkaSaslMechanism {
    /// User and password in the clear (over TLS): Event Hubs, with user `$ConnectionString`.
    #[default]
    #[serde(rename = "PLAIN")]
    Plain,
    #[serde(rename = "SCRAM-SHA-256")]
    ScramSha256,
    #[serde(rename = "SCRAM-SHA-512")]
    ScramSha512,
    /// Refused: its one spelling is `kafka.auth = "entra"`, which sets it.
    #[serde(rename = "OAUTHBEARER")]
    OAuthBearer,
}

impl KafkaSaslMechanism {
    /// librdkafka's name for it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Plain => "PLAIN",
            Self::ScramSha256 => "SCRAM-SHA-256",
            Self::ScramSha512 => "SCRAM-SHA-512",
            Self::OAuthBearer => "OAUTHBEARER",
        }
    }
}

/// The librdkafka properties Skyport sets itself for its guarantees; the
/// pass-through table may not change them.
pub const MANAGED_PROPERTIES: &[&str] = &[
    "bootstrap.servers",
    "metadata.broker.list",
    "client.id",
    "group.id",
    "security.protocol",
    "sasl.mechanism",
    "sasl.mechanisms",
    "sasl.username",
    "sasl.password",
    "enable.idempotence",
    "acks",
    "request.required.acks",
    "linger.ms",
    "queue.buffering.max.ms",
    "batch.size",
    "message.timeout.ms",
    "delivery.timeout.ms",
    "enable.auto.commit",
    "enable.auto.offset.store",
    "auto.commit.interval.ms",
    "partition.assignment.strategy",
    "session.timeout.ms",
    "max.poll.interval.ms",
];

/// Kafka: the stream, sharded over one or more topics. The workers' consumer
/// group is `worker.consumer_group`.
#[derive(Debug, Clone, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields)]
pub struct KafkaSettings {
    /// `host:port` of one or more brokers (`NAMESPACE.servicebus.windows.net:9093` for Event Hubs).
    pub brokers: Vec<String>,
    /// The topics events are sharded over (topic = hash of the key mod their
    /// number); each must have the same number of partitions, and every
    /// gateway and worker must list the same topics in the same order.
    pub topics: Vec<String>,
    /// The topic of the expedited lane: expedited deliveries and their later
    /// events go there (partition = hash of the key mod its partitions) and
    /// the workers read it beside `topics`, each of its partitions with a
    /// window of its own. Unset: expedited deliveries share `topics`.
    pub expedited_topic: Option<String>,
    /// This client's name in the brokers' logs and quotas.
    pub client_id: String,
    pub auth: KafkaAuth,
    /// Unset: `sasl_ssl` with `auth = "entra"`, else `plaintext`.
    pub security: Option<KafkaSecurity>,
    /// Unset: `PLAIN` (with `auth = "password"` and a SASL protocol).
    pub sasl_mechanism: Option<KafkaSaslMechanism>,
    /// SASL user; unset with a `connection_string`: `$ConnectionString`.
    pub sasl_username: Option<String>,
    #[cfg_attr(test, schemars(with = "Option<String>"))]
    pub sasl_password: Option<SecretString>,
    /// An Event Hubs connection string: the SASL password, with the user
    /// `$ConnectionString` (Event Hubs' Kafka endpoint).
    #[cfg_attr(test, schemars(with = "Option<String>"))]
    pub connection_string: Option<SecretString>,
    /// How long the producer waits for more records to join a batch.
    pub linger_ms: Millis,
    /// Largest batch of records to one partition, in bytes.
    pub batch_size: u32,
    /// A record the brokers have not acknowledged by then fails, and its
    /// request gets 503 + Retry-After (librdkafka's `message.timeout.ms`).
    pub delivery_timeout_ms: Millis,
    /// How often the acknowledged offsets are committed (asynchronously).
    pub commit_interval_ms: Millis,
    /// A member the coordinator has not heard from for this long leaves the group.
    pub session_timeout_ms: Millis,
    /// A member that has not polled for this long leaves the group (the
    /// consumer polls all the time; work never holds the poll).
    pub max_poll_interval_ms: Millis,
    /// How long a revocation waits for the revoked partitions' work to stop
    /// and their offsets to be committed before it completes anyway.
    pub drain_timeout_ms: Millis,
    /// Further librdkafka properties, as librdkafka names them (for example
    /// `request.timeout.ms`, `metadata.max.age.ms`, `ssl.ca.location`). A
    /// dotted name may also arrive nested (`--set
    /// kafka.properties.request.timeout.ms=60000`, or
    /// `SKYPORT__KAFKA__PROPERTIES__…`): the levels are joined with dots.
    #[serde(deserialize_with = "flat_properties")]
    pub properties: BTreeMap<String, String>,
}

impl Default for KafkaSettings {
    fn default() -> Self {
        Self {
            brokers: Vec::new(),
            topics: vec!["deliveries".into()],
            expedited_topic: None,
            client_id: "skyport".into(),
            auth: KafkaAuth::Password,
            security: None,
            sasl_mechanism: None,
            sasl_username: None,
            sasl_password: None,
            connection_string: None,
            linger_ms: Millis::new(5),
            batch_size: 1_000_000,
            delivery_timeout_ms: Millis::new(10_000),
            commit_interval_ms: Millis::new(1_000),
            session_timeout_ms: Millis::new(45_000),
            max_poll_interval_ms: Millis::new(300_000),
            drain_timeout_ms: Millis::new(10_000),
            properties: BTreeMap::new(),
        }
    }
}

/// A pass-through property's value as the settings' sources give it.
#[derive(Deserialize)]
#[serde(untagged)]
enum PropertyValue {
    Text(String),
    Integer(i64),
    Float(f64),
    Flag(bool),
    Nested(BTreeMap<String, PropertyValue>),
}

fn flat_properties<'de, D>(deserializer: D) -> Result<BTreeMap<String, String>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    fn flatten(prefix: &str, value: PropertyValue, out: &mut BTreeMap<String, String>) {
        let text = match value {
            PropertyValue::Text(text) => text,
            PropertyValue::Integer(n) => n.to_string(),
            PropertyValue::Float(x) => x.to_string(),
            PropertyValue::Flag(flag) => flag.to_string(),
            PropertyValue::Nested(levels) => {
                for (key, value) in levels {
                    flatten(&format!("{prefix}.{key}"), value, out);
                }
                return;
            }
        };
        out.insert(prefix.to_owned(), text);
    }
    let levels = BTreeMap::<String, PropertyValue>::deserialize(deserializer)?;
    let mut out = BTreeMap::new();
    for (key, value) in levels {
        flatten(&key, value, &mut out);
    }
    Ok(out)
}

impl KafkaSettings {
    /// Every topic read, with its lane: `topics`, then `expedited_topic`.
    pub fn lane_topics(&self) -> Vec<(String, Lane)> {
        self.topics
            .iter()
            .map(|topic| (topic.clone(), Lane::Normal))
            .chain(
                self.expedited_topic
                    .iter()
                    .map(|topic| (topic.clone(), Lane::Expedited)),
            )
            .collect()
    }

    /// librdkafka's `security.protocol`: `security`, else `sasl_ssl` with
    /// `auth = "entra"` and `plaintext` without.
    pub fn security_protocol(&self) -> KafkaSecurity {
        self.security.unwrap_or(match self.auth {
            KafkaAuth::Password => KafkaSecurity::Plaintext,
            KafkaAuth::Entra => KafkaSecurity::SaslSsl,
        })
    }

    /// The SASL user and password, when `auth = "password"`, SASL is on and
    /// they are set.
    pub fn sasl_credentials(&self) -> Option<(String, SecretString)> {
        if self.auth != KafkaAuth::Password || !self.security_protocol().uses_sasl() {
            return None;
        }
        if let Some(connection_string) = &self.connection_string {
            let user = self
                .sasl_username
                .clone()
                .unwrap_or_else(|| "$ConnectionString".into());
            return Some((user, connection_string.clone()));
        }
        Some((self.sasl_username.clone()?, self.sasl_password.clone()?))
    }

    /// The host of the Event Hubs namespace, `NAMESPACE.servicebus.windows.net`,
    /// when every broker is its Kafka endpoint (`…:9093`); `None` when they
    /// name none, or several.
    pub fn event_hubs_namespace(&self) -> Option<&str> {
        let (first, rest) = self.brokers.split_first()?;
        let (host, port) = first.rsplit_once(':')?;
        let name = host.strip_suffix(EVENT_HUBS_SUFFIX)?;
        let well_formed = port == EVENT_HUBS_KAFKA_PORT
            && !name.is_empty()
            && !name.starts_with('-')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-');
        (well_formed && rest.iter().all(|broker| broker == first)).then_some(host)
    }

    /// The scope of the Entra ID token with `auth = "entra"`: the audience
    /// `https://NAMESPACE.servicebus.windows.net` of the brokers' namespace.
    pub fn entra_scope(&self) -> Option<String> {
        self.event_hubs_namespace()
            .map(|namespace| format!("https://{namespace}/.default"))
    }

    /// Checks the keys of a stream on Kafka.
    pub(super) fn validate(&self, checks: &mut Checks<'_>) {
        checks.check(
            !self.brokers.is_empty(),
            "brokers",
            "must list at least one broker as host:port",
        );
        let well_formed = self.brokers.iter().all(|broker| {
            broker
                .rsplit_once(':')
                .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok())
        });
        checks.check(well_formed, "brokers", "each must be host:port");
        checks.check(
            (1..=64).contains(&self.topics.len()),
            "topics",
            "must list from 1 to 64 topics",
        );
        let well_named = |topic: &String| {
            !topic.is_empty()
                && topic.len() <= 249
                && topic != "."
                && topic != ".."
                && topic
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        };
        checks.check(
            self.topics.iter().all(well_named),
            "topics",
            "names must be 1 to 249 letters, digits, '-', '_' or '.'",
        );
        if let Some(expedited) = &self.expedited_topic {
            checks.check(
                well_named(expedited),
                "expedited_topic",
                "must be 1 to 249 letters, digits, '-', '_' or '.'",
            );
            checks.check(
                !self.topics.contains(expedited),
                "expedited_topic",
                "must not be one of kafka.topics: the lane needs partitions of its own",
            );
        }
        let distinct = self
            .topics
            .iter()
            .enumerate()
            .all(|(i, topic)| !self.topics[..i].contains(topic));
        checks.check(distinct, "topics", "must not list a topic twice");
        checks.check(!self.client_id.is_empty(), "client_id", "must not be empty");
        match self.auth {
            KafkaAuth::Password => self.validate_password(checks),
            KafkaAuth::Entra => self.validate_entra(checks),
        }
        checks.check(
            self.linger_ms.count() <= 1_000,
            "linger_ms",
            "must be at most 1000",
        );
        checks.check(
            (1_024..=2_147_483_647).contains(&self.batch_size),
            "batch_size",
            "must be from 1024 to 2147483647",
        );
        checks.check(
            (1_000..=900_000).contains(&self.delivery_timeout_ms.count()),
            "delivery_timeout_ms",
            "must be from 1000 to 900000",
        );
        checks.check(
            (10..=60_000).contains(&self.commit_interval_ms.count()),
            "commit_interval_ms",
            "must be from 10 to 60000",
        );
        checks.check(
            (6_000..=300_000).contains(&self.session_timeout_ms.count()),
            "session_timeout_ms",
            "must be from 6000 to 300000",
        );
        checks.check(
            self.max_poll_interval_ms >= self.session_timeout_ms,
            "max_poll_interval_ms",
            "must be at least kafka.session_timeout_ms",
        );
        checks.check(
            self.drain_timeout_ms.count() >= 1 && self.drain_timeout_ms < self.session_timeout_ms,
            "drain_timeout_ms",
            "must be from 1 ms to less than kafka.session_timeout_ms, or the group expels a member while it drains",
        );
        for key in self.properties.keys() {
            checks.check(
                !MANAGED_PROPERTIES.contains(&key.as_str()),
                &format!("properties.{key}"),
                "is set by Skyport itself (use the [kafka] key for it)",
            );
        }
    }

    /// The keys of `auth = "password"`: a SASL protocol needs a user and a
    /// password, and only a SASL protocol takes them.
    fn validate_password(&self, checks: &mut Checks<'_>) {
        checks.check(
            self.sasl_mechanism != Some(KafkaSaslMechanism::OAuthBearer),
            "sasl_mechanism",
            "OAUTHBEARER is spelled kafka.auth = \"entra\" (an Entra ID token for Event Hubs), with kafka.sasl_mechanism unset",
        );
        if self.security_protocol().uses_sasl() {
            let has_password = self.connection_string.is_some() || self.sasl_password.is_some();
            checks.check(
                has_password,
                "sasl_password",
                "must be set (or kafka.connection_string) with a SASL security protocol",
            );
            checks.check(
                self.connection_string.is_some() || self.sasl_username.is_some(),
                "sasl_username",
                "must be set (or kafka.connection_string) with a SASL security protocol",
            );
            checks.check(
                self.connection_string.is_none() || self.sasl_password.is_none(),
                "connection_string",
                "is the SASL password: set it or kafka.sasl_password, not both",
            );
        } else {
            checks.check(
                self.connection_string.is_none()
                    && self.sasl_password.is_none()
                    && self.sasl_username.is_none(),
                "security",
                "must be sasl_ssl or sasl_plaintext when SASL credentials are set",
            );
        }
        if let Some(connection_string) = &self.connection_string {
            checks.check(
                connection_string.expose_secret().starts_with("Endpoint="),
                "connection_string",
                "must be an Event Hubs connection string (Endpoint=sb://…;SharedAccessKeyName=…;SharedAccessKey=…)",
            );
        }
    }

    /// The keys of `auth = "entra"`: SASL OAUTHBEARER over TLS to one Event
    /// Hubs namespace, whose token replaces every credential.
    fn validate_entra(&self, checks: &mut Checks<'_>) {
        checks.check(
            matches!(self.security, None | Some(KafkaSecurity::SaslSsl)),
            "security",
            "must be sasl_ssl or unset with kafka.auth = \"entra\": Event Hubs takes OAUTHBEARER over TLS only",
        );
        checks.check(
            self.sasl_mechanism.is_none(),
            "sasl_mechanism",
            "must be unset with kafka.auth = \"entra\", which is OAUTHBEARER",
        );
        for (key, set) in [
            ("connection_string", self.connection_string.is_some()),
            ("sasl_username", self.sasl_username.is_some()),
            ("sasl_password", self.sasl_password.is_some()),
        ] {
            checks.check(
                !set,
                key,
                "must be unset with kafka.auth = \"entra\": the Entra ID token replaces it",
            );
        }
        if !self.brokers.is_empty() {
            checks.check(
                self.event_hubs_namespace().is_some(),
                "brokers",
                "must all be one NAMESPACE.servicebus.windows.net:9093 with kafka.auth = \"entra\": the token's audience is that Event Hubs namespace",
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ConfigErrors, Settings};

    /// Settings on Kafka from `[kafka]` keys in TOML.
    fn load(kafka: &str) -> Result<Settings, ConfigErrors> {
        Settings::from_toml(&format!("[stream]\nbackend = \"kafka\"\n[kafka]\n{kafka}"))
    }

    const ENTRA: &str =
        "auth = \"entra\"\nbrokers = [\"skyport-prod.servicebus.windows.net:9093\"]\n";

    #[test]
    fn entra_needs_only_the_namespace_and_takes_sasl_ssl_and_oauthbearer() {
        for extra in ["", "security = \"sasl_ssl\"\n"] {
            let settings = load(&format!("{ENTRA}{extra}")).expect("valid");
            let kafka = &settings.kafka;
            assert_eq!(kafka.auth, KafkaAuth::Entra);
            assert_eq!(kafka.security_protocol(), KafkaSecurity::SaslSsl);
            assert!(kafka.sasl_credentials().is_none());
            assert_eq!(
                kafka.entra_scope().as_deref(),
                Some("https://skyport-prod.servicebus.windows.net/.default")
            );
        }
        let password = load("brokers = [\"b:9092\"]").expect("valid");
        assert_eq!(password.kafka.auth, KafkaAuth::Password);
        assert_eq!(password.kafka.security_protocol(), KafkaSecurity::Plaintext);
    }

    #[test]
    fn entra_refuses_every_other_credential_and_protocol_naming_the_key() {
        let cases = [
            (
                "connection_string = \"Endpoint=sb://x/;SharedAccessKeyName=k;SharedAccessKey=s\"",
                "kafka.connection_string",
            ),
            (
                "sasl_username = \"$ConnectionString\"",
                "kafka.sasl_username",
            ),
            ("sasl_password = \"secret\"", "kafka.sasl_password"),
            ("security = \"ssl\"", "kafka.security"),
            ("security = \"sasl_plaintext\"", "kafka.security"),
            ("sasl_mechanism = \"PLAIN\"", "kafka.sasl_mechanism"),
            ("sasl_mechanism = \"OAUTHBEARER\"", "kafka.sasl_mechanism"),
        ];
        for (line, key) in cases {
            let errors = load(&format!("{ENTRA}{line}\n")).expect_err(line);
            let keys: Vec<&str> = errors.0.iter().map(|e| e.key.as_str()).collect();
            assert_eq!(keys, [key], "{line}: {errors}");
            assert!(
                errors.0[0].message.contains("kafka.auth = \"entra\""),
                "{errors}"
            );
        }
    }

    #[test]
    fn entra_needs_every_broker_on_one_event_hubs_namespace() {
        for brokers in [
            "[\"kafka.contoso.com:9093\"]",
            "[\"skyport-prod.servicebus.windows.net:9092\"]",
            "[\"skyport-prod.servicebus.windows.net:9093\", \"other.servicebus.windows.net:9093\"]",
            "[\"a.b.servicebus.windows.net:9093\"]",
            "[\".servicebus.windows.net:9093\"]",
        ] {
            let errors =
                load(&format!("auth = \"entra\"\nbrokers = {brokers}\n")).expect_err(brokers);
            let keys: Vec<&str> = errors.0.iter().map(|e| e.key.as_str()).collect();
            assert_eq!(keys, ["kafka.brokers"], "{brokers}: {errors}");
        }
        let twice = "auth = \"entra\"\nbrokers = [\"ns.servicebus.windows.net:9093\", \"ns.servicebus.windows.net:9093\"]\n";
        assert!(load(twice).is_ok());
    }

    #[test]
    fn oauthbearer_without_entra_is_refused_naming_the_mechanism() {
        let errors = load(
            "brokers = [\"b:9093\"]\nsecurity = \"sasl_ssl\"\nsasl_mechanism = \"OAUTHBEARER\"\n\
             sasl_username = \"u\"\nsasl_password = \"p\"\n",
        )
        .expect_err("refused");
        let keys: Vec<&str> = errors.0.iter().map(|e| e.key.as_str()).collect();
        assert_eq!(keys, ["kafka.sasl_mechanism"], "{errors}");
        assert!(errors.0[0].message.contains("kafka.auth = \"entra\""));
    }
}
