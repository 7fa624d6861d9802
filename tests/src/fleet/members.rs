//! The fleet: the shared servers (Cosmos DB emulator, the stream's broker,
//! the simulated services, a callback receiver), and gateways and workers as
//! processes of the real binaries, each with its own name, any of which can
//! be SIGKILLed or SIGTERMed and replaced.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use crate::kafka::Broker;
use crate::webhooks::{Behaviour, Receiver};
use crate::{metric_lines, metric_sum};
use skyport_azure::cosmos::emulator::server::{STATS_PATH, ServedStats};
use tokio::process::Child;

use super::servers::{Server, announced, process};
use super::shape::{Endpoints, Role, Shape, Stream, overrides};

/// Kafka's topic and partitions (`ci/kafka-values.yaml` assumes 6), and
/// Event Hubs' hubs of 4 partitions each (`ci/azure-values.yaml`).
const TOPIC: &str = "deliveries";
pub const KAFKA_PARTITIONS: u32 = 6;
pub const HUBS: [&str; 2] = ["deliveries-0", "deliveries-1"];
pub const HUB_PARTITIONS: u32 = 4;
/// The callbacks' change-feed leases: one per feed range of the status
/// container, which the emulator creates with 4 physical partitions.
pub const LEASES: usize = 4;
/// The series of the callbacks' change-feed processor's leases.
const CALLBACK_LEASES: &str = "skyport_change_feed_leases_owned{processor=\"skyport-callbacks\"}";

/// How a fleet starts.
#[derive(Debug, Clone)]
pub struct Options {
    pub gateways: usize,
    pub workers: usize,
    /// The emulator answers 429 past a container's RU/s.
    pub throttling: bool,
    /// RU/s of each container the first process creates.
    pub throughput: u32,
    /// Keys on top of the shape's overrides.
    pub keys: Vec<(&'static str, String)>,
    /// How long each simulated service takes to answer.
    pub service_latency_ms: u64,
}

impl Options {
    pub fn new(gateways: usize, workers: usize) -> Self {
        Self {
            gateways,
            workers,
            throttling: false,
            throughput: 100_000,
            keys: Vec::new(),
            service_latency_ms: 5,
        }
    }
}

/// One process of the fleet.
#[derive(Debug)]
pub struct Member {
    pub name: String,
    /// `http://ADDRESS` of its listener (the gateway's API, or the worker's admin one).
    pub base: String,
    /// `http://ADDRESS` of its probes and `/metrics`: the gateway's internal
    /// listener (`gateway.internal_listen`, as the chart sets it), else `base`.
    pub internal: String,
    child: Child,
    pub log: PathBuf,
}

impl Member {
    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id().unwrap()
    }

    /// SIGKILL: no drain, no goodbye.
    pub async fn kill(mut self) {
        self.child.kill().await.unwrap();
    }

    /// SIGTERM, then waits (at most `within`) for a clean exit.
    pub async fn terminate(mut self, within: Duration) {
        let pid = i32::try_from(self.child.id().unwrap()).unwrap();
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        let exit = tokio::time::timeout(within, self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("{} did not stop within {within:?}", self.name))
            .unwrap();
        assert!(
            exit.success(),
            "{} exited with {exit}; see {}",
            self.name,
            self.log.display()
        );
    }

    /// The sum of the samples of `series` on its `/metrics`.
    pub async fn metric(&self, series: &str) -> f64 {
        metric_sum(&self.internal, series).await
    }

    /// The lines of its `/metrics` that start with `prefix` (a name and the
    /// start of its labels).
    pub async fn series_lines(&self, prefix: &str) -> Vec<String> {
        metric_lines(&self.internal, prefix).await
    }

    /// How many series `prefix` (a name and the start of its labels) it exposes.
    pub async fn series(&self, prefix: &str) -> usize {
        self.series_lines(prefix).await.len()
    }
}

/// The stream's broker.
#[derive(Debug)]
enum StreamBroker {
    /// tansu, a process of its own, which the processes reach directly.
    Kafka(Broker),
    /// The Event Hubs test broker, a process of its own.
    EventHubs(Server),
}

