//! The end-to-end harness: [`TestApp`] runs gateway + worker + simulated
//! services in-process on port 0 over a temporary data directory, and
//! [`Client`] posts and polls over real HTTP.
//!
//! Every wait is bounded by a deadline, and every server stops with the test.

#![allow(clippy::unwrap_used)]

pub mod browser;
pub mod contract;
pub mod crds;
pub mod dead_letters_contract;
pub mod decoders;
pub mod eventhubs;
pub mod eventhubs_broker;
pub mod fleet;
pub mod helm;
pub mod idempotency_contract;
pub mod kafka;
pub mod kafka_sasl;
pub mod leases_contract;
pub mod listing_contract;
pub mod otlp;
pub mod prometheus;
pub mod schema_v1;
pub mod stream_contract;
pub mod tls;
pub mod tools;
pub mod webhooks;

pub use self::tools::{chromium, installed_tool};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use secrecy::SecretString;
use serde_json::{Value, json};
use skyport::{App, Backends, Store};
use skyport_azure::cosmos::CosmosStore;
use skyport_core::status::{DeliveryState, StatusDocument, Step};
use skyport_embedded::EmbeddedStore;
use skyport_gateway::routes::deliveries::resources::Accepted;
use skyport_runtime::config::{ApiKeySettings, Millis, Scope, Settings};
use skyport_simulator::{Simulator, SimulatorStats};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// How many requests a test keeps in flight at once.
pub const CONCURRENCY: usize = 64;

/// How often [`eventually`] looks again.
const POLL: Duration = Duration::from_millis(20);

/// Waits until `probe` answers `Some`, asking again every 20 ms; panics
/// naming `what` (and the last answer's absence) once `within` has passed.
pub async fn eventually<T, F, Fut>(what: &str, within: Duration, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(found) = probe().await {
            return found;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not within {within:?}"
        );
        tokio::time::sleep(POLL).await;
    }
}

/// Settings for a test: everything on 127.0.0.1 port 0, fast simulated
/// services, short checkpoint interval, data under `dir`.
pub fn test_settings(dir: &Path) -> Settings {
    let mut settings = Settings::default();
    settings.gateway.listen = "127.0.0.1:0".parse().unwrap();
    settings.embedded.data_dir = dir.to_path_buf();
    settings.embedded.cache_size_mb = 16;
    // Small segments: every test opens a store of its own, and rotation runs too.
    settings.embedded.segment_size_mb = 2;
    settings.simulator.latency_ms = Millis::new(1);
    settings.simulator.jitter_ms = Millis::new(2);
    settings.worker.checkpoint_interval_ms = Millis::new(100);
    settings.worker.shutdown_grace_period_ms = Millis::new(10_000);
    settings.services.retry_initial_backoff_ms = Millis::new(5);
    settings.services.retry_max_backoff_ms = Millis::new(200);
    settings
}

/// Turns authentication on in `settings` with these API keys: each a name
/// (the principal), the key and its scopes.
pub fn with_api_keys(settings: &mut Settings, keys: &[(&str, &str, &[Scope])]) {
    let auth = &mut settings.gateway.auth;
    auth.enabled = Some(true);
    for (name, key, scopes) in keys {
        auth.api_keys.insert(
            (*name).to_owned(),
            ApiKeySettings {
                key: SecretString::from(*key),
                scopes: scopes.to_vec(),
            },
        );
    }
}

/// The whole system in this process.
#[derive(Debug)]
pub struct TestApp {
    pub app: App,
    pub client: Client,
    pub settings: Settings,
}

impl TestApp {
    /// Starts on a fresh temporary directory (kept in `dir`).
    pub async fn spawn(dir: &tempfile::TempDir) -> Self {
        Self::spawn_with(test_settings(dir.path())).await
    }

    pub async fn spawn_with(settings: Settings) -> Self {
        let app = App::start(settings.clone(), CancellationToken::new())
            .await
            .unwrap();
        Self::running(app, settings)
    }

