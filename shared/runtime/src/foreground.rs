//! How the gateway in this process is answering, for a worker beside it.
//!
//! In the all-in-one the worker shares two cores with the gateway. Its
//! threads already run at a lower priority (`worker.nice`), but a thousand
//! workflows in flight still wake often enough to delay the gateway's
//! answers. So the gateway records here how slow its slowest answer has
//! been since the worker last looked, and the worker narrows its in-flight
//! window while that is over its goal (`worker.gateway_latency_goal_ms`).
//! Nothing is recorded in a process without a gateway, and a worker there
//! keeps its whole window.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The gateway's answers since the last [`Foreground::take`].
#[derive(Debug, Default)]
pub struct Foreground {
    answered: AtomicU64,
    slowest_us: AtomicU64,
}

impl Foreground {
    /// The gateway answered an API request after `elapsed`.
    pub fn record(&self, elapsed: Duration) {
        let micros = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        self.answered.fetch_add(1, Ordering::Relaxed);
        self.slowest_us.fetch_max(micros, Ordering::Relaxed);
    }

    /// How many answers since the last call, and the slowest of them; starts over.
    pub fn take(&self) -> (u64, Duration) {
        let answered = self.answered.swap(0, Ordering::Relaxed);
        let slowest = self.slowest_us.swap(0, Ordering::Relaxed);
        (answered, Duration::from_micros(slowest))
    }
}

/// The process's one record.
pub fn global() -> &'static Foreground {
    static FOREGROUND: OnceLock<Foreground> = OnceLock::new();
    FOREGROUND.get_or_init(Foreground::default)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn take_answers_the_slowest_since_the_last_take_and_starts_over() {
        let foreground = Foreground::default();
        assert_eq!(foreground.take(), (0, Duration::ZERO));
        foreground.record(Duration::from_millis(3));
        foreground.record(Duration::from_millis(12));
        foreground.record(Duration::from_millis(1));
        assert_eq!(foreground.take(), (3, Duration::from_millis(12)));
        assert_eq!(foreground.take(), (0, Duration::ZERO));
    }
}
