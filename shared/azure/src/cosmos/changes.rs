//! [`ChangeSource`] on Cosmos DB: the latest-version change feed of the
//! status container, read by feed range.
//!
//! - The ranges are the container's feed ranges, read with a forced refresh
//!   of the partition key ranges, so a range that split shows as its
//!   children. Their bounds are the SDK's effective partition keys in
//!   upper-case hex: `""` is the lowest key and `"FF"` the end of the key
//!   space, as in [`FeedRange`].
//! - A read is exactly one page of the change feed (the SDK's iterator never
//!   ends; a 304 is an empty page). A change is the document as it is now
//!   (`current`), without the system properties (the keys starting with `_`,
//!   such as `_etag`, `_ts`, `_rid`) and the `ttl` of a settled document, so
//!   a handler sees the document the status store wrote, as on the embedded
//!   store.
//! - A continuation is this adapter's own JSON: `{"token": "c1.…", "lsn": N}`,
//!   the SDK's continuation token after the page and the LSN the range has
//!   been read through, taken from the page's ETag (real Cosmos DB: a quoted
//!   integer, `"123"`; the SDK's in-memory emulator: a JSON cursor
//!   `{"kind":"change_feed_cursor_v1","lsn":123,…}`), or after an empty page
//!   from its `x-ms-lsn` (the range's latest LSN). The SDK token of a range
//!   also resumes any range inside it: after a split, each child is read from
//!   its parent's continuation (the SDK scopes the saved position to the
//!   child's part of the key space).
//! - Pending is the range's latest LSN (`x-ms-lsn` of a one-item probe read
//!   from now) minus the LSN of the continuation: every write of the range
//!   after it counts, a document written twice twice.
//!
//! Every request is [`Work::ChangeFeed`], accounted as
//! [`Operation::ChangeFeed`].
//!
//! The changes a handler gave up on are dead letters in the dead-letter
//! container, next to the events' (which have no `kind`): `{id:
//! "change.{processor}.{key}", kind: "change", processor, key, reason, at,
//! payload, ttl}`, upserted, so the same change given up twice is kept once
//! (for `store.dead_letter_retention_s` after the last time). The
//! characters Cosmos DB does not allow in an id (`/`, `\`, `?`, `#`), `%`,
//! and `.` in the processor's name, are percent-encoded in the id, so two
//! letters never share one.

use std::num::NonZeroU32;

use async_trait::async_trait;
use azure_core::http::StatusCode;
use azure_data_cosmos::feed::{ContinuationToken, FeedPage, FeedRange as SdkFeedRange};
use azure_data_cosmos::models::{ChangeFeedItem, EffectivePartitionKey};
use azure_data_cosmos::options::{
    ChangeFeedOptions, ChangeFeedStartFrom, MaxItemCountHint, QueryOptions, ReadFeedRangesOptions,
};
use azure_data_cosmos::{CosmosError, CosmosStatus, FeedScope, Query};
use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::Value;
use skyport_core::ports::{
    BoxError, Change, ChangeDeadLetter, ChangeFeedError, ChangePage, ChangeSource, DeadLetterError,
    FeedRange, StartFrom,
};
use skyport_runtime::config::Work;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::charge::{Charged, Paged, charge};
use super::request_units::Operation;
use super::store::{CosmosStore, READ_PATIENCE};
use super::throttle::Failure;

/// A continuation this source gives out.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
struct Continuation {
    /// The SDK's continuation token (`c1.…`).
    token: String,
    /// The LSN the range has been read through.
    lsn: u64,
}

impl Continuation {
    fn parse(text: &str) -> Result<Self, ChangeFeedError> {
        serde_json::from_str(text).map_err(|e| bad_continuation(text, Box::new(e)))
    }

    fn to_text(&self) -> String {
        format!(
            r#"{{"token":{},"lsn":{}}}"#,
            Value::String(self.token.clone()),
            self.lsn
        )
    }
}

fn bad_continuation(continuation: &str, source: BoxError) -> ChangeFeedError {
    ChangeFeedError::BadContinuation {
        continuation: continuation.to_owned(),
        source,
    }
}

/// The LSN a change feed ETag names: an integer, quoted or not (real Cosmos
/// DB), or a JSON cursor with an `lsn` field (the in-memory emulator), itself
/// possibly quoted.
fn etag_lsn(etag: &str) -> Option<u64> {
    match serde_json::from_str::<Value>(etag.trim()).ok()? {
        Value::Number(number) => number.as_u64(),
        Value::String(text) => {
            let text = text.trim();
            if text.starts_with('{') {
                etag_lsn(text)
            } else {
                text.parse().ok()
            }
        }
        Value::Object(cursor) => match cursor.get("lsn")? {
            Value::Number(number) => number.as_u64(),
            Value::String(text) => text.parse().ok(),
            _ => None,
        },
        _ => None,
    }
}

