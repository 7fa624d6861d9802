//! Per-partition offset tracking for at-least-once checkpoints.
//!
//! Offsets begin in stream order and complete in any order. The checkpoint is
//! the furthest offset below which every begun event has completed: with 0..=7
//! begun and 0,1,2,5,6,7 done it is 2; once 3 and 4 finish it is 7. An event
//! that never completes (abandoned at shutdown) holds the checkpoint where it
//! is, so it is read again after a restart.
//!
//! An event handed back (a nack: its writes failed too often in a row, or its
//! processing panicked) holds the checkpoint too, and the partition is read
//! again from the lowest such offset: of what comes again, only the nacked
//! events run; those running or done are skipped.

use std::collections::{BTreeMap, BTreeSet};

use tokio::time::Instant;

/// What to do with an event the reader handed out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Begin {
    /// Run it (new, or nacked and read again); `panics` counts the earlier
    /// runs of it that panicked.
    Run { panics: u32 },
    /// Read again after a rewind, but running or done already.
    Skip,
}

/// An event begun and not yet completed.
#[derive(Debug, Clone, Copy)]
struct Began {
    /// When it first began.
    at: Instant,
    /// When the gateway accepted it (Unix milliseconds), once it is decoded.
    accepted_ms: Option<i64>,
}

#[derive(Debug, Default)]
pub struct Tracker {
    /// Begun, not yet completed.
    in_flight: BTreeMap<u64, Began>,
    highest_begun: Option<u64>,
    /// The last checkpoint made durable.
    committed: Option<u64>,
    /// Nacked, waiting to be read again.
    nacked: BTreeSet<u64>,
    /// How many runs of each offset in flight panicked.
    panics: BTreeMap<u64, u32>,
    /// Whether the reader has been rewound to the lowest nacked offset.
    rewound: bool,
}

impl Tracker {
    pub fn begin(&mut self, offset: u64, now: Instant) -> Begin {
        if Some(offset) <= self.highest_begun {
            if !self.nacked.remove(&offset) {
                return Begin::Skip;
            }
        } else {
            self.highest_begun = Some(offset);
        }
        self.in_flight.entry(offset).or_insert(Began {
            at: now,
            accepted_ms: None,
        });
        Begin::Run {
            panics: self.panics.get(&offset).copied().unwrap_or(0),
        }
    }

    /// Records when the gateway accepted `offset`, begun and decoded.
    pub fn accepted(&mut self, offset: u64, unix_ms: i64) {
        if let Some(began) = self.in_flight.get_mut(&offset) {
            began.accepted_ms = Some(unix_ms);
        }
    }

    pub fn complete(&mut self, offset: u64) {
        self.in_flight.remove(&offset);
        self.panics.remove(&offset);
    }

    /// Hands `offset` back to be read again; `panicked` when its run panicked.
    pub fn nack(&mut self, offset: u64, panicked: bool) {
        if panicked {
            *self.panics.entry(offset).or_default() += 1;
        }
        if self.nacked.insert(offset) {
            self.rewound = false;
        }
    }

    /// Where the reader must be rewound to before it reads on, if anywhere.
    pub fn rewind_to(&self) -> Option<u64> {
        self.nacked.first().copied().filter(|_| !self.rewound)
    }

    /// Records that the reader reads again from [`Tracker::rewind_to`].
    pub fn rewound(&mut self) {
        self.rewound = true;
    }

    /// The furthest offset at or below which every begun event has completed.
    pub fn safe_offset(&self) -> Option<u64> {
        match self.in_flight.first_key_value() {
            Some((&lowest, _)) => lowest.checked_sub(1),
            None => self.highest_begun,
        }
    }

    /// The checkpoint to write now, if it moved past the last durable one.
    pub fn pending_checkpoint(&self) -> Option<u64> {
        self.safe_offset().filter(|&o| Some(o) > self.committed)
    }

    /// Records that the checkpoint at `offset` is durable.
    pub fn committed(&mut self, offset: u64) {
        self.committed = self.committed.max(Some(offset));
    }

    /// Events begun and not completed, the nacked among them.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// When the oldest event still in flight began (events begin in offset order).
    pub fn oldest_in_flight(&self) -> Option<Instant> {
        self.in_flight.first_key_value().map(|(_, began)| began.at)
    }