    /// Starts with status and dead letters in Cosmos DB on the SDK's in-memory
    /// emulator (the stream stays on the embedded store).
    pub async fn spawn_on_cosmos(settings: Settings) -> Self {
        let cosmos = skyport_azure::cosmos::emulator::Emulator::new(false)
            .unwrap()
            .store_with(&settings.cosmos, &settings.store)
            .await
            .unwrap();
        let backends = Backends::open_with(&settings, Some(cosmos)).await.unwrap();
        let app = App::start_with(settings.clone(), backends, CancellationToken::new())
            .await
            .unwrap();
        Self::running(app, settings)
    }

    /// Starts on `backends`, opened from `settings` and changed by the test
    /// (a port wrapped, say).
    pub async fn spawn_on(settings: Settings, backends: Backends) -> Self {
        let app = App::start_with(settings.clone(), backends, CancellationToken::new())
            .await
            .unwrap();
        Self::running(app, settings)
    }

    fn running(app: App, settings: Settings) -> Self {
        let client = Client::new(format!("http://{}", app.gateway_addr));
        Self {
            app,
            client,
            settings,
        }
    }

    pub fn simulator(&self) -> &Simulator {
        self.app.simulator.as_ref().unwrap()
    }

    /// Waits (at most `within`) until every delivery behind `urls` is
    /// terminal, and asserts that each ended Scheduled and that each
    /// simulated service created each delivery once, with no conflicting call.
    pub async fn expect_all_scheduled_once(&self, urls: &[String], within: Duration) {
        let documents = self.client.wait_for_terminal(urls, within).await;
        for document in &documents {
            assert_eq!(document.state, DeliveryState::Scheduled, "{document:?}");
        }
        let stats = self.simulator().stats();
        for service in Step::ALL {
            let counters = stats.get(service);
            assert_eq!(
                counters.created,
                urls.len() as u64,
                "{service:?}: {counters:?}"
            );
            assert_eq!(counters.conflicts, 0, "{service:?}: {counters:?}");
        }
    }

    /// The embedded store the stream lives in.
    pub fn embedded(&self) -> Arc<EmbeddedStore> {
        self.app
            .backends
            .embedded
            .clone()
            .expect("the stream is embedded")
    }

    /// The Cosmos DB store status lives in.
    pub fn cosmos(&self) -> Arc<CosmosStore> {
        match &self.app.backends.store {
            Store::Cosmos(cosmos) => Arc::clone(cosmos),
            Store::Embedded(_) => panic!("the status store is embedded, not Cosmos DB"),
        }
    }

    /// Events the embedded stream has made durable so far.
    pub fn published(&self) -> u64 {
        self.embedded().heads().iter().sum()
    }

    /// Stops gracefully and starts again on the same data directory.
    pub async fn restart(self) -> Self {
        let settings = self.settings.clone();
        self.app.stop().await.unwrap();
        Self::spawn_with(settings).await
    }
}

/// A valid delivery request, unique by `n` (delivery, package and owner ids).
pub fn delivery_request(n: usize) -> Value {
    json!({
        "deliveryId": format!("delivery-{n}"),
        "ownerId": format!("owner-{}", n % 97),
        "pickupLocation": format!("47.{n:04},-122.1368"),
        "pickupTime": "2030-01-01T10:00:00Z",
        "deadline": "2030-01-01T12:00:00Z",
        "dropoffLocation": "47.6101,-122.2015",
        "expedited": n.is_multiple_of(3),
        "confirmationRequired": "Picture",
        "packageInfo": { "packageId": format!("package-{n}"), "size": "Small", "weight": 2.5, "tag": "test" }
    })
}

/// An HTTP client of the gateway at `base`.
#[derive(Debug, Clone)]
pub struct Client {
    pub http: reqwest::Client,
    pub base: String,
}

impl Client {
    pub fn new(base: String) -> Self {
        Self::sending(base, reqwest::header::HeaderMap::new())
    }

    /// A client of the same gateway that sends `name: value` with every
    /// request (credentials, say).
    pub fn with_header(&self, name: &'static str, value: &str) -> Self {
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(name, value.parse().unwrap());
        Self::sending(self.base.clone(), headers)
    }

