//! Where each partition's records lie in the segments, by offset: kept in
//! memory, rebuilt at start by [`super::recover`].

use std::collections::VecDeque;

/// Where a record lies: 16 bytes for each event in the stream (a segment
/// is smaller than 4 GiB, `embedded.segment_size_mb` ≤ 4095).
#[derive(Debug, Clone, Copy)]
pub(super) struct Location {
    pub(super) segment: u64,
    pub(super) position: u32,
    pub(super) len: u32,
}

/// The positions of one partition's records, by offset.
#[derive(Debug, Default)]
pub(super) struct Index {
    pub(super) first: u64,
    pub(super) locations: VecDeque<Location>,
}

impl Index {
    pub(super) fn next(&self) -> u64 {
        self.first + self.locations.len() as u64
    }

    pub(super) fn push(&mut self, offset: u64, location: Location) {
        if self.locations.is_empty() {
            self.first = offset;
        }
        self.locations.push_back(location);
    }

    /// Forgets every record up to and including `offset`.
    pub(super) fn trim_through(&mut self, offset: u64) {
        while self.first <= offset && self.locations.pop_front().is_some() {
            self.first += 1;
        }
    }
}
