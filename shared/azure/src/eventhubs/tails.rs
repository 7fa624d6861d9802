//! How far each partition this instance reads reaches: its first and last
//! sequence numbers, from the partition's properties, for
//! [`PartitionReader::unread`](skyport_core::ports::PartitionReader::unread).
//! A receiver learns nothing of what waits behind what it received, so a
//! task per hub asks the service, for the partitions this instance reads
//! only: once as a reader starts, then every [`TAIL_INTERVAL`].

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use azure_messaging_eventhubs::ConsumerClient;
use azure_messaging_eventhubs::models::EventHubPartitionProperties;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::hub::HubContext;
use super::namespace::Namespace;

/// How often the partitions' ends are read.
pub(crate) const TAIL_INTERVAL: Duration = Duration::from_secs(5);

/// How long opening the client or one reading may take.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// Not read yet.
const UNKNOWN: i64 = i64::MIN;

/// A partition's ends as last read.
#[derive(Debug)]
pub(crate) struct Ends {
    /// The first sequence number the partition still holds.
    first: AtomicI64,
    /// The last enqueued sequence number; below `first` when it is empty.
    last: AtomicI64,
}

impl Default for Ends {
    fn default() -> Self {
        Self {
            first: AtomicI64::new(UNKNOWN),
            last: AtomicI64::new(UNKNOWN),
        }
    }
}

impl Ends {
    /// (first, last), once read.
    pub(crate) fn read(&self) -> Option<(i64, i64)> {
        let last = self.last.load(Ordering::Acquire);
        let first = self.first.load(Ordering::Acquire);
        (last != UNKNOWN && first != UNKNOWN).then_some((first, last))
    }

    fn store(&self, properties: &EventHubPartitionProperties) {
        let first = properties.beginning_sequence_number;
        let last = if properties.is_empty {
            first.saturating_sub(1)
        } else {
            properties.last_enqueued_sequence_number
        };
        self.first.store(first, Ordering::Release);
        self.last.store(last, Ordering::Release);
    }
}

/// The ends of one hub's partitions that readers of this instance watch.
#[derive(Debug, Default)]
pub(crate) struct Tails {
    watched: Mutex<Vec<(String, Weak<Ends>)>>,
    added: Notify,
}

impl Tails {
    /// The ends of `partition_id`, read from now on while the answer is held.
    pub(crate) fn watch(&self, partition_id: &str) -> Arc<Ends> {
        let ends = Arc::new(Ends::default());
        self.watched
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((partition_id.to_owned(), Arc::downgrade(&ends)));
        self.added.notify_one();
        ends
    }

    /// The partitions still watched, forgetting the others.
    fn live(&self) -> Vec<(String, Arc<Ends>)> {
        let mut watched = self.watched.lock().unwrap_or_else(PoisonError::into_inner);
        watched.retain(|(_, ends)| ends.strong_count() > 0);
        watched
            .iter()
            .filter_map(|(id, ends)| Some((id.clone(), ends.upgrade()?)))
            .collect()
    }

    /// Reads the watched partitions' ends until `stop`, on a client of its
    /// own (the processor's is its own), reopened after a failure.
    pub(crate) async fn run(
        &self,
        namespace: &Namespace,
        context: &HubContext,
        stop: &CancellationToken,
    ) {
        let mut client: Option<ConsumerClient> = None;
        let mut ticks = tokio::time::interval(TAIL_INTERVAL);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop.cancelled() => break,
                _ = ticks.tick() => {}
                () = self.added.notified() => {}
            }
            let live = self.live();
            if live.is_empty() {
                continue;
            }
            if client.is_none() {
                // Named apart from the processor's connection, which claims
                // partitions under the owner's name.
                let name = format!("{}-ends", context.owner);
                let opened = tokio::time::timeout(
                    ANSWER_TIMEOUT,
                    namespace.consumer(&context.hub, &context.consumer_group, &name),
                )
                .await;
                match opened {
                    Ok(Ok(opened)) => client = Some(opened),
                    Ok(Err(e)) => {
                        tracing::debug!(error = %e, "Cannot open a client to read the partitions' ends; the lag waits.");
                        continue;
                    }
                    Err(_) => continue,
                }
            }
            let mut failed = false;
            if let Some(reading) = client.as_ref() {
                for (id, ends) in live {
                    let answer =
                        tokio::time::timeout(ANSWER_TIMEOUT, reading.get_partition_properties(&id))
                            .await;
                    match answer {
                        Ok(Ok(properties)) => ends.store(&properties),
                        Ok(Err(e)) => {
                            tracing::debug!(error = %e, partition = %id, "Cannot read a partition's ends; reconnecting.");
                            failed = true;
                            break;
                        }
                        Err(_) => {
                            failed = true;
                            break;
                        }
                    }
                }
            }
            if failed && let Some(broken) = client.take() {
                let _ = tokio::time::timeout(ANSWER_TIMEOUT, broken.close()).await;
            }
        }
        if let Some(client) = client {
            let _ = tokio::time::timeout(ANSWER_TIMEOUT, client.close()).await;
        }
    }
}
