//! What the processor hands changes to: the one trait its users implement
//! (the notifier). A batch is checkpointed only after `handle` returned `Ok`.

use async_trait::async_trait;
use skyport_core::error::BoxError;
use skyport_core::ports::Change;

/// What the processor hands each batch of changes to.
#[async_trait]
pub trait ChangeHandler: Send + Sync + 'static {
    /// Handles `changes` (in the order the range holds them). An error hands
    /// the batch over again from the last checkpoint.
    ///
    /// # Errors
    /// When the batch is not handled; nothing of it is checkpointed.
    async fn handle(&self, changes: &[Change]) -> Result<(), BoxError>;
}
