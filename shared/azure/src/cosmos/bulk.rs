//! Bulk-style dispatch, the way Cosmos DB's bulk mode batches writes.
//!
//! Writes queue per logical partition (their partition key). A queue is
//! flushed as one batch when it holds `max_items` writes or when its oldest
//! write has waited `max_wait`; batches run concurrently, at most
//! `max_in_flight` at once, and a key never has two batches in flight, so the
//! writes of one key keep their order. Every write gets its own result.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tokio_util::time::{DelayQueue, delay_queue};

/// When queues are flushed and how many batches may run at once.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BulkSettings {
    pub max_items: usize,
    pub max_wait: Duration,
    pub max_in_flight: usize,
}

/// Runs one batch: the writes of one key, in order, one result each.
pub(crate) trait Executor<Op, Out>: Send + Sync + 'static {
    fn execute(
        &self,
        key: String,
        ops: Vec<Op>,
    ) -> Pin<Box<dyn Future<Output = Vec<Out>> + Send + '_>>;
}

struct Pending<Op, Out> {
    key: String,
    op: Op,
    reply: oneshot::Sender<Out>,
}

/// The handle writers submit through; the dispatcher runs until [`Bulk::close`].
#[derive(Debug)]
pub(crate) struct Bulk<Op, Out> {
    submit: mpsc::Sender<Pending<Op, Out>>,
}

impl<Op, Out> std::fmt::Debug for Pending<Op, Out> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pending")
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

/// The dispatcher went away before answering (the store is shutting down).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the bulk dispatcher is closed")]
pub(crate) struct Closed;

impl<Op: Send + 'static, Out: Send + 'static> Bulk<Op, Out> {
    /// Starts the dispatcher; it stops when `shutdown` fires, after running what is queued.
    pub(crate) fn start(
        settings: BulkSettings,
        executor: Arc<dyn Executor<Op, Out>>,
        shutdown: CancellationToken,
    ) -> (Self, tokio::task::JoinHandle<()>) {
        let (submit, receive) = mpsc::channel(settings.max_items.max(1) * 64);
        let dispatcher = Dispatcher {
            settings,
            executor,
            queues: HashMap::new(),
            busy: HashSet::new(),
            timers: DelayQueue::new(),
            permits: Arc::new(Semaphore::new(settings.max_in_flight.max(1))),
            batches: JoinSet::new(),
        };
        let task = tokio::spawn(dispatcher.run(receive, shutdown));
        (Self { submit }, task)
    }

    /// Queues `op` under `key` and waits for its result.
    ///
    /// # Errors
    /// [`Closed`] when the dispatcher stopped first.
    pub(crate) async fn submit(&self, key: String, op: Op) -> Result<Out, Closed> {
        let (reply, answer) = oneshot::channel();
        self.submit
            .send(Pending { key, op, reply })
            .await
            .map_err(|_| Closed)?;
        answer.await.map_err(|_| Closed)
    }
}

struct Queue<Op, Out> {
    items: Vec<Pending<Op, Out>>,
    timer: Option<delay_queue::Key>,
}

struct Dispatcher<Op, Out> {
    settings: BulkSettings,
    executor: Arc<dyn Executor<Op, Out>>,
    queues: HashMap<String, Queue<Op, Out>>,
    /// Keys with a batch in flight.
    busy: HashSet<String>,
    /// Keys whose oldest write is waiting for `max_wait`.
    timers: DelayQueue<String>,
    permits: Arc<Semaphore>,
    batches: JoinSet<String>,
}

