//! The timers of Waiting deliveries on the SDK's in-memory emulator: set
//! beside the status write, read when due in order and by shard, removed
//! once fired unless moved, and found from the documents when lost.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use skyport_core::ports::{Due, Precondition, StatusStore, Timers, shard_of};
use skyport_core::status::{DeliveryState, StatusDocument};
use skyport_runtime::config::{CosmosSettings, Millis};
use time::{Duration, OffsetDateTime};

use crate::cosmos::CosmosStore;
use crate::cosmos::emulator::Emulator;

const SHARDS: u32 = 4;

async fn open() -> Arc<CosmosStore> {
    let settings = CosmosSettings {
        bulk_max_wait_ms: Millis::new(5),
        timer_shards: SHARDS,
        ..CosmosSettings::default()
    };
    Emulator::new(false)
        .unwrap()
        .store(&settings)
        .await
        .unwrap()
}

fn waiting(id: &str, runs_at: OffsetDateTime) -> StatusDocument {
    let mut document = StatusDocument::accepted(id, OffsetDateTime::now_utc());
    document.state = DeliveryState::Waiting;
    document.runs_at = Some(runs_at);
    document
}

/// Every due timer of every shard, up to `up_to`.
async fn due(store: &CosmosStore, up_to: OffsetDateTime) -> Vec<Due> {
    let mut all = Vec::new();
    for shard in 0..SHARDS {
        all.extend(store.due(shard, None, up_to, 100).await.unwrap());
    }
    all
}

#[tokio::test]
async fn a_waiting_write_sets_its_timer_in_its_shard_read_in_order_when_due() {
    let store = open().await;
    let now = OffsetDateTime::now_utc();
    let mut etags = Vec::new();
    for i in 0..20 {
        let document = waiting(&format!("d-{i:02}"), now + Duration::seconds(i - 10));
        etags.push(
            store
                .put(&document, Precondition::IfNoneMatch)
                .await
                .unwrap(),
        );
    }
    let ready = due(&store, now).await;
    assert_eq!(ready.len(), 11, "{ready:?}");
    assert!(
        ready
            .iter()
            .all(|due| due.runs_at <= now && due.version.is_some())
    );
    for shard in 0..SHARDS {
        let page = store
            .due(shard, None, now + Duration::hours(1), 100)
            .await
            .unwrap();
        assert!(
            page.iter()
                .all(|d| shard_of(&d.delivery_id, SHARDS) == shard)
        );
        assert!(
            page.windows(2).all(|w| w[0].runs_at <= w[1].runs_at),
            "in order"
        );
        // Paged: after the first, the rest.
        if let Some(first) = page.first() {
            let rest = store
                .due(shard, Some(first), now + Duration::hours(1), 100)
                .await
                .unwrap();
            assert_eq!(rest, page[1..]);
        }
    }
    let counted: u64 = {
        let mut sum = 0;
        for shard in 0..SHARDS {
            sum += store.waiting(shard).await.unwrap();
        }
        sum
    };
    assert_eq!(counted, 20);
    // A document leaving Waiting writes no timer; a new one never Waiting has none.
    let other = StatusDocument::accepted("d-plain", now);
    store.put(&other, Precondition::IfNoneMatch).await.unwrap();
    assert_eq!(due(&store, now + Duration::hours(1)).await.len(), 20);
}

#[tokio::test]
async fn a_fired_timer_goes_unless_it_moved_since() {
    let store = open().await;
    let now = OffsetDateTime::now_utc();
    let document = waiting("d-moved", now - Duration::seconds(1));
    let etag = store
        .put(&document, Precondition::IfNoneMatch)
        .await
        .unwrap();
    let gone = waiting("d-gone", now - Duration::seconds(1));
    store.put(&gone, Precondition::IfNoneMatch).await.unwrap();
    let fired = due(&store, now).await;
    assert_eq!(fired.len(), 2);
    // A reschedule moves d-moved's timer before the fire is acknowledged.
    let mut moved = document.clone();
    moved.revision = 1;
    moved.runs_at = Some(now + Duration::hours(1));
    store
        .put(&moved, Precondition::IfMatch(etag))
        .await
        .unwrap();
    for due in &fired {
        let shard = shard_of(&due.delivery_id, SHARDS);
        store.fired(shard, std::slice::from_ref(due)).await.unwrap();
    }
    assert!(due(&store, now).await.is_empty());
    let later = due(&store, now + Duration::hours(2)).await;
    assert_eq!(later.len(), 1, "{later:?}");
    assert_eq!(
        (later[0].delivery_id.as_str(), later[0].revision),
        ("d-moved", 1)
    );
    // Acknowledging a fire twice, or one with no version, is harmless.
    let shard = shard_of("d-gone", SHARDS);
    store.fired(shard, &fired).await.unwrap();
    let unversioned = Due {
        version: None,
        ..later[0].clone()
    };
    store
        .fired(shard_of("d-moved", SHARDS), &[unversioned])
        .await
        .unwrap();
    assert!(due(&store, now + Duration::hours(2)).await.is_empty());
}

#[tokio::test]
async fn a_lost_timer_is_found_from_its_waiting_document_once_overdue() {
    let store = open().await;
    let now = OffsetDateTime::now_utc();
    let lost = waiting("d-lost", now - Duration::minutes(20));
    let etag = store.put(&lost, Precondition::IfNoneMatch).await.unwrap();
    let recent = waiting("d-recent", now - Duration::minutes(1));
    store.put(&recent, Precondition::IfNoneMatch).await.unwrap();
    // Its timer is lost (fired and removed, say, with no event to show for it).
    let fired = due(&store, now).await;
    for due in &fired {
        store
            .fired(
                shard_of(&due.delivery_id, SHARDS),
                std::slice::from_ref(due),
            )
            .await
            .unwrap();
    }
    let overdue = store
        .overdue(now - Duration::minutes(10), 100)
        .await
        .unwrap();
    assert_eq!(overdue.len(), 1, "{overdue:?}");
    assert_eq!(overdue[0].delivery_id, "d-lost");
    assert_eq!(overdue[0].version, None);
    assert_eq!(
        overdue[0].runs_at.unix_timestamp(),
        (now - Duration::minutes(20)).unix_timestamp()
    );
    // Once it runs, it is no longer overdue.
    let mut running = lost;
    running.state = DeliveryState::Processing;
    store
        .put(&running, Precondition::IfMatch(etag))
        .await
        .unwrap();
    let left = store.overdue(now, 100).await.unwrap();
    let left: Vec<&str> = left.iter().map(|d| d.delivery_id.as_str()).collect();
    assert_eq!(left, ["d-recent"]);
}