    fn sending(base: String, headers: reqwest::header::HeaderMap) -> Self {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .default_headers(headers)
            .build()
            .unwrap();
        Self { http, base }
    }

    pub async fn post_raw(
        &self,
        content_type: &str,
        body: impl Into<reqwest::Body>,
    ) -> reqwest::Response {
        self.http
            .post(format!("{}/api/deliveryrequests", self.base))
            .header("content-type", content_type)
            .body(body)
            .send()
            .await
            .unwrap()
    }

    /// Posts `request` with `headers` besides its content type (`Prefer`,
    /// `Idempotency-Key`), whatever the answer.
    pub async fn post_with(&self, headers: &[(&str, &str)], request: &Value) -> reqwest::Response {
        let mut post = self
            .http
            .post(format!("{}/api/deliveryrequests", self.base))
            .header("content-type", "application/json")
            .body(request.to_string());
        for (name, value) in headers {
            post = post.header(*name, *value);
        }
        post.send().await.unwrap()
    }

    /// Posts `request` and expects a 202.
    pub async fn post_delivery(&self, request: &Value) -> Accepted {
        let response = self.post_raw("application/json", request.to_string()).await;
        assert_eq!(
            response.status(),
            202,
            "{}",
            response.text().await.unwrap_or_default()
        );
        response.json().await.unwrap()
    }

    /// Posts `request`; `None` when the connection failed (the server is gone),
    /// otherwise the request must have been accepted.
    pub async fn try_post_delivery(&self, request: &Value) -> Option<Accepted> {
        let response = self
            .http
            .post(format!("{}/api/deliveryrequests", self.base))
            .header("content-type", "application/json")
            .body(request.to_string())
            .send()
            .await
            .ok()?;
        assert_eq!(response.status(), 202);
        response.json().await.ok()
    }

    /// Posts requests `0..count`, `CONCURRENCY` at a time; returns what each got.
    pub async fn post_many(&self, count: usize) -> Vec<Accepted> {
        let permits = Arc::new(Semaphore::new(CONCURRENCY));
        let mut posts = JoinSet::new();
        for n in 0..count {
            let client = self.clone();
            let permit = Arc::clone(&permits).acquire_owned().await.unwrap();
            posts.spawn(async move {
                let accepted = client.post_delivery(&delivery_request(n)).await;
                drop(permit);
                accepted
            });
        }
        posts.join_all().await
    }

    /// The status behind a status URL (its path and query, against this client's base).
    pub async fn status(&self, status_url: &str) -> reqwest::Response {
        self.http.get(self.rebase(status_url)).send().await.unwrap()
    }

    /// `DELETE` the delivery behind a status URL (keeping its receipt).
    pub async fn cancel(&self, status_url: &str) -> reqwest::Response {
        let url = self.rebase(status_url).replacen("/status?", "?", 1);
        self.http.delete(url).send().await.unwrap()
    }

