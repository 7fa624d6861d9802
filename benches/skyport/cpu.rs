//! CPU time of processes, from Linux's `/proc`: this process (the servers
//! under test), the children it has waited for (the poster), and another
//! process by its id (the simulated services).

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
