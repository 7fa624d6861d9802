//! (2) The named phase: what naming a request costs, the gateway alone
//! taking the same distinct requests with no name and then with an
//! `Idempotency-Key` each.

use serde::{Deserialize, Serialize};

use crate::bench::Bench;
use crate::phases::Verdict;
use crate::poster::{self, Naming, Schedule};
use crate::servers::GatewayOnly;

/// The gateway alone, the same distinct requests posted unnamed and then
/// each with an `Idempotency-Key` (64 connections, from the poster).
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Named {
    pub(crate) requests: u64,
    pub(crate) unnamed_per_s: f64,
    pub(crate) keyed_per_s: f64,
    /// Keyed over unnamed.
    pub(crate) ratio: f64,
}

impl Bench {
    /// What naming a request costs: the gateway alone, the same distinct
    /// requests posted with no name and with an `Idempotency-Key` each (a
    /// reservation written before the event).
    pub(crate) async fn named(&self) -> anyhow::Result<Named> {
        let requests = self.plan.named_requests;
        let mut rates = Vec::new();
        for naming in [Naming::Unnamed, Naming::Keyed] {
            eprintln!("{naming:?} requests: {requests} at 64 connections, gateway alone");
            let gateway = GatewayOnly::start(&self.settings(&format!("{naming:?}"), &[])?).await?;
            let posted =
                poster::post(&gateway.url, Schedule::Requests(requests), 64, naming, 0).await?;
            let published = gateway.published();
            gateway.stop().await?;
            anyhow::ensure!(
                posted.status("202") == requests && published == requests,
                "{naming:?}: {} of {requests} accepted, {published} published",
                posted.status("202")
            );
            rates.push(posted.requests_per_s);
        }
        Ok(Named {
            requests,
            unnamed_per_s: rates[0],
            keyed_per_s: rates[1],
            ratio: rates[1] / rates[0],
        })
    }
}

impl Named {
    /// No target: what naming costs.
    pub(crate) fn verdicts(&self) -> Vec<Verdict> {
        vec![Verdict {
            what: format!("{} requests with an Idempotency-Key each", self.requests),
            measured: format!(
                "{:.0}/s against {:.0}/s unnamed: {:.2} × (one reservation before each event)",
                self.keyed_per_s, self.unnamed_per_s, self.ratio
            ),
            target: "(what naming costs)",
            met: None,
        }]
    }
}
