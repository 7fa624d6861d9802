//! Conditional status writes, executed batch by batch for the bulk dispatcher
//! ([`StatusBatches`]).
//!
//! If-None-Match is `create_item` (409: the document exists); If-Match is
//! `replace_item` with the ETag (412, or 404 for a vanished document: it
//! changed). Both come back as [`StatusStoreError::PreconditionFailed`], so
//! the caller re-reads and decides again.
//!
//! A settled document (terminal, and its callback, if any, delivered or
//! dead-lettered) is written with a `ttl` of `store.status_retention_s`,
//! which Cosmos DB counts from the write; an unsettled one without, so a
//! document is never removed while its callback is still owed, and a write
//! that makes a document unsettled again drops its `ttl`. A Scheduled
//! delivery settles at its deadline, so its `ttl` adds the time until then:
//! it can be read, cancelled and rescheduled until the deadline and the
//! retention after it have passed.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use azure_core::http::Etag;
use azure_data_cosmos::ContainerClient;
use azure_data_cosmos::options::{ItemWriteOptions, Precondition as CosmosPrecondition};
use serde::Serialize;
use skyport_runtime::config::Work;
use time::OffsetDateTime;

use super::bulk::Executor;
use super::request_units::Operation;
use super::throttle::Requests;
use super::timer_writes::TimerWrites;
use skyport_core::ports::{ETag, Precondition, StatusStoreError};
use skyport_core::status::StatusDocument;

/// `at` in Unix milliseconds: a status document's `createdMs`, which the
/// listing sorts on and its cursor counts, and the `runsAtMs` of a Waiting
/// one and of its timer.
pub(super) fn unix_ms(at: OffsetDateTime) -> i64 {
    i64::try_from(at.unix_timestamp_nanos() / 1_000_000).unwrap_or(i64::MAX)
}

/// One queued status write.
#[derive(Debug)]
pub(super) struct StatusWrite {
    pub(super) document: StatusDocument,
    pub(super) condition: Precondition,
}

/// A status document as stored: with its `createdMs`, which listing filters
/// and sorts on ([`super::listing`]), and a `ttl` (seconds after this
/// write) once it is settled.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Item<'a> {
    #[serde(flatten)]
    document: &'a StatusDocument,
    created_ms: i64,
    /// While Waiting: when its steps run, which lost timers are found by.
    #[serde(skip_serializing_if = "Option::is_none")]
    runs_at_ms: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ttl: Option<u64>,
}

impl<'a> Item<'a> {
    /// `document`, written at `now`, to expire `settled_ttl` seconds after
    /// it is settled. An unsettled document carries no `ttl`, so the
    /// container's default (-1) keeps it until a write settles it: it is
    /// never removed while its callback is still owed.
    fn new(document: &'a StatusDocument, settled_ttl: u64, now: OffsetDateTime) -> Self {
        Self {
            document,
            created_ms: unix_ms(document.created_at),
            runs_at_ms: document.due_at().map(unix_ms),
            ttl: ttl_of(document, settled_ttl, now),
        }
    }
}

/// The longest `ttl` Cosmos DB takes, in seconds (about 68 years).
const MAX_TTL: u64 = i32::MAX as u64;

/// The `ttl` `document` is stored with when written at `now`: none before it
/// is settled;
/// once it is, `settled_ttl` counted from when it settles ([`StatusDocument::settled_at`]:
/// a Scheduled delivery's deadline, when that is later), in whole seconds
/// rounded up, at most [`MAX_TTL`].
fn ttl_of(document: &StatusDocument, settled_ttl: u64, now: OffsetDateTime) -> Option<u64> {
    let settled = document.settled_at(now)?;
    let wait = settled - now;
    let wait_s = u64::try_from(wait.whole_seconds())
        .unwrap_or(0)
        .saturating_add(u64::from(wait.subsec_nanoseconds() > 0));
    Some(settled_ttl.saturating_add(wait_s).min(MAX_TTL))
}

