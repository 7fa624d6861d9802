//! Skyport's worker: consumes the stream, runs the five-step workflow for every
//! event with at-least-once checkpointing, and writes each outcome to the
//! status store. Also home of the simulated backend services.
//!
//! Library + thin binary: [`Worker::new`] wires the ports to the workflow,
//! [`Worker::run`] consumes until the shutdown token fires and then drains.

pub mod backlog;
pub mod consumer;
pub mod intake;
pub mod ops;
pub mod rate_limit;
pub mod simulator;
pub mod workflow;

use std::sync::Arc;

use skyport_shared::adapters::Backends;
use skyport_shared::config::{ServicesSettings, WorkerSettings};
use tokio_util::sync::CancellationToken;
use url::Url;

use crate::backlog::{BacklogExceeded, BacklogGuard};
use crate::consumer::Shared;
use crate::intake::Intake;
use crate::rate_limit::RateLimiter;
use crate::workflow::Workflow;
use crate::workflow::backoff::Backoff;
use crate::workflow::breaker::{BreakerSettings, Breakers};
use crate::workflow::client::ServiceClient;
use crate::workflow::status::StatusWriter;

/// The worker, ready to run.
#[derive(Debug)]
pub struct Worker {
    backends: Backends,
    shared: Arc<Shared>,
    limiter: Option<RateLimiter>,
}

impl Worker {
    /// A worker over `backends` whose workflow calls the services at `services_url`.
    ///
    /// # Errors
    /// When the HTTP client cannot be built.
    pub fn new(
        backends: Backends,
        services_url: Url,
        services: &ServicesSettings,
        settings: WorkerSettings,
    ) -> Result<Self, reqwest::Error> {
        let backoff = Backoff::new(
            services.retry_initial_backoff(),
            services.retry_max_backoff(),
        );
        let intake = Intake::default();
        let breakers = Arc::new(Breakers::new(BreakerSettings::from(services), &intake));
        let limiter =
            (settings.rate_limit_per_s > 0).then(|| RateLimiter::new(settings.rate_limit_per_s));
        let workflow = Workflow::new(
            ServiceClient::new(services_url, services, breakers)?,
            StatusWriter::new(Arc::clone(&backends.status), backoff),
            Arc::clone(&backends.dead_letters),
            backoff,
            limiter.clone(),
        );
        let shared = Shared {
            workflow: Arc::new(workflow),
            backlog: Arc::new(BacklogGuard::new(&settings)),
            settings,
            intake,
        };
        Ok(Self {
            backends,
            shared: Arc::new(shared),
            limiter,
        })
    }

    /// Whether the worker is pulling new events, and why not.
    pub fn intake(&self) -> Intake {
        self.shared.intake.clone()
    }

    /// What the workflow has done so far; stays readable after [`Worker::run`] returns.
    pub fn counters(&self) -> Arc<workflow::Counters> {
        self.shared.workflow.counters()
    }

    /// Consumes until `shutdown` fires, then drains every partition and checkpoints.
    ///
    /// # Errors
    /// [`BacklogExceeded`] when the backlog stayed over its limit; the worker
    /// drained and checkpointed what it could before returning it.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), BacklogExceeded> {
        tracing::info!(
            max_in_flight = self.shared.settings.max_in_flight,
            rate_limit_per_s = self.limiter.as_ref().map(RateLimiter::rate),
            "The worker is consuming."
        );
        let stop = shutdown.child_token();
        let consume = consumer::run(
            Arc::clone(&self.backends.consumer),
            Arc::clone(&self.shared),
            stop.clone(),
        );
        let guard = async {
            let result = self
                .shared
                .backlog
                .watch(&self.shared.intake, BACKLOG_CHECK_PERIOD, &stop)
                .await;
            stop.cancel();
            result
        };
        let refill = async {
            if let Some(limiter) = self.limiter.clone() {
                limiter.refill(stop.clone()).await;
            }
        };
        let ((), result, ()) = tokio::join!(consume, guard, refill);
        tracing::info!(counters = %self.shared.workflow.counters(), "The worker stopped.");
        result
    }
}

/// How often the backlog guard looks at the partitions.
const BACKLOG_CHECK_PERIOD: std::time::Duration = std::time::Duration::from_secs(1);
