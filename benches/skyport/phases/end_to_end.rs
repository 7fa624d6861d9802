//! (5), (6) The end-to-end phase: workflows Scheduled per second, requests
//! posted through the gateway, the simulated services in a process of their
//! own at 20 ms per call, rate limiter off; Skyport's CPU time per workflow,
//! the services' and the poster's beside it. The Kafka and fleet phases run
//! it on their streams. And the workflows chart, the all-in-one's rounds and
//! Kafka's run beside it.

use std::path::Path;
use std::time::{Duration, Instant};

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use serde::{Deserialize, Serialize};
use skyport::Store;
use skyport::plan::thousands;
use skyport_runtime::config::StreamBackend;

use crate::bench::{Bench, KAFKA_PARTITIONS};
use crate::charts::{
    Area, BLUE, Mark, ORANGE, Outcome, Provenance, TARGET, frame, linear, text, texts,
};
use crate::cpu::CpuTime;
use crate::memory;
use crate::phases::Verdict;
use crate::phases::all_in_one::WholeSystem;
use crate::phases::cosmos_cost::{Spent, spent_by_work};
use crate::poster::{self, Naming, Schedule};

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct EndToEnd {
    pub(crate) requests: u64,
    pub(crate) accepted: u64,
    /// Deliveries that reached a terminal state.
    pub(crate) completed: u64,
    /// Of them, Failed (every request is valid: must be 0).
    pub(crate) failed: u64,
    /// From the first request until the last workflow completed.
    pub(crate) seconds: f64,
    pub(crate) posting_s: f64,
    pub(crate) workflows_per_s: f64,
    /// The most workflows completed in one second.
    pub(crate) best_second: u64,
    /// Skyport's CPU time (this process: gateway and worker) per completed workflow.
    pub(crate) cpu_us_per_workflow: f64,
    pub(crate) cpu: CpuSplit,
    pub(crate) peak_rss_mib: f64,
    /// The embedded database's commits over the run, when status is kept there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) database: Option<DatabaseCommits>,
    /// Request units by kind over the run, when status is kept on Cosmos DB.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) request_units: Vec<Spent>,
}

/// How the embedded database's group commit grouped a run's writes (status
/// documents, and the Event Hubs processor's leases when it runs on them):
/// each commit's cost is mostly fixed, so fewer writes a commit cost more a
/// workflow.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct DatabaseCommits {
    pub(crate) commits_per_workflow: f64,
    pub(crate) writes_per_commit: f64,
}

/// CPU time over a phase, by process: what shares the two cores.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct CpuSplit {
    pub(crate) seconds: f64,
    /// This process: the gateway and the worker.
    pub(crate) skyport_s: f64,
    /// The simulated services' process.
    pub(crate) services_s: f64,
    /// The poster's process (the only child waited for in the phase).
    pub(crate) poster_s: f64,
}

impl CpuSplit {
    /// What was used since `before` (this process's reading and that of the
    /// services, `services_pid`), over `elapsed`.
    pub(crate) fn between(
        before: (CpuTime, CpuTime),
        services_pid: u32,
        elapsed: std::time::Duration,
    ) -> anyhow::Result<Self> {
        let this = CpuTime::this()?.since(before.0);
        let services = CpuTime::of(services_pid)?.since(before.1);
        Ok(Self {
            seconds: elapsed.as_secs_f64(),
            skyport_s: this.own_s,
            services_s: services.own_s,
            poster_s: this.children_s,
        })
    }

    /// Cores used on average by each process, for the table.
    fn cores(&self) -> String {
        let per = |s: f64| s / self.seconds.max(f64::EPSILON);
        format!(
            "cores: Skyport {:.2}, services {:.2}, poster {:.2}",
            per(self.skyport_s),
            per(self.services_s),
            per(self.poster_s)
        )
    }
}

impl Bench {
    /// (5) and (6): workflows completed per second, requests posted through the gateway.
    pub(crate) async fn end_to_end(&self) -> anyhow::Result<EndToEnd> {
        self.end_to_end_on("end-to-end", &[]).await
    }

    /// End to end with the settings `extra` adds (another stream).
    pub(crate) async fn end_to_end_on(
        &self,
        phase: &str,
        extra: &[(&str, String)],
    ) -> anyhow::Result<EndToEnd> {
        self.end_to_end_of(phase, extra, self.plan.end_to_end, None)
            .await
    }

