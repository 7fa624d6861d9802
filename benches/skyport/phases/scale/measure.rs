//! What the scale phase reads from the running system: samples of its
//! stream, its terminal workflows and its CPU; the committer's busy time;
//! the long-lived tasks' and the named locks' times from `/metrics`; and
//! the drain's tenths and the backlog's slope computed from them.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::Instant;

use skyport_runtime::metrics;

use super::{SerialPart, Tenth};
use crate::cpu::CpuTime;
use crate::servers::AllInOne;

/// One sample of a running system: when, events in the stream, workflows
/// terminal, the process's CPU seconds.
#[derive(Debug, Clone, Copy)]
pub(super) struct Sample {
    pub(super) at: f64,
    pub(super) published: u64,
    pub(super) terminal: u64,
    pub(super) cpu_s: f64,
}

impl Sample {
    pub(super) fn of(system: &AllInOne, started: Instant) -> anyhow::Result<Self> {
        Ok(Self {
            at: started.elapsed().as_secs_f64(),
            published: system.published(),
            terminal: system.terminal(),
            cpu_s: CpuTime::this()?.own_s,
        })
    }
}

/// The embedded store's committer's busy time so far, in nanoseconds.
pub(super) fn committer_busy_ns(system: &AllInOne) -> u64 {
    system.app.backends.embedded.as_ref().map_or(0, |store| {
        store
            .database_commit_stats()
            .busy_ns
            .load(Ordering::Relaxed)
    })
}

/// µs of `seconds` a unit of `units`.
pub(super) fn per(seconds: f64, units: u64) -> f64 {
    seconds * 1e6 / units.max(1) as f64
}

/// Each tenth of the `drained` workflows after `from` were terminal: its
/// rate and the process's CPU a workflow, interpolated between samples.
pub(super) fn tenths(samples: &[Sample], from: u64, drained: u64) -> Vec<Tenth> {
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
pub(super) fn slope(points: &[(f64, f64)]) -> f64 {
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
pub(super) struct SerialTimes {
    polls: HashMap<String, f64>,
    tasks: HashMap<String, f64>,
    held: HashMap<String, f64>,
}

impl SerialTimes {
    pub(super) fn read() -> Self {
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
    pub(super) fn parts(
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
