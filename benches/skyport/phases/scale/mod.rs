//! The scale phase: the all-in-one as users run it (`cargo run --release`
//! at its defaults: the embedded stream and store, the worker and the
//! simulated services in the process), measured as issue 50's table was,
//! on whatever machine runs it. Each part starts a system of its own on a
//! fresh data directory, loaded by the poster (distinct requests):
//!
//! 1. ingest with the worker on, closed loop, against the bare handler;
//! 2. the seed's spike on connections opened before it, then the backlog it
//!    leaves worked off: the drain's rate and CPU a workflow by tenths (the
//!    last against the first), the cores each of the process's threads
//!    kept busy, and the serial parts' time a workflow with the ceiling
//!    each sets (10⁶ ÷ µs; a kind of `n` tasks, n × that);
//! 3. the same spike on connections opened as it starts (a burst of
//!    handshakes that the listen backlog holds);
//! 4. the seed's sustained rate, open loop, with the rate the worker works
//!    off beside it and the backlog's slope.

mod measure;
mod report;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::bench::{Bench, OPEN_LOOP_CONNECTIONS};
use crate::cpu;
use crate::poster::{self, Naming, Posted, Schedule};
use crate::servers::{AllInOne, Ceiling};
use measure::{Sample, SerialTimes, committer_busy_ns, per, slope, tenths};

/// How often the drain and the sustained rate are sampled.
const SAMPLE_EVERY: Duration = Duration::from_millis(250);

/// The thread that commits the embedded store's status writes: its cost a
/// workflow falls as its batches grow (group commit), so its time at the
/// drain's rate is no ceiling (the status-writes phase saturates it).
const COMMITTER: &str = "skyport-committer";

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Scale {
    /// Closed loop at this many connections, the bare handler's and Skyport's.
    pub(crate) connections: u32,
    pub(crate) ceiling: Posted,
    pub(crate) ingest: Posted,
    /// Events in the stream after the ingest run.
    pub(crate) ingest_published: u64,
    /// The spikes: requests due a second, for how long, on how many connections.
    pub(crate) spike_rate: u32,
    pub(crate) spike_seconds: f64,
    pub(crate) spike_connections: u32,
    pub(crate) opened: Spike,
    pub(crate) fresh: Spike,
    pub(crate) drain: Drain,
    pub(crate) sustained: Sustained,
}

/// A spike and what it left durable.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Spike {
    pub(crate) posted: Posted,
    /// Events in the stream after it: at least every 202.
    pub(crate) published: u64,
}

/// The backlog the spike on opened connections left, worked off.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Drain {
    /// Accepted and not yet terminal when the spike's last answer came.
    pub(crate) backlog: u64,
    pub(crate) seconds: f64,
    /// Each tenth of the backlog: its workflows a second and the process's
    /// CPU a workflow.
    pub(crate) tenths: Vec<Tenth>,
    /// The process's cores busy over the drain, and each thread name's.
    pub(crate) cores: f64,
    pub(crate) threads: Vec<ThreadUse>,
    pub(crate) serial: Vec<SerialPart>,
    /// The committer: the share of the drain it was busy (from taking a
    /// batch to its commit being durable).
    pub(crate) committer_busy: f64,
    pub(crate) scheduled: u64,
    pub(crate) failed: u64,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Tenth {
    pub(crate) workflows_per_s: f64,
    pub(crate) cpu_us: f64,
}

/// The threads of one name over the drain.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct ThreadUse {
    pub(crate) name: String,
    pub(crate) count: usize,
    pub(crate) cores: f64,
}

/// A part that runs on one thread at a time: a thread of its own, a kind
/// of long-lived task (`count` of them sharing the work) or a lock.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct SerialPart {
    pub(crate) part: String,
    pub(crate) count: usize,
    /// µs a workflow: the most of its time a delivery taken (in the spike)
    /// and a workflow drained.
    pub(crate) us: f64,
    /// Whether its ceiling is judged: not the committer's (group commit).
    pub(crate) judged: bool,
}

impl SerialPart {
    pub(crate) fn ceiling(&self) -> f64 {
        self.count.max(1) as f64 * 1e6 / self.us.max(f64::MIN_POSITIVE)
    }
}

/// The sustained rate, open loop, beside the worker.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Sustained {
    pub(crate) rate: u32,
    pub(crate) seconds: f64,
    pub(crate) posted: Posted,
    pub(crate) published: u64,
    /// Events into the stream and workflows terminal a second while it ran.
    pub(crate) taken_per_s: f64,
    pub(crate) worked_off_per_s: f64,
    /// The backlog's growth a second (least squares over the samples).
    pub(crate) backlog_slope: f64,
    pub(crate) backlog_at_end: u64,
}

