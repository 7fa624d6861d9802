//! The cosmos-cost phase (issue 51): what a delivery costs on Cosmos DB.
//! Gateway and worker in this process on the embedded stream with status on
//! Cosmos DB (the SDK's emulator served over HTTP, a process of its own),
//! the simulated services in theirs at 20 ms; every request named (an
//! `Idempotency-Key`). Two mixes, each on an emulator of its own: every
//! request asking for a callback, and none. Posted open loop at a rate the
//! emulator sustains here, then drained (and every callback received): the
//! request units a delivery spent, by what they were for
//! (`skyport_cosmos_request_units_total`'s `work`), against one status
//! write's; and Skyport's CPU per workflow against the embedded store's,
//! posted the same way (with callbacks) at the same rate.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;

use serde::{Deserialize, Serialize};
use skyport::Store;
use skyport_azure::cosmos::CosmosStore;
use skyport_azure::cosmos::emulator::Emulator;
use skyport_azure::cosmos::request_units::{Operation, RequestUnits, Spend};
use skyport_tests::fleet::Member;
use skyport_tests::fleet::servers::Server;
use skyport_tests::fleet::shape::{CALLBACK_SECRET, RECEIPT_KEY, change_feed_timings};

use crate::bench::{Bench, OPEN_LOOP_CONNECTIONS};
use crate::callbacks;
use crate::cpu::CpuTime;
use crate::phases::{Verdict, describe, latency};
use crate::poster::{self, Naming, Posted, Schedule};

/// How long the request units must stay unchanged for the callbacks'
/// outcomes to count as written, and how long that may take at most.
const SETTLED: Duration = Duration::from_secs(3);
const SETTLE_AT_MOST: Duration = Duration::from_secs(60);

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct CosmosCost {
    /// Deliveries due a second, and for how long.
    pub(crate) rate: u32,
    pub(crate) seconds: f64,
    /// Every request named, each asking for a callback; and none asking.
    pub(crate) with_callbacks: Mix,
    pub(crate) without_callbacks: Mix,
    /// The mix with callbacks on the embedded store, and Skyport's CPU a workflow there.
    pub(crate) on_embedded: Posted,
    pub(crate) embedded_cpu_us: f64,
    /// Deliveries Failed, over the three runs.
    pub(crate) failed: u64,
}

/// One mix posted to Cosmos DB.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Mix {
    pub(crate) posted: Posted,
    /// Request units by what they were for, over the whole run.
    pub(crate) units: Vec<Spent>,
    /// The writes of status documents (the status writes' reads apart),
    /// and the mean charge of one.
    pub(crate) status_writes: u64,
    pub(crate) one_write_ru: f64,
    /// Skyport's CPU a workflow, and the emulator's beside it.
    pub(crate) cpu_us: f64,
    pub(crate) emulator_cpu_us: f64,
    pub(crate) failed: u64,
}

impl Mix {
    fn deliveries(&self) -> f64 {
        self.posted.status("202").max(1) as f64
    }

