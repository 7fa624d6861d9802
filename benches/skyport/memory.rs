//! Peak resident memory of this process (the servers under test; the load
//! generator is another process), or of another by its id, from Linux's `/proc`.

use anyhow::Context;

/// Starts a new peak: the kernel resets `VmHWM` to the current RSS.
pub(crate) fn reset_peak() -> anyhow::Result<()> {
    std::fs::write("/proc/self/clear_refs", "5").context("cannot reset /proc/self VmHWM")
}

/// The peak resident set since the last [`reset_peak`], in MiB.
pub(crate) fn peak_mib() -> anyhow::Result<f64> {
    peak("self")
}

/// The peak resident set of the process `pid` since it started, in MiB.
pub(crate) fn peak_mib_of(pid: u32) -> anyhow::Result<f64> {
    peak(&pid.to_string())
}

fn peak(pid: &str) -> anyhow::Result<f64> {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path).with_context(|| format!("cannot read {path}"))?;
    let kib: f64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .with_context(|| format!("{path} has no VmHWM line"))?;
    Ok(kib / 1024.0)
}
