//! The dead-letter contract: what every `DeadLetterStore` adapter must do
//! when its letters are read a page at a time, as one suite run against each
//! (the embedded store and Cosmos DB).

use std::collections::BTreeSet;
use std::sync::Arc;

use bytes::Bytes;
use serde_json::json;
use skyport_core::ports::{ChangeDeadLetter, DeadLetter, DeadLetterStore};
use time::OffsetDateTime;

/// Positions whose order as numbers and as text differ (9 < 10 < 100).
const POSITIONS: [(u32, u64); 9] = [
    (0, 9),
    (0, 10),
    (0, 100),
    (1, 5),
    (2, 0),
    (10, 1),
    (3, 99),
    (3, 1_000),
    (7, 7),
];

/// Every event dead letter, read in pages of `limit` after the last one
/// read; asserts each page holds at most `limit` and only the last fewer.
async fn every_event(store: &dyn DeadLetterStore, limit: usize) -> Vec<(u32, u64)> {
    let mut read = Vec::new();
    let mut after = None;
    loop {
        let page = store.events(after, limit).await.expect("a page");
        assert!(page.len() <= limit, "a page of {} for {limit}", page.len());
        read.extend(page.iter().map(|letter| (letter.partition, letter.offset)));
        match page.last() {
            Some(last) if page.len() == limit => after = Some((last.partition, last.offset)),
            _ => return read,
        }
    }
}

/// Runs every case against `store`, which holds no dead letters yet.
///
/// # Panics
/// On the first case the store gets wrong.
pub async fn dead_letter_store_contract(store: Arc<dyn DeadLetterStore>) {
    assert!(
        store.events(None, 5).await.expect("a page").is_empty(),
        "an empty store has no page"
    );
    let at = OffsetDateTime::from_unix_timestamp(1_700_000_000).expect("a time");
    for (partition, offset) in POSITIONS {
        store
            .put(DeadLetter {
                partition,
                offset,
                reason: format!("poison at {partition}/{offset}"),
                payload: Bytes::from(format!("\u{0}{partition}.{offset}")),
                at,
            })
            .await
            .expect("put");
    }
    let whole = store.events(None, 100).await.expect("a page");
    assert_eq!(whole.len(), POSITIONS.len());
    let letter = whole
        .iter()
        .find(|letter| (letter.partition, letter.offset) == (3, 99))
        .expect("kept");
    assert_eq!(letter.reason, "poison at 3/99");
    assert_eq!(letter.payload, Bytes::from_static(b"\x003.99"));
    assert_eq!(letter.at, at);
    let order: Vec<(u32, u64)> = whole.iter().map(|l| (l.partition, l.offset)).collect();
    for limit in [1, 2, 4, POSITIONS.len(), 100] {
        assert_eq!(
            every_event(&*store, limit).await,
            order,
            "pages of {limit} read every letter once, in the store's order"
        );
    }
    assert!(
        store
            .events(order.last().copied(), 5)
            .await
            .expect("a page")
            .is_empty(),
        "nothing after the last"
    );

    // A redrive removes what it read: the next page goes on from the last.
    let mut after = None;
    let mut removed = Vec::new();
    loop {
        let page = store.events(after, 2).await.expect("a page");
        for letter in &page {
            store
                .remove(letter.partition, letter.offset)
                .await
                .expect("remove");
            removed.push((letter.partition, letter.offset));
        }
        match page.last() {
            Some(last) if page.len() == 2 => after = Some((last.partition, last.offset)),
            _ => break,
        }
    }
    assert_eq!(removed, order, "removing a page does not move the next");
    assert!(store.events(None, 100).await.expect("a page").is_empty());
    store
        .remove(0, 9)
        .await
        .expect("removing what is gone succeeds");

    let change = |processor: &str, key: &str| ChangeDeadLetter {
        processor: processor.into(),
        key: key.into(),
        reason: format!("{key} refused"),
        payload: json!({"webhookId": key}),
        at,
    };
    let keys: BTreeSet<String> = (0..11).map(|n| format!("msg_d-{n}_Failed")).collect();
    for key in keys.iter().rev() {
        store
            .put_change(change("notify", key))
            .await
            .expect("put_change");
    }
    store
        .put_change(change("other", "msg_d-0_Failed"))
        .await
        .expect("put_change");
    let mut read = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = store
            .changes("notify", after.as_deref(), 4)
            .await
            .expect("a page");
        assert!(page.len() <= 4);
        assert!(page.iter().all(|letter| letter.processor == "notify"));
        read.extend(page.iter().map(|letter| letter.key.clone()));
        match page.last() {
            Some(last) if page.len() == 4 => after = Some(last.key.clone()),
            _ => break,
        }
    }
    assert_eq!(
        read,
        keys.iter().cloned().collect::<Vec<_>>(),
        "by key, each once, only the processor's"
    );
    let first = &store.changes("notify", None, 1).await.expect("a page")[0];
    assert_eq!(*first, change("notify", "msg_d-0_Failed"));
    assert_eq!(
        store
            .changes("other", None, 10)
            .await
            .expect("a page")
            .len(),
        1
    );
}