pub(super) struct StatusBatches {
    container: ContainerClient,
    requests: Arc<Requests>,
    /// `store.status_retention_s`: the `ttl` of a settled document.
    settled_ttl: u64,
    /// The timers of the Waiting documents written.
    timers: TimerWrites,
}

impl std::fmt::Debug for StatusBatches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatusBatches").finish_non_exhaustive()
    }
}

impl StatusBatches {
    pub(super) fn new(
        container: ContainerClient,
        requests: Arc<Requests>,
        settled_ttl: u64,
        timers: TimerWrites,
    ) -> Self {
        Self {
            container,
            requests,
            settled_ttl,
            timers,
        }
    }

    async fn write(&self, write: &StatusWrite) -> Result<ETag, StatusStoreError> {
        let id = &write.document.id;
        let item = Item::new(&write.document, self.settled_ttl, OffsetDateTime::now_utc());
        let result = self
            .requests
            .run(
                Work::StatusWrites,
                Operation::Write,
                u32::MAX,
                |options| async {
                    let options = ItemWriteOptions::default().with_operation_options(options);
                    match &write.condition {
                        Precondition::IfNoneMatch => {
                            self.container
                                .create_item(id.clone(), id, &item, Some(options))
                                .await
                        }
                        Precondition::IfMatch(ETag(tag)) => {
                            let options = options.with_precondition(CosmosPrecondition::if_match(
                                Etag::from(tag.clone()),
                            ));
                            self.container
                                .replace_item(id.clone(), id, &item, Some(options))
                                .await
                        }
                    }
                },
            )
            .await;
        match result {
            Ok(response) => {
                let etag = response
                    .headers()
                    .etag()
                    .map(ToString::to_string)
                    .ok_or_else(|| StatusStoreError::Corrupt {
                        id: id.clone(),
                        source: "the write carried no ETag".into(),
                    })?;
                // The status first: a timer never fires before its document is Waiting.
                if let (Some(runs_at), Some(ms)) = (write.document.due_at(), item.runs_at_ms) {
                    self.timers.follow(&write.document, runs_at, ms).await;
                }
                Ok(ETag(etag))
            }
            Err(e) if e.lost_race() => Err(StatusStoreError::PreconditionFailed),
            Err(e) => Err(StatusStoreError::Unavailable(e.into_box())),
        }
    }
}

