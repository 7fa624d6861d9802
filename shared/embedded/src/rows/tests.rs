#![allow(clippy::unwrap_used)]

use std::time::Duration;

use redb::{ReadableDatabase, ReadableTableMetadata, TableHandle};
use skyport_core::ports::{ChangeSource, FeedRange, Precondition, StartFrom, StatusStore};
use skyport_core::status::{DeliveryState, StatusDocument};
use time::OffsetDateTime;

use super::{CHANGE_OF, DOCUMENTS, DONE, EXPIRY_OF};
use crate::retention::Retention;
use crate::store::EmbeddedStore;
use crate::tables::{META, STATUS, STATUS_CHANGES};
use crate::tests::{Row, settings, status_rows};

/// More than one batch, so that the upgrade takes several transactions.
const DOCUMENTS_WRITTEN: usize = super::BATCH + 500;

fn document(n: usize) -> StatusDocument {
    StatusDocument {
        // Every third one is settled, so it has a retention window.
        state: if n.is_multiple_of(3) {
            DeliveryState::Cancelled
        } else {
            DeliveryState::Processing
        },
        owner_id: Some(format!("owner-{}", n % 7)),
        ..StatusDocument::accepted(format!("sp-{n:08}"), OffsetDateTime::now_utc())
    }
}

/// Rewrites the data directory at `file` as an earlier version left it:
/// `documents` and its two reverse indexes, no mark.
fn as_an_earlier_version_left_it(file: &std::path::Path, written: &[Row]) {
    let db = redb::Database::open(file).unwrap();
    let txn = db.begin_write().unwrap();
    {
        let mut documents = txn.open_table(DOCUMENTS).unwrap();
        let mut change_of = txn.open_table(CHANGE_OF).unwrap();
        let mut expiry_of = txn.open_table(EXPIRY_OF).unwrap();
        for (id, version, change, settled, body) in written {
            documents
                .insert(id.as_str(), (*version, body.as_slice()))
                .unwrap();
            change_of.insert(id.as_str(), change.unwrap()).unwrap();
            if let Some(at) = settled {
                expiry_of.insert(id.as_str(), at).unwrap();
            }
        }
        txn.open_table(META).unwrap().remove(DONE).unwrap();
    }
    txn.delete_table(STATUS).unwrap();
    txn.commit().unwrap();
}

#[tokio::test]
async fn documents_and_their_reverse_indexes_become_one_row_each_in_place() {
    let data = tempfile::tempdir().unwrap();
    let file = data.path().join("skyport.redb");
    let mut etags = vec![None; DOCUMENTS_WRITTEN];
    {
        let store = EmbeddedStore::open(&settings(data.path()), 1).unwrap();
        let mut puts = tokio::task::JoinSet::new();
        for n in 0..DOCUMENTS_WRITTEN {
            let store = std::sync::Arc::clone(&store);
            puts.spawn(async move {
                let document = document(n);
                let put = StatusStore::put(&*store, &document, Precondition::IfNoneMatch);
                (n, put.await.unwrap())
            });
        }
        while let Some(written) = puts.join_next().await {
            let (n, etag) = written.unwrap();
            etags[n] = Some(etag);
        }
    }
    let written = status_rows(&redb::Database::open(&file).unwrap());
    assert_eq!(written.len(), DOCUMENTS_WRITTEN);
    as_an_earlier_version_left_it(&file, &written);

    let store = EmbeddedStore::open(&settings(data.path()), 1).unwrap();
    for (n, etag) in etags.iter().enumerate().step_by(97) {
        let stored = StatusStore::get(&*store, &format!("sp-{n:08}"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            Some(&stored.etag),
            etag.as_ref(),
            "every ETag held still matches"
        );
    }
    // A document written again leaves the change feed's sequence holding
    // it once, at its new place.
    let id = "sp-00000001";
    let stored = StatusStore::get(&*store, id).await.unwrap().unwrap();
    let mut again = stored.document.clone();
    again.attempt += 1;
    StatusStore::put(&*store, &again, Precondition::IfMatch(stored.etag))
        .await
        .unwrap();
    let feed = store
        .read(
            &FeedRange::full(),
            None,
            StartFrom::Beginning,
            u32::try_from(DOCUMENTS_WRITTEN * 2).unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(feed.changes.len(), DOCUMENTS_WRITTEN, "each document once");
    assert_eq!(
        feed.changes.last().unwrap().id,
        id,
        "the rewritten one last"
    );
    // The settled documents' windows moved with them.
    let retention = Retention {
        status: Duration::from_secs(60),
        dead_letters: Duration::from_secs(60),
        interval: Duration::from_millis(10),
        batch: DOCUMENTS_WRITTEN,
    };
    let later = OffsetDateTime::now_utc() + Duration::from_secs(120);
    let swept = store.sweep(&retention, later).await.unwrap();
    assert_eq!(swept.statuses, DOCUMENTS_WRITTEN.div_ceil(3));
    drop(store);

    let db = redb::Database::open(&file).unwrap();
    let kept = status_rows(&db);
    assert_eq!(
        kept.len(),
        DOCUMENTS_WRITTEN - DOCUMENTS_WRITTEN.div_ceil(3)
    );
    let txn = db.begin_read().unwrap();
    assert_eq!(
        txn.open_table(STATUS_CHANGES).unwrap().len().unwrap(),
        kept.len() as u64,
        "a swept document's change went with it"
    );
    for old in ["documents", "status_change_of", "status_expiry_of"] {
        assert!(
            txn.list_tables().unwrap().all(|table| table.name() != old),
            "{old} is gone"
        );
    }
    drop(txn);
    let mut db = db;
    assert_eq!(super::run(&mut db).unwrap(), None, "once");
}