/// A running fleet; its processes stop when it is dropped.
#[derive(Debug)]
pub struct Fleet {
    pub stream: Stream,
    pub dir: Logs,
    shape: Shape,
    keys: BTreeMap<String, String>,
    pub cosmos: Server,
    broker: StreamBroker,
    pub simulator: Member,
    pub receiver: Receiver,
    pub gateways: Vec<Member>,
    pub workers: Vec<Member>,
    /// The gateways' addresses, as a load balancer sees them.
    pub pool: Pool,
    started: usize,
}

/// The gateways' base URLs, updated as they come and go.
pub type Pool = Arc<RwLock<Vec<String>>>;

impl Fleet {
    pub async fn start(stream: Stream, options: &Options) -> Self {
        let dir = Logs(tempfile::tempdir().unwrap());
        let shape = Shape::render(stream, dir.path()).await;
        let mut cosmos_role = vec!["cosmos"];
        if options.throttling {
            cosmos_role.push("--throttling");
        }
        let cosmos = Server::start(&cosmos_role).await;
        let (broker, stream_address) = match stream {
            Stream::Kafka => {
                let broker = Broker::start_direct(&[TOPIC], KAFKA_PARTITIONS).await;
                let address = broker.address.clone();
                (StreamBroker::Kafka(broker), address)
            }
            Stream::EventHubs => {
                let hubs: Vec<String> = HUBS
                    .iter()
                    .map(|hub| format!("{hub}:{HUB_PARTITIONS}"))
                    .collect();
                let mut role = vec!["eventhubs"];
                role.extend(hubs.iter().map(String::as_str));
                let server = Server::start(&role).await;
                let address = server.address.clone();
                (StreamBroker::EventHubs(server), address)
            }
        };
        let simulator = simulator(dir.path(), options.service_latency_ms).await;
        let endpoints = Endpoints {
            cosmos: cosmos.address.clone(),
            stream: stream_address,
            services: simulator.base.clone(),
        };
        let mut keys = overrides(stream, &endpoints);
        keys.insert("cosmos.throughput".into(), options.throughput.to_string());
        keys.extend(
            options
                .keys
                .iter()
                .map(|(k, v)| ((*k).to_owned(), v.clone())),
        );
        let receiver = Receiver::start([127, 0, 0, 1].into(), Behaviour::Accept).await;
        let mut fleet = Self {
            stream,
            dir,
            shape,
            keys,
            cosmos,
            broker,
            simulator,
            receiver,
            gateways: Vec::new(),
            workers: Vec::new(),
            pool: Pool::default(),
            started: 0,
        };
        // The first process provisions the database and containers alone.
        fleet.add(Role::Gateway).await;
        for _ in 1..options.gateways {
            fleet.add(Role::Gateway).await;
        }
        for _ in 0..options.workers {
            fleet.add(Role::Worker).await;
        }
        fleet
    }

    /// Partitions of the stream in all.
    pub fn partitions(&self) -> usize {
        match self.stream {
            Stream::Kafka => KAFKA_PARTITIONS as usize,
            Stream::EventHubs => HUBS.len() * HUB_PARTITIONS as usize,
        }
    }

    /// Starts one more process in `role`, named as its StatefulSet or
    /// Deployment would name it, and waits until it is ready.
    pub async fn add(&mut self, role: Role) -> &Member {
        let name = match role {
            Role::Gateway => format!("skyport-gateway-{}", self.started),
            Role::Worker => format!("skyport-worker-{}", self.started),
        };
        self.add_named(role, name).await
    }

