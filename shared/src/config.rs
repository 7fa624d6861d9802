//! Settings for every Skyport process: defaults → optional TOML file →
//! `SKYPORT__SECTION__KEY` environment variables → command-line flags.
//!
//! Every value is checked before anything starts; a bad one is reported with
//! the key that holds it and the process exits with code 64 (`EX_USAGE`).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use jsonwebtoken::{Algorithm, DecodingKey};
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Deserializer};
use url::Url;

use crate::adapters::eventhubs::ConnectionString;

/// The exit code for a configuration error (`EX_USAGE` in sysexits.h).
pub const EXIT_CONFIG: i32 = 64;
/// The prefix of environment variables that set configuration keys.
pub const ENV_PREFIX: &str = "SKYPORT__";

/// Everything a Skyport process can be told.
#[derive(Debug, Clone, Default, Deserialize)]
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
    pub worker: WorkerSettings,
    pub services: ServicesSettings,
    pub simulator: SimulatorSettings,
    pub telemetry: TelemetrySettings,
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// One readable line per event (colours on a terminal).
    Human,
    /// One JSON object per line, for a log pipeline.
    Json,
}

/// Logs; traces are switched on by the standard `OTEL_*` variables instead.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TelemetrySettings {
    /// Unset: the profile's (embedded → human, azure → json).
    pub log_format: Option<LogFormat>,
}

/// The HTTP gateway.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GatewaySettings {
    /// Address the gateway listens on.
    pub listen: SocketAddr,
    /// Base of the status URLs handed to clients; when unset, the request's `Host` is used.
    pub public_url: Option<Url>,
    /// Largest request body accepted, in bytes.
    pub max_body_bytes: usize,
    /// Seconds a client is asked to wait before polling a status URL.
    pub retry_after_s: u32,
    /// Key that signs status receipts (at least 32 characters). The embedded store
    /// generates and keeps one when unset; gateways that scale out must share one.
    pub receipt_key: Option<SecretString>,
    /// How long in-flight requests may take to finish after a shutdown signal.
    pub shutdown_grace_period_ms: u64,
    /// How long a client-chosen `deliveryId` or an `Idempotency-Key` is
    /// remembered: a retry within it returns the same delivery.
    pub idempotency_retention_s: u64,
    /// Requests handled at once; one more is refused at once with 503 and
    /// `Retry-After` instead of queueing behind them.
    pub max_in_flight: usize,
    /// Who may call the `/api` routes.
    #[serde(default)]
    pub auth: AuthSettings,
}

impl Default for GatewaySettings {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            public_url: None,
            max_body_bytes: 64 * 1024,
            retry_after_s: 1,
            receipt_key: None,
            shutdown_grace_period_ms: 10_000,
            idempotency_retention_s: 24 * 60 * 60,
            max_in_flight: 4096,
            auth: AuthSettings::default(),
        }
    }
}

impl GatewaySettings {
    pub fn shutdown_grace_period(&self) -> Duration {
        Duration::from_millis(self.shutdown_grace_period_ms)
    }

    pub fn idempotency_retention(&self) -> Duration {
        Duration::from_secs(self.idempotency_retention_s)
    }
}

/// Authentication of the gateway's `/api` routes: API keys, JWT bearer tokens, or both.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthSettings {
    /// Unset: the profile's (embedded → off, azure → on).
    pub enabled: Option<bool>,
    /// API keys by name (the name becomes the caller's principal); sent in `X-API-Key`.
    pub api_keys: BTreeMap<String, ApiKeySettings>,
    /// Bearer tokens (`Authorization: Bearer …`), for example Entra ID access tokens.
    pub jwt: Option<JwtSettings>,
    /// The scope (in `scp`) or app role (in `roles`) a token needs to read status.
    pub read_scope: String,
    /// The scope or app role a token needs to post and cancel delivery requests.
    pub write_scope: String,
}

impl Default for AuthSettings {
    fn default() -> Self {
        Self {
            enabled: None,
            api_keys: BTreeMap::new(),
            jwt: None,
            read_scope: "deliveries.read".into(),
            write_scope: "deliveries.write".into(),
        }
    }
}

/// One API key and what it may do.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiKeySettings {
    /// The key itself (at least 32 characters).
    pub key: SecretString,
    /// Unset: both scopes.
    #[serde(default = "Scope::all")]
    pub scopes: Vec<Scope>,
}

/// What a caller may do with delivery requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
pub enum Scope {
    /// Read status (`GET`).
    #[serde(rename = "deliveries.read")]
    Read,
    /// Post and cancel delivery requests (`POST`, `DELETE`).
    #[serde(rename = "deliveries.write")]
    Write,
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
        })
    }
}

/// How bearer tokens are checked: their issuer, audience and exactly one
/// source of signing keys.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct JwtSettings {
    /// The `iss` tokens must carry (Entra ID: `https://login.microsoftonline.com/TENANT/v2.0`).
    pub issuer: String,
    /// The `aud` tokens must carry (Entra ID: the API's application id URI or client id).
    pub audience: String,
    /// A shared secret for HS256 (at least 32 characters).
    pub hs256_secret: Option<SecretString>,
    /// A public key in PEM: RSA (RS256) or EC on P-256 (ES256).
    pub public_key_pem: Option<PublicKeyPem>,
    /// Where the issuer publishes its signing keys (a JWKS document).
    pub jwks_url: Option<Url>,
    /// How often the JWKS is fetched again.
    pub jwks_refresh_s: u64,
    /// Clock skew allowed when checking `exp` and `nbf`.
    pub leeway_s: u64,
}

impl Default for JwtSettings {
    fn default() -> Self {
        Self {
            issuer: String::new(),
            audience: String::new(),
            hs256_secret: None,
            public_key_pem: None,
            jwks_url: None,
            jwks_refresh_s: 3_600,
            leeway_s: 60,
        }
    }
}

impl JwtSettings {
    pub fn jwks_refresh(&self) -> Duration {
        Duration::from_secs(self.jwks_refresh_s)
    }
}

/// A public key that verifies bearer tokens, parsed from PEM; its kind picks
/// the algorithm.
#[derive(Debug, Clone)]
pub struct PublicKeyPem {
    key: DecodingKey,
    algorithm: Algorithm,
}

