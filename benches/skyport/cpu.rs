//! CPU time of processes, from Linux's `/proc`: this process (the servers
//! under test), the children it has waited for (the poster), and another
//! process by its id (the simulated services); and the threads of this
//! process that carry a name (the embedded store's committer).

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
        // The command name (field 2) may hold spaces: the fields that follow
        // start after its closing parenthesis, at field 3.
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .map(|(_, rest)| rest.split_whitespace().collect())
            .unwrap_or_default();
        let field = |n: usize| -> anyhow::Result<f64> {
            let ticks: u64 = fields
                .get(n - 3)
                .and_then(|v| v.parse().ok())
                .with_context(|| format!("{path} has no field {n}"))?;
            Ok(ticks as f64 / TICKS_PER_S)
        };
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
    let kept = &name.as_bytes()[..name.len().min(15)];
    let mut seconds = 0.0;
    for task in std::fs::read_dir("/proc/self/task").context("cannot list /proc/self/task")? {
        let stat = match std::fs::read_to_string(task?.path().join("stat")) {
            Ok(stat) => stat,
            // A thread that ended since the listing.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e).context("cannot read a thread's stat"),
        };
        let Some((head, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let comm = head.split_once('(').map_or("", |(_, comm)| comm);
        if comm.as_bytes() != kept {
            continue;
        }
        let fields: Vec<&str> = rest.split_whitespace().collect();
        for n in [14, 15] {
            let ticks: u64 = fields
                .get(n - 3)
                .and_then(|v| v.parse().ok())
                .context("a thread's stat has no CPU times")?;
            seconds += ticks as f64 / TICKS_PER_S;
        }
    }
    Ok(seconds)
}
