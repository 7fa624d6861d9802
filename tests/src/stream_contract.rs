//! The partition-reader contract: what every `PartitionReader` must do, as
//! one suite run against each stream (the embedded log, Kafka and Event
//! Hubs). Each check runs on a lane of its own (a store, topic or hub that
//! nothing else touches), is bounded in time, and names the stream in every
//! failure.
//!
//! The checks: `next_batch` is cancel-safe (dropped while waiting, or while
//! events arrive, it loses and repeats nothing); `max` bounds every batch
//! and `max = 0` answers an empty batch at once; `rewind` reads again from
//! exactly its offset; checkpoints are idempotent, never move back, and a
//! new reader starts right after the highest; pausing loses nothing;
//! `unread`, where told, counts what waits, from the checkpoint for a new
//! reader; and a partition taken over by a
//! second consumer answers `Revoked`, takes a final checkpoint, and its new
//! owner skips nothing after it ([`Handover`] says how far back it may
//! start). A stream without groups (the embedded log) revokes nothing.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use skyport_core::partitioning::partition_for;
use skyport_core::ports::{
    ConsumeError, Consumer, EventProperties, OutboundEvent, PartitionReader, Publisher, StreamEvent,
};
use tokio::time::Instant;

/// How long one check may take, joins and rebalances included.
const CHECK_TIMEOUT: Duration = Duration::from_secs(180);
/// How long a reader may take to hand out what was published.
const READ_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a reader is watched to see that nothing more comes.
const QUIET: Duration = Duration::from_millis(750);

/// Every lane the suite asks for, with its partition count, so that a
/// fixture whose lanes must exist up front (hubs) can create them all.
pub const LANES: &[(&str, u32)] = &[
    ("contract-cancel", 1),
    ("contract-max", 1),
    ("contract-rewind", 1),
    ("contract-checkpoint", 1),
    ("contract-pause", 1),
    ("contract-unread", 1),
    ("contract-revocation", 2),
];

/// What a new owner of a revoked partition reads first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handover {
    /// Exactly the event after the old owner's final checkpoint: the
    /// revocation waits for it (Kafka's cooperative rebalance).
    AfterFinalCheckpoint,
    /// The event after the checkpoint the new owner found when it claimed
    /// the partition, which may be earlier than the old owner's final one
    /// (Event Hubs: ownership moves first, at-least-once).
    AtOrBeforeFinalCheckpoint,
}

/// A stream the contract runs on.
#[async_trait]
pub trait StreamFixture: Send + Sync {
    /// The stream's name, in every failure message.
    fn stream(&self) -> &'static str;

    /// How partitions move between consumers of one group; `None` when one
    /// consumer owns every partition and nothing ever revokes them.
    fn handover(&self) -> Option<Handover>;

    /// A lane named `name` with `partitions` partitions (one of [`LANES`]):
    /// nothing published to it, no checkpoint in its group.
    async fn lane(&self, name: &str, partitions: u32) -> Box<dyn Lane>;
}

/// A store, topic or hub of the stream under test, and its consumer group.
pub trait Lane: Send + Sync {
    /// How many partitions the lane has (numbered from 0 for the worker).
    fn partitions(&self) -> u32;

    /// Appends to the lane's partitions, routed by key.
    fn publisher(&self) -> Arc<dyn Publisher>;

    /// A new member of the lane's consumer group.
    fn consumer(&self) -> Arc<dyn Consumer>;
}

/// Runs every check on `fixture`.
///
/// # Panics
/// On the first check the stream fails, naming the stream and the check.
pub async fn partition_reader_contract(fixture: &dyn StreamFixture) {
    timed(
        fixture,
        "next_batch is cancel-safe",
        next_batch_is_cancel_safe(fixture),
    )
    .await;
    timed(
        fixture,
        "max bounds the batch",
        max_bounds_the_batch(fixture),
    )
    .await;
    timed(
        fixture,
        "rewind reads again from the offset",
        rewind_reads_again_from_the_offset(fixture),
    )
    .await;
    timed(
        fixture,
        "checkpoints are idempotent and never move back",
        checkpoints_are_idempotent_and_never_move_back(fixture),
    )
    .await;
    timed(
        fixture,
        "a paused reader loses nothing",
        a_paused_reader_loses_nothing(fixture),
    )
    .await;
    timed(
        fixture,
        "unread follows what is published and read",
        unread_follows_what_is_published_and_read(fixture),
    )
    .await;
    timed(
        fixture,
        "a revoked reader says so",
        a_revoked_reader_says_so(fixture),
    )
    .await;
}