/// A `public_key_pem` that cannot verify tokens.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PublicKeyError {
    #[error(
        "must be a public key in PEM (-----BEGIN PUBLIC KEY-----), not a private key or a certificate"
    )]
    NotPublic,
    #[error("is not a readable RSA or EC public key in PEM")]
    Malformed,
    #[error("is an EC key on a curve other than P-256 (only ES256 is supported)")]
    UnsupportedCurve,
}

impl PublicKeyPem {
    /// Reads an RSA (RS256) or P-256 EC (ES256) public key.
    ///
    /// # Errors
    /// [`PublicKeyError`] when `pem` is not one.
    pub fn parse(pem: &str) -> Result<Self, PublicKeyError> {
        let label = pem
            .trim_start()
            .strip_prefix("-----BEGIN ")
            .and_then(|rest| rest.split_once("-----"))
            .map(|(label, _)| label);
        match label {
            Some("PUBLIC KEY" | "RSA PUBLIC KEY") => {}
            Some(_) => return Err(PublicKeyError::NotPublic),
            None => return Err(PublicKeyError::Malformed),
        }
        if let Ok(key) = DecodingKey::from_rsa_pem(pem.as_bytes()) {
            return Ok(Self {
                key,
                algorithm: Algorithm::RS256,
            });
        }
        let key =
            DecodingKey::from_ec_pem(pem.as_bytes()).map_err(|_| PublicKeyError::Malformed)?;
        // An uncompressed SEC1 point on P-256: 0x04, then 32 bytes each of x and y.
        if key.as_bytes().len() != 65 {
            return Err(PublicKeyError::UnsupportedCurve);
        }
        Ok(Self {
            key,
            algorithm: Algorithm::ES256,
        })
    }

    pub fn key(&self) -> &DecodingKey {
        &self.key
    }

    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }
}

impl<'de> Deserialize<'de> for PublicKeyPem {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let pem = String::deserialize(deserializer)?;
        Self::parse(&pem).map_err(serde::de::Error::custom)
    }
}

/// Which event stream carries accepted requests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StreamBackend {
    /// The partitioned log inside the embedded store.
    #[default]
    Embedded,
    /// Azure Event Hubs, sharded over `eventhubs.hubs`.
    EventHubs,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StreamSettings {
    /// Unset: the profile's (embedded → embedded, azure → eventhubs).
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

/// A family of backends: what a setting left unset defaults to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Profile {
    /// Everything on this machine, in the embedded store.
    #[default]
    Embedded,
    /// Azure: status, checkpoints and dead letters in Cosmos DB.
    Azure,
}

/// Which store holds status documents and dead letters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreBackend {
    Embedded,
    Cosmos,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreSettings {
    /// Unset: the profile's (embedded → embedded, azure → cosmos).
    pub backend: Option<StoreBackend>,
}

/// How the Cosmos DB client authenticates.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CosmosAuth {
    /// The account key in `cosmos.key`.
    #[default]
    Key,
    /// An Entra ID credential: workload identity on Kubernetes, managed identity, or developer tools.
    Entra,
}

/// Azure Cosmos DB.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CosmosSettings {
    /// Account endpoint, `https://ACCOUNT.documents.azure.com:443/`.
    pub endpoint: Option<Url>,
    pub auth: CosmosAuth,
    /// The Azure region to route to first (the closest to this process).
    pub region: String,
    /// Account key (with `auth = "key"`).
    pub key: Option<SecretString>,
    pub database: String,
    pub status_container: String,
    pub leases_container: String,
    pub dead_letter_container: String,
    /// Idempotency reservations (partition key `/id`, per-item TTL).
    pub reservations_container: String,
    /// Create the database and containers when missing; when false, fail naming what is missing.
    pub create_if_missing: bool,
    /// Manual RU/s of containers created here; unset: the account's default (serverless or shared).
    pub throughput: Option<u32>,
    /// A partition's queue of status writes is flushed at this many…
    pub bulk_max_items: usize,
    /// …or when its oldest write has waited this long.
    pub bulk_max_wait_ms: u64,
    /// Batches in flight at once.
    pub bulk_max_in_flight: usize,
    /// Wait after a 429 that names no `x-ms-retry-after-ms`.
    pub throttle_retry_ms: u64,
}

impl Default for CosmosSettings {
    fn default() -> Self {
        Self {
            endpoint: None,
            auth: CosmosAuth::Key,
            region: "East US".into(),
            key: None,
            database: "skyport".into(),
            status_container: "status".into(),
            leases_container: "leases".into(),
            dead_letter_container: "deadletters".into(),
            reservations_container: "reservations".into(),
            create_if_missing: true,
            throughput: None,
            bulk_max_items: 100,
            bulk_max_wait_ms: 1_000,
            bulk_max_in_flight: 32,
            throttle_retry_ms: 2_000,
        }
    }
}

impl CosmosSettings {
    pub fn bulk_max_wait(&self) -> Duration {
        Duration::from_millis(self.bulk_max_wait_ms)
    }

    pub fn throttle_retry(&self) -> Duration {
        Duration::from_millis(self.throttle_retry_ms)
    }
}

/// How the Event Hubs clients authenticate.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
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
#[serde(default, deny_unknown_fields)]
pub struct EventHubsSettings {
    /// Fully qualified namespace, `NAMESPACE.servicebus.windows.net`; with a
    /// connection string, its `Endpoint` host when unset.
    pub namespace: Option<String>,
    /// The hubs events are sharded over (hub = hash of the key mod their
    /// number); every gateway and worker must list the same hubs in the same order.
    pub hubs: Vec<String>,
    pub auth: EventHubsAuth,
    /// `Endpoint=sb://…/;SharedAccessKeyName=…;SharedAccessKey=…` (with `auth = "connection_string"`).
    pub connection_string: Option<SecretString>,
    /// Where to connect instead of the namespace's own address (a private
    /// endpoint, or `amqp://127.0.0.1:PORT` for a local test broker).
    pub custom_endpoint: Option<Url>,
    /// How long a send waits for more events to join its batch.
    pub linger_ms: u64,
    /// Largest batch, in bytes; the hub's own limit caps it further.
    pub max_batch_bytes: u64,
    /// Most events in one batch.
    pub max_batch_events: usize,
    /// Events that may wait for a partition's sender before publishers wait to queue.
    pub queue_capacity: usize,
    /// A send that has not been acknowledged by then fails (its requests get 503).
    pub send_timeout_ms: u64,
    /// How often each worker balances partition ownership with the others.
    pub update_interval_ms: u64,
    /// An owner that has not renewed its claim for this long loses it.
    pub partition_expiration_ms: u64,
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
            auth: EventHubsAuth::ConnectionString,
            connection_string: None,
            custom_endpoint: None,
            linger_ms: 5,
            max_batch_bytes: 1_000_000,
            max_batch_events: 1_000,
            queue_capacity: 16_384,
            send_timeout_ms: 10_000,
            update_interval_ms: 10_000,
            partition_expiration_ms: 60_000,
            prefetch: 300,
            instance_id: None,
        }
    }
}

