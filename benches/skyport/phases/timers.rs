//! The timers phase: deliveries deferred (`worker.booking_lead_s`) on the
//! all-in-one with the services at 20 ms, their `runsAt` spread evenly over
//! a window that starts once every one is posted: how late each timer fired
//! (from `runsAt` to its `DeliveryDue`'s publish, the worker's histogram)
//! and how late each first step ran, every one Scheduled, none run twice.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use skyport_core::status::DeliveryState;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::bench::{BODY, Bench, terminal_documents};
use crate::phases::{Verdict, latency};
use crate::poster::Latency;

/// The lead: a day before its pickup a delivery books.
const LEAD_S: i64 = 86_400;

/// POSTs at once while the deliveries are posted.
const POSTING: usize = 64;

/// The goal: timers at most this late at p99.
const LATE_TARGET_MS: f64 = 1_000.0;

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct TimersRun {
    pub(crate) deliveries: u64,
    /// Over how long their `runsAt` are spread, and the fires a second that makes.
    pub(crate) window_s: f64,
    pub(crate) fires_per_s: f64,
    /// From `runsAt` to the publish of its `DeliveryDue` (the worker's
    /// histogram, interpolated in its buckets).
    pub(crate) late_at_publish_p50_ms: f64,
    pub(crate) late_at_publish_p99_ms: f64,
    /// From `runsAt` to the first step's answer.
    pub(crate) late_at_first_step: Option<Latency>,
    pub(crate) scheduled: u64,
    /// Deliveries that ran more than once (an attempt past 1): must be 0.
    pub(crate) ran_twice: u64,
}

impl Bench {
    pub(crate) async fn timers(&self) -> anyhow::Result<TimersRun> {
        let plan = &self.plan;
        let lead = [("worker.booking_lead_s", LEAD_S.to_string())];
        let (system, services) = self.system("timers", 0, &lead).await?;
        let settings = self.settings("timers", &lead)?;
        Self::await_partitions("timers", &system, settings.stream.partitions).await?;
        let deliveries = plan.timer_deliveries;
        let window = plan.timer_window;
        // The window starts once every delivery is posted (a posting rate of
        // at least 2,000/s is assumed, with a margin).
        let start = OffsetDateTime::now_utc()
            + time::Duration::seconds_f64(deliveries as f64 / 2_000.0 + 2.0);
        eprintln!(
            "timers: {deliveries} deliveries, runsAt spread over {} s",
            window.as_secs_f64()
        );
        let http = reqwest::Client::new();
        let permits = Arc::new(Semaphore::new(POSTING));
        let mut posts = JoinSet::new();
        for n in 0..deliveries {
            let runs_at = start
                + time::Duration::seconds_f64(window.as_secs_f64() * n as f64 / deliveries as f64);
            let pickup = runs_at + time::Duration::seconds(LEAD_S);
            let body = BODY
                .replace("pkg-1", &format!("pkg-timer-{n}"))
                .replace("2030-01-01T10:00:00Z", &pickup.format(&Rfc3339)?)
                .replace(
                    "2030-01-01T12:00:00Z",
                    &(pickup + time::Duration::hours(2)).format(&Rfc3339)?,
                );
            let (http, url) = (http.clone(), system.url.clone());
            let permit = Arc::clone(&permits).acquire_owned().await?;
            posts.spawn(async move {
                let status = http
                    .post(&url)
                    .header("content-type", "application/json")
                    .body(body)
                    .send()
                    .await
                    .map(|r| r.status());
                drop(permit);
                status
            });
        }
        for status in posts.join_all().await {
            anyhow::ensure!(status? == 202, "timers: a POST was not accepted");
        }
        anyhow::ensure!(
            OffsetDateTime::now_utc() < start,
            "timers: posting outlasted the window's start"
        );
        // Each delivery puts two events in the stream (its request and its
        // timer's DeliveryDue), so the stream's count is no measure here.
        let deadline = tokio::time::Instant::now() + self.plan.drain_timeout + window;
        while system.terminal() < deliveries {
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "timers: {} of {deliveries} deliveries terminal",
                system.terminal()
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        let documents = terminal_documents(&system).await?;
        let mut late = Vec::new();
        let mut ran_twice = 0;
        for document in &documents {
            ran_twice += u64::from(document.attempt > 1);
            if let (Some(runs_at), Some(first)) = (document.runs_at, document.steps.first()) {
                let micros = (first.at - runs_at).whole_microseconds().max(0);
                late.push(u32::try_from(micros).unwrap_or(u32::MAX));
            }
        }
        let scheduled = documents
            .iter()
            .filter(|d| d.state == DeliveryState::Scheduled)
            .count() as u64;
        let buckets = lateness_buckets();
        let (p50, p99) = (quantile(&buckets, 0.5), quantile(&buckets, 0.99));
        Self::stop(system, services).await?;
        Ok(TimersRun {
            deliveries,
            window_s: window.as_secs_f64(),
            fires_per_s: deliveries as f64 / window.as_secs_f64(),
            late_at_publish_p50_ms: p50 * 1e3,
            late_at_publish_p99_ms: p99 * 1e3,
            late_at_first_step: Latency::of(&mut late),
            scheduled,
            ran_twice,
        })
    }
}

/// The timers' lateness histogram as this process exposes it: each
/// bucket's upper bound and cumulative count.
fn lateness_buckets() -> Vec<(f64, f64)> {
    skyport_runtime::metrics::global()
        .render()
        .lines()
        .filter_map(|line| line.strip_prefix("skyport_timer_lateness_seconds_bucket{le=\""))
        .filter_map(|rest| {
            let (le, count) = rest.split_once("\"} ")?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, count.split_whitespace().next()?.parse().ok()?))
        })
        .collect()
}

