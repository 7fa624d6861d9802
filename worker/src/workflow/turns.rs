//! A delivery's events in stream order, where their order matters: a
//! reschedule is applied after the request it changes, and after the
//! reschedules before it.
//!
//! The worker runs a partition's events concurrently. Each event takes its
//! [`Turn`] when it is read (in the partition's order, before any of them
//! runs); a reschedule waits for the turns of its delivery before it. A
//! reschedule read is also [`Turns::pending`] from then until it is
//! handled, so that a request that starts after it was read runs its steps
//! with the new values: read in one batch with its request, a reschedule
//! changes what the request books rather than updating the bookings after.
//! Cancellations take no turn: they reach a running delivery at its next step.

use std::collections::HashMap;
use std::sync::Arc;

use skyport_core::event::DeliveryRescheduled;
use skyport_runtime::locks::{NamedGuard, NamedMutex};
use tokio::sync::oneshot;

#[derive(Debug, Default)]
struct Registry {
    /// Per delivery, the last turn taken: its number and what resolves
    /// when it ends.
    tails: HashMap<String, (u64, oneshot::Receiver<()>)>,
    next_turn: u64,
    /// Turns read and not yet handled, per delivery, in stream order.
    pending: HashMap<String, Vec<DeliveryRescheduled>>,
}

/// The turns and pending reschedules of the deliveries this worker reads.
#[derive(Debug)]
pub(super) struct Turns(NamedMutex<Registry>);

impl Default for Turns {
    fn default() -> Self {
        Self(NamedMutex::new("turns", Registry::default()))
    }
}

impl Turns {
    fn lock(&self) -> NamedGuard<'_, Registry> {
        self.0.lock()
    }

    /// The next turn of delivery `id`, taken in stream order.
    pub(super) fn turn(self: &Arc<Self>, id: &str) -> Turn {
        let mut registry = self.lock();
        let number = registry.next_turn;
        registry.next_turn += 1;
        let (done, ended) = oneshot::channel();
        let previous = registry
            .tails
            .insert(id.to_owned(), (number, ended))
            .map(|(_, ended)| ended);
        Turn {
            registry: Arc::clone(self),
            id: id.to_owned(),
            number,
            previous,
            _done: done,
        }
    }

    /// Notes a reschedule read, until [`Turns::handled`].
    pub(super) fn read(&self, reschedule: &DeliveryRescheduled) {
        self.lock()
            .pending
            .entry(reschedule.delivery_id.clone())
            .or_default()
            .push(reschedule.clone());
    }

    /// The reschedules of `id` read and not yet handled, in stream order.
    pub(super) fn pending(&self, id: &str) -> Vec<DeliveryRescheduled> {
        self.lock().pending.get(id).cloned().unwrap_or_default()
    }

    /// Forgets a reschedule once it is handled (or given up).
    pub(super) fn handled(&self, reschedule: &DeliveryRescheduled) {
        let mut registry = self.lock();
        let id = &reschedule.delivery_id;
        let Some(pending) = registry.pending.get_mut(id) else {
            return;
        };
        if let Some(at) = pending
            .iter()
            .position(|p| p.change_id == reschedule.change_id)
        {
            pending.remove(at);
        }
        if pending.is_empty() {
            registry.pending.remove(id);
        }
    }
}

/// An event's place among its delivery's events; dropping it lets the next
/// one go.
#[derive(Debug)]
pub(super) struct Turn {
    registry: Arc<Turns>,
    id: String,
    number: u64,
    previous: Option<oneshot::Receiver<()>>,
    /// Dropped with the turn, which ends it for the next.
    _done: oneshot::Sender<()>,
}

impl Turn {
    /// Resolves once the events of the delivery read before this one have
    /// run (or given up).
    pub(super) async fn come(&mut self) {
        if let Some(previous) = self.previous.take() {
            // Ended when its sender is dropped, whatever happened to its event.
            let _ = previous.await;
        }
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        let mut registry = self.registry.lock();
        if registry
            .tails
            .get(&self.id)
            .is_some_and(|(number, _)| *number == self.number)
        {
            registry.tails.remove(&self.id);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::time::Duration;

    use time::OffsetDateTime;

    use super::*;

    fn reschedule(id: &str, change: &str) -> DeliveryRescheduled {
        DeliveryRescheduled {
            delivery_id: id.into(),
            change_id: change.into(),
            requested_at: OffsetDateTime::UNIX_EPOCH,
            changes: skyport_core::request::Reschedule::default(),
            traceparent: None,
            principal: None,
        }
    }

    #[tokio::test]
    async fn a_turn_comes_after_the_turns_of_its_delivery_before_it() {
        let reschedules = Arc::new(Turns::default());
        let first = reschedules.turn("d-1");
        let mut other = reschedules.turn("d-2");
        let mut second = reschedules.turn("d-1");
        tokio::time::timeout(Duration::from_secs(1), other.come())
            .await
            .unwrap();
        assert!(
            tokio::time::timeout(Duration::from_millis(20), second.come())
                .await
                .is_err(),
            "the second turn waits for the first"
        );
        drop(first);
        tokio::time::timeout(Duration::from_secs(1), second.come())
            .await
            .unwrap();
        drop((second, other));
        assert!(reschedules.lock().tails.is_empty(), "nothing is kept");
    }

    #[test]
    fn a_reschedule_is_pending_from_its_read_until_it_is_handled() {
        let reschedules = Turns::default();
        let (a, b) = (reschedule("d-1", "a"), reschedule("d-1", "b"));
        reschedules.read(&a);
        reschedules.read(&b);
        let pending: Vec<String> = reschedules
            .pending("d-1")
            .into_iter()
            .map(|p| p.change_id)
            .collect();
        assert_eq!(pending, ["a", "b"]);
        reschedules.handled(&a);
        reschedules.handled(&b);
        assert!(reschedules.pending("d-1").is_empty());
        assert!(reschedules.lock().pending.is_empty());
    }
}