impl EventHubsSettings {
    pub fn linger(&self) -> Duration {
        Duration::from_millis(self.linger_ms)
    }

    pub fn send_timeout(&self) -> Duration {
        Duration::from_millis(self.send_timeout_ms)
    }

    pub fn update_interval(&self) -> Duration {
        Duration::from_millis(self.update_interval_ms)
    }

    pub fn partition_expiration(&self) -> Duration {
        Duration::from_millis(self.partition_expiration_ms)
    }
}

/// The embedded store (stream, status, checkpoints in one file).
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EmbeddedSettings {
    pub data_dir: PathBuf,
    /// Page cache of the database, in MiB.
    pub cache_size_mb: usize,
    /// Most writes committed by one transaction (one fsync).
    pub max_batch: usize,
    /// Writes that may wait for the committer before writers wait to queue.
    pub queue_capacity: usize,
}

impl Default for EmbeddedSettings {
    fn default() -> Self {
        Self {
            data_dir: PathBuf::from("./data"),
            cache_size_mb: 64,
            max_batch: 4096,
            queue_capacity: 65_536,
        }
    }
}

/// The worker that runs the workflow.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WorkerSettings {
    /// Where `skyport-worker` serves `/healthz`, `/readyz` and `/metrics`.
    pub listen: SocketAddr,
    /// Consumer group whose checkpoints this worker keeps.
    pub consumer_group: String,
    /// Events processed at once per partition.
    pub max_in_flight: usize,
    /// How often each partition's checkpoint is written.
    pub checkpoint_interval_ms: u64,
    /// How long in-flight events may take to finish after a shutdown signal.
    pub shutdown_grace_period_ms: u64,
    /// Events started per second by this worker; 0 turns the limit off.
    pub rate_limit_per_s: u32,
    /// Most events pending (pulled, not completed) before intake pauses.
    pub allow_backlog_of: usize,
    /// Oldest age a pending event may reach before intake pauses.
    pub allow_backlog_to_ms: u64,
    /// How long a backlog breach may last before the worker exits to be restarted.
    pub backlog_grace_period_ms: u64,
}

impl Default for WorkerSettings {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 9090)),
            consumer_group: "skyport-worker".into(),
            max_in_flight: 256,
            checkpoint_interval_ms: 5_000,
            shutdown_grace_period_ms: 30_000,
            rate_limit_per_s: 0,
            allow_backlog_of: 320_000,
            allow_backlog_to_ms: 600_000,
            backlog_grace_period_ms: 60_000,
        }
    }
}

impl WorkerSettings {
    pub fn checkpoint_interval(&self) -> Duration {
        Duration::from_millis(self.checkpoint_interval_ms)
    }

    pub fn shutdown_grace_period(&self) -> Duration {
        Duration::from_millis(self.shutdown_grace_period_ms)
    }

    pub fn allow_backlog_to(&self) -> Duration {
        Duration::from_millis(self.allow_backlog_to_ms)
    }

    pub fn backlog_grace_period(&self) -> Duration {
        Duration::from_millis(self.backlog_grace_period_ms)
    }
}

/// The five backend services the workflow calls.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServicesSettings {
    /// Base URL that serves `/account`, `/package`, `/delivery`, `/thirdparty` and `/drone`.
    /// Unset: the all-in-one process starts the simulated services and uses them.
    pub base_url: Option<Url>,
    /// Time limit of one call.
    pub timeout_ms: u64,
    /// First wait before retrying a transient failure; doubles up to `retry_max_backoff_ms`.
    pub retry_initial_backoff_ms: u64,
    pub retry_max_backoff_ms: u64,
    /// Calls a step makes while its circuit lets it, before a transient failure counts as permanent.
    pub max_attempts: u32,
    /// A circuit opens after this many transient failures in a row…
    pub breaker_consecutive_failures: u32,
    /// …or when this percentage of the last `breaker_window` calls failed.
    pub breaker_failure_percent: u32,
    pub breaker_window: usize,
    /// How long an open circuit waits before one probe call.
    pub breaker_open_ms: u64,
}

impl Default for ServicesSettings {
    fn default() -> Self {
        Self {
            base_url: None,
            timeout_ms: 5_000,
            retry_initial_backoff_ms: 50,
            retry_max_backoff_ms: 5_000,
            max_attempts: 10,
            breaker_consecutive_failures: 5,
            breaker_failure_percent: 50,
            breaker_window: 20,
            breaker_open_ms: 2_000,
        }
    }
}

impl ServicesSettings {
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }

    pub fn retry_initial_backoff(&self) -> Duration {
        Duration::from_millis(self.retry_initial_backoff_ms)
    }

    pub fn retry_max_backoff(&self) -> Duration {
        Duration::from_millis(self.retry_max_backoff_ms)
    }

    pub fn breaker_open(&self) -> Duration {
        Duration::from_millis(self.breaker_open_ms)
    }
}

/// The simulated backend services started by the all-in-one process.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SimulatorSettings {
    pub listen: SocketAddr,
    /// Fixed latency of every call.
    pub latency_ms: u64,
    /// Extra latency drawn uniformly from 0 to this.
    pub jitter_ms: u64,
    /// Fraction of calls (0 to 1) answered 503.
    pub error_rate: f64,
    /// Owners whose accounts are suspended.
    pub suspended_owners: Vec<String>,
}

impl Default for SimulatorSettings {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            latency_ms: 10,
            jitter_ms: 10,
            error_rate: 0.0,
            suspended_owners: Vec::new(),
        }
    }
}

/// A setting that cannot be used, named by its key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {message}")]
pub struct ConfigError {
    pub key: String,
    pub message: String,
}

impl ConfigError {
    fn new(key: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            message: message.into(),
        }
    }
}

/// Command-line flags shared by every Skyport binary.
#[derive(Debug, Default, Parser)]
pub struct Cli {
    /// TOML file with settings, in the sections of the README's configuration table.
    #[arg(short, long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Set one key, for example `--set worker.max_in_flight=64` (repeatable; wins over everything).
    #[arg(short, long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Shorthand for `--set gateway.listen=ADDR`.
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// Shorthand for `--set embedded.data_dir=DIR`.
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<String>,
}

