//! (3) The fixed-rate phase: the gateway alone, open loop at a fixed rate,
//! latency from when each request was due (coordinated omission corrected);
//! and the latency chart, the all-in-one's open loop beside it.

use std::collections::BTreeMap;
use std::path::Path;

use plotters::prelude::*;
use serde::{Deserialize, Serialize};
use skyport::plan::thousands;

use crate::bench::{Bench, OPEN_LOOP_CONNECTIONS};
use crate::charts::{
    BLUE, Mark, ORANGE, Outcome, Provenance, TARGET, Ticks, frame, linear, text, texts,
};
use crate::load::{Load, Measured};
use crate::memory;
use crate::phases::Verdict;
use crate::phases::all_in_one::WholeSystem;
use crate::servers::GatewayOnly;

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct FixedRate {
    pub(crate) rate: u32,
    pub(crate) seconds: f64,
    pub(crate) measured: Measured,
    pub(crate) peak_rss_mib: f64,
}

impl Bench {
    /// (3): open loop at a fixed rate, latency from when each request was due.
    pub(crate) async fn fixed_rate(&self) -> anyhow::Result<FixedRate> {
        let plan = &self.plan;
        eprintln!(
            "fixed rate: {}/s for {} s",
            plan.fixed_rate,
            plan.fixed_duration.as_secs()
        );
        memory::reset_peak()?;
        let gateway = GatewayOnly::start(&self.settings("fixed-rate", &[])?).await?;
        let measured = self
            .load(
                &gateway.url,
                Load {
                    connections: OPEN_LOOP_CONNECTIONS,
                    duration: plan.fixed_duration,
                    rate: Some(plan.fixed_rate),
                },
            )
            .await?;
        let peak_rss_mib = memory::peak_mib()?;
        gateway.stop().await?;
        Ok(FixedRate {
            rate: plan.fixed_rate,
            seconds: plan.fixed_duration.as_secs_f64(),
            measured,
            peak_rss_mib,
        })
    }
}

impl FixedRate {
    /// Its p99 against the target, and its errors.
    pub(crate) fn verdicts(&self) -> Vec<Verdict> {
        let m = &self.measured;
        let errors = m.requests - m.status("202");
        vec![Verdict {
            what: format!("fixed rate {}/s for {:.0} s", self.rate, self.seconds),
            measured: format!(
                "{:.0}/s; p50 {:.2} ms, p99 {:.2} ms, p99.9 {:.2} ms; {errors} not 202",
                m.requests_per_s, m.p50_ms, m.p99_ms, m.p99_9_ms
            ),
            target: "p99 ≤ 10 ms, no errors",
            met: Some(m.p99_ms <= 10.0 && errors == 0),
        }]
    }

    /// What fails a smoke run: nothing accepted.
    pub(crate) fn failures(&self, full: bool) -> Vec<String> {
        let mut failures = Vec::new();
        if !full && self.measured.status("202") == 0 {
            failures.push("fixed rate: nothing accepted".into());
        }
        failures
    }
}

/// The fixed-rate phase's target, from the verdicts.
const P99_TARGET_MS: f64 = 10.0;

/// (2): the latency percentiles of the open loops at the fixed rate: the
/// gateway alone (oha) and the all-in-one with its worker draining behind
/// (the poster).
pub(crate) fn chart(
    fixed_rate: Option<&FixedRate>,
    all_in_one: Option<&WholeSystem>,
    provenance: &Provenance<'_>,
    path: &Path,
) -> anyhow::Result<Outcome> {
    let mut curves = Vec::new();
    if let Some(f) = fixed_rate {
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
    if let Some(a) = all_in_one
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
    let (root, body) = frame(path, 400, provenance, title, &legend)?;
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
