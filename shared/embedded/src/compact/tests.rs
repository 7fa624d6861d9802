#![allow(clippy::unwrap_used)]

use redb::{ReadableDatabase, ReadableTable, ReadableTableMetadata};
use skyport_core::ports::{ListQuery, Precondition, StatusStore};
use skyport_core::status::{DeliveryState, StatusDocument};
use time::OffsetDateTime;

use super::{DONE, PLAIN};
use crate::codec;
use crate::rows::{CHANGE_OF, EXPIRY_OF};
use crate::store::EmbeddedStore;
use crate::tables::{META, STATUS, STATUS_CHANGES};
use crate::tests::{Row, settings, status_rows};

const DOCUMENTS: usize = 2_500;

fn document(n: usize) -> StatusDocument {
    StatusDocument {
        state: DeliveryState::Scheduled,
        owner_id: Some(format!("owner-{}", n % 7)),
        principal: Some("portal".into()),
        callback_url: Some("https://hooks.example.com/skyport/deliveries".into()),
        package_id: Some(format!("pkg-{n}")),
        traceparent: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into()),
        ..StatusDocument::accepted(format!("sp-{n:08}"), OffsetDateTime::now_utc())
    }
}

/// The status table's rows, in id order.
fn bodies(path: &std::path::Path) -> Vec<Row> {
    status_rows(&redb::Database::open(path).unwrap())
}

fn last_change(path: &std::path::Path) -> (u64, u64) {
    let db = redb::Database::open(path).unwrap();
    let txn = db.begin_read().unwrap();
    let changes = txn.open_table(STATUS_CHANGES).unwrap();
    let last = changes.last().unwrap().unwrap().0.value();
    (changes.len().unwrap(), last)
}

#[tokio::test]
async fn plain_documents_of_an_earlier_version_are_rewritten_compactly_in_place() {
    let data = tempfile::tempdir().unwrap();
    let file = data.path().join("skyport.redb");
    let mut etags = Vec::new();
    {
        let store = EmbeddedStore::open(&settings(data.path()), 1).unwrap();
        for n in 0..DOCUMENTS {
            let etag = StatusStore::put(&*store, &document(n), Precondition::IfNoneMatch)
                .await
                .unwrap();
            etags.push(etag);
        }
    }
    // Make it the data directory an earlier version left: plain JSON in
    // `status`, its change numbers and retention windows in reverse indexes,
    // no marks.
    let written = bodies(&file);
    {
        let db = redb::Database::open(&file).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut plain = txn.open_table(PLAIN).unwrap();
            let mut change_of = txn.open_table(CHANGE_OF).unwrap();
            let mut expiry_of = txn.open_table(EXPIRY_OF).unwrap();
            for (id, version, change, settled, body) in &written {
                let json = serde_json::to_vec(&codec::decode(body).unwrap()).unwrap();
                plain
                    .insert(id.as_str(), (*version, json.as_slice()))
                    .unwrap();
                change_of.insert(id.as_str(), change.unwrap()).unwrap();
                if let Some(at) = settled {
                    expiry_of.insert(id.as_str(), at).unwrap();
                }
            }
            // One body no version could read moves as it is.
            plain
                .insert("sp-damaged", (1, b"{not json".as_slice()))
                .unwrap();
            let mut meta = txn.open_table(META).unwrap();
            meta.remove(DONE).unwrap();
            meta.remove(crate::rows::DONE).unwrap();
        }
        txn.delete_table(STATUS).unwrap();
        txn.commit().unwrap();
    }
    let mut db = redb::Database::open(&file).unwrap();
    while db.compact().unwrap() {}
    drop(db);
    let plain_size = std::fs::metadata(&file).unwrap().len();
    let changes = last_change(&file);

    let store = EmbeddedStore::open(&settings(data.path()), 1).unwrap();
    for (n, etag) in etags.iter().enumerate() {
        let stored = StatusStore::get(&*store, &format!("sp-{n:08}"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(stored.document, document_like(&stored.document, n));
        assert_eq!(&stored.etag, etag, "the version, and every ETag held, stay");
    }
    let page = StatusStore::list(
        &*store,
        &ListQuery {
            principal: None,
            owner: Some("owner-3".into()),
            state: None,
            since: None,
            until: None,
            limit: 1_000,
            after: None,
        },
    )
    .await
    .unwrap();
    assert_eq!(page.items.len(), DOCUMENTS.div_ceil(7) - 1);
    drop(store);

    let stored = bodies(&file);
    assert_eq!(stored.len(), DOCUMENTS + 1);
    assert!(
        redb::Database::open(&file)
            .unwrap()
            .begin_read()
            .unwrap()
            .open_table(PLAIN)
            .is_err(),
        "the old table is gone"
    );
    for (id, _, _, _, body) in &stored {
        let plain = body.first() == Some(&b'{');
        assert_eq!(plain, id == "sp-damaged", "{id}");
    }
    for ((id, version, change, settled, _), before) in stored.iter().zip(&written) {
        assert_eq!(
            (id, version, change, settled),
            (&before.0, &before.1, &before.2, &before.3),
            "the version, change number and retention window move with the document"
        );
    }
    assert_eq!(
        last_change(&file),
        changes,
        "no change-feed entry for a rewrite"
    );
    let compact_size = std::fs::metadata(&file).unwrap().len();
    println!("{plain_size} bytes as plain JSON, {compact_size} compact");
    // These documents are 600 bytes of JSON, not a delivery's 1.4 KB.
    assert!(
        compact_size * 2 < plain_size,
        "{compact_size} of {plain_size}"
    );

    // A second start has nothing to do.
    let mut db = redb::Database::open(&file).unwrap();
    assert_eq!(super::run(&mut db).unwrap(), None);
}

/// `document(n)` with the accept time it was stored with.
fn document_like(stored: &StatusDocument, n: usize) -> StatusDocument {
    StatusDocument {
        created_at: stored.created_at,
        updated_at: stored.updated_at,
        ..document(n)
    }
}
