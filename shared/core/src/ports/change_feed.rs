//! The change feed of the status documents: every write of a document, in the
//! order a part of the store made it, read from a position kept by the reader.
//!
//! The feed is read in ranges (a Cosmos DB feed range; the embedded store's
//! one sequence), each from a continuation the source gave out. Only a
//! document's latest version is guaranteed to appear: a document written twice
//! between two reads may appear once. The change-feed processor keeps one
//! lease per range in a [`LeaseStore`](super::LeaseStore) and hands each batch
//! to a handler.

use async_trait::async_trait;
use serde_json::Value;
use time::OffsetDateTime;

use crate::error::BoxError;

/// The prefix of the name of each lease a change-feed processor keeps per
/// range in a [`LeaseStore`](super::LeaseStore), and the fields of it that say
/// where the range was checkpointed and whether the lease is retired (split).
/// A source that removes old changes reads them, so that it never removes a
/// change that a live lease has not checkpointed past.
pub const RANGE_LEASE_PREFIX: &str = "range.";
pub const LEASE_CONTINUATION: &str = "continuation";
pub const LEASE_RETIRED: &str = "retired";

/// A part of the feed read on its own: an effective-partition-key range
/// `[min, max)` in upper-case hex (`""` is the lowest key, `"FF"` the end).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FeedRange {
    pub min: String,
    pub max: String,
}

impl FeedRange {
    /// The whole key space.
    pub fn full() -> Self {
        Self {
            min: String::new(),
            max: "FF".into(),
        }
    }

    /// Whether every key of `other` is in this range.
    pub fn contains(&self, other: &Self) -> bool {
        epk(&self.min) <= epk(&other.min) && epk(&other.max) <= epk(&self.max)
    }

    /// A name for the range, usable in a lease's name: `min-max`.
    pub fn name(&self) -> String {
        format!("{}-{}", self.min, self.max)
    }
}

/// Orders effective partition keys as the store does: by their bytes, with
/// `FF` as the end of the key space.
fn epk(key: &str) -> (bool, &str) {
    (key.eq_ignore_ascii_case("FF"), key)
}

/// Where a range with no continuation yet starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartFrom {
    /// Every document in the store.
    Beginning,
    /// Only what is written from the first read on.
    Now,
    /// What is written from this time on (the embedded store and the Cosmos
    /// SDK read from the beginning when they cannot start at a time).
    Time(OffsetDateTime),
}

/// One change: a document as it is now.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    /// The document's id.
    pub id: String,
    pub document: Value,
}

/// The changes of a range after a position, and the position after them.
#[derive(Debug, Clone, PartialEq)]
pub struct ChangePage {
    pub changes: Vec<Change>,
    /// Where the next read of this range starts once these are handled.
    pub continuation: String,
    /// Changes the page passed over ([`ChangeSource::read_having`]): the
    /// position moved past them although `changes` may be empty.
    pub skipped: usize,
}

