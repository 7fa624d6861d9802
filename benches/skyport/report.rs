//! What a run measured: the JSON written to `BENCHMARKS.json` ([`Results`],
//! a field per phase, each phase's result from its file in
//! [`phases`](crate::phases)), the table printed for `BENCHMARKS.md`, the
//! verdict on each target (the phases' own, in the table's order), and the
//! charts written beside the JSON.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::charts::{self, Outcome, Provenance};
use crate::phases::Verdict;
use crate::phases::all_in_one::WholeSystem;
use crate::phases::batch::Batches;
use crate::phases::burst::{self, Burst};
use crate::phases::cosmos_cost::CosmosCost;
use crate::phases::end_to_end::{self, EndToEnd};
use crate::phases::fairness::{Expedited, NoisyNeighbour};
use crate::phases::fixed_rate::{self, FixedRate};
use crate::phases::fleet::{self, FleetPhase};
use crate::phases::held::HeldReads;
use crate::phases::ingest::{self, Ingest};
use crate::phases::kafka::KafkaRun;
use crate::phases::named::Named;
use crate::phases::post_wait::PostWait;
use crate::phases::quotas::QuotaCost;
use crate::phases::rate_limit::RateLimited;
use crate::phases::scale::Scale;
use crate::phases::status_writes::StatusWrites;
use crate::phases::store::Store;
use crate::phases::time_to_terminal::TimeToTerminal;
use crate::phases::timers::TimersRun;

/// Read back to redraw the charts (`-- charts`): a phase a run did not have
/// is empty or null.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Results {
    pub(crate) plan: String,
    pub(crate) machine: Machine,
    #[serde(default)]
    pub(crate) ingest: Vec<Ingest>,
    #[serde(default)]
    pub(crate) store: Vec<Store>,
    #[serde(default)]
    pub(crate) status_writes: Vec<StatusWrites>,
    pub(crate) named: Option<Named>,
    pub(crate) fixed_rate: Option<FixedRate>,
    pub(crate) burst: Option<Burst>,
    pub(crate) end_to_end: Option<EndToEnd>,
    pub(crate) rate_limited: Option<RateLimited>,
    pub(crate) all_in_one: Option<WholeSystem>,
    #[serde(default)]
    pub(crate) time_to_terminal: Vec<TimeToTerminal>,
    #[serde(default)]
    pub(crate) held_reads: Option<HeldReads>,
    #[serde(default)]
    pub(crate) post_wait: Option<PostWait>,
    #[serde(default)]
    pub(crate) batch: Option<Batches>,
    #[serde(default)]
    pub(crate) timers: Option<TimersRun>,
    #[serde(default)]
    pub(crate) timers_cosmos: Option<TimersRun>,
    #[serde(default)]
    pub(crate) quotas: Option<QuotaCost>,
    #[serde(default)]
    pub(crate) expedited: Option<Expedited>,
    #[serde(default)]
    pub(crate) noisy_neighbour: Option<NoisyNeighbour>,
    pub(crate) kafka: Option<KafkaRun>,
    #[serde(default)]
    pub(crate) fleet_kafka: Option<FleetPhase>,
    #[serde(default)]
    pub(crate) fleet_eventhubs: Option<FleetPhase>,
    #[serde(default)]
    pub(crate) scale: Option<Scale>,
    #[serde(default)]
    pub(crate) cosmos_cost: Option<CosmosCost>,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Machine {
    pub(crate) date: String,
    pub(crate) commit: String,
    pub(crate) cores: usize,
    pub(crate) memory_gib: f64,
    pub(crate) cpu: String,
    pub(crate) kernel: String,
    pub(crate) load_generator: String,
}

impl Results {
    pub(crate) fn new(plan: &str, load_generator: &str) -> Self {
        Self {
            plan: plan.to_owned(),
            machine: Machine::read(load_generator),
            ingest: Vec::new(),
            store: Vec::new(),
            status_writes: Vec::new(),
            named: None,
            fixed_rate: None,
            burst: None,
            end_to_end: None,
            rate_limited: None,
            all_in_one: None,
            time_to_terminal: Vec::new(),
            held_reads: None,
            post_wait: None,
            batch: None,
            timers: None,
            timers_cosmos: None,
            quotas: None,
            expedited: None,
            noisy_neighbour: None,
            kafka: None,
            fleet_kafka: None,
            fleet_eventhubs: None,
            scale: None,
            cosmos_cost: None,
        }
    }