    /// Waits until the status behind `status_url` is in `state`; panics after `timeout`.
    pub async fn wait_for_state(
        &self,
        status_url: &str,
        state: skyport_core::status::DeliveryState,
        timeout: Duration,
    ) -> StatusDocument {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let document: StatusDocument = self.status(status_url).await.json().await.unwrap();
            if document.state == state {
                return document;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "still {:?}, not {state:?}, after {timeout:?}",
                document.state
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn rebase(&self, status_url: &str) -> String {
        let path = status_url
            .find("/api/")
            .map_or(status_url, |at| &status_url[at..]);
        format!("{}{path}", self.base)
    }

    /// Polls every status URL until each is terminal; panics after `timeout`.
    pub async fn wait_for_terminal(
        &self,
        status_urls: &[String],
        timeout: Duration,
    ) -> Vec<StatusDocument> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut done: Vec<Option<StatusDocument>> = vec![None; status_urls.len()];
        loop {
            let pending: Vec<usize> = (0..done.len()).filter(|&i| done[i].is_none()).collect();
            if pending.is_empty() {
                return done.into_iter().map(Option::unwrap).collect();
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{} of {} deliveries are not terminal after {timeout:?}",
                pending.len(),
                status_urls.len()
            );
            let permits = Arc::new(Semaphore::new(CONCURRENCY));
            let mut polls = JoinSet::new();
            for i in pending {
                let client = self.clone();
                let url = status_urls[i].clone();
                let permit = Arc::clone(&permits).acquire_owned().await.unwrap();
                polls.spawn(async move {
                    let response = client.status(&url).await;
                    drop(permit);
                    assert_eq!(
                        response.status(),
                        200,
                        "a status URL of an accepted request answered {}",
                        response.status()
                    );
                    (i, response.json::<StatusDocument>().await.unwrap())
                });
            }
            for (i, document) in polls.join_all().await {
                if document.state.is_terminal() {
                    done[i] = Some(document);
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// The simulated services' counters, over HTTP (for services in another process).
pub async fn simulator_stats(base_url: &str) -> SimulatorStats {
    reqwest::get(format!("{}/_sim/stats", base_url.trim_end_matches('/')))
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// The `skyport` binary as a child process, killable at any moment.
#[derive(Debug)]
pub struct ChildApp {
    pub child: tokio::process::Child,
    pub client: Client,
    pub stderr: PathBuf,
}

impl ChildApp {
    /// Starts `binary` with `args`, logging to `stderr`; waits for its "listening" line.
    pub async fn spawn(binary: &Path, args: &[String], stderr: PathBuf) -> Self {
        Self::spawn_with_env(binary, args, &[], stderr).await
    }

    /// [`ChildApp::spawn`] with environment variables `env` added to this process's.
    pub async fn spawn_with_env(
        binary: &Path,
        args: &[String],
        env: &[(&str, String)],
        stderr: PathBuf,
    ) -> Self {
        use tokio::io::AsyncBufReadExt;
        let log = std::fs::File::create(&stderr).unwrap();
        let mut child = tokio::process::Command::new(binary)
            .args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdout(std::process::Stdio::piped())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        let base = tokio::time::timeout(Duration::from_secs(30), async {
            while let Some(line) = lines.next_line().await.unwrap() {
                if let Some(rest) = line.strip_prefix("Skyport is listening on ") {
                    return rest.split_whitespace().next().unwrap().to_owned();
                }
            }
            panic!("skyport exited before listening; see {}", stderr.display());
        })
        .await
        .unwrap();
        Self {
            child,
            client: Client::new(base),
            stderr,
        }
    }

    /// SIGKILL: no drain, no final checkpoint.
    pub async fn kill(mut self) {
        self.child.kill().await.unwrap();
    }

    /// SIGTERM, then waits for a clean exit; returns what it logged.
    pub async fn terminate(mut self) -> String {
        let pid = i32::try_from(self.child.id().unwrap()).unwrap();
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        let exit = tokio::time::timeout(Duration::from_secs(60), self.child.wait())
            .await
            .unwrap()
            .unwrap();
        assert!(exit.success(), "skyport exited with {exit}");
        std::fs::read_to_string(&self.stderr).unwrap()
    }
}

/// The sum of the samples on `{base}/metrics` (Prometheus text) whose line
/// starts with `series` (a name, or a name and the start of its labels).
pub async fn metric_sum(base: &str, series: &str) -> f64 {
    metric_lines(base, series)
        .await
        .iter()
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The lines of `{base}/metrics` that start with `prefix` (a name and the
/// start of its labels).
pub async fn metric_lines(base: &str, prefix: &str) -> Vec<String> {
    let text = reqwest::Client::new()
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .filter(|line| line.starts_with(prefix))
        .map(str::to_owned)
        .collect()
}

/// Scrapes `{base}/metrics` twice, as a Prometheus text scraper and as an
/// OpenMetrics one, checks that each answer parses in its format (panics
/// naming the parser's complaint otherwise) and that both hold the same
/// families, and returns the label sets of each family by family name
/// (a counter's without its `_total`).
pub async fn scrape_metrics(base: &str) -> BTreeMap<String, Vec<BTreeMap<String, String>>> {
    let get = |accept: &'static str| async move {
        let response = reqwest::Client::new()
            .get(format!("{base}/metrics"))
            .header("accept", accept)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let content_type = response.headers()["content-type"]
            .to_str()
            .unwrap()
            .to_owned();
        (content_type, response.text().await.unwrap())
    };
    let (content_type, text) = get("text/plain").await;
    assert!(
        content_type.starts_with("text/plain; version=0.0.4"),
        "{content_type}"
    );
    let prometheus = openmetrics_parser::prometheus::parse_prometheus(&text)
        .unwrap_or_else(|e| panic!("not Prometheus text: {e:?}\n{text}"));
    let (content_type, text) = get("application/openmetrics-text;version=1.0.0").await;
    assert!(
        content_type.starts_with("application/openmetrics-text"),
        "{content_type}"
    );
    let exposition = openmetrics_parser::openmetrics::parse_openmetrics(&text)
        .unwrap_or_else(|e| panic!("not OpenMetrics text: {e:?}\n{text}"));
    let mut names: Vec<String> = prometheus
        .families
        .keys()
        .map(|n| n.strip_suffix("_total").unwrap_or(n).to_owned())
        .collect();
    names.sort();
    let mut open_names: Vec<String> = exposition.families.keys().cloned().collect();
    open_names.sort();
    assert_eq!(names, open_names, "both formats hold the same families");
    exposition
        .families
        .into_iter()
        .map(|(name, family)| {
            let names = family.get_label_names().to_vec();
            let series = family
                .iter_samples()
                .map(|sample| {
                    let labels = sample.get_labelset().unwrap();
                    names
                        .iter()
                        .filter_map(|n| {
                            labels.get_label_value(n).map(|v| (n.clone(), v.to_owned()))
                        })
                        .collect()
                })
                .collect();
            (name, series)
        })
        .collect()
}

/// The workspace's root directory.
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// What a tool printed and how it ended.
#[derive(Debug)]
pub struct ToolOutput {
    pub status: std::process::ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

/// [`run_tool`], then prints what the tool printed (shown on failure, or with
/// `--nocapture`) and fails the test unless it exited 0; returns that output
/// (stdout, then stderr).
pub async fn run_tool_ok(
    what: &str,
    command: tokio::process::Command,
    limit: Duration,
    dir: &Path,
) -> String {
    let output = run_tool(what, command, limit, dir).await;
    let printed = format!("{}{}", output.stdout, output.stderr);
    println!("{printed}");
    assert!(
        output.status.success(),
        "{what} failed ({}); its output is above",
        output.status
    );
    printed
}

/// Runs a tool's `command` within `limit`, its stdout and stderr going to files in
/// `dir` (named after `what`); on time-out its whole process group is killed (a
/// wrapper may have started a JVM) and the test fails with what it printed.
pub async fn run_tool(
    what: &str,
    mut command: tokio::process::Command,
    limit: Duration,
    dir: &Path,
) -> ToolOutput {
    let stem = what.replace(|c: char| !c.is_ascii_alphanumeric(), "_");
    let (out_path, err_path) = (
        dir.join(format!("{stem}.out")),
        dir.join(format!("{stem}.err")),
    );
    command
        .stdin(std::process::Stdio::null())
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .process_group(0)
        .kill_on_drop(true);
    let shown = format!("{:?}", command.as_std());
    eprintln!("== {what}: {shown}");
    let started = std::time::Instant::now();
    let mut child = command
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: cannot start {shown}: {e}"));
    let read = || {
        (
            std::fs::read_to_string(&out_path).unwrap_or_default(),
            std::fs::read_to_string(&err_path).unwrap_or_default(),
        )
    };
    match tokio::time::timeout(limit, child.wait()).await {
        Ok(status) => {
            let status = status.unwrap();
            let (stdout, stderr) = read();
            eprintln!("== {what}: {status} after {:.1?}", started.elapsed());
            ToolOutput {
                status,
                stdout,
                stderr,
            }
        }
        Err(_) => {
            if let Some(pid) = child.id() {
                let group = nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap());
                let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
            }
            let _ = child.wait().await;
            let (stdout, stderr) = read();
            panic!("{what} did not finish within {limit:?}\n{stdout}\n{stderr}");
        }
    }
}