/// Runs one check within [`CHECK_TIMEOUT`].
async fn timed(fixture: &dyn StreamFixture, name: &str, check: impl Future<Output = ()>) {
    let started = Instant::now();
    tokio::time::timeout(CHECK_TIMEOUT, check)
        .await
        .unwrap_or_else(|_| {
            panic!(
                "{}: the check `{name}` did not finish within {CHECK_TIMEOUT:?}",
                fixture.stream()
            )
        });
    println!(
        "{}: `{name}` passed in {:?}",
        fixture.stream(),
        started.elapsed()
    );
}

fn partitions_of(lane: &str) -> u32 {
    LANES
        .iter()
        .find_map(|(name, partitions)| (*name == lane).then_some(*partitions))
        .unwrap_or_else(|| panic!("{lane} is not one of the contract's lanes"))
}

/// The lane named `name`, and a reader of its partition 0 from a new consumer.
async fn open(
    fixture: &dyn StreamFixture,
    name: &str,
) -> (Box<dyn Lane>, Arc<dyn Consumer>, Box<dyn PartitionReader>) {
    let lane = fixture.lane(name, partitions_of(name)).await;
    let consumer = lane.consumer();
    let reader = reader_of(fixture, consumer.as_ref(), 0).await;
    (lane, consumer, reader)
}

/// The reader `consumer` is handed for `partition` (the first it is handed
/// when the lane has one partition).
async fn reader_of(
    fixture: &dyn StreamFixture,
    consumer: &dyn Consumer,
    partition: u32,
) -> Box<dyn PartitionReader> {
    let reader = tokio::time::timeout(READ_TIMEOUT, consumer.next_partition())
        .await
        .unwrap_or_else(|_| {
            panic!(
                "{}: no partition handed out within {READ_TIMEOUT:?}",
                fixture.stream()
            )
        })
        .unwrap_or_else(|e| panic!("{}: next_partition failed: {e}", fixture.stream()));
    assert_eq!(
        reader.partition(),
        partition,
        "{}: the reader is of the only partition",
        fixture.stream()
    );
    reader
}

/// Gives the partition up in order: the reader dropped, then the consumer stopped.
async fn close(reader: Box<dyn PartitionReader>, consumer: Arc<dyn Consumer>) {
    drop(reader);
    consumer.stop().await;
}

/// A key that the stream routes to `partition` of `partitions`.
fn key_for(partition: u32, partitions: u32, n: usize) -> String {
    (n..)
        .map(|i| format!("key-{i}"))
        .find(|key| partition_for(key, partitions) == partition)
        .unwrap_or_else(|| unreachable!("some key lands on every partition"))
}

/// Publishes `count` events to `partition`, one after the other, and
/// returns their payloads in order.
async fn publish(
    fixture: &dyn StreamFixture,
    lane: &dyn Lane,
    partition: u32,
    tag: &str,
    count: usize,
) -> Vec<Bytes> {
    let partitions = lane.partitions();
    let publisher = lane.publisher();
    let key = key_for(partition, partitions, 0);
    let mut payloads = Vec::with_capacity(count);
    for n in 0..count {
        let payload = Bytes::from(format!("{tag}-{n}"));
        let position = publisher
            .publish(OutboundEvent {
                key: key.clone(),
                payload: payload.clone(),
                properties: EventProperties::default(),
                lane: skyport_core::ports::Lane::Normal,
            })
            .await
            .unwrap_or_else(|e| panic!("{}: cannot publish: {e}", fixture.stream()));
        assert_eq!(
            position.partition,
            partition,
            "{}: the key's partition",
            fixture.stream()
        );
        payloads.push(payload);
    }
    payloads
}

