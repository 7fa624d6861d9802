//! The status-writes phase: the embedded store's committer alone, written to
//! as the worker writes a delivery (its first document, Processing; then
//! its terminal one with five steps), through the `StatusStore` port, no
//! stream, no worker, no HTTP. Once at a fixed rate, once with as many
//! workflows in flight as the store takes, and that again with the ids of
//! named requests (`k-` and 32 random hex digits, where an unnamed
//! request's id is time-ordered), and that again with each delivery
//! deferred first (a Waiting document, whose timer the same commit indexes):
//! the committer thread's busy time and CPU per workflow, the ceiling they
//! set (10⁶ ÷ µs), and the workflows a second it sustains when nothing else
//! bounds it.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::{Deserialize, Serialize};
use skyport_core::ports::{Precondition, StatusStore, StatusStoreError};
use skyport_core::request::DeliveryRequest;
use skyport_core::status::{DeliveryState, StatusDocument, Step, StepOutcome, StepResult};
use time::OffsetDateTime;
use tokio::task::JoinSet;

use crate::bench::{BODY, Bench};
use crate::cpu;
use crate::phases::{CEILING_TARGET, Verdict};

/// The name the committer's thread carries (`/proc` keeps 15 bytes of it).
const COMMITTER: &str = "skyport-committer";

/// One run of the committer alone.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct StatusWrites {
    /// The workflows started per second (`None`: as fast as they finish,
    /// `in_flight` at a time).
    pub(crate) rate: Option<u32>,
    pub(crate) in_flight: u32,
    /// Whether the ids were a named request's (random), not an unnamed one's.
    #[serde(default)]
    pub(crate) named: bool,
    /// Whether each delivery was written Waiting first (deferred), its
    /// timer set and then removed by the Processing write.
    #[serde(default)]
    pub(crate) deferred: bool,
    pub(crate) workflows: u64,
    pub(crate) workflows_per_s: f64,
    pub(crate) commits_per_s: f64,
    pub(crate) writes_per_commit: f64,
    /// The committer thread's CPU per workflow (two writes), µs.
    pub(crate) committer_us: f64,
    /// The committer's time per workflow from taking a batch to its commit
    /// being durable, µs: its CPU and its wait for the disk.
    pub(crate) committer_busy_us: f64,
    /// This process's CPU per workflow, µs: the committer and the writers
    /// (each document encoded and compressed by its caller).
    pub(crate) process_us: f64,
}

impl StatusWrites {
    /// What the committer alone could do: 10⁶ ÷ its busy µs per workflow
    /// (its CPU and its wait for the disk, which it cannot overlap).
    pub(crate) fn ceiling(&self) -> f64 {
        1e6 / self.committer_busy_us.max(f64::MIN_POSITIVE)
    }
}

impl Bench {
    /// The committer alone, at the plan's fixed rate and then saturated.
    pub(crate) async fn status_writes(&self) -> anyhow::Result<Vec<StatusWrites>> {
        let request: DeliveryRequest = serde_json::from_str(BODY)?;
        let runs = [
            (
                Some(self.plan.status_rate),
                4 * self.plan.status_rate,
                Ids::Unnamed,
            ),
            (None, self.plan.status_in_flight, Ids::Unnamed),
            (None, self.plan.status_in_flight, Ids::Named),
            (None, self.plan.status_in_flight, Ids::Deferred),
        ];
        let mut rows = Vec::new();
        for (rate, in_flight, ids) in runs {
            let name = match (rate, ids) {
                (Some(rate), _) => format!("{rate}-per-s"),
                (None, Ids::Unnamed) => "saturated".to_owned(),
                (None, Ids::Named) => "saturated-named".to_owned(),
                (None, Ids::Deferred) => "saturated-deferred".to_owned(),
            };
            eprintln!("status writes alone, {name}");
            let settings = self.settings(&format!("status-writes-{name}"), &[])?;
            let backends = skyport::Backends::open(&settings).await?;
            let embedded = backends
                .embedded
                .clone()
                .context("the embedded store is not open")?;
            let workflows = self.plan.status_workflows;
            let committer_before = cpu::thread_s(COMMITTER)?;
            let process_before = cpu::CpuTime::this()?;
            let started = Instant::now();
            drive(
                &backends.ports.status,
                &request,
                workflows,
                rate,
                in_flight,
                ids,
            )
            .await?;
            let seconds = started.elapsed().as_secs_f64();
            let committer_s = cpu::thread_s(COMMITTER)? - committer_before;
            let process_s = cpu::CpuTime::this()?.since(process_before).own_s;
            let stats = embedded.database_commit_stats();
            let commits = stats.commits.load(Ordering::Relaxed).max(1);
            let writes = stats.operations.load(Ordering::Relaxed);
            let busy_s = stats.busy_ns.load(Ordering::Relaxed) as f64 / 1e9;
            let per_workflow = 1e6 / workflows as f64;
            rows.push(StatusWrites {
                rate,
                in_flight,
                named: ids == Ids::Named,
                deferred: ids == Ids::Deferred,
                workflows,
                workflows_per_s: workflows as f64 / seconds,
                commits_per_s: commits as f64 / seconds,
                writes_per_commit: writes as f64 / commits as f64,
                committer_us: committer_s * per_workflow,
                committer_busy_us: busy_s * per_workflow,
                process_us: process_s * per_workflow,
            });
        }
        Ok(rows)
    }
}

