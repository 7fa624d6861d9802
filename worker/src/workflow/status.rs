//! Status writes of the workflow: conditional, retried, never moving a
//! terminal state back.
//!
//! Every write goes through [`StatusWriter::update`], a read-decide-write loop
//! on the document's version (or [`StatusWriter::update_likely_new`], which
//! decides on "absent" before reading): a conflict re-reads and decides again;
//! a store outage is retried with backoff until it passes or the event is
//! given up (it is then read again: see [`super::retry`]).

use std::sync::Arc;

use skyport_core::ports::{Precondition, StatusStore, StatusStoreError, Versioned};
use skyport_core::status::StatusDocument;
use skyport_runtime::trace_span;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::retry::{Interrupted, Retries, RetryPolicy};

/// What a failed status write or read is logged as.
const STORE: &str = "The status store";

/// What to do with the document as it stands.
#[derive(Debug)]
#[allow(
    clippy::large_enum_variant,
    reason = "returned by a closure and consumed at once, never stored"
)]
pub enum Decision<T> {
    /// Write this document (on the version just read) and answer `T`.
    Write(StatusDocument, T),
    /// Leave the document as it is and answer `T`.
    Keep(T),
}

#[derive(Debug, Clone)]
pub struct StatusWriter {
    store: Arc<dyn StatusStore>,
    retries: RetryPolicy,
}

impl StatusWriter {
    pub fn new(store: Arc<dyn StatusStore>, retries: RetryPolicy) -> Self {
        Self { store, retries }
    }

    /// Reads the document of `id`, retrying while the store is unavailable.
    ///
    /// # Errors
    /// [`Interrupted`] when `abandon` fires first, or (while retrying) when
    /// the event is to be read again.
    pub async fn current(
        &self,
        id: &str,
        abandon: &CancellationToken,
    ) -> Result<Option<Versioned>, Interrupted> {
        Retries::new(self.retries, abandon)
            .until_done(STORE, || self.store.get(id))
            .await
    }

    /// Decides on the document of `id` (starting from `known` when the caller
    /// holds a recent version, else from a read) and writes what `decide` asks
    /// for, conditional on the version it decided on. Returns the answer and
    /// the document as it now stands.
    ///
    /// # Errors
    /// [`Interrupted`] when `abandon` fires before the write is durable, or
    /// when the event is to be read again.
    pub async fn update<T>(
        &self,
        id: &str,
        known: Option<Versioned>,
        abandon: &CancellationToken,
        decide: impl FnMut(Option<&StatusDocument>) -> Decision<T>,
    ) -> Result<(T, Option<Versioned>), Interrupted> {
        async {
            let current = match known {
                Some(known) => Some(known),
                None => self.current(id, abandon).await?,
            };
            self.decide_and_write(id, current, true, abandon, decide)
                .await
        }
        .instrument(trace_span!("status write"))
        .await
    }

    /// [`Self::update`] for a document that is most often absent (a delivery
    /// seen for the first time): `decide` first rules on "absent" and the
    /// write is conditional on that, so the stored document is read only when
    /// the write finds one, or when the decision is to keep what is there.
    ///
    /// # Errors
    /// [`Interrupted`] when `abandon` fires before the write is durable, or
    /// when the event is to be read again.
    pub async fn update_likely_new<T>(
        &self,
        id: &str,
        abandon: &CancellationToken,
        decide: impl FnMut(Option<&StatusDocument>) -> Decision<T>,
    ) -> Result<(T, Option<Versioned>), Interrupted> {
        self.decide_and_write(id, None, false, abandon, decide)
            .instrument(trace_span!("status write"))
            .await
    }