/// Reads until `count` events have come, in batches of at most `max`, and
/// then watches the reader for [`QUIET`] to see that nothing more comes.
async fn read_exactly(
    fixture: &dyn StreamFixture,
    reader: &mut Box<dyn PartitionReader>,
    count: usize,
    max: usize,
) -> Vec<StreamEvent> {
    let read = read_first(fixture, reader, count, max).await;
    assert_quiet(fixture, reader).await;
    read
}

/// Reads the first `count` events of those waiting, in batches of at most `max`.
async fn read_first(
    fixture: &dyn StreamFixture,
    reader: &mut Box<dyn PartitionReader>,
    count: usize,
    max: usize,
) -> Vec<StreamEvent> {
    let deadline = Instant::now() + READ_TIMEOUT;
    let mut read = Vec::with_capacity(count);
    while read.len() < count {
        let asked = max.min(count - read.len());
        let batch = tokio::time::timeout_at(deadline, reader.next_batch(asked))
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "{}: {} of {count} events read within {READ_TIMEOUT:?}",
                    fixture.stream(),
                    read.len()
                )
            })
            .unwrap_or_else(|e| panic!("{}: next_batch failed: {e}", fixture.stream()));
        assert!(
            !batch.is_empty() && batch.len() <= asked,
            "{}: a batch of {} for max {asked}",
            fixture.stream(),
            batch.len()
        );
        read.extend(batch);
    }
    read
}

/// Nothing more comes from `reader` for [`QUIET`].
async fn assert_quiet(fixture: &dyn StreamFixture, reader: &mut Box<dyn PartitionReader>) {
    if let Ok(more) = tokio::time::timeout(QUIET, reader.next_batch(100)).await {
        panic!(
            "{}: more than was published came: {:?}",
            fixture.stream(),
            more.map(|batch| payloads(&batch))
        );
    }
}

fn payloads(events: &[StreamEvent]) -> Vec<Bytes> {
    events.iter().map(|e| e.payload.clone()).collect()
}

fn offsets(events: &[StreamEvent]) -> Vec<u64> {
    events.iter().map(|e| e.offset).collect()
}

fn assert_in_order(fixture: &dyn StreamFixture, events: &[StreamEvent]) {
    assert!(
        events.windows(2).all(|w| w[0].offset < w[1].offset),
        "{}: offsets out of order: {:?}",
        fixture.stream(),
        offsets(events)
    );
}

/// A `next_batch` dropped while it waits on an empty partition, or while
/// events arrive, loses and repeats nothing.
async fn next_batch_is_cancel_safe(fixture: &dyn StreamFixture) {
    let stream = fixture.stream();
    let (lane, consumer, mut reader) = open(fixture, "contract-cancel").await;
    for _ in 0..3 {
        let waited = tokio::time::timeout(Duration::from_millis(200), reader.next_batch(10)).await;
        assert!(
            waited.is_err(),
            "{stream}: next_batch on an empty partition waits"
        );
    }
    let published = publish(fixture, lane.as_ref(), 0, "cancel", 5).await;
    let read = read_exactly(fixture, &mut reader, 5, 10).await;
    assert_eq!(
        payloads(&read),
        published,
        "{stream}: after dropped waits, every event once, in order"
    );
    assert_in_order(fixture, &read);

    let publishing = {
        let (publisher, key) = (lane.publisher(), key_for(0, lane.partitions(), 0));
        async move {
            let mut published = Vec::new();
            for n in 0..60 {
                let payload = Bytes::from(format!("arriving-{n}"));
                publisher
                    .publish(OutboundEvent {
                        key: key.clone(),
                        payload: payload.clone(),
                        properties: EventProperties::default(),
                        lane: skyport_core::ports::Lane::Normal,
                    })
                    .await
                    .unwrap_or_else(|e| panic!("{stream}: cannot publish: {e}"));
                published.push(payload);
                if n % 7 == 0 {
                    tokio::time::sleep(Duration::from_millis(15)).await;
                }
            }
            published
        }
    };
    let reading = async {
        let deadline = Instant::now() + READ_TIMEOUT;
        let (mut read, mut dropped) = (Vec::new(), 0_u32);
        let mut wait = 1_u64;
        while read.len() < 60 && Instant::now() < deadline {
            // Waits of 1 to 9 ms: most are dropped mid-way, some while a
            // batch is being put together.
            match tokio::time::timeout(Duration::from_millis(wait), reader.next_batch(4)).await {
                Ok(batch) => read
                    .extend(batch.unwrap_or_else(|e| panic!("{stream}: next_batch failed: {e}"))),
                Err(_) => dropped += 1,
            }
            wait = wait % 9 + 1;
        }
        (read, dropped)
    };
    let (published, (read, dropped)) = tokio::join!(publishing, reading);
    assert!(
        dropped > 0,
        "{stream}: some next_batch futures were dropped"
    );
    assert_eq!(
        payloads(&read),
        published,
        "{stream}: with {dropped} next_batch futures dropped mid-way, what was read is exactly what was published"
    );
    assert_in_order(fixture, &read);
    assert_quiet(fixture, &mut reader).await;
    close(reader, consumer).await;
}

