//! What the Helm chart renders for its `azure` and `kafka` shapes
//! (`helm/skyport/ci/*-values.yaml`), turned into each process's arguments:
//! the configuration file its workload reads (the gateway's `skyport.toml`,
//! the worker's `worker.toml`) as `--config`, the `SKYPORT__…` variables its
//! pod gets as `--set` (its name where the pod's name goes, the values of a
//! Secret the test holds: each role only the secrets the chart gives it), and
//! then the overrides that cannot hold on one machine ([`overrides`]), which
//! the README lists.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::helm::{self, Rendering};
use serde_json::Value;

/// The stream a shape runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    /// `ci/kafka-values.yaml`: Kafka (tansu here), status on Cosmos DB.
    Kafka,
    /// `ci/azure-values.yaml`: Event Hubs over two hubs (the test broker here), status on Cosmos DB.
    EventHubs,
}

impl Stream {
    pub fn name(self) -> &'static str {
        match self {
            Self::Kafka => "kafka",
            Self::EventHubs => "eventhubs",
        }
    }
}

/// The values of the Secret `skyport-secrets` the test installs.
pub const RECEIPT_KEY: &str = "receipt-key-fleet-0f1e2d3c4b5a69788796a5b4c3d2e1f0";
pub const API_KEY: &str = "sk-fleet-portal-7f3a9c1e5b2d4f60a8e7c9b1d3f5a7e9";
pub const CALLBACK_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const TRACKER_KEY: &str = "sk-fleet-tracker-0a1b2c3d4e5f60718293a4b5c6d7e8f9";

/// The timings shortened so that the scenarios take seconds, not minutes
/// (the chart's values keep the production ones): named in the README. The
/// lease and ownership expiries leave 9 s for a renewal: every lease lives in
/// the one emulator, which copies a container's items for each change-feed
/// read and under load can answer a renewal seconds late.
pub const LEASE_EXPIRY_MS: u64 = 10_000;
pub const KAFKA_SESSION_TIMEOUT_MS: u64 = 24_000;
/// Longer than the default (10 s): a worker that loses partitions to workers
/// joining drains what it has in flight on them (128 each) and commits it
/// first, while its kept partitions go on and three workers, the broker and
/// the emulator share two cores; 5 s did not cover 4 partitions' on a slow
/// machine, and 10 s covered 2 of 4 in one CI run (261 handled twice). It
/// must stay below the session timeout.
pub const KAFKA_DRAIN_TIMEOUT_MS: u64 = 20_000;
pub const OWNERSHIP_EXPIRY_MS: u64 = 10_000;
/// Not shortened: a global group's renewal and expiry are at their minimums
/// (`cosmos.throughput_control.renew_interval_ms` 5 s, expiry 11 s).
pub const THROUGHPUT_EXPIRY_MS: u64 = 11_000;

/// The two kinds of process the chart installs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Gateway,
    Worker,
}

impl Role {
    /// The process's binary, named as the chart's workload.
    pub fn binary(self) -> PathBuf {
        super::servers::binary(self.workload())
    }

    fn workload(self) -> &'static str {
        match self {
            Self::Gateway => "skyport-gateway",
            Self::Worker => "skyport-worker",
        }
    }
}

/// One shape, rendered: each workload's container and the config file it reads.
#[derive(Debug)]
pub struct Shape {
    gateway_config: PathBuf,
    worker_config: PathBuf,
    rendering: Rendering,
}

impl Shape {
    /// Renders the chart with the shape's CI values into `dir`.
    pub async fn render(stream: Stream, dir: &Path) -> Self {
        let values = match stream {
            Stream::Kafka => helm::kafka_values(),
            Stream::EventHubs => helm::azure_values(),
        };
        let rendering = helm::render_unvalidated(&[&values], &[], dir).await;
        let shape = Self {
            gateway_config: dir.join("gateway.toml"),
            worker_config: dir.join("worker.toml"),
            rendering,
        };
        for role in [Role::Gateway, Role::Worker] {
            let text = shape.rendering.config_of(shape.workload(role)).to_owned();
            std::fs::write(shape.config(role), text).unwrap();
        }
        shape
    }

    fn workload(&self, role: Role) -> &Value {
        self.rendering
            .workloads()
            .into_iter()
            .find(|w| helm::name(w) == role.workload())
            .unwrap_or_else(|| panic!("the rendering has no workload {}", role.workload()))
    }

    fn config(&self, role: Role) -> &Path {
        match role {
            Role::Gateway => &self.gateway_config,
            Role::Worker => &self.worker_config,
        }
    }

    /// The arguments of process `name` in `role`: the rendered configuration,
    /// what its pod's environment sets, then `overrides` (later ones win).
    pub fn args(
        &self,
        role: Role,
        name: &str,
        overrides: &BTreeMap<String, String>,
    ) -> Vec<String> {
        let mut set = BTreeMap::new();
        for env in helm::container(self.workload(role))["env"]
            .as_array()
            .unwrap()
        {
            let Some(key) = env["name"].as_str().unwrap().strip_prefix("SKYPORT__") else {
                continue;
            };
            let key = key.split("__").collect::<Vec<_>>().join(".").to_lowercase();
            if let Some(value) = pod_value(env, name) {
                set.insert(key, value);
            }
        }
        set.extend(overrides.iter().map(|(k, v)| (k.clone(), v.clone())));
        let mut args = vec![
            "--config".to_owned(),
            self.config(role).to_str().unwrap().to_owned(),
        ];
        for (key, value) in set {
            args.push("--set".to_owned());
            args.push(format!("{key}={value}"));
        }
        args
    }
}

