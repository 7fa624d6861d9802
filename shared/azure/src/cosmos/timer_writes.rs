//! The timer of a Waiting document, written right after its status write
//! in the same bulk batch ([`TimerWrites`]); the timers container and how
//! it is read are in [`super::timers`].

use std::sync::Arc;

use azure_data_cosmos::ContainerClient;
use azure_data_cosmos::options::ItemWriteOptions;
use serde::Serialize;
use skyport_core::ports::{Lane, shard_of};
use skyport_core::status::StatusDocument;
use skyport_runtime::config::Work;
use time::OffsetDateTime;

use super::request_units::Operation;
use super::throttle::Requests;

/// A timer as stored.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Item<'a> {
    id: &'a str,
    shard: String,
    runs_at_ms: i64,
    revision: u32,
    lane: Lane,
    ttl: u64,
}

/// The shard's partition key value.
pub(super) fn partition(shard: u32) -> String {
    shard.to_string()
}

/// Writes the timers of Waiting documents, beside their status writes.
pub(super) struct TimerWrites {
    container: ContainerClient,
    requests: Arc<Requests>,
    shards: u32,
    /// `store.status_retention_s`: how long a timer outlives its time.
    retention: u64,
}

impl TimerWrites {
    pub(super) fn new(
        container: ContainerClient,
        requests: Arc<Requests>,
        shards: u32,
        retention: u64,
    ) -> Self {
        Self {
            container,
            requests,
            shards,
            retention,
        }
    }

    /// Sets (or moves) the timer of `document`, Waiting until `runs_at`
    /// (`runs_at_ms` in Unix milliseconds). A failure is logged, never
    /// returned: the status is written, and `Timers::overdue` finds the lost
    /// timer.
    pub(super) async fn follow(
        &self,
        document: &StatusDocument,
        runs_at: OffsetDateTime,
        runs_at_ms: i64,
    ) {
        let now = OffsetDateTime::now_utc();
        let wait = u64::try_from((runs_at - now).whole_seconds()).unwrap_or(0);
        let shard = partition(shard_of(&document.id, self.shards));
        let item = Item {
            id: &document.id,
            shard: shard.clone(),
            runs_at_ms,
            revision: document.revision,
            lane: document.lane,
            ttl: wait.saturating_add(self.retention).min(i32::MAX as u64),
        };
        let result = self
            .requests
            .run(Work::Timers, Operation::Write, u32::MAX, |options| {
                let options = ItemWriteOptions::default().with_operation_options(options);
                let shard = shard.clone();
                let item = &item;
                async move {
                    self.container
                        .upsert_item(shard, &document.id, item, Some(options))
                        .await
                }
            })
            .await;
        if let Err(e) = result {
            tracing::warn!(
                delivery_id = %document.id,
                error = skyport_runtime::error_chain::error_chain(e.into_box().as_ref()),
                "Cannot write a Waiting delivery's timer; it is found from its status once overdue."
            );
        }
    }
}

impl std::fmt::Debug for TimerWrites {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TimerWrites")
            .field("shards", &self.shards)
            .finish_non_exhaustive()
    }
}