/// `next_batch(n)` hands out at most `n`; `next_batch(0)` answers an empty
/// batch at once, whether or not events wait.
async fn max_bounds_the_batch(fixture: &dyn StreamFixture) {
    let stream = fixture.stream();
    let (lane, consumer, mut reader) = open(fixture, "contract-max").await;
    let empty = tokio::time::timeout(Duration::from_secs(1), reader.next_batch(0))
        .await
        .unwrap_or_else(|_| panic!("{stream}: next_batch(0) on an empty partition answers at once"))
        .unwrap_or_else(|e| panic!("{stream}: next_batch(0) failed: {e}"));
    assert!(empty.is_empty(), "{stream}: next_batch(0) is empty");
    let published = publish(fixture, lane.as_ref(), 0, "max", 20).await;
    let first = read_first(fixture, &mut reader, 1, 1).await;
    let empty = tokio::time::timeout(Duration::from_secs(1), reader.next_batch(0))
        .await
        .unwrap_or_else(|_| panic!("{stream}: next_batch(0) answers at once"))
        .unwrap_or_else(|e| panic!("{stream}: next_batch(0) failed: {e}"));
    assert!(
        empty.is_empty(),
        "{stream}: next_batch(0) is empty even with events waiting, got {}",
        empty.len()
    );
    let rest = read_exactly(fixture, &mut reader, 19, 3).await;
    let read: Vec<StreamEvent> = first.into_iter().chain(rest).collect();
    assert_eq!(
        payloads(&read),
        published,
        "{stream}: batches of at most 3 hand out every event once, in order"
    );
    assert_in_order(fixture, &read);
    close(reader, consumer).await;
}

/// After `rewind(offset)` the next batch starts exactly at `offset` and
/// everything after it comes again, in order.
async fn rewind_reads_again_from_the_offset(fixture: &dyn StreamFixture) {
    let stream = fixture.stream();
    let (lane, consumer, mut reader) = open(fixture, "contract-rewind").await;
    let published = publish(fixture, lane.as_ref(), 0, "rewind", 10).await;
    let read = read_exactly(fixture, &mut reader, 10, 100).await;
    assert_eq!(payloads(&read), published, "{stream}: the first read");
    let offsets = offsets(&read);
    for from in [3, 8, 0] {
        reader
            .rewind(offsets[from])
            .await
            .unwrap_or_else(|e| panic!("{stream}: rewind failed: {e}"));
        let again = read_exactly(fixture, &mut reader, 10 - from, 100).await;
        assert_eq!(
            again.first().map(|e| e.offset),
            Some(offsets[from]),
            "{stream}: after rewind({}) the next batch starts there",
            offsets[from]
        );
        assert_eq!(
            payloads(&again),
            published[from..],
            "{stream}: after rewind({}) the events after it come again, in order",
            offsets[from]
        );
    }
    // A rewind in the middle of a read of fresh events.
    let more = publish(fixture, lane.as_ref(), 0, "rewind-more", 4).await;
    let first = read_first(fixture, &mut reader, 2, 2).await;
    reader
        .rewind(first[0].offset)
        .await
        .unwrap_or_else(|e| panic!("{stream}: rewind failed: {e}"));
    let again = read_exactly(fixture, &mut reader, 4, 100).await;
    assert_eq!(
        payloads(&again),
        more,
        "{stream}: a rewind past events not handed out yet reads them once"
    );
    close(reader, consumer).await;
}