impl Bench {
    pub(crate) async fn scale(&self) -> anyhow::Result<Scale> {
        let plan = &self.plan;
        let connections = plan.scale_connections;

        eprintln!("scale: the bare handler, closed loop at {connections} connections");
        let ceiling = Ceiling::start().await?;
        let bare = poster::post(
            &ceiling.url,
            Schedule::For(plan.closed_loop),
            connections,
            Naming::Unnamed,
            0,
        )
        .await?;
        ceiling.stop().await?;
        eprintln!("scale: Skyport with the worker on, closed loop at {connections} connections");
        let system = self.fresh_system("scale-ingest").await?;
        let ingest = poster::post(
            &system.url,
            Schedule::For(plan.closed_loop),
            connections,
            Naming::Unnamed,
            0,
        )
        .await?;
        let ingest_published = system.published();
        self.discard("scale-ingest", system).await?;

        let spike = Schedule::Rate {
            per_s: plan.spike_rate,
            duration: plan.spike_duration,
        };
        eprintln!(
            "scale: a spike of {}/s for {} s on {} connections opened before it",
            plan.spike_rate,
            plan.spike_duration.as_secs_f64(),
            plan.spike_connections
        );
        let system = self.fresh_system("scale-opened").await?;
        let taking = cpu::threads()?;
        let serial_before = SerialTimes::read();
        let posted = poster::spike(&system.url, spike, plan.spike_connections, true, 0).await?;
        let taken = cpu::threads()?;
        let serial_taken = SerialTimes::read();
        let opened = Spike {
            published: system.published(),
            posted,
        };
        let drain = self
            .work_off(
                &system,
                &opened,
                (&taking, &taken),
                (&serial_before, &serial_taken),
            )
            .await?;
        self.discard("scale-opened", system).await?;

        eprintln!(
            "scale: the spike again on {} connections opened as it starts",
            plan.spike_connections
        );
        let system = self.fresh_system("scale-fresh").await?;
        let posted = poster::spike(&system.url, spike, plan.spike_connections, false, 0).await?;
        let fresh = Spike {
            published: system.published(),
            posted,
        };
        self.discard("scale-fresh", system).await?;

        let sustained = self.sustained().await?;
        Ok(Scale {
            connections,
            ceiling: bare,
            ingest,
            ingest_published,
            spike_rate: plan.spike_rate,
            spike_seconds: plan.spike_duration.as_secs_f64(),
            spike_connections: plan.spike_connections,
            opened,
            fresh,
            drain,
            sustained,
        })
    }

    /// The all-in-one at its defaults on a fresh data directory `name`.
    async fn fresh_system(&self, name: &str) -> anyhow::Result<AllInOne> {
        AllInOne::start(self.settings(name, &[])?).await
    }

    /// Stops `system` and removes its data directory (a spike's is gigabytes).
    async fn discard(&self, name: &str, system: AllInOne) -> anyhow::Result<()> {
        system.stop().await?;
        std::fs::remove_dir_all(self.data.join(name))?;
        Ok(())
    }

