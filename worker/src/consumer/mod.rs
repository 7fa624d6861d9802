//! Consumption: one task per assigned partition, each with its own tracker.
//!
//! The loop here only hands partitions out and waits for their tasks; all
//! per-partition bookkeeping lives in [`partition`].

pub mod partition;
mod ready;
pub mod tracker;

use std::sync::Arc;
use std::time::Duration;

use skyport_core::ports::Consumer;
use skyport_runtime::config::WorkerSettings;
use skyport_runtime::tasks::Task;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::intake::Intake;
use crate::workflow::Workflow;

/// What every partition task of one worker shares: the workflow, the
/// worker's settings and its intake control.
#[derive(Debug)]
pub struct PartitionContext {
    pub workflow: Workflow,
    pub settings: WorkerSettings,
    pub intake: Intake,
}

/// Consumes every partition the consumer assigns until `shutdown`, then waits
/// for each partition to drain and write its final checkpoint, and gives the
/// partitions up.
pub async fn run(
    consumer: Arc<dyn Consumer>,
    context: Arc<PartitionContext>,
    shutdown: CancellationToken,
) {
    let mut partitions = JoinSet::new();
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            next = consumer.next_partition() => match next {
                Ok(reader) => {
                    let span = tracing::info_span!("partition", partition = reader.partition());
                    let run = partition::run(reader, Arc::clone(&context), shutdown.clone());
                    partitions.spawn(Task::Partition.monitor().instrument(run.instrument(span)));
                }
                Err(e) => {
                    tracing::error!(error = %e, "Cannot get a partition from the stream; retrying in 1 s.");
                    tokio::select! {
                        () = shutdown.cancelled() => break,
                        () = tokio::time::sleep(Duration::from_secs(1)) => {}
                    }
                }
            },
            Some(joined) = partitions.join_next(), if !partitions.is_empty() => report(joined),
        }
    }
    while let Some(joined) = partitions.join_next().await {
        report(joined);
    }
    consumer.stop().await;
}

fn report(joined: Result<(), tokio::task::JoinError>) {
    if let Err(e) = joined {
        tracing::error!(error = %e, "A partition task failed; its events will be read again after a restart.");
    }
}
