//! CPU time of processes, from Linux's `/proc`: this process (the servers
//! under test), the children it has waited for (the poster), and another
//! process by its id (the simulated services); and this process's threads
//! by name (the embedded store's committer, the runtime's workers).

use std::collections::HashMap;

use anyhow::Context;

/// Clock ticks per second of `/proc/*/stat`: `USER_HZ`, 100 on Linux.
const TICKS_PER_S: f64 = 100.0;

/// CPU seconds used so far, as `/proc/PID/stat` counts them.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CpuTime {
    /// The process's own threads, user and system.
    pub(crate) own_s: f64,
    /// Its children that ended and were waited for.
    pub(crate) children_s: f64,
}

impl CpuTime {
    /// This process.
    pub(crate) fn this() -> anyhow::Result<Self> {
        Self::read("self")
    }

    /// The process `pid`.
    pub(crate) fn of(pid: u32) -> anyhow::Result<Self> {
        Self::read(&pid.to_string())
    }

    fn read(pid: &str) -> anyhow::Result<Self> {
        let path = format!("/proc/{pid}/stat");
        let stat = std::fs::read_to_string(&path).with_context(|| format!("cannot read {path}"))?;
        let (_, fields) = split(&stat).with_context(|| format!("{path} is not a stat line"))?;
        let field =
            |n: usize| ticks(&fields, n).with_context(|| format!("{path} has no field {n}"));
        Ok(Self {
            own_s: field(14)? + field(15)?,
            children_s: field(16)? + field(17)?,
        })
    }

    /// What was used between `earlier` and this reading.
    pub(crate) fn since(self, earlier: Self) -> Self {
        Self {
            own_s: self.own_s - earlier.own_s,
            children_s: self.children_s - earlier.children_s,
        }
    }
}

/// CPU seconds used so far by this process's threads named `name` (as
/// much of it as `/proc` keeps: 15 bytes), user and system.
pub(crate) fn thread_s(name: &str) -> anyhow::Result<f64> {
    let kept = String::from_utf8_lossy(&name.as_bytes()[..name.len().min(15)]).into_owned();
    Ok(threads()?.get(&kept).map_or(0.0, |t| t.cpu_s))
}

/// The CPU seconds of this process's threads that carry one name, and how
/// many carry it now.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Threads {
    pub(crate) cpu_s: f64,
    pub(crate) count: usize,
}

/// This process's threads by name (as much of it as `/proc` keeps), user
/// and system CPU seconds so far.
pub(crate) fn threads() -> anyhow::Result<HashMap<String, Threads>> {
    let mut found: HashMap<String, Threads> = HashMap::new();
    for task in std::fs::read_dir("/proc/self/task").context("cannot list /proc/self/task")? {
        let stat = match std::fs::read_to_string(task?.path().join("stat")) {
            Ok(stat) => stat,
            // A thread that ended since the listing.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e).context("cannot read a thread's stat"),
        };
        let (comm, fields) = split(&stat).context("a thread's stat is not a stat line")?;
        let cpu_s = ticks(&fields, 14).context("a thread's stat has no CPU times")?
            + ticks(&fields, 15).context("a thread's stat has no CPU times")?;
        let entry = found.entry(comm.to_owned()).or_default();
        entry.cpu_s += cpu_s;
        entry.count += 1;
    }
    Ok(found)
}

/// A `stat` line's command name (field 2, which may hold spaces and
/// parentheses) and the fields after it, from field 3 on.
fn split(stat: &str) -> Option<(&str, Vec<&str>)> {
    let (head, rest) = stat.rsplit_once(')')?;
    let (_, comm) = head.split_once('(')?;
    Some((comm, rest.split_whitespace().collect()))
}

/// Field `n` (counted from 1, as `proc(5)` does) of `fields`, which start at
/// field 3, in seconds: a count of clock ticks.
fn ticks(fields: &[&str], n: usize) -> Option<f64> {
    let ticks: u64 = fields.get(n - 3)?.parse().ok()?;
    Some(ticks as f64 / TICKS_PER_S)
}
