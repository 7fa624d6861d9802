//! The deliveries a cancellation flagged while they run on this worker.

use std::collections::HashSet;
use std::sync::{Mutex, PoisonError};

/// Deliveries a cancellation event flagged while they were running here.
///
/// A cancellation travels on its delivery's partition, so the worker running
/// the delivery reads it too: the delivery looks here before each step instead
/// of re-reading its document. A cancellation handled elsewhere (after a
/// rebalance) is still caught, by the conditional final write.
#[derive(Debug, Default)]
pub(super) struct Cancellations(Mutex<HashSet<String>>);

impl Cancellations {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn request(&self, id: &str) {
        self.lock().insert(id.to_owned());
    }

    pub(super) fn is_requested(&self, id: &str) -> bool {
        self.lock().contains(id)
    }

    pub(super) fn forget(&self, id: &str) {
        self.lock().remove(id);
    }
}
