//! The embedded stream's consumer side: one consumer owns every partition and
//! reads each from just after its group's checkpoint.
//!
//! Nothing ever revokes a partition: one process owns the store, and a
//! second consumer of the same group is handed every partition too and
//! reads it on its own. Checkpoints only move forward, and are durable when
//! `checkpoint` returns.
//!
//! Readers see only committed events: a partition's head moves after the
//! commit that made its events durable. They read the log's segments
//! directly ([`crate::log`]), never waiting for its writer.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use skyport_core::ports::{ConsumeError, Consumer, Lane, PartitionReader, StreamEvent};

use crate::log::ReadError;
use crate::store::EmbeddedStore;

/// A consumer in one group that is assigned every partition of the store,
/// the expedited lane's included.
#[derive(Debug)]
pub struct EmbeddedConsumer {
    store: Arc<EmbeddedStore>,
    group: String,
    unassigned: Mutex<VecDeque<u32>>,
}

impl EmbeddedConsumer {
    /// A consumer in `group` of every partition of `store`.
    pub fn new(store: Arc<EmbeddedStore>, group: &str) -> Self {
        let unassigned = (0..=store.expedited_partition()).collect();
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
            reading: None,
            surplus: VecDeque::new(),
        }))
    }
}

/// A read of the log under way on the blocking pool: kept by the reader, so
/// that a `next_batch` dropped while it runs (the worker's loop selects on
/// it) finds it again rather than starting another.
#[derive(Debug)]
struct Reading {
    /// Just past the last offset asked for.
    end: u64,
    task: JoinHandle<Result<Vec<StreamEvent>, ReadError>>,
}

#[derive(Debug)]
struct EmbeddedPartitionReader {
    store: Arc<EmbeddedStore>,
    group: String,
    partition: u32,
    /// The first offset not yet read (or being read).
    next: u64,
    head: watch::Receiver<u64>,
    reading: Option<Reading>,
    /// Events read beyond what the last caller could take, handed out first.
    surplus: VecDeque<StreamEvent>,
}

#[async_trait]
impl PartitionReader for EmbeddedPartitionReader {
    fn partition(&self) -> u32 {
        self.partition
    }

    fn lane(&self) -> Lane {
        self.store.lane_of(self.partition)
    }

    async fn next_batch(&mut self, max: usize) -> Result<Vec<StreamEvent>, ConsumeError> {
        if max == 0 {
            return Ok(Vec::new());
        }
        loop {
            if !self.surplus.is_empty() {
                let take = max.min(self.surplus.len());
                return Ok(self.surplus.drain(..take).collect());
            }
            let reading = match &mut self.reading {
                Some(reading) => reading,
                None => {
                    let head = *self.head.borrow_and_update();
                    if self.next >= head {
                        if self.head.changed().await.is_err() {
                            return Err(ConsumeError::Unavailable(
                                "the embedded store is closed".into(),
                            ));
                        }
                        continue;
                    }
                    let end = head.min(self.next.saturating_add(max as u64));
                    let (stream, partition, from) =
                        (self.store.stream(), self.partition, self.next);
                    self.reading.insert(Reading {
                        end,
                        task: tokio::task::spawn_blocking(move || {
                            stream.read(partition, from, end)
                        }),
                    })
                }
            };
            // Cancel-safe: dropped here, the read stays in `self.reading`.
            let joined = (&mut reading.task).await;
            let end = reading.end;
            self.reading = None;
            let events = joined
                .map_err(|e| ConsumeError::Unavailable(Box::new(e)))?
                .map_err(|e| ConsumeError::Unavailable(Box::new(e)))?;
            // Entries below the group's checkpoint may have been deleted; skip past them.
            self.next = events.last().map_or(end, |e| e.offset + 1);
            self.surplus.extend(events);
        }
    }

    fn unread(&self) -> Option<u64> {
        let surplus = self.surplus.len() as u64;
        Some(self.head.borrow().saturating_sub(self.next) + surplus)
    }

    async fn rewind(&mut self, offset: u64) -> Result<(), ConsumeError> {
        // A read under way is dropped with its task; the log keeps every
        // entry past the group's checkpoint, so `offset` can be read again.
        self.reading = None;
        self.surplus.clear();
        self.next = offset;
        Ok(())
    }

    async fn checkpoint(&mut self, offset: u64) -> Result<(), ConsumeError> {
        self.store
            .log
            .checkpoint(&self.group, self.partition, offset)
            .await
            .map_err(|e| ConsumeError::Unavailable(Box::new(e)))
    }
}
