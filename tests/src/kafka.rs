//! A real Kafka-compatible broker for the Kafka tests: tansu 0.6.0 on its
//! memory engine (`tools::tansu`), on 127.0.0.1 and a free port, with the
//! topics a test asks for; stopped (killed) when dropped.
//!
//! Clients reach it through a TCP relay of the test's own (the address the
//! broker advertises), which a test can cut to make the broker unreachable
//! for a while without losing what it holds (the memory engine keeps
//! nothing across a restart), and which can serve TLS in front of the
//! broker's plain listener (tansu 0.6 has no TLS listener of its own). A
//! benchmark starts it without the relay ([`Broker::start_direct`]), so that
//! no byte of the stream is copied by the process it measures.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use skyport_runtime::config::{KafkaSettings, Settings, StreamBackend};
use tokio_native_tls::native_tls::{Identity, TlsAcceptor};

use crate::tools;

/// A running tansu broker.
#[derive(Debug)]
pub struct Broker {
    /// Where clients connect (the relay): `127.0.0.1:PORT`.
    pub address: String,
    /// Where the broker itself listens.
    listen: String,
    child: Child,
    /// `None` when clients reach the broker directly.
    relay: Option<Relay>,
}

impl Broker {
    /// Starts a broker and creates `topics` with `partitions` partitions each.
    ///
    /// # Panics
    /// When the broker cannot be installed, started or reached within 30 s.
    pub async fn start(topics: &[&str], partitions: u32) -> Self {
        Self::start_with(topics, partitions, Front::Relay(None)).await
    }

    /// [`Broker::start`] with clients reaching it over TLS, the broker
    /// presenting `identity`'s certificate.
    ///
    /// # Panics
    /// As [`Broker::start`].
    pub async fn start_tls(topics: &[&str], partitions: u32, identity: Identity) -> Self {
        let acceptor = TlsAcceptor::new(identity).expect("a TLS acceptor for the certificate");
        Self::start_with(topics, partitions, Front::Relay(Some(acceptor.into()))).await
    }

    /// [`Broker::start`] with clients connecting to the broker itself, not
    /// through a relay: it cannot be cut off ([`Broker::disconnect`] panics).
    ///
    /// # Panics
    /// As [`Broker::start`].
    pub async fn start_direct(topics: &[&str], partitions: u32) -> Self {
        Self::start_with(topics, partitions, Front::Direct).await
    }

    /// Starts the broker on a port free a moment before, behind `front`.
    /// tansu binds the port itself, so another process can take it first:
    /// then the broker exits, and it starts again on another one.
    async fn start_with(topics: &[&str], partitions: u32, front: Front) -> Self {
        for _ in 0..5 {
            let listen = format!("127.0.0.1:{}", free_port());
            let relay = match &front {
                Front::Relay(tls) => Some(Relay::start(listen.clone(), tls.clone()).await),
                Front::Direct => None,
            };
            let address = relay
                .as_ref()
                .map_or_else(|| listen.clone(), |relay| relay.address.clone());
            let child = spawn(&listen, &address).await;
            let mut broker = Self {
                address,
                listen,
                child,
                relay,
            };
            if broker.wait_until_listening().await {
                broker.create_topics(topics, partitions).await;
                return broker;
            }
        }
        panic!("tansu exited before listening, on five ports in turn");
    }

    /// The broker's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Starts a new broker on the same address (the memory engine kept
    /// nothing) with `topics` created again.
    pub async fn restart(&mut self, topics: &[&str], partitions: u32) {
        self.kill();
        self.child = spawn(&self.listen, &self.address).await;
        assert!(
            self.wait_until_listening().await,
            "tansu exited before listening on {} again",
            self.listen
        );
        self.create_topics(topics, partitions).await;
    }

    /// Creates `topics` with `partitions` partitions each.
    ///
    /// # Panics
    /// When the broker refuses one within 30 s.
    pub async fn create_topics(&self, topics: &[&str], partitions: u32) {
        let binary = tokio::task::spawn_blocking(tools::tansu)
            .await
            .expect("the install ran");
        for topic in topics {
            self.create_topic(&binary, topic, partitions).await;
        }
    }

