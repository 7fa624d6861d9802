//! The change feed of the embedded store ([`ChangeSource`]): every status
//! write takes the next number of one sequence (`status_changes`) in the
//! transaction that makes it durable, and drops the document's earlier entry,
//! so the feed holds each document once, at its latest write, like Cosmos DB's
//! latest-version change feed. It is one range (the whole key space); a
//! continuation is the last number read.

use std::borrow::Cow;
use std::ops::Bound;
use std::sync::Arc;

use async_trait::async_trait;
use redb::{ReadableDatabase, ReadableTable};
use serde_json::Value;
use skyport_core::ports::{
    Change, ChangeDeadLetter, ChangeFeedError, ChangePage, ChangeSource, ChangedIds,
    DeadLetterError, FeedRange, StartFrom,
};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::codec;
use crate::ops::{Applied, OpKind};
use crate::store::EmbeddedStore;
use crate::tables::{CHANGE_DEAD_LETTERS, STATUS, STATUS_CHANGES};

fn sequence(from: Option<&str>) -> Result<Option<u64>, ChangeFeedError> {
    from.map(|text| {
        text.parse::<u64>()
            .map_err(|e| ChangeFeedError::BadContinuation {
                continuation: text.to_owned(),
                source: Box::new(e),
            })
    })
    .transpose()
}

fn unavailable(e: redb::Error) -> ChangeFeedError {
    ChangeFeedError::Unavailable(Box::new(e))
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack
        .windows(needle.len())
        .any(|window| window == needle)
}

/// Whether a document was written at or after `since` (by its `updatedAt`).
fn written_since(document: &Value, since: OffsetDateTime) -> bool {
    document
        .get("updatedAt")
        .and_then(Value::as_str)
        .and_then(|at| OffsetDateTime::parse(at, &Rfc3339).ok())
        .is_none_or(|at| at >= since)
}

#[async_trait]
impl ChangeSource for EmbeddedStore {
    async fn ranges(&self) -> Result<Vec<FeedRange>, ChangeFeedError> {
        Ok(vec![FeedRange::full()])
    }

    /// The last change number committed: a reader that caught up is woken
    /// by the commit of the next status write, not by its poll interval.
    fn version(&self) -> Option<u64> {
        Some(*self.changes.borrow())
    }

