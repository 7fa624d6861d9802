//! A real Kafka-compatible broker for the Kafka tests: tansu 0.6.0 on its
//! memory engine (`tools::tansu`), on 127.0.0.1 and a free port, with the
//! topics a test asks for; stopped (killed) when dropped.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use skyport_runtime::config::{KafkaSettings, Settings, StreamBackend};

use crate::tools;

/// A running tansu broker.
#[derive(Debug)]
pub struct Broker {
    /// `127.0.0.1:PORT`.
    pub address: String,
    child: Child,
}

impl Broker {
    /// Starts a broker and creates `topics` with `partitions` partitions each.
    ///
    /// # Panics
    /// When the broker cannot be installed, started or reached within 30 s.
    pub async fn start(topics: &[&str], partitions: u32) -> Self {
        let address = format!("127.0.0.1:{}", free_port());
        let child = spawn(&address).await;
        let broker = Self { address, child };
        broker.wait_until_listening().await;
        broker.create_topics(topics, partitions).await;
        broker
    }

    /// Starts a new broker on the same address (the memory engine kept
    /// nothing) with `topics` created again.
    pub async fn restart(&mut self, topics: &[&str], partitions: u32) {
        self.kill();
        self.child = spawn(&self.address).await;
        self.wait_until_listening().await;
        self.create_topics(topics, partitions).await;
    }

    async fn create_topics(&self, topics: &[&str], partitions: u32) {
        let binary = tokio::task::spawn_blocking(tools::tansu)
            .await
            .expect("the install ran");
        for topic in topics {
            self.create_topic(&binary, topic, partitions).await;
        }
    }

    async fn wait_until_listening(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while tokio::net::TcpStream::connect(&self.address).await.is_err() {
            assert!(
                Instant::now() < deadline,
                "tansu did not listen on {} within 30 s",
                self.address
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn create_topic(&self, binary: &Path, topic: &str, partitions: u32) {
        let output = tokio::process::Command::new(binary)
            .args(["topic", "create", topic, "--partitions"])
            .arg(partitions.to_string())
            .args(["--broker", &format!("tcp://{}", self.address)])
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

async fn spawn(address: &str) -> Child {
    let binary = tokio::task::spawn_blocking(tools::tansu)
        .await
        .expect("the install ran");
    let url = format!("tcp://{address}");
    Command::new(&binary)
        .args([
            "broker",
            "--listener-url",
            &url,
            "--advertised-listener-url",
            &url,
        ])
        .args(["--storage-engine", "memory://tansu/", "--silent"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", binary.display()))
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .expect("a free port on 127.0.0.1")
}