/// Our range as the SDK's.
fn sdk_range(range: &FeedRange) -> Result<SdkFeedRange, ChangeFeedError> {
    let key = |hex: &str| {
        EffectivePartitionKey::try_from(hex).map_err(|e| ChangeFeedError::Unavailable(Box::new(e)))
    };
    SdkFeedRange::new(key(&range.min)?, key(&range.max)?)
        .map_err(|e| ChangeFeedError::Unavailable(Box::new(e)))
}

/// The SDK's range as ours: its bounds' upper-case hex, which is `""` for the
/// start of the key space and `"FF"` for its end.
fn our_range(range: &SdkFeedRange) -> FeedRange {
    FeedRange {
        min: range.min_inclusive().to_hex(),
        max: range.max_exclusive().to_hex(),
    }
}

fn sdk_start(start: StartFrom) -> ChangeFeedStartFrom {
    match start {
        StartFrom::Beginning => ChangeFeedStartFrom::Beginning,
        StartFrom::Now => ChangeFeedStartFrom::Now,
        StartFrom::Time(at) => ChangeFeedStartFrom::PointInTime(at),
    }
}

/// The document of a change without its system properties and its `ttl`.
fn change(item: ChangeFeedItem<Value>) -> Option<Change> {
    let mut document = item.current()?.clone();
    if let Value::Object(fields) = &mut document {
        fields.retain(|key, _| !key.starts_with('_') && key != "ttl");
    }
    let id = document
        .get("id")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    Some(Change { id, document })
}

/// The feed ranges (reading them is charged nothing).
struct Ranges(Vec<SdkFeedRange>);

impl Charged for Ranges {
    fn request_charge(&self) -> f64 {
        0.0
    }
}

/// One page of the change feed and the SDK's position after it.
struct OnePage {
    page: FeedPage<ChangeFeedItem<Value>>,
    token: ContinuationToken,
}

impl Charged for OnePage {
    fn request_charge(&self) -> f64 {
        charge(self.page.headers())
    }
}

impl CosmosStore {
    /// Reads one page of the status container's change feed over `scope`,
    /// from `token` or else from `start`.
    async fn change_feed_page(
        &self,
        scope: &SdkFeedRange,
        token: Option<&str>,
        start: StartFrom,
        max_items: u32,
    ) -> Result<OnePage, Failure> {
        let max_items = NonZeroU32::new(max_items).unwrap_or(NonZeroU32::MIN);
        self.requests
            .run(
                Work::ChangeFeed,
                Operation::ChangeFeed,
                u32::MAX,
                |options| async move {
                    let mut options = ChangeFeedOptions::default()
                        .with_operation_options(options)
                        .with_max_item_count(MaxItemCountHint::Limit(max_items));
                    if let Some(token) = token {
                        options = options.with_continuation_token(ContinuationToken::from_string(
                            token.to_owned(),
                        ));
                    }
                    let mut pages = self
                        .status
                        .query_change_feed::<Value>(
                            FeedScope::range(scope.clone()),
                            sdk_start(start),
                            Some(options),
                        )
                        .await?;
                    let page = pages.next().await.unwrap_or_else(|| {
                        Err(CosmosError::builder()
                            .with_status(CosmosStatus::new(StatusCode::InternalServerError))
                            .with_message("the change feed ended")
                            .build())
                    })?;
                    let token = pages.to_continuation_token()?;
                    Ok(OnePage { page, token })
                },
            )
            .await
    }
}

/// Why a read failed: the continuation when the SDK refused it (400), else
/// the change feed.
fn read_error(failure: Failure, from: Option<&str>) -> ChangeFeedError {
    match from {
        Some(continuation) if failure.status_code() == StatusCode::BadRequest => {
            bad_continuation(continuation, failure.into_box())
        }
        _ => ChangeFeedError::Unavailable(failure.into_box()),
    }
}

#[async_trait]
impl ChangeSource for CosmosStore {
    async fn ranges(&self) -> Result<Vec<FeedRange>, ChangeFeedError> {
        let ranges = self
            .requests
            .run(
                Work::ChangeFeed,
                Operation::ChangeFeed,
                u32::MAX,
                |options| async {
                    let options = ReadFeedRangesOptions::default()
                        .with_force_refresh(true)
                        .with_operation_options(options);
                    self.status
                        .read_feed_ranges(Some(options))
                        .await
                        .map(Ranges)
                },
            )
            .await
            .map_err(|e| ChangeFeedError::Unavailable(e.into_box()))?;
        let mut ranges: Vec<FeedRange> = ranges.0.iter().map(our_range).collect();
        ranges.sort();
        Ok(ranges)
    }

