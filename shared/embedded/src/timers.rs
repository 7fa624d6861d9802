//! The timers of Waiting documents ([`Timers`]): the `timers` table, which
//! every status write keeps in its own transaction ([`crate::tables`]), read
//! earliest first. One shard: one process reads it. A fired entry stays
//! until its document's next write removes it, and none is ever lost.

use std::ops::Bound;

use async_trait::async_trait;
use redb::{ReadableDatabase, ReadableTableMetadata};
use skyport_core::ports::{Due, Lane, StatusStoreError, Timers};
use time::OffsetDateTime;

use crate::store::EmbeddedStore;
use crate::tables::{TIMERS, WAITING, unix_ms};

#[async_trait]
impl Timers for EmbeddedStore {
    fn shards(&self) -> u32 {
        1
    }

    async fn due(
        &self,
        _shard: u32,
        after: Option<&Due>,
        up_to: OffsetDateTime,
        limit: usize,
    ) -> Result<Vec<Due>, StatusStoreError> {
        let db = std::sync::Arc::clone(&self.db);
        let up_to = unix_ms(up_to);
        let after = after.map(|due| (unix_ms(due.runs_at), due.delivery_id.clone()));
        self.blocking(move || {
            let txn = db.begin_read()?;
            let table = match txn.open_table(TIMERS) {
                Ok(table) => table,
                Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
                Err(e) => return Err(e.into()),
            };
            let start = match &after {
                Some((at, id)) => Bound::Excluded((*at, id.as_str())),
                None => Bound::Unbounded,
            };
            let end = Bound::Excluded((up_to.saturating_add(1), ""));
            let mut due = Vec::new();
            for entry in table.range::<(i64, &str)>((start, end))?.take(limit) {
                let (key, value) = entry?;
                let (at, id) = key.value();
                let (revision, expedited) = value.value();
                due.push(Due {
                    delivery_id: id.to_owned(),
                    revision,
                    lane: Lane::of(expedited),
                    runs_at: OffsetDateTime::from_unix_timestamp_nanos(i128::from(at) * 1_000_000)
                        .unwrap_or(OffsetDateTime::UNIX_EPOCH),
                    version: None,
                });
            }
            Ok(due)
        })
        .await
        .map_err(|e| StatusStoreError::Unavailable(Box::new(e)))
    }

    async fn fired(&self, _shard: u32, _fired: &[Due]) -> Result<(), StatusStoreError> {
        Ok(())
    }

    async fn overdue(
        &self,
        _before: OffsetDateTime,
        _limit: usize,
    ) -> Result<Vec<Due>, StatusStoreError> {
        Ok(Vec::new())
    }

    async fn waiting(&self, _shard: u32) -> Result<u64, StatusStoreError> {
        let db = std::sync::Arc::clone(&self.db);
        self.blocking(move || {
            let txn = db.begin_read()?;
            match txn.open_table(WAITING) {
                Ok(table) => Ok(table.len()?),
                Err(redb::TableError::TableDoesNotExist(_)) => Ok(0),
                Err(e) => Err(e.into()),
            }
        })
        .await
        .map_err(|e| StatusStoreError::Unavailable(Box::new(e)))
    }
}
