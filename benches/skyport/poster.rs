//! Distinct delivery requests for the phases that run the whole system.
//!
//! oha sends one body over and over (or picks lines of a file at random), and
//! a workflow needs a package of its own: the same package under another
//! delivery is a conflict at the Package service. So these phases post from
//! this binary run again as another process (`--post JOB`, a [`Job`] as
//! JSON), each request with its own package and owner, counting the answers
//! and timing each one. Closed loop, each connection sends its next request
//! when the last is answered; open loop, requests are due at a fixed rate
//! whether or not the answers keep up (see [`Schedule`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::bench::BODY;

/// What a posting run got back.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Posted {
    pub(crate) requests: u64,
    pub(crate) seconds: f64,
    pub(crate) requests_per_s: f64,
    /// Of the answered requests; `None` when none was.
    pub(crate) latency: Option<Latency>,
    /// Answers by HTTP status.
    pub(crate) statuses: BTreeMap<String, u64>,
    /// Requests that got no answer, by kind of error.
    pub(crate) errors: BTreeMap<String, u64>,
}

impl Posted {
    pub(crate) fn status(&self, code: &str) -> u64 {
        self.statuses.get(code).copied().unwrap_or(0)
    }

    pub(crate) fn other_than(&self, code: &str) -> BTreeMap<String, u64> {
        crate::load::other_than(&self.statuses, &self.errors, code)
    }
}

/// From when a request was due (open loop) or sent (closed loop) until its
/// answer was read, over every answered request: exact ranks of the sorted
/// microseconds, no histogram buckets.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Latency {
    pub(crate) p50_ms: f64,
    pub(crate) p99_ms: f64,
    pub(crate) p99_9_ms: f64,
    pub(crate) max_ms: f64,
    /// At each of [`PERCENTILES`], named as oha names them (`p99.9`): the
    /// latency chart's curve (absent from runs before it was kept).
    #[serde(default)]
    pub(crate) percentiles_ms: BTreeMap<String, f64>,
}

/// The percentiles oha reports, by its names, so that the poster's curves
/// and oha's are drawn at the same points.
const PERCENTILES: [(&str, f64); 9] = [
    ("p10", 0.1),
    ("p25", 0.25),
    ("p50", 0.5),
    ("p75", 0.75),
    ("p90", 0.9),
    ("p95", 0.95),
    ("p99", 0.99),
    ("p99.9", 0.999),
    ("p99.99", 0.9999),
];

/// Whether each request names its delivery with an `Idempotency-Key` of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Naming {
    Unnamed,
    Keyed,
}

/// How much a run sends, and when.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub(crate) enum Schedule {
    /// Closed loop: this many requests.
    Requests(u64),
    /// Closed loop until this much time has passed; the requests in flight
    /// then are answered and counted.
    For(Duration),
    /// Open loop: request `n` is due `n / per_s` seconds after the start, for
    /// `duration`. A request waits for a free connection when every one is
    /// busy, and its latency counts from when it was due, so a stall shows in
    /// every request it delays rather than only slowing the sending down
    /// (coordinated omission, which oha's `--latency-correction` corrects too).
    /// Every request due within `duration` is sent, however late: under
    /// overload the run outlasts `duration` and the latencies grow with the
    /// queue. Tokio's timer wakes a sender to the millisecond, as oha's
    /// does: up to 1 ms of a request's latency can be the poster's.
    Rate { per_s: u32, duration: Duration },
}

impl Schedule {
    /// Open loop at `per_s`, exactly `requests` of them: request `n` is sent
    /// when `n / per_s` falls before the duration, as [`post`] times it.
    pub(crate) fn paced(requests: u64, per_s: u32) -> Self {
        Self::Rate {
            per_s,
            duration: Duration::from_nanos(requests * 1_000_000_000 / u64::from(per_s.max(1))),
        }
    }
}

