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

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use skyport_runtime::metrics;

use crate::bench::{Bench, OPEN_LOOP_CONNECTIONS};
use crate::cpu::{self, CpuTime};
use crate::phases::{CEILING_TARGET, Verdict, describe, latency};
use crate::poster::{self, Naming, Posted, Schedule};
use crate::servers::{AllInOne, Ceiling};

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

/// One sample of a running system: when, events in the stream, workflows
/// terminal, the process's CPU seconds.
#[derive(Debug, Clone, Copy)]
struct Sample {
    at: f64,
    published: u64,
    terminal: u64,
    cpu_s: f64,
}

impl Sample {
    fn of(system: &AllInOne, started: Instant) -> anyhow::Result<Self> {
        Ok(Self {
            at: started.elapsed().as_secs_f64(),
            published: system.published(),
            terminal: system.terminal(),
            cpu_s: CpuTime::this()?.own_s,
        })
    }
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

/// The embedded store's committer's busy time so far, in nanoseconds.
fn committer_busy_ns(system: &AllInOne) -> u64 {
    system.app.backends.embedded.as_ref().map_or(0, |store| {
        store
            .database_commit_stats()
            .busy_ns
            .load(Ordering::Relaxed)
    })
}

/// µs of `seconds` a unit of `units`.
fn per(seconds: f64, units: u64) -> f64 {
    seconds * 1e6 / units.max(1) as f64
}

/// Each tenth of the `drained` workflows after `from` were terminal: its
/// rate and the process's CPU a workflow, interpolated between samples.
fn tenths(samples: &[Sample], from: u64, drained: u64) -> Vec<Tenth> {
    let at = |n: f64| -> (f64, f64) {
        for pair in samples.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            let (n0, n1) = ((a.terminal - from) as f64, (b.terminal - from) as f64);
            if n0 <= n && n <= n1 && n1 > n0 {
                let f = (n - n0) / (n1 - n0);
                return (a.cpu_s + f * (b.cpu_s - a.cpu_s), a.at + f * (b.at - a.at));
            }
        }
        samples.last().map_or((0.0, 0.0), |s| (s.cpu_s, s.at))
    };
    let tenth = drained as f64 / 10.0;
    (0..10)
        .map(|k| {
            let ((c0, t0), (c1, t1)) = (at(tenth * k as f64), at(tenth * (k + 1) as f64));
            Tenth {
                workflows_per_s: tenth / (t1 - t0).max(f64::MIN_POSITIVE),
                cpu_us: (c1 - c0) * 1e6 / tenth.max(1.0),
            }
        })
        .collect()
}

/// The least-squares slope of `points` (y a unit of x); 0 with fewer than two.
fn slope(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    if points.len() < 2 {
        return 0.0;
    }
    let (mx, my) = (
        points.iter().map(|p| p.0).sum::<f64>() / n,
        points.iter().map(|p| p.1).sum::<f64>() / n,
    );
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    if sxx == 0.0 { 0.0 } else { sxy / sxx }
}

/// The long-lived tasks' time in poll and how many run, and the named
/// locks' time held (a build with `--features lock-timing`), from the
/// process's `/metrics`.
#[derive(Debug, Default)]
struct SerialTimes {
    polls: HashMap<String, f64>,
    tasks: HashMap<String, f64>,
    held: HashMap<String, f64>,
}

impl SerialTimes {
    fn read() -> Self {
        let text = metrics::global().render();
        let mut times = Self::default();
        for line in text.lines() {
            for (prefix, label, into) in [
                ("skyport_task_poll_seconds_total", "task", &mut times.polls),
                ("skyport_tasks", "task", &mut times.tasks),
                ("skyport_lock_held_seconds_total", "lock", &mut times.held),
            ] {
                if let Some((name, value)) = labelled(line, prefix, label) {
                    into.insert(name.to_owned(), value);
                }
            }
        }
        times
    }

