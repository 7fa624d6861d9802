//! (5) The rate-limit phase: the worker's rate limiter at R, with a backlog
//! larger than R can clear, against R.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::bench::Bench;
use crate::phases::Verdict;
use crate::poster::{self, Naming, Schedule};

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct RateLimited {
    pub(crate) rate: u32,
    pub(crate) seconds: f64,
    pub(crate) completed: u64,
    pub(crate) achieved_per_s: f64,
    /// Accepted requests still waiting when the window closed (the backlog was big enough).
    pub(crate) waiting_after: u64,
}

impl Bench {
    /// (5): the rate limiter at R with a backlog larger than R can clear.
    pub(crate) async fn rate_limited(&self) -> anyhow::Result<RateLimited> {
        let plan = &self.plan;
        let rate = plan.limited_rate;
        eprintln!("rate limiter at {rate}/s");
        let (system, services) = self.system("rate-limit", rate, &[]).await?;
        let window = plan.limited_window;
        let backlog = u64::from(rate) * (window.as_secs() + 4);
        let posted = poster::post(
            &system.url,
            Schedule::Requests(backlog),
            64,
            Naming::Unnamed,
            0,
        )
        .await?;
        // Let the limiter settle after the posting, then count over the window.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let before = system.terminal();
        let opened = Instant::now();
        tokio::time::sleep(window).await;
        let completed = system.terminal() - before;
        let seconds = opened.elapsed().as_secs_f64();
        let waiting = posted.status("202").saturating_sub(system.terminal());
        Self::stop(system, services).await?;
        Ok(RateLimited {
            rate,
            seconds,
            completed,
            achieved_per_s: completed as f64 / seconds,
            waiting_after: waiting,
        })
    }
}

impl RateLimited {
    /// The rate it kept, within 1 % of R with a backlog left.
    pub(crate) fn verdicts(&self) -> Vec<Verdict> {
        let off = (self.achieved_per_s - f64::from(self.rate)) / f64::from(self.rate) * 100.0;
        vec![Verdict {
            what: format!("rate limiter at {}/s", self.rate),
            measured: format!(
                "{:.1}/s ({:+.2} %): {} in {:.1} s, {} still waiting",
                self.achieved_per_s, off, self.completed, self.seconds, self.waiting_after
            ),
            target: "within 1 %",
            met: Some(off.abs() <= 1.0 && self.waiting_after > 0),
        }]
    }

    /// What fails a smoke run: nothing completed.
    pub(crate) fn failures(&self, full: bool) -> Vec<String> {
        let mut failures = Vec::new();
        if !full && self.completed == 0 {
            failures.push("rate limiter: nothing completed".into());
        }
        failures
    }
}