/// One posting run: the poster's arguments.
#[derive(Debug, Serialize, Deserialize)]
struct Job {
    url: String,
    schedule: Schedule,
    connections: u32,
    naming: Naming,
    /// The number of the first request, which names its package and owner.
    first: u64,
    /// Where each request asks for its callback: this URL, then `/bench-N`.
    callback: Option<String>,
    /// The API key each request carries (`x-api-key`), where the gateway asks for one.
    api_key: Option<String>,
    /// Whether every connection is opened (by a `GET /healthz` on each)
    /// before the first request is due, rather than as the requests need them.
    #[serde(default)]
    opened: bool,
    /// Requests posted together to `{url}/batch` in each of its requests;
    /// `None`: each request alone to `url`. A batch's requests count one by
    /// one, by the status of each one's result; its latency counts once.
    #[serde(default)]
    batch: Option<u32>,
}

/// Posts distinct delivery requests to `url` from another process, over at
/// most `connections` connections. They are numbered from `first` on, with
/// no gap (the requests [`Posted`] counts): a run against a store that
/// earlier runs posted to starts after their numbers, so that no package is
/// posted twice.
pub(crate) async fn post(
    url: &str,
    schedule: Schedule,
    connections: u32,
    naming: Naming,
    first: u64,
) -> anyhow::Result<Posted> {
    run_job(Job {
        url: url.to_owned(),
        schedule,
        connections,
        naming,
        first,
        callback: None,
        api_key: None,
        opened: false,
        batch: None,
    })
    .await
}

/// As [`post`], unnamed, closed loop for `duration`: `batch` requests in
/// each POST to `{url}/batch`.
pub(crate) async fn post_batches(
    url: &str,
    duration: Duration,
    connections: u32,
    batch: u32,
    first: u64,
) -> anyhow::Result<Posted> {
    run_job(Job {
        url: url.to_owned(),
        schedule: Schedule::For(duration),
        connections,
        naming: Naming::Unnamed,
        first,
        callback: None,
        api_key: None,
        opened: false,
        batch: Some(batch),
    })
    .await
}

/// As [`post`], unnamed, each request carrying `api_key` (a fleet's
/// gateways, which the Helm chart configures with API keys).
pub(crate) async fn post_with_key(
    url: &str,
    schedule: Schedule,
    connections: u32,
    api_key: &str,
) -> anyhow::Result<Posted> {
    run_job(Job {
        url: url.to_owned(),
        schedule,
        connections,
        naming: Naming::Unnamed,
        first: 0,
        callback: None,
        api_key: Some(api_key.to_owned()),
        opened: false,
        batch: None,
    })
    .await
}

/// As [`post`] from 0, named as `naming` says, each request asking for a
/// callback at `callback` (then `/bench-N`) when there is one.
pub(crate) async fn post_calling_back(
    url: &str,
    schedule: Schedule,
    connections: u32,
    naming: Naming,
    callback: Option<&str>,
) -> anyhow::Result<Posted> {
    run_job(Job {
        url: url.to_owned(),
        schedule,
        connections,
        naming,
        first: 0,
        callback: callback.map(str::to_owned),
        api_key: None,
        opened: false,
        batch: None,
    })
    .await
}

/// As [`post`], unnamed, from `first` on: a spike on `connections`
/// connections, every one of them opened before it starts when `opened`,
/// else as the requests need them (a burst of handshakes, which the
/// listener's backlog must hold). Raises this process's and the poster's
/// limit on open files to what the connections need.
pub(crate) async fn spike(
    url: &str,
    schedule: Schedule,
    connections: u32,
    opened: bool,
    first: u64,
) -> anyhow::Result<Posted> {
    raise_open_files(connections)?;
    run_job(Job {
        url: url.to_owned(),
        schedule,
        connections,
        naming: Naming::Unnamed,
        first,
        callback: None,
        api_key: None,
        opened,
        batch: None,
    })
    .await
}

