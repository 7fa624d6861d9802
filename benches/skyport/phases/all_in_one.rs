//! (7) The all-in-one phase: the whole system as users run it (`cargo run
//! --release`), gateway, worker and the simulated services at their defaults
//! in one process on a fresh embedded store: closed loop against the
//! ceiling, then open loop at the fixed rate while the worker drains behind
//! it, every accepted request followed to a terminal state, and the peak RSS
//! (the services' memory included, as in a user's process).

use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::bench::{Bench, OPEN_LOOP_CONNECTIONS};
use crate::cpu::CpuTime;
use crate::memory;
use crate::phases::{Verdict, describe, latency};
use crate::poster::{self, Naming, Posted, Schedule};
use crate::servers::{AllInOne, Ceiling};

/// The whole system as users run it (`cargo run --release`): gateway, worker
/// and the simulated services at their defaults in one process on the
/// embedded store, loaded by the poster (distinct requests).
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct WholeSystem {
    /// Closed loop at this many connections: the ceiling and Skyport, both
    /// loaded by the poster, in the round of the median ratio.
    pub(crate) connections: u32,
    pub(crate) ceiling: Posted,
    pub(crate) skyport: Posted,
    /// Skyport's requests/s over the ceiling's.
    pub(crate) ratio: f64,
    /// Every round's ratio, lowest first.
    pub(crate) ratios: Vec<f64>,
    /// Each closed-loop round's workflows, from its first request until
    /// the last was terminal, in the order run.
    pub(crate) work: Vec<WholeRound>,
    /// Open loop: requests due per second, for how long, and what they got
    /// (latency from when each was due).
    pub(crate) rate: u32,
    pub(crate) seconds: f64,
    pub(crate) open_loop: Posted,
    /// 202s over the phase, every round and the open loop.
    pub(crate) accepted: u64,
    /// Events in the stream at the end.
    pub(crate) published: u64,
    /// Accepted requests not yet terminal when the open loop ended.
    pub(crate) backlog: u64,
    /// From the open loop's end until every durable request was terminal.
    pub(crate) drain_s: f64,
    /// Deliveries that reached a terminal state: Scheduled, Failed (none
    /// cancelled).
    pub(crate) terminal: u64,
    pub(crate) scheduled: u64,
    /// Every request is valid and the services fail no call: must be 0.
    pub(crate) failed: u64,
    /// Of the whole phase.
    pub(crate) peak_rss_mib: f64,
}

/// The workflows of one closed-loop round of the all-in-one.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct WholeRound {
    pub(crate) workflows: u64,
    pub(crate) seconds: f64,
    pub(crate) workflows_per_s: f64,
    /// The process's CPU time per workflow: gateway, worker and the
    /// simulated services it runs, as a user's process spends it.
    pub(crate) cpu_us_per_workflow: f64,
}

impl Bench {
    /// (7): the whole system as users run it (`cargo run --release`). No
    /// `services.base_url`, so the process starts the simulated services
    /// itself at their defaults (10 to 20 ms a call); they, the worker and the
    /// gateway share this process, and the machine with the poster. Every
    /// request has a package of its own, numbered on across the phase, since
    /// every run posts to the same store.
    ///
    /// The ceiling is loaded by the poster too (its handler takes any valid
    /// body), in rounds alternating with Skyport's as ingest's do, so that the
    /// ratio compares like with like. Each Skyport round is drained before the
    /// next ceiling round and before the open loop, which thus start on an
    /// idle machine. The peak RSS covers the whole phase, the in-process
    /// ceiling's few MiB included.
    pub(crate) async fn all_in_one(&self) -> anyhow::Result<WholeSystem> {
        let plan = &self.plan;
        // Ingest's first connection count, so that the ratio compares with its row.
        let connections = plan.connections[0];
        let closed_loop = Schedule::For(plan.closed_loop);
        memory::reset_peak()?;
        let system = AllInOne::start(self.settings("all-in-one", &[])?).await?;
        let (mut posted, mut accepted) = (0, 0);
        let (mut rounds, mut work) = (Vec::new(), Vec::new());
        for round in 1..=plan.rounds {
            eprintln!(
                "all in one: the ceiling, closed loop at {connections} connections (round {round})"
            );
            let ceiling = Ceiling::start().await?;
            let bare =
                poster::post(&ceiling.url, closed_loop, connections, Naming::Unnamed, 0).await?;
            ceiling.stop().await?;
            eprintln!("all in one: closed loop at {connections} connections (round {round})");
            let (cpu_before, round_started) = (CpuTime::this()?, Instant::now());
            let skyport = poster::post(
                &system.url,
                closed_loop,
                connections,
                Naming::Unnamed,
                posted,
            )
            .await?;
            posted += skyport.requests;
            accepted += skyport.status("202");
            let drained = self.drain(&system, accepted).await?;
            eprintln!(
                "all in one: round {round} drained {:.1} s after its last answer",
                drained.as_secs_f64()
            );
            let seconds = round_started.elapsed().as_secs_f64();
            let workflows = skyport.status("202");
            work.push(WholeRound {
                workflows,
                seconds,
                workflows_per_s: workflows as f64 / seconds,
                cpu_us_per_workflow: CpuTime::this()?.since(cpu_before).own_s * 1e6
                    / workflows.max(1) as f64,
            });
            rounds.push((skyport.requests_per_s / bare.requests_per_s, bare, skyport));
        }
        // The round of the median ratio stands for them all; every ratio is kept.
        rounds.sort_by(|a, b| a.0.total_cmp(&b.0));
        let ratios = rounds.iter().map(|r| r.0).collect();
        let (ratio, ceiling, skyport) = rounds.swap_remove(rounds.len() / 2);

        eprintln!(
            "all in one: open loop at {}/s for {} s, the worker draining behind it",
            plan.fixed_rate,
            plan.fixed_duration.as_secs()
        );
        let open_loop = poster::post(
            &system.url,
            Schedule::Rate {
                per_s: plan.fixed_rate,
                duration: plan.fixed_duration,
            },
            OPEN_LOOP_CONNECTIONS,
            Naming::Unnamed,
            posted,
        )
        .await?;
        accepted += open_loop.status("202");
        let backlog = accepted.saturating_sub(system.terminal());
        let drained = self.drain(&system, accepted).await?;
        let peak_rss_mib = memory::peak_mib()?;
        let result = WholeSystem {
            connections,
            ceiling,
            skyport,
            ratio,
            ratios,
            work,
            rate: plan.fixed_rate,
            seconds: plan.fixed_duration.as_secs_f64(),
            open_loop,
            accepted,
            published: system.published(),
            backlog,
            drain_s: drained.as_secs_f64(),
            terminal: system.terminal(),
            scheduled: system.scheduled(),
            failed: system.failed(),
            peak_rss_mib,
        };
        system.stop().await?;
        Ok(result)
    }
}

