//! Conditional status writes, executed batch by batch for the bulk dispatcher
//! ([`StatusBatches`]).
//!
//! If-None-Match is `create_item` (409: the document exists); If-Match is
//! `replace_item` with the ETag (412, or 404 for a vanished document: it
//! changed). Both come back as [`StatusStoreError::PreconditionFailed`], so
//! the caller re-reads and decides again.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use azure_core::http::Etag;
use azure_data_cosmos::ContainerClient;
use azure_data_cosmos::options::{ItemWriteOptions, Precondition as CosmosPrecondition};
use skyport_runtime::config::Work;

use super::bulk::Executor;
use super::request_units::Operation;
use super::throttle::Requests;
use skyport_core::ports::{ETag, Precondition, StatusStoreError};
use skyport_core::status::StatusDocument;

/// One queued status write.
#[derive(Debug)]
pub(super) struct StatusWrite {
    pub(super) document: StatusDocument,
    pub(super) condition: Precondition,
}

pub(super) struct StatusBatches {
    container: ContainerClient,
    requests: Arc<Requests>,
}

impl std::fmt::Debug for StatusBatches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatusBatches").finish_non_exhaustive()
    }
}

impl StatusBatches {
    pub(super) fn new(container: ContainerClient, requests: Arc<Requests>) -> Self {
        Self {
            container,
            requests,
        }
    }

    async fn write(&self, write: &StatusWrite) -> Result<ETag, StatusStoreError> {
        let id = &write.document.id;
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
                                .create_item(id.clone(), id, &write.document, Some(options))
                                .await
                        }
                        Precondition::IfMatch(ETag(tag)) => {
                            let options = options.with_precondition(CosmosPrecondition::if_match(
                                Etag::from(tag.clone()),
                            ));
                            self.container
                                .replace_item(id.clone(), id, &write.document, Some(options))
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