    /// Each task kind's and lock's part: the most of its time a workflow
    /// drained (since `before`) and a delivery taken (`taking` to `taken`).
    fn parts(
        &self,
        before: &Self,
        drained: u64,
        taken: &Self,
        taking: &Self,
        accepted: u64,
    ) -> Vec<SerialPart> {
        let delta = |after: &HashMap<String, f64>, before: &HashMap<String, f64>, name: &str| {
            after.get(name).copied().unwrap_or(0.0) - before.get(name).copied().unwrap_or(0.0)
        };
        let tasks = self.polls.keys().map(|task| SerialPart {
            part: format!("task {task}"),
            count: self.tasks.get(task).copied().unwrap_or(1.0) as usize,
            us: per(delta(&self.polls, &before.polls, task), drained)
                .max(per(delta(&taken.polls, &taking.polls, task), accepted)),
            judged: true,
        });
        let locks = self.held.keys().map(|lock| SerialPart {
            part: format!("lock {lock}"),
            count: 1,
            us: per(delta(&self.held, &before.held, lock), drained)
                .max(per(delta(&taken.held, &taking.held, lock), accepted)),
            judged: true,
        });
        tasks.chain(locks).filter(|p| p.us > 0.0).collect()
    }
}

/// The label's value and the sample's value of `line`, when it is a sample
/// of the series `prefix` with the one label `label`.
fn labelled<'a>(line: &'a str, prefix: &str, label: &str) -> Option<(&'a str, f64)> {
    let rest = line.strip_prefix(prefix)?.strip_prefix('{')?;
    let rest = rest.strip_prefix(label)?.strip_prefix("=\"")?;
    let (name, rest) = rest.split_once('"')?;
    let value = rest.strip_prefix("} ")?.trim().parse().ok()?;
    Some((name, value))
}