impl<Op: Send + 'static, Out: Send + 'static> Dispatcher<Op, Out> {
    async fn run(
        mut self,
        mut receive: mpsc::Receiver<Pending<Op, Out>>,
        shutdown: CancellationToken,
    ) {
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                pending = receive.recv() => match pending {
                    Some(pending) => self.enqueue(pending),
                    None => break,
                },
                Some(expired) = std::future::poll_fn(|cx| self.timers.poll_expired(cx)), if !self.timers.is_empty() => {
                    let key = expired.into_inner();
                    if let Some(queue) = self.queues.get_mut(&key) {
                        queue.timer = None;
                    }
                    self.flush(&key);
                }
                Some(done) = self.batches.join_next(), if !self.batches.is_empty() => {
                    if let Ok(key) = done {
                        self.busy.remove(&key);
                        self.flush_if_due(&key);
                    }
                }
            }
        }
        // Shutting down: run whatever is queued now, then wait for every batch.
        receive.close();
        while let Ok(pending) = receive.try_recv() {
            self.enqueue(pending);
        }
        loop {
            let keys: Vec<String> = self.queues.keys().cloned().collect();
            for key in keys {
                self.flush(&key);
            }
            match self.batches.join_next().await {
                Some(Ok(key)) => {
                    self.busy.remove(&key);
                }
                Some(Err(_)) => {}
                None if self.queues.is_empty() => return,
                None => {}
            }
        }
    }

    fn enqueue(&mut self, pending: Pending<Op, Out>) {
        let key = pending.key.clone();
        let queue = self.queues.entry(key.clone()).or_insert_with(|| Queue {
            items: Vec::new(),
            timer: None,
        });
        queue.items.push(pending);
        if queue.timer.is_none() && queue.items.len() == 1 {
            queue.timer = Some(self.timers.insert(key.clone(), self.settings.max_wait));
        }
        if queue.items.len() >= self.settings.max_items {
            self.flush(&key);
        }
    }

    /// Flushes `key` if its queue is full or its oldest write has waited long enough.
    fn flush_if_due(&mut self, key: &str) {
        let due = self
            .queues
            .get(key)
            .is_some_and(|q| q.items.len() >= self.settings.max_items || q.timer.is_none());
        if due {
            self.flush(key);
        }
    }

    /// Starts a batch of `key`'s queued writes, unless one is already in flight
    /// (then the queue waits for it, keeping the key's order).
    fn flush(&mut self, key: &str) {
        if self.busy.contains(key) {
            return;
        }
        let Some(mut queue) = self.queues.remove(key) else {
            return;
        };
        if let Some(timer) = queue.timer.take() {
            self.timers.remove(&timer);
        }
        let take = queue.items.len().min(self.settings.max_items);
        let rest: Vec<_> = queue.items.split_off(take);
        if !rest.is_empty() {
            let timer = self.timers.insert(key.to_owned(), self.settings.max_wait);
            self.queues.insert(
                key.to_owned(),
                Queue {
                    items: rest,
                    timer: Some(timer),
                },
            );
        }
        let (ops, replies): (Vec<Op>, Vec<oneshot::Sender<Out>>) =
            queue.items.into_iter().map(|p| (p.op, p.reply)).unzip();
        self.busy.insert(key.to_owned());
        let executor = Arc::clone(&self.executor);
        let permits = Arc::clone(&self.permits);
        let key = key.to_owned();
        self.batches.spawn(async move {
            let _permit = permits.acquire_owned().await;
            let results = executor.execute(key.clone(), ops).await;
            for (reply, result) in replies.into_iter().zip(results) {
                // A writer that stopped waiting is no reason to fail the others.
                let _ = reply.send(result);
            }
            key
        });
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// Records every batch and how many ran at once.
    #[derive(Default)]
    struct Recorder {
        batches: Mutex<Vec<(String, Vec<u32>)>>,
        running: AtomicUsize,
        most_at_once: AtomicUsize,
        delay: Duration,
    }

    impl Executor<u32, u32> for Recorder {
        fn execute(
            &self,
            key: String,
            ops: Vec<u32>,
        ) -> Pin<Box<dyn Future<Output = Vec<u32>> + Send + '_>> {
            Box::pin(async move {
                let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
                self.most_at_once.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(self.delay).await;
                self.running.fetch_sub(1, Ordering::SeqCst);
                self.batches
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push((key, ops.clone()));
                ops.into_iter().map(|op| op * 10).collect()
            })
        }
    }

    fn settings() -> BulkSettings {
        BulkSettings {
            max_items: 3,
            max_wait: Duration::from_secs(1),
            max_in_flight: 2,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_queue_flushes_at_once_and_each_write_gets_its_result() {
        let recorder = Arc::new(Recorder::default());
        let (bulk, _task) = Bulk::start(settings(), recorder.clone(), CancellationToken::new());
        let bulk = Arc::new(bulk);
        let started = tokio::time::Instant::now();
        let writes: Vec<_> = (1..=3)
            .map(|op| {
                let bulk = Arc::clone(&bulk);
                tokio::spawn(async move { bulk.submit("k".into(), op).await })
            })
            .collect();
        for (op, write) in (1..=3).zip(writes) {
            assert_eq!(write.await.expect("joins"), Ok(op * 10));
        }
        assert!(
            started.elapsed() < Duration::from_millis(10),
            "no waiting for a full queue"
        );
        let batches = recorder.batches.lock().expect("lock").clone();
        assert_eq!(batches.len(), 1);
        assert_eq!(batches[0].1.len(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lone_write_waits_for_max_wait() {
        let recorder = Arc::new(Recorder::default());
        let (bulk, _task) = Bulk::start(settings(), recorder, CancellationToken::new());
        let started = tokio::time::Instant::now();
        assert_eq!(bulk.submit("k".into(), 7).await, Ok(70));
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_secs(1) && waited < Duration::from_millis(1010),
            "{waited:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn keys_batch_apart_and_in_flight_batches_are_bounded() {
        let recorder = Arc::new(Recorder {
            delay: Duration::from_millis(100),
            ..Recorder::default()
        });
        let (bulk, _task) = Bulk::start(settings(), recorder.clone(), CancellationToken::new());
        let bulk = Arc::new(bulk);
        let mut writes = JoinSet::new();
        for key in ["a", "b", "c", "d"] {
            for op in 0..3 {
                let bulk = Arc::clone(&bulk);
                writes.spawn(async move { bulk.submit(key.into(), op).await });
            }
        }
        while let Some(result) = writes.join_next().await {
            assert!(result.expect("joins").is_ok());
        }
        let batches = recorder.batches.lock().expect("lock").clone();
        assert_eq!(batches.len(), 4, "{batches:?}");
        assert!(batches.iter().all(|(_, ops)| ops.len() == 3));
        assert_eq!(recorder.most_at_once.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn one_key_never_has_two_batches_in_flight() {
        let recorder = Arc::new(Recorder {
            delay: Duration::from_millis(100),
            ..Recorder::default()
        });
        let (bulk, _task) = Bulk::start(settings(), recorder.clone(), CancellationToken::new());
        let bulk = Arc::new(bulk);
        let mut writes = JoinSet::new();
        for op in 0..7 {
            let bulk = Arc::clone(&bulk);
            writes.spawn(async move { bulk.submit("k".into(), op).await });
            tokio::task::yield_now().await;
        }
        while let Some(result) = writes.join_next().await {
            assert!(result.expect("joins").is_ok());
        }
        assert_eq!(recorder.most_at_once.load(Ordering::SeqCst), 1);
        let ops: Vec<u32> = recorder
            .batches
            .lock()
            .expect("lock")
            .iter()
            .flat_map(|(_, ops)| ops.clone())
            .collect();
        assert_eq!(
            ops,
            (0..7).collect::<Vec<_>>(),
            "the key's writes kept their order"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn shutting_down_runs_what_is_queued() {
        let recorder = Arc::new(Recorder::default());
        let shutdown = CancellationToken::new();
        let (bulk, task) = Bulk::start(settings(), recorder, shutdown.clone());
        let write = tokio::spawn(async move { bulk.submit("k".into(), 1).await });
        tokio::task::yield_now().await;
        shutdown.cancel();
        assert_eq!(write.await.expect("joins"), Ok(10));
        task.await.expect("the dispatcher stops");
    }
}