    async fn changed_since(&self, seen: u64) {
        let mut changes = self.changes.clone();
        // An error means the committer stopped: nothing more will change.
        if changes.wait_for(|last| *last != seen).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    async fn read(
        &self,
        _range: &FeedRange,
        from: Option<&str>,
        start: StartFrom,
        max_items: u32,
    ) -> Result<ChangePage, ChangeFeedError> {
        self.read_changes(from, start, max_items, None).await
    }

    /// Passes over documents without `field` before parsing them, and
    /// compact ones without a callback URL before decompressing them.
    async fn read_having(
        &self,
        _range: &FeedRange,
        from: Option<&str>,
        start: StartFrom,
        max_items: u32,
        field: &str,
    ) -> Result<ChangePage, ChangeFeedError> {
        self.read_changes(from, start, max_items, Some(field.to_owned()))
            .await
    }

    /// Reads the sequence alone, never a document.
    async fn read_ids(
        &self,
        _range: &FeedRange,
        from: Option<&str>,
        start: StartFrom,
        max_items: u32,
    ) -> Result<ChangedIds, ChangeFeedError> {
        let after = sequence(from)?;
        let db = Arc::clone(&self.db);
        let limit = usize::try_from(max_items.max(1)).unwrap_or(usize::MAX);
        self.blocking(move || -> Result<_, redb::Error> {
            let txn = db.begin_read()?;
            let changes = match txn.open_table(STATUS_CHANGES) {
                Ok(table) => table,
                Err(redb::TableError::TableDoesNotExist(_)) => {
                    return Ok(ChangedIds {
                        ids: Vec::new(),
                        continuation: after.unwrap_or(0).to_string(),
                        more: false,
                    });
                }
                Err(e) => return Err(e.into()),
            };
            let after = match (after, start) {
                (Some(after), _) => after,
                (None, StartFrom::Now) => changes.last()?.map_or(0, |(seq, _)| seq.value()),
                (None, StartFrom::Beginning | StartFrom::Time(_)) => 0,
            };
            let mut ids = Vec::new();
            let mut last = after;
            for entry in changes.range(after + 1..)?.take(limit) {
                let (seq, id) = entry?;
                last = seq.value();
                ids.push(id.value().to_owned());
            }
            Ok(ChangedIds {
                more: ids.len() >= limit,
                ids,
                continuation: last.to_string(),
            })
        })
        .await
        .map_err(unavailable)
    }

    async fn pending(
        &self,
        _range: &FeedRange,
        from: Option<&str>,
        start: StartFrom,
    ) -> Result<u64, ChangeFeedError> {
        let after = sequence(from)?;
        if after.is_none() && start == StartFrom::Now {
            return Ok(0);
        }
        let db = Arc::clone(&self.db);
        self.blocking(move || -> Result<_, redb::Error> {
            let txn = db.begin_read()?;
            let changes = match txn.open_table(STATUS_CHANGES) {
                Ok(table) => table,
                Err(redb::TableError::TableDoesNotExist(_)) => return Ok(0),
                Err(e) => return Err(e.into()),
            };
            let mut count = 0;
            for entry in changes.range(after.unwrap_or(0) + 1..)? {
                entry?;
                count += 1;
            }
            Ok(count)
        })
        .await
        .map_err(unavailable)
    }
}

impl EmbeddedStore {
    /// The changes after `from`, only those with `field` set when given.
    async fn read_changes(
        &self,
        from: Option<&str>,
        start: StartFrom,
        max_items: u32,
        field: Option<String>,
    ) -> Result<ChangePage, ChangeFeedError> {
        let after = sequence(from)?;
        let db = Arc::clone(&self.db);
        let limit = usize::try_from(max_items.max(1)).unwrap_or(usize::MAX);
        let (rows, last, mut skipped) = self
            .blocking(move || -> Result<_, redb::Error> {
                let txn = db.begin_read()?;
                let changes = match txn.open_table(STATUS_CHANGES) {
                    Ok(table) => table,
                    Err(redb::TableError::TableDoesNotExist(_)) => return Ok((Vec::new(), 0, 0)),
                    Err(e) => return Err(e.into()),
                };
                let newest = changes.last()?.map_or(0, |(seq, _)| seq.value());
                let after = match (after, start) {
                    (Some(after), _) => after,
                    (None, StartFrom::Now) => return Ok((Vec::new(), newest, 0)),
                    (None, StartFrom::Beginning | StartFrom::Time(_)) => 0,
                };
                let status = txn.open_table(STATUS)?;
                // A serialized status document holds `"field":` only when it is set.
                let pattern = field.as_deref().map(|field| format!("\"{field}\":"));
                let mut rows = Vec::new();
                let (mut last, mut skipped) = (after, 0);
                for entry in changes.range(after + 1..)?.take(limit) {
                    let (seq, id) = entry?;
                    last = seq.value();
                    let Some(stored) = status.get(id.value())? else {
                        continue;
                    };
                    let body = stored.value().3;
                    // A compact body's flags may answer without decompressing.
                    let known = field.as_deref().and_then(|field| codec::holds(body, field));
                    if known == Some(false) {
                        skipped += 1;
                        continue;
                    }
                    let json = codec::json(body);
                    if let (None, Ok(json), Some(pattern)) = (known, &json, &pattern)
                        && !contains(json, pattern.as_bytes())
                    {
                        skipped += 1;
                        continue;
                    }
                    rows.push((
                        id.value().to_owned(),
                        json.map(Cow::into_owned).map_err(|_| body.to_vec()),
                    ));
                }
                Ok((rows, last, skipped))
            })
            .await
            .map_err(unavailable)?;
        let mut changes = Vec::with_capacity(rows.len());
        for (id, json) in rows {
            // A document that is not JSON is still a change: the handler
            // decides what to do with it (the notifier dead-letters it).
            let lossy = |bytes: &[u8]| Value::String(String::from_utf8_lossy(bytes).into_owned());
            let document = match json {
                Ok(json) => serde_json::from_slice(&json).unwrap_or_else(|_| lossy(&json)),
                Err(raw) => lossy(&raw),
            };
            if let (None, StartFrom::Time(since)) = (from, start)
                && !written_since(&document, since)
            {
                skipped += 1;
                continue;
            }
            changes.push(Change { id, document });
        }
        Ok(ChangePage {
            changes,
            continuation: last.to_string(),
            skipped,
        })
    }

    pub(crate) async fn put_change_dead_letter(
        &self,
        letter: ChangeDeadLetter,
    ) -> Result<(), DeadLetterError> {
        match self.submit(OpKind::ChangeDeadLetter(letter)).await {
            Ok(Applied::Done) => Ok(()),
            Ok(other) => unreachable!("a dead letter is answered with Done, not {other:?}"),
            Err(e) => Err(DeadLetterError::Unavailable(Box::new(e))),
        }
    }

    /// At most `limit` of `processor`'s dead-lettered changes after key
    /// `after`, by key.
    pub(crate) async fn change_dead_letters(
        &self,
        processor: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<ChangeDeadLetter>, DeadLetterError> {
        let db = Arc::clone(&self.db);
        let processor = processor.to_owned();
        let after = after.map(str::to_owned);
        self.blocking(move || -> Result<_, redb::Error> {
            let txn = db.begin_read()?;
            let table = match txn.open_table(CHANGE_DEAD_LETTERS) {
                Ok(table) => table,
                Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
                Err(e) => return Err(e.into()),
            };
            let from = match &after {
                Some(key) => Bound::Excluded((processor.as_str(), key.as_str())),
                None => Bound::Included((processor.as_str(), "")),
            };
            let mut letters = Vec::new();
            for entry in table.range((from, Bound::Unbounded))? {
                if letters.len() >= limit {
                    break;
                }
                let (key, value) = entry?;
                let (owner, name) = key.value();
                if owner != processor {
                    break;
                }
                let (reason, at, payload) = value.value();
                letters.push(ChangeDeadLetter {
                    processor: owner.to_owned(),
                    key: name.to_owned(),
                    reason: reason.to_owned(),
                    payload: serde_json::from_slice(payload).unwrap_or(Value::Null),
                    at: OffsetDateTime::parse(at, &Rfc3339).unwrap_or(OffsetDateTime::UNIX_EPOCH),
                });
            }
            Ok(letters)
        })
        .await
        .map_err(|e| DeadLetterError::Unavailable(Box::new(e)))
    }
}