    /// Each phase's verdicts, in the order of the table, and the peak RSS
    /// of those that measure it.
    fn verdicts(&self) -> Vec<Verdict> {
        let mut verdicts: Vec<Verdict> = self.ingest.iter().flat_map(Ingest::verdicts).collect();
        verdicts.extend(self.store.iter().flat_map(Store::verdicts));
        verdicts.extend(self.status_writes.iter().flat_map(StatusWrites::verdicts));
        verdicts.extend(self.named.iter().flat_map(Named::verdicts));
        verdicts.extend(self.fixed_rate.iter().flat_map(FixedRate::verdicts));
        verdicts.extend(self.burst.iter().flat_map(Burst::verdicts));
        verdicts.extend(self.end_to_end.iter().flat_map(EndToEnd::verdicts));
        verdicts.extend(
            self.time_to_terminal
                .iter()
                .flat_map(TimeToTerminal::verdicts),
        );
        verdicts.extend(self.rate_limited.iter().flat_map(RateLimited::verdicts));
        verdicts.extend(self.all_in_one.iter().flat_map(WholeSystem::verdicts));
        verdicts.extend(self.kafka.iter().flat_map(KafkaRun::verdicts));
        verdicts.extend(self.peak_rss());
        verdicts.extend(self.held_reads.iter().flat_map(HeldReads::verdicts));
        verdicts.extend(self.post_wait.iter().flat_map(PostWait::verdicts));
        verdicts.extend(self.batch.iter().flat_map(Batches::verdicts));
        verdicts.extend(
            self.timers
                .iter()
                .chain(&self.timers_cosmos)
                .flat_map(TimersRun::verdicts),
        );
        verdicts.extend(self.quotas.iter().flat_map(QuotaCost::verdicts));
        verdicts.extend(self.expedited.iter().flat_map(Expedited::verdicts));
        verdicts.extend(
            self.noisy_neighbour
                .iter()
                .flat_map(NoisyNeighbour::verdicts),
        );
        for f in [&self.fleet_kafka, &self.fleet_eventhubs]
            .into_iter()
            .flatten()
        {
            verdicts.extend(f.verdicts());
        }
        verdicts.extend(self.scale.iter().flat_map(Scale::verdicts));
        verdicts.extend(self.cosmos_cost.iter().flat_map(CosmosCost::verdicts));
        verdicts
    }

    /// Skyport's peak RSS in the phases that measure it, against the target.
    fn peak_rss(&self) -> Option<Verdict> {
        let peaks: Vec<(String, f64)> = self
            .ingest
            .iter()
            .map(|i| (format!("ingest at {}", i.connections), i.peak_rss_mib))
            .chain(
                self.end_to_end
                    .iter()
                    .map(|e| ("end to end".into(), e.peak_rss_mib)),
            )
            .chain(
                self.all_in_one
                    .iter()
                    .map(|a| ("all in one (services included)".into(), a.peak_rss_mib)),
            )
            .collect();
        if peaks.is_empty() {
            return None;
        }
        let worst = peaks.iter().map(|p| p.1).fold(0.0, f64::max);
        Some(Verdict {
            what: "peak RSS".into(),
            measured: peaks
                .iter()
                .map(|(what, mib)| format!("{what}: {mib:.0} MiB"))
                .collect::<Vec<_>>()
                .join(", "),
            target: "≤ 256 MB",
            met: Some(worst * 1024.0 * 1024.0 <= 256e6),
        })
    }

    /// A Markdown table of the run, for `BENCHMARKS.md`.
    pub(crate) fn table(&self) -> String {
        let m = &self.machine;
        let mut out = format!(
            "{} run, {} (commit {}): {} cores, {:.0} GiB, {}, Linux {}; load from {}\n\n\
             | what | measured | target | met |\n|---|---|---|---|\n",
            self.plan, m.date, m.commit, m.cores, m.memory_gib, m.cpu, m.kernel, m.load_generator
        );
        for v in self.verdicts() {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} |",
                v.what,
                v.measured,
                v.target,
                match (self.plan.as_str(), v.met) {
                    (_, None) => "",
                    ("smoke", _) => "(smoke run: not judged)",
                    (_, Some(true)) => "yes",
                    (_, Some(false)) => "**no**",
                }
            );
        }
        out
    }

    /// What makes the run fail: anything accepted and lost, or a valid request
    /// that ended Failed, always; in a
    /// smoke run also a phase that measured nothing. Missed speed targets
    /// are reported in the table, not failed on.
    pub(crate) fn failures(&self, full: bool) -> Vec<String> {
        let mut failures: Vec<String> = self
            .ingest
            .iter()
            .flat_map(|row| row.failures(full))
            .collect();
        failures.extend(self.burst.iter().flat_map(|b| b.failures(full)));
        failures.extend(self.end_to_end.iter().flat_map(|e| e.failures(full)));
        failures.extend(self.fixed_rate.iter().flat_map(|f| f.failures(full)));
        failures.extend(self.rate_limited.iter().flat_map(|r| r.failures(full)));
        failures.extend(self.time_to_terminal.iter().flat_map(|t| t.failures(full)));
        failures.extend(self.held_reads.iter().flat_map(|h| h.failures(full)));
        failures.extend(self.post_wait.iter().flat_map(|p| p.failures(full)));
        failures.extend(self.batch.iter().flat_map(|b| b.failures(full)));
        failures.extend(
            self.timers
                .iter()
                .chain(&self.timers_cosmos)
                .flat_map(|t| t.failures(full)),
        );
        failures.extend(self.quotas.iter().flat_map(|q| q.failures(full)));
        failures.extend(self.expedited.iter().flat_map(Expedited::failures));
        failures.extend(
            self.noisy_neighbour
                .iter()
                .flat_map(NoisyNeighbour::failures),
        );
        failures.extend(self.kafka.iter().flat_map(|k| k.failures(full)));
        for f in [&self.fleet_kafka, &self.fleet_eventhubs]
            .into_iter()
            .flatten()
        {
            failures.extend(f.failures(full));
        }
        failures.extend(self.all_in_one.iter().flat_map(|a| a.failures(full)));
        failures.extend(self.scale.iter().flat_map(|s| s.failures(full)));
        failures.extend(self.cosmos_cost.iter().flat_map(|c| c.failures(full)));
        failures
    }

    /// The run, as its charts name it.
    fn provenance(&self) -> Provenance<'_> {
        let m = &self.machine;
        Provenance {
            plan: &self.plan,
            date: &m.date,
            commit: &m.commit,
            cores: m.cores,
            cpu: &m.cpu,
        }
    }
}

