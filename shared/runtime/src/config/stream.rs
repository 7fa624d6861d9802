//! `[stream]`: which backend carries the events.

use serde::Deserialize;

use super::checks::Checks;

/// Which event stream carries accepted requests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum StreamBackend {
    /// The partitioned log inside the embedded store.
    #[default]
    Embedded,
    /// Azure Event Hubs, sharded over `eventhubs.hubs`.
    EventHubs,
    /// A Kafka cluster or Event Hubs' Kafka endpoint, sharded over `kafka.topics`.
    Kafka,
}

#[derive(Debug, Clone, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields)]
pub struct StreamSettings {
    /// Unset: the profile's (embedded → embedded, azure → eventhubs, kafka → kafka).
    pub backend: Option<StreamBackend>,
    /// Partitions of the embedded stream; fixed once the embedded store holds data.
    pub partitions: u32,
}

impl Default for StreamSettings {
    fn default() -> Self {
        Self {
            backend: None,
            partitions: 8,
        }
    }
}

/// The most partitions `stream.partitions` may name.
pub const MAX_PARTITIONS: u32 = 1024;

impl StreamSettings {
    pub(super) fn validate(&self, checks: &mut Checks<'_>) {
        checks.check(
            (1..=MAX_PARTITIONS).contains(&self.partitions),
            "partitions",
            "must be from 1 to 1024",
        );
    }
}
