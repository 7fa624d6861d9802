//! Exponential backoff with full jitter: the n-th retry waits a uniformly
//! random time between zero and `min(max, initial × 2ⁿ)`. The workflow's
//! retries and the callbacks' both wait this way.

use std::time::Duration;

/// The waits between retries: doubling from `initial`, capped at `max`.
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
}

impl Backoff {
    /// A backoff from `initial` up to `max` (at least `initial`).
    pub fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max: max.max(initial),
        }
    }

    /// The ceiling of the wait before retry number `retry` (0-based).
    pub fn ceiling(&self, retry: u32) -> Duration {
        self.initial
            .checked_mul(1u32.checked_shl(retry.min(31)).unwrap_or(u32::MAX))
            .map_or(self.max, |d| d.min(self.max))
    }

    /// A random wait before retry number `retry`.
    pub fn delay(&self, retry: u32) -> Duration {
        self.ceiling(retry).mul_f64(fastrand::f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ceiling_doubles_up_to_the_maximum() {
        let backoff = Backoff::new(Duration::from_millis(50), Duration::from_millis(1000));
        let ceilings: Vec<u128> = (0..7).map(|n| backoff.ceiling(n).as_millis()).collect();
        assert_eq!(ceilings, [50, 100, 200, 400, 800, 1000, 1000]);
        assert_eq!(backoff.ceiling(u32::MAX), Duration::from_millis(1000));
    }

    #[test]
    fn every_delay_is_within_its_ceiling() {
        let backoff = Backoff::new(Duration::from_millis(10), Duration::from_secs(2));
        for retry in 0..40 {
            for _ in 0..50 {
                assert!(backoff.delay(retry) <= backoff.ceiling(retry));
            }
        }
    }
}