/// The same checkpoint twice is fine; a lower one after a higher one does
/// not move the stored position back; a new reader starts right after the
/// highest checkpoint.
async fn checkpoints_are_idempotent_and_never_move_back(fixture: &dyn StreamFixture) {
    let stream = fixture.stream();
    let (lane, consumer, mut reader) = open(fixture, "contract-checkpoint").await;
    let published = publish(fixture, lane.as_ref(), 0, "checkpoint", 10).await;
    let read = read_exactly(fixture, &mut reader, 10, 100).await;
    let offsets = offsets(&read);
    for offset in [offsets[2], offsets[6], offsets[6], offsets[4]] {
        reader
            .checkpoint(offset)
            .await
            .unwrap_or_else(|e| panic!("{stream}: checkpoint({offset}) failed: {e}"));
    }
    close(reader, consumer).await;

    let consumer = lane.consumer();
    let mut reader = reader_of(fixture, consumer.as_ref(), 0).await;
    let resumed = read_exactly(fixture, &mut reader, 3, 100).await;
    assert_eq!(
        resumed.first().map(|e| e.offset),
        Some(offsets[7]),
        "{stream}: a new reader starts right after the highest checkpoint ({}), not after the later, lower one ({})",
        offsets[6],
        offsets[4]
    );
    assert_eq!(
        payloads(&resumed),
        published[7..],
        "{stream}: the resumed read"
    );
    reader
        .checkpoint(offsets[9])
        .await
        .unwrap_or_else(|e| panic!("{stream}: checkpoint failed: {e}"));
    close(reader, consumer).await;

    let more = publish(fixture, lane.as_ref(), 0, "checkpoint-more", 2).await;
    let consumer = lane.consumer();
    let mut reader = reader_of(fixture, consumer.as_ref(), 0).await;
    let resumed = read_exactly(fixture, &mut reader, 2, 100).await;
    assert_eq!(
        payloads(&resumed),
        more,
        "{stream}: a third reader starts right after the second one's checkpoint"
    );
    close(reader, consumer).await;
}

/// Events published while a reader is paused come after it resumes, and
/// what it held when paused is not lost.
async fn a_paused_reader_loses_nothing(fixture: &dyn StreamFixture) {
    let stream = fixture.stream();
    let (lane, consumer, mut reader) = open(fixture, "contract-pause").await;
    let mut published = publish(fixture, lane.as_ref(), 0, "before-pause", 6).await;
    let mut read = read_first(fixture, &mut reader, 2, 2).await;
    reader.set_paused(true);
    published.extend(publish(fixture, lane.as_ref(), 0, "while-paused", 6).await);
    tokio::time::sleep(QUIET).await;
    reader.set_paused(false);
    read.extend(read_exactly(fixture, &mut reader, 10, 100).await);
    assert_eq!(
        payloads(&read),
        published,
        "{stream}: pausing and resuming loses and repeats nothing"
    );
    assert_in_order(fixture, &read);
    // Paused twice, and resumed once.
    reader.set_paused(true);
    reader.set_paused(true);
    let more = publish(fixture, lane.as_ref(), 0, "paused-twice", 3).await;
    reader.set_paused(false);
    let again = read_exactly(fixture, &mut reader, 3, 100).await;
    assert_eq!(payloads(&again), more, "{stream}: after a second pause");
    close(reader, consumer).await;
}