    /// When the gateway accepted the oldest event in flight (Unix
    /// milliseconds): the first in offset order, as a partition holds
    /// them in the order they were accepted. `None` when none is in
    /// flight, or the oldest is not decoded yet or carries no time.
    pub fn oldest_accepted_ms(&self) -> Option<i64> {
        self.in_flight
            .first_key_value()
            .and_then(|(_, began)| began.accepted_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn begun(range: std::ops::RangeInclusive<u64>) -> Tracker {
        let mut tracker = Tracker::default();
        let now = Instant::now();
        for offset in range {
            tracker.begin(offset, now);
        }
        tracker
    }

    #[test]
    fn checkpoint_stops_at_the_first_gap() {
        let mut tracker = begun(0..=7);
        for offset in [0, 1, 2, 5, 6, 7] {
            tracker.complete(offset);
        }
        assert_eq!(tracker.safe_offset(), Some(2));
        tracker.complete(3);
        tracker.complete(4);
        assert_eq!(tracker.safe_offset(), Some(7));
    }

    #[test]
    fn the_oldest_accepted_is_the_first_in_flight_once_decoded() {
        let mut tracker = begun(4..=6);
        assert_eq!(tracker.oldest_accepted_ms(), None, "nothing decoded yet");
        tracker.accepted(5, 2_000);
        tracker.accepted(6, 3_000);
        assert_eq!(tracker.oldest_accepted_ms(), None, "4 is not decoded yet");
        tracker.accepted(4, 1_000);
        tracker.accepted(9, 500);
        assert_eq!(
            tracker.oldest_accepted_ms(),
            Some(1_000),
            "9 was never begun"
        );
        tracker.complete(4);
        assert_eq!(tracker.oldest_accepted_ms(), Some(2_000));
        tracker.complete(5);
        tracker.complete(6);
        assert_eq!(tracker.oldest_accepted_ms(), None);
    }

    #[test]
    fn nothing_is_safe_before_the_first_event_completes() {
        let mut tracker = begun(0..=3);
        assert_eq!(tracker.safe_offset(), None);
        tracker.complete(1);
        assert_eq!(tracker.safe_offset(), None);
        assert_eq!(Tracker::default().safe_offset(), None);
    }

    #[test]
    fn a_resumed_partition_checkpoints_from_where_it_resumed() {
        let mut tracker = begun(10..=12);
        // Before anything completes, the checkpoint is the one it resumed
        // after (9), never one below it.
        assert_eq!(tracker.pending_checkpoint(), Some(9));
        tracker.complete(11);
        assert_eq!(tracker.safe_offset(), Some(9), "10 is still in flight");
        tracker.complete(10);
        assert_eq!(tracker.safe_offset(), Some(11));
    }

    #[test]
    fn a_checkpoint_is_pending_only_when_it_moved() {
        let mut tracker = begun(0..=2);
        tracker.complete(0);
        assert_eq!(tracker.pending_checkpoint(), Some(0));
        tracker.committed(0);
        assert_eq!(tracker.pending_checkpoint(), None);
        tracker.complete(1);
        assert_eq!(tracker.pending_checkpoint(), Some(1));
    }

    #[test]
    fn the_checkpoint_matches_a_simple_model_in_any_completion_order() {
        let mut rng = fastrand::Rng::with_seed(7);
        for _ in 0..200 {
            let n = rng.u64(1..200);
            let mut tracker = Tracker::default();
            let now = Instant::now();
            let mut order: Vec<u64> = (0..n).collect();
            rng.shuffle(&mut order);
            let mut done = vec![false; n as usize];
            let mut next_to_begin = 0;
            for &offset in &order {
                // Begin in stream order, as far as needed to complete `offset`.
                while next_to_begin <= offset {
                    tracker.begin(next_to_begin, now);
                    next_to_begin += 1;
                }
                tracker.complete(offset);
                done[offset as usize] = true;
                let prefix = done
                    .iter()
                    .take(next_to_begin as usize)
                    .take_while(|d| **d)
                    .count() as u64;
                let expected = if prefix == next_to_begin {
                    next_to_begin.checked_sub(1)
                } else {
                    prefix.checked_sub(1)
                };
                assert_eq!(tracker.safe_offset(), expected, "order {order:?}");
            }
        }
    }

    #[test]
    fn a_nacked_event_holds_the_checkpoint_and_alone_runs_again_when_read_again() {
        let mut tracker = begun(0..=5);
        let now = Instant::now();
        for offset in [0, 1, 3, 5] {
            tracker.complete(offset);
        }
        tracker.nack(2, false);
        tracker.nack(4, true);
        assert_eq!(tracker.rewind_to(), Some(2));
        tracker.rewound();
        assert_eq!(tracker.rewind_to(), None);
        assert_eq!(tracker.safe_offset(), Some(1));
        // Read again from 2: 2 and 4 run, 3 and 5 (done) are skipped; 6 is new.
        let begun: Vec<Begin> = (2..=6).map(|o| tracker.begin(o, now)).collect();
        assert_eq!(
            begun,
            [
                Begin::Run { panics: 0 },
                Begin::Skip,
                Begin::Run { panics: 1 },
                Begin::Skip,
                Begin::Run { panics: 0 },
            ]
        );
        // A nack below where the reader was rewound to rewinds it again.
        tracker.nack(4, true);
        tracker.nack(2, false);
        assert_eq!(tracker.rewind_to(), Some(2));
        tracker.rewound();
        assert_eq!(tracker.begin(2, now), Begin::Run { panics: 0 });
        assert_eq!(tracker.begin(4, now), Begin::Run { panics: 2 });
        for offset in [2, 4, 6] {
            tracker.complete(offset);
        }
        assert_eq!(tracker.safe_offset(), Some(6));
        assert_eq!(tracker.in_flight(), 0);
    }
}
