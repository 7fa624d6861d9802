//! `[kafka]`: the stream on a Kafka cluster, or on Event Hubs' Kafka
//! endpoint, sharded over one or more topics.

use std::collections::BTreeMap;

use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;

use skyport_core::ports::Lane;

use super::checks::Checks;
use super::duration::Millis;

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
}

impl KafkaSaslMechanism {
    /// librdkafka's name for it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Plain => "PLAIN",
            Self::ScramSha256 => "SCRAM-SHA-256",
            Self::ScramSha512 => "SCRAM-SHA-512",
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
    pub security: KafkaSecurity,
    pub sasl_mechanism: KafkaSaslMechanism,
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
            security: KafkaSecurity::Plaintext,
            sasl_mechanism: KafkaSaslMechanism::Plain,
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

    /// The SASL user and password, when SASL is on and they are set.
    pub fn sasl_credentials(&self) -> Option<(String, SecretString)> {
        if !self.security.uses_sasl() {
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
        if self.security.uses_sasl() {
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
}
