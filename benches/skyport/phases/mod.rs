//! The phases, a file each (the two fairness phases share one; the fleet's
//! two, a folder): each runs its phase as a method of
//! [`Bench`](crate::bench::Bench) and owns its result, its verdicts and its
//! chart. Here, what their verdicts share: [`Verdict`] and its formatting.

pub(crate) mod all_in_one;
pub(crate) mod batch;
pub(crate) mod burst;
pub(crate) mod cosmos_cost;
pub(crate) mod end_to_end;
pub(crate) mod fairness;
pub(crate) mod fixed_rate;
pub(crate) mod fleet;
pub(crate) mod held;
pub(crate) mod ingest;
pub(crate) mod kafka;
pub(crate) mod named;
pub(crate) mod post_wait;
pub(crate) mod quotas;
pub(crate) mod rate_limit;
pub(crate) mod scale;
pub(crate) mod status_writes;
pub(crate) mod store;
pub(crate) mod time_to_terminal;
pub(crate) mod timers;

use std::collections::BTreeMap;

use crate::poster::Latency;

/// What issue 50 asks of every serial part: 15,000 workflows a second.
pub(crate) const CEILING_TARGET: f64 = 15_000.0;

/// A target of the issue, and whether this run met it.
pub(crate) struct Verdict {
    pub(crate) what: String,
    pub(crate) measured: String,
    pub(crate) target: &'static str,
    /// `None` for a figure with no target.
    pub(crate) met: Option<bool>,
}

/// The percentiles of a run's answers, or that there were none.
pub(crate) fn latency(latency: Option<&Latency>) -> String {
    latency.map_or_else(
        || "no answers".into(),
        |l| {
            format!(
                "p50 {:.2} ms, p99 {:.2} ms, p99.9 {:.2} ms, max {:.1} ms",
                l.p50_ms, l.p99_ms, l.p99_9_ms, l.max_ms
            )
        },
    )
}

pub(crate) fn describe(counts: &BTreeMap<String, u64>) -> String {
    if counts.is_empty() {
        return "none".into();
    }
    counts
        .iter()
        .map(|(what, n)| format!("{n} × {what}"))
        .collect::<Vec<_>>()
        .join(", ")
}