/// Whether a reader tells `unread` is decided by its first answer (the
/// worker asks once, when the partition is assigned, and registers the lag
/// series only then), and every later answer agrees. Where it tells, it is
/// positive once events wait (before any is read too), 0 once they are all
/// handed out, and counts what is published after.
async fn unread_follows_what_is_published_and_read(fixture: &dyn StreamFixture) {
    let (lane, consumer, mut reader) = open(fixture, "contract-unread").await;
    let tells = reader.unread().is_some();
    publish(fixture, lane.as_ref(), 0, "unread", 5).await;
    if !tells {
        assert_unread(fixture, reader.as_ref(), None).await;
        read_exactly(fixture, &mut reader, 5, 100).await;
        assert_unread(fixture, reader.as_ref(), None).await;
        close(reader, consumer).await;
        return;
    }
    assert_unread(fixture, reader.as_ref(), Some(5)).await;
    read_exactly(fixture, &mut reader, 5, 100).await;
    assert_unread(fixture, reader.as_ref(), Some(0)).await;
    publish(fixture, lane.as_ref(), 0, "unread-more", 3).await;
    assert_unread(fixture, reader.as_ref(), Some(3)).await;
    let read = read_exactly(fixture, &mut reader, 3, 2).await;
    assert_unread(fixture, reader.as_ref(), Some(0)).await;
    let last = *offsets(&read).last().expect("three events read");
    reader
        .checkpoint(last)
        .await
        .unwrap_or_else(|e| panic!("{}: checkpoint({last}) failed: {e}", fixture.stream()));
    close(reader, consumer).await;

    // A new reader counts from the checkpoint, not from the partition's
    // start, before it has handed anything out.
    let consumer = lane.consumer();
    let mut reader = reader_of(fixture, consumer.as_ref(), 0).await;
    publish(fixture, lane.as_ref(), 0, "unread-resumed", 2).await;
    assert_unread(fixture, reader.as_ref(), Some(2)).await;
    read_exactly(fixture, &mut reader, 2, 2).await;
    assert_unread(fixture, reader.as_ref(), Some(0)).await;
    close(reader, consumer).await;
}