/// Whose writes a run makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ids {
    /// Unnamed requests' (time-ordered ids).
    Unnamed,
    /// Named requests' (random ids).
    Named,
    /// Unnamed requests', each deferred: written Waiting first.
    Deferred,
}

/// Runs `workflows` workflows, started at `rate` a second (or as fast as
/// they finish), at most `in_flight` at a time, with `ids`' writes.
async fn drive(
    store: &Arc<dyn StatusStore>,
    request: &DeliveryRequest,
    workflows: u64,
    rate: Option<u32>,
    in_flight: u32,
    ids: Ids,
) -> anyhow::Result<()> {
    let slots = Arc::new(tokio::sync::Semaphore::new(in_flight as usize));
    let mut ticks = rate.map(|r| {
        let mut ticks = tokio::time::interval(Duration::from_secs(1) / r);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
        ticks
    });
    let mut tasks = JoinSet::new();
    for n in 0..workflows {
        if let Some(ticks) = &mut ticks {
            ticks.tick().await;
        }
        let slot = Arc::clone(&slots).acquire_owned().await?;
        let store = Arc::clone(store);
        let request = request.clone();
        let id = if ids == Ids::Named {
            format!("k-{:032x}", fastrand::u128(..))
        } else {
            skyport_gateway::ids::generated()
        };
        let deferred = ids == Ids::Deferred;
        tasks.spawn(async move {
            let written = workflow(store.as_ref(), request, id, n, deferred).await;
            drop(slot);
            written
        });
        while let Some(done) = tasks.try_join_next() {
            done??;
        }
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    Ok(())
}

/// One delivery's writes as the worker makes them: Processing, then
/// Scheduled with its five steps, each conditional on the one before; when
/// `deferred`, Waiting (a day ahead) before them.
async fn workflow(
    store: &dyn StatusStore,
    mut request: DeliveryRequest,
    id: String,
    n: u64,
    deferred: bool,
) -> Result<(), StatusStoreError> {
    // Each its own owner and package, as the poster's requests are.
    request.owner_id = format!("owner-{n}");
    request.package_info.package_id = format!("pkg-{n}");
    let now = OffsetDateTime::now_utc();
    let mut document = StatusDocument::accepted(id, now);
    document.state = DeliveryState::Processing;
    document.attempt = 1;
    document.package_id = Some(request.package_info.package_id.clone());
    document.owner_id = Some(request.owner_id.clone());
    document.principal = Some(format!("client-{}", n % 16));
    document.request = Some(request);
    document.updated_at = now;
    let mut first = Precondition::IfNoneMatch;
    if deferred {
        let mut waiting = document.clone();
        waiting.state = DeliveryState::Waiting;
        waiting.attempt = 0;
        waiting.runs_at = Some(now + time::Duration::days(1));
        first = Precondition::IfMatch(store.put(&waiting, first).await?);
        document.runs_at = waiting.runs_at;
    }
    let etag = store.put(&document, first).await?;
    document.state = DeliveryState::Scheduled;
    document.drone_id = Some(format!("drone-{}", n % 1_000));
    document.third_party_required = Some(false);
    document.steps = Step::ALL
        .into_iter()
        .map(|step| StepOutcome {
            step,
            result: StepResult::Succeeded,
            at: OffsetDateTime::now_utc(),
            calls: 1,
            detail: None,
        })
        .collect();
    document.updated_at = OffsetDateTime::now_utc();
    store.put(&document, Precondition::IfMatch(etag)).await?;
    Ok(())
}

impl StatusWrites {
    pub(crate) fn verdicts(&self) -> Vec<Verdict> {
        let how = match (self.rate, self.named, self.deferred) {
            (Some(rate), _, _) => format!("{rate} workflows/s"),
            (None, true, _) => format!("saturated, {} in flight, named", self.in_flight),
            (None, _, true) => format!(
                "saturated, {} in flight, each deferred first (Waiting, its timer indexed)",
                self.in_flight
            ),
            (None, false, false) => format!("saturated, {} in flight", self.in_flight),
        };
        // At a fixed rate the committer is not busy all the time and each
        // commit carries few writes: its time then is no ceiling.
        let (what, target, met) = if self.rate.is_none() && !self.named && !self.deferred {
            (
                "the committer's ceiling",
                "≥ 15,000/s",
                Some(self.ceiling() >= CEILING_TARGET),
            )
        } else {
            ("the committer's time", "(no target)", None)
        };
        vec![Verdict {
            what: format!("status writes alone, {how}: {what}"),
            measured: format!(
                "{:.0}/s (the committer {:.1} µs busy a workflow, {:.1} µs of CPU); {:.0} workflows/s, {:.0} commits/s of {:.1} writes, {:.1} µs of the process a workflow",
                self.ceiling(),
                self.committer_busy_us,
                self.committer_us,
                self.workflows_per_s,
                self.commits_per_s,
                self.writes_per_commit,
                self.process_us
            ),
            target,
            met,
        }]
    }
}
