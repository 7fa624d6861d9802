//! The held-reads phase: status reads that wait for a change (`wait=10`),
//! on the all-in-one with the services at 20 ms.
//!
//! 1. Deliveries posted at a fixed rate, each read right after its 202 with
//!    `wait=10` (then with `If-None-Match` naming what it got) until it is
//!    terminal: how many reads each took, and how long after its terminal
//!    write the answer came.
//! 2. The gateway's POSTs, closed loop, alone and then beside thousands of
//!    held reads (more than `gateway.max_in_flight`), in the same run: their
//!    rate against each other, and the 503s of each.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use skyport_core::ports::Lane;
use skyport_core::status::{DeliveryState, StatusDocument};
use skyport_gateway::receipt::Receipts;
use time::OffsetDateTime;
use tokio::task::JoinSet;

use crate::bench::{BODY, Bench};
use crate::load::Measured;
use crate::phases::{Verdict, latency};
use crate::poster::Latency;

/// How long a held read asks to wait.
const WAIT_S: u64 = 10;

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct HeldReads {
    /// Deliveries posted and read with waits, and at what rate.
    pub(crate) deliveries: u64,
    pub(crate) rate: u32,
    /// The deliveries whose terminal status took two reads (one answered
    /// their Processing write first); the rest took one.
    pub(crate) two_reads: u64,
    /// The most reads any took: at most 2.
    pub(crate) most_reads: u64,
    /// From the terminal write to the answer that carried it.
    pub(crate) after_write: Option<Latency>,
    /// Reads held while the POSTs were measured the second time.
    pub(crate) held: u64,
    pub(crate) max_in_flight: usize,
    pub(crate) posts_alone: Measured,
    pub(crate) posts_beside_held: Measured,
    /// The second rate over the first.
    pub(crate) ratio: f64,
}

impl Bench {
    pub(crate) async fn held_reads(&self) -> anyhow::Result<HeldReads> {
        let plan = &self.plan;
        // Every read comes from this one client: it may hold them all (the
        // default share of one client, `gateway.max_waiting_per_client`, is 64).
        let room = (plan.held + 64).to_string();
        let waiting = [
            ("gateway.max_waiting", room.clone()),
            ("gateway.max_waiting_per_client", room),
        ];
        let settings = self.settings("held-reads", &waiting)?;
        let (system, services) = self.system("held-reads", 0, &waiting).await?;
        Self::await_partitions("held-reads", &system, settings.stream.partitions).await?;
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(WAIT_S + 20))
            .build()?;

        eprintln!(
            "held reads: {} deliveries at {}/s, each read with wait={WAIT_S} until terminal",
            plan.held_deliveries, plan.held_rate
        );
        let mut reads = JoinSet::new();
        let pace = Duration::from_secs_f64(1.0 / f64::from(plan.held_rate));
        for n in 0..plan.held_deliveries {
            tokio::time::sleep(pace).await;
            let (http, url) = (http.clone(), system.url.clone());
            reads.spawn(async move { post_and_hold(&http, &url, n).await });
        }
        let mut most_reads = 0;
        let mut two_reads = 0;
        let mut after = Vec::new();
        for read in reads.join_all().await {
            let (count, micros) = read?;
            most_reads = most_reads.max(count);
            two_reads += u64::from(count == 2);
            after.push(micros);
        }
        self.drain(&system, plan.held_deliveries).await?;