    /// Whether the broker listens, false when it exited first (its port was
    /// taken).
    async fn wait_until_listening(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(30);
        while tokio::net::TcpStream::connect(&self.listen).await.is_err() {
            if self.child.try_wait().is_ok_and(|exit| exit.is_some()) {
                return false;
            }
            assert!(
                Instant::now() < deadline,
                "tansu did not listen on {} within 30 s",
                self.listen
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        true
    }

    async fn create_topic(&self, binary: &Path, topic: &str, partitions: u32) {
        let output = tokio::process::Command::new(binary)
            .args(["topic", "create", topic, "--partitions"])
            .arg(partitions.to_string())
            .args(["--broker", &format!("tcp://{}", self.listen)])
            .output();
        let output = tokio::time::timeout(Duration::from_secs(30), output)
            .await
            .expect("tansu creates a topic within 30 s")
            .expect("tansu runs");
        assert!(
            output.status.success(),
            "cannot create topic {topic}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// `[kafka]` for this broker and `topics`.
    pub fn settings(&self, topics: &[&str]) -> KafkaSettings {
        KafkaSettings {
            brokers: vec![self.address.clone()],
            topics: topics.iter().map(|t| (*t).to_owned()).collect(),
            ..KafkaSettings::default()
        }
    }

    /// `settings` with the stream on this broker's `topics`.
    pub fn configure(&self, settings: &mut Settings, topics: &[&str]) {
        settings.stream.backend = Some(StreamBackend::Kafka);
        settings.kafka = self.settings(topics);
    }

    /// Makes the broker unreachable: open connections are cut and new ones
    /// refused until [`Broker::reconnect`].
    ///
    /// # Panics
    /// When the broker was started without a relay.
    pub async fn disconnect(&self) {
        self.relay().set(false).await;
    }

    /// Lets clients reach the broker again.
    ///
    /// # Panics
    /// As [`Broker::disconnect`].
    pub async fn reconnect(&self) {
        self.relay().set(true).await;
    }

    fn relay(&self) -> &Relay {
        self.relay
            .as_ref()
            .expect("a broker started with a relay (Broker::start)")
    }

    /// Stops the broker (a test of an outage starts another on the same port).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        self.kill();
    }
}

async fn spawn(listen: &str, advertised: &str) -> Child {
    let binary = tokio::task::spawn_blocking(tools::tansu)
        .await
        .expect("the install ran");
    let (listen, advertised) = (format!("tcp://{listen}"), format!("tcp://{advertised}"));
    Command::new(&binary)
        .args(["broker", "--listener-url", &listen])
        .args(["--advertised-listener-url", &advertised])
        .args(["--storage-engine", "memory://tansu/", "--silent"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", binary.display()))
}

/// What clients connect to: the broker itself, or a relay in front of it
/// (ending TLS when it has an acceptor).
enum Front {
    Direct,
    Relay(Option<tokio_native_tls::TlsAcceptor>),
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .expect("a free port on 127.0.0.1")
}

/// A TCP relay from a port of its own to the broker, which can be cut: while
/// it is down, its listener is closed (connections are refused) and the
/// connections it relayed are dropped. With an acceptor, it ends TLS.
#[derive(Debug)]
struct Relay {
    address: String,
    up: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Relay {
    async fn start(upstream: String, tls: Option<tokio_native_tls::TlsAcceptor>) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port on 127.0.0.1");
        let address = listener.local_addr().expect("bound").to_string();
        let (up, watch) = tokio::sync::watch::channel(true);
        let task = tokio::spawn(relay(listener, address.clone(), upstream, tls, watch));
        Self { address, up, task }
    }

    async fn set(&self, up: bool) {
        self.up.send_replace(up);
        // Let the relay close or reopen its listener before the test goes on.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn relay(
    listener: tokio::net::TcpListener,
    address: String,
    upstream: String,
    tls: Option<tokio_native_tls::TlsAcceptor>,
    mut up: tokio::sync::watch::Receiver<bool>,
) {
    let mut listener = Some(listener);
    loop {
        let Some(open) = &listener else {
            if up.wait_for(|up| *up).await.is_err() {
                return;
            }
            listener = tokio::net::TcpListener::bind(&address).await.ok();
            continue;
        };
        tokio::select! {
            accepted = open.accept() => {
                let Ok((client, _)) = accepted else { continue };
                let upstream = upstream.clone();
                let cut = up.clone();
                let tls = tls.clone();
                tokio::spawn(async move {
                    match tls {
                        None => pipe(client, &upstream, cut).await,
                        Some(acceptor) => {
                            if let Ok(client) = acceptor.accept(client).await {
                                pipe(client, &upstream, cut).await;
                            }
                        }
                    }
                });
            }
            changed = up.changed() => {
                if changed.is_err() {
                    return;
                }
                if !*up.borrow_and_update() {
                    listener = None;
                }
            }
        }
    }
}

/// Copies between `client` and a new connection to `upstream` until either
/// closes or the relay is cut.
async fn pipe<S>(mut client: S, upstream: &str, mut cut: tokio::sync::watch::Receiver<bool>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let Ok(mut server) = tokio::net::TcpStream::connect(upstream).await else {
        return;
    };
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
        _ = cut.wait_for(|up| !*up) => {}
    }
}

/// Commits for `group` the end of every partition of `settings`' topics, so
/// that the group reads only what is published from now on (on a shared
/// topic, earlier runs' events stay unread).
///
/// # Panics
/// When the brokers cannot be reached or refuse the commit within 60 s.
pub async fn start_group_at_the_end(settings: &KafkaSettings, group: &str) {
    use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer as _};
    use rdkafka::{Offset, TopicPartitionList};

    let timeout = Duration::from_secs(60);
    let mut config = skyport_kafka::client_config(settings);
    config.set("group.id", group);
    let consumer: BaseConsumer = config.create().expect("a Kafka client");
    let topics = settings.topics.clone();
    tokio::task::spawn_blocking(move || {
        let mut ends = TopicPartitionList::new();
        for topic in &topics {
            let metadata = consumer
                .fetch_metadata(Some(topic), timeout)
                .expect("the topic's metadata");
            for partition in metadata.topics().iter().flat_map(|t| t.partitions()) {
                let (_, high) = consumer
                    .fetch_watermarks(topic, partition.id(), timeout)
                    .expect("the partition's watermarks");
                ends.add_partition_offset(topic, partition.id(), Offset::Offset(high))
                    .expect("an offset for the partition");
            }
        }
        consumer
            .commit(&ends, CommitMode::Sync)
            .expect("the group's offsets at the topic's end");
    })
    .await
    .expect("the commit's task");
}
