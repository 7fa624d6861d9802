//! The embedded stream's consumer side: one consumer owns every partition and
//! reads each from just after its group's checkpoint.
//!
//! Readers see only committed events: a partition's head moves after the
//! commit that made its events durable.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use bytes::Bytes;
use redb::ReadableDatabase;
use tokio::sync::watch;

use skyport_core::ports::{ConsumeError, Consumer, PartitionReader, StreamEvent};

use crate::committer::{Applied, OpKind};
use crate::store::{EmbeddedStore, SubmitError, blocking};
use crate::tables::{CHECKPOINTS, LOG};

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
        let db = Arc::clone(&self.store.db);
        let group = self.group.clone();
        let checkpoint = blocking(move || {
            let txn = db.begin_read()?;
            let table = txn.open_table(CHECKPOINTS)?;
            Ok(table.get((group.as_str(), partition))?.map(|v| v.value()))
        })
        .await
        .map_err(|e| ConsumeError::Unavailable(Box::new(e)))?;
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
        let kind = OpKind::Checkpoint {
            group: self.group.clone(),
            partition: self.partition,
            offset,
        };
        match self.store.submit(kind).await {
            Ok(Applied::Done) => Ok(()),
            Ok(other) => unreachable!("a checkpoint is answered with Done, not {other:?}"),
            Err(SubmitError::Closed) => Err(ConsumeError::Unavailable(
                "the embedded store is closed".into(),
            )),
            Err(SubmitError::Failed(e)) => Err(ConsumeError::Unavailable(Box::new(e))),
        }
    }
}

impl EmbeddedPartitionReader {
    async fn read(&self, from: u64, to: u64) -> Result<Vec<StreamEvent>, ConsumeError> {
        let db = Arc::clone(&self.store.db);
        let partition = self.partition;
        blocking(move || {
            let txn = db.begin_read()?;
            let table = txn.open_table(LOG)?;
            let mut events = Vec::new();
            for entry in table.range((partition, from)..(partition, to))? {
                let (key, value) = entry?;
                events.push(StreamEvent {
                    partition,
                    offset: key.value().1,
                    payload: Bytes::copy_from_slice(value.value()),
                });
            }
            Ok(events)
        })
        .await
        .map_err(|e| ConsumeError::Unavailable(Box::new(e)))
    }
}
