//! (4) The burst phase: a large number of requests as fast as the client
//! sends them to the whole system, the worker limited to the rate the
//! backends sustain, then every accepted one followed to a terminal state;
//! and its chart, from the counts it samples meanwhile.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use plotters::prelude::*;
use serde::{Deserialize, Serialize};
use skyport::plan::thousands;

use crate::bench::Bench;
use crate::charts::{
    BLUE, GREEN, GREY, Mark, ORANGE, Outcome, Provenance, TARGET, frame, text, texts,
};
use crate::memory;
use crate::phases::{Verdict, describe};
use crate::poster::{self, Naming, Posted, Schedule};
use crate::servers::AllInOne;

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Burst {
    pub(crate) requests: u64,
    pub(crate) connections: u32,
    /// The worker's rate limit while the burst drains.
    pub(crate) drain_rate: u32,
    pub(crate) accepted: u64,
    /// Requests not answered 202, by what they got.
    pub(crate) not_accepted: BTreeMap<String, u64>,
    /// Events in the stream at the end.
    pub(crate) published: u64,
    /// Deliveries that reached a terminal state.
    pub(crate) terminal: u64,
    /// Of them, Failed (every request is valid: must be 0).
    pub(crate) failed: u64,
    /// Durable requests that did not reach a terminal state: must be 0.
    pub(crate) lost: u64,
    /// How long sending took.
    pub(crate) send_s: f64,
    /// From the last answer until every durable request was terminal.
    pub(crate) drain_s: f64,
    pub(crate) measured: Posted,
    pub(crate) peak_rss_mib: f64,
    /// Every half second from the first request until the drain ended
    /// (absent from runs before it was kept): the burst chart.
    #[serde(default)]
    pub(crate) timeline: Vec<BurstSample>,
}

/// The burst's counts at one moment.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct BurstSample {
    /// Since the first request.
    pub(crate) seconds: f64,
    /// Events in the stream: the requests accepted so far.
    pub(crate) published: u64,
    /// Deliveries that reached a terminal state so far.
    pub(crate) terminal: u64,
}

impl Bench {
    /// (4): the burst on the whole system, the worker limited to the rate the
    /// backends sustain (the stream levels the load), then every accepted
    /// request followed to the end.
    pub(crate) async fn burst(&self) -> anyhow::Result<Burst> {
        let plan = &self.plan;
        eprintln!(
            "burst: {} requests at {} connections, then the drain at {}/s",
            plan.burst, plan.burst_connections, plan.burst_drain_rate
        );
        memory::reset_peak()?;
        let (system, services) = self.system("burst", plan.burst_drain_rate, &[]).await?;
        let started = Instant::now();
        let mut timeline = Timeline::new(started, &system);
        let measured = {
            let mut posting = std::pin::pin!(poster::post(
                &system.url,
                Schedule::Requests(plan.burst),
                plan.burst_connections,
                Naming::Unnamed,
                0,
            ));
            loop {
                tokio::select! {
                    posted = &mut posting => break posted?,
                    () = tokio::time::sleep(Duration::from_millis(50)) => timeline.sample(&system),
                }
            }
        };
        let sent = started.elapsed();
        let accepted = measured.status("202");
        // Every event the stream holds (a request whose answer was lost on the
        // way still counts) must reach a terminal state.
        let durable = system.published().max(accepted);
        let deadline = started + sent + plan.drain_timeout;
        while system.terminal() < durable && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
            timeline.sample(&system);
        }
        let drained = started.elapsed();
        timeline.take(&system);
        let terminal = system.terminal();
        let failed = system.failed();
        let peak_rss_mib = memory::peak_mib()?;
        let published = system.published();
        Self::stop(system, services).await?;
        Ok(Burst {
            requests: plan.burst,
            connections: plan.burst_connections,
            drain_rate: plan.burst_drain_rate,
            accepted,
            not_accepted: measured.other_than("202"),
            published,
            terminal,
            failed,
            lost: durable.saturating_sub(terminal),
            send_s: sent.as_secs_f64(),
            drain_s: (drained - sent).as_secs_f64(),
            measured,
            peak_rss_mib,
            timeline: timeline.samples,
        })
    }
}

/// The burst's counts over time, for its chart.
struct Timeline {
    started: Instant,
    /// Seconds since `started` when the next sample is due.
    next: f64,
    samples: Vec<BurstSample>,
}

impl Timeline {
    /// Twenty samples over the ten seconds of sending, a few hundred over
    /// the whole phase.
    const EVERY_S: f64 = 0.5;

    /// Starts with the counts at `started`.
    fn new(started: Instant, system: &AllInOne) -> Self {
        let mut timeline = Self {
            started,
            next: Self::EVERY_S,
            samples: Vec::new(),
        };
        timeline.take(system);
        timeline
    }

    /// Takes a sample if one is due (call it more often than [`Self::EVERY_S`]).
    fn sample(&mut self, system: &AllInOne) {
        let elapsed = self.started.elapsed().as_secs_f64();
        if elapsed >= self.next {
            self.take(system);
            self.next = ((elapsed / Self::EVERY_S).floor() + 1.0) * Self::EVERY_S;
        }
    }

    /// Takes a sample now.
    fn take(&mut self, system: &AllInOne) {
        self.samples.push(BurstSample {
            seconds: self.started.elapsed().as_secs_f64(),
            published: system.published(),
            terminal: system.terminal(),
        });
    }
}