/// The `q` quantile of cumulative `buckets`, interpolated within its bucket
/// as Prometheus' `histogram_quantile` does.
fn quantile(buckets: &[(f64, f64)], q: f64) -> f64 {
    let Some(&(_, total)) = buckets.last() else {
        return 0.0;
    };
    let rank = q * total;
    let (mut lower, mut below) = (0.0, 0.0);
    for &(upper, cumulative) in buckets {
        if cumulative >= rank && cumulative > below {
            if !upper.is_finite() {
                return lower;
            }
            return lower + (upper - lower) * (rank - below) / (cumulative - below);
        }
        (lower, below) = (upper, cumulative);
    }
    lower
}

impl TimersRun {
    pub(crate) fn verdicts(&self) -> Vec<Verdict> {
        vec![Verdict {
            what: format!(
                "timers: {} deliveries deferred, runsAt over {:.0} s ({:.0} fires/s), services at 20 ms",
                self.deliveries, self.window_s, self.fires_per_s
            ),
            measured: format!(
                "{} Scheduled, {} ran twice; late at the fire p50 {:.1} ms, p99 {:.1} ms; at the first step {}",
                self.scheduled,
                self.ran_twice,
                self.late_at_publish_p50_ms,
                self.late_at_publish_p99_ms,
                latency(self.late_at_first_step.as_ref())
            ),
            target: "p99 ≤ 1 s late; all Scheduled, none twice",
            met: Some(
                self.late_at_publish_p99_ms <= LATE_TARGET_MS
                    && self.scheduled == self.deliveries
                    && self.ran_twice == 0,
            ),
        }]
    }

    /// What fails the run: a delivery not Scheduled, or one run twice.
    pub(crate) fn failures(&self, _full: bool) -> Vec<String> {
        (self.scheduled != self.deliveries || self.ran_twice > 0)
            .then(|| {
                format!(
                    "timers: {} of {} Scheduled, {} ran twice",
                    self.scheduled, self.deliveries, self.ran_twice
                )
            })
            .into_iter()
            .collect()
    }
}
