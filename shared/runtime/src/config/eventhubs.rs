//! `[eventhubs]`: Azure Event Hubs, the stream sharded over one or more hubs
//! of a namespace.

use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use url::Url;

use skyport_core::ports::Lane;

use super::checks::Checks;
use super::connection_string::ConnectionString;
use super::duration::Millis;

/// How the Event Hubs clients authenticate.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum EventHubsAuth {
    /// A shared access key from `eventhubs.connection_string`.
    #[default]
    ConnectionString,
    /// An Entra ID credential: workload identity on Kubernetes, managed identity, or developer tools.
    Entra,
}

/// Azure Event Hubs: the stream, sharded over one or more hubs of a namespace.
#[derive(Debug, Clone, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields)]
pub struct EventHubsSettings {
    /// Fully qualified namespace, `NAMESPACE.servicebus.windows.net`; with a
    /// connection string, its `Endpoint` host when unset.
    pub namespace: Option<String>,
    /// The hubs events are sharded over (hub = hash of the key mod their
    /// number); every gateway and worker must list the same hubs in the same order.
    pub hubs: Vec<String>,
    /// The hubs of the expedited lane: expedited deliveries and their later
    /// events are sharded over them as the others are over `hubs`, and the
    /// workers read them beside `hubs`, each partition with a window of its
    /// own. Empty: expedited deliveries share `hubs`.
    pub expedited_hubs: Vec<String>,
    pub auth: EventHubsAuth,
    /// `Endpoint=sb://…/;SharedAccessKeyName=…;SharedAccessKey=…` (with `auth = "connection_string"`).
    #[cfg_attr(test, schemars(with = "Option<String>"))]
    pub connection_string: Option<SecretString>,
    /// Where to connect instead of the namespace's own address (a private
    /// endpoint, or `amqp://127.0.0.1:PORT` for a local test broker).
    pub custom_endpoint: Option<Url>,
    /// How long a send waits for more events to join its batch.
    pub linger_ms: Millis,
    /// Largest batch, in bytes; the hub's own limit caps it further.
    pub max_batch_bytes: u64,
    /// Most events in one batch.
    pub max_batch_events: usize,
    /// Events that may wait for a partition's sender before publishers wait to queue.
    pub queue_capacity: usize,
    /// A send that has not been acknowledged by then fails (its requests get 503).
    pub send_timeout_ms: Millis,
    /// How often each worker balances partition ownership with the others.
    pub update_interval_ms: Millis,
    /// An owner that has not renewed its claim for this long loses it.
    pub partition_expiration_ms: Millis,
    /// Events each partition receiver asks for ahead of processing.
    pub prefetch: u32,
    /// This worker's owner id in ownership claims; unset: a new random id per start.
    pub instance_id: Option<String>,
}

impl Default for EventHubsSettings {
    fn default() -> Self {
        Self {
            namespace: None,
            hubs: vec!["deliveries".into()],
            expedited_hubs: Vec::new(),
            auth: EventHubsAuth::ConnectionString,
            connection_string: None,
            custom_endpoint: None,
            linger_ms: Millis::new(5),
            max_batch_bytes: 1_000_000,
            max_batch_events: 1_000,
            queue_capacity: 16_384,
            send_timeout_ms: Millis::new(10_000),
            update_interval_ms: Millis::new(10_000),
            partition_expiration_ms: Millis::new(60_000),
            prefetch: 300,
            instance_id: None,
        }
    }
}

impl EventHubsSettings {
    /// Every hub read, with its lane: `hubs`, then `expedited_hubs`.
    pub fn lane_hubs(&self) -> Vec<(String, Lane)> {
        self.hubs
            .iter()
            .map(|hub| (hub.clone(), Lane::Normal))
            .chain(
                self.expedited_hubs
                    .iter()
                    .map(|hub| (hub.clone(), Lane::Expedited)),
            )
            .collect()
    }

    /// Checks the keys of a stream on Event Hubs.
    pub(super) fn validate(&self, checks: &mut Checks<'_>) {
        checks.check(
            (1..=64).contains(&self.hubs.len()),
            "hubs",
            "must list from 1 to 64 event hubs",
        );
        let well_named = |hub: &String| {
            !hub.is_empty()
                && hub.len() <= 256
                && hub
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        };
        checks.check(
            self.hubs.iter().all(well_named),
            "hubs",
            "names must be 1 to 256 letters, digits, '-', '_' or '.'",
        );
        let distinct = self
            .hubs
            .iter()
            .enumerate()
            .all(|(i, hub)| !self.hubs[..i].contains(hub));
        checks.check(distinct, "hubs", "must not list a hub twice");
        checks.check(
            self.expedited_hubs.iter().all(well_named),
            "expedited_hubs",
            "names must be 1 to 256 letters, digits, '-', '_' or '.'",
        );
        let apart =
            self.expedited_hubs.iter().enumerate().all(|(i, hub)| {
                !self.hubs.contains(hub) && !self.expedited_hubs[..i].contains(hub)
            });
        checks.check(
            apart,
            "expedited_hubs",
            "must not list a hub twice or one of eventhubs.hubs: the lane needs partitions of its own",
        );
        match self.auth {
            EventHubsAuth::ConnectionString => self.validate_connection_string(checks),
            EventHubsAuth::Entra => {
                checks.check(
                    self.namespace.is_some(),
                    "namespace",
                    "must be set with eventhubs.auth = \"entra\"",
                );
            }
        }
        if let Some(namespace) = &self.namespace {
            checks.check(
                !namespace.is_empty() && !namespace.contains(['/', ':']),
                "namespace",
                "must be a host name such as NAMESPACE.servicebus.windows.net",
            );
        }
        if let Some(url) = &self.custom_endpoint {
            checks.check(
                matches!(url.scheme(), "amqp" | "amqps" | "sb") && url.host().is_some(),
                "custom_endpoint",
                "must be an amqp://, amqps:// or sb:// URL with a host",
            );
        }
        checks.check(
            self.linger_ms.count() <= 1_000,
            "linger_ms",
            "must be at most 1000",
        );
        checks.check(
            (1_024..=1_048_576).contains(&self.max_batch_bytes),
            "max_batch_bytes",
            "must be from 1024 to 1048576",
        );
        checks.at_least(self.max_batch_events, 1, "max_batch_events");
        checks.at_least(self.queue_capacity, 1, "queue_capacity");
        checks.at_least(self.send_timeout_ms.count(), 100, "send_timeout_ms");
        checks.at_least(self.update_interval_ms.count(), 100, "update_interval_ms");
        checks.check(
            self.partition_expiration_ms > self.update_interval_ms,
            "partition_expiration_ms",
            "must be longer than eventhubs.update_interval_ms, or owners lose partitions between renewals",
        );
        checks.at_least(self.prefetch, 1, "prefetch");
    }

    fn validate_connection_string(&self, checks: &mut Checks<'_>) {
        let Some(secret) = &self.connection_string else {
            checks.fail(
                "connection_string",
                "must be set with eventhubs.auth = \"connection_string\" (or use eventhubs.auth = \"entra\")",
            );
            return;
        };
        match ConnectionString::parse(secret.expose_secret()) {
            Ok(parsed) => {
                if let Some(entity) = &parsed.entity_path {
                    checks.check(
                        self.hubs.len() == 1
                            && &self.hubs[0] == entity
                            && self.expedited_hubs.is_empty(),
                        "connection_string",
                        "names one event hub (EntityPath) but eventhubs.hubs or eventhubs.expedited_hubs lists others; use a namespace-level key",
                    );
                }
            }
            Err(e) => checks.fail("connection_string", e.to_string()),
        }
    }
}
