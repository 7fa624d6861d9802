//! Status writes of the workflow: conditional, retried, never moving a
//! terminal state.
//!
//! Every write is a read-modify-write on the document's version: a conflict
//! re-reads and re-applies; a store outage is retried with backoff until it
//! passes or the event is given up (it is then read again after a restart).

use std::sync::Arc;

use skyport_shared::event::DeliveryRequested;
use skyport_shared::ports::{Precondition, StatusStore, StatusStoreError, Versioned};
use skyport_shared::status::{DeliveryState, StatusDocument};
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;

use super::backoff::Backoff;

/// The event was given up before its write was durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Abandoned;

/// How starting a delivery went.
#[derive(Debug)]
pub enum Start {
    /// The document is now Processing at this version.
    Begun(Versioned),
    /// A terminal state is already recorded: a replay with nothing left to do.
    AlreadyTerminal,
}

/// How finishing a delivery went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    Written,
    /// Someone else recorded a terminal state first; it stands.
    AlreadyTerminal,
}

#[derive(Debug, Clone)]
pub struct StatusWriter {
    store: Arc<dyn StatusStore>,
    backoff: Backoff,
}

impl StatusWriter {
    pub fn new(store: Arc<dyn StatusStore>, backoff: Backoff) -> Self {
        Self { store, backoff }
    }

    /// Moves the delivery to Processing, counting one more attempt.
    ///
    /// # Errors
    /// [`Abandoned`] when `abandon` fires before the write is durable.
    pub async fn start(
        &self,
        event: &DeliveryRequested,
        abandon: &CancellationToken,
    ) -> Result<Start, Abandoned> {
        let mut outages = 0;
        loop {
            let current = match self.store.get(&event.delivery_id).await {
                Ok(current) => current,
                Err(e) => {
                    self.wait_out(&e, &mut outages, abandon).await?;
                    continue;
                }
            };
            let (mut document, condition) = match current {
                Some(stored) if stored.document.state.is_terminal() => {
                    return Ok(Start::AlreadyTerminal);
                }
                Some(stored) => (stored.document, Precondition::IfMatch(stored.etag)),
                None => (
                    StatusDocument::accepted(event.delivery_id.clone(), event.accepted_at),
                    Precondition::IfNoneMatch,
                ),
            };
            document.state = DeliveryState::Processing;
            document.attempt += 1;
            document.updated_at = OffsetDateTime::now_utc();
            match self.store.put(&document, condition).await {
                Ok(etag) => return Ok(Start::Begun(Versioned { document, etag })),
                Err(StatusStoreError::PreconditionFailed) => {}
                Err(e) => self.wait_out(&e, &mut outages, abandon).await?,
            }
        }
    }

    /// Writes the terminal document `apply` makes of the current one.
    ///
    /// # Errors
    /// [`Abandoned`] when `abandon` fires before the write is durable.
    pub async fn finish(
        &self,
        mut current: Versioned,
        apply: impl Fn(&mut StatusDocument),
        abandon: &CancellationToken,
    ) -> Result<Finish, Abandoned> {
        let mut outages = 0;
        loop {
            let mut next = current.document.clone();
            apply(&mut next);
            debug_assert!(current.document.state.can_become(next.state));
            match self
                .store
                .put(&next, Precondition::IfMatch(current.etag.clone()))
                .await
            {
                Ok(_) => return Ok(Finish::Written),
                Err(StatusStoreError::PreconditionFailed) => loop {
                    match self.store.get(&current.document.id).await {
                        Ok(Some(stored)) if stored.document.state.is_terminal() => {
                            return Ok(Finish::AlreadyTerminal);
                        }
                        Ok(Some(stored)) => {
                            current = stored;
                            break;
                        }
                        // Documents are never deleted; should one vanish, write it anew.
                        Ok(None) => match self.store.put(&next, Precondition::IfNoneMatch).await {
                            Ok(_) => return Ok(Finish::Written),
                            Err(StatusStoreError::PreconditionFailed) => {}
                            Err(e) => self.wait_out(&e, &mut outages, abandon).await?,
                        },
                        Err(e) => self.wait_out(&e, &mut outages, abandon).await?,
                    }
                },
                Err(e) => self.wait_out(&e, &mut outages, abandon).await?,
            }
        }
    }

    async fn wait_out(
        &self,
        error: &StatusStoreError,
        outages: &mut u32,
        abandon: &CancellationToken,
    ) -> Result<(), Abandoned> {
        *outages += 1;
        let wait = self.backoff.delay(*outages - 1);
        tracing::warn!(error = %error, retries = *outages, "The status store failed a write; retrying.");
        tokio::select! {
            () = abandon.cancelled() => Err(Abandoned),
            () = tokio::time::sleep(wait) => Ok(()),
        }
    }
}
