//! How the gateway in this process is answering, for a worker beside it.
//!
//! In the all-in-one on the embedded stream the worker shares two cores,
//! the disk and the store's committer with the gateway. Its threads already
//! run at a lower priority (`worker.nice`), but a thousand workflows in
//! flight still wake often enough to delay the gateway's 202s. So the
//! gateway counts here its 202s and those slower than its objective
//! (`gateway.latency_objective_ms`), and the worker narrows its in-flight
//! window while more than 1 % of them were: while the 202's p99 is over the
//! objective. Nothing is counted as slow until the all-in-one sets the
//! objective ([`Foreground::aim`]), so a worker anywhere else keeps its
//! whole window.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The gateway's 202s since the last [`Foreground::take`].
#[derive(Debug, Default)]
pub struct Foreground {
    /// The objective in µs; 0: none.
    objective_us: AtomicU64,
    answered: AtomicU64,
    slow: AtomicU64,
}

/// The 202s between two looks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Answers {
    pub answered: u64,
    /// Those slower than the objective.
    pub slow: u64,
}

impl Answers {
    /// Whether their p99 was over the objective: more than 1 % were slower.
    pub fn over_objective(self) -> bool {
        self.slow.saturating_mul(100) > self.answered
    }
}

impl Foreground {
    /// Counts the 202s slower than `objective` from now on; zero counts none.
    pub fn aim(&self, objective: Duration) {
        let micros = u64::try_from(objective.as_micros()).unwrap_or(u64::MAX);
        self.objective_us.store(micros, Ordering::Relaxed);
    }

    /// Whether an objective is set.
    pub fn aimed(&self) -> bool {
        self.objective_us.load(Ordering::Relaxed) > 0
    }

    /// The gateway answered a request with 202 after `elapsed`.
    pub fn record(&self, elapsed: Duration) {
        self.answered.fetch_add(1, Ordering::Relaxed);
        let objective = self.objective_us.load(Ordering::Relaxed);
        let micros = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        if objective > 0 && micros > objective {
            self.slow.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The 202s since the last call; starts over.
    pub fn take(&self) -> Answers {
        Answers {
            answered: self.answered.swap(0, Ordering::Relaxed),
            slow: self.slow.swap(0, Ordering::Relaxed),
        }
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
    fn take_counts_the_answers_over_the_objective_since_the_last_take_and_starts_over() {
        let foreground = Foreground::default();
        foreground.record(Duration::from_millis(40));
        assert_eq!(
            foreground.take(),
            Answers {
                answered: 1,
                slow: 0
            },
            "nothing is slow without an objective"
        );
        foreground.aim(Duration::from_millis(25));
        assert!(foreground.aimed());
        for millis in [3, 25, 26, 1] {
            foreground.record(Duration::from_millis(millis));
        }
        assert_eq!(
            foreground.take(),
            Answers {
                answered: 4,
                slow: 1
            }
        );
        assert_eq!(
            foreground.take(),
            Answers {
                answered: 0,
                slow: 0
            }
        );
    }

    #[test]
    fn the_p99_is_over_the_objective_when_more_than_one_answer_in_a_hundred_is() {
        let answers = |answered, slow| Answers { answered, slow };
        assert!(!answers(0, 0).over_objective());
        assert!(!answers(100, 1).over_objective());
        assert!(answers(100, 2).over_objective());
        assert!(answers(50, 1).over_objective());
        assert!(!answers(500, 5).over_objective());
    }
}
