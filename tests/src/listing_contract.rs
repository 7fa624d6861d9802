//! The listing contract: what `StatusStore::list` answers on every adapter,
//! as one suite run against each (the embedded store and Cosmos DB). Both
//! list a document as soon as it is written.

use std::future::Future;
use std::time::Duration;

use skyport_core::ports::{ListPage, ListQuery, Precondition, StatusStore};
use skyport_core::status::{DeliveryState, StatusDocument};
use time::OffsetDateTime;

/// A store under the listing contract, fresh for each case.
pub trait Listed {
    /// The store.
    fn store(&self) -> &dyn StatusStore;

    /// Stops the store.
    fn close(self) -> impl Future<Output = ()>;
}

/// Runs every case, each against a store `open` gives.
///
/// # Panics
/// On the first case the store gets wrong.
pub async fn listing_contract<L, F, Fut>(mut open: F)
where
    L: Listed,
    F: FnMut() -> Fut,
    Fut: Future<Output = L>,
{
    newest_first_and_filtered(open().await).await;
    pages_go_on_from_their_cursor_while_new_documents_arrive(open().await).await;
    a_document_described_later_is_listed_once_where_it_says(open().await).await;
}

/// Delivery `n`: Scheduled or Failed, of one of three owners and two clients.
fn document(n: usize, at: OffsetDateTime) -> StatusDocument {
    let states = [DeliveryState::Scheduled, DeliveryState::Failed];
    StatusDocument {
        state: states[n % 2],
        owner_id: Some(format!("owner-{}", n % 3)),
        principal: Some(format!("client-{}", n % 2)),
        ..StatusDocument::accepted(format!("d-{n:03}"), at)
    }
}

fn everything() -> ListQuery {
    ListQuery {
        principal: None,
        owner: None,
        state: None,
        since: None,
        until: None,
        limit: 1_000,
        after: None,
    }
}

fn ids(page: &ListPage) -> Vec<&str> {
    page.items.iter().map(|d| d.id.as_str()).collect()
}

async fn list(listed: &impl Listed, query: &ListQuery) -> ListPage {
    listed.store().list(query).await.expect("list")
}

async fn put(listed: &impl Listed, document: &StatusDocument) {
    listed
        .store()
        .put(document, Precondition::IfNoneMatch)
        .await
        .expect("create");
}

/// 30 documents accepted a second apart, the last newest, and listed.
async fn thirty(listed: &impl Listed) -> OffsetDateTime {
    let start = OffsetDateTime::now_utc() - Duration::from_secs(60);
    for n in 0..30 {
        put(listed, &document(n, start + Duration::from_secs(n as u64))).await;
    }
    start
}

async fn newest_first_and_filtered(listed: impl Listed) {
    let start = thirty(&listed).await;
    let all = list(&listed, &everything()).await;
    let expected: Vec<String> = (0..30).rev().map(|n| format!("d-{n:03}")).collect();
    assert_eq!(ids(&all), expected, "newest first");
    assert_eq!(all.next, None, "one page holds them all");

    let owner = ListQuery {
        owner: Some("owner-1".into()),
        ..everything()
    };
    let page = list(&listed, &owner).await;
    assert_eq!(page.items.len(), 10);
    assert!(
        page.items
            .iter()
            .all(|d| d.owner_id.as_deref() == Some("owner-1"))
    );
    assert_eq!(ids(&page)[..2], ["d-028", "d-025"]);

    let mine = ListQuery {
        principal: Some("client-0".into()),
        owner: Some("owner-0".into()),
        state: Some(DeliveryState::Scheduled),
        ..everything()
    };
    // n even (client-0, Scheduled) and n % 3 == 0: 0, 6, 12, 18, 24.
    let page = list(&listed, &mine).await;
    assert_eq!(ids(&page), ["d-024", "d-018", "d-012", "d-006", "d-000"]);

    let failed = ListQuery {
        state: Some(DeliveryState::Failed),
        ..everything()
    };
    let page = list(&listed, &failed).await;
    assert_eq!(page.items.len(), 15);
    assert!(page.items.iter().all(|d| d.state == DeliveryState::Failed));

    let window = ListQuery {
        since: Some(start + Duration::from_secs(10)),
        until: Some(start + Duration::from_secs(13)),
        ..everything()
    };
    let page = list(&listed, &window).await;
    assert_eq!(
        ids(&page),
        ["d-012", "d-011", "d-010"],
        "since inclusive, until exclusive"
    );
    listed.close().await;
}

async fn pages_go_on_from_their_cursor_while_new_documents_arrive(listed: impl Listed) {
    thirty(&listed).await;
    let mine = ListQuery {
        principal: Some("client-1".into()),
        ..everything()
    };
    let mut arrivals = 100;
    // Client 1's listing also holds the two of it that arrived during the first.
    for (listing, count) in [(everything(), 30), (mine, 17)] {
        // What the listing holds before the first page, in one page.
        let expected: Vec<String> = list(&listed, &listing)
            .await
            .items
            .into_iter()
            .map(|d| d.id)
            .collect();
        assert_eq!(expected.len(), count, "{expected:?}");
        let mut seen = Vec::new();
        let mut after = None;
        loop {
            let page = list(
                &listed,
                &ListQuery {
                    limit: 7,
                    after: after.clone(),
                    ..listing.clone()
                },
            )
            .await;
            assert!(page.items.len() <= 7);
            seen.extend(page.items.iter().map(|d| d.id.clone()));
            // A newer delivery arrives between two pages: it sorts before the cursor.
            put(&listed, &document(arrivals, OffsetDateTime::now_utc())).await;
            arrivals += 1;
            match page.next {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        assert_eq!(seen, expected, "{listing:?}");
    }
    listed.close().await;
}

/// A cancellation that arrived before its request is written knowing the
/// principal, not the owner, and at its own time, not the accept time; the
/// request describes it later.
async fn a_document_described_later_is_listed_once_where_it_says(listed: impl Listed) {
    let accepted_at = OffsetDateTime::now_utc() - Duration::from_secs(5);
    let at = OffsetDateTime::now_utc();
    let bare = StatusDocument {
        principal: Some("client-1".into()),
        cancel_requested_at: Some(at),
        ..StatusDocument::accepted("d-1", at)
    };
    let etag = listed
        .store()
        .put(&bare, Precondition::IfNoneMatch)
        .await
        .expect("create");
    assert_eq!(ids(&list(&listed, &everything()).await), ["d-1"]);

    let described = StatusDocument {
        owner_id: Some("owner-9".into()),
        state: DeliveryState::Processing,
        created_at: accepted_at,
        ..bare
    };
    listed
        .store()
        .put(&described, Precondition::IfMatch(etag))
        .await
        .expect("describe");
    for scope in [
        ListQuery {
            owner: Some("owner-9".into()),
            ..everything()
        },
        ListQuery {
            principal: Some("client-1".into()),
            ..everything()
        },
        everything(),
    ] {
        let page = list(&listed, &scope).await;
        assert_eq!(page.items, std::slice::from_ref(&described), "{scope:?}");
    }
    let before = ListQuery {
        until: Some(accepted_at + Duration::from_secs(1)),
        ..everything()
    };
    assert_eq!(
        ids(&list(&listed, &before).await),
        ["d-1"],
        "listed at its accept time"
    );
    listed.close().await;
}
