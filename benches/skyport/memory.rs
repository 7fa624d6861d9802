//! Peak resident memory of this process (the servers under test; the load
//! generator is another process), from Linux's `/proc/self`.

use anyhow::Context;

/// Starts a new peak: the kernel resets `VmHWM` to the current RSS.
pub(crate) fn reset_peak() -> anyhow::Result<()> {
    std::fs::write("/proc/self/clear_refs", "5").context("cannot reset /proc/self VmHWM")
}

/// The peak resident set since the last [`reset_peak`], in MiB.
pub(crate) fn peak_mib() -> anyhow::Result<f64> {
    let status =
        std::fs::read_to_string("/proc/self/status").context("cannot read /proc/self/status")?;
    let kib: f64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .context("/proc/self/status has no VmHWM line")?;
    Ok(kib / 1024.0)
}