impl Burst {
    /// None lost.
    pub(crate) fn verdicts(&self) -> Vec<Verdict> {
        vec![Verdict {
            what: format!(
                "burst of {} at {} connections, drained at {}/s",
                self.requests, self.connections, self.drain_rate
            ),
            measured: format!(
                "{} accepted in {:.1} s ({:.0}/s), {} not ({}); {} terminal ({} Failed), {} lost; drained {:.1} s after",
                self.accepted,
                self.send_s,
                self.measured.requests_per_s,
                self.requests - self.accepted,
                describe(&self.not_accepted),
                self.terminal,
                self.failed,
                self.lost,
                self.drain_s
            ),
            target: "0 lost",
            met: Some(self.lost == 0),
        }]
    }

    /// What fails the run: a durable request not terminal, or one Failed; in a
    /// smoke run, nothing accepted.
    pub(crate) fn failures(&self, full: bool) -> Vec<String> {
        let mut failures = Vec::new();
        if self.lost > 0 || self.failed > 0 || (!full && self.accepted == 0) {
            failures.push(format!(
                "burst: {} of {} durable requests did not reach a terminal state, {} Failed",
                self.lost, self.published, self.failed
            ));
        }
        failures
    }
}

/// The room for the values left of both burst panels, so that their time
/// axes line up.
const BURST_Y_LABELS: u32 = 80;

/// (3): the burst's requests accepted and deliveries terminal over time:
/// per second above, so far below.
pub(crate) fn chart(
    burst: Option<&Burst>,
    provenance: &Provenance<'_>,
    path: &Path,
) -> anyhow::Result<Outcome> {
    let Some(b) = burst else {
        return Ok(Outcome::NotRun("burst"));
    };
    let timeline = &b.timeline;
    let (Some(first), Some(last)) = (timeline.first(), timeline.last()) else {
        return Ok(Outcome::Lacking(
            "its burst phase recorded no timeline (a run from before it was kept)",
        ));
    };
    let title = format!(
        "Burst: {} requests over {} connections, the worker limited to {}/s",
        thousands(b.requests as f64),
        b.connections,
        thousands(f64::from(b.drain_rate))
    );
    let sent = format!("last answer ({:.1} s)", b.send_s);
    let legend = [
        (
            "accepted (events in the stream)".to_owned(),
            Mark::Line(BLUE),
        ),
        ("terminal".to_owned(), Mark::Line(GREEN)),
        (
            "waiting (accepted, not yet terminal)".to_owned(),
            Mark::Line(ORANGE),
        ),
        ("the worker's limit".to_owned(), Mark::Dashed(TARGET)),
        (sent, Mark::Dashed(GREY)),
    ];
    // A step per window between samples; a sample taken just after another
    // (the last one) joins the next window rather than make one so short
    // that a single delivery in it reads as thousands per second.
    let per_s = |count: fn(&BurstSample) -> u64| -> Vec<(f64, f64)> {
        let mut steps = Vec::new();
        let mut from = first;
        for sample in timeline {
            let dt = sample.seconds - from.seconds;
            if dt >= 0.1 {
                let rate = count(sample).saturating_sub(count(from)) as f64 / dt;
                steps.extend([(from.seconds, rate), (sample.seconds, rate)]);
                from = sample;
            }
        }
        steps
    };
    let so_far = |count: fn(&BurstSample) -> u64| -> Vec<(f64, f64)> {
        timeline
            .iter()
            .map(|s| (s.seconds, count(s) as f64))
            .collect()
    };
    let end = last.seconds.max(1.0);
    let rates = [
        (per_s(|s| s.published), BLUE),
        (per_s(|s| s.terminal), GREEN),
    ];
    let counts = [
        (so_far(|s| s.published), BLUE),
        (so_far(|s| s.terminal), GREEN),
        (so_far(|s| s.published.saturating_sub(s.terminal)), ORANGE),
    ];
    let (root, body) = frame(path, 540, provenance, &title, &legend)?;
    let (upper, lower) = body.split_vertically(200);
    let seconds = |x: &f64| {
        let s = format!("{x:.1}");
        s.strip_suffix(".0")
            .map_or_else(|| s.clone(), str::to_owned)
    };
    let count = |y: &f64| thousands(*y);
    for (area, lines, per_second) in [(&upper, &rates[..], true), (&lower, &counts[..], false)] {
        let top = lines
            .iter()
            .flat_map(|(points, _)| points.iter().map(|p| p.1))
            .fold(f64::from(b.drain_rate), f64::max)
            * 1.1;
        let mut chart = ChartBuilder::on(area)
            .margin_left(12)
            .margin_right(20)
            .margin_top(6)
            .x_label_area_size(if per_second { 25 } else { 45 })
            .y_label_area_size(BURST_Y_LABELS)
            .build_cartesian_2d(0.0..end, 0.0..top)?;
        let mut mesh = chart.configure_mesh();
        mesh.max_light_lines(2)
            .x_label_formatter(&seconds)
            .y_label_formatter(&count)
            .y_desc(if per_second {
                "per second"
            } else {
                "deliveries so far"
            })
            .label_style(text(13))
            .axis_desc_style(text(14));
        if !per_second {
            mesh.x_desc("seconds since the first request");
        }
        mesh.draw()?;
        for (points, color) in lines {
            chart.draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?;
        }
        if per_second {
            let limit = f64::from(b.drain_rate);
            chart.draw_series(DashedLineSeries::new(
                [(0.0, limit), (end, limit)],
                6,
                4,
                TARGET.stroke_width(1),
            ))?;
        }
        chart.draw_series(DashedLineSeries::new(
            [(b.send_s, 0.0), (b.send_s, top)],
            4,
            4,
            GREY.stroke_width(1),
        ))?;
    }
    root.present()?;
    Ok(Outcome::Drawn(texts(&title, &legend)))
}
