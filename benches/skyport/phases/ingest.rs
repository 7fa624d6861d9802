//! (1), (2) The ingest phase: the ceiling (a bare axum handler that parses
//! the same body and answers 202) and the gateway on the embedded store,
//! closed loop at each connection count, in alternating rounds; and the
//! chart of both, the all-in-one's closed loop beside them.

use std::path::Path;

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use serde::{Deserialize, Serialize};
use skyport::plan::thousands;

use crate::bench::Bench;
use crate::charts::{BLUE, GREY, Mark, Outcome, Provenance, TARGET, frame, linear, text, texts};
use crate::load::Measured;
use crate::memory;
use crate::phases::Verdict;
use crate::phases::all_in_one::WholeSystem;
use crate::servers::{Ceiling, GatewayOnly};

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Ingest {
    pub(crate) connections: u32,
    pub(crate) ceiling: Measured,
    pub(crate) skyport: Measured,
    /// Skyport's requests/s over the ceiling's, in the round of the median ratio.
    pub(crate) ratio: f64,
    /// Every round's ratio, lowest first.
    pub(crate) ratios: Vec<f64>,
    /// 202s with no event in the stream: must be 0.
    pub(crate) accepted_not_published: u64,
    /// The embedded store's group commits: how often, and how many writes each carried.
    pub(crate) commits_per_s: f64,
    pub(crate) writes_per_commit: f64,
    pub(crate) peak_rss_mib: f64,
}

impl Bench {
    /// (1), (2) and (6): the ceiling and the gateway, each connection count in turn.
    pub(crate) async fn ingest(&self) -> anyhow::Result<Vec<Ingest>> {
        let mut rows = Vec::new();
        for connections in self.plan.connections {
            let mut rounds = Vec::new();
            for round in 1..=self.plan.rounds {
                rounds.push(self.ingest_round(connections, round).await?);
            }
            // The round of the median ratio stands for them all; every ratio is kept.
            rounds.sort_by(|a, b| a.ratio.total_cmp(&b.ratio));
            let ratios = rounds.iter().map(|r| r.ratio).collect();
            let peak_rss_mib = rounds.iter().map(|r| r.peak_rss_mib).fold(0.0, f64::max);
            let not_published = rounds.iter().map(|r| r.accepted_not_published).sum();
            let mut median = rounds.swap_remove(rounds.len() / 2);
            median.ratios = ratios;
            median.peak_rss_mib = peak_rss_mib;
            median.accepted_not_published = not_published;
            rows.push(median);
        }
        Ok(rows)
    }

    /// The ceiling, then the gateway on a fresh store, at `connections`.
    async fn ingest_round(&self, connections: u32, round: u32) -> anyhow::Result<Ingest> {
        eprintln!("ceiling, closed loop at {connections} connections (round {round})");
        let ceiling = Ceiling::start().await?;
        let bare = self
            .load(&ceiling.url, self.closed_loop(connections))
            .await?;
        ceiling.stop().await?;

        eprintln!("ingest, closed loop at {connections} connections (round {round})");
        memory::reset_peak()?;
        let gateway =
            GatewayOnly::start(&self.settings(&format!("ingest-{connections}-{round}"), &[])?)
                .await?;
        let skyport = self
            .load(&gateway.url, self.closed_loop(connections))
            .await?;
        let peak_rss_mib = memory::peak_mib()?;
        let published = gateway.published();
        let (commits, writes) = gateway.commits();
        gateway.stop().await?;
        Ok(Ingest {
            connections,
            ratio: skyport.requests_per_s / bare.requests_per_s,
            ratios: Vec::new(),
            accepted_not_published: skyport.status("202").saturating_sub(published),
            commits_per_s: commits as f64 / skyport.seconds,
            writes_per_commit: writes as f64 / commits.max(1) as f64,
            ceiling: bare,
            skyport,
            peak_rss_mib,
        })
    }
}

impl Ingest {
    /// The row against its target: a share of the ceiling.
    pub(crate) fn verdicts(&self) -> Vec<Verdict> {
        vec![Verdict {
            what: format!("ingest, {} connections", self.connections),
            measured: format!(
                "{:.0}/s against {:.0}/s: {:.2} × the ceiling (rounds: {}); p50 {:.2} ms, p99 {:.2} ms \
                 (ceiling p50 {:.2} ms, p99 {:.2} ms); {:.0} commits/s of {:.1} events",
                self.skyport.requests_per_s,
                self.ceiling.requests_per_s,
                self.ratio,
                self.ratios
                    .iter()
                    .map(|r| format!("{r:.2}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                self.skyport.p50_ms,
                self.skyport.p99_ms,
                self.ceiling.p50_ms,
                self.ceiling.p99_ms,
                self.commits_per_s,
                self.writes_per_commit
            ),
            target: "≥ 0.6 × the ceiling",
            met: Some(self.ratio >= 0.6),
        }]
    }

    /// What fails the run: a request answered 202 that is not in the stream;
    /// in a smoke run, nothing accepted.
    pub(crate) fn failures(&self, full: bool) -> Vec<String> {
        let mut failures = Vec::new();
        if self.accepted_not_published > 0 {
            failures.push(format!(
                "ingest at {}: {} requests answered 202 are not in the stream",
                self.connections, self.accepted_not_published
            ));
        }
        if !full && self.skyport.status("202") == 0 {
            failures.push(format!("ingest at {}: nothing accepted", self.connections));
        }
        failures
    }
}

/// Ingest's target, from the verdicts: Skyport at this share of the ceiling.
const INGEST_TARGET: f64 = 0.6;

/// (1): Skyport's requests/s against the ceiling's at each connection
/// count of the ingest phase, and the all-in-one's closed loop.
pub(crate) fn chart(
    ingest: &[Ingest],
    all_in_one: Option<&WholeSystem>,
    provenance: &Provenance<'_>,
    path: &Path,
) -> anyhow::Result<Outcome> {
    struct Group {
        label: String,
        ceiling: f64,
        skyport: f64,
        ratio: f64,
        /// Only the gateway alone has a target.
        target: bool,
    }
    let mut groups: Vec<Group> = ingest
        .iter()
        .map(|row| Group {
            label: format!("gateway alone, {} connections", row.connections),
            ceiling: row.ceiling.requests_per_s,
            skyport: row.skyport.requests_per_s,
            ratio: row.ratio,
            target: true,
        })
        .collect();
    if let Some(a) = all_in_one {
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
    let (root, body) = frame(path, 400, provenance, title, &legend)?;
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