    /// Starts process `name` in `role` (a StatefulSet's replacement has its
    /// predecessor's name) and waits until it is ready.
    pub async fn add_named(&mut self, role: Role, name: String) -> &Member {
        self.started += 1;
        let mut keys = self.keys.clone();
        if self.stream == Stream::Kafka && role == Role::Worker {
            // The kafka shape's workers are a Deployment, whose pods the chart does not name.
            keys.insert("change_feed.instance_name".into(), name.clone());
        }
        // The chart puts the gateway's probes and metrics on a port of their
        // own, 9090 in every pod; here each gateway binds one the system
        // picks and logs it.
        if role == Role::Gateway {
            keys.insert("gateway.internal_listen".into(), "127.0.0.1:0".into());
        }
        let args = self.shape.args(role, &name, &keys);
        let member = spawn(role, &name, &args, self.dir.path()).await;
        wait_ready(&member).await;
        if role == Role::Gateway {
            refuses_without_credentials(&member).await;
        }
        match role {
            Role::Gateway => {
                self.pool.write().unwrap().push(member.base.clone());
                self.gateways.push(member);
                self.gateways.last().unwrap()
            }
            Role::Worker => {
                self.workers.push(member);
                self.workers.last().unwrap()
            }
        }
    }

    /// Stream partitions each worker reads now.
    pub async fn partitions_by_worker(&self) -> Vec<usize> {
        let mut counts = Vec::new();
        for worker in &self.workers {
            counts.push(worker.series("skyport_events_in_flight{").await);
        }
        counts
    }

    /// Change-feed leases each worker owns now.
    pub async fn leases_by_worker(&self) -> Vec<usize> {
        let mut counts = Vec::new();
        for worker in &self.workers {
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            counts.push(worker.metric(CALLBACK_LEASES).await as usize);
        }
        counts
    }

    /// The sum of `series` over the workers running now.
    pub async fn workers_metric(&self, series: &str) -> f64 {
        let mut sum = 0.0;
        for worker in &self.workers {
            sum += worker.metric(series).await;
        }
        sum
    }

