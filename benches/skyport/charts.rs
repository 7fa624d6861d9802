//! The charts of a run: SVG files drawn from its results into a directory
//! beside its JSON (`benchmarks/` beside `BENCHMARKS.json`), which
//! `BENCHMARKS.md` embeds. `cargo bench --bench skyport -- charts` redraws
//! them from the JSON alone.
//!
//! Plotters is built without its font features: it writes each text as an
//! SVG `<text>` with a font family and sizes it by an estimate, so drawing
//! needs no font installed; the viewer's font renders it.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::Path;

use anyhow::Context;
use plotters::coord::Shift;
use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint};
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use skyport::plan::thousands;

use crate::report::{BurstSample, EndToEnd, FleetPhase, Results};

const WIDTH: u32 = 800;
const FONT: &str = "sans-serif";
// Softer than the prelude's pure colours, which these names shadow.
const BLUE: RGBColor = RGBColor(31, 119, 180);
const ORANGE: RGBColor = RGBColor(230, 120, 20);
const GREEN: RGBColor = RGBColor(44, 160, 44);
const GREY: RGBColor = RGBColor(150, 150, 150);
/// Targets, from the verdicts.
const TARGET: RGBColor = RGBColor(214, 39, 40);

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

/// What became of one chart.
enum Outcome {
    /// Drawn; its SVG must hold these texts (title, legend).
    Drawn(Vec<String>),
    /// The run has none of the phases it is drawn from.
    NotRun(&'static str),
    /// Its phases ran, but their results lack what it is drawn from (a run
    /// from before it was recorded).
    Lacking(&'static str),
}

/// Draws every chart of `results` into `dir`, saying what became of each; a
/// chart that cannot be drawn from them is removed, so that every chart in
/// `dir` shows the JSON beside it. Returns why each chart whose phases ran
/// was not drawn (what a fresh run fails on; a redraw from an older JSON
/// expects some).
pub(crate) fn write(results: &Results, dir: &Path) -> anyhow::Result<Vec<String>> {
    type Draw = fn(&Results, &Path) -> anyhow::Result<Outcome>;
    let charts: [(&str, Draw); 5] = [
        ("ingest.svg", ingest),
        ("latency.svg", latency),
        ("burst.svg", burst),
        ("workflows.svg", workflows),
        ("fleet.svg", fleet),
    ];
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut lacking = Vec::new();
    for (file, draw) in charts {
        let path = dir.join(file);
        let why = match draw(results, &path).with_context(|| format!("drawing {file}"))? {
            Outcome::Drawn(texts) => {
                check(&path, &texts)?;
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

/// Fails unless the SVG at `path` holds each of `texts`, as its `<text>`
/// elements write them.
fn check(path: &Path, texts: &[String]) -> anyhow::Result<()> {
    let svg =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    for text in texts {
        let escaped = text
            .replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
            .replace('"', "&quot;")
            .replace('\'', "&apos;");
        anyhow::ensure!(
            svg.contains(&format!("\n{escaped}\n")),
            "{} lacks the text {text:?}",
            path.display()
        );
    }
    Ok(())
}

/// How a legend entry is marked.
#[derive(Debug, Clone, Copy)]
enum Mark {
    Bar(RGBColor),
    Line(RGBColor),
    Dashed(RGBColor),
    Cross,
}

/// Where a legend starts, level with the plots' left edges, and the height
/// of its rows.
const LEGEND_LEFT: i32 = 90;
const LEGEND_ROW: i32 = 18;

/// A chart's frame: a white canvas of `height` with `title` at the top, the
/// `legend` under it (entries in rows, so that none covers the data) and the
/// run's provenance in the lower right corner. Returns the canvas, to
/// present once drawn, and the area left for the plots.
fn frame<'a>(
    path: &'a Path,
    height: u32,
    results: &Results,
    title: &str,
    legend: &[(String, Mark)],
) -> anyhow::Result<(Area<'a>, Area<'a>)> {
    let root = SVGBackend::new(path, (WIDTH, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let m = &results.machine;
    let provenance = format!(
        "cargo bench --bench skyport, {} run of {}, commit {}, {} cores ({})",
        results.plan,
        m.date.get(..10).unwrap_or(&m.date),
        m.commit,
        m.cores,
        m.cpu
    );
    let corner = (i32::try_from(WIDTH)? - 6, i32::try_from(height)? - 4);
    root.draw(&Text::new(
        provenance,
        corner,
        text(11)
            .color(&GREY)
            .pos(Pos::new(HPos::Right, VPos::Bottom)),
    ))?;
    let titled = root.margin(8, 0, 0, 0).titled(title, text(20))?;
    // Entries left to right, a new row when the next would pass the right edge.
    let mut places = Vec::new();
    let (mut x, mut row) = (LEGEND_LEFT, 0);
    for (label, _) in legend {
        // The mark, about 5.5 px a character of 13 px text, and a gap.
        let width = 44 + i32::try_from(label.chars().count())? * 11 / 2;
        if x > LEGEND_LEFT && x + width > i32::try_from(WIDTH)? {
            (x, row) = (LEGEND_LEFT, row + 1);
        }
        places.push((x, row * LEGEND_ROW + LEGEND_ROW / 2));
        x += width;
    }
    let (strip, body) = titled.split_vertically(u32::try_from((row + 1) * LEGEND_ROW + 6)?);
    for ((label, mark), (x, y)) in legend.iter().zip(places) {
        match *mark {
            Mark::Bar(color) => strip.draw(&Rectangle::new(
                [(x, y - 6), (x + 18, y + 6)],
                color.filled(),
            ))?,
            Mark::Line(color) => strip.draw(&PathElement::new(
                vec![(x, y), (x + 20, y)],
                color.stroke_width(2),
            ))?,
            Mark::Dashed(color) => {
                for dx in [0, 8, 16] {
                    strip.draw(&PathElement::new(
                        vec![(x + dx, y), (x + dx + 5, y)],
                        color.stroke_width(2),
                    ))?;
                }
            }
            Mark::Cross => strip.draw(&Cross::new((x + 9, y), 5, BLACK.stroke_width(2)))?,
        }
        strip.draw(&Text::new(
            label.as_str(),
            (x + 28, y),
            text(13).pos(Pos::new(HPos::Left, VPos::Center)),
        ))?;
    }
    // Clear of the provenance line.
    let body = body.margin(0, 14, 0, 0);
    Ok((root, body))
}

/// What a drawn chart's SVG must hold: its title and its legend.
fn texts(title: &str, legend: &[(String, Mark)]) -> Vec<String> {
    std::iter::once(title.to_owned())
        .chain(legend.iter().map(|(label, _)| label.clone()))
        .collect()
}

fn text(size: u32) -> TextStyle<'static> {
    (FONT, size).into_font().into()
}

/// An axis of `f64` (linear or log, `inner`) with its ticks where the chart
/// wants them: at categories' centres, at round percentiles. Plotters' own
/// `with_key_points` loses the axis's label formatting.
struct Ticks<R> {
    inner: R,
    at: Vec<f64>,
}

impl<R: Ranged<ValueType = f64>> Ranged for Ticks<R> {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn range(&self) -> Range<f64> {
        self.inner.range()
    }

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        self.inner.map(value, limit)
    }

    fn key_points<Hint: KeyPointHint>(&self, hint: Hint) -> Vec<f64> {
        // Bold lines only: light ones would fall between categories.
        if hint.weight().allow_light_points() {
            Vec::new()
        } else {
            self.at.clone()
        }
    }
}

/// A linear axis over `range` with ticks `at`.
fn linear(range: Range<f64>, at: impl IntoIterator<Item = f64>) -> Ticks<RangedCoordf64> {
    Ticks {
        inner: range.into(),
        at: at.into_iter().collect(),
    }
}

/// Ingest's target, from the verdicts: Skyport at this share of the ceiling.
const INGEST_TARGET: f64 = 0.6;

/// (1): Skyport's requests/s against the ceiling's at each connection
/// count of the ingest phase, and the all-in-one's closed loop.
fn ingest(results: &Results, path: &Path) -> anyhow::Result<Outcome> {
    struct Group {
        label: String,
        ceiling: f64,
        skyport: f64,
        ratio: f64,
        /// Only the gateway alone has a target.
        target: bool,
    }
    let mut groups: Vec<Group> = results
        .ingest
        .iter()
        .map(|row| Group {
            label: format!("gateway alone, {} connections", row.connections),
            ceiling: row.ceiling.requests_per_s,
            skyport: row.skyport.requests_per_s,
            ratio: row.ratio,
            target: true,
        })
        .collect();
    if let Some(a) = &results.all_in_one {
        groups.push(Group {
            label: format!("all in one, {} connections", a.connections),
            ceiling: a.ceiling.requests_per_s,
            skyport: a.skyport.requests_per_s,
            ratio: a.ratio,
            target: false,
        });
    }
    if groups.is_empty() {
        return Ok(Outcome::NotRun("ingest or all-in-one"));
    }
    let title = "Closed loop: Skyport against the ceiling (a bare axum handler)";
    let legend = [
        ("the ceiling".to_owned(), Mark::Bar(GREY)),
        (
            "Skyport, labelled with its share of the ceiling".to_owned(),
            Mark::Bar(BLUE),
        ),
        (
            "target: 0.6 × the ceiling (gateway alone)".to_owned(),
            Mark::Line(TARGET),
        ),
    ];
    let top = groups
        .iter()
        .map(|g| g.ceiling.max(g.skyport))
        .fold(0.0, f64::max)
        * 1.1;
    let n = groups.len();
    let (root, body) = frame(path, 400, results, title, &legend)?;
    let mut chart = ChartBuilder::on(&body)
        .margin(12)
        .x_label_area_size(50)
        .y_label_area_size(80)
        .build_cartesian_2d(
            linear(0.0..n as f64, (0..n).map(|i| i as f64 + 0.5)),
            0.0..top,
        )?;
    let label = |x: &f64| {
        groups
            .get(x.floor() as usize)
            .map_or_else(String::new, |g| g.label.clone())
    };
    let per_s = |y: &f64| thousands(*y);
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_label_formatter(&label)
        .y_label_formatter(&per_s)
        .x_desc(
            "the gateway alone loaded by oha; the all-in-one process and its ceiling by the poster",
        )
        .y_desc("requests per second")
        .max_light_lines(2)
        .label_style(text(13))
        .axis_desc_style(text(14))
        .draw()?;
    let bar = |i: usize, from: f64, value: f64, color: RGBColor| {
        let x = i as f64 + from;
        Rectangle::new([(x, 0.0), (x + 0.36, value)], color.filled())
    };
    chart.draw_series(
        groups
            .iter()
            .enumerate()
            .map(|(i, g)| bar(i, 0.12, g.ceiling, GREY)),
    )?;
    chart.draw_series(
        groups
            .iter()
            .enumerate()
            .map(|(i, g)| bar(i, 0.52, g.skyport, BLUE)),
    )?;
    chart.draw_series(
        groups
            .iter()
            .enumerate()
            .filter(|(_, g)| g.target)
            .map(|(i, g)| {
                let y = g.ceiling * INGEST_TARGET;
                PathElement::new(
                    vec![(i as f64 + 0.5, y), (i as f64 + 0.9, y)],
                    TARGET.stroke_width(2),
                )
            }),
    )?;
    chart.draw_series(groups.iter().enumerate().map(|(i, g)| {
        Text::new(
            format!("{:.2} ×", g.ratio),
            (i as f64 + 0.7, g.skyport),
            text(13).pos(Pos::new(HPos::Center, VPos::Bottom)),
        )
    }))?;
    root.present()?;
    Ok(Outcome::Drawn(texts(title, &legend)))
}

/// The fixed-rate phase's target, from the verdicts.
const P99_TARGET_MS: f64 = 10.0;

/// (2): the latency percentiles of the open loops at the fixed rate: the
/// gateway alone (oha) and the all-in-one with its worker draining behind
/// (the poster).
fn latency(results: &Results, path: &Path) -> anyhow::Result<Outcome> {
    let mut curves = Vec::new();
    if let Some(f) = &results.fixed_rate {
        let m = &f.measured;
        curves.push((
            curve(
                format!("gateway alone at {}/s (oha)", thousands(f64::from(f.rate))),
                &m.percentiles_ms,
                [m.p50_ms, m.p99_ms, m.p99_9_ms],
            ),
            BLUE,
        ));
    }
    if let Some(a) = &results.all_in_one
        && let Some(l) = &a.open_loop.latency
    {
        curves.push((
            curve(
                format!(
                    "all in one at {}/s, the worker draining behind (poster)",
                    thousands(f64::from(a.rate))
                ),
                &l.percentiles_ms,
                [l.p50_ms, l.p99_ms, l.p99_9_ms],
            ),
            ORANGE,
        ));
    }
    if curves.is_empty() {
        return Ok(Outcome::NotRun("fixed-rate or all-in-one"));
    }
    let title = "Open loop at a fixed rate: latency from when each request was due";
    let legend: Vec<(String, Mark)> = curves
        .iter()
        .map(|((label, _), color)| (label.clone(), Mark::Line(*color)))
        .chain(std::iter::once((
            "target: p99 ≤ 10 ms (gateway alone)".to_owned(),
            Mark::Dashed(TARGET),
        )))
        .collect();
    let (low, high) = curves
        .iter()
        .flat_map(|((_, points), _)| points.iter().map(|p| p.1))
        .fold((f64::MAX, P99_TARGET_MS), |(low, high), ms| {
            (low.min(ms), high.max(ms))
        });
    let (bottom, top) = (low / 1.5, high * 1.5);
    let steps = [
        0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0,
    ];
    let (root, body) = frame(path, 400, results, title, &legend)?;
    let mut chart = ChartBuilder::on(&body)
        .margin(12)
        .margin_right(30)
        .x_label_area_size(50)
        .y_label_area_size(70)
        .build_cartesian_2d(
            linear(
                0.0..nines(99.99),
                [10.0, 50.0, 75.0, 90.0, 99.0, 99.9, 99.99].map(nines),
            ),
            Ticks {
                inner: LogCoord::from((bottom..top).log_scale()),
                at: steps
                    .into_iter()
                    .filter(|ms| (bottom..=top).contains(ms))
                    .collect(),
            },
        )?;
    let percentile = |x: &f64| {
        let hundredths = (100.0 - 100.0 * 10f64.powf(-x)) * 100.0;
        format!("p{}", hundredths.round() / 100.0)
    };
    let ms = |y: &f64| format!("{y}");
    chart
        .configure_mesh()
        .x_label_formatter(&percentile)
        .y_label_formatter(&ms)
        .x_desc("percentile of the requests (each step right: ten times fewer slower)")
        .y_desc("latency (ms, log scale)")
        .label_style(text(13))
        .axis_desc_style(text(14))
        .draw()?;
    for ((_, points), color) in &curves {
        chart.draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?;
        chart.draw_series(
            points
                .iter()
                .map(|&point| Circle::new(point, 3, color.filled())),
        )?;
    }
    chart.draw_series(DashedLineSeries::new(
        [(0.0, P99_TARGET_MS), (nines(99.0), P99_TARGET_MS)],
        6,
        4,
        TARGET.stroke_width(2),
    ))?;
    root.present()?;
    Ok(Outcome::Drawn(texts(title, &legend)))
}

/// Where a percentile sits on a scale of nines: p90 at 1, p99 at 2, p99.9 at 3.
fn nines(percentile: f64) -> f64 {
    -(1.0 - percentile / 100.0).log10()
}

/// A run's latency percentiles as points on the scale of nines, and its
/// label: every one recorded, or, from a run before they were kept, its p50,
/// p99 and p99.9.
fn curve(
    label: String,
    percentiles: &BTreeMap<String, f64>,
    p50_99_999: [f64; 3],
) -> (String, Vec<(f64, f64)>) {
    let (label, mut points): (String, Vec<(f64, f64)>) = if percentiles.is_empty() {
        (
            format!("{label}: p50, p99, p99.9 only (an older run)"),
            [50.0, 99.0, 99.9].into_iter().zip(p50_99_999).collect(),
        )
    } else {
        let points = percentiles
            .iter()
            .filter_map(|(name, ms)| Some((name.strip_prefix('p')?.parse().ok()?, *ms)))
            .collect();
        (label, points)
    };
    // A log scale has no place for 0 ms, nor for NaN (nothing answered).
    points.retain(|&(p, ms)| p < 100.0 && ms > 0.0);
    points.sort_by(|a, b| a.0.total_cmp(&b.0));
    (
        label,
        points.into_iter().map(|(p, ms)| (nines(p), ms)).collect(),
    )
}

/// The room for the values left of both burst panels, so that their time
/// axes line up.
const BURST_Y_LABELS: u32 = 80;

/// (3): the burst's requests accepted and deliveries terminal over time:
/// per second above, so far below.
fn burst(results: &Results, path: &Path) -> anyhow::Result<Outcome> {
    let Some(b) = &results.burst else {
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
    let (root, body) = frame(path, 540, results, &title, &legend)?;
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
/// all-in-one round.
fn workflows(results: &Results, path: &Path) -> anyhow::Result<Outcome> {
    let end_to_end = |label: &str, e: &EndToEnd| Run {
        label: label.to_owned(),
        workflows_per_s: e.workflows_per_s,
        cpu_us: e.cpu_us_per_workflow,
        best_second: Some(e.best_second),
        all_in_one: false,
    };
    let mut runs: Vec<Run> = results
        .end_to_end
        .iter()
        .map(|e| end_to_end("end to end", e))
        .collect();
    if let Some(a) = &results.all_in_one {
        runs.extend(a.work.iter().enumerate().map(|(i, round)| Run {
            label: format!("all in one, round {}", i + 1),
            workflows_per_s: round.workflows_per_s,
            cpu_us: round.cpu_us_per_workflow,
            best_second: None,
            all_in_one: true,
        }));
    }
    if let Some(k) = &results.kafka {
        runs.push(end_to_end("end to end on Kafka", &k.end_to_end));
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
    let (root, body) = frame(path, 420, results, title, &legend)?;
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

/// (10): the fleet's workflows/s against its worker count on each stream,
/// measured and as the capacity plan predicts it.
fn fleet(results: &Results, path: &Path) -> anyhow::Result<Outcome> {
    let phases: Vec<(&str, RGBColor, &FleetPhase)> = [
        ("Kafka", BLUE, results.fleet_kafka.as_ref()),
        ("Event Hubs", ORANGE, results.fleet_eventhubs.as_ref()),
    ]
    .into_iter()
    .filter_map(|(name, color, phase)| Some((name, color, phase?)))
    .collect();
    if phases.is_empty() {
        return Ok(Outcome::NotRun("fleet-kafka or fleet-eventhubs"));
    }
    if phases.iter().any(|(_, _, phase)| phase.runs.is_empty()) {
        return Ok(Outcome::Lacking("a fleet phase without runs"));
    }
    let title =
        "The fleet draining a backlog: workflows per second against its workers, on 2 shared cores";
    let legend: Vec<(String, Mark)> = phases
        .iter()
        .flat_map(|(name, color, _)| {
            [
                (format!("{name}, measured"), Mark::Line(*color)),
                (
                    format!("{name}, the plan's prediction"),
                    Mark::Dashed(*color),
                ),
            ]
        })
        .collect();
    let (root, body) = frame(path, 420, results, title, &legend)?;
    let runs = || phases.iter().flat_map(|(_, _, phase)| &phase.runs);
    let most = runs().map(|r| r.workers).max().unwrap_or(1);
    let top = runs()
        .map(|r| r.workflows_per_s.max(r.predicted_workflows_per_s))
        .fold(0.0, f64::max)
        * 1.2;
    let mut chart = ChartBuilder::on(&body)
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(
            linear(0.5..most as f64 + 0.5, (1..=most).map(|w| w as f64)),
            0.0..top.max(1.0),
        )?;
    let count = |x: &f64| format!("{x:.0}");
    let value = |y: &f64| thousands(*y);
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_label_formatter(&count)
        .y_label_formatter(&value)
        .x_desc("workers (one gateway; broker, Cosmos DB emulator and services beside them)")
        .y_desc("workflows per second")
        .label_style(text(12))
        .axis_desc_style(text(13))
        .draw()?;
    for (_, color, phase) in &phases {
        let measured: Vec<(f64, f64)> = phase
            .runs
            .iter()
            .map(|r| (r.workers as f64, r.workflows_per_s))
            .collect();
        let predicted: Vec<(f64, f64)> = phase
            .runs
            .iter()
            .map(|r| (r.workers as f64, r.predicted_workflows_per_s))
            .collect();
        chart.draw_series(LineSeries::new(measured.clone(), color.stroke_width(2)))?;
        chart.draw_series(
            measured
                .iter()
                .map(|&point| Circle::new(point, 4, color.filled())),
        )?;
        chart.draw_series(DashedLineSeries::new(
            predicted,
            6,
            4,
            color.stroke_width(2),
        ))?;
        chart.draw_series(measured.iter().map(|&(x, y)| {
            EmptyElement::at((x, y))
                + Text::new(
                    format!("{}/s", thousands(y)),
                    (6, -12),
                    text(12).pos(Pos::new(HPos::Left, VPos::Center)),
                )
        }))?;
    }
    root.present()?;
    Ok(Outcome::Drawn(texts(title, &legend)))
}
