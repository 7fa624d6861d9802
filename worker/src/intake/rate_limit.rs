//! Records-per-second limit for one worker.
//!
//! With a rate of 10 or more, ceil(rate/10) slots are released every 100 ms,
//! but never more than `rate` in one second (so 15/s releases 2,2,2,2,2,2,2,1,0,0);
//! below 10 the whole rate is released once a second. Unused slots keep, up to
//! `rate` of them. An event waits for a slot before it runs.
//!
//! The expedited lane's events go first: each release hands its slots to
//! the expedited events waiting before the normal ones, except that while
//! both wait every [`NORMAL_SHARE`]th slot goes to a normal event, so the
//! normal lane is never starved. A slot kept unused is taken by whichever
//! event asks first.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::time::Duration;

use skyport_core::ports::Lane;
use tokio::sync::Semaphore;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

const TICK: Duration = Duration::from_millis(100);
const TICKS_PER_SECOND: u32 = 10;
/// While both lanes wait, one slot in this many goes to the normal lane.
const NORMAL_SHARE: u32 = 4;

/// A shared slot pool; [`RateLimiter::refill`] must run for slots to appear.
#[derive(Debug, Clone)]
pub struct RateLimiter {
    rate: u32,
    slots: Arc<Slots>,
}

#[derive(Debug)]
struct Slots {
    /// Slots for normal events, and the slots kept unused (up to the rate).
    normal: Semaphore,
    /// Slots handed to expedited events waiting.
    expedited: Semaphore,
    waiting_normal: AtomicUsize,
    waiting_expedited: AtomicUsize,
    /// Slots given to the expedited lane in a row while normal events waited.
    streak: AtomicU32,
}

/// Counts a waiter for as long as it waits (a dropped wait is no longer one).
struct Waiting<'a>(&'a AtomicUsize);

impl<'a> Waiting<'a> {
    fn new(count: &'a AtomicUsize) -> Self {
        count.fetch_add(1, Ordering::SeqCst);
        Self(count)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl RateLimiter {
    /// A limiter of `rate` records per second (at least 1), starting empty.
    pub fn new(rate: u32) -> Self {
        Self {
            rate: rate.max(1),
            slots: Arc::new(Slots {
                normal: Semaphore::new(0),
                expedited: Semaphore::new(0),
                waiting_normal: AtomicUsize::new(0),
                waiting_expedited: AtomicUsize::new(0),
                streak: AtomicU32::new(0),
            }),
        }
    }

    pub fn rate(&self) -> u32 {
        self.rate
    }

    /// Waits for a slot for an event of `lane` and uses it up.
    pub async fn acquire(&self, lane: Lane) {
        let slots = &self.slots;
        let (semaphore, waiting) = match lane {
            Lane::Normal => (&slots.normal, &slots.waiting_normal),
            Lane::Expedited => {
                if let Ok(kept) = slots.normal.try_acquire() {
                    kept.forget();
                    return;
                }
                (&slots.expedited, &slots.waiting_expedited)
            }
        };
        let _waiting = Waiting::new(waiting);
        if let Ok(permit) = semaphore.acquire().await {
            permit.forget();
        }
    }

    /// Splits `release` slots: to the expedited events waiting (and not yet
    /// given one) first, but one in [`NORMAL_SHARE`] to the normal lane while
    /// normal events wait too; the rest to the normal lane.
    fn split(&self, release: u32) -> (usize, usize) {
        let slots = &self.slots;
        let mut wanting = slots
            .waiting_expedited
            .load(Ordering::SeqCst)
            .saturating_sub(slots.expedited.available_permits());
        let contested = slots.waiting_normal.load(Ordering::SeqCst) > 0;
        let mut streak = slots.streak.load(Ordering::Relaxed);
        let mut expedited = 0;
        for _ in 0..release {
            if wanting > 0 && !(contested && streak + 1 >= NORMAL_SHARE) {
                expedited += 1;
                wanting -= 1;
                streak += u32::from(contested);
            } else {
                streak = 0;
            }
        }
        slots.streak.store(streak, Ordering::Relaxed);
        (expedited, release as usize - expedited)
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
            let (expedited, normal) = self.split(release);
            self.slots.expedited.add_permits(expedited);
            let room = (self.rate as usize).saturating_sub(self.slots.normal.available_permits());
            self.slots.normal.add_permits(normal.min(room));
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

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
                    limiter.acquire(Lane::Normal).await;
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
    async fn expedited_events_get_the_slots_first_and_the_normal_lane_one_in_four() {
        let limiter = RateLimiter::new(10);
        let (granted, mut order) = tokio::sync::mpsc::unbounded_channel();
        let mut waiters = tokio::task::JoinSet::new();
        let mut wait = |lane: Lane, n: u32| {
            let (limiter, granted) = (limiter.clone(), granted.clone());
            waiters.spawn(async move {
                limiter.acquire(lane).await;
                granted.send((lane, n)).unwrap();
            });
        };
        // Twenty normal events wait first; eight expedited ones join them.
        for n in 0..20 {
            wait(Lane::Normal, n);
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
        for n in 0..8 {
            wait(Lane::Expedited, n);
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
        let shutdown = CancellationToken::new();
        let refill = tokio::spawn(limiter.clone().refill(shutdown.clone()));
        let mut lanes = Vec::new();
        for _ in 0..12 {
            lanes.push(order.recv().await.unwrap().0);
        }
        let e = Lane::Expedited;
        let n = Lane::Normal;
        assert_eq!(lanes, [e, e, e, n, e, e, e, n, e, e, n, n]);
        shutdown.cancel();
        refill.await.unwrap();
        waiters.abort_all();
    }

    #[tokio::test(start_paused = true)]
    async fn an_expedited_event_takes_a_slot_kept_unused_at_once() {
        let limiter = RateLimiter::new(20);
        let shutdown = CancellationToken::new();
        let refill = tokio::spawn(limiter.clone().refill(shutdown.clone()));
        tokio::time::sleep(Duration::from_secs(1)).await;
        let before = Instant::now();
        limiter.acquire(Lane::Expedited).await;
        assert_eq!(before.elapsed(), Duration::ZERO);
        assert_eq!(limiter.slots.normal.available_permits(), 19);
        shutdown.cancel();
        refill.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn unused_slots_keep_up_to_the_rate() {
        let limiter = RateLimiter::new(20);
        let shutdown = CancellationToken::new();
        let refill = tokio::spawn(limiter.clone().refill(shutdown.clone()));
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(limiter.slots.normal.available_permits(), 20);
        shutdown.cancel();
        refill.await.expect("refill stops");
    }
}
