//! The in-flight window: how many events each partition runs at once.
//!
//! `max_in_flight` unless a gateway in the same process is answering its
//! 202s slower than its objective ([`skyport_runtime::foreground`]: their
//! p99 over `gateway.latency_objective_ms`). Every [`PERIOD`] the window
//! halves when more than 1 % of the 202s since the last look were slower,
//! down to an eighth of `max_in_flight`, and otherwise grows by a sixteenth
//! of it, back to the whole in under a second: a spike is accepted first and
//! the backlog drained at full width once it has passed. In-flight events
//! are never touched.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::metrics;
use skyport_runtime::config::WorkerSettings;
use skyport_runtime::foreground::{Answers, Foreground};
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
}

impl Window {
    pub fn new(settings: &WorkerSettings) -> Self {
        let max = settings.max_in_flight;
        Self {
            current: AtomicUsize::new(max),
            max,
            min: (max / 8).max(1),
        }
    }

    /// Events each partition may have in flight now.
    pub fn get(&self) -> usize {
        self.current.load(Ordering::Relaxed)
    }

    /// One adjustment after the gateway's `answers`.
    fn adjust(&self, answers: Answers) -> usize {
        let current = self.get();
        let next = if answers.over_objective() {
            (current / 2).max(self.min)
        } else {
            (current + (self.max / 16).max(1)).min(self.max)
        };
        self.current.store(next, Ordering::Relaxed);
        next
    }

    /// Adjusts the window to what `foreground` reports until `stop` fires;
    /// keeps it whole where no objective is set.
    pub async fn run(&self, foreground: &Foreground, stop: &CancellationToken) {
        let gauge = &metrics::global().worker_window;
        gauge.set(i64::try_from(self.get()).unwrap_or(i64::MAX));
        if !foreground.aimed() {
            return;
        }
        let mut ticks = tokio::time::interval(PERIOD);
        ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        // What piled up before this worker started is not its doing.
        foreground.take();
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = ticks.tick() => {
                    let window = self.adjust(foreground.take());
                    gauge.set(i64::try_from(window).unwrap_or(i64::MAX));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(max: usize) -> Window {
        Window::new(&WorkerSettings {
            max_in_flight: max,
            ..WorkerSettings::default()
        })
    }

    fn answers(answered: u64, slow: u64) -> Answers {
        Answers { answered, slow }
    }

    #[test]
    fn a_p99_over_the_objective_halves_the_window_down_to_an_eighth_and_one_within_widens_it_again()
    {
        let window = window(128);
        assert_eq!(window.get(), 128);
        let narrowed: Vec<usize> = (0..4).map(|_| window.adjust(answers(50, 2))).collect();
        assert_eq!(narrowed, [64, 32, 16, 16]);
        // An idle gateway, or one whose p99 is within the objective (1 slow
        // answer in 100), gives the window back.
        assert_eq!(window.adjust(answers(0, 0)), 24);
        assert_eq!(window.adjust(answers(500, 5)), 32);
        for _ in 0..20 {
            window.adjust(answers(0, 0));
        }
        assert_eq!(window.get(), 128);
    }

    #[test]
    fn a_window_of_one_stays_one() {
        let one = window(1);
        assert_eq!(one.adjust(answers(9, 9)), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn without_an_objective_the_window_stays_whole() {
        let window = window(128);
        let foreground = Foreground::default();
        for _ in 0..10 {
            foreground.record(Duration::from_secs(1));
        }
        let stop = CancellationToken::new();
        tokio::time::timeout(Duration::from_secs(1), window.run(&foreground, &stop))
            .await
            .expect("the window is not adjusted at all");
        assert_eq!(window.get(), 128);
    }
}