impl Settings {
    /// The status store in use: `store.backend`, else the profile's.
    pub fn store_backend(&self) -> StoreBackend {
        self.store.backend.unwrap_or(match self.profile {
            Profile::Embedded => StoreBackend::Embedded,
            Profile::Azure => StoreBackend::Cosmos,
        })
    }

    /// The event stream in use: `stream.backend`, else the profile's.
    pub fn stream_backend(&self) -> StreamBackend {
        self.stream.backend.unwrap_or(match self.profile {
            Profile::Embedded => StreamBackend::Embedded,
            Profile::Azure => StreamBackend::EventHubs,
        })
    }

    /// How log lines are written: `telemetry.log_format`, else the profile's.
    pub fn log_format(&self) -> LogFormat {
        self.telemetry.log_format.unwrap_or(match self.profile {
            Profile::Embedded => LogFormat::Human,
            Profile::Azure => LogFormat::Json,
        })
    }

    /// Whether `/api` requests need credentials: `gateway.auth.enabled`, else the profile's.
    pub fn auth_enabled(&self) -> bool {
        self.gateway.auth.enabled.unwrap_or(match self.profile {
            Profile::Embedded => false,
            Profile::Azure => true,
        })
    }

    /// Loads the layers in order of precedence, taking the environment from `env`.
    ///
    /// # Errors
    /// [`ConfigError`] names the first key that is missing its file, malformed or out of range.
    pub fn load(cli: &Cli) -> Result<Self, Vec<ConfigError>> {
        let mut figment = Figment::new();
        if let Some(path) = &cli.config {
            if !path.is_file() {
                return Err(vec![ConfigError::new(
                    "--config",
                    format!("{} is not a readable file", path.display()),
                )]);
            }
            figment = figment.merge(Toml::file_exact(path));
        }
        figment = figment.merge(Env::prefixed(ENV_PREFIX).split("__"));
        if let Some(listen) = &cli.listen {
            figment = figment.merge(Serialized::default("gateway.listen", listen));
        }
        if let Some(dir) = &cli.data_dir {
            figment = figment.merge(Serialized::default("embedded.data_dir", dir));
        }
        for assignment in &cli.set {
            let Some((key, value)) = assignment.split_once('=') else {
                return Err(vec![ConfigError::new(
                    "--set",
                    format!("`{assignment}` is not KEY=VALUE"),
                )]);
            };
            let value: figment::value::Value = value
                .parse()
                .unwrap_or_else(|never: std::convert::Infallible| match never {});
            figment = figment.merge(Serialized::default(key.trim(), value));
        }
        let settings: Self = figment
            .extract()
            .map_err(|e| e.into_iter().map(describe).collect::<Vec<_>>())?;
        settings.validate().map_err(|e| vec![e])?;
        Ok(settings)
    }

