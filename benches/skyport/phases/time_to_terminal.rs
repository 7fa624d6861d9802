//! (8) The time-to-terminal phase: the system of the end-to-end phase fed at
//! fixed rates, each delivery's time from its acceptance to its terminal
//! status, from the timestamps of its status document (read through the
//! change feed once all are terminal), not by polling; then the first rate
//! again with every request asking for a callback to a receiver in this
//! process, and each callback's delay after the terminal write it announces.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::bench::{Bench, OPEN_LOOP_CONNECTIONS, terminal_times};
use crate::callbacks;
use crate::phases::{Verdict, latency};
use crate::poster::{self, Latency, Naming, Schedule};

/// Deliveries fed at a fixed rate, and each one's time from its acceptance
/// to its terminal status (from its status document's timestamps).
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct TimeToTerminal {
    pub(crate) rate: u32,
    pub(crate) seconds: f64,
    pub(crate) accepted: u64,
    /// Every request is valid: must be 0.
    pub(crate) failed: u64,
    /// The 202's latency, from when each request was due.
    pub(crate) accept: Option<Latency>,
    /// From acceptance to the terminal status.
    pub(crate) terminal: Option<Latency>,
    /// From the terminal status's write to its callback's arrival (absent
    /// from runs before the requests asked for callbacks).
    #[serde(default)]
    pub(crate) callback: Option<Latency>,
}

impl Bench {
    /// (8): the system of [`Bench::end_to_end`] fed at each fixed rate for
    /// `plan.terminal_duration`, on a fresh store each; then every delivery's
    /// time from acceptance to its terminal status, from its status document.
    /// Then the first rate again with every request asking for a callback,
    /// and each callback's delay after the terminal write it announces.
    pub(crate) async fn time_to_terminal(&self) -> anyhow::Result<Vec<TimeToTerminal>> {
        let plan = &self.plan;
        let runs = plan
            .terminal_rates
            .iter()
            .map(|rate| (*rate, false))
            .chain([(plan.terminal_rates[0], true)]);
        let mut rows = Vec::new();
        for (rate, calling_back) in runs {
            let phase = format!(
                "time-to-terminal-{rate}{}",
                if calling_back { "-callbacks" } else { "" }
            );
            eprintln!(
                "time to terminal: {rate}/s for {} s, 5 services at 20 ms per call{}",
                plan.terminal_duration.as_secs(),
                if calling_back {
                    ", a callback each"
                } else {
                    ""
                }
            );
            let receiver = if calling_back {
                Some(callbacks::Receiver::start().await?)
            } else {
                None
            };
            let loopback = [("callbacks.allow", "[\"127.0.0.0/8\"]".to_owned())];
            let settings = self.settings(&phase, &loopback)?;
            let (system, services) = self.system(&phase, 0, &loopback).await?;
            Self::await_partitions(&phase, &system, settings.stream.partitions).await?;
            let schedule = Schedule::Rate {
                per_s: rate,
                duration: plan.terminal_duration,
            };
            let posted = poster::post_calling_back(
                &system.url,
                schedule,
                OPEN_LOOP_CONNECTIONS,
                Naming::Unnamed,
                receiver.as_ref().map(|r| r.url.as_str()),
            )
            .await?;
            let accepted = posted.status("202");
            self.drain(&system, accepted).await?;
            let mut micros = terminal_times(&system).await?;
            let terminal = micros.len() as u64;
            let failed = system.failed();
            let mut delays = match receiver {
                Some(receiver) => Some(Self::called_back(receiver, accepted).await?),
                None => None,
            };
            Self::stop(system, services).await?;
            anyhow::ensure!(
                terminal >= accepted,
                "time to terminal at {rate}/s: {terminal} terminal documents for {accepted} accepted"
            );
            rows.push(TimeToTerminal {
                rate,
                seconds: plan.terminal_duration.as_secs_f64(),
                accepted,
                failed,
                accept: posted.latency,
                terminal: Latency::of(&mut micros),
                callback: delays.as_mut().and_then(|delays| Latency::of(delays)),
            });
        }
        Ok(rows)
    }

    /// Waits (at most a minute) until `receiver` has had `accepted`
    /// callbacks, then stops it; their delays.
    pub(crate) async fn called_back(
        receiver: callbacks::Receiver,
        accepted: u64,
    ) -> anyhow::Result<Vec<u32>> {
        let started = Instant::now();
        while (receiver.received() as u64) < accepted {
            anyhow::ensure!(
                started.elapsed() < Duration::from_secs(60),
                "{} callbacks for {accepted} accepted after 60 s",
                receiver.received()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        receiver.stop().await
    }
}

impl TimeToTerminal {
    /// The time a client waits, with a target at 2,000/s; a callback's delay,
    /// with one at 1,000/s.
    pub(crate) fn verdicts(&self) -> Vec<Verdict> {
        let with = if self.callback.is_some() {
            ", a callback each"
        } else {
            ""
        };
        let mut verdicts = vec![Verdict {
            what: format!(
                "time to terminal at {}/s for {:.0} s, 5 services at 20 ms{with}",
                self.rate, self.seconds
            ),
            measured: format!(
                "{} accepted ({} Failed); acceptance to terminal: {}; the 202: {}",
                self.accepted,
                self.failed,
                latency(self.terminal.as_ref()),
                latency(self.accept.as_ref())
            ),
            target: if self.rate >= 2_000 && self.callback.is_none() {
                "p99 ≤ 200 ms"
            } else {
                "(the time a client waits)"
            },
            met: (self.rate >= 2_000 && self.callback.is_none())
                .then(|| self.terminal.as_ref().is_some_and(|l| l.p99_ms <= 200.0)),
        }];
        if let Some(callback) = &self.callback {
            let goal = self.rate == 1_000;
            verdicts.push(Verdict {
                what: format!(
                    "callbacks at {}/s: the terminal write to the callback's arrival",
                    self.rate
                ),
                measured: latency(Some(callback)),
                target: if goal {
                    "p99 ≤ 100 ms"
                } else {
                    "(the time a receiver waits)"
                },
                met: goal.then_some(callback.p99_ms <= 100.0),
            });
        }
        verdicts
    }

    /// What fails the run: a delivery Failed; in a smoke run, nothing accepted.
    pub(crate) fn failures(&self, full: bool) -> Vec<String> {
        let mut failures = Vec::new();
        if self.failed > 0 || (!full && self.accepted == 0) {
            failures.push(format!(
                "time to terminal at {}/s: {} accepted, {} Failed",
                self.rate, self.accepted, self.failed
            ));
        }
        failures
    }
}