    /// End to end on the settings `extra` adds, with `requests` requests:
    /// posted closed loop, or open loop at `paced` requests a second.
    pub(crate) async fn end_to_end_of(
        &self,
        phase: &str,
        extra: &[(&str, String)],
        requests: u64,
        paced: Option<u32>,
    ) -> anyhow::Result<EndToEnd> {
        let plan = &self.plan;
        eprintln!("{phase}: {requests} requests, 5 services at 20 ms per call, rate limiter off");
        memory::reset_peak()?;
        let partitions = {
            let settings = self.settings(phase, extra)?;
            match settings.stream_backend() {
                StreamBackend::Kafka => KAFKA_PARTITIONS,
                _ => settings.stream.partitions,
            }
        };
        let (system, services) = self.system(phase, 0, extra).await?;
        Self::await_partitions(phase, &system, partitions).await?;
        let started = Instant::now();
        let cpu_before = (CpuTime::this()?, CpuTime::of(services.pid())?);
        let database_before = system.database_commits();
        let schedule = paced.map_or(Schedule::Requests(requests), |per_s| {
            Schedule::paced(requests, per_s)
        });
        let post = poster::post(&system.url, schedule, 64, Naming::Unnamed, 0);
        let sample = async {
            let mut samples = vec![0];
            let deadline = started + plan.drain_timeout;
            while samples.last().copied() < Some(requests) && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(100)).await;
                samples.push(system.terminal());
            }
            samples
        };
        let (posted, samples) = tokio::join!(post, sample);
        let posted = posted?;
        let elapsed = started.elapsed();
        let cpu = CpuSplit::between(cpu_before, services.pid(), elapsed)?;
        let completed = system.terminal();
        let failed = system.failed();
        let database = system.database_commits().zip(database_before).map(
            |((commits, writes), (commits_before, writes_before))| {
                let commits = commits - commits_before;
                DatabaseCommits {
                    commits_per_workflow: commits as f64 / completed.max(1) as f64,
                    writes_per_commit: (writes - writes_before) as f64 / commits.max(1) as f64,
                }
            },
        );
        let peak_rss_mib = memory::peak_mib()?;
        let request_units = match &system.app.backends.store {
            Store::Cosmos(cosmos) => spent_by_work(cosmos.request_units()),
            Store::Embedded(_) => Vec::new(),
        };
        Self::stop(system, services).await?;
        let best_second = samples
            .windows(11)
            .map(|w| w[10] - w[0])
            .max()
            .unwrap_or(completed);
        Ok(EndToEnd {
            requests,
            accepted: posted.status("202"),
            completed,
            failed,
            seconds: elapsed.as_secs_f64(),
            posting_s: posted.seconds,
            workflows_per_s: (completed - failed) as f64 / elapsed.as_secs_f64(),
            best_second,
            cpu_us_per_workflow: cpu.skyport_s * 1e6 / completed.max(1) as f64,
            cpu,
            peak_rss_mib,
            database,
            request_units,
        })
    }
}

impl EndToEnd {
    /// Workflows per second, and Skyport's CPU each, against their targets.
    pub(crate) fn verdicts(&self) -> Vec<Verdict> {
        vec![
            Verdict {
                what: "end to end, 5 services at 20 ms, limiter off".into(),
                measured: format!(
                    "{:.0} workflows/s Scheduled ({} in {:.1} s, {} Failed; best second {})",
                    self.workflows_per_s,
                    self.completed - self.failed,
                    self.seconds,
                    self.failed,
                    self.best_second
                ),
                target: "≥ 5,000 workflows/s",
                met: Some(self.workflows_per_s >= 5_000.0),
            },
            Verdict {
                what: "end to end: Skyport's CPU per workflow".into(),
                measured: format!(
                    "{:.0} µs ({:.1} s of CPU over {} workflows; {})",
                    self.cpu_us_per_workflow,
                    self.cpu.skyport_s,
                    self.completed,
                    self.cpu.cores()
                ),
                target: "≤ 300 µs",
                met: Some(self.cpu_us_per_workflow <= 300.0),
            },
        ]
    }

    /// What fails the run: an accepted request not completed, or one Failed;
    /// in a smoke run, nothing completed.
    pub(crate) fn failures(&self, full: bool) -> Vec<String> {
        let mut failures = Vec::new();
        if self.completed < self.accepted || self.failed > 0 || (!full && self.completed == 0) {
            failures.push(format!(
                "end to end: {} of {} accepted completed, {} Failed",
                self.completed, self.accepted, self.failed
            ));
        }
        failures
    }
}

/// One bar of the workflows chart.
struct Run {
    label: String,
    workflows_per_s: f64,
    cpu_us: f64,
    best_second: Option<u64>,
    /// The all-in-one process: its CPU includes the simulated services'.
    all_in_one: bool,
}

/// The end-to-end phase's targets, from the verdicts.
const WORKFLOWS_TARGET: f64 = 5_000.0;
const CPU_TARGET_US: f64 = 300.0;