        eprintln!(
            "held reads: POSTs closed loop at 64 connections, alone then beside {} held reads",
            plan.held
        );
        let posts_alone = self.load(&system.url, self.closed_loop(64)).await?;
        let receipts = Receipts::new(&system.app.backends.ports.receipt_keys);
        let gateway = system
            .url
            .trim_end_matches("/api/deliveryrequests")
            .to_owned();
        let mut holding = JoinSet::new();
        let wait = plan.closed_loop.as_secs() + 10;
        for n in 0..plan.held {
            let id = format!("held-{n}");
            let receipt = receipts.sign(&id, OffsetDateTime::now_utc(), Lane::Normal, None);
            let url = format!(
                "{gateway}/api/deliveryrequests/{id}/status?receipt={receipt}&wait={}",
                wait.min(30)
            );
            let http = http.clone();
            holding.spawn(async move { http.get(url).send().await.map(|r| r.status()) });
        }
        let gauge = &skyport_runtime::metrics::global().http_held;
        let started = tokio::time::Instant::now();
        while u64::try_from(gauge.get()).unwrap_or(0) < plan.held {
            anyhow::ensure!(
                started.elapsed() < Duration::from_secs(30),
                "held reads: {} of {} held after 30 s",
                gauge.get(),
                plan.held
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let posts_beside_held = self.load(&system.url, self.closed_loop(64)).await?;
        let still_held = u64::try_from(gauge.get()).unwrap_or(0);
        anyhow::ensure!(
            still_held == plan.held,
            "held reads: {still_held} of {} still held after the POSTs",
            plan.held
        );
        holding.abort_all();
        let accepted = posts_alone.status("202") + posts_beside_held.status("202");
        self.drain(&system, accepted + plan.held_deliveries).await?;
        let max_in_flight = settings.gateway.max_in_flight;
        Self::stop(system, services).await?;
        Ok(HeldReads {
            deliveries: plan.held_deliveries,
            rate: plan.held_rate,
            two_reads,
            most_reads,
            after_write: Latency::of(&mut after),
            held: plan.held,
            max_in_flight,
            ratio: posts_beside_held.requests_per_s / posts_alone.requests_per_s,
            posts_alone,
            posts_beside_held,
        })
    }
}

impl HeldReads {
    /// Reads a delivery took and how soon after its terminal write; the POSTs
    /// beside the held reads against alone.
    pub(crate) fn verdicts(&self) -> Vec<Verdict> {
        vec![
            Verdict {
                what: format!(
                    "held reads: {} deliveries at {}/s, each read with wait=10 until terminal",
                    self.deliveries, self.rate
                ),
                measured: format!(
                    "at most {} reads each ({} took two); terminal write to answer: {}",
                    self.most_reads,
                    self.two_reads,
                    latency(self.after_write.as_ref())
                ),
                target: "≤ 2 reads; p99 ≤ 50 ms",
                met: Some(
                    self.most_reads <= 2
                        && self.after_write.as_ref().is_some_and(|l| l.p99_ms <= 50.0),
                ),
            },
            Verdict {
                what: format!(
                    "POSTs beside {} held reads (max_in_flight {}), closed loop at 64 connections",
                    self.held, self.max_in_flight
                ),
                measured: format!(
                    "{:.0}/s against {:.0}/s alone: {:.2} ×; 503s {} beside, {} alone; p99 {:.2} ms against {:.2} ms",
                    self.posts_beside_held.requests_per_s,
                    self.posts_alone.requests_per_s,
                    self.ratio,
                    self.posts_beside_held.status("503"),
                    self.posts_alone.status("503"),
                    self.posts_beside_held.p99_ms,
                    self.posts_alone.p99_ms
                ),
                target: "within noise (≥ 0.9 ×), no 503",
                met: Some(self.ratio >= 0.9 && self.posts_beside_held.status("503") == 0),
            },
        ]
    }

    /// What fails the run: a delivery that took more than two reads; in a
    /// smoke run, no POST accepted beside the held reads.
    pub(crate) fn failures(&self, full: bool) -> Vec<String> {
        let mut failures = Vec::new();
        if self.most_reads > 2 || (!full && self.posts_beside_held.status("202") == 0) {
            failures.push(format!(
                "held reads: a delivery took {} reads, {} POSTs accepted beside them",
                self.most_reads,
                self.posts_beside_held.status("202")
            ));
        }
        failures
    }
}

/// Posts delivery `n` to `url`, then reads its status with waits until it
/// is terminal: the reads it took, and the microseconds from its terminal
/// write to the answer.
async fn post_and_hold(http: &reqwest::Client, url: &str, n: u64) -> anyhow::Result<(u64, u32)> {
    // A package of its own, so that each delivery runs its five steps.
    let body = BODY.replace("pkg-1", &format!("pkg-held-{n}"));
    let response = http
        .post(url)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await?;
    anyhow::ensure!(
        response.status() == 202,
        "POST answered {}",
        response.status()
    );
    let accepted: serde_json::Value = response.json().await?;
    let status = accepted["statusUrl"]
        .as_str()
        .ok_or_else(|| anyhow::anyhow!("a 202 without statusUrl"))?;
    let held = format!("{status}&wait={WAIT_S}");
    let mut seen: Option<String> = None;
    for reads in 1..=5 {
        let mut request = http.get(&held);
        if let Some(etag) = &seen {
            request = request.header("if-none-match", etag);
        }
        let response = request.send().await?;
        let answered = OffsetDateTime::now_utc();
        if response.status() == 304 {
            continue;
        }
        anyhow::ensure!(
            response.status() == 200,
            "a held read answered {}",
            response.status()
        );
        seen = response
            .headers()
            .get("etag")
            .and_then(|etag| etag.to_str().ok())
            .map(str::to_owned);
        let document: StatusDocument = response.json().await?;
        anyhow::ensure!(
            document.state != DeliveryState::Failed,
            "{status}: Failed: {:?}",
            document.failure
        );
        if document.state.is_terminal() {
            let micros = (answered - document.updated_at).whole_microseconds().max(0);
            return Ok((reads, u32::try_from(micros).unwrap_or(u32::MAX)));
        }
    }
    anyhow::bail!("{status}: not terminal after 5 held reads")
}