    /// Works off what the spike left, sampling as it goes; `threads` and
    /// `serial` before and after the spike, for the time a delivery taken.
    async fn work_off(
        &self,
        system: &AllInOne,
        spike: &Spike,
        threads: (
            &HashMap<String, cpu::Threads>,
            &HashMap<String, cpu::Threads>,
        ),
        serial: (&SerialTimes, &SerialTimes),
    ) -> anyhow::Result<Drain> {
        let accepted = spike.posted.status("202");
        let durable = spike.published.max(accepted);
        let started = Instant::now();
        let first = Sample::of(system, started)?;
        let backlog = durable.saturating_sub(first.terminal);
        eprintln!("scale: working off a backlog of {backlog}");
        let threads_before = cpu::threads()?;
        let serial_before = SerialTimes::read();
        let busy_before = committer_busy_ns(system);
        let mut samples = vec![first];
        while samples.last().is_some_and(|s| s.terminal < durable) {
            anyhow::ensure!(
                started.elapsed() < self.plan.drain_timeout,
                "scale: {} of {durable} accepted requests lost (not terminal after {} s)",
                durable - samples.last().map_or(0, |s| s.terminal),
                self.plan.drain_timeout.as_secs()
            );
            tokio::time::sleep(SAMPLE_EVERY).await;
            samples.push(Sample::of(system, started)?);
        }
        let seconds = started.elapsed().as_secs_f64();
        let threads_after = cpu::threads()?;
        let serial_after = SerialTimes::read();
        let busy_s = (committer_busy_ns(system) - busy_before) as f64 / 1e9;
        let last = samples.last().copied().unwrap_or(first);
        let drained = last.terminal - first.terminal;
        let tenths = tenths(&samples, first.terminal, drained);

        let mut used: Vec<ThreadUse> = threads_after
            .iter()
            .map(|(name, after)| ThreadUse {
                name: name.clone(),
                count: after.count,
                cores: (after.cpu_s - threads_before.get(name).map_or(0.0, |t| t.cpu_s))
                    / seconds.max(f64::MIN_POSITIVE),
            })
            .filter(|t| t.cores > 0.0)
            .collect();
        used.sort_by(|a, b| b.cores.total_cmp(&a.cores));

        // Threads of their own: Skyport's names them `skyport-…`; this
        // process's main thread (the bench's own) is not one of them.
        let main = std::fs::read_to_string("/proc/self/comm").unwrap_or_default();
        let (taking, taken) = threads;
        let mut parts: Vec<SerialPart> = threads_after
            .iter()
            .filter(|(name, t)| {
                t.count == 1 && name.starts_with("skyport-") && **name != main.trim()
            })
            .map(|(name, after)| {
                let drained_us = per(
                    after.cpu_s - threads_before.get(name).map_or(0.0, |t| t.cpu_s),
                    drained,
                );
                let taken_us = per(
                    taken.get(name).map_or(0.0, |t| t.cpu_s)
                        - taking.get(name).map_or(0.0, |t| t.cpu_s),
                    spike.posted.status("202"),
                );
                SerialPart {
                    part: format!("thread {name}"),
                    count: 1,
                    us: drained_us.max(taken_us),
                    judged: !COMMITTER.starts_with(name.as_str()),
                }
            })
            .filter(|p| p.us > 0.0)
            .collect();
        parts.extend(serial_after.parts(&serial_before, drained, serial.1, serial.0, accepted));
        parts.sort_by(|a, b| a.ceiling().total_cmp(&b.ceiling()));
        Ok(Drain {
            backlog,
            seconds,
            tenths,
            cores: (last.cpu_s - first.cpu_s) / seconds.max(f64::MIN_POSITIVE),
            threads: used,
            serial: parts,
            committer_busy: busy_s / seconds.max(f64::MIN_POSITIVE),
            scheduled: system.scheduled(),
            failed: system.failed(),
        })
    }

    /// The sustained rate on a fresh system, sampled as it runs.
    async fn sustained(&self) -> anyhow::Result<Sustained> {
        let plan = &self.plan;
        eprintln!(
            "scale: {}/s for {} s, open loop, the worker working beside it",
            plan.scale_rate,
            plan.scale_duration.as_secs_f64()
        );
        let system = self.fresh_system("scale-sustained").await?;
        let started = Instant::now();
        let mut samples = vec![Sample::of(&system, started)?];
        let posted = {
            let posting = poster::post(
                &system.url,
                Schedule::Rate {
                    per_s: plan.scale_rate,
                    duration: plan.scale_duration,
                },
                OPEN_LOOP_CONNECTIONS,
                Naming::Unnamed,
                0,
            );
            tokio::pin!(posting);
            let mut ticks = tokio::time::interval(SAMPLE_EVERY);
            loop {
                tokio::select! {
                    posted = &mut posting => break posted?,
                    _ = ticks.tick() => samples.push(Sample::of(&system, started)?),
                }
            }
        };
        let (first, last) = (samples[0], Sample::of(&system, started)?);
        samples.push(last);
        let seconds = (last.at - first.at).max(f64::MIN_POSITIVE);
        let backlog: Vec<(f64, f64)> = samples
            .iter()
            .map(|s| (s.at, s.published.saturating_sub(s.terminal) as f64))
            .collect();
        let result = Sustained {
            rate: plan.scale_rate,
            seconds: plan.scale_duration.as_secs_f64(),
            published: last.published,
            taken_per_s: (last.published - first.published) as f64 / seconds,
            worked_off_per_s: (last.terminal - first.terminal) as f64 / seconds,
            backlog_slope: slope(&backlog),
            backlog_at_end: last.published.saturating_sub(last.terminal),
            posted,
        };
        self.discard("scale-sustained", system).await?;
        Ok(result)
    }
}
