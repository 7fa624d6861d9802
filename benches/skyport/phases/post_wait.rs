//! The post-wait phase: POSTs with `Prefer: wait=10` on the all-in-one with
//! the services at 20 ms, at a fixed rate: each must answer 200 with its
//! outcome, and its answer time is set against its workflow's time to
//! terminal (acceptance to the terminal write, from the outcome it carries).

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use skyport_core::status::{DeliveryState, StatusDocument};
use tokio::task::JoinSet;

use crate::bench::{BODY, Bench};
use crate::phases::{Verdict, latency};
use crate::poster::Latency;

/// How long each POST asks to be held.
const WAIT_S: u64 = 10;

/// The goal: the answer at most this long after the workflow's end, at p99.
const OVER_TARGET_MS: f64 = 10.0;

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct PostWait {
    pub(crate) deliveries: u64,
    pub(crate) rate: u32,
    /// From the POST's sending to its answer.
    pub(crate) answer: Option<Latency>,
    /// The workflow's time to terminal, from the outcome.
    pub(crate) workflow: Option<Latency>,
    /// Each answer's time less its workflow's time to terminal.
    pub(crate) over_workflow: Option<Latency>,
    /// Answers that were not a 200 with a Scheduled outcome.
    pub(crate) not_answered: u64,
}

impl Bench {
    pub(crate) async fn post_wait(&self) -> anyhow::Result<PostWait> {
        let plan = &self.plan;
        let (system, services) = self.system("post-wait", 0, &[]).await?;
        let settings = self.settings("post-wait", &[])?;
        Self::await_partitions("post-wait", &system, settings.stream.partitions).await?;
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(WAIT_S + 20))
            .build()?;
        eprintln!(
            "post-wait: {} deliveries at {}/s, each POST with Prefer: wait={WAIT_S}",
            plan.held_deliveries, plan.held_rate
        );
        let mut posts = JoinSet::new();
        let pace = Duration::from_secs_f64(1.0 / f64::from(plan.held_rate));
        for n in 0..plan.held_deliveries {
            tokio::time::sleep(pace).await;
            let (http, url) = (http.clone(), system.url.clone());
            posts.spawn(async move { post_and_wait(&http, &url, n).await });
        }
        let (mut answers, mut workflows, mut over) = (Vec::new(), Vec::new(), Vec::new());
        let mut not_answered = 0;
        for post in posts.join_all().await {
            match post? {
                Some((answer, workflow)) => {
                    answers.push(answer);
                    workflows.push(workflow);
                    over.push(answer.saturating_sub(workflow));
                }
                None => not_answered += 1,
            }
        }
        self.drain(&system, plan.held_deliveries).await?;
        Self::stop(system, services).await?;
        Ok(PostWait {
            deliveries: plan.held_deliveries,
            rate: plan.held_rate,
            answer: Latency::of(&mut answers),
            workflow: Latency::of(&mut workflows),
            over_workflow: Latency::of(&mut over),
            not_answered,
        })
    }
}

impl PostWait {
    pub(crate) fn verdicts(&self) -> Vec<Verdict> {
        vec![Verdict {
            what: format!(
                "POSTs with Prefer: wait={WAIT_S}, {} at {}/s, services at 20 ms: the outcome in one request",
                self.deliveries, self.rate
            ),
            measured: format!(
                "{} not answered with their outcome; answer {}; workflow {}; answer less workflow {}",
                self.not_answered,
                latency(self.answer.as_ref()),
                latency(self.workflow.as_ref()),
                latency(self.over_workflow.as_ref())
            ),
            target: "all 200; answer ≤ workflow + 10 ms at p99",
            met: Some(
                self.not_answered == 0
                    && self
                        .over_workflow
                        .as_ref()
                        .is_some_and(|l| l.p99_ms <= OVER_TARGET_MS),
            ),
        }]
    }

    /// What fails the run: a POST not answered with its outcome.
    pub(crate) fn failures(&self, _full: bool) -> Vec<String> {
        (self.not_answered > 0)
            .then(|| {
                format!(
                    "post-wait: {} of {} POSTs not answered with their outcome",
                    self.not_answered, self.deliveries
                )
            })
            .into_iter()
            .collect()
    }
}

/// Posts delivery `n` with `Prefer: wait`: the microseconds to its answer
/// and its workflow's time to terminal, or `None` when it was not answered
/// 200 with a Scheduled outcome.
async fn post_and_wait(
    http: &reqwest::Client,
    url: &str,
    n: u64,
) -> anyhow::Result<Option<(u32, u32)>> {
    // A package of its own, so that each delivery runs its five steps.
    let body = BODY.replace("pkg-1", &format!("pkg-wait-{n}"));
    let sent = Instant::now();
    let response = http
        .post(url)
        .header("content-type", "application/json")
        .header("prefer", format!("wait={WAIT_S}"))
        .body(body)
        .send()
        .await?;
    let status = response.status();
    let answer: serde_json::Value = response.json().await?;
    let answered = u32::try_from(sent.elapsed().as_micros()).unwrap_or(u32::MAX);
    if status != 200 {
        eprintln!("post-wait: delivery {n} answered {status}");
        return Ok(None);
    }
    let outcome: StatusDocument = serde_json::from_value(answer["outcome"].clone())?;
    if outcome.state != DeliveryState::Scheduled {
        eprintln!("post-wait: delivery {n} ended {:?}", outcome.state);
        return Ok(None);
    }
    let workflow = (outcome.updated_at - outcome.created_at)
        .whole_microseconds()
        .max(0);
    Ok(Some((
        answered,
        u32::try_from(workflow).unwrap_or(u32::MAX),
    )))
}
