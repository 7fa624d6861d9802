//! Skyport's worker: consumes the stream, runs the five-step workflow for every
//! event with at-least-once checkpointing, and writes each outcome to the
//! status store.
//!
//! A library on the ports: [`Worker::new`] wires them to the workflow,
//! [`Worker::run`] consumes until the shutdown token fires and then drains.

pub mod consumer;
pub mod intake;
pub mod metrics;
pub mod resilience;
pub mod timers;
pub mod workflow;

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use serde_json::Value;
use skyport_core::ports::{
    Consumer, Diagnostics, Ports, ReportError, ReportQuery, StatusStore, details_of, inspect_parts,
};
use skyport_runtime::admin::ReadinessCheck;
use skyport_runtime::backoff::Backoff;
use skyport_runtime::config::{ServicesSettings, WorkerSettings};
use tokio_util::sync::CancellationToken;
use url::Url;

use crate::consumer::PartitionContext;
use crate::intake::Intake;
use crate::intake::backlog::BacklogExceeded;
use crate::intake::pauses::Pauses;
use crate::resilience::breaker::{BreakerSettings, Breakers};
use crate::resilience::client::{ClientError, ServiceClient};
use crate::workflow::status::StatusWriter;
use crate::workflow::{RetryPolicy, Workflow};

/// The worker, ready to run.
#[derive(Debug)]
pub struct Worker {
    consumer: Arc<dyn Consumer>,
    status: Arc<dyn StatusStore>,
    context: Arc<PartitionContext>,
    /// The timers of Waiting deliveries, the stream their fires go to and
    /// the leases of their shards, where the store keeps timers.
    timers: Option<timers::Firing>,
}

impl Worker {
    /// A worker over `ports` whose workflow calls the services at `services_url`.
    ///
    /// # Errors
    /// When the HTTP client cannot be built.
    pub fn new(
        ports: &Ports,
        services_url: Url,
        services: &ServicesSettings,
        settings: WorkerSettings,
    ) -> Result<Self, ClientError> {
        // The worker's series are exposed from its start, at 0.
        metrics::global();
        let retries = RetryPolicy {
            backoff: Backoff::new(
                services.retry_initial_backoff_ms.duration(),
                services.retry_max_backoff_ms.duration(),
            ),
            redeliver_after: Some(settings.redeliver_after_failures).filter(|&n| n > 0),
        };
        let intake = Intake::new(&settings);
        let breakers = Arc::new(Breakers::new(
            BreakerSettings::from(services),
            intake.pauses(),
        ));
        let workflow = Workflow::new(
            ServiceClient::new(services_url, services, breakers)?,
            StatusWriter::new(Arc::clone(&ports.status), retries),
            Arc::clone(&ports.dead_letters),
            retries,
            settings.processing_after_ms.duration(),
            settings.redrive_per_s,
            settings.booking_lead_s.map(|lead| lead.duration()),
        );
        Ok(Self {
            consumer: Arc::clone(&ports.consumer),
            status: Arc::clone(&ports.status),
            timers: ports.timers.as_ref().map(|timers| timers::Firing {
                timers: Arc::clone(timers),
                publisher: Arc::clone(&ports.publisher),
                leases: Arc::clone(&ports.leases),
                owner: timers::owner_name(),
                expiry: settings.timer_lease_expiry_ms.duration(),
                poll: settings.timer_poll_ms.duration(),
            }),
            context: Arc::new(PartitionContext {
                workflow,
                settings,
                intake,
            }),
        })
    }

    /// Who holds the worker's intake paused, and why (for `/readyz`).
    pub fn pauses(&self) -> Pauses {
        self.context.intake.pauses().clone()
    }

    /// What the workflow has done so far; stays readable after [`Worker::run`] returns.
    pub fn tally(&self) -> Arc<workflow::Tally> {
        self.context.workflow.tally()
    }

    /// What `/readyz` asks of this worker: the status store answers and
    /// `stopping` has not fired; paused intake is listed, not fatal, and so
    /// is what `diagnostics` (the change-feed processor) report.
    pub fn readiness(
        &self,
        stopping: CancellationToken,
        diagnostics: Vec<Arc<dyn Diagnostics>>,
    ) -> impl ReadinessCheck + use<> {
        WorkerReadiness {
            status: Arc::clone(&self.status),
            pauses: self.pauses(),
            stopping,
            diagnostics,
        }
    }

    /// Consumes until `shutdown` fires, then drains every partition and checkpoints.
    ///
    /// # Errors
    /// [`BacklogExceeded`] when the backlog stayed over its limit; the worker
    /// drained and checkpointed what it could before returning it.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), BacklogExceeded> {
        tracing::info!(
            max_in_flight = self.context.settings.max_in_flight,
            rate_limit_per_s = self.context.intake.rate(),
            "The worker is consuming."
        );
        let stop = shutdown.child_token();
        let consume = consumer::run(
            Arc::clone(&self.consumer),
            Arc::clone(&self.context),
            stop.clone(),
        );
        let intake = async {
            let result = self.context.intake.run(&stop).await;
            stop.cancel();
            result
        };
        // Timers fire whatever the lead now: deliveries recorded Waiting
        // under an earlier one still run at their time.
        let timers = async {
            if let Some(firing) = &self.timers {
                timers::fire(firing.clone(), stop.clone()).await;
            }
        };
        let ((), (), result) = tokio::join!(consume, timers, intake);
        tracing::info!(counters = %self.context.workflow.tally(), "The worker stopped.");
        result
    }
}

#[derive(Debug)]
struct WorkerReadiness {
    status: Arc<dyn StatusStore>,
    pauses: Pauses,
    stopping: CancellationToken,
    diagnostics: Vec<Arc<dyn Diagnostics>>,
}

#[async_trait]
impl ReadinessCheck for WorkerReadiness {
    async fn check(&self) -> Result<Vec<String>, String> {
        if self.stopping.is_cancelled() {
            return Err("the worker is stopping".into());
        }
        if !self.status.ready().await {
            return Err("not ready: status store unavailable".into());
        }
        let mut degraded = self.pauses.degraded();
        degraded.extend(self.diagnostics.iter().flat_map(|d| d.degraded()));
        Ok(degraded)
    }

    fn details(&self) -> BTreeMap<String, Value> {
        details_of(&self.diagnostics)
    }

    async fn inspect(&self, path: &str, query: &ReportQuery) -> Option<Result<Value, ReportError>> {
        inspect_parts(&self.diagnostics, path, query).await
    }
}
