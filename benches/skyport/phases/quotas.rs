//! The quotas phase: what metering every request costs the gateway. The
//! gateway alone on the embedded store, closed loop at 64 connections, with
//! `gateway.quotas` off and on (one client, a quota it never reaches, so
//! every request is charged and none refused), alternating over the rounds.

use serde::{Deserialize, Serialize};

use crate::bench::Bench;
use crate::load::Measured;
use crate::phases::Verdict;
use crate::servers::GatewayOnly;

const CONNECTIONS: u32 = 64;

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct QuotaCost {
    pub(crate) connections: u32,
    /// The round of the median ratio.
    pub(crate) off: Measured,
    pub(crate) on: Measured,
    /// On's requests/s over off's, in that round.
    pub(crate) ratio: f64,
    /// Every round's ratio, lowest first.
    pub(crate) ratios: Vec<f64>,
}

impl Bench {
    pub(crate) async fn quota_cost(&self) -> anyhow::Result<QuotaCost> {
        let mut rounds = Vec::new();
        for round in 1..=self.plan.rounds {
            eprintln!("quotas: the gateway alone, off then on (round {round})");
            let off = self
                .gateway_alone(&format!("quotas-off-{round}"), &[])
                .await?;
            let on = self
                .gateway_alone(
                    &format!("quotas-on-{round}"),
                    &[("gateway.quotas.default_per_s", "1000000".to_owned())],
                )
                .await?;
            anyhow::ensure!(
                on.status("429") == 0,
                "quotas: {} requests refused under a quota they never reach",
                on.status("429")
            );
            rounds.push((on.requests_per_s / off.requests_per_s, off, on));
        }
        rounds.sort_by(|a, b| a.0.total_cmp(&b.0));
        let ratios = rounds.iter().map(|(ratio, _, _)| *ratio).collect();
        let (ratio, off, on) = rounds.swap_remove(rounds.len() / 2);
        Ok(QuotaCost {
            connections: CONNECTIONS,
            off,
            on,
            ratio,
            ratios,
        })
    }

    /// The gateway alone on a fresh store with `keys`, closed loop.
    async fn gateway_alone(
        &self,
        phase: &str,
        keys: &[(&str, String)],
    ) -> anyhow::Result<Measured> {
        let gateway = GatewayOnly::start(&self.settings(phase, keys)?).await?;
        let measured = self
            .load(&gateway.url, self.closed_loop(CONNECTIONS))
            .await?;
        gateway.stop().await?;
        Ok(measured)
    }
}

impl QuotaCost {
    /// Quotas on against off.
    pub(crate) fn verdicts(&self) -> Vec<Verdict> {
        let ratios: Vec<String> = self.ratios.iter().map(|r| format!("{r:.2}")).collect();
        vec![Verdict {
            what: format!(
                "the gateway with quotas on (every request charged to one client), closed loop at {} connections",
                self.connections
            ),
            measured: format!(
                "{:.0}/s against {:.0}/s off: {:.2} × (rounds: {}); p99 {:.2} ms against {:.2} ms",
                self.on.requests_per_s,
                self.off.requests_per_s,
                self.ratio,
                ratios.join(", "),
                self.on.p99_ms,
                self.off.p99_ms
            ),
            target: "≥ 0.95 ×",
            met: Some(self.ratio >= 0.95),
        }]
    }

    /// What fails a smoke run: nothing accepted with quotas on.
    pub(crate) fn failures(&self, full: bool) -> Vec<String> {
        let mut failures = Vec::new();
        if !full && self.on.status("202") == 0 {
            failures.push("quotas: nothing accepted with quotas on".into());
        }
        failures
    }
}