    /// Waits until every partition and every lease has an owner among the
    /// running workers, spread within one of even; how long it took.
    pub async fn wait_spread(&self, within: Duration) -> Duration {
        let started = Instant::now();
        let leases_total = LEASES;
        loop {
            let partitions = self.partitions_by_worker().await;
            let leases = self.leases_by_worker().await;
            if even(&partitions, self.partitions()) && even(&leases, leases_total) {
                return started.elapsed();
            }
            if started.elapsed() >= within {
                self.print_ownership().await;
                panic!(
                    "not spread after {within:?}: partitions {partitions:?} of {}, leases {leases:?} of {leases_total}",
                    self.partitions()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Prints, for each worker, the partitions it reads now and the last
    /// lines of its log about owning them: what a spread that never came
    /// needs to be understood from a CI log alone.
    async fn print_ownership(&self) {
        for worker in &self.workers {
            let partitions = worker.series_lines("skyport_events_in_flight{").await;
            println!("{}: reads {partitions:?}", worker.name);
            let log = std::fs::read_to_string(&worker.log).unwrap_or_default();
            let owning: Vec<&str> = log
                .lines()
                .filter(|l| OWNERSHIP_LOGS.iter().any(|m| l.contains(m)))
                .collect();
            for line in &owning[owning.len().saturating_sub(30)..] {
                println!("  {line}");
            }
        }
    }

    /// What reached the Cosmos DB emulator.
    pub async fn emulator_stats(&self) -> ServedStats {
        reqwest::get(format!(
            "{}{}",
            self.cosmos.address.trim_end_matches('/'),
            STATS_PATH
        ))
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
    }

    /// The process ids of the stream's broker and of the Cosmos DB emulator.
    pub fn server_pids(&self) -> (u32, u32) {
        let broker = match &self.broker {
            StreamBroker::Kafka(broker) => broker.pid(),
            StreamBroker::EventHubs(server) => server.pid(),
        };
        (broker, self.cosmos.pid())
    }

    /// Stops every process and server.
    pub async fn stop(self) {
        for member in self.gateways.into_iter().chain(self.workers) {
            member.kill().await;
        }
        self.simulator.kill().await;
        self.receiver.stop().await;
        match self.broker {
            StreamBroker::Kafka(mut broker) => broker.kill(),
            StreamBroker::EventHubs(server) => server.stop().await,
        }
        self.cosmos.stop().await;
    }
}

/// The fleet's directory: the rendered configuration and each process's log.
#[derive(Debug)]
pub struct Logs(tempfile::TempDir);

impl Logs {
    pub fn path(&self) -> &std::path::Path {
        self.0.path()
    }
}

impl Drop for Logs {
    /// A scenario that failed keeps its processes' logs, and says where.
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.disable_cleanup(true);
            eprintln!("the fleet's logs: {}", self.0.path().display());
        }
    }
}

/// Whether `counts` (one per owner) add up to `total` and are within one of each other.
/// What a worker logs as partitions come and go.
const OWNERSHIP_LOGS: [&str; 7] = [
    "taken over",
    "Another processor owns",
    "giving it up",
    "stream failed",
    "restarting it on a new connection",
    "Handing a partition back",
    "Draining in-flight",
];

pub fn even(counts: &[usize], total: usize) -> bool {
    let (min, max) = (counts.iter().min(), counts.iter().max());
    counts.iter().sum::<usize>() == total && matches!((min, max), (Some(a), Some(b)) if b - a <= 1)
}

/// The simulated services, a process of their own, answering in `latency_ms`.
async fn simulator(dir: &std::path::Path, latency_ms: u64) -> Member {
    let binary = super::servers::binary("skyport-simulator");
    let log = dir.join("skyport-simulator.log");
    let mut child = process(binary)
        // Remembering every resource of a scenario (the default forgets
        // past 10,000), so that one created twice is counted as such.
        .args([
            "--listen",
            "127.0.0.1:0",
            "--set",
            &format!("simulator.latency_ms={latency_ms}"),
            "--set",
            "simulator.max_resources=100000",
        ])
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let what = format!("the simulator (see {})", log.display());
    let base = announced(&mut child, "simulated services listening on ", &what).await;
    Member {
        name: "skyport-simulator".into(),
        internal: base.clone(),
        base,
        child,
        log,
    }
}

/// Starts `name` and reads the addresses it listens on from its log: a
/// gateway's API and its internal listener (probes and metrics), a worker's
/// admin listener (both).
async fn spawn(role: Role, name: &str, args: &[String], dir: &std::path::Path) -> Member {
    let log = dir.join(format!("{name}.log"));
    let mut child = process(role.binary())
        .args(args)
        .env("RUST_LOG", "info,skyport_callbacks=debug")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let (message, internal_message) = match role {
        Role::Gateway => (
            "The gateway is listening.",
            "The gateway serves /healthz, /readyz and /metrics there.",
        ),
        Role::Worker => ("The worker serves /healthz", "The worker serves /healthz"),
    };
    let logged = |text: &str, message: &str| {
        text.lines()
            .filter(|l| l.contains(message))
            .find_map(|l| field(l, "address"))
    };
    let started = Instant::now();
    let (address, internal) = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if let (Some(address), Some(internal)) =
            (logged(&text, message), logged(&text, internal_message))
        {
            break (address, internal);
        }
        if let Some(exit) = child.try_wait().unwrap() {
            panic!("{name} exited ({exit}) before listening:\n{text}");
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{name} did not listen within 60 s:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    Member {
        name: name.to_owned(),
        base: format!("http://{address}"),
        internal: format!("http://{internal}"),
        child,
        log,
    }
}

/// The value of the string field `name` of a JSON log line.
fn field(line: &str, name: &str) -> Option<String> {
    let json: serde_json::Value = serde_json::from_str(line).ok()?;
    json["fields"][name].as_str().map(str::to_owned)
}

/// Waits until `member` answers `/readyz` with 200.
async fn wait_ready(member: &Member) {
    let started = Instant::now();
    loop {
        if let Ok(response) = reqwest::get(format!("{}/readyz", member.internal)).await
            && response.status() == 200
        {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{} not ready within 60 s; see {}",
            member.name,
            member.log.display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The gateway `member` runs with the chart's authentication: a request
/// without credentials is refused (the fleet's clients send the API key the
/// chart gives the gateways).
async fn refuses_without_credentials(member: &Member) {
    let response = reqwest::get(format!("{}/api/deliveryrequests", member.base))
        .await
        .unwrap();
    assert_eq!(
        response.status(),
        401,
        "{} answered a request without credentials; see {}",
        member.name,
        member.log.display()
    );
}
