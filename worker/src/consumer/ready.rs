//! The events a partition has read ahead and not yet started, started in
//! turn over the clients that sent them: one client's burst does not hold
//! another client's delivery behind it once both are read.
//!
//! A client is the request's principal when the gateway authenticates, else
//! its `ownerId` (as the gateway's quotas count them). Each client's events
//! start in stream order; the clients take turns, one event each. Only
//! delivery requests wait here: a cancellation or a reschedule starts as
//! soon as it is read (it is quick, and a reschedule waits for its
//! delivery's request, which must never wait behind it).
//!
//! The bound: a delivery waits for the events read before it, at most
//! `worker.read_ahead` of them, to be *read*; once read, it starts within
//! one turn of the clients that have events waiting.
//!
//! Taking turns starts events out of stream order, and a checkpoint covers
//! only what is complete in order. So that a graceful leave (a revocation,
//! a shutdown) still hands over nothing to run twice, the partition then
//! starts the holes, the events waiting below the highest one started
//! ([`Ready::take_below`]), and gives up only those above it.

use std::collections::{HashMap, VecDeque};

use skyport_core::ports::StreamEvent;

use crate::workflow::Admitted;

/// An event read and not started.
#[derive(Debug)]
pub(super) struct Waiting {
    pub(super) event: StreamEvent,
    pub(super) admitted: Admitted,
    pub(super) panics: u32,
}

/// The clients' queues and their turns.
#[derive(Debug, Default)]
pub(super) struct Ready {
    queues: HashMap<String, VecDeque<Waiting>>,
    /// The clients with events waiting, the next to start first.
    turns: VecDeque<String>,
    len: usize,
}

impl Ready {
    /// Events waiting.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Queues `waiting` behind `client`'s other events.
    pub(super) fn push(&mut self, client: String, waiting: Waiting) {
        self.len += 1;
        if let Some(queue) = self.queues.get_mut(&client) {
            queue.push_back(waiting);
            return;
        }
        self.turns.push_back(client.clone());
        self.queues.insert(client, VecDeque::from([waiting]));
    }

    /// The next event to start: the first of the client whose turn it is,
    /// who then goes to the back of the turns if more of theirs wait.
    pub(super) fn pop(&mut self) -> Option<Waiting> {
        let client = self.turns.pop_front()?;
        let queue = self.queues.get_mut(&client)?;
        let next = queue.pop_front();
        if queue.is_empty() {
            self.queues.remove(&client);
        } else {
            self.turns.push_back(client);
        }
        if next.is_some() {
            self.len -= 1;
        }
        next
    }

    /// Takes out every event waiting below `offset`, in stream order, and
    /// gives up the rest (they were not started, and are read again after
    /// the last checkpoint).
    pub(super) fn take_below(&mut self, offset: u64) -> Vec<Waiting> {
        let mut holes: Vec<Waiting> = self
            .queues
            .drain()
            .flat_map(|(_, queue)| queue)
            .filter(|waiting| waiting.event.offset < offset)
            .collect();
        holes.sort_by_key(|waiting| waiting.event.offset);
        self.turns.clear();
        self.len = 0;
        holes
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use bytes::Bytes;

    use super::*;
    use crate::workflow::Admitted;

    fn waiting(offset: u64) -> Waiting {
        let event = StreamEvent {
            partition: 0,
            offset,
            payload: Bytes::new(),
        };
        Waiting {
            admitted: Admitted::unreadable(&event),
            event,
            panics: 0,
        }
    }

    fn drain(ready: &mut Ready) -> Vec<u64> {
        std::iter::from_fn(|| ready.pop().map(|w| w.event.offset)).collect()
    }

    #[test]
    fn clients_take_turns_and_each_keeps_its_order() {
        let mut ready = Ready::default();
        // A floods first; B and C send one each, read last.
        for offset in 0..6 {
            ready.push("a".into(), waiting(offset));
        }
        ready.push("b".into(), waiting(6));
        ready.push("c".into(), waiting(7));
        ready.push("b".into(), waiting(8));
        assert_eq!(ready.len(), 9);
        assert_eq!(drain(&mut ready), [0, 6, 7, 1, 8, 2, 3, 4, 5]);
        assert_eq!(ready.len(), 0);
        assert!(ready.pop().is_none());
    }

    #[test]
    fn the_holes_below_the_highest_start_are_taken_in_order_and_the_rest_given_up() {
        let mut ready = Ready::default();
        for offset in 0..5 {
            ready.push("a".into(), waiting(offset));
        }
        ready.push("b".into(), waiting(5));
        ready.push("b".into(), waiting(6));
        // A's 0 and B's 5 start: 1 to 4 are holes below 5, and 6 is above it.
        assert_eq!(drain_two(&mut ready), [0, 5]);
        let holes: Vec<u64> = ready.take_below(5).iter().map(|w| w.event.offset).collect();
        assert_eq!(holes, [1, 2, 3, 4]);
        assert_eq!(ready.len(), 0);
        assert!(ready.pop().is_none());
    }

    fn drain_two(ready: &mut Ready) -> Vec<u64> {
        (0..2).map(|_| ready.pop().unwrap().event.offset).collect()
    }

    #[test]
    fn a_client_that_comes_back_joins_the_end_of_the_turns() {
        let mut ready = Ready::default();
        ready.push("a".into(), waiting(0));
        ready.push("b".into(), waiting(1));
        assert_eq!(ready.pop().unwrap().event.offset, 0);
        ready.push("a".into(), waiting(2));
        assert_eq!(drain(&mut ready), [1, 2]);
        ready.push("a".into(), waiting(3));
        assert_eq!(ready.take_below(0).len(), 0);
        assert_eq!(ready.len(), 0);
        assert!(ready.pop().is_none());
    }
}
