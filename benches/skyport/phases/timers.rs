//! The timers phases: deliveries deferred (`worker.booking_lead_s`) on the
//! all-in-one with the services at 20 ms, their `runsAt` spread evenly over
//! a window that starts once every one is Waiting: how late each timer fired
//! (from `runsAt` to its `DeliveryDue`'s publish, the worker's histogram)
//! and how late each first step ran, every one Scheduled, none run twice.
//! `timers` on the embedded store; `timers-cosmos` with the status on
//! Cosmos DB (the emulator, at the rate it sustains here), with what the
//! timers cost in request units: idle a second per shard, a write, a fire.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use skyport_core::status::DeliveryState;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use skyport::Store;
use skyport_azure::cosmos::CosmosStore;
use skyport_azure::cosmos::request_units::{Operation, Spend};
use skyport_core::ports::Timers;
use skyport_tests::fleet::servers::Server;

use crate::bench::{BODY, Bench, terminal_documents};
use crate::phases::cosmos_cost::cosmos_keys;
use crate::phases::{Verdict, latency};
use crate::poster::Latency;
use crate::servers::AllInOne;

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
    /// On Cosmos DB, what the timers cost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) cosmos: Option<TimerCosts>,
}

/// What timers cost on Cosmos DB, from the store's request units.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct TimerCosts {
    pub(crate) shards: u32,
    /// Request units a second the timers spent with none waiting (the due
    /// reads of every shard, their counts, the search for lost ones), per shard.
    pub(crate) idle_ru_per_s_per_shard: f64,
    /// A timer's write beside its Waiting status write.
    pub(crate) write_ru: f64,
    /// A fire, over what the idle polls cost anyway: the due read that
    /// returned it (its share) and the removal of its timer.
    pub(crate) fire_ru: f64,
    /// The Waiting status write a deferred delivery adds.
    pub(crate) waiting_write_ru: f64,
}

impl Bench {
    /// The embedded store: `plan.timer_deliveries` over `plan.timer_window`.
    pub(crate) async fn timers(&self) -> anyhow::Result<TimersRun> {
        self.deferred("timers", Vec::new(), self.plan.timer_deliveries, 2_000.0)
            .await
    }

    /// Cosmos DB (the SDK's emulator served over HTTP, a process of its own):
    /// `plan.timer_cosmos_deliveries` over the same window, and what the
    /// timers spent.
    pub(crate) async fn timers_on_cosmos(&self) -> anyhow::Result<TimersRun> {
        let cosmos = Server::start(&["cosmos"]).await;
        let keys = cosmos_keys(&cosmos.address);
        let run = self
            .deferred(
                "timers-cosmos",
                keys,
                self.plan.timer_cosmos_deliveries,
                f64::from(self.plan.cost_rate),
            )
            .await;
        cosmos.stop().await;
        run
    }

