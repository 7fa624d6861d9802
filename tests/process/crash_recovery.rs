//! The real binary, killed with SIGKILL while its worker is busy and started
//! again on the same data directory: every request that got a 202 reaches a
//! terminal state, and no service creates anything twice.
//!
//! The simulated services run in this test process, so their counters outlive
//! the killed child.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::time::Duration;

use std::sync::Arc;

use skyport_core::status::DeliveryState;
use skyport_core::status::Step;
use skyport_simulator::{Behaviour, Simulator, SimulatorOptions};
use skyport_tests::kafka::Broker;
use skyport_tests::{ChildApp, Client, delivery_request};
use tokio_util::sync::CancellationToken;

const REQUESTS: usize = 2_000;

/// The simulated services in this process, so that their counters outlive the child.
struct Services {
    simulator: Simulator,
    url: String,
    stop: CancellationToken,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Services {
    async fn start() -> Self {
        let simulator = Simulator::new(SimulatorOptions {
            behaviour: Behaviour {
                latency: Duration::from_millis(10),
                jitter: Duration::from_millis(10),
                ..Behaviour::default()
            },
            ..SimulatorOptions::default()
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/", listener.local_addr().unwrap());
        let stop = CancellationToken::new();
        let server = tokio::spawn(simulator.clone().serve(listener, stop.clone()));
        Self {
            simulator,
            url,
            stop,
            server,
        }
    }

    async fn stop(self) {
        self.stop.cancel();
        self.server.await.unwrap().unwrap();
    }
}

/// The counters the worker logged as it stopped.
fn worker_summary(log: &str) -> String {
    log.lines()
        .find(|l| l.contains("The worker stopped."))
        .and_then(|l| l.split("counters=").nth(1))
        .unwrap_or("(no summary)")
        .to_owned()
}

fn args(data_dir: &Path, services: &str, extra: &[String]) -> Vec<String> {
    let mut args: Vec<String> = [
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        data_dir.to_str().unwrap(),
        "--set",
        &format!("services.base_url={services}"),
        "--set",
        "worker.max_in_flight=16",
        "--set",
        "worker.checkpoint_interval_ms=200",
        "--set",
        "services.retry_initial_backoff_ms=5",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    for setting in extra {
        args.extend(["--set".to_owned(), setting.clone()]);
    }
    args
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_process_loses_nothing_and_duplicates_nothing() {
    killed_and_restarted("embedded", &[]).await;
}

/// The same on Kafka: the killed member's partitions go to the restarted
/// process once the group's session timeout has passed, from the last
/// committed offsets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_process_on_kafka_loses_nothing_and_duplicates_nothing() {
    let broker = Broker::start(&["deliveries"], 4).await;
    killed_and_restarted(
        "kafka",
        &[
            "stream.backend=kafka".to_owned(),
            format!("kafka.brokers=[\"{}\"]", broker.address),
            "kafka.session_timeout_ms=6000".to_owned(),
            "kafka.drain_timeout_ms=3000".to_owned(),
        ],
    )
    .await;
}

async fn killed_and_restarted(stream: &str, extra: &[String]) {
    let binary = Path::new(env!("CARGO_BIN_EXE_skyport"));
    let dir = tempfile::tempdir().unwrap();
    let services = Services::start().await;
    let simulator = &services.simulator;

    let data = dir.path().join("data");
    let first = ChildApp::spawn(
        binary,
        &args(&data, &services.url, extra),
        dir.path().join("first.log"),
    )
    .await;
    let accepted = first.client.post_many(REQUESTS).await;
    assert_eq!(accepted.len(), REQUESTS);

    // Kill it mid-flight: some deliveries done, some half-way, some not started.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let done_at_kill = loop {
        let done = simulator.stats().get(Step::Drone).created;
        if done >= (REQUESTS / 4) as u64 {
            break done;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the worker made no progress"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    first.kill().await;
    let at_kill = simulator.stats();
    assert!(
        done_at_kill < REQUESTS as u64,
        "the worker finished before the kill; nothing was tested"
    );

    let second = ChildApp::spawn(
        binary,
        &args(&data, &services.url, extra),
        dir.path().join("second.log"),
    )
    .await;
    let urls: Vec<String> = accepted.iter().map(|a| a.status_url.clone()).collect();
    let documents = second
        .client
        .wait_for_terminal(&urls, Duration::from_secs(120))
        .await;
    let log = second.terminate().await;

    let stats = simulator.stats();
    let scheduled = documents
        .iter()
        .filter(|d| d.state == DeliveryState::Scheduled)
        .count();
    let restarted = documents.iter().filter(|d| d.attempt > 1).count();
    let summary = worker_summary(&log);
    println!(
        "crash recovery ({stream}): {REQUESTS} accepted, killed after {done_at_kill} drone bookings; \
         after restart {scheduled} Scheduled; {restarted} deliveries started again (attempt > 1); \
         restarted worker: {summary}; calls answered as replays: account={} package={} delivery={} thirdparty={} drone={}",
        stats.account.replayed,
        stats.package.replayed,
        stats.delivery.replayed,
        stats.third_party.replayed,
        stats.drone.replayed,
    );
    assert_eq!(
        scheduled, REQUESTS,
        "every accepted request reaches Scheduled"
    );
    for service in Step::ALL {
        let counters = stats.get(service);
        assert_eq!(
            counters.created, REQUESTS as u64,
            "{service:?} created each resource exactly once: {counters:?}"
        );
        assert_eq!(counters.conflicts, 0, "{service:?}: {counters:?}");
    }
    assert!(
        stats.drone.calls > at_kill.drone.calls,
        "the restarted worker did the rest of the work"
    );
    let replayed: u64 = summary
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("replayed="))
        .and_then(|n| n.parse().ok())
        .unwrap();
    assert!(
        replayed > 0,
        "events after the last checkpoint are read again: {summary}"
    );

    services.stop().await;
}

const ROUNDS: usize = 5;
const PER_ROUND: usize = 400;

/// Posts deliveries `first..first + count` until the server goes away; returns the accepted ones.
async fn post_until_killed(client: Client, first: usize, count: usize) -> Vec<(usize, String)> {
    let permits = Arc::new(tokio::sync::Semaphore::new(16));
    let mut posts = tokio::task::JoinSet::new();
    for n in first..first + count {
        let client = client.clone();
        let permit = Arc::clone(&permits).acquire_owned().await.unwrap();
        posts.spawn(async move {
            let accepted = client.try_post_delivery(&delivery_request(n)).await;
            drop(permit);
            accepted.map(|a| (n, a.status_url))
        });
    }
    posts.join_all().await.into_iter().flatten().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_kills_at_random_moments_lose_nothing_and_duplicate_nothing() {
    let binary = Path::new(env!("CARGO_BIN_EXE_skyport"));
    let dir = tempfile::tempdir().unwrap();
    let services = Services::start().await;
    let simulator = &services.simulator;
    let data = dir.path().join("data");
    let seed = fastrand::u64(..);
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut accepted = Vec::new();
    for round in 0..ROUNDS {
        let log = dir.path().join(format!("round-{round}.log"));
        let child = ChildApp::spawn(binary, &args(&data, &services.url, &[]), log).await;
        let posting = tokio::spawn(post_until_killed(
            child.client.clone(),
            round * PER_ROUND,
            PER_ROUND,
        ));
        let kill_after = Duration::from_millis(rng.u64(100..1_500));
        tokio::time::sleep(kill_after).await;
        child.kill().await;
        let round_accepted = posting.await.unwrap();
        println!(
            "round {round}: killed after {kill_after:?}; {} of {PER_ROUND} posts accepted; {} drone bookings so far",
            round_accepted.len(),
            simulator.stats().drone.created
        );
        accepted.extend(round_accepted);
    }

    let last = ChildApp::spawn(
        binary,
        &args(&data, &services.url, &[]),
        dir.path().join("last.log"),
    )
    .await;
    // Every request again, as a client whose post was cut off would retry it:
    // an accepted one gets its status URL back; one that never became durable
    // is accepted now.
    let retried = post_until_killed(last.client.clone(), 0, ROUNDS * PER_ROUND).await;
    assert_eq!(retried.len(), ROUNDS * PER_ROUND, "every retry is accepted");
    let path = |url: &str| url.split_once("/api/").map(|(_, p)| p.to_owned()).unwrap();
    let retried_paths: std::collections::HashMap<usize, String> =
        retried.iter().map(|(n, url)| (*n, path(url))).collect();
    for (n, url) in &accepted {
        assert_eq!(
            retried_paths[n],
            path(url),
            "a retry of accepted request {n} gets its status URL back"
        );
    }
    let urls: Vec<String> = retried.into_iter().map(|(_, url)| url).collect();
    let documents = last
        .client
        .wait_for_terminal(&urls, Duration::from_secs(180))
        .await;
    assert!(
        documents
            .iter()
            .all(|d| d.state == DeliveryState::Scheduled),
        "every request is Scheduled"
    );
    let scheduled = documents.len() as u64;
    let restarted = documents.iter().filter(|d| d.attempt > 1).count() as u64;
    let log = last.terminate().await;
    let stats = simulator.stats();
    let summary = worker_summary(&log);
    println!(
        "crash loop (seed {seed}): {} accepted, {scheduled} deliveries exist and are Scheduled, \
         {restarted} were started again after a kill; last worker: {summary}; \
         calls answered as replays: account={} package={} delivery={} thirdparty={} drone={}",
        accepted.len(),
        stats.account.replayed,
        stats.package.replayed,
        stats.delivery.replayed,
        stats.third_party.replayed,
        stats.drone.replayed,
    );
    for service in Step::ALL {
        let counters = stats.get(service);
        assert_eq!(
            counters.created, scheduled,
            "{service:?}: one creation per delivery: {counters:?}"
        );
        assert_eq!(counters.conflicts, 0, "{service:?}: {counters:?}");
    }
    services.stop().await;
}

/// Batches in this test: each of [`BATCH`] requests, the last one invalid.
const BATCHES: usize = 24;
const BATCH: usize = 100;

/// Batch `b`: its requests (the last with a weight of -1) as a body.
fn batch_body(b: usize) -> String {
    let requests: Vec<serde_json::Value> = (b * BATCH..(b + 1) * BATCH)
        .map(|n| {
            let mut request = delivery_request(n);
            if n % BATCH == BATCH - 1 {
                request["packageInfo"]["weight"] = serde_json::json!(-1);
            }
            request
        })
        .collect();
    serde_json::json!({ "requests": requests }).to_string()
}

/// Posts batch `b` under its own key: each request's result, or `None`
/// when the server went away before answering.
async fn post_batch(client: &Client, b: usize) -> Option<Vec<serde_json::Value>> {
    let response = client
        .http
        .post(format!("{}/api/deliveryrequests/batch", client.base))
        .header("content-type", "application/json")
        .header("idempotency-key", format!("crash-batch-{b}"))
        .body(batch_body(b))
        .send()
        .await
        .ok()?;
    assert_eq!(response.status(), 200);
    let answer: serde_json::Value = response.json().await.ok()?;
    answer["results"].as_array().cloned()
}

/// The status URLs of the requests a batch's results accepted, after
/// checking that every other one was refused as invalid.
fn accepted_urls(results: &[serde_json::Value]) -> Vec<String> {
    assert_eq!(results.len(), BATCH);
    results
        .iter()
        .enumerate()
        .filter_map(|(i, result)| {
            if i == BATCH - 1 {
                assert_eq!(result["status"], 422, "{result}");
                return None;
            }
            assert_eq!(result["status"], 202, "{result}");
            Some(result["accepted"]["statusUrl"].as_str()?.to_owned())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_killed_mid_batch_keeps_what_it_accepted_and_a_retry_finds_it() {
    let binary = Path::new(env!("CARGO_BIN_EXE_skyport"));
    let dir = tempfile::tempdir().unwrap();
    let services = Services::start().await;
    let data = dir.path().join("data");
    let first = ChildApp::spawn(
        binary,
        &args(&data, &services.url, &[]),
        dir.path().join("first.log"),
    )
    .await;
    let mut posts = tokio::task::JoinSet::new();
    for b in 0..BATCHES {
        let client = first.client.clone();
        posts.spawn(async move { (b, post_batch(&client, b).await) });
    }
    // Kill it once some batches are answered and others are on their way.
    let mut answered = Vec::new();
    while answered.len() < BATCHES / 4 {
        let (b, results) = posts.join_next().await.unwrap().unwrap();
        answered.push((b, results.expect("the server is up")));
    }
    first.kill().await;
    let mut unanswered = Vec::new();
    for (b, results) in posts.join_all().await {
        match results {
            Some(results) => answered.push((b, results)),
            None => unanswered.push(b),
        }
    }
    println!(
        "killed mid-batch: {} batches answered, {} not",
        answered.len(),
        unanswered.len()
    );

    let second = ChildApp::spawn(
        binary,
        &args(&data, &services.url, &[]),
        dir.path().join("second.log"),
    )
    .await;
    let mut urls: Vec<String> = answered
        .iter()
        .flat_map(|(_, results)| accepted_urls(results))
        .collect();
    // Every request answered 202 before the kill is there.
    second
        .client
        .wait_for_terminal(&urls, Duration::from_secs(120))
        .await;
    // A batch that got no answer, retried unchanged under its key, gets one
    // for each of its requests; an answered one, retried, the same.
    for (b, results) in &answered {
        let again = post_batch(&second.client, *b).await.unwrap();
        for (then, now) in results.iter().zip(&again) {
            assert_eq!(
                now["accepted"]["deliveryId"],
                then["accepted"]["deliveryId"]
            );
            assert_eq!(now["accepted"]["receipt"], then["accepted"]["receipt"]);
        }
    }
    for b in unanswered {
        let results = post_batch(&second.client, b).await.unwrap();
        urls.extend(accepted_urls(&results));
    }
    let documents = second
        .client
        .wait_for_terminal(&urls, Duration::from_secs(120))
        .await;
    second.terminate().await;
    assert!(
        documents
            .iter()
            .all(|document| document.state == DeliveryState::Scheduled)
    );
    let valid = (BATCH - 1) * BATCHES;
    assert_eq!(urls.len(), valid);
    let stats = services.simulator.stats();
    for service in Step::ALL {
        let counters = stats.get(service);
        assert_eq!(
            counters.created, valid as u64,
            "{service:?} created each valid request's resource exactly once, and none of an invalid one's: {counters:?}"
        );
    }
    services.stop().await;
}

/// Deliveries whose pickup is `LEAD_S` and `in_s` seconds away.
const LEAD_S: i64 = 3_600;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_deliveries_survive_a_kill_and_run_once_after_the_restart() {
    let binary = Path::new(env!("CARGO_BIN_EXE_skyport"));
    let dir = tempfile::tempdir().unwrap();
    let services = Services::start().await;
    let data = dir.path().join("data");
    let lead = [format!("worker.booking_lead_s={LEAD_S}")];
    let first = ChildApp::spawn(
        binary,
        &args(&data, &services.url, &lead),
        dir.path().join("first.log"),
    )
    .await;
    let pickup = time::OffsetDateTime::now_utc() + time::Duration::seconds(LEAD_S + 4);
    let format = &time::format_description::well_known::Rfc3339;
    let mut urls = Vec::new();
    for n in 0..50 {
        let mut request = delivery_request(n);
        request["pickupTime"] = serde_json::json!(pickup.format(format).unwrap());
        request["deadline"] =
            serde_json::json!((pickup + time::Duration::hours(2)).format(format).unwrap());
        urls.push(first.client.post_delivery(&request).await.status_url);
    }
    first
        .client
        .wait_for_state(&urls[49], DeliveryState::Waiting, Duration::from_secs(10))
        .await;
    first.kill().await;
    assert_eq!(
        services.simulator.stats().get(Step::Drone).created,
        0,
        "nothing was booked before the kill"
    );
    let second = ChildApp::spawn(
        binary,
        &args(&data, &services.url, &lead),
        dir.path().join("second.log"),
    )
    .await;
    let documents = second
        .client
        .wait_for_terminal(&urls, Duration::from_secs(60))
        .await;
    second.terminate().await;
    assert!(
        documents
            .iter()
            .all(|d| d.state == DeliveryState::Scheduled && d.attempt == 1)
    );
    let stats = services.simulator.stats();
    for service in Step::ALL {
        assert_eq!(stats.get(service).created, 50, "{service:?}");
    }
    services.stop().await;
}