/// Draws every chart of `results` into `dir`, saying what became of each; a
/// chart that cannot be drawn from them is removed, so that every chart in
/// `dir` shows the JSON beside it. Returns why each chart whose phases ran
/// was not drawn (what a fresh run fails on; a redraw from an older JSON
/// expects some).
pub(crate) fn write_charts(results: &Results, dir: &Path) -> anyhow::Result<Vec<String>> {
    type Draw = fn(&Results, &Provenance<'_>, &Path) -> anyhow::Result<Outcome>;
    let charts: [(&str, Draw); 5] = [
        ("ingest.svg", |r, p, path| {
            ingest::chart(&r.ingest, r.all_in_one.as_ref(), p, path)
        }),
        ("latency.svg", |r, p, path| {
            fixed_rate::chart(r.fixed_rate.as_ref(), r.all_in_one.as_ref(), p, path)
        }),
        ("burst.svg", |r, p, path| {
            burst::chart(r.burst.as_ref(), p, path)
        }),
        ("workflows.svg", |r, p, path| {
            end_to_end::chart(
                r.end_to_end.as_ref(),
                r.all_in_one.as_ref(),
                r.kafka.as_ref().map(|k| &k.end_to_end),
                p,
                path,
            )
        }),
        ("fleet.svg", |r, p, path| {
            fleet::chart(r.fleet_kafka.as_ref(), r.fleet_eventhubs.as_ref(), p, path)
        }),
    ];
    let provenance = results.provenance();
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut lacking = Vec::new();
    for (file, draw) in charts {
        let path = dir.join(file);
        let why =
            match draw(results, &provenance, &path).with_context(|| format!("drawing {file}"))? {
                Outcome::Drawn(texts) => {
                    charts::check(&path, &texts)?;
                    println!("Chart written to {}", path.display());
                    continue;
                }
                Outcome::NotRun(phases) => format!("the run has no {phases} phase"),
                Outcome::Lacking(what) => {
                    lacking.push(format!("{file}: {what}"));
                    what.to_owned()
                }
            };
        let removed = std::fs::remove_file(&path).is_ok();
        println!(
            "No {file}: {why}{}",
            if removed {
                " (the old one removed)"
            } else {
                ""
            }
        );
    }
    Ok(lacking)
}

impl Machine {
    fn read(load_generator: &str) -> Self {
        let read = |path: &str| std::fs::read_to_string(path).unwrap_or_default();
        let field = |text: &str, key: &str| {
            text.lines()
                .find(|line| line.starts_with(key))
                .and_then(|line| line.split(':').nth(1))
                .map(|v| v.trim().to_owned())
                .unwrap_or_default()
        };
        let memory_kib: f64 = field(&read("/proc/meminfo"), "MemTotal")
            .trim_end_matches("kB")
            .trim()
            .parse()
            .unwrap_or(0.0);
        let git = |args: &[&str]| {
            std::process::Command::new("git")
                .args(args)
                .current_dir(env!("CARGO_MANIFEST_DIR"))
                .output()
                .ok()
                .filter(|out| out.status.success())
                .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_owned())
        };
        let dirty =
            git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
        let commit = git(&["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "unknown".into());
        Self {
            date: OffsetDateTime::now_utc()
                .format(&Rfc3339)
                .unwrap_or_default(),
            commit: if dirty {
                format!("{commit}-dirty")
            } else {
                commit
            },
            cores: std::thread::available_parallelism().map_or(0, usize::from),
            memory_gib: memory_kib / 1024.0 / 1024.0,
            cpu: field(&read("/proc/cpuinfo"), "model name"),
            kernel: read("/proc/sys/kernel/osrelease").trim().to_owned(),
            load_generator: load_generator.to_owned(),
        }
    }
}