/// The ids of the documents changed in a range after a position
/// ([`ChangeSource::read_ids`]), and the position after them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChangedIds {
    pub ids: Vec<String>,
    /// Where the next read of this range starts.
    pub continuation: String,
    /// Whether the read stopped at `max_items`, with more to read.
    pub more: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum ChangeFeedError {
    #[error("the change feed cannot be read")]
    Unavailable(#[source] BoxError),
    #[error("the continuation {continuation:?} is not one this change feed gave out")]
    BadContinuation {
        continuation: String,
        #[source]
        source: BoxError,
    },
}

/// A store's change feed of status documents, read by range.
#[async_trait]
pub trait ChangeSource: std::fmt::Debug + Send + Sync + 'static {
    /// The ranges the feed is read in now (re-read from the store: a range
    /// that split shows as its children).
    ///
    /// # Errors
    /// [`ChangeFeedError::Unavailable`] when the store cannot be asked.
    async fn ranges(&self) -> Result<Vec<FeedRange>, ChangeFeedError>;

    /// Up to `max_items` changes of `range` after `from` (a continuation this
    /// source gave out for `range` or a range that contains it), or from
    /// `start` when there is none. An empty page keeps the position.
    ///
    /// # Errors
    /// [`ChangeFeedError`] when the store cannot be read or `from` is not a
    /// continuation of this source.
    async fn read(
        &self,
        range: &FeedRange,
        from: Option<&str>,
        start: StartFrom,
        max_items: u32,
    ) -> Result<ChangePage, ChangeFeedError>;

    /// As [`ChangeSource::read`], handing over only the changes whose
    /// document has the top-level `field` (not null); the others are passed
    /// over and counted in [`ChangePage::skipped`]. A source that can tell
    /// without decoding a document overrides this.
    ///
    /// # Errors
    /// As [`ChangeSource::read`].
    async fn read_having(
        &self,
        range: &FeedRange,
        from: Option<&str>,
        start: StartFrom,
        max_items: u32,
        field: &str,
    ) -> Result<ChangePage, ChangeFeedError> {
        let mut page = self.read(range, from, start, max_items).await?;
        let read = page.changes.len();
        page.changes.retain(|change| {
            change
                .document
                .get(field)
                .is_some_and(|value| !value.is_null())
        });
        page.skipped += read - page.changes.len();
        Ok(page)
    }

    /// As [`ChangeSource::read`], for a reader that needs only to know which
    /// documents changed. A source that can tell without reading the
    /// documents overrides this.
    ///
    /// # Errors
    /// As [`ChangeSource::read`].
    async fn read_ids(
        &self,
        range: &FeedRange,
        from: Option<&str>,
        start: StartFrom,
        max_items: u32,
    ) -> Result<ChangedIds, ChangeFeedError> {
        let page = self.read(range, from, start, max_items).await?;
        let read = page.changes.len() + page.skipped;
        Ok(ChangedIds {
            more: read >= usize::try_from(max_items).unwrap_or(usize::MAX),
            ids: page.changes.into_iter().map(|change| change.id).collect(),
            continuation: page.continuation,
        })
    }

    /// A number that moves with every change this source makes readable,
    /// when the source can tell (the embedded store's commits); `None`, the
    /// default, leaves its readers to poll.
    fn version(&self) -> Option<u64> {
        None
    }

    /// Resolves once [`ChangeSource::version`] is no longer `seen` (at once
    /// if it moved already); never, the default, for a source that cannot
    /// tell.
    async fn changed_since(&self, seen: u64) {
        let _ = seen;
        std::future::pending::<()>().await;
    }

    /// How many changes of `range` after `from` are not read yet (the
    /// estimator's figure: the store's sequence numbers, so a document
    /// written twice counts twice).
    ///
    /// # Errors
    /// As [`ChangeSource::read`].
    async fn pending(
        &self,
        range: &FeedRange,
        from: Option<&str>,
        start: StartFrom,
    ) -> Result<u64, ChangeFeedError>;
}

#[cfg(test)]
mod tests {
    use super::FeedRange;

    fn range(min: &str, max: &str) -> FeedRange {
        FeedRange {
            min: min.into(),
            max: max.into(),
        }
    }

    #[test]
    fn the_full_range_contains_its_parts() {
        let full = FeedRange::full();
        assert!(full.contains(&range("", "3F")));
        assert!(full.contains(&range("3F", "FF")));
        assert!(full.contains(&full));
        assert!(!range("", "3F").contains(&full));
        assert!(!range("3F", "7F").contains(&range("", "7F")));
        assert!(range("3F", "7F").contains(&range("3F", "5F")));
    }

    #[test]
    fn a_range_is_named_by_its_bounds() {
        assert_eq!(range("", "3F").name(), "-3F");
        assert_eq!(range("3F", "FF").name(), "3F-FF");
    }
}
