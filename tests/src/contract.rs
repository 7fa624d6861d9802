//! The status-store contract: what every `StatusStore` adapter must do, as
//! one suite run against each (the embedded store and Cosmos DB).

use std::sync::Arc;

use skyport_core::ports::{Precondition, StatusStore, StatusStoreError};
use skyport_core::status::{DeliveryState, Failure, StatusDocument, Step, StepOutcome, StepResult};
use time::OffsetDateTime;
use time::macros::datetime;

fn document(id: &str) -> StatusDocument {
    StatusDocument {
        state: DeliveryState::Processing,
        steps: vec![StepOutcome {
            step: Step::Account,
            result: StepResult::Succeeded,
            at: datetime!(2026-11-21 10:00:01.5 UTC),
            calls: 2,
            detail: Some("ok".into()),
        }],
        drone_id: Some("drone-7".into()),
        third_party_required: Some(false),
        failure: Some(Failure {
            step: Step::Drone,
            code: "Rejected".into(),
            message: "no drone".into(),
        }),
        package_id: Some("package-1".into()),
        cancel_requested_at: Some(datetime!(2026-11-21 10:00:02 UTC)),
        attempt: 1,
        ..StatusDocument::accepted(id, datetime!(2026-11-21 10:00 UTC))
    }
}

fn is_conflict<T: std::fmt::Debug>(result: &Result<T, StatusStoreError>) -> bool {
    matches!(result, Err(StatusStoreError::PreconditionFailed))
}

/// Runs every case against `store`; ids are prefixed with `prefix` so that
/// one store can serve several runs.
///
/// # Panics
/// On the first case the store gets wrong.
pub async fn status_store_contract(store: Arc<dyn StatusStore>, prefix: &str) {
    let id = format!("{prefix}-contract");
    assert!(
        store.get(&id).await.expect("get").is_none(),
        "an unknown id reads as absent"
    );

    let written = document(&id);
    let first = store
        .put(&written, Precondition::IfNoneMatch)
        .await
        .expect("create");
    let stored = store.get(&id).await.expect("get").expect("present");
    assert_eq!(
        stored.document, written,
        "a document reads back as written, every field"
    );
    assert_eq!(
        stored.etag, first,
        "the read returns the version the write returned"
    );

    let again = store.put(&written, Precondition::IfNoneMatch).await;
    assert!(
        is_conflict(&again),
        "create-only on an existing id fails: {again:?}"
    );

    let mut next = written.clone();
    next.state = DeliveryState::Scheduled;
    next.updated_at = OffsetDateTime::now_utc()
        .replace_nanosecond(0)
        .expect("valid");
    let second = store
        .put(&next, Precondition::IfMatch(first.clone()))
        .await
        .expect("a write on the current version");
    assert_ne!(second, first, "a write makes a new version");
    let stale = store.put(&written, Precondition::IfMatch(first)).await;
    assert!(
        is_conflict(&stale),
        "a write on a stale version fails: {stale:?}"
    );
    assert_eq!(
        store
            .get(&id)
            .await
            .expect("get")
            .expect("present")
            .document,
        next
    );

    let missing = store
        .put(
            &document(&format!("{prefix}-missing")),
            Precondition::IfMatch(second),
        )
        .await;
    assert!(
        is_conflict(&missing),
        "a conditional write on an absent document fails: {missing:?}"
    );

    concurrent_writers_lose_no_update(&store, &format!("{prefix}-counter")).await;
    assert!(store.ready().await);
}

/// Twenty writers each add one to `attempt` with read-modify-write loops.
async fn concurrent_writers_lose_no_update(store: &Arc<dyn StatusStore>, id: &str) {
    store
        .put(
            &StatusDocument::accepted(id, OffsetDateTime::UNIX_EPOCH),
            Precondition::IfNoneMatch,
        )
        .await
        .expect("create");
    let mut writers = tokio::task::JoinSet::new();
    for _ in 0..20 {
        let store = Arc::clone(store);
        let id = id.to_owned();
        writers.spawn(async move {
            loop {
                let current = store.get(&id).await.expect("get").expect("present");
                let mut next = current.document.clone();
                next.attempt += 1;
                match store.put(&next, Precondition::IfMatch(current.etag)).await {
                    Ok(_) => return,
                    Err(StatusStoreError::PreconditionFailed) => {}
                    Err(e) => panic!("{e}"),
                }
            }
        });
    }
    writers.join_all().await;
    let stored = store.get(id).await.expect("get").expect("present");
    assert_eq!(
        stored.document.attempt, 20,
        "concurrent writers never lose an update"
    );
}
