//! A pace for one kind of event: starts spaced `1/rate` apart (redrives, at
//! `worker.redrive_per_s`).

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// Spaces redrives `1/rate` apart (a rate of 0: no limit). Cheaper than a
/// slot pool with a refill task: the next start time is all it keeps.
#[derive(Debug)]
pub(crate) struct Pacer {
    interval: Duration,
    next: Mutex<Option<Instant>>,
}

impl Pacer {
    pub(crate) fn new(per_s: u32) -> Self {
        Self {
            interval: if per_s == 0 {
                Duration::ZERO
            } else {
                Duration::from_secs(1) / per_s
            },
            next: Mutex::new(None),
        }
    }

    /// Waits for this caller's turn.
    pub(crate) async fn wait(&self) {
        if self.interval.is_zero() {
            return;
        }
        let at = {
            let mut next = self
                .next
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let now = Instant::now();
            let at = next.map_or(now, |next| next.max(now));
            *next = Some(at + self.interval);
            at
        };
        tokio::time::sleep_until(at).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_pacer_spaces_callers_by_its_rate() {
        let pacer = Pacer::new(10);
        let start = Instant::now();
        for _ in 0..5 {
            pacer.wait().await;
        }
        assert_eq!(start.elapsed(), Duration::from_millis(400));
        let unlimited = Pacer::new(0);
        let start = Instant::now();
        unlimited.wait().await;
        assert_eq!(start.elapsed(), Duration::ZERO);
    }
}
