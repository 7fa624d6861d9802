//! (2) The store phase: what bounds ingest, the embedded store alone,
//! appending encoded events through the `Publisher` port from as many tasks
//! as ingest has connections, no HTTP.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use anyhow::Context;
use serde::{Deserialize, Serialize};
use skyport::Backends;
use skyport_core::event::{DeliveryRequested, Event};
use skyport_core::ports::PublishError;
use skyport_core::request::DeliveryRequest;
use time::OffsetDateTime;

use crate::bench::{BODY, Bench};
use crate::phases::Verdict;

/// The embedded store alone: appends from `concurrency` tasks, no HTTP.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Store {
    pub(crate) concurrency: u32,
    pub(crate) appends: u64,
    pub(crate) appends_per_s: f64,
    pub(crate) commits_per_s: f64,
    pub(crate) appends_per_commit: f64,
}

impl Bench {
    /// What bounds ingest: the embedded store alone, appending encoded
    /// events from `concurrency` tasks through the `Publisher` port, no HTTP.
    pub(crate) async fn store(&self) -> anyhow::Result<Vec<Store>> {
        let request: DeliveryRequest = serde_json::from_str(BODY)?;
        let mut rows = Vec::new();
        for concurrency in self.plan.connections {
            eprintln!("store alone, {concurrency} concurrent appends");
            let settings = self.settings(&format!("store-{concurrency}"), &[])?;
            let backends = Backends::open(&settings).await?;
            let per_task = self.plan.store_appends / u64::from(concurrency);
            let started = Instant::now();
            let mut tasks = tokio::task::JoinSet::new();
            for task in 0..concurrency {
                let publisher = Arc::clone(&backends.ports.publisher);
                let request = request.clone();
                tasks.spawn(async move {
                    for n in 0..per_task {
                        let event = Event::DeliveryRequested(Box::new(DeliveryRequested {
                            delivery_id: format!("store-{task}-{n}"),
                            accepted_at: OffsetDateTime::now_utc(),
                            traceparent: None,
                            idempotency_key: None,
                            principal: None,
                            epoch: 0,
                            redrive: None,
                            request: request.clone(),
                        }));
                        publisher
                            .publish(event.outbound(skyport_core::ports::Lane::Normal))
                            .await?;
                    }
                    Ok::<_, PublishError>(())
                });
            }
            for appended in tasks.join_all().await {
                appended?;
            }
            let seconds = started.elapsed().as_secs_f64();
            let stats = backends
                .embedded
                .as_ref()
                .context("the embedded store is not open")?
                .commit_stats();
            let commits = stats.commits.load(Ordering::Relaxed);
            let appends = per_task * u64::from(concurrency);
            rows.push(Store {
                concurrency,
                appends,
                appends_per_s: appends as f64 / seconds,
                commits_per_s: commits as f64 / seconds,
                appends_per_commit: appends as f64 / commits.max(1) as f64,
            });
        }
        Ok(rows)
    }
}

impl Store {
    /// The row: no target, what bounds ingest.
    pub(crate) fn verdicts(&self) -> Vec<Verdict> {
        vec![Verdict {
            what: format!("store alone, {} concurrent appends", self.concurrency),
            measured: format!(
                "{:.0} appends/s: {:.0} commits/s of {:.1}",
                self.appends_per_s, self.commits_per_s, self.appends_per_commit
            ),
            target: "(what bounds ingest)",
            met: None,
        }]
    }
}