    /// Checks what types alone cannot.
    ///
    /// # Errors
    /// The first key whose value is out of range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let check = |ok: bool, key: &str, message: &str| {
            if ok {
                Ok(())
            } else {
                Err(ConfigError::new(key, message))
            }
        };
        check(
            self.gateway.max_body_bytes >= 1024,
            "gateway.max_body_bytes",
            "must be at least 1024",
        )?;
        check(
            self.gateway.retry_after_s >= 1,
            "gateway.retry_after_s",
            "must be at least 1",
        )?;
        check(
            (60..=30 * 24 * 60 * 60).contains(&self.gateway.idempotency_retention_s),
            "gateway.idempotency_retention_s",
            "must be from 60 (a minute) to 2592000 (30 days)",
        )?;
        check(
            self.gateway.max_in_flight >= 1,
            "gateway.max_in_flight",
            "must be at least 1",
        )?;
        if let Some(key) = &self.gateway.receipt_key {
            check(
                key.expose_secret().len() >= 32,
                "gateway.receipt_key",
                "must be at least 32 characters",
            )?;
        }
        if let Some(url) = &self.gateway.public_url {
            check(
                matches!(url.scheme(), "http" | "https"),
                "gateway.public_url",
                "must be an http or https URL",
            )?;
        }
        check(
            (1..=1024).contains(&self.stream.partitions),
            "stream.partitions",
            "must be from 1 to 1024",
        )?;
        check(
            self.embedded.cache_size_mb >= 1,
            "embedded.cache_size_mb",
            "must be at least 1",
        )?;
        check(
            self.embedded.max_batch >= 1,
            "embedded.max_batch",
            "must be at least 1",
        )?;
        check(
            self.embedded.queue_capacity >= 1,
            "embedded.queue_capacity",
            "must be at least 1",
        )?;
        check(
            !self.worker.consumer_group.trim().is_empty(),
            "worker.consumer_group",
            "must not be empty",
        )?;
        check(
            self.worker.max_in_flight >= 1,
            "worker.max_in_flight",
            "must be at least 1",
        )?;
        check(
            self.worker.checkpoint_interval_ms >= 10,
            "worker.checkpoint_interval_ms",
            "must be at least 10",
        )?;
        if let Some(url) = &self.services.base_url {
            check(
                matches!(url.scheme(), "http" | "https"),
                "services.base_url",
                "must be an http or https URL",
            )?;
        }
        if self.store_backend() == StoreBackend::Cosmos {
            check(
                self.cosmos.endpoint.is_some(),
                "cosmos.endpoint",
                "must be set to use Cosmos DB",
            )?;
            if self.cosmos.auth == CosmosAuth::Key {
                check(
                    self.cosmos.key.is_some(),
                    "cosmos.key",
                    "must be set with cosmos.auth = \"key\" (or use cosmos.auth = \"entra\")",
                )?;
            }
        }
        for (key, name) in [
            ("cosmos.database", &self.cosmos.database),
            ("cosmos.status_container", &self.cosmos.status_container),
            ("cosmos.leases_container", &self.cosmos.leases_container),
            (
                "cosmos.dead_letter_container",
                &self.cosmos.dead_letter_container,
            ),
            (
                "cosmos.reservations_container",
                &self.cosmos.reservations_container,
            ),
        ] {
            check(!name.trim().is_empty(), key, "must not be empty")?;
        }
        check(
            self.cosmos.bulk_max_items >= 1,
            "cosmos.bulk_max_items",
            "must be at least 1",
        )?;
        check(
            self.cosmos.bulk_max_in_flight >= 1,
            "cosmos.bulk_max_in_flight",
            "must be at least 1",
        )?;
        if self.stream_backend() == StreamBackend::EventHubs {
            self.validate_eventhubs()?;
            check(
                self.store_backend() == StoreBackend::Embedded
                    || self.gateway.receipt_key.is_some(),
                "gateway.receipt_key",
                "must be set when neither the stream nor the store is embedded (no embedded store keeps one)",
            )?;
        }
        check(
            self.services.timeout_ms >= 1,
            "services.timeout_ms",
            "must be at least 1",
        )?;
        check(
            self.services.retry_initial_backoff_ms >= 1,
            "services.retry_initial_backoff_ms",
            "must be at least 1",
        )?;
        check(
            self.services.retry_max_backoff_ms >= self.services.retry_initial_backoff_ms,
            "services.retry_max_backoff_ms",
            "must be at least services.retry_initial_backoff_ms",
        )?;
        check(
            self.services.max_attempts >= 1,
            "services.max_attempts",
            "must be at least 1",
        )?;
        check(
            self.services.breaker_consecutive_failures >= 1,
            "services.breaker_consecutive_failures",
            "must be at least 1",
        )?;
        check(
            (1..=100).contains(&self.services.breaker_failure_percent),
            "services.breaker_failure_percent",
            "must be from 1 to 100",
        )?;
        check(
            self.services.max_attempts > self.services.breaker_consecutive_failures,
            "services.max_attempts",
            "must be more than services.breaker_consecutive_failures, or a lone call gives up before its circuit can open",
        )?;
        check(
            self.services.breaker_window >= 1,
            "services.breaker_window",
            "must be at least 1",
        )?;
        check(
            self.services.breaker_open_ms >= 1,
            "services.breaker_open_ms",
            "must be at least 1",
        )?;
        check(
            self.worker.allow_backlog_of >= 1,
            "worker.allow_backlog_of",
            "must be at least 1",
        )?;
        check(
            self.worker.allow_backlog_to_ms >= 1,
            "worker.allow_backlog_to_ms",
            "must be at least 1",
        )?;
        check(
            (0.0..=1.0).contains(&self.simulator.error_rate),
            "simulator.error_rate",
            "must be from 0 to 1",
        )?;
        self.validate_auth()
    }

    fn validate_auth(&self) -> Result<(), ConfigError> {
        let auth = &self.gateway.auth;
        let check = |ok: bool, key: &str, message: &str| {
            if ok {
                Ok(())
            } else {
                Err(ConfigError::new(key, message))
            }
        };
        if self.auth_enabled() && auth.api_keys.is_empty() && auth.jwt.is_none() {
            let why = match auth.enabled {
                Some(_) => "auth is on (gateway.auth.enabled = true)",
                None => "auth is on (profile azure)",
            };
            return Err(ConfigError::new(
                "gateway.auth",
                format!(
                    "{why} but neither gateway.auth.api_keys nor gateway.auth.jwt is set; set one, or gateway.auth.enabled = false"
                ),
            ));
        }
        for (name, api_key) in &auth.api_keys {
            let key = api_key.key.expose_secret();
            check(
                key.len() >= 32,
                &format!("gateway.auth.api_keys.{name}.key"),
                "must be at least 32 characters",
            )?;
            if let Some((other, _)) = auth
                .api_keys
                .iter()
                .take_while(|(other, _)| *other != name)
                .find(|(_, other)| other.key.expose_secret() == key)
            {
                return Err(ConfigError::new(
                    format!("gateway.auth.api_keys.{name}.key"),
                    format!(
                        "is the same as gateway.auth.api_keys.{other}.key; each key must be unique"
                    ),
                ));
            }
            check(
                !api_key.scopes.is_empty(),
                &format!("gateway.auth.api_keys.{name}.scopes"),
                "must list deliveries.read, deliveries.write or both",
            )?;
        }
        for (key, scope) in [
            ("gateway.auth.read_scope", &auth.read_scope),
            ("gateway.auth.write_scope", &auth.write_scope),
        ] {
            check(
                !scope.is_empty() && !scope.contains(char::is_whitespace),
                key,
                "must be one scope name, without spaces",
            )?;
        }
        let Some(jwt) = &auth.jwt else {
            return Ok(());
        };
        check(
            !jwt.issuer.trim().is_empty(),
            "gateway.auth.jwt.issuer",
            "must be set to the `iss` tokens carry",
        )?;
        check(
            !jwt.audience.trim().is_empty(),
            "gateway.auth.jwt.audience",
            "must be set to the `aud` tokens carry",
        )?;
        let sources = [
            jwt.hs256_secret.is_some(),
            jwt.public_key_pem.is_some(),
            jwt.jwks_url.is_some(),
        ];
        check(
            sources.iter().filter(|set| **set).count() == 1,
            "gateway.auth.jwt",
            "must set exactly one of hs256_secret, public_key_pem and jwks_url",
        )?;
        if let Some(secret) = &jwt.hs256_secret {
            check(
                secret.expose_secret().len() >= 32,
                "gateway.auth.jwt.hs256_secret",
                "must be at least 32 characters",
            )?;
        }
        if let Some(url) = &jwt.jwks_url {
            check(
                matches!(url.scheme(), "http" | "https") && url.host().is_some(),
                "gateway.auth.jwt.jwks_url",
                "must be an http or https URL with a host",
            )?;
        }
        check(
            jwt.jwks_refresh_s >= 60,
            "gateway.auth.jwt.jwks_refresh_s",
            "must be at least 60",
        )
    }

    fn validate_eventhubs(&self) -> Result<(), ConfigError> {
        let hubs = &self.eventhubs;
        let check = |ok: bool, key: &str, message: &str| {
            if ok {
                Ok(())
            } else {
                Err(ConfigError::new(key, message))
            }
        };
        check(
            (1..=64).contains(&hubs.hubs.len()),
            "eventhubs.hubs",
            "must list from 1 to 64 event hubs",
        )?;
        for (i, hub) in hubs.hubs.iter().enumerate() {
            check(
                !hub.is_empty()
                    && hub.len() <= 256
                    && hub
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')),
                "eventhubs.hubs",
                "names must be 1 to 256 letters, digits, '-', '_' or '.'",
            )?;
            check(
                !hubs.hubs[..i].contains(hub),
                "eventhubs.hubs",
                "must not list a hub twice",
            )?;
        }
        match hubs.auth {
            EventHubsAuth::ConnectionString => {
                let Some(secret) = &hubs.connection_string else {
                    return Err(ConfigError::new(
                        "eventhubs.connection_string",
                        "must be set with eventhubs.auth = \"connection_string\" (or use eventhubs.auth = \"entra\")",
                    ));
                };
                let parsed = ConnectionString::parse(secret.expose_secret())
                    .map_err(|e| ConfigError::new("eventhubs.connection_string", e.to_string()))?;
                if let Some(entity) = &parsed.entity_path {
                    check(
                        hubs.hubs.len() == 1 && &hubs.hubs[0] == entity,
                        "eventhubs.connection_string",
                        "names one event hub (EntityPath) but eventhubs.hubs lists others; use a namespace-level key",
                    )?;
                }
            }
            EventHubsAuth::Entra => check(
                hubs.namespace.is_some(),
                "eventhubs.namespace",
                "must be set with eventhubs.auth = \"entra\"",
            )?,
        }
        if let Some(namespace) = &hubs.namespace {
            check(
                !namespace.is_empty() && !namespace.contains(['/', ':']),
                "eventhubs.namespace",
                "must be a host name such as NAMESPACE.servicebus.windows.net",
            )?;
        }
        if let Some(url) = &hubs.custom_endpoint {
            check(
                matches!(url.scheme(), "amqp" | "amqps" | "sb") && url.host().is_some(),
                "eventhubs.custom_endpoint",
                "must be an amqp://, amqps:// or sb:// URL with a host",
            )?;
        }
        check(
            hubs.linger_ms <= 1_000,
            "eventhubs.linger_ms",
            "must be at most 1000",
        )?;
        check(
            (1_024..=1_048_576).contains(&hubs.max_batch_bytes),
            "eventhubs.max_batch_bytes",
            "must be from 1024 to 1048576",
        )?;
        check(
            hubs.max_batch_events >= 1,
            "eventhubs.max_batch_events",
            "must be at least 1",
        )?;
        check(
            hubs.queue_capacity >= 1,
            "eventhubs.queue_capacity",
            "must be at least 1",
        )?;
        check(
            hubs.send_timeout_ms >= 100,
            "eventhubs.send_timeout_ms",
            "must be at least 100",
        )?;
        check(
            hubs.update_interval_ms >= 100,
            "eventhubs.update_interval_ms",
            "must be at least 100",
        )?;
        check(
            hubs.partition_expiration_ms > hubs.update_interval_ms,
            "eventhubs.partition_expiration_ms",
            "must be longer than eventhubs.update_interval_ms, or owners lose partitions between renewals",
        )?;
        check(
            hubs.prefetch >= 1,
            "eventhubs.prefetch",
            "must be at least 1",
        )
    }

    /// Parses the process's flags and loads the settings, or exits: 0 after
    /// `--help`, [`EXIT_CONFIG`] with a message naming the key on any error.
    pub fn from_args_or_exit(binary: &'static str, about: &'static str) -> Self {
        use clap::{CommandFactory, FromArgMatches};
        let command = Cli::command().name(binary).about(about);
        let cli = command
            .try_get_matches()
            .and_then(|m| Cli::from_arg_matches(&m))
            .unwrap_or_else(|e| {
                let code = if e.use_stderr() { EXIT_CONFIG } else { 0 };
                let _ = e.print();
                std::process::exit(code);
            });
        Self::load(&cli).unwrap_or_else(|errors| {
            for e in errors {
                eprintln!("{binary}: configuration error: {e}");
            }
            std::process::exit(EXIT_CONFIG);
        })
    }
}

