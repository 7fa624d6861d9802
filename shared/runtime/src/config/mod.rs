//! Settings for every Skyport process: defaults → optional TOML file →
//! `SKYPORT__SECTION__KEY` environment variables → command-line flags
//! ([`load`]).
//!
//! One file per section; each section checks its own keys into one
//! [`Checks`] collector, so a start that fails names every bad key at once,
//! and the process exits with code 64 (`EX_USAGE`). What depends on more than
//! one section (the profile's defaults, what the chosen backends require) is
//! decided here.

mod auth;
mod callbacks;
mod change_feed;
mod checks;
mod connection_string;
mod cosmos;
mod duration;
mod embedded;
mod eventhubs;
mod gateway;
mod http;
mod kafka;
mod load;
mod profile;
#[cfg(test)]
mod reference;
mod services;
mod simulator;
mod store;
mod stream;
mod telemetry;
#[cfg(test)]
mod tests;
mod throughput;
mod worker;

use serde::Deserialize;

pub use self::auth::{ApiKeySettings, AuthSettings, JwtSettings, Scope, is_key_name};
pub use self::callbacks::{CallbackSettings, SECRET_PREFIX, decode_secret};
pub use self::change_feed::ChangeFeedSettings;
pub use self::checks::{Checks, ConfigError, ConfigErrors};
pub use self::connection_string::{ConnectionString, ConnectionStringError};
pub use self::cosmos::{CosmosAuth, CosmosSettings};
pub use self::duration::{Millis, Seconds};
pub use self::embedded::EmbeddedSettings;
pub use self::eventhubs::{EventHubsAuth, EventHubsSettings};
pub use self::gateway::{ClientQuota, GatewaySettings, QuotaSettings};
pub use self::http::HttpSettings;
pub use self::kafka::{
    KafkaAuth, KafkaSaslMechanism, KafkaSecurity, KafkaSettings, MANAGED_PROPERTIES,
};
pub use self::load::{Cli, ENV_PREFIX, EXIT_CONFIG};
pub use self::profile::Profile;
pub use self::services::{ServicesProtocol, ServicesSettings};
pub use self::simulator::SimulatorSettings;
pub use self::store::{StoreBackend, StoreSettings};
pub use self::stream::{MAX_PARTITIONS, StreamBackend, StreamSettings};
pub use self::telemetry::{LogFormat, TelemetrySettings};
pub use self::throughput::{
    GlobalControlSettings, GroupScope, MIN_RENEW_INTERVAL_MS, OnInitError, Priority,
    ThroughputGroupSettings, Work,
};
pub use self::worker::WorkerSettings;

/// Everything a Skyport process can be told.
#[derive(Debug, Clone, Default, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// Which family of backends the defaults come from.
    pub profile: Profile,
    pub gateway: GatewaySettings,
    pub stream: StreamSettings,
    pub store: StoreSettings,
    pub embedded: EmbeddedSettings,
    pub cosmos: CosmosSettings,
    pub eventhubs: EventHubsSettings,
    pub kafka: KafkaSettings,
    pub worker: WorkerSettings,
    pub services: ServicesSettings,
    pub simulator: SimulatorSettings,
    pub telemetry: TelemetrySettings,
    pub change_feed: ChangeFeedSettings,
    pub callbacks: CallbackSettings,
}

impl Settings {
    /// The status store in use: `store.backend`, else the profile's.
    pub fn store_backend(&self) -> StoreBackend {
        self.store.backend.unwrap_or(match self.profile {
            Profile::Embedded => StoreBackend::Embedded,
            Profile::Azure => StoreBackend::Cosmos,
            Profile::Kafka => StoreBackend::Embedded,
        })
    }

    /// The event stream in use: `stream.backend`, else the profile's.
    pub fn stream_backend(&self) -> StreamBackend {
        self.stream.backend.unwrap_or(match self.profile {
            Profile::Embedded => StreamBackend::Embedded,
            Profile::Azure => StreamBackend::EventHubs,
            Profile::Kafka => StreamBackend::Kafka,
        })
    }

    /// How log lines are written: `telemetry.log_format`, else the profile's.
    pub fn log_format(&self) -> LogFormat {
        self.telemetry.log_format.unwrap_or(match self.profile {
            Profile::Embedded => LogFormat::Human,
            Profile::Azure | Profile::Kafka => LogFormat::Json,
        })
    }

