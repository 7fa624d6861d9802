//! Listing on Cosmos DB is a query on the status container, on each
//! document's `createdMs`. A document written by a version that kept a
//! listing view has none; the worker (and the all-in-one) gives those theirs
//! once at start ([`backfill`]). The embedded store lists its documents in
//! the transaction that writes them and needs neither.

use std::future::Future;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::backends::{Backends, Store};

/// Gives every status document without `createdMs` its own
/// ([`CosmosStore::backfill_created_ms`]), when the store is Cosmos DB, until
/// done or `shutdown`. A failure is logged, not fatal: the documents left
/// are not listed until a later start gives them theirs.
///
/// [`CosmosStore::backfill_created_ms`]: skyport_azure::cosmos::CosmosStore::backfill_created_ms
pub fn backfill(
    backends: &Backends,
    shutdown: CancellationToken,
) -> Option<impl Future<Output = ()> + Send + 'static> {
    let Store::Cosmos(cosmos) = &backends.store else {
        return None;
    };
    let cosmos = Arc::clone(cosmos);
    Some(async move {
        let backfilled = tokio::select! {
            () = shutdown.cancelled() => return,
            backfilled = cosmos.backfill_created_ms() => backfilled,
        };
        match backfilled {
            Ok(0) => {}
            Ok(documents) => tracing::info!(
                documents,
                "Gave the status documents of an earlier version their createdMs: they are listed."
            ),
            Err(e) => tracing::warn!(
                error = %e,
                "Could not give every status document of an earlier version its createdMs; \
                 those left are listed once a later start does."
            ),
        }
    })
}