    /// The request units a delivery of this mix (`what`) against at most
    /// `limit` × one write of its status document.
    fn units_verdict(&self, what: &str, limit: f64, target: &'static str) -> Verdict {
        let per = self.units.iter().map(|s| s.units).sum::<f64>() / self.deliveries();
        let ratio = per / self.one_write_ru.max(f64::MIN_POSITIVE);
        Verdict {
            what: format!("cosmos cost: request units a delivery, {what}, by what they were for"),
            measured: format!(
                "{} of {} → 202; {per:.1} RU, {ratio:.2} × one write of a status document ({:.2} RU, \
                 {:.2} such writes a delivery): {}; Skyport's CPU {:.0} µs a workflow, the emulator's {:.0} µs",
                self.posted.status("202"),
                self.posted.requests,
                self.one_write_ru,
                self.status_writes as f64 / self.deliveries(),
                per_delivery(&self.units, self.deliveries()),
                self.cpu_us,
                self.emulator_cpu_us
            ),
            target,
            met: Some(ratio <= limit),
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Spent {
    pub(crate) work: String,
    /// Requests, where counted: a process's `/metrics` has only the units.
    #[serde(default)]
    pub(crate) requests: u64,
    pub(crate) units: f64,
}

/// What `units` were spent on, by kind.
pub(crate) fn spent_by_work(units: &RequestUnits) -> Vec<Spent> {
    Spend::ALL
        .iter()
        .map(|&spend| {
            let (requests, units) = units.spent_on(spend);
            Spent {
                work: spend.name().to_owned(),
                requests,
                units,
            }
        })
        .collect()
}

/// What the processes `members` spent, by kind, from their
/// `skyport_cosmos_request_units_total{operation, work}`.
pub(crate) async fn spent_by_processes(members: impl Iterator<Item = &Member>) -> Vec<Spent> {
    let mut by_work: std::collections::BTreeMap<String, f64> = std::collections::BTreeMap::new();
    for member in members {
        for line in member
            .series_lines("skyport_cosmos_request_units_total{")
            .await
        {
            let work = line
                .split("work=\"")
                .nth(1)
                .and_then(|rest| rest.split('"').next());
            let value = line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok());
            if let (Some(work), Some(value)) = (work, value) {
                *by_work.entry(work.to_owned()).or_default() += value;
            }
        }
    }
    by_work
        .into_iter()
        .map(|(work, units)| Spent {
            work,
            requests: 0,
            units,
        })
        .collect()
}

/// `spent` a delivery, the kinds that spent anything: "status_writes 42.60
/// RU (5.00 requests), …".
pub(crate) fn per_delivery(spent: &[Spent], deliveries: f64) -> String {
    let deliveries = deliveries.max(1.0);
    spent
        .iter()
        .filter(|s| s.units > 0.0 || s.requests > 0)
        .map(|s| {
            let requests = if s.requests > 0 {
                format!(" ({:.2} requests)", s.requests as f64 / deliveries)
            } else {
                String::new()
            };
            format!("{} {:.2} RU{requests}", s.work, s.units / deliveries)
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The keys of the status on the Cosmos DB emulator served at `endpoint`.
pub(crate) fn cosmos_keys(endpoint: &str) -> Vec<(&'static str, String)> {
    vec![
        ("store.backend", "cosmos".to_owned()),
        ("cosmos.auth", "key".to_owned()),
        ("cosmos.key", format!("\"{}\"", Emulator::key())),
        ("cosmos.endpoint", endpoint.to_owned()),
        ("cosmos.region", "\"East US\"".to_owned()),
        ("cosmos.create_if_missing", "true".to_owned()),
        ("cosmos.throughput", "100000".to_owned()),
        // No embedded store keeps one.
        ("gateway.receipt_keys", format!("[\"{RECEIPT_KEY}\"]")),
    ]
}

impl Bench {
    pub(crate) async fn cosmos_cost(&self) -> anyhow::Result<CosmosCost> {
        let plan = &self.plan;
        let schedule = Schedule::Rate {
            per_s: plan.cost_rate,
            duration: plan.cost_duration,
        };
        eprintln!(
            "cosmos cost: {}/s for {} s, named, a callback each, on Cosmos DB",
            plan.cost_rate,
            plan.cost_duration.as_secs_f64()
        );
        let with = self.on_cosmos("cosmos-cost", schedule, true).await?;
        eprintln!("cosmos cost: the same with no callback URL");
        let without = self.on_cosmos("cosmos-cost-quiet", schedule, false).await?;
        eprintln!("cosmos cost: the same, with callbacks, on the embedded store");
        let (on_embedded, embedded_cpu_us, embedded_failed, _) = self
            .posted_and_settled("cosmos-cost-embedded", schedule, Vec::new(), true)
            .await?;
        Ok(CosmosCost {
            rate: plan.cost_rate,
            seconds: plan.cost_duration.as_secs_f64(),
            failed: with.failed + without.failed + embedded_failed,
            with_callbacks: with,
            without_callbacks: without,
            on_embedded,
            embedded_cpu_us,
        })
    }

    /// Posts `schedule` to a system with status on an emulator of its own,
    /// each request asking for a callback when `calling_back`.
    async fn on_cosmos(
        &self,
        phase: &str,
        schedule: Schedule,
        calling_back: bool,
    ) -> anyhow::Result<Mix> {
        let cosmos = Server::start(&["cosmos"]).await;
        let mut keys = cosmos_keys(&cosmos.address);
        keys.extend(change_feed_timings());
        let emulator_before = CpuTime::of(cosmos.pid())?;
        let (posted, cpu_us, failed, store) = self
            .posted_and_settled(phase, schedule, keys, calling_back)
            .await?;
        let emulator_s = CpuTime::of(cosmos.pid())?.since(emulator_before).own_s;
        cosmos.stop().await;
        let store = store.context("status was not on Cosmos DB")?;
        let units = store.request_units();
        let (writes, write_units) = units.spent_doing(Spend::StatusWrites, Operation::Write);
        Ok(Mix {
            units: spent_by_work(units),
            status_writes: writes,
            one_write_ru: write_units / writes.max(1) as f64,
            cpu_us,
            emulator_cpu_us: emulator_s * 1e6 / posted.status("202").max(1) as f64,
            failed,
            posted,
        })
    }

    /// Posts `schedule` (named; a callback each when `calling_back`) to a
    /// system with `keys`, drains it, waits for every callback and for its
    /// request units to settle; what the poster got, this process's CPU a
    /// workflow over all of it, the workflows Failed, and the Cosmos DB
    /// store's request units.
    async fn posted_and_settled(
        &self,
        phase: &str,
        schedule: Schedule,
        mut keys: Vec<(&'static str, String)>,
        calling_back: bool,
    ) -> anyhow::Result<(Posted, f64, u64, Option<Arc<CosmosStore>>)> {
        keys.push(("callbacks.allow", "[\"127.0.0.0/8\"]".to_owned()));
        keys.push(("callbacks.secrets", format!("[\"{CALLBACK_SECRET}\"]")));
        let settings = self.settings(phase, &keys)?;
        let (system, services) = self.system(phase, 0, &keys).await?;
        Self::await_partitions(phase, &system, settings.stream.partitions).await?;
        let receiver = if calling_back {
            Some(callbacks::Receiver::start().await?)
        } else {
            None
        };
        let before = CpuTime::this()?;
        let posted = poster::post_calling_back(
            &system.url,
            schedule,
            OPEN_LOOP_CONNECTIONS,
            Naming::Keyed,
            receiver.as_ref().map(|r| r.url.as_str()),
        )
        .await?;
        let accepted = posted.status("202");
        self.drain(&system, accepted).await?;
        if let Some(receiver) = receiver {
            Self::called_back(receiver, accepted).await?;
        }
        let cosmos = match &system.app.backends.store {
            Store::Cosmos(cosmos) => Some(Arc::clone(cosmos)),
            Store::Embedded(_) => None,
        };
        if let Some(cosmos) = &cosmos {
            settle(cosmos.request_units()).await?;
        }
        let cpu_us = CpuTime::this()?.since(before).own_s * 1e6 / accepted.max(1) as f64;
        let failed = system.failed();
        Self::stop(system, services).await?;
        Ok((posted, cpu_us, failed, cosmos))
    }
}

/// What each delivery spends on, as opposed to what costs the same every
/// second however many there are (change-feed polls, lease renewals,
/// throughput control).
const PER_DELIVERY: [Spend; 5] = [
    Spend::StatusWrites,
    Spend::StatusReads,
    Spend::Reservations,
    Spend::DeadLetters,
    Spend::Listing,
];

/// Waits until the request units spent [`PER_DELIVERY`] have not moved for
/// [`SETTLED`]: the callbacks' outcomes written.
async fn settle(units: &RequestUnits) -> anyhow::Result<()> {
    let total = || -> f64 { PER_DELIVERY.iter().map(|&s| units.spent_on(s).1).sum() };
    let started = Instant::now();
    let (mut last, mut since) = (total(), Instant::now());
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = total();
        if (now - last).abs() > f64::EPSILON {
            (last, since) = (now, Instant::now());
        } else if since.elapsed() >= SETTLED {
            return Ok(());
        }
        anyhow::ensure!(
            started.elapsed() < SETTLE_AT_MOST,
            "cosmos cost: the request units of deliveries still growing after {} s",
            SETTLE_AT_MOST.as_secs()
        );
    }
}

impl CosmosCost {
    pub(crate) fn verdicts(&self) -> Vec<Verdict> {
        let with = &self.with_callbacks;
        vec![
            Verdict {
                what: format!(
                    "cosmos cost: {}/s for {:.0} s on Cosmos DB (the emulator), named, a callback each, \
                     listing on the status container",
                    self.rate, self.seconds
                ),
                measured: format!(
                    "{} of {} → 202; {}; not 202: {}; {} Failed",
                    with.posted.status("202"),
                    with.posted.requests,
                    latency(with.posted.latency.as_ref()),
                    describe(&with.posted.other_than("202")),
                    self.failed
                ),
                target: "(the mix issue 51 measures)",
                met: None,
            },
            with.units_verdict(
                "a callback each",
                2.0,
                "≤ 2 × one write of a status document (issue 51)",
            ),
            self.without_callbacks.units_verdict(
                "no callback URL",
                1.25,
                "≤ 1.25 × one write of a status document (issue 51)",
            ),
            Verdict {
                what: "cosmos cost: Skyport's CPU a workflow, Cosmos DB against the embedded store at the same rate".into(),
                measured: format!(
                    "{:.0} against {:.0} µs: {:.2} × (the emulator's own {:.0} µs apart); the embedded run {} of {} → 202",
                    with.cpu_us,
                    self.embedded_cpu_us,
                    with.cpu_us / self.embedded_cpu_us.max(f64::MIN_POSITIVE),
                    with.emulator_cpu_us,
                    self.on_embedded.status("202"),
                    self.on_embedded.requests
                ),
                target: "≤ 1.5 × (issue 51)",
                met: Some(with.cpu_us <= 1.5 * self.embedded_cpu_us),
            },
        ]
    }

    /// What fails the run: a delivery Failed; in a smoke run, nothing accepted.
    pub(crate) fn failures(&self, full: bool) -> Vec<String> {
        let mut failures = Vec::new();
        if self.failed > 0 {
            failures.push(format!("cosmos cost: {} deliveries Failed", self.failed));
        }
        if !full
            && [
                &self.with_callbacks.posted,
                &self.without_callbacks.posted,
                &self.on_embedded,
            ]
            .iter()
            .any(|posted| posted.status("202") == 0)
        {
            failures.push("cosmos cost: nothing accepted".into());
        }
        failures
    }
}
