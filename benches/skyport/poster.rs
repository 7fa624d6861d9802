//! Distinct delivery requests for the phases that run the whole system.
//!
//! oha sends one body over and over (or picks lines of a file at random), and
//! a workflow needs a package of its own: the same package under another
//! delivery is a conflict at the Package service. So these phases post from
//! this binary run again as another process (`--post URL REQUESTS
//! CONNECTIONS`), each request with its own package and owner, as fast as
//! `CONNECTIONS` connections allow, counting the answers.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};

use crate::BODY;

/// What a posting run got back.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Posted {
    pub(crate) requests: u64,
    pub(crate) seconds: f64,
    pub(crate) requests_per_s: f64,
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

/// Whether each request names its delivery with an `Idempotency-Key` of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Naming {
    Unnamed,
    Keyed,
}

/// Posts `requests` distinct delivery requests to `url` from another process.
pub(crate) async fn post(
    url: &str,
    requests: u64,
    connections: u32,
    naming: Naming,
) -> anyhow::Result<Posted> {
    let mut args = vec![
        "--post".to_owned(),
        url.to_owned(),
        requests.to_string(),
        connections.to_string(),
    ];
    if naming == Naming::Keyed {
        args.push("--keyed".to_owned());
    }
    tokio::task::spawn_blocking(move || crate::rerun(&args, "the poster"))
        .await
        .context("the poster's thread panicked")?
}

/// The poster's side: posts, then prints [`Posted`] as JSON on stdout.
pub(crate) fn run(args: &[String]) -> anyhow::Result<()> {
    let (naming, args) = match args {
        [rest @ .., last] if last == "--keyed" => (Naming::Keyed, rest),
        _ => (Naming::Unnamed, args),
    };
    let [url, requests, connections] = args else {
        bail!("--post takes URL REQUESTS CONNECTIONS [--keyed]");
    };
    let requests: u64 = requests.parse().context("REQUESTS")?;
    let connections: usize = connections.parse().context("CONNECTIONS")?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let posted = runtime.block_on(post_all(url, requests, connections, naming))?;
    println!("{}", serde_json::to_string(&posted)?);
    Ok(())
}

async fn post_all(
    url: &str,
    requests: u64,
    connections: usize,
    naming: Naming,
) -> anyhow::Result<Posted> {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(connections)
        .build()?;
    let next = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut senders = tokio::task::JoinSet::new();
    for _ in 0..connections {
        let (client, next, url) = (client.clone(), Arc::clone(&next), url.to_owned());
        senders.spawn(async move {
            let mut statuses = HashMap::<u16, u64>::new();
            let mut errors = HashMap::<String, u64>::new();
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= requests {
                    return (statuses, errors);
                }
                let body = BODY
                    .replace("\"pkg-1\"", &format!("\"pkg-{n}\""))
                    .replace("\"owner-1\"", &format!("\"owner-{n}\""));
                let mut post = client
                    .post(&url)
                    .header("content-type", "application/json")
                    .body(body);
                if naming == Naming::Keyed {
                    post = post.header("idempotency-key", format!("bench-{n}"));
                }
                let sent = post.send().await;
                match sent {
                    Ok(response) => {
                        let status = response.status().as_u16();
                        // Read the answer to the end so the connection is reused.
                        let _ = response.bytes().await;
                        *statuses.entry(status).or_default() += 1;
                    }
                    Err(e) => {
                        let kind = if e.is_timeout() {
                            "timeout"
                        } else if e.is_connect() {
                            "connection refused"
                        } else {
                            "request failed"
                        };
                        *errors.entry(kind.to_owned()).or_default() += 1;
                    }
                }
            }
        });
    }
    let mut statuses = BTreeMap::new();
    let mut errors = BTreeMap::new();
    for (s, e) in senders.join_all().await {
        for (status, n) in s {
            *statuses.entry(status.to_string()).or_default() += n;
        }
        for (kind, n) in e {
            *errors.entry(kind).or_default() += n;
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    Ok(Posted {
        requests,
        seconds,
        requests_per_s: requests as f64 / seconds,
        statuses,
        errors,
    })
}
