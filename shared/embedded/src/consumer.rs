//! The embedded stream's consumer side: one consumer owns every partition and
//! reads each from just after its group's checkpoint.
//!
//! Readers see only committed events: a partition's head moves after the
//! commit that made its events durable. They read the log's segments
//! directly ([`crate::log`]), never waiting for its writer.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use tokio::sync::watch;

use skyport_core::ports::{ConsumeError, Consumer, PartitionReader, StreamEvent};

use crate::store::EmbeddedStore;

/// A consumer in one group that is assigned every partition of the store.
#[derive(Debug)]
pub struct EmbeddedConsumer {
    store: Arc<EmbeddedStore>,
    group: String,
    unassigned: Mutex<VecDeque<u32>>,
}

impl EmbeddedConsumer {
    /// A consumer in `group` of every partition of `store`.
    pub fn new(store: Arc<EmbeddedStore>, group: &str) -> Self {
        let unassigned = (0..store.partitions()).collect();
        Self {
            store,
            group: group.to_owned(),
            unassigned: Mutex::new(unassigned),
        }
    }
}

#[async_trait]
impl Consumer for EmbeddedConsumer {
    async fn next_partition(&self) -> Result<Box<dyn PartitionReader>, ConsumeError> {
        let next = self
            .unassigned
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop_front();
        // One process owns the embedded store, so partitions are never taken away or added.
        let Some(partition) = next else {
            return std::future::pending().await;
        };
        let checkpoint = self
            .store
            .checkpoints(&self.group)
            .into_iter()
            .find_map(|(p, offset)| (p == partition).then_some(offset));
        let next = checkpoint.map_or(0, |c| c + 1);
        let head = self.store.head(partition);
        tracing::info!(
            partition,
            from_offset = next,
            backlog = head.borrow().saturating_sub(next),
            "Assigned a partition."
        );
        Ok(Box::new(EmbeddedPartitionReader {
            store: Arc::clone(&self.store),
            group: self.group.clone(),
            partition,
            next,
            head,
        }))
    }
}

#[derive(Debug)]
struct EmbeddedPartitionReader {
    store: Arc<EmbeddedStore>,
    group: String,
    partition: u32,
    next: u64,
    head: watch::Receiver<u64>,
}

#[async_trait]
impl PartitionReader for EmbeddedPartitionReader {
    fn partition(&self) -> u32 {
        self.partition
    }

    async fn next_batch(&mut self, max: usize) -> Result<Vec<StreamEvent>, ConsumeError> {
        loop {
            let head = *self.head.borrow_and_update();
            if self.next < head {
                let end = head.min(self.next.saturating_add(max.max(1) as u64));
                let events = self.read(self.next, end).await?;
                // Entries below the group's checkpoint may have been deleted; skip past them.
                self.next = events.last().map_or(end, |e| e.offset + 1);
                if !events.is_empty() {
                    return Ok(events);
                }
                continue;
            }
            if self.head.changed().await.is_err() {
                return Err(ConsumeError::Unavailable(
                    "the embedded store is closed".into(),
                ));
            }
        }
    }

    fn unread(&self) -> Option<u64> {
        Some(self.head.borrow().saturating_sub(self.next))
    }

    async fn checkpoint(&mut self, offset: u64) -> Result<(), ConsumeError> {
        self.store
            .log
            .checkpoint(&self.group, self.partition, offset)
            .await
            .map_err(|e| ConsumeError::Unavailable(Box::new(e)))
    }
}

impl EmbeddedPartitionReader {
    async fn read(&self, from: u64, to: u64) -> Result<Vec<StreamEvent>, ConsumeError> {
        let stream = self.store.stream();
        let partition = self.partition;
        tokio::task::spawn_blocking(move || stream.read(partition, from, to))
            .await
            .map_err(|e| ConsumeError::Unavailable(Box::new(e)))?
            .map_err(|e| ConsumeError::Unavailable(Box::new(e)))
    }
}