/// Raises the soft limit on open files to what `connections` connections
/// need in a process that holds one side of each (the poster) or the other
/// (the gateway), with room for its stores and the services' connections.
fn raise_open_files(connections: u32) -> anyhow::Result<()> {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let needed = u64::from(connections) + 4_096;
    let limit = getrlimit(Resource::Nofile);
    if limit.current.is_none_or(|current| current >= needed) {
        return Ok(());
    }
    anyhow::ensure!(
        limit.maximum.is_none_or(|maximum| maximum >= needed),
        "{connections} connections need {needed} open files, over the hard limit (`ulimit -Hn`)"
    );
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(needed),
            maximum: limit.maximum,
        },
    )
    .context("cannot raise the limit on open files")
}

/// Runs `job` in another process (this binary with `--post`).
async fn run_job(job: Job) -> anyhow::Result<Posted> {
    let args = vec!["--post".to_owned(), serde_json::to_string(&job)?];
    tokio::task::spawn_blocking(move || crate::rerun(&args, "the poster"))
        .await
        .context("the poster's thread panicked")?
}

/// The poster's side: posts, then prints [`Posted`] as JSON on stdout.
pub(crate) fn run(args: &[String]) -> anyhow::Result<()> {
    let [job] = args else {
        anyhow::bail!("--post takes one argument, the job as JSON");
    };
    let job: Job = serde_json::from_str(job).context("--post JOB")?;
    raise_open_files(job.connections)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let posted = runtime.block_on(post_all(job))?;
    println!("{}", serde_json::to_string(&posted)?);
    Ok(())
}

/// What one connection's sender counted.
#[derive(Debug, Default)]
struct Counts {
    statuses: HashMap<u16, u64>,
    errors: HashMap<String, u64>,
    /// Microseconds, of each answered request.
    latencies: Vec<u32>,
}

