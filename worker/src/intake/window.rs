//! The in-flight window: how many events each partition runs at once.
//!
//! `max_in_flight` unless a gateway in the same process is answering slower
//! than `gateway_latency_goal_ms` ([`skyport_runtime::foreground`]). Every
//! [`PERIOD`] the window halves when the gateway's slowest answer since the
//! last look was over the goal, down to an eighth of `max_in_flight`, and
//! otherwise grows by a sixteenth of it, back to the whole in under a
//! second: a spike is accepted first and the backlog drained at full width
//! once it has passed. In-flight events are never touched.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::metrics;
use skyport_runtime::config::WorkerSettings;
use skyport_runtime::foreground::Foreground;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

/// How often the window is adjusted.
pub const PERIOD: Duration = Duration::from_millis(50);

/// The window shared by a worker's partitions.
#[derive(Debug)]
pub struct Window {
    current: AtomicUsize,
    max: usize,
    min: usize,
    /// `None`: the window stays whole.
    goal: Option<Duration>,
}

impl Window {
    pub fn new(settings: &WorkerSettings) -> Self {
        let max = settings.max_in_flight;
        let goal = settings.gateway_latency_goal_ms.duration();
        Self {
            current: AtomicUsize::new(max),
            max,
            min: (max / 8).max(1),
            goal: (!goal.is_zero()).then_some(goal),
        }
    }

    /// Events each partition may have in flight now.
    pub fn get(&self) -> usize {
        self.current.load(Ordering::Relaxed)
    }

    /// One adjustment after the gateway answered `answered` requests, the
    /// slowest after `slowest`.
    fn adjust(&self, goal: Duration, answered: u64, slowest: Duration) -> usize {
        let current = self.get();
        let next = if answered > 0 && slowest > goal {
            (current / 2).max(self.min)
        } else {
            (current + (self.max / 16).max(1)).min(self.max)
        };
        self.current.store(next, Ordering::Relaxed);
        next
    }

    /// Adjusts the window to what `foreground` reports until `stop` fires.
    pub async fn run(&self, foreground: &Foreground, stop: &CancellationToken) {
        let gauge = &metrics::global().worker_window;
        gauge.set(i64::try_from(self.get()).unwrap_or(i64::MAX));
        let Some(goal) = self.goal else {
            return;
        };
        let mut ticks = tokio::time::interval(PERIOD);
        ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        // What piled up before this worker started is not its doing.
        foreground.take();
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = ticks.tick() => {
                    let (answered, slowest) = foreground.take();
                    let window = self.adjust(goal, answered, slowest);
                    gauge.set(i64::try_from(window).unwrap_or(i64::MAX));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use skyport_runtime::config::Millis;

    use super::*;

    fn window(max: usize) -> Window {
        Window::new(&WorkerSettings {
            max_in_flight: max,
            gateway_latency_goal_ms: Millis::new(10),
            ..WorkerSettings::default()
        })
    }

    #[test]
    fn a_slow_gateway_halves_the_window_down_to_an_eighth_and_a_fast_one_widens_it_again() {
        let window = window(128);
        let goal = Duration::from_millis(10);
        let slow = Duration::from_millis(25);
        assert_eq!(window.get(), 128);
        let narrowed: Vec<usize> = (0..4).map(|_| window.adjust(goal, 50, slow)).collect();
        assert_eq!(narrowed, [64, 32, 16, 16]);
        // An idle gateway, or one within its goal, gives the window back.
        assert_eq!(window.adjust(goal, 0, Duration::ZERO), 24);
        assert_eq!(window.adjust(goal, 500, Duration::from_millis(3)), 32);
        for _ in 0..20 {
            window.adjust(goal, 0, Duration::ZERO);
        }
        assert_eq!(window.get(), 128);
    }

    #[test]
    fn a_window_of_one_stays_one_and_a_goal_of_zero_never_narrows() {
        let one = window(1);
        assert_eq!(
            one.adjust(Duration::from_millis(10), 9, Duration::from_secs(1)),
            1
        );
        let off = Window::new(&WorkerSettings {
            gateway_latency_goal_ms: Millis::new(0),
            ..WorkerSettings::default()
        });
        assert_eq!(off.goal, None);
        assert_eq!(off.get(), WorkerSettings::default().max_in_flight);
    }
}
