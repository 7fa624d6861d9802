//! The deliveries running on this worker, and those a cancellation flagged
//! while they run.

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, PoisonError};

#[derive(Debug, Default)]
struct Registry {
    /// Deliveries running here, each with the number of its events running
    /// (a request read twice runs twice).
    running: HashMap<String, usize>,
    /// Deliveries a cancellation event flagged while they were running here.
    requested: HashSet<String>,
}

/// Deliveries running on this worker and the cancellations that reached them.
///
/// A cancellation travels on its delivery's partition, so the worker running
/// the delivery reads it too: the delivery looks here before each step instead
/// of re-reading its document. A cancellation handled elsewhere (after a
/// rebalance) is still caught, by the conditional final write.
#[derive(Debug, Default)]
pub(super) struct Cancellations(Mutex<Registry>);

impl Cancellations {
    fn lock(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Notes that `id` runs here until the guard is dropped.
    pub(super) fn run<'a>(&'a self, id: &'a str) -> Running<'a> {
        *self.lock().running.entry(id.to_owned()).or_default() += 1;
        Running { registry: self, id }
    }

    /// Whether `id` runs on this worker now.
    pub(super) fn is_running(&self, id: &str) -> bool {
        self.lock().running.contains_key(id)
    }

    /// Flags `id` if it runs here (else its document's flag stops it
    /// where it runs, at its final write).
    pub(super) fn request(&self, id: &str) {
        let mut registry = self.lock();
        if registry.running.contains_key(id) {
            registry.requested.insert(id.to_owned());
        }
    }

    pub(super) fn is_requested(&self, id: &str) -> bool {
        self.lock().requested.contains(id)
    }
}

/// A delivery running on this worker; dropping it ends that, and forgets a
/// cancellation flagged for it once none of its events runs.
pub(super) struct Running<'a> {
    registry: &'a Cancellations,
    id: &'a str,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        let mut registry = self.registry.lock();
        let Some(count) = registry.running.get_mut(self.id) else {
            return;
        };
        *count -= 1;
        if *count == 0 {
            registry.running.remove(self.id);
            registry.requested.remove(self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Cancellations;

    #[test]
    fn only_a_delivery_running_here_is_flagged() {
        let cancellations = Cancellations::default();
        cancellations.request("d-1");
        assert!(!cancellations.is_requested("d-1"));
    }

    #[test]
    fn a_flag_is_forgotten_when_the_last_run_of_its_delivery_ends() {
        let cancellations = Cancellations::default();
        let first = cancellations.run("d-1");
        let second = cancellations.run("d-1");
        cancellations.request("d-1");
        drop(first);
        assert!(cancellations.is_running("d-1"));
        assert!(cancellations.is_requested("d-1"));
        drop(second);
        assert!(!cancellations.is_running("d-1"));
        assert!(!cancellations.is_requested("d-1"));
    }
}