    async fn read(
        &self,
        range: &FeedRange,
        from: Option<&str>,
        start: StartFrom,
        max_items: u32,
    ) -> Result<ChangePage, ChangeFeedError> {
        let position = from.map(Continuation::parse).transpose()?;
        let scope = sdk_range(range)?;
        let OnePage { page, token } = self
            .change_feed_page(
                &scope,
                position.as_ref().map(|p| p.token.as_str()),
                start,
                max_items,
            )
            .await
            .map_err(|e| read_error(e, from))?;
        // An empty page (304) says the range has nothing after the position:
        // it has been read through its latest LSN (`x-ms-lsn`; the ETag may
        // still name the position, as the emulator's does, which would leave
        // a split's extra LSN pending). A page whose headers name no LSN
        // keeps the position's.
        let headers = page.headers();
        let etag = headers.etag().and_then(|etag| etag_lsn(etag.as_ref()));
        let lsn = if page.items().is_empty() {
            headers.lsn().or(etag)
        } else {
            etag
        }
        .or(position.map(|p| p.lsn))
        .unwrap_or(0);
        let changes = page.into_items().into_iter().filter_map(change).collect();
        Ok(ChangePage {
            changes,
            continuation: Continuation {
                token: token.as_str().to_owned(),
                lsn,
            }
            .to_text(),
            skipped: 0,
        })
    }

    async fn pending(
        &self,
        range: &FeedRange,
        from: Option<&str>,
        start: StartFrom,
    ) -> Result<u64, ChangeFeedError> {
        let read_through = match (from.map(Continuation::parse).transpose()?, start) {
            (Some(position), _) => position.lsn,
            (None, StartFrom::Now) => return Ok(0),
            (None, StartFrom::Beginning | StartFrom::Time(_)) => 0,
        };
        let OnePage { page, .. } = self
            .change_feed_page(&sdk_range(range)?, None, StartFrom::Now, 1)
            .await
            .map_err(|e| ChangeFeedError::Unavailable(e.into_box()))?;
        let headers = page.headers();
        let latest = headers
            .lsn()
            .or_else(|| headers.etag().and_then(|etag| etag_lsn(etag.as_ref())))
            .ok_or_else(|| {
                ChangeFeedError::Unavailable("the change feed named no LSN (x-ms-lsn)".into())
            })?;
        Ok(latest.saturating_sub(read_through))
    }
}

/// What marks a change's dead letter in the dead-letter container.
const CHANGE_KIND: &str = "change";

/// `text` with the characters in `escaped`, and `%`, percent-encoded.
fn id_part(text: &str, escaped: &[char]) -> String {
    let mut part = String::with_capacity(text.len());
    for c in text.chars() {
        if c == '%' || escaped.contains(&c) {
            part.push_str(&format!("%{:02X}", u32::from(c)));
        } else {
            part.push(c);
        }
    }
    part
}

/// The id of a change's dead letter: `change.{processor}.{key}`, encoded.
fn change_letter_id(processor: &str, key: &str) -> String {
    const NOT_IN_IDS: [char; 4] = ['/', '\\', '?', '#'];
    let mut in_processor = NOT_IN_IDS.to_vec();
    in_processor.push('.');
    format!(
        "{CHANGE_KIND}.{}.{}",
        id_part(processor, &in_processor),
        id_part(key, &NOT_IN_IDS)
    )
}

/// A change's dead letter as stored.
#[derive(Debug, Deserialize)]
struct StoredChange {
    processor: String,
    key: String,
    reason: String,
    #[serde(with = "time::serde::rfc3339")]
    at: OffsetDateTime,
    payload: Value,
}

impl CosmosStore {
    pub(super) async fn put_change_dead_letter(
        &self,
        letter: ChangeDeadLetter,
    ) -> Result<(), DeadLetterError> {
        let id = change_letter_id(&letter.processor, &letter.key);
        let document = serde_json::json!({
            "id": id,
            "kind": CHANGE_KIND,
            "processor": letter.processor,
            "key": letter.key,
            "reason": letter.reason,
            "at": letter.at.format(&Rfc3339).unwrap_or_default(),
            "payload": letter.payload,
            "ttl": self.dead_letter_ttl,
        });
        self.upsert_dead_letter(id, &document).await
    }

