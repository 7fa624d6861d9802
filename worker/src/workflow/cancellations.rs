//! The deliveries running on this worker, and those a cancellation flagged
//! while they run.

use std::collections::{HashMap, HashSet, VecDeque};

use skyport_runtime::locks::{NamedGuard, NamedMutex};

/// The most cancellations kept for deliveries not running here yet.
const MAX_EARLY: usize = 4_096;

#[derive(Debug, Default)]
struct Registry {
    /// Deliveries running here, each with the number of its events running
    /// (a request read twice runs twice).
    running: HashMap<String, usize>,
    /// Deliveries a cancellation event flagged while they were running here.
    requested: HashSet<String>,
    /// Cancellations of deliveries not running here when they were handled,
    /// oldest first: a request read before its cancellation may start just
    /// after it (its task is polled later), and then stops before its first
    /// step. Bounded, since a request read by another worker never starts here.
    early: HashSet<String>,
    /// The same, oldest first, to drop the oldest beyond [`MAX_EARLY`].
    early_order: VecDeque<String>,
}

/// Deliveries running on this worker and the cancellations that reached them.
///
/// A cancellation travels on its delivery's partition, so the worker running
/// the delivery reads it too: the delivery looks here before each step instead
/// of re-reading its document. A cancellation handled elsewhere (after a
/// rebalance) is still caught, by the conditional final write.
#[derive(Debug)]
pub(super) struct Cancellations(NamedMutex<Registry>);

impl Default for Cancellations {
    fn default() -> Self {
        Self(NamedMutex::new("cancellations", Registry::default()))
    }
}

impl Cancellations {
    fn lock(&self) -> NamedGuard<'_, Registry> {
        self.0.lock()
    }

    /// Notes that `id` runs here until the guard is dropped; a cancellation
    /// handled before it started flags it.
    pub(super) fn run<'a>(&'a self, id: &'a str) -> Running<'a> {
        let mut registry = self.lock();
        *registry.running.entry(id.to_owned()).or_default() += 1;
        if registry.early.remove(id) {
            registry.requested.insert(id.to_owned());
        }
        Running { registry: self, id }
    }

    /// Whether `id` runs on this worker now.
    pub(super) fn is_running(&self, id: &str) -> bool {
        self.lock().running.contains_key(id)
    }

    /// Flags `id` if it runs here, else keeps the cancellation for when it
    /// starts here (elsewhere, the document stops it at its final write).
    pub(super) fn request(&self, id: &str) {
        let mut registry = self.lock();
        if registry.running.contains_key(id) {
            registry.requested.insert(id.to_owned());
            return;
        }
        if registry.early.insert(id.to_owned()) {
            registry.early_order.push_back(id.to_owned());
        }
        while registry.early_order.len() > MAX_EARLY {
            if let Some(oldest) = registry.early_order.pop_front() {
                registry.early.remove(&oldest);
            }
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
    fn a_cancellation_handled_before_its_delivery_started_flags_it_when_it_starts() {
        let cancellations = Cancellations::default();
        cancellations.request("d-1");
        assert!(!cancellations.is_requested("d-1"));
        let running = cancellations.run("d-1");
        assert!(cancellations.is_requested("d-1"));
        drop(running);
        let again = cancellations.run("d-1");
        assert!(!cancellations.is_requested("d-1"), "used once");
        drop(again);
    }

    #[test]
    fn early_cancellations_are_bounded() {
        let cancellations = Cancellations::default();
        for n in 0..=super::MAX_EARLY {
            cancellations.request(&format!("d-{n}"));
        }
        let _oldest = cancellations.run("d-0");
        assert!(!cancellations.is_requested("d-0"), "dropped as the oldest");
        let newest = format!("d-{}", super::MAX_EARLY);
        let _newest = cancellations.run(&newest);
        assert!(cancellations.is_requested(&newest));
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