/// `unread` comes to `expected` within 10 s (a stream may learn the
/// partition's head on an interval), answering `Some` or `None` as
/// `expected` does all along; `None` is watched for a second.
async fn assert_unread(
    fixture: &dyn StreamFixture,
    reader: &dyn PartitionReader,
    expected: Option<u64>,
) {
    let stream = fixture.stream();
    let within = if expected.is_some() {
        Duration::from_secs(10)
    } else {
        Duration::from_secs(1)
    };
    let deadline = Instant::now() + within;
    loop {
        let unread = reader.unread();
        assert_eq!(
            unread.is_some(),
            expected.is_some(),
            "{stream}: unread answered {unread:?}; its first answer said it {} tell",
            if expected.is_some() {
                "does"
            } else {
                "does not"
            }
        );
        if unread == expected && (expected.is_some() || Instant::now() >= deadline) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{stream}: unread is {unread:?}, not {expected:?}, after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A second consumer in the group takes a partition over: the old reader
/// answers `Revoked` from `next_batch` (and again after), may still write a
/// final checkpoint, and the new owner loses nothing after it. On a stream
/// without groups, nothing revokes a reader.
async fn a_revoked_reader_says_so(fixture: &dyn StreamFixture) {
    let stream = fixture.stream();
    let lane = fixture.lane("contract-revocation", 2).await;
    let first = lane.consumer();
    let mut readers = Vec::new();
    for _ in 0..2 {
        let reader = tokio::time::timeout(READ_TIMEOUT, first.next_partition())
            .await
            .unwrap_or_else(|_| panic!("{stream}: both partitions handed out"))
            .unwrap_or_else(|e| panic!("{stream}: next_partition failed: {e}"));
        readers.push(reader);
    }
    readers.sort_by_key(|r| r.partition());
    let mut last = [0_u64; 2];
    for (partition, reader) in (0_u32..).zip(readers.iter_mut()) {
        let published = publish(fixture, lane.as_ref(), partition, "owned", 3).await;
        let read = read_exactly(fixture, reader, 3, 100).await;
        assert_eq!(
            payloads(&read),
            published,
            "{stream}: partition {partition}"
        );
        last[partition as usize] = read[2].offset;
        reader
            .checkpoint(read[0].offset)
            .await
            .unwrap_or_else(|e| panic!("{stream}: checkpoint failed: {e}"));
    }
    let second = lane.consumer();
    let Some(handover) = fixture.handover() else {
        // One consumer owns every partition: a second one is handed them
        // too and reads them on its own, and the first is revoked nothing.
        let other = reader_of(fixture, second.as_ref(), 0).await;
        let published = publish(fixture, lane.as_ref(), 0, "still-owned", 1).await;
        let read = read_exactly(fixture, &mut readers[0], 1, 100).await;
        assert_eq!(
            payloads(&read),
            published,
            "{stream}: a second consumer revokes nothing"
        );
        drop(other);
        drop(readers);
        second.stop().await;
        first.stop().await;
        return;
    };
    let taking = tokio::spawn({
        let second = Arc::clone(&second);
        async move { second.next_partition().await }
    });
    let (revoked, kept) = {
        let [a, b] = &mut readers[..] else {
            unreachable!("two readers")
        };
        let deadline = Instant::now() + READ_TIMEOUT;
        tokio::select! {
            answer = a.next_batch(100) => (0, answer.map(|batch| payloads(&batch))),
            answer = b.next_batch(100) => (1, answer.map(|batch| payloads(&batch))),
            () = tokio::time::sleep_until(deadline) => panic!("{stream}: no reader revoked within {READ_TIMEOUT:?} of a second consumer joining"),
        }
    };
    assert!(
        matches!(kept, Err(ConsumeError::Revoked)),
        "{stream}: the taken partition's reader answers Revoked, not {kept:?}"
    );
    let mut taken = readers.remove(revoked);
    let mut still = readers.remove(0);
    let again = tokio::time::timeout(Duration::from_secs(5), taken.next_batch(100)).await;
    assert!(
        matches!(again, Ok(Err(ConsumeError::Revoked))),
        "{stream}: a revoked reader keeps answering Revoked: {:?}",
        again.map(|a| a.map(|batch| payloads(&batch)))
    );
    let partition = taken.partition();
    taken
        .checkpoint(last[partition as usize])
        .await
        .unwrap_or_else(|e| panic!("{stream}: the final checkpoint after Revoked failed: {e}"));
    drop(taken);
    let mut new_owner = tokio::time::timeout(READ_TIMEOUT, taking)
        .await
        .unwrap_or_else(|_| panic!("{stream}: the second consumer got no partition"))
        .unwrap_or_else(|e| panic!("{stream}: {e}"))
        .unwrap_or_else(|e| panic!("{stream}: next_partition failed: {e}"));
    assert_eq!(
        new_owner.partition(),
        partition,
        "{stream}: the second consumer reads the partition taken from the first"
    );
    let published = publish(fixture, lane.as_ref(), partition, "taken", 2).await;
    let deadline = Instant::now() + READ_TIMEOUT;
    let mut read = Vec::new();
    while read
        .last()
        .is_none_or(|e: &StreamEvent| e.payload != published[1])
    {
        let batch = tokio::time::timeout_at(deadline, new_owner.next_batch(100))
            .await
            .unwrap_or_else(|_| panic!("{stream}: the new owner read {read:?} by the deadline"))
            .unwrap_or_else(|e| panic!("{stream}: the new owner's next_batch failed: {e}"));
        read.extend(batch);
    }
    assert_in_order(fixture, &read);
    let first_offset = read[0].offset;
    let after_checkpoint = last[partition as usize] + 1;
    match handover {
        Handover::AfterFinalCheckpoint => assert_eq!(
            first_offset, after_checkpoint,
            "{stream}: the new owner starts right after the old owner's final checkpoint"
        ),
        Handover::AtOrBeforeFinalCheckpoint => assert!(
            first_offset <= after_checkpoint,
            "{stream}: the new owner starts at {first_offset}, past the old owner's final checkpoint {}",
            after_checkpoint - 1
        ),
    }
    assert!(
        read.windows(2).all(|w| w[1].offset == w[0].offset + 1),
        "{stream}: the new owner skips nothing: {:?}",
        offsets(&read)
    );
    let kept = publish(fixture, lane.as_ref(), still.partition(), "kept", 1).await;
    let read = read_exactly(fixture, &mut still, 1, 100).await;
    assert_eq!(
        payloads(&read),
        kept,
        "{stream}: the partition the first consumer kept is still read"
    );
    drop(new_owner);
    drop(still);
    second.stop().await;
    first.stop().await;
}
