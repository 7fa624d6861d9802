//! The charts' primitives: the frame every chart is drawn in (title, legend
//! and the run's provenance), its marks, colours and axes. Each chart is its
//! phase's (`phases/*.rs`); the report writes them.
//!
//! The charts of a run are SVG files drawn from its results into a directory
//! beside its JSON (`benches/charts/` beside `benches/BENCHMARKS.json`), which
//! `BENCHMARKS.md` embeds. `cargo bench --bench skyport -- charts` redraws
//! them from the JSON alone.
//!
//! Plotters is built without its font features: it writes each text as an
//! SVG `<text>` with a font family and sizes it by an estimate, so drawing
//! needs no font installed; the viewer's font renders it.

use std::ops::Range;
use std::path::Path;

use anyhow::Context;
use plotters::coord::Shift;
use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint};
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

const WIDTH: u32 = 800;
const FONT: &str = "sans-serif";
// Softer than the prelude's pure colours, which these names shadow.
pub(crate) const BLUE: RGBColor = RGBColor(31, 119, 180);
pub(crate) const ORANGE: RGBColor = RGBColor(230, 120, 20);
pub(crate) const GREEN: RGBColor = RGBColor(44, 160, 44);
pub(crate) const GREY: RGBColor = RGBColor(150, 150, 150);
/// Targets, from the verdicts.
pub(crate) const TARGET: RGBColor = RGBColor(214, 39, 40);

pub(crate) type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

/// What became of one chart.
pub(crate) enum Outcome {
    /// Drawn; its SVG must hold these texts (title, legend).
    Drawn(Vec<String>),
    /// The run has none of the phases it is drawn from.
    NotRun(&'static str),
    /// Its phases ran, but their results lack what it is drawn from (a run
    /// from before it was recorded).
    Lacking(&'static str),
}

/// The run a chart is drawn from, which its frame names in the lower right
/// corner.
pub(crate) struct Provenance<'a> {
    /// The plan's name: `full` or `smoke`.
    pub(crate) plan: &'a str,
    /// When the run was (RFC 3339); the chart names its day.
    pub(crate) date: &'a str,
    pub(crate) commit: &'a str,
    pub(crate) cores: usize,
    pub(crate) cpu: &'a str,
}

/// Fails unless the SVG at `path` holds each of `texts`, as its `<text>`
/// elements write them.
pub(crate) fn check(path: &Path, texts: &[String]) -> anyhow::Result<()> {
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
pub(crate) enum Mark {
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
pub(crate) fn frame<'a>(
    path: &'a Path,
    height: u32,
    provenance: &Provenance<'_>,
    title: &str,
    legend: &[(String, Mark)],
) -> anyhow::Result<(Area<'a>, Area<'a>)> {
    let root = SVGBackend::new(path, (WIDTH, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let m = provenance;
    let provenance = format!(
        "cargo bench --bench skyport, {} run of {}, commit {}, {} cores ({})",
        m.plan,
        m.date.get(..10).unwrap_or(m.date),
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
pub(crate) fn texts(title: &str, legend: &[(String, Mark)]) -> Vec<String> {
    std::iter::once(title.to_owned())
        .chain(legend.iter().map(|(label, _)| label.clone()))
        .collect()
}

pub(crate) fn text(size: u32) -> TextStyle<'static> {
    (FONT, size).into_font().into()
}

/// An axis of `f64` (linear or log, `inner`) with its ticks where the chart
/// wants them: at categories' centres, at round percentiles. Plotters' own
/// `with_key_points` loses the axis's label formatting.
pub(crate) struct Ticks<R> {
    pub(crate) inner: R,
    pub(crate) at: Vec<f64>,
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
pub(crate) fn linear(
    range: Range<f64>,
    at: impl IntoIterator<Item = f64>,
) -> Ticks<RangedCoordf64> {
    Ticks {
        inner: range.into(),
        at: at.into_iter().collect(),
    }
}