    /// At most `limit` of `processor`'s dead-lettered changes after key
    /// `after`, by key: a query with `TOP` and `ORDER BY c.key`, so that a
    /// page reads at most `limit` however many there are. After
    /// [`READ_PATIENCE`] 429s it answers unavailable: an operator asks again.
    pub(super) async fn change_dead_letters(
        &self,
        processor: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<ChangeDeadLetter>, DeadLetterError> {
        let unavailable = |e: BoxError| DeadLetterError::Unavailable(e);
        let query = Query::from(format!(
            "SELECT TOP {limit} * FROM c WHERE c.kind = @kind AND c.processor = @processor \
             AND c.key > @after ORDER BY c.key"
        ))
        .with_parameter("@kind", CHANGE_KIND)
        .and_then(|query| query.with_parameter("@processor", processor))
        .and_then(|query| query.with_parameter("@after", after.unwrap_or_default()))
        .map_err(|e| unavailable(Box::new(e)))?;
        let stored: Paged<StoredChange> = self
            .requests
            .run(
                Work::DeadLetters,
                Operation::Query,
                READ_PATIENCE,
                |options| async {
                    let options = QueryOptions::default().with_operation_options(options);
                    let query = self
                        .dead_letters
                        .query_items::<StoredChange>(
                            query.clone(),
                            FeedScope::full_container(),
                            Some(options),
                        )
                        .await?;
                    Paged::read_all(query).await
                },
            )
            .await
            .map_err(|e| unavailable(e.into_box()))?;
        Ok(stored
            .items
            .into_iter()
            .map(|s| ChangeDeadLetter {
                processor: s.processor,
                key: s.key,
                reason: s.reason,
                payload: s.payload,
                at: s.at,
            })
            .collect())
    }
}

#[cfg(all(test, feature = "cosmos-emulator"))]
mod emulator_tests;

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn an_etag_names_its_lsn_in_either_form() {
        assert_eq!(etag_lsn("\"123\""), Some(123));
        assert_eq!(etag_lsn("123"), Some(123));
        assert_eq!(
            etag_lsn(r#"{"kind":"change_feed_cursor_v1","lsn":42,"epk":"05C1","id":"a"}"#),
            Some(42)
        );
        assert_eq!(
            etag_lsn(r#""{\"kind\":\"change_feed_cursor_v1\",\"lsn\":7}""#),
            Some(7)
        );
        assert_eq!(etag_lsn(r#"{"lsn":"9"}"#), Some(9));
        assert_eq!(etag_lsn("\"0x8DC\""), None);
        assert_eq!(etag_lsn(r#"{"kind":"change_feed_cursor_v1"}"#), None);
        assert_eq!(etag_lsn(""), None);
        assert_eq!(etag_lsn("-1"), None);
    }

    #[test]
    fn a_continuation_is_our_json_or_bad() {
        let continuation = Continuation {
            token: "c1.abc".into(),
            lsn: 17,
        };
        let text = continuation.to_text();
        assert_eq!(text, r#"{"token":"c1.abc","lsn":17}"#);
        assert_eq!(Continuation::parse(&text).unwrap(), continuation);
        for bad in ["", "17", "c1.abc", r#"{"token":"c1.abc"}"#] {
            assert!(matches!(
                Continuation::parse(bad),
                Err(ChangeFeedError::BadContinuation { continuation, .. }) if continuation == bad
            ));
        }
    }

    #[test]
    fn ranges_keep_their_bounds_across_the_sdk() {
        let full = our_range(&SdkFeedRange::full());
        assert_eq!(full, FeedRange::full());
        let part = FeedRange {
            min: "3FFFFFFFFFFFFFFFFFFFFFFFFFFFFFFF".into(),
            max: "FF".into(),
        };
        assert_eq!(our_range(&sdk_range(&part).unwrap()), part);
        let lower = FeedRange {
            min: "3fff".into(),
            max: "7FFF".into(),
        };
        assert_eq!(our_range(&sdk_range(&lower).unwrap()).min, "3FFF");
        let odd = FeedRange {
            min: "3FF".into(),
            max: "FF".into(),
        };
        assert!(matches!(
            sdk_range(&odd),
            Err(ChangeFeedError::Unavailable(_))
        ));
    }

    #[test]
    fn a_change_letters_id_is_allowed_in_cosmos_and_unique() {
        assert_eq!(
            change_letter_id("notify", "d1.Failed"),
            "change.notify.d1.Failed"
        );
        assert_eq!(
            change_letter_id("a/b", r"x\y?z#%"),
            "change.a%2Fb.x%5Cy%3Fz%23%25"
        );
        // A '.' in the processor's name cannot move the boundary to the key.
        assert_ne!(change_letter_id("a.b", "c"), change_letter_id("a", "b.c"));
        assert_ne!(change_letter_id("p", "a/b"), change_letter_id("p", "a%2Fb"));
    }

    #[test]
    fn a_change_is_the_document_without_system_properties_or_ttl() {
        let item: ChangeFeedItem<Value> = serde_json::from_value(serde_json::json!({
            "current": {"id": "d1", "state": "Accepted", "_etag": "\"1\"", "_ts": 5, "_rid": "x", "ttl": 60},
            "metadata": {"crts": 5}
        }))
        .unwrap();
        let change = change(item).unwrap();
        assert_eq!(change.id, "d1");
        assert_eq!(
            change.document,
            serde_json::json!({"id": "d1", "state": "Accepted"})
        );
    }
}