impl WholeSystem {
    /// Its closed loop, rounds, open loop and drain; none lost, none Failed.
    pub(crate) fn verdicts(&self) -> Vec<Verdict> {
        let lost = self
            .published
            .max(self.accepted)
            .saturating_sub(self.terminal);
        vec![
            Verdict {
                what: format!(
                    "all in one, closed loop at {} connections (both from the poster)",
                    self.connections
                ),
                measured: format!(
                    "{:.0}/s against {:.0}/s: {:.2} × the ceiling (rounds: {}); {} (ceiling {})",
                    self.skyport.requests_per_s,
                    self.ceiling.requests_per_s,
                    self.ratio,
                    self.ratios
                        .iter()
                        .map(|r| format!("{r:.2}"))
                        .collect::<Vec<_>>()
                        .join(", "),
                    latency(self.skyport.latency.as_ref()),
                    latency(self.ceiling.latency.as_ref())
                ),
                target: "(ingest beside the worker and the services)",
                met: None,
            },
            Verdict {
                what: "all in one, closed-loop rounds followed to terminal".into(),
                measured: self
                    .work
                    .iter()
                    .map(|r| {
                        format!(
                            "{:.0} workflows/s at {:.0} µs of process CPU each ({} in {:.1} s)",
                            r.workflows_per_s, r.cpu_us_per_workflow, r.workflows, r.seconds
                        )
                    })
                    .collect::<Vec<_>>()
                    .join("; "),
                target: "(as users run it: the services' CPU included)",
                met: None,
            },
            Verdict {
                what: format!(
                    "all in one, open loop {}/s for {:.0} s",
                    self.rate, self.seconds
                ),
                measured: format!(
                    "{:.0}/s (sent over {:.1} s); {}; not 202: {}; \
                     {} accepted not yet terminal at its end",
                    self.open_loop.requests_per_s,
                    self.open_loop.seconds,
                    latency(self.open_loop.latency.as_ref()),
                    describe(&self.open_loop.other_than("202")),
                    self.backlog
                ),
                target: "(the whole system)",
                met: None,
            },
            Verdict {
                what: "all in one, every accepted request followed".into(),
                measured: format!(
                    "{} accepted, {} in the stream: {} terminal ({} Scheduled, {} Failed), \
                     {lost} lost; drained {:.1} s after the open loop",
                    self.accepted,
                    self.published,
                    self.terminal,
                    self.scheduled,
                    self.failed,
                    self.drain_s
                ),
                target: "0 lost, 0 Failed",
                met: Some(lost == 0 && self.failed == 0),
            },
        ]
    }

    /// What fails the run: a request Failed; in a smoke run, nothing accepted
    /// in the closed or the open loop.
    pub(crate) fn failures(&self, full: bool) -> Vec<String> {
        let mut failures = Vec::new();
        // A request lost fails the phase itself, when its drain times out.
        if self.failed > 0 {
            failures.push(format!(
                "all in one: {} of {} accepted requests Failed",
                self.failed, self.accepted
            ));
        }
        if !full && (self.skyport.status("202") == 0 || self.open_loop.status("202") == 0) {
            failures.push("all in one: nothing accepted in the closed or the open loop".into());
        }
        failures
    }
}
