//! Poison events (undecodable, or of a schema version this build does not
//! read) go to the dead-letter store with the reason, so their partition
//! moves on.

use skyport_core::ports::{DeadLetter, StreamEvent};
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;

use super::engine::Workflow;
use super::outcome::Outcome;
use super::retry::Retries;

impl Workflow {
    pub(super) async fn dead_letter(
        &self,
        event: &StreamEvent,
        reason: String,
        abandon: &CancellationToken,
    ) -> Outcome {
        tracing::warn!(partition = event.partition, offset = event.offset, %reason, "Dead-lettered an event that cannot be processed.");
        let letter = DeadLetter {
            partition: event.partition,
            offset: event.offset,
            reason,
            payload: event.payload.clone(),
            at: OffsetDateTime::now_utc(),
        };
        let stored = Retries::new(self.retries, abandon)
            .until_done("Storing a dead letter", || {
                self.dead_letters.put(letter.clone())
            })
            .await;
        match stored {
            Ok(()) => Outcome::DeadLettered,
            Err(interrupted) => interrupted.into(),
        }
    }
}
