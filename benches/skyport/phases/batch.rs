//! The batch phase: the gateway on the embedded store, closed loop, taking
//! single POSTs and then batches of 1, 10, 100 and 1,000 requests, each run
//! on a fresh store in the same process: deliveries accepted a second, and
//! the gateway's CPU per delivery (the poster is another process).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::bench::Bench;
use crate::cpu::CpuTime;
use crate::phases::{Verdict, describe, latency};
use crate::poster::{self, Latency, Naming, Posted, Schedule};
use crate::servers::GatewayOnly;

/// The batch sizes measured.
const SIZES: [u32; 4] = [1, 10, 100, 1_000];

/// The connections single POSTs are sent over: the ingest phase's best.
const SINGLE_CONNECTIONS: u32 = 64;

/// The batch size the target is set at, and the target: this many
/// times the single POSTs' rate.
const TARGET_SIZE: u32 = 100;
const TARGET_RATIO: f64 = 5.0;

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Batches {
    pub(crate) single: BatchRun,
    pub(crate) batches: Vec<BatchRun>,
}

/// One run: requests of `size` (0: single POSTs) over `connections`.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct BatchRun {
    pub(crate) size: u32,
    pub(crate) connections: u32,
    /// Deliveries answered 202 (in a batch, by their own result) a second.
    pub(crate) accepted_per_s: f64,
    /// The gateway's CPU (user and system) per delivery accepted.
    pub(crate) cpu_us_per_delivery: f64,
    /// Of each HTTP request (a batch's counts once).
    pub(crate) latency: Option<Latency>,
    /// Deliveries answered otherwise than 202, by status or error.
    pub(crate) refused: BTreeMap<String, u64>,
    /// Deliveries answered 202 that are not in the stream: must be 0.
    pub(crate) accepted_not_published: u64,
    /// This run's rate over the single POSTs'.
    pub(crate) ratio: f64,
}

impl Bench {
    pub(crate) async fn batch(&self) -> anyhow::Result<Batches> {
        let single = self.batch_run(0).await?;
        let mut batches = Vec::new();
        for size in SIZES {
            let mut run = self.batch_run(size).await?;
            run.ratio = run.accepted_per_s / single.accepted_per_s;
            batches.push(run);
        }
        Ok(Batches { single, batches })
    }

    /// Requests of `size` (0: single POSTs) on a fresh store, closed loop.
    async fn batch_run(&self, size: u32) -> anyhow::Result<BatchRun> {
        // About 64 deliveries in flight per size, and at least 4 requests.
        let connections = SINGLE_CONNECTIONS
            .checked_div(size)
            .map_or(SINGLE_CONNECTIONS, |share| {
                share.clamp(4, SINGLE_CONNECTIONS)
            });
        let what = if size == 0 {
            "single POSTs".to_owned()
        } else {
            format!("batches of {size}")
        };
        eprintln!("batch: {what}, closed loop at {connections} connections");
        let gateway = GatewayOnly::start(&self.settings(&format!("batch-{size}"), &[])?).await?;
        let duration = self.plan.closed_loop;
        let before = CpuTime::this()?;
        let posted: Posted = if size == 0 {
            poster::post(
                &gateway.url,
                Schedule::For(duration),
                connections,
                Naming::Unnamed,
                0,
            )
            .await?
        } else {
            poster::post_batches(&gateway.url, duration, connections, size, 0).await?
        };
        let cpu = CpuTime::this()?.since(before);
        let published = gateway.published();
        gateway.stop().await?;
        let accepted = posted.status("202");
        Ok(BatchRun {
            size,
            connections,
            accepted_per_s: accepted as f64 / posted.seconds,
            cpu_us_per_delivery: cpu.own_s * 1e6 / accepted.max(1) as f64,
            latency: posted.latency.clone(),
            refused: posted.other_than("202"),
            accepted_not_published: accepted.saturating_sub(published),
            ratio: 1.0,
        })
    }
}

impl Batches {
    pub(crate) fn verdicts(&self) -> Vec<Verdict> {
        let single = &self.single;
        let mut verdicts = vec![Verdict {
            what: format!(
                "batch: single POSTs, closed loop at {} connections (the baseline)",
                single.connections
            ),
            measured: format!(
                "{:.0} deliveries/s, {:.1} µs CPU each; latency {}",
                single.accepted_per_s,
                single.cpu_us_per_delivery,
                latency(single.latency.as_ref())
            ),
            target: "",
            met: None,
        }];
        for run in &self.batches {
            let target = run.size == TARGET_SIZE;
            verdicts.push(Verdict {
                what: format!(
                    "batch: batches of {}, closed loop at {} connections",
                    run.size, run.connections
                ),
                measured: format!(
                    "{:.0} deliveries/s ({:.2} × single POSTs), {:.1} µs CPU each; a batch's latency {}",
                    run.accepted_per_s,
                    run.ratio,
                    run.cpu_us_per_delivery,
                    latency(run.latency.as_ref())
                ),
                target: if target { "≥ 5 × single POSTs" } else { "" },
                met: target.then_some(run.ratio >= TARGET_RATIO),
            });
        }
        verdicts
    }

    /// What fails the run: a delivery accepted and not in the stream, or a
    /// delivery refused; in a smoke run also a run that accepted nothing.
    pub(crate) fn failures(&self, full: bool) -> Vec<String> {
        std::iter::once(&self.single)
            .chain(&self.batches)
            .filter(|run| {
                run.accepted_not_published > 0
                    || !run.refused.is_empty()
                    || (!full && run.accepted_per_s <= 0.0)
            })
            .map(|run| {
                format!(
                    "batch of {}: {} accepted and not published, refused {}",
                    run.size,
                    run.accepted_not_published,
                    describe(&run.refused)
                )
            })
            .collect()
    }
}