impl Executor<StatusWrite, Result<ETag, StatusStoreError>> for StatusBatches {
    fn execute(
        &self,
        _key: String,
        writes: Vec<StatusWrite>,
    ) -> Pin<Box<dyn Future<Output = Vec<Result<ETag, StatusStoreError>>> + Send + '_>> {
        Box::pin(async move {
            // The writes of one key run in order: each may be conditional on the one before.
            let mut results = Vec::with_capacity(writes.len());
            for write in &writes {
                results.push(self.write(write).await);
            }
            results
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use skyport_core::status::{CallbackOutcome, CallbackState, DeliveryState, StatusDocument};
    use time::format_description::well_known::Rfc3339;
    use time::macros::datetime;
    use time::{Duration, OffsetDateTime};

    use super::{Item, ttl_of};

    const TTL: u64 = 604_800;

    fn document(state: DeliveryState, callback: Option<CallbackState>) -> StatusDocument {
        let mut document = StatusDocument::accepted("d-1", OffsetDateTime::UNIX_EPOCH);
        document.state = state;
        if let Some(callback) = callback {
            document.callback_url = Some("https://receiver.example/done".into());
            document.callback = Some(CallbackOutcome {
                state: callback,
                announced: state,
                attempts: 1,
                last_error: None,
                delivered_at: None,
                retrying_since: None,
            });
        }
        document
    }

    fn stored(document: &StatusDocument) -> serde_json::Value {
        serde_json::to_value(Item::new(document, TTL, OffsetDateTime::UNIX_EPOCH)).unwrap()
    }

    /// A Scheduled delivery whose request has `deadline`.
    fn scheduled_until(deadline: OffsetDateTime) -> StatusDocument {
        let rfc3339 = |at: OffsetDateTime| at.format(&Rfc3339).unwrap();
        let request = serde_json::json!({
            "ownerId": "owner-1",
            "pickupLocation": "a",
            "pickupTime": rfc3339(deadline - Duration::HOUR),
            "deadline": rfc3339(deadline),
            "dropoffLocation": "b",
            "packageInfo": {"packageId": "p-1", "size": "Small", "weight": 1.0},
        });
        StatusDocument {
            request: Some(serde_json::from_value(request).unwrap()),
            ..document(DeliveryState::Scheduled, None)
        }
    }

    #[test]
    fn a_scheduled_delivery_expires_the_retention_after_its_deadline() {
        let now = datetime!(2026-11-28 12:00 UTC);
        let ttl = |document: &StatusDocument| ttl_of(document, TTL, now);
        let in_ten_days = scheduled_until(now + Duration::days(10));
        assert_eq!(ttl(&in_ten_days), Some(TTL + 10 * 86_400));
        let in_a_moment = scheduled_until(now + Duration::milliseconds(1_500));
        assert_eq!(ttl(&in_a_moment), Some(TTL + 2), "rounded up");
        let passed = scheduled_until(now - Duration::days(1));
        assert_eq!(ttl(&passed), Some(TTL), "as any settled document");
        let far = scheduled_until(datetime!(9999-01-01 00:00 UTC));
        assert_eq!(
            ttl(&far),
            Some(i32::MAX as u64),
            "the longest Cosmos DB takes"
        );
        let older = document(DeliveryState::Scheduled, None);
        assert_eq!(ttl(&older), Some(TTL), "no request: as before");
        let pending = document(DeliveryState::Scheduled, Some(CallbackState::Pending));
        let retried = StatusDocument {
            callback_url: pending.callback_url,
            callback: pending.callback,
            ..in_ten_days.clone()
        };
        assert_eq!(ttl(&retried), None, "its callback is retried");
        let unsent = StatusDocument {
            callback_url: retried.callback_url,
            ..in_ten_days
        };
        assert_eq!(ttl(&unsent), Some(TTL + 10 * 86_400), "not yet sent");
    }

    #[test]
    fn a_terminal_document_without_a_callback_is_stored_with_the_retention_as_its_ttl() {
        let item = stored(&document(DeliveryState::Scheduled, None));
        assert_eq!(item["ttl"], TTL);
        assert_eq!(item["id"], "d-1");
        assert_eq!(item["state"], "Scheduled");
    }

    #[test]
    fn every_document_is_stored_with_its_creation_time_in_milliseconds() {
        let mut document = document(DeliveryState::Processing, None);
        document.created_at = datetime!(2030-01-01 00:00:01.5 UTC);
        assert_eq!(stored(&document)["createdMs"], 1_893_456_001_500_i64);
    }

    #[test]
    fn a_terminal_document_whose_callback_is_not_retried_is_stored_with_a_ttl() {
        // Not yet sent, or delivered at its first attempt, it records nothing.
        let mut unsent = document(DeliveryState::Cancelled, None);
        unsent.callback_url = Some("https://receiver.example/done".into());
        assert_eq!(stored(&unsent)["ttl"], TTL);
        for done in [CallbackState::Delivered, CallbackState::DeadLettered] {
            let item = stored(&document(DeliveryState::Failed, Some(done)));
            assert_eq!(item["ttl"], TTL, "{done:?}");
        }
    }

    #[test]
    fn a_document_that_is_not_settled_is_stored_without_a_ttl() {
        let pending = document(DeliveryState::Scheduled, Some(CallbackState::Pending));
        for document in [
            document(DeliveryState::Accepted, None),
            document(DeliveryState::Processing, None),
            pending,
        ] {
            let item = stored(&document);
            assert!(item.get("ttl").is_none(), "{item}");
        }
    }

    #[test]
    fn a_stored_document_reads_back_whole_past_its_ttl_and_creation_time() {
        let document = document(DeliveryState::Scheduled, Some(CallbackState::Delivered));
        let read: StatusDocument = serde_json::from_value(stored(&document)).unwrap();
        assert_eq!(read, document);
    }
}