    /// `deliveries` deferred on a system with `keys`, their `runsAt` spread
    /// over `plan.timer_window` from once every one is Waiting (recorded at
    /// `waiting_per_s` at least, with a margin).
    async fn deferred(
        &self,
        phase: &str,
        mut keys: Vec<(&'static str, String)>,
        deliveries: u64,
        waiting_per_s: f64,
    ) -> anyhow::Result<TimersRun> {
        keys.push(("worker.booking_lead_s", LEAD_S.to_string()));
        let (system, services) = self.system(phase, 0, &keys).await?;
        let settings = self.settings(phase, &keys)?;
        Self::await_partitions(phase, &system, settings.stream.partitions).await?;
        let cosmos = match &system.app.backends.store {
            Store::Cosmos(cosmos) => Some(Arc::clone(cosmos)),
            Store::Embedded(_) => None,
        };
        let idle = match &cosmos {
            Some(cosmos) => {
                let before = timer_units(cosmos);
                let idle = self.plan.timer_idle;
                tokio::time::sleep(idle).await;
                Some((timer_units(cosmos) - before) / idle.as_secs_f64())
            }
            None => None,
        };
        let window = self.plan.timer_window;
        let start = OffsetDateTime::now_utc()
            + time::Duration::seconds_f64(deliveries as f64 / waiting_per_s.min(2_000.0) + 3.0);
        eprintln!(
            "{phase}: {deliveries} deliveries, runsAt spread over {} s",
            window.as_secs_f64()
        );
        let waiting_before = status_write_units(cosmos.as_deref());
        let buckets_before = lateness_buckets();
        post_deferred(&system.url, deliveries, start, window).await?;
        while waiting_outcomes() < deliveries as f64 {
            anyhow::ensure!(
                OffsetDateTime::now_utc() < start,
                "{phase}: {} of {deliveries} Waiting when the window starts",
                waiting_outcomes()
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        let waiting_written = status_write_units(cosmos.as_deref()) - waiting_before;
        let written = cosmos.as_deref().map(|c| {
            c.request_units()
                .spent_doing(Spend::Timers, Operation::Write)
                .1
        });
        let fires_before = cosmos.as_deref().map(timer_units);
        let window_began = std::time::Instant::now();
        // Each delivery puts two events in the stream (its request and its
        // timer's DeliveryDue), so the stream's count is no measure here.
        let deadline = tokio::time::Instant::now() + self.plan.drain_timeout + window;
        while system.terminal() < deliveries {
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "{phase}: {} of {deliveries} deliveries terminal",
                system.terminal()
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        let costs = cosmos.as_deref().map(|cosmos| {
            let n = deliveries.max(1) as f64;
            let fired = timer_units(cosmos) - fires_before.unwrap_or(0.0);
            // What the shards' polls would have cost over the window anyway.
            let polled = idle.unwrap_or(0.0) * window_began.elapsed().as_secs_f64();
            TimerCosts {
                shards: cosmos.shards(),
                idle_ru_per_s_per_shard: idle.unwrap_or(0.0) / f64::from(cosmos.shards()),
                write_ru: written.unwrap_or(0.0) / n,
                fire_ru: (fired - polled).max(0.0) / n,
                waiting_write_ru: waiting_written / n,
            }
        });
        let mut run = summarise(&system, deliveries, window, &buckets_before).await?;
        run.cosmos = costs;
        Self::stop(system, services).await?;
        Ok(run)
    }
}

/// Posts `deliveries`, their `runsAt` spread over `window` from `start`,
/// [`POSTING`] at once.
async fn post_deferred(
    url: &str,
    deliveries: u64,
    start: OffsetDateTime,
    window: std::time::Duration,
) -> anyhow::Result<()> {
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
        let (http, url) = (http.clone(), url.to_owned());
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
    Ok(())
}

/// The run's figures from the terminal documents and the lateness histogram.
async fn summarise(
    system: &AllInOne,
    deliveries: u64,
    window: std::time::Duration,
    buckets_before: &[(f64, f64)],
) -> anyhow::Result<TimersRun> {
    let documents = terminal_documents(system).await?;
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
    // The histogram is the process's: this run's fires are what it gained.
    let buckets: Vec<(f64, f64)> = lateness_buckets()
        .into_iter()
        .map(|(le, count)| {
            let before = buckets_before
                .iter()
                .find(|(b, _)| *b == le)
                .map_or(0.0, |(_, c)| *c);
            (le, count - before)
        })
        .collect();
    let (p50, p99) = (quantile(&buckets, 0.5), quantile(&buckets, 0.99));
    Ok(TimersRun {
        deliveries,
        window_s: window.as_secs_f64(),
        fires_per_s: deliveries as f64 / window.as_secs_f64(),
        late_at_publish_p50_ms: p50 * 1e3,
        late_at_publish_p99_ms: p99 * 1e3,
        late_at_first_step: Latency::of(&mut late),
        scheduled,
        ran_twice,
        cosmos: None,
    })
}

/// The request units the timers have spent on `cosmos`.
fn timer_units(cosmos: &CosmosStore) -> f64 {
    cosmos.request_units().spent_on(Spend::Timers).1
}

/// The request units of status writes so far, on Cosmos DB.
fn status_write_units(cosmos: Option<&CosmosStore>) -> f64 {
    cosmos.map_or(0.0, |c| {
        c.request_units()
            .spent_doing(Spend::StatusWrites, Operation::Write)
            .1
    })
}

/// Deliveries this process's workers recorded Waiting.
fn waiting_outcomes() -> f64 {
    skyport_runtime::metrics::global()
        .render()
        .lines()
        .find_map(|line| {
            line.strip_prefix("skyport_workflow_events_total{outcome=\"waiting\"} ")?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or(0.0)
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
        let store = if self.cosmos.is_some() {
            "Cosmos DB"
        } else {
            "the embedded store"
        };
        let mut verdicts = vec![Verdict {
            what: format!(
                "timers on {store}: {} deliveries deferred, runsAt over {:.0} s ({:.0} fires/s), services at 20 ms",
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
        }];
        if let Some(costs) = &self.cosmos {
            verdicts.push(Verdict {
                what: format!(
                    "timers on Cosmos DB: request units, {} shards",
                    costs.shards
                ),
                measured: format!(
                    "idle {:.2} RU/s a shard; a deferred delivery: its timer's write {:.2} RU, its fire {:.2} RU over the idle polls \
                     (the due read that returned it, the timer's removal), its Waiting status write {:.2} RU",
                    costs.idle_ru_per_s_per_shard,
                    costs.write_ru,
                    costs.fire_ru,
                    costs.waiting_write_ru
                ),
                target: "stated",
                met: None,
            });
        }
        verdicts
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