    /// `read`: whether `current` is what the store held (else it is assumed absent).
    async fn decide_and_write<T>(
        &self,
        id: &str,
        mut current: Option<Versioned>,
        mut read: bool,
        abandon: &CancellationToken,
        mut decide: impl FnMut(Option<&StatusDocument>) -> Decision<T>,
    ) -> Result<(T, Option<Versioned>), Interrupted> {
        let mut retries = Retries::new(self.retries, abandon);
        loop {
            let (document, answer) = match decide(current.as_ref().map(|c| &c.document)) {
                Decision::Keep(answer) if read => return Ok((answer, current)),
                Decision::Keep(_) => {
                    current = self.current(id, abandon).await?;
                    read = true;
                    continue;
                }
                Decision::Write(document, answer) => (document, answer),
            };
            if let Some(stored) = &current {
                debug_assert!(
                    stored.document.may_become(&document),
                    "{:?} in epoch {} -> {:?} in epoch {}",
                    stored.document.state,
                    stored.document.epoch,
                    document.state,
                    document.epoch
                );
            }
            let condition = current.as_ref().map_or(Precondition::IfNoneMatch, |c| {
                Precondition::IfMatch(c.etag.clone())
            });
            match self.store.put(&document, condition).await {
                Ok(etag) => return Ok((answer, Some(Versioned { document, etag }))),
                Err(StatusStoreError::PreconditionFailed) => {}
                Err(e) => retries.wait_out(STORE, &e).await?,
            }
            current = self.current(id, abandon).await?;
            read = true;
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    use async_trait::async_trait;
    use skyport_core::ports::{ETag, ListPage, ListQuery};
    use skyport_core::status::DeliveryState;
    use skyport_embedded::EmbeddedStore;
    use skyport_runtime::backoff::Backoff;
    use skyport_runtime::config::EmbeddedSettings;
    use time::OffsetDateTime;

    use super::*;

    /// The embedded store on disk, counting reads.
    #[derive(Debug)]
    struct CountingReads {
        store: Arc<EmbeddedStore>,
        reads: AtomicU32,
    }

    #[async_trait]
    impl StatusStore for CountingReads {
        async fn get(&self, id: &str) -> Result<Option<Versioned>, StatusStoreError> {
            self.reads.fetch_add(1, Ordering::Relaxed);
            self.store.get(id).await
        }

        async fn put(
            &self,
            document: &StatusDocument,
            condition: Precondition,
        ) -> Result<ETag, StatusStoreError> {
            self.store.put(document, condition).await
        }

        async fn list(&self, query: &ListQuery) -> Result<ListPage, StatusStoreError> {
            self.store.list(query).await
        }

        async fn ready(&self) -> bool {
            true
        }
    }

    fn writer(dir: &tempfile::TempDir) -> (StatusWriter, Arc<CountingReads>) {
        let settings = EmbeddedSettings {
            data_dir: dir.path().to_path_buf(),
            segment_size_mb: 1,
            ..EmbeddedSettings::default()
        };
        let store = Arc::new(CountingReads {
            store: EmbeddedStore::open(&settings, 1).unwrap(),
            reads: AtomicU32::new(0),
        });
        let retries = RetryPolicy {
            backoff: Backoff::new(Duration::from_millis(1), Duration::from_millis(10)),
            redeliver_after: None,
        };
        (StatusWriter::new(store.clone(), retries), store)
    }

    /// Starts processing: a new document, or the stored one with one more attempt.
    fn begin(current: Option<&StatusDocument>) -> Decision<u32> {
        let mut next = current
            .cloned()
            .unwrap_or_else(|| StatusDocument::accepted("d-1", OffsetDateTime::now_utc()));
        next.state = DeliveryState::Processing;
        next.attempt += 1;
        Decision::Write(next, 0)
    }

    #[tokio::test]
    async fn a_likely_new_document_is_written_without_a_read() {
        let dir = tempfile::tempdir().unwrap();
        let (writer, store) = writer(&dir);
        let abandon = CancellationToken::new();
        let (_, written) = writer
            .update_likely_new("d-1", &abandon, begin)
            .await
            .unwrap();
        assert_eq!(written.unwrap().document.attempt, 1);
        assert_eq!(store.reads.load(Ordering::Relaxed), 0);
    }

    #[tokio::test]
    async fn a_likely_new_document_that_exists_is_read_and_decided_on_again() {
        let dir = tempfile::tempdir().unwrap();
        let (writer, store) = writer(&dir);
        let abandon = CancellationToken::new();
        writer
            .update_likely_new("d-1", &abandon, begin)
            .await
            .unwrap();
        let (_, written) = writer
            .update_likely_new("d-1", &abandon, begin)
            .await
            .unwrap();
        // The conditional create failed, so the stored attempt was read and counted on.
        assert_eq!(written.unwrap().document.attempt, 2);
        assert_eq!(store.reads.load(Ordering::Relaxed), 1);
        let stored = store.get("d-1").await.unwrap().unwrap();
        assert_eq!(stored.document.attempt, 2);
    }

    #[tokio::test]
    async fn keeping_what_is_there_is_decided_on_what_the_store_holds() {
        let dir = tempfile::tempdir().unwrap();
        let (writer, store) = writer(&dir);
        let abandon = CancellationToken::new();
        writer
            .update_likely_new("d-1", &abandon, begin)
            .await
            .unwrap();
        // Keep when absent: an "absent" guess is never the answer without a read.
        let (seen, current) = writer
            .update_likely_new("d-1", &abandon, |current| {
                Decision::Keep(current.map(|d| d.attempt))
            })
            .await
            .unwrap();
        assert_eq!(seen, Some(1));
        assert_eq!(current.unwrap().document.attempt, 1);
        assert_eq!(store.reads.load(Ordering::Relaxed), 1);
    }
}