/// (4): workflows per second and CPU per workflow, end to end and in each
/// all-in-one round (and end to end on Kafka, `kafka_end_to_end`).
pub(crate) fn chart(
    end_to_end_phase: Option<&EndToEnd>,
    all_in_one: Option<&WholeSystem>,
    kafka_end_to_end: Option<&EndToEnd>,
    provenance: &Provenance<'_>,
    path: &Path,
) -> anyhow::Result<Outcome> {
    let end_to_end = |label: &str, e: &EndToEnd| Run {
        label: label.to_owned(),
        workflows_per_s: e.workflows_per_s,
        cpu_us: e.cpu_us_per_workflow,
        best_second: Some(e.best_second),
        all_in_one: false,
    };
    let mut runs: Vec<Run> = end_to_end_phase
        .iter()
        .map(|e| end_to_end("end to end", e))
        .collect();
    if let Some(a) = all_in_one {
        runs.extend(a.work.iter().enumerate().map(|(i, round)| Run {
            label: format!("all in one, round {}", i + 1),
            workflows_per_s: round.workflows_per_s,
            cpu_us: round.cpu_us_per_workflow,
            best_second: None,
            all_in_one: true,
        }));
    }
    if let Some(k) = kafka_end_to_end {
        runs.push(end_to_end("end to end on Kafka", k));
    }
    if runs.is_empty() {
        return Ok(Outcome::NotRun("end-to-end, all-in-one or kafka"));
    }
    let title = "Workflows: how many per second, and the CPU each costs";
    let legend = [
        (
            "services in their own process; CPU: Skyport's process".to_owned(),
            Mark::Bar(BLUE),
        ),
        (
            "all in one, each round to terminal; CPU: the process, services included".to_owned(),
            Mark::Bar(ORANGE),
        ),
        ("best second".to_owned(), Mark::Cross),
        ("target (end to end)".to_owned(), Mark::Dashed(TARGET)),
    ];
    let (root, body) = frame(path, 420, provenance, title, &legend)?;
    let (left, right) = body.split_horizontally(470);
    workflow_panel(
        &left,
        &runs,
        &Panel {
            desc: "workflows per second (to a terminal state)",
            value: |r| r.workflows_per_s,
            unit: "/s",
            target: WORKFLOWS_TARGET,
            names: 150,
        },
    )?;
    workflow_panel(
        &right,
        &runs,
        &Panel {
            desc: "CPU per workflow (µs)",
            value: |r| r.cpu_us,
            unit: " µs",
            target: CPU_TARGET_US,
            names: 0,
        },
    )?;
    root.present()?;
    let mut texts = texts(title, &legend);
    texts.extend(runs.into_iter().map(|r| r.label));
    Ok(Outcome::Drawn(texts))
}

/// One panel of the workflows chart: a horizontal bar per run.
struct Panel {
    desc: &'static str,
    value: fn(&Run) -> f64,
    unit: &'static str,
    target: f64,
    /// The room for the runs' names on the left; 0 leaves them out, and the
    /// best seconds with them.
    names: u32,
}

fn workflow_panel(area: &Area<'_>, runs: &[Run], panel: &Panel) -> anyhow::Result<()> {
    let n = runs.len();
    let best = |r: &Run| r.best_second.filter(|_| panel.names > 0);
    let right = runs
        .iter()
        .map(|r| (panel.value)(r).max(best(r).map_or(0.0, |b| b as f64)))
        .fold(panel.target, f64::max)
        * 1.15;
    // The first run at the top.
    let row = |i: usize| (n - 1 - i) as f64;
    let mut chart = ChartBuilder::on(area)
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(panel.names)
        .build_cartesian_2d(
            0.0..right,
            linear(0.0..n as f64, (0..n).map(|i| row(i) + 0.5)),
        )?;
    let name = |y: &f64| {
        runs.get(n - 1 - (y.floor() as usize).min(n - 1))
            .map_or_else(String::new, |r| r.label.clone())
    };
    let value = |x: &f64| thousands(*x);
    chart
        .configure_mesh()
        .disable_y_mesh()
        .x_labels(5)
        .max_light_lines(2)
        .x_label_formatter(&value)
        .y_label_formatter(&name)
        .x_desc(panel.desc)
        .label_style(text(12))
        .axis_desc_style(text(13))
        .draw()?;
    chart.draw_series(runs.iter().enumerate().map(|(i, r)| {
        let color = if r.all_in_one { ORANGE } else { BLUE };
        Rectangle::new(
            [(0.0, row(i) + 0.2), ((panel.value)(r), row(i) + 0.8)],
            color.filled(),
        )
    }))?;
    // Inside the bar where it fits, clear of the best second's mark.
    chart.draw_series(runs.iter().enumerate().map(|(i, r)| {
        let v = (panel.value)(r);
        let (dx, style) = if v > right / 4.0 {
            (
                -5,
                text(12)
                    .color(&WHITE)
                    .pos(Pos::new(HPos::Right, VPos::Center)),
            )
        } else {
            (5, text(12).pos(Pos::new(HPos::Left, VPos::Center)))
        };
        EmptyElement::at((v, row(i) + 0.5))
            + Text::new(format!("{}{}", thousands(v), panel.unit), (dx, 0), style)
    }))?;
    chart.draw_series(runs.iter().enumerate().filter_map(|(i, r)| {
        Some(Cross::new(
            (best(r)? as f64, row(i) + 0.5),
            5,
            BLACK.stroke_width(2),
        ))
    }))?;
    chart.draw_series(DashedLineSeries::new(
        [(panel.target, 0.0), (panel.target, n as f64)],
        6,
        4,
        TARGET.stroke_width(2),
    ))?;
    Ok(())
}