async fn post_all(job: Job) -> anyhow::Result<Posted> {
    let connections = usize::try_from(job.connections)?;
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(connections)
        .build()?;
    if job.opened {
        open(&client, &job.url, connections).await?;
    }
    let next = Arc::new(AtomicU64::new(0));
    let job = Arc::new(job);
    let started = Instant::now();
    let mut senders = tokio::task::JoinSet::new();
    for _ in 0..connections {
        let (client, next, job) = (client.clone(), Arc::clone(&next), Arc::clone(&job));
        senders.spawn(async move {
            let mut counts = Counts::default();
            loop {
                // Time is up before a number is taken, so that the numbers
                // sent run on without a gap (see [`post`]).
                if let Schedule::For(duration) = job.schedule
                    && started.elapsed() >= duration
                {
                    return counts;
                }
                let size = u64::from(job.batch.unwrap_or(1));
                let n = next.fetch_add(size, Ordering::Relaxed);
                let due = match job.schedule {
                    Schedule::Requests(requests) if n >= requests => return counts,
                    Schedule::Requests(_) | Schedule::For(_) => Instant::now(),
                    Schedule::Rate { per_s, duration } => {
                        let after =
                            Duration::from_nanos(n * 1_000_000_000 / u64::from(per_s.max(1)));
                        if after >= duration {
                            return counts;
                        }
                        let due = started + after;
                        if due > Instant::now() {
                            tokio::time::sleep_until(due).await;
                        }
                        due
                    }
                };
                let n = job.first + n;
                let post = match job.batch {
                    Some(_) => {
                        let requests: Vec<String> = (n..n + size).map(|n| body(&job, n)).collect();
                        client
                            .post(format!("{}/batch", job.url))
                            .body(format!(r#"{{"requests":[{}]}}"#, requests.join(",")))
                    }
                    None => client.post(&job.url).body(body(&job, n)),
                };
                let mut post = post.header("content-type", "application/json");
                if job.naming == Naming::Keyed {
                    post = post.header("idempotency-key", format!("bench-{n}"));
                }
                if let Some(key) = &job.api_key {
                    post = post.header("x-api-key", key);
                }
                match post.send().await {
                    Ok(response) => {
                        let status = response.status().as_u16();
                        // Read the answer to the end so the connection is reused.
                        let answer = response.bytes().await.unwrap_or_default();
                        let micros = due.elapsed().as_micros();
                        counts
                            .latencies
                            .push(u32::try_from(micros).unwrap_or(u32::MAX));
                        if job.batch.is_some() && status == 200 {
                            for status in result_statuses(&answer) {
                                *counts.statuses.entry(status).or_default() += 1;
                            }
                        } else {
                            *counts.statuses.entry(status).or_default() += size;
                        }
                    }
                    Err(e) => {
                        let kind = if e.is_timeout() {
                            "timeout"
                        } else if e.is_connect() {
                            "connection refused"
                        } else {
                            "request failed"
                        };
                        *counts.errors.entry(kind.to_owned()).or_default() += size;
                    }
                }
            }
        });
    }
    let mut statuses = BTreeMap::new();
    let mut errors = BTreeMap::new();
    let mut latencies = Vec::new();
    for counts in senders.join_all().await {
        for (status, n) in counts.statuses {
            *statuses.entry(status.to_string()).or_default() += n;
        }
        for (kind, n) in counts.errors {
            *errors.entry(kind).or_default() += n;
        }
        latencies.extend(counts.latencies);
    }
    let seconds = started.elapsed().as_secs_f64();
    let requests = statuses.values().chain(errors.values()).sum();
    Ok(Posted {
        requests,
        seconds,
        requests_per_s: requests as f64 / seconds,
        latency: Latency::of(&mut latencies),
        statuses,
        errors,
    })
}

/// Request `n` of `job`: a package and owner of its own, and its callback.
fn body(job: &Job, n: u64) -> String {
    let body = BODY
        .replace("\"pkg-1\"", &format!("\"pkg-{n}\""))
        .replace("\"owner-1\"", &format!("\"owner-{n}\""));
    match &job.callback {
        Some(callback) => body.replacen(
            '{',
            &format!("{{\"callbackUrl\":\"{callback}/bench-{n}\","),
            1,
        ),
        None => body,
    }
}

/// The status of each result of a batch's answer (none when it is not one).
fn result_statuses(answer: &[u8]) -> Vec<u16> {
    #[derive(Deserialize)]
    struct Answer {
        results: Vec<Result>,
    }
    #[derive(Deserialize)]
    struct Result {
        status: u16,
    }
    serde_json::from_slice::<Answer>(answer)
        .map(|answer| answer.results.iter().map(|r| r.status).collect())
        .unwrap_or_default()
}

/// Opens `connections` connections to `url`'s server and leaves them idle
/// in `client`'s pool: as many `GET /healthz` at once, each holding its
/// connection (its answer's body unread) until all are answered.
async fn open(client: &reqwest::Client, url: &str, connections: usize) -> anyhow::Result<()> {
    let mut health = reqwest::Url::parse(url).context("the job's url")?;
    health.set_path("/healthz");
    let all_answered = Arc::new(tokio::sync::Barrier::new(connections));
    let mut opening = tokio::task::JoinSet::new();
    for _ in 0..connections {
        let (client, health) = (client.clone(), health.clone());
        let all_answered = Arc::clone(&all_answered);
        opening.spawn(async move {
            let answer = client
                .get(health)
                .send()
                .await
                .and_then(|r| r.error_for_status());
            all_answered.wait().await;
            answer?.bytes().await.map(drop)
        });
    }
    for opened in opening.join_all().await {
        opened.context("cannot open a connection before the spike")?;
    }
    Ok(())
}

impl Latency {
    /// The percentiles of `micros` (sorted here); `None` when it is empty.
    pub(crate) fn of(micros: &mut [u32]) -> Option<Self> {
        micros.sort_unstable();
        let max = *micros.last()?;
        let ms = |us: u32| f64::from(us) / 1_000.0;
        // The smallest value at or above a fraction `q` of the requests.
        let at = |q: f64| {
            let rank = (q * micros.len() as f64).ceil() as usize;
            ms(micros[rank.clamp(1, micros.len()) - 1])
        };
        Some(Self {
            p50_ms: at(0.5),
            p99_ms: at(0.99),
            p99_9_ms: at(0.999),
            max_ms: ms(max),
            percentiles_ms: PERCENTILES
                .iter()
                .map(|&(name, q)| (name.to_owned(), at(q)))
                .collect(),
        })
    }
}
