//! Skyport's worker: consumes the stream, runs the five-step workflow for every
//! event with at-least-once checkpointing, and writes each outcome to the
//! status store. Also home of the simulated backend services.
//!
//! Library + thin binary: [`Worker::new`] wires the ports to the workflow,
//! [`Worker::run`] consumes until the shutdown token fires and then drains.

pub mod consumer;
pub mod simulator;
pub mod workflow;

use std::sync::Arc;

use skyport_shared::adapters::Backends;
use skyport_shared::config::{ServicesSettings, WorkerSettings};
use tokio_util::sync::CancellationToken;
use url::Url;

use crate::workflow::Workflow;
use crate::workflow::backoff::Backoff;
use crate::workflow::client::ServiceClient;
use crate::workflow::status::StatusWriter;

/// The worker, ready to run.
#[derive(Debug)]
pub struct Worker {
    backends: Backends,
    workflow: Arc<Workflow>,
    settings: WorkerSettings,
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
        let workflow = Workflow::new(
            ServiceClient::new(services_url, services)?,
            StatusWriter::new(Arc::clone(&backends.status), backoff),
            Arc::clone(&backends.dead_letters),
            backoff,
        );
        Ok(Self {
            backends,
            workflow: Arc::new(workflow),
            settings,
        })
    }

    /// What the workflow has done so far; stays readable after [`Worker::run`] returns.
    pub fn counters(&self) -> Arc<workflow::Counters> {
        self.workflow.counters()
    }

    /// Consumes until `shutdown` fires, then drains every partition and checkpoints.
    pub async fn run(self, shutdown: CancellationToken) {
        tracing::info!(
            max_in_flight = self.settings.max_in_flight,
            "The worker is consuming."
        );
        consumer::run(
            Arc::clone(&self.backends.consumer),
            Arc::clone(&self.workflow),
            self.settings.clone(),
            shutdown,
        )
        .await;
        tracing::info!(counters = %self.workflow.counters(), "The worker stopped.");
    }
}
