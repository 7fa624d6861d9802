//! The idempotency-store contract: what every `IdempotencyStore` adapter must
//! do, as one suite run against each (the embedded store and Cosmos DB).

use std::sync::Arc;

use skyport_core::ports::{IdempotencyStore, Precondition, Reservation, Reserved, StatusStore};
use skyport_core::status::StatusDocument;
use time::{Duration, OffsetDateTime};
use tokio::task::JoinSet;

fn reservation(id: &str, fingerprint: &str, expires_in: Duration) -> Reservation {
    let now = OffsetDateTime::now_utc();
    Reservation {
        delivery_id: id.to_owned(),
        fingerprint: fingerprint.to_owned(),
        accepted_at: now,
        expires_at: now + expires_in,
    }
}

/// Runs the whole contract; ids start with `prefix` so runs do not collide.
/// The store keeps statuses too: a name stays taken while its delivery is
/// recorded.
pub async fn idempotency_store_contract<S: IdempotencyStore + StatusStore>(
    store: Arc<S>,
    prefix: &str,
) {
    let id = format!("{prefix}-held");
    let first = reservation(&id, "a", Duration::HOUR);
    assert_eq!(store.reserve(&first).await.unwrap(), Reserved::New);
    assert_eq!(
        store.reserve(&first).await.unwrap(),
        Reserved::Existing(first.clone()),
        "a retry finds its own reservation"
    );
    let other = reservation(&id, "b", Duration::HOUR);
    assert_eq!(
        store.reserve(&other).await.unwrap(),
        Reserved::Existing(first.clone()),
        "another request under the same id finds the first"
    );

    store.release(&other).await.unwrap();
    assert_eq!(
        store.reserve(&other).await.unwrap(),
        Reserved::Existing(first.clone()),
        "releasing someone else's reservation changes nothing"
    );
    store.release(&first).await.unwrap();
    assert_eq!(
        store.reserve(&other).await.unwrap(),
        Reserved::New,
        "a released id is free"
    );

    let id = format!("{prefix}-expired");
    let expired = reservation(&id, "old", -Duration::SECOND);
    assert_eq!(store.reserve(&expired).await.unwrap(), Reserved::New);
    let fresh = reservation(&id, "new", Duration::HOUR);
    assert_eq!(
        store.reserve(&fresh).await.unwrap(),
        Reserved::New,
        "an expired reservation does not hold its id"
    );
    assert_eq!(
        store.reserve(&expired).await.unwrap(),
        Reserved::Existing(fresh)
    );

    let id = format!("{prefix}-recorded");
    let lapsed = reservation(&id, "first", -Duration::SECOND);
    assert_eq!(store.reserve(&lapsed).await.unwrap(), Reserved::New);
    store
        .put(
            &StatusDocument::accepted(&id, lapsed.accepted_at),
            Precondition::IfNoneMatch,
        )
        .await
        .unwrap();
    for attempt in ["later", "again"] {
        match store
            .reserve(&reservation(&id, attempt, Duration::HOUR))
            .await
            .unwrap()
        {
            Reserved::Recorded(status) => assert_eq!(
                status.document.id, id,
                "a recorded delivery keeps its name after its reservation"
            ),
            other => panic!("a recorded name was answered {other:?}"),
        }
    }

    let id = format!("{prefix}-raced");
    let mut racers = JoinSet::new();
    for n in 0..8 {
        let store = Arc::clone(&store);
        let racer = reservation(&id, &format!("racer-{n}"), Duration::HOUR);
        racers.spawn(async move { (racer.clone(), store.reserve(&racer).await.unwrap()) });
    }
    let answers = racers.join_all().await;
    let winners: Vec<&Reservation> = answers
        .iter()
        .filter(|(_, answer)| *answer == Reserved::New)
        .map(|(racer, _)| racer)
        .collect();
    assert_eq!(
        winners.len(),
        1,
        "exactly one racer takes the id: {answers:?}"
    );
    for (_, answer) in &answers {
        if let Reserved::Existing(held) = answer {
            assert_eq!(held, winners[0], "every loser finds the winner");
        }
    }
}