    /// Whether `/api` requests need credentials: `gateway.auth.enabled`, else the profile's.
    pub fn auth_enabled(&self) -> bool {
        self.gateway.auth.enabled.unwrap_or(match self.profile {
            Profile::Embedded => false,
            Profile::Azure | Profile::Kafka => true,
        })
    }

    /// What a process that serves the gateway needs beyond [`Settings::validate`]:
    /// a key that signs receipts (`skyport-worker` signs none, so it needs none).
    ///
    /// # Errors
    /// The key that must be set.
    pub fn check_gateway(&self) -> Result<(), ConfigError> {
        let embedded = self.stream_backend() == StreamBackend::Embedded
            || self.store_backend() == StoreBackend::Embedded;
        if embedded || !self.gateway.receipt_keys.is_empty() {
            Ok(())
        } else {
            Err(ConfigError::new(
                "gateway.receipt_keys",
                "must be set when neither the stream nor the store is embedded (no embedded store keeps a key)",
            ))
        }
    }

    /// `[gateway]` with what the profile and the other sections decide
    /// filled in: whether it serves `/dashboard` (`gateway.dashboard`, else
    /// the profile's), and when a delivery with no status document is gone.
    pub fn gateway_settings(&self) -> GatewaySettings {
        GatewaySettings {
            dashboard: Some(
                self.gateway
                    .dashboard
                    .unwrap_or(self.dashboard_by_profile()),
            ),
            status_gone_after: Some(
                self.store.status_retention_s.duration()
                    + self.worker.allow_backlog_to_ms.duration(),
            ),
            ..self.gateway.clone()
        }
    }

    /// Whether the worker's admin listener serves `/dashboard`: `worker.dashboard`, else the profile's.
    pub fn worker_dashboard(&self) -> bool {
        self.worker.dashboard.unwrap_or(self.dashboard_by_profile())
    }

    /// On a single machine or beside Kafka the page is on; on Azure, where
    /// the gateway faces the internet, an operator turns it on.
    fn dashboard_by_profile(&self) -> bool {
        match self.profile {
            Profile::Embedded | Profile::Kafka => true,
            Profile::Azure => false,
        }
    }

    /// Whether callbacks are on: `callbacks.enabled`, else whether there is
    /// a secret to sign them with (configured, or kept by the embedded
    /// store). A gateway needs no secret: `callbacks.enabled = true` alone
    /// makes it take callback URLs.
    pub fn callbacks_enabled(&self) -> bool {
        self.callbacks.enabled.unwrap_or(
            !self.callbacks.secrets.is_empty() || self.store_backend() == StoreBackend::Embedded,
        )
    }

    /// Checks what types alone cannot, section by section.
    ///
    /// # Errors
    /// Every key whose value is out of range, in the order of the sections.
    pub fn validate(&self) -> Result<(), ConfigErrors> {
        let mut errors = Vec::new();
        let mut checks = Checks::new(&mut errors);
        self.gateway
            .validate(&mut checks.section("gateway"), self.auth_enabled());
        self.stream.validate(&mut checks.section("stream"));
        self.store.validate(
            &mut checks.section("store"),
            self.gateway.idempotency_retention_s,
        );
        self.embedded.validate(&mut checks.section("embedded"));
        self.cosmos.validate(
            &mut checks.section("cosmos"),
            self.store_backend() == StoreBackend::Cosmos,
        );
        match self.stream_backend() {
            StreamBackend::Embedded => {}
            StreamBackend::EventHubs => self.eventhubs.validate(&mut checks.section("eventhubs")),
            StreamBackend::Kafka => self.kafka.validate(&mut checks.section("kafka")),
        }
        checks.check(
            u128::from(self.gateway.idempotency_retention_s.count()) * 1000
                >= u128::from(self.worker.allow_backlog_to_ms.count()),
            "gateway.idempotency_retention_s",
            format!(
                "must be at least worker.allow_backlog_to_ms ({} ms): a client-chosen id stays \
                 reserved until its delivery has a status, which a worker writes within that",
                self.worker.allow_backlog_to_ms.count()
            ),
        );
        self.worker.validate(&mut checks.section("worker"));
        self.services.validate(&mut checks.section("services"));
        self.simulator.validate(&mut checks.section("simulator"));
        self.change_feed
            .validate(&mut checks.section("change_feed"));
        // No secret is required here: a gateway takes callback URLs without
        // one; the process that signs them checks at its start.
        self.callbacks.validate(&mut checks.section("callbacks"));
        if errors.is_empty() {
            Ok(())
        } else {
            Err(ConfigErrors(errors))
        }
    }
}
