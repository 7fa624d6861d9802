//! The fleet phases' chart: the fleet's workflows per second against its
//! worker count on each stream, measured and as the capacity plan predicts.

use std::path::Path;

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use skyport::plan::thousands;

use super::FleetPhase;
use crate::charts::{BLUE, Mark, ORANGE, Outcome, Provenance, frame, linear, text, texts};

/// (10): the fleet's workflows/s against its worker count on each stream,
/// measured and as the capacity plan predicts it.
pub(crate) fn chart(
    kafka: Option<&FleetPhase>,
    eventhubs: Option<&FleetPhase>,
    provenance: &Provenance<'_>,
    path: &Path,
) -> anyhow::Result<Outcome> {
    let phases: Vec<(&str, RGBColor, &FleetPhase)> =
        [("Kafka", BLUE, kafka), ("Event Hubs", ORANGE, eventhubs)]
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
    let (root, body) = frame(path, 420, provenance, title, &legend)?;
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
