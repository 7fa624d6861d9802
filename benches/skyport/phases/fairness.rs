//! The fairness phases, on the all-in-one with the services at 20 ms.
//!
//! - `expedited`: a burst is accepted and drained at the rate the backends
//!   sustain (`worker.rate_limit_per_s`, as in the burst phase); while it
//!   drains, one expedited delivery a second is posted. Their time to
//!   terminal, against the backlog's drain time: what an expedited delivery
//!   would have waited at the back of the backlog without its lane.
//! - `noisy-neighbour`: clients B to E post 50/s each, first alone (the quiet
//!   baseline) and then while client A posts at ten times its quota; quotas
//!   on for every client. A's refusals, B to E's, and B to E's time to
//!   terminal against the baseline, in the same run.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use skyport_core::ports::Lane;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::bench::{BODY, Bench, micros_to_terminal, terminal_documents};
use crate::phases::{Verdict, latency};
use crate::poster::{self, Latency, Naming, Schedule};
use crate::servers::AllInOne;

/// Each quiet client's rate, and A's quota: A posts at ten times it.
const QUIET_RATE: u32 = 50;
const QUOTA: u32 = 100;
const QUIET_CLIENTS: [&str; 4] = ["client-b", "client-c", "client-d", "client-e"];

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Expedited {
    pub(crate) burst: u64,
    /// The rate the worker drains at (`worker.rate_limit_per_s`).
    pub(crate) drain_rate: u32,
    /// From the burst's last 202 to its last delivery's terminal write.
    pub(crate) drain_s: f64,
    /// The burst's time to terminal: its p99 is about the drain time.
    pub(crate) normal: Option<Latency>,
    /// Expedited deliveries posted, one a second, while the burst drained.
    pub(crate) expedited: u64,
    pub(crate) expedited_terminal: Option<Latency>,
    /// Each in the expedited lane.
    pub(crate) in_lane: u64,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Posted {
    pub(crate) sent: u64,
    pub(crate) accepted: u64,
    pub(crate) refused: u64,
    /// Answers that were neither 202 nor 429.
    pub(crate) other: u64,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct NoisyNeighbour {
    pub(crate) duration_s: u64,
    pub(crate) quota_per_s: u32,
    pub(crate) quiet_rate: u32,
    pub(crate) noisy_rate: u32,
    /// B to E alone: their posts and time to terminal.
    pub(crate) quiet_alone: Posted,
    pub(crate) quiet_alone_terminal: Option<Latency>,
    /// B to E beside A.
    pub(crate) quiet_beside: Posted,
    pub(crate) quiet_beside_terminal: Option<Latency>,
    pub(crate) noisy: Posted,
    /// B to E's p99 beside A over their p99 alone.
    pub(crate) ratio: f64,
}

impl Bench {
    pub(crate) async fn expedited(&self) -> anyhow::Result<Expedited> {
        let plan = &self.plan;
        let (system, services) = self.system("expedited", plan.burst_drain_rate, &[]).await?;
        eprintln!(
            "expedited: {} requests at {} connections, drained at {}/s, one expedited a second meanwhile",
            plan.expedited_burst, plan.burst_connections, plan.burst_drain_rate
        );
        let burst = poster::post(
            &system.url,
            Schedule::Requests(plan.expedited_burst),
            plan.burst_connections,
            Naming::Unnamed,
            0,
        )
        .await?;
        let accepted = burst.status("202");
        anyhow::ensure!(
            accepted == plan.expedited_burst,
            "expedited: {accepted} of {} accepted",
            plan.expedited_burst
        );
        let posted = Instant::now();
        let http = reqwest::Client::new();
        let mut expedited = Vec::new();
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        let mut drained = None;
        while drained.is_none() || (expedited.len() as u64) < plan.expedited_samples {
            tick.tick().await;
            let n = expedited.len();
            let body = request(&format!("urgent-{n}"), &format!("x-{n}"), true);
            let status = post(&http, &system.url, body).await?;
            anyhow::ensure!(status == 202, "expedited: a delivery answered {status}");
            expedited.push(status);
            if drained.is_none() && system.terminal() >= accepted {
                drained = Some(posted.elapsed());
            }
        }
        let drain = drained.unwrap_or_else(|| posted.elapsed());
        self.drain(&system, accepted + expedited.len() as u64)
            .await?;
        let mut normal = Vec::new();
        let mut urgent = Vec::new();
        let mut in_lane = 0;
        for document in terminal_documents(&system).await? {
            let micros = micros_to_terminal(&document);
            if document
                .owner_id
                .as_deref()
                .is_some_and(|o| o.starts_with("urgent-"))
            {
                in_lane += u64::from(document.lane == Lane::Expedited);
                urgent.push(micros);
            } else {
                normal.push(micros);
            }
        }
        anyhow::ensure!(
            urgent.len() == expedited.len(),
            "expedited: {} of {} expedited deliveries terminal",
            urgent.len(),
            expedited.len()
        );
        Self::stop(system, services).await?;
        Ok(Expedited {
            burst: plan.expedited_burst,
            drain_rate: plan.burst_drain_rate,
            drain_s: drain.as_secs_f64(),
            normal: Latency::of(&mut normal),
            expedited: expedited.len() as u64,
            expedited_terminal: Latency::of(&mut urgent),
            in_lane,
        })
    }

    pub(crate) async fn noisy_neighbour(&self) -> anyhow::Result<NoisyNeighbour> {
        let duration = self.plan.noisy_duration;
        let quotas = [
            ("gateway.quotas.default_per_s", QUOTA.to_string()),
            ("gateway.quotas.burst", QUOTA.to_string()),
        ];
        let (system, services) = self.system("noisy-neighbour", 0, &quotas).await?;
        eprintln!(
            "noisy neighbour: B to E at {QUIET_RATE}/s each for {} s, alone",
            duration.as_secs()
        );
        let quiet_alone =
            post_clients(&system, &QUIET_CLIENTS, "alone", QUIET_RATE, duration).await?;
        eprintln!(
            "noisy neighbour: B to E again beside A at {}/s (quota {QUOTA}/s)",
            QUOTA * 10
        );
        let (quiet_beside, noisy) = tokio::join!(
            post_clients(&system, &QUIET_CLIENTS, "beside", QUIET_RATE, duration),
            post_clients(&system, &["client-a"], "noisy", QUOTA * 10, duration),
        );
        let (quiet_beside, noisy) = (quiet_beside?, noisy?);
        self.drain(
            &system,
            quiet_alone.accepted + quiet_beside.accepted + noisy.accepted,
        )
        .await?;
        let mut alone = Vec::new();
        let mut beside = Vec::new();
        for document in terminal_documents(&system).await? {
            let micros = micros_to_terminal(&document);
            match document.owner_id.as_deref() {
                Some(owner) if owner.ends_with("-alone") => alone.push(micros),
                Some(owner) if owner.ends_with("-beside") => beside.push(micros),
                _ => {}
            }
        }
        Self::stop(system, services).await?;
        let quiet_alone_terminal = Latency::of(&mut alone);
        let quiet_beside_terminal = Latency::of(&mut beside);
        let ratio = match (&quiet_alone_terminal, &quiet_beside_terminal) {
            (Some(alone), Some(beside)) => beside.p99_ms / alone.p99_ms,
            _ => f64::NAN,
        };
        Ok(NoisyNeighbour {
            duration_s: duration.as_secs(),
            quota_per_s: QUOTA,
            quiet_rate: QUIET_RATE,
            noisy_rate: QUOTA * 10,
            quiet_alone,
            quiet_alone_terminal,
            quiet_beside,
            quiet_beside_terminal,
            noisy,
            ratio,
        })
    }
}

impl Expedited {
    /// The expedited deliveries' time to terminal, each in its lane.
    pub(crate) fn verdicts(&self) -> Vec<Verdict> {
        vec![Verdict {
            what: format!(
                "expedited: a burst of {} drained at {}/s, one expedited delivery a second meanwhile ({} posted)",
                self.burst, self.drain_rate, self.expedited
            ),
            measured: format!(
                "expedited time to terminal {}, {} of {} in their lane; the burst drained in {:.1} s (its time to terminal {}), which an expedited delivery would have waited without its lane",
                latency(self.expedited_terminal.as_ref()),
                self.in_lane,
                self.expedited,
                self.drain_s,
                latency(self.normal.as_ref())
            ),
            target: "p99 ≤ 1 s",
            met: Some(
                self.in_lane == self.expedited
                    && self
                        .expedited_terminal
                        .as_ref()
                        .is_some_and(|l| l.p99_ms <= 1_000.0),
            ),
        }]
    }

    /// What fails the run: an expedited delivery out of its lane, or none terminal.
    pub(crate) fn failures(&self) -> Vec<String> {
        let mut failures = Vec::new();
        if self.in_lane < self.expedited || self.expedited_terminal.is_none() {
            failures.push(format!(
                "expedited: {} of {} expedited deliveries ran in their lane",
                self.in_lane, self.expedited
            ));
        }
        failures
    }
}

impl NoisyNeighbour {
    /// A refused beyond its quota, B to E not, and their time to terminal
    /// beside A against alone.
    pub(crate) fn verdicts(&self) -> Vec<Verdict> {
        vec![Verdict {
            what: format!(
                "noisy neighbour: A at {}/s (quota {}/s) beside B to E at {}/s each, {} s; B to E alone first",
                self.noisy_rate, self.quota_per_s, self.quiet_rate, self.duration_s
            ),
            measured: format!(
                "A: {} accepted, {} refused (429) of {}; B to E: {} refused beside A, {} alone; their time to terminal {} beside A against {} alone: p99 {:.2} ×",
                self.noisy.accepted,
                self.noisy.refused,
                self.noisy.sent,
                self.quiet_beside.refused,
                self.quiet_alone.refused,
                latency(self.quiet_beside_terminal.as_ref()),
                latency(self.quiet_alone_terminal.as_ref()),
                self.ratio
            ),
            target: "A refused beyond its quota; B to E: no 429, p99 ≤ 2 ×",
            met: Some(
                self.noisy.refused > 0
                    && self.quiet_beside.refused == 0
                    && self.quiet_alone.refused == 0
                    && self.ratio <= 2.0,
            ),
        }]
    }

    /// What fails the run: B to E refused, A never refused, or an answer
    /// neither 202 nor 429.
    pub(crate) fn failures(&self) -> Vec<String> {
        let mut failures = Vec::new();
        if self.quiet_beside.refused > 0
            || self.quiet_alone.refused > 0
            || self.noisy.refused == 0
            || self.noisy.other + self.quiet_beside.other + self.quiet_alone.other > 0
        {
            failures.push(format!(
                "noisy neighbour: B to E refused {} and {}, A refused {}, answers neither 202 nor 429: {}",
                self.quiet_alone.refused,
                self.quiet_beside.refused,
                self.noisy.refused,
                self.noisy.other + self.quiet_beside.other + self.quiet_alone.other
            ));
        }
        failures
    }
}

/// The bench's request of `owner`, its package `package`, expedited or not.
fn request(owner: &str, package: &str, expedited: bool) -> String {
    let body = BODY
        .replace("\"owner-1\"", &format!("\"{owner}\""))
        .replace("\"pkg-1\"", &format!("\"{package}\""));
    if expedited {
        body.replacen('{', "{\"expedited\":true,", 1)
    } else {
        body
    }
}

async fn post(http: &reqwest::Client, url: &str, body: String) -> anyhow::Result<u16> {
    let response = http
        .post(url)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await?;
    let status = response.status().as_u16();
    response.bytes().await?;
    Ok(status)
}

/// Each of `clients` posting at `rate` for `duration` (their owners named
/// `CLIENT-tag`, so that each run's deliveries are told apart), counted
/// together.
async fn post_clients(
    system: &AllInOne,
    clients: &[&str],
    tag: &str,
    rate: u32,
    duration: Duration,
) -> anyhow::Result<Posted> {
    let http = reqwest::Client::new();
    let mut posts = JoinSet::new();
    let pace = Duration::from_secs_f64(1.0 / f64::from(rate));
    let started = Instant::now();
    let mut n = 0u64;
    while started.elapsed() < duration {
        for client in clients {
            let body = request(
                &format!("{client}-{tag}"),
                &format!("{client}-{tag}-{n}"),
                false,
            );
            let (http, url) = (http.clone(), system.url.clone());
            posts.spawn(async move { post(&http, &url, body).await });
        }
        n += 1;
        tokio::time::sleep_until(started + pace * u32::try_from(n).unwrap_or(u32::MAX)).await;
    }
    let mut posted = Posted {
        sent: 0,
        accepted: 0,
        refused: 0,
        other: 0,
    };
    for status in posts.join_all().await {
        posted.sent += 1;
        match status? {
            202 => posted.accepted += 1,
            429 => posted.refused += 1,
            _ => posted.other += 1,
        }
    }
    Ok(posted)
}
