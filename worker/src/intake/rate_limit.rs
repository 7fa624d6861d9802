//! Records-per-second limit for one worker.
//!
//! With a rate of 10 or more, ceil(rate/10) slots are released every 100 ms,
//! but never more than `rate` in one second (so 15/s releases 2,2,2,2,2,2,2,1,0,0);
//! below 10 the whole rate is released once a second. Unused slots keep, up to
//! `rate` of them. An event waits for a slot before it runs.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

const TICK: Duration = Duration::from_millis(100);
const TICKS_PER_SECOND: u32 = 10;

/// A shared slot pool; [`RateLimiter::refill`] must run for slots to appear.
#[derive(Debug, Clone)]
pub struct RateLimiter {
    rate: u32,
    slots: Arc<Semaphore>,
}

impl RateLimiter {
    /// A limiter of `rate` records per second (at least 1), starting empty.
    pub fn new(rate: u32) -> Self {
        Self {
            rate: rate.max(1),
            slots: Arc::new(Semaphore::new(0)),
        }
    }

    pub fn rate(&self) -> u32 {
        self.rate
    }

    /// Waits for a slot and uses it up.
    pub async fn acquire(&self) {
        if let Ok(permit) = self.slots.acquire().await {
            permit.forget();
        }
    }

    /// Releases slots on schedule until `shutdown`.
    pub async fn refill(self, shutdown: CancellationToken) {
        let (period, per_tick) = if self.rate >= TICKS_PER_SECOND {
            (TICK, self.rate.div_ceil(TICKS_PER_SECOND))
        } else {
            (Duration::from_secs(1), self.rate)
        };
        let ticks_per_second = if period == TICK { TICKS_PER_SECOND } else { 1 };
        let mut ticks = tokio::time::interval(period);
        ticks.set_missed_tick_behavior(MissedTickBehavior::Burst);
        let mut tick_in_second = 0;
        let mut released_this_second = 0u32;
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = ticks.tick() => {}
            }
            if tick_in_second == 0 {
                released_this_second = 0;
            }
            let release = per_tick.min(self.rate - released_this_second);
            released_this_second += release;
            tick_in_second = (tick_in_second + 1) % ticks_per_second;
            let room = (self.rate as usize).saturating_sub(self.slots.available_permits());
            self.slots.add_permits((release as usize).min(room));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::time::Instant;

    /// Counts the slots a greedy consumer gets in each 100 ms of `seconds`.
    async fn slots_per_tick(rate: u32, seconds: u64) -> Vec<u32> {
        let limiter = RateLimiter::new(rate);
        let shutdown = CancellationToken::new();
        let refill = tokio::spawn(limiter.clone().refill(shutdown.clone()));
        let start = Instant::now();
        let buckets = (seconds * 10) as usize;
        let mut counts = vec![0u32; buckets];
        let consumer = {
            let limiter = limiter.clone();
            async move {
                loop {
                    limiter.acquire().await;
                    let bucket = (start.elapsed().as_millis() / 100) as usize;
                    if bucket >= buckets {
                        return counts;
                    }
                    counts[bucket] += 1;
                }
            }
        };
        let counts = tokio::time::timeout(Duration::from_secs(seconds + 1), consumer)
            .await
            .expect("the consumer keeps getting slots");
        shutdown.cancel();
        refill.await.expect("refill stops");
        counts
    }

    #[tokio::test(start_paused = true)]
    async fn a_thousand_per_second_releases_a_hundred_every_100_ms() {
        assert!(slots_per_tick(1000, 3).await.iter().all(|&n| n == 100));
    }

    #[tokio::test(start_paused = true)]
    async fn ten_per_second_releases_one_every_100_ms() {
        assert!(slots_per_tick(10, 3).await.iter().all(|&n| n == 1));
    }

    #[tokio::test(start_paused = true)]
    async fn five_per_second_releases_all_five_once_a_second() {
        let counts = slots_per_tick(5, 3).await;
        for (i, n) in counts.iter().enumerate() {
            assert_eq!(*n, if i % 10 == 0 { 5 } else { 0 }, "{counts:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_rate_that_is_not_a_multiple_of_ten_is_still_exact_per_second() {
        let counts = slots_per_tick(15, 3).await;
        assert_eq!(&counts[..10], &[2, 2, 2, 2, 2, 2, 2, 1, 0, 0]);
        for second in counts.chunks(10) {
            assert_eq!(second.iter().sum::<u32>(), 15);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn unused_slots_keep_up_to_the_rate() {
        let limiter = RateLimiter::new(20);
        let shutdown = CancellationToken::new();
        let refill = tokio::spawn(limiter.clone().refill(shutdown.clone()));
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(limiter.slots.available_permits(), 20);
        shutdown.cancel();
        refill.await.expect("refill stops");
    }
}