/// What the variable `env` holds in pod `pod`: a literal, the pod's name, or
/// a key of the Secret the test installs (`None` for an optional key it lacks).
fn pod_value(env: &Value, pod: &str) -> Option<String> {
    if let Some(value) = env.get("value") {
        return Some(value.as_str().unwrap().to_owned());
    }
    let from = &env["valueFrom"];
    if from.get("fieldRef").is_some() {
        return Some(pod.to_owned());
    }
    let reference = &from["secretKeyRef"];
    assert_eq!(reference["name"], "skyport-secrets", "{env}");
    let value = match reference["key"].as_str().unwrap() {
        "receipt-keys" => format!("[\"{RECEIPT_KEY}\"]"),
        "api-key-portal" => API_KEY.to_owned(),
        "api-key-tracker" => TRACKER_KEY.to_owned(),
        "callback-secrets" => format!("[\"{CALLBACK_SECRET}\"]"),
        "cosmos-key" => skyport_azure::cosmos::emulator::Emulator::key().to_owned(),
        "eventhubs-connection-string" => format!(
            "\"Endpoint=sb://skyport-prod.servicebus.windows.net/;SharedAccessKeyName=fleet;SharedAccessKey={}\"",
            "ZmxlZXQtdGVzdC1rZXk="
        ),
        _ if reference["optional"] == true => return None,
        key => panic!("the pods need the secret {key}, which the fleet does not hold"),
    };
    Some(value)
}

/// Where the shared servers are.
#[derive(Debug, Clone)]
pub struct Endpoints {
    /// `http://127.0.0.1:PORT/`: the Cosmos DB emulator's one region.
    pub cosmos: String,
    /// `127.0.0.1:PORT` of tansu, or `amqp://127.0.0.1:PORT` of the Event Hubs broker.
    pub stream: String,
    /// The simulated services' base URL.
    pub services: String,
}

/// The callbacks' change-feed processor's timings, shortened.
pub fn change_feed_timings() -> [(&'static str, String); 4] {
    [
        ("change_feed.acquire_interval_ms", "500".to_owned()),
        ("change_feed.renew_interval_ms", "1000".to_owned()),
        ("change_feed.expiry_ms", LEASE_EXPIRY_MS.to_string()),
        // The emulator copies a container's items to read its change feed: every
        // second, not every 100 ms, keeps it from taking the fleet's CPU.
        ("change_feed.poll_interval_ms", "1000".to_owned()),
    ]
}

/// The keys that cannot hold on one machine, and the timings shortened, for
/// `stream`: what every process gets on top of the chart's rendering.
pub fn overrides(stream: Stream, endpoints: &Endpoints) -> BTreeMap<String, String> {
    let mut keys: BTreeMap<String, String> = [
        // Port 0: the fleet's processes share one machine.
        ("gateway.listen", "127.0.0.1:0".to_owned()),
        ("worker.listen", "127.0.0.1:0".to_owned()),
        // Key auth instead of Entra (the emulator takes any key), on its local endpoint.
        ("cosmos.auth", "key".to_owned()),
        ("cosmos.endpoint", endpoints.cosmos.clone()),
        ("cosmos.region", "\"East US\"".to_owned()),
        ("cosmos.create_if_missing", "true".to_owned()),
        ("services.base_url", endpoints.services.clone()),
        // The callback receiver is on 127.0.0.1, not the cluster's pod network.
        ("callbacks.allow", "[\"127.0.0.0/8\"]".to_owned()),
        // A raised offer reaches the groups' budgets within a second (not 15 minutes).
        (
            "cosmos.throughput_control.offer_refresh_interval_ms",
            "1000".to_owned(),
        ),
    ]
    .into_iter()
    .chain(change_feed_timings())
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    match stream {
        Stream::Kafka => {
            // tansu has no TLS listener.
            keys.insert(
                "kafka.brokers".into(),
                format!("[\"{}\"]", endpoints.stream),
            );
            keys.insert("kafka.security".into(), "plaintext".into());
            keys.insert(
                "kafka.session_timeout_ms".into(),
                KAFKA_SESSION_TIMEOUT_MS.to_string(),
            );
            keys.insert(
                "kafka.drain_timeout_ms".into(),
                KAFKA_DRAIN_TIMEOUT_MS.to_string(),
            );
        }
        Stream::EventHubs => {
            // A SAS connection string instead of Entra (the broker takes any token), to the local broker.
            keys.insert("eventhubs.auth".into(), "connection_string".into());
            keys.insert("eventhubs.custom_endpoint".into(), endpoints.stream.clone());
            keys.insert("eventhubs.update_interval_ms".into(), "1000".into());
            keys.insert(
                "eventhubs.partition_expiration_ms".into(),
                OWNERSHIP_EXPIRY_MS.to_string(),
            );
        }
    }
    keys
}