impl Scale {
    pub(crate) fn verdicts(&self) -> Vec<Verdict> {
        let ratio = self.ingest.requests_per_s / self.ceiling.requests_per_s.max(f64::MIN_POSITIVE);
        let spike = |what: &str, spike: &Spike| {
            let accepted = spike.posted.status("202");
            Verdict {
                what: format!(
                    "scale: a spike of {}/s for {:.0} s on {} connections {what}",
                    self.spike_rate, self.spike_seconds, self.spike_connections
                ),
                measured: format!(
                    "{accepted} of {} → 202 ({:.0}/s sent); {}; not 202: {}; {} in the stream",
                    spike.posted.requests,
                    spike.posted.requests_per_s,
                    latency(spike.posted.latency.as_ref()),
                    describe(&spike.posted.other_than("202")),
                    spike.published
                ),
                target: "every request 202, none lost",
                met: Some(accepted == spike.posted.requests && spike.published >= accepted),
            }
        };
        let drain = &self.drain;
        let (first, last) = (drain.tenths.first(), drain.tenths.last());
        let cpu_ratio = match (first, last) {
            (Some(f), Some(l)) => l.cpu_us / f.cpu_us.max(f64::MIN_POSITIVE),
            _ => 0.0,
        };
        let rate_ratio = match (first, last) {
            (Some(f), Some(l)) => l.workflows_per_s / f.workflows_per_s.max(f64::MIN_POSITIVE),
            _ => 0.0,
        };
        let judged: Vec<&SerialPart> = drain.serial.iter().filter(|p| p.judged).collect();
        let lowest = judged
            .iter()
            .map(|p| p.ceiling())
            .fold(f64::INFINITY, f64::min);
        let sustained = &self.sustained;
        vec![
            Verdict {
                what: format!(
                    "scale: ingest with the worker on, closed loop at {} connections",
                    self.connections
                ),
                measured: format!(
                    "{:.0}/s against the bare handler's {:.0}/s: {ratio:.2} ×; {}; not 202: {}",
                    self.ingest.requests_per_s,
                    self.ceiling.requests_per_s,
                    latency(self.ingest.latency.as_ref()),
                    describe(&self.ingest.other_than("202"))
                ),
                target: "(16 cores: 0.45 ×, p99 7.4 ms)",
                met: None,
            },
            spike("opened before it", &self.opened),
            spike("opened as it starts", &self.fresh),
            Verdict {
                what: "scale: the spike's backlog worked off".into(),
                measured: format!(
                    "{} in {:.1} s: {:.0} workflows/s (first tenth {:.0}/s, last {:.0}/s), {:.0} µs of \
                     the process's CPU a workflow; {} Scheduled, {} Failed",
                    drain.backlog,
                    drain.seconds,
                    drain.backlog as f64 / drain.seconds.max(f64::MIN_POSITIVE),
                    first.map_or(0.0, |t| t.workflows_per_s),
                    last.map_or(0.0, |t| t.workflows_per_s),
                    drain.cores * drain.seconds * 1e6 / drain.backlog.max(1) as f64,
                    drain.scheduled,
                    drain.failed
                ),
                target: "(16 cores: about 5,800/s)",
                met: None,
            },
            Verdict {
                what: "scale: the drain's last tenth against its first".into(),
                measured: format!(
                    "{cpu_ratio:.3} × the CPU a workflow ({:.0} against {:.0} µs), {rate_ratio:.3} × the rate",
                    last.map_or(0.0, |t| t.cpu_us),
                    first.map_or(0.0, |t| t.cpu_us)
                ),
                target: "CPU within 10 %",
                met: Some((cpu_ratio - 1.0).abs() <= 0.1),
            },
            Verdict {
                what: "scale: cores busy while the backlog is worked off, by thread".into(),
                measured: format!(
                    "{:.2} of {} cores: {}; the committer busy {:.0} % of the time",
                    drain.cores,
                    std::thread::available_parallelism().map_or(0, usize::from),
                    drain
                        .threads
                        .iter()
                        .take(8)
                        .map(|t| format!("{} ({}) {:.2}", t.name, t.count, t.cores))
                        .collect::<Vec<_>>()
                        .join(", "),
                    drain.committer_busy * 100.0
                ),
                target: "(16 cores: 9.2 busy)",
                met: None,
            },
            Verdict {
                what: "scale: serial parts, µs a workflow and the ceiling it sets".into(),
                measured: drain
                    .serial
                    .iter()
                    .map(|p| {
                        format!(
                            "{}{} {:.1} µs → {:.0}/s{}",
                            p.part,
                            if p.count > 1 {
                                format!(" ({})", p.count)
                            } else {
                                String::new()
                            },
                            p.us,
                            p.ceiling(),
                            if p.judged {
                                ""
                            } else {
                                " (group commit: at this rate, not saturated)"
                            }
                        )
                    })
                    .collect::<Vec<_>>()
                    .join("; "),
                target: "≥ 15,000/s each",
                met: Some(!judged.is_empty() && lowest >= CEILING_TARGET),
            },
            Verdict {
                what: format!(
                    "scale: {}/s for {:.0} s, open loop, the worker beside it",
                    sustained.rate, sustained.seconds
                ),
                measured: format!(
                    "{} of {} → 202; {}; not 202: {}; taken {:.0}/s, worked off {:.0}/s, the backlog \
                     growing {:.0}/s ({} at the end)",
                    sustained.posted.status("202"),
                    sustained.posted.requests,
                    latency(sustained.posted.latency.as_ref()),
                    describe(&sustained.posted.other_than("202")),
                    sustained.taken_per_s,
                    sustained.worked_off_per_s,
                    sustained.backlog_slope,
                    sustained.backlog_at_end
                ),
                target: "every request 202; worked off as fast as taken",
                met: Some(
                    sustained.posted.status("202") == sustained.posted.requests
                        && sustained.worked_off_per_s >= 0.98 * sustained.taken_per_s,
                ),
            },
        ]
    }

    /// What fails the run: anything accepted and not durable, or Failed; in
    /// a smoke run, a part that accepted nothing.
    pub(crate) fn failures(&self, full: bool) -> Vec<String> {
        let mut failures = Vec::new();
        let parts = [
            ("ingest", &self.ingest, self.ingest_published),
            (
                "the spike on opened connections",
                &self.opened.posted,
                self.opened.published,
            ),
            (
                "the spike on new connections",
                &self.fresh.posted,
                self.fresh.published,
            ),
            (
                "the sustained rate",
                &self.sustained.posted,
                self.sustained.published,
            ),
        ];
        for (what, posted, published) in parts {
            let accepted = posted.status("202");
            if published < accepted {
                failures.push(format!(
                    "scale, {what}: {accepted} accepted but {published} in the stream"
                ));
            }
            if !full && accepted == 0 {
                failures.push(format!("scale, {what}: nothing accepted"));
            }
        }
        if self.drain.failed > 0 {
            failures.push(format!(
                "scale: {} of the spike's deliveries Failed",
                self.drain.failed
            ));
        }
        failures
    }
}