/// Names the key of one figment error and where its value came from.
fn describe(error: figment::Error) -> ConfigError {
    let key = if error.path.is_empty() {
        "(top level)".to_owned()
    } else {
        error.path.join(".")
    };
    let message = match &error.metadata {
        Some(source) => match &source.source {
            Some(origin) => format!("{} (from {} {origin})", error.kind, source.name),
            None => format!("{} (from {})", error.kind, source.name),
        },
        None => error.kind.to_string(),
    };
    ConfigError::new(key, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cli(set: &[&str]) -> Cli {
        Cli {
            set: set.iter().map(|s| (*s).to_owned()).collect(),
            ..Cli::default()
        }
    }

    #[test]
    fn defaults_are_valid() {
        Settings::default().validate().expect("defaults validate");
    }

    #[test]
    fn flags_set_nested_keys() {
        let settings = Settings::load(&cli(&["worker.max_in_flight=7", "stream.partitions=4"]))
            .expect("valid");
        assert_eq!(settings.worker.max_in_flight, 7);
        assert_eq!(settings.stream.partitions, 4);
    }

    #[test]
    fn a_wrong_type_names_its_key() {
        let errors = Settings::load(&cli(&["worker.max_in_flight=lots"])).expect_err("invalid");
        assert_eq!(errors[0].key, "worker.max_in_flight");
    }

    #[test]
    fn an_unknown_key_is_named() {
        let errors = Settings::load(&cli(&["worker.max_inflight=7"])).expect_err("invalid");
        assert_eq!(errors[0].key, "worker.max_inflight");
    }

    #[test]
    fn the_azure_profile_streams_through_event_hubs() {
        let errors = Settings::load(&cli(&[
            "profile=azure",
            "cosmos.endpoint=https://a.documents.azure.com:443/",
            "cosmos.key=k",
        ]))
        .expect_err("invalid");
        assert_eq!(errors[0].key, "eventhubs.connection_string");
    }

    #[test]
    fn event_hubs_settings_name_their_key() {
        let base = [
            "stream.backend=eventhubs",
            "eventhubs.connection_string=Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=send;SharedAccessKey=c2VjcmV0",
        ];
        let load = |extra: &[&str]| {
            let mut set = base.to_vec();
            set.extend_from_slice(extra);
            Settings::load(&cli(&set))
        };
        let settings = load(&["eventhubs.hubs=[\"d-0\", \"d-1\"]"]).expect("valid");
        assert_eq!(settings.stream_backend(), StreamBackend::EventHubs);
        assert_eq!(settings.eventhubs.hubs, ["d-0", "d-1"]);
        for (extra, key) in [
            ("eventhubs.hubs=[]", "eventhubs.hubs"),
            ("eventhubs.hubs=[\"a\", \"a\"]", "eventhubs.hubs"),
            ("eventhubs.hubs=[\"a/b\"]", "eventhubs.hubs"),
            (
                "eventhubs.connection_string=Endpoint=sb://x/",
                "eventhubs.connection_string",
            ),
            ("eventhubs.auth=entra", "eventhubs.namespace"),
            (
                "eventhubs.custom_endpoint=http://127.0.0.1:1",
                "eventhubs.custom_endpoint",
            ),
            ("eventhubs.max_batch_bytes=10", "eventhubs.max_batch_bytes"),
            (
                "eventhubs.partition_expiration_ms=100",
                "eventhubs.partition_expiration_ms",
            ),
            ("store.backend=cosmos", "cosmos.endpoint"),
        ] {
            let errors = load(&[extra]).expect_err(extra);
            assert_eq!(errors[0].key, key, "{extra}");
        }
    }

    #[test]
    fn an_unknown_backend_is_named() {
        let errors = Settings::load(&cli(&["stream.backend=carrier-pigeon"])).expect_err("invalid");
        assert_eq!(errors[0].key, "stream.backend");
    }

    #[test]
    fn out_of_range_values_name_their_key() {
        let errors = Settings::load(&cli(&["simulator.error_rate=1.5"])).expect_err("invalid");
        assert_eq!(errors[0].key, "simulator.error_rate");
        let errors = Settings::load(&cli(&["stream.partitions=0"])).expect_err("invalid");
        assert_eq!(errors[0].key, "stream.partitions");
    }

    #[test]
    fn a_file_is_read_and_flags_win_over_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("skyport.toml");
        std::fs::write(
            &path,
            "[worker]\nmax_in_flight = 3\ncheckpoint_interval_ms = 100\n",
        )
        .expect("write");
        let settings = Settings::load(&Cli {
            config: Some(path),
            ..cli(&["worker.max_in_flight=9"])
        })
        .expect("valid");
        assert_eq!(settings.worker.max_in_flight, 9);
        assert_eq!(settings.worker.checkpoint_interval_ms, 100);
    }

    #[test]
    fn a_missing_file_is_reported() {
        let errors = Settings::load(&Cli {
            config: Some("/nonexistent/skyport.toml".into()),
            ..Cli::default()
        })
        .expect_err("missing");
        assert_eq!(errors[0].key, "--config");
    }

    #[test]
    fn attempts_that_run_out_before_the_circuit_opens_are_refused() {
        let errors = Settings::load(&cli(&["services.max_attempts=5"])).expect_err("invalid");
        assert_eq!(errors[0].key, "services.max_attempts");
    }

    #[test]
    fn the_azure_profile_needs_a_cosmos_endpoint_and_key() {
        let errors = Settings::load(&cli(&["profile=azure"])).expect_err("invalid");
        assert_eq!(errors[0].key, "cosmos.endpoint");
        let errors = Settings::load(&cli(&[
            "profile=azure",
            "cosmos.endpoint=https://a.documents.azure.com/",
        ]))
        .expect_err("invalid");
        assert_eq!(errors[0].key, "cosmos.key");
        let settings = Settings::load(&cli(&[
            "profile=azure",
            "cosmos.endpoint=https://a.documents.azure.com/",
            "cosmos.auth=entra",
            "eventhubs.auth=entra",
            "eventhubs.namespace=ns.servicebus.windows.net",
            "gateway.receipt_key=0123456789abcdef0123456789abcdef",
            "gateway.auth.jwt.issuer=https://login.microsoftonline.com/tenant/v2.0",
            "gateway.auth.jwt.audience=api://skyport",
            "gateway.auth.jwt.jwks_url=https://login.microsoftonline.com/tenant/discovery/v2.0/keys",
        ]))
        .expect("valid");
        assert_eq!(settings.store_backend(), StoreBackend::Cosmos);
        assert_eq!(settings.stream_backend(), StreamBackend::EventHubs);
        assert!(settings.auth_enabled());
    }

    #[test]
    fn an_explicit_backend_wins_over_the_profile() {
        let settings = Settings::load(&cli(&[
            "profile=azure",
            "store.backend=embedded",
            "stream.backend=embedded",
            "gateway.auth.enabled=false",
        ]))
        .expect("valid");
        assert_eq!(settings.store_backend(), StoreBackend::Embedded);
        assert_eq!(settings.stream_backend(), StreamBackend::Embedded);
        assert!(!settings.auth_enabled());
    }

    #[test]
    fn a_short_receipt_key_is_refused() {
        let errors = Settings::load(&cli(&["gateway.receipt_key=short"])).expect_err("invalid");
        assert_eq!(errors[0].key, "gateway.receipt_key");
    }

    const KEY_A: &str = "gateway.auth.api_keys.portal.key=aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    const KEY_B: &str = "gateway.auth.api_keys.batch.key=bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
    const RS256_PUBLIC: &str = include_str!("../../tests/fixtures/jwt/rs256-public.pem");
    const ES256_PUBLIC: &str = include_str!("../../tests/fixtures/jwt/es256-public.pem");
    const ES256_PRIVATE: &str = include_str!("../../tests/fixtures/jwt/es256-private.pem");
    const P384_PUBLIC: &str = "-----BEGIN PUBLIC KEY-----
MHYwEAYHKoZIzj0CAQYFK4EEACIDYgAEIO2NbBMfgyRmtKFYk70HzBVnVNxjHLHq
DFpWCLWPNuhfU7GfqqBfYXMjE5voDlIR8UQaj+Li8LvhNHsjfhws31GbYOxOb/Fc
3MFv7FvMXW4LonhiY4fp8YHpKXtY5PZk
-----END PUBLIC KEY-----
";

    #[test]
    fn auth_is_off_in_the_embedded_profile_and_on_in_azure() {
        assert!(!Settings::default().auth_enabled());
        let azure = Settings {
            profile: Profile::Azure,
            ..Settings::default()
        };
        assert!(azure.auth_enabled());
        let settings = Settings::load(&cli(&["gateway.auth.enabled=true", KEY_A])).expect("valid");
        assert!(settings.auth_enabled());
    }

    #[test]
    fn logs_are_human_in_the_embedded_profile_and_json_in_azure() {
        assert_eq!(Settings::default().log_format(), LogFormat::Human);
        let azure = Settings {
            profile: Profile::Azure,
            ..Settings::default()
        };
        assert_eq!(azure.log_format(), LogFormat::Json);
        let settings = Settings::load(&cli(&["telemetry.log_format=json"])).expect("valid");
        assert_eq!(settings.log_format(), LogFormat::Json);
        let errors = Settings::load(&cli(&["telemetry.log_format=xml"])).expect_err("invalid");
        assert_eq!(errors[0].key, "telemetry.log_format");
    }

    #[test]
    fn auth_on_without_credentials_says_what_to_set() {
        let errors = Settings::load(&cli(&[
            "profile=azure",
            "store.backend=embedded",
            "stream.backend=embedded",
        ]))
        .expect_err("invalid");
        assert_eq!(errors[0].key, "gateway.auth");
        assert!(
            errors[0].message.contains("profile azure")
                && errors[0].message.contains("gateway.auth.api_keys")
                && errors[0].message.contains("gateway.auth.jwt")
                && errors[0].message.contains("gateway.auth.enabled = false"),
            "{}",
            errors[0].message
        );
        let errors = Settings::load(&cli(&["gateway.auth.enabled=true"])).expect_err("invalid");
        assert_eq!(errors[0].key, "gateway.auth");
    }

    #[test]
    fn api_keys_may_do_everything_unless_scoped() {
        let settings = Settings::load(&cli(&[
            KEY_A,
            KEY_B,
            "gateway.auth.api_keys.batch.scopes=[\"deliveries.read\"]",
        ]))
        .expect("valid");
        let keys = &settings.gateway.auth.api_keys;
        assert_eq!(keys["portal"].scopes, [Scope::Read, Scope::Write]);
        assert_eq!(keys["batch"].scopes, [Scope::Read]);
        assert_eq!(
            keys["portal"].key.expose_secret(),
            "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
        );
    }

    #[test]
    fn api_key_settings_name_their_key() {
        for (set, key) in [
            (
                vec!["gateway.auth.api_keys.portal.key=short"],
                "gateway.auth.api_keys.portal.key",
            ),
            (
                vec![
                    KEY_A,
                    "gateway.auth.api_keys.copy.key=aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
                ],
                "gateway.auth.api_keys.portal.key",
            ),
            (
                vec![KEY_A, "gateway.auth.api_keys.portal.scopes=[]"],
                "gateway.auth.api_keys.portal.scopes",
            ),
            (
                vec![
                    KEY_A,
                    "gateway.auth.api_keys.portal.scopes=[\"deliveries.admin\"]",
                ],
                "gateway.auth.api_keys.portal.scopes.0",
            ),
            (
                vec![KEY_A, "gateway.auth.write_scope=a b"],
                "gateway.auth.write_scope",
            ),
        ] {
            let errors = Settings::load(&cli(&set)).expect_err(key);
            assert_eq!(errors[0].key, key, "{set:?}");
        }
    }

    #[test]
    fn jwt_settings_name_their_key() {
        let base = [
            "gateway.auth.enabled=true",
            "gateway.auth.jwt.issuer=https://issuer.example",
            "gateway.auth.jwt.audience=skyport",
        ];
        let load = |extra: &[&str]| {
            let mut set = base.to_vec();
            set.extend_from_slice(extra);
            Settings::load(&cli(&set))
        };
        let settings = load(&["gateway.auth.jwt.hs256_secret=0123456789abcdef0123456789abcdef"])
            .expect("valid");
        let jwt = settings.gateway.auth.jwt.expect("jwt");
        assert_eq!((jwt.leeway_s, jwt.jwks_refresh_s), (60, 3_600));
        let rs256 = format!("gateway.auth.jwt.public_key_pem={RS256_PUBLIC}");
        let settings = load(&[&rs256]).expect("valid");
        let key = settings.gateway.auth.jwt.and_then(|jwt| jwt.public_key_pem);
        assert_eq!(key.map(|key| key.algorithm()), Some(Algorithm::RS256));
        let jwks = "gateway.auth.jwt.jwks_url=http://127.0.0.1:1/keys";
        load(&[jwks]).expect("valid");
        let bad_pem = "gateway.auth.jwt.public_key_pem=-----BEGIN PUBLIC KEY-----\nnot a key\n-----END PUBLIC KEY-----";
        for (extra, key) in [
            (vec![], "gateway.auth.jwt"),
            (
                vec![
                    jwks,
                    "gateway.auth.jwt.hs256_secret=0123456789abcdef0123456789abcdef",
                ],
                "gateway.auth.jwt",
            ),
            (
                vec![jwks, "gateway.auth.jwt.issuer="],
                "gateway.auth.jwt.issuer",
            ),
            (
                vec![jwks, "gateway.auth.jwt.audience= "],
                "gateway.auth.jwt.audience",
            ),
            (
                vec!["gateway.auth.jwt.hs256_secret=short"],
                "gateway.auth.jwt.hs256_secret",
            ),
            (vec![bad_pem], "gateway.auth.jwt.public_key_pem"),
            (
                vec!["gateway.auth.jwt.public_key_pem=nonsense"],
                "gateway.auth.jwt.public_key_pem",
            ),
            (
                vec!["gateway.auth.jwt.jwks_url=ftp://keys.example/"],
                "gateway.auth.jwt.jwks_url",
            ),
            (
                vec!["gateway.auth.jwt.jwks_url=not a url"],
                "gateway.auth.jwt.jwks_url",
            ),
            (
                vec![jwks, "gateway.auth.jwt.jwks_refresh_s=5"],
                "gateway.auth.jwt.jwks_refresh_s",
            ),
            (
                vec![jwks, "gateway.auth.jwt.tenant=x"],
                "gateway.auth.jwt.tenant",
            ),
        ] {
            let errors = load(&extra).expect_err(key);
            assert_eq!(errors[0].key, key, "{extra:?}");
        }
    }

    #[test]
    fn a_public_key_picks_its_algorithm() {
        let rs256 = PublicKeyPem::parse(RS256_PUBLIC).expect("RSA");
        assert_eq!(rs256.algorithm(), Algorithm::RS256);
        let es256 = PublicKeyPem::parse(ES256_PUBLIC).expect("P-256");
        assert_eq!(es256.algorithm(), Algorithm::ES256);
        for (pem, error) in [
            (ES256_PRIVATE, PublicKeyError::NotPublic),
            (P384_PUBLIC, PublicKeyError::UnsupportedCurve),
            ("", PublicKeyError::Malformed),
            (
                "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n",
                PublicKeyError::Malformed,
            ),
        ] {
            assert_eq!(PublicKeyPem::parse(pem).expect_err(pem), error);
        }
    }
}
