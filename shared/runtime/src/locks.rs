//! Short mutexes that carry a name. Built with the `lock-timing` feature
//! (`cargo build --release --features lock-timing`), each counts how long
//! its callers waited for it and held it
//! (`skyport_lock_wait_seconds_total{lock}`,
//! `skyport_lock_held_seconds_total{lock}`,
//! `skyport_lock_acquisitions_total{lock}`): a lock on every workflow's
//! path is a serial part of it, its hold time per workflow sets its
//! ceiling, 10⁶ ÷ µs. Without the feature a lock is a plain mutex and
//! costs nothing more. A poisoned lock is taken as it is: what it guards
//! stays consistent at every unwind point of its users.

use std::ops::{Deref, DerefMut};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// A mutex with a name, timed under the `lock-timing` feature.
#[derive(Default)]
pub struct NamedMutex<T> {
    name: &'static str,
    inner: Mutex<T>,
}

impl<T> std::fmt::Debug for NamedMutex<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NamedMutex")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl<T> NamedMutex<T> {
    /// `name`: its `lock` label, one per kind of lock (every breaker's
    /// tally is `breaker_tally`).
    pub const fn new(name: &'static str, value: T) -> Self {
        Self {
            name,
            inner: Mutex::new(value),
        }
    }

    /// Waits for the lock and holds it until the guard is dropped.
    pub fn lock(&self) -> NamedGuard<'_, T> {
        #[cfg(feature = "lock-timing")]
        let asked = std::time::Instant::now();
        let guard = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        NamedGuard {
            guard,
            #[cfg(feature = "lock-timing")]
            held: timing::Held::since(self.name, asked),
        }
    }
}

/// A held [`NamedMutex`].
pub struct NamedGuard<'a, T> {
    guard: MutexGuard<'a, T>,
    #[cfg(feature = "lock-timing")]
    held: timing::Held,
}

impl<T: std::fmt::Debug> std::fmt::Debug for NamedGuard<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("NamedGuard").field(&*self.guard).finish()
    }
}

impl<T> Deref for NamedGuard<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.guard
    }
}

impl<T> DerefMut for NamedGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.guard
    }
}

#[cfg(feature = "lock-timing")]
impl<T> Drop for NamedGuard<'_, T> {
    fn drop(&mut self) {
        self.held.release();
    }
}

#[cfg(feature = "lock-timing")]
mod timing {
    use std::sync::LazyLock;
    use std::sync::atomic::AtomicU64;
    use std::time::Instant;

    use prometheus_client::encoding::EncodeLabelSet;
    use prometheus_client::metrics::counter::Counter;
    use prometheus_client::metrics::family::Family;

    use crate::metrics;

    #[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
    struct LockLabels {
        lock: &'static str,
    }

    struct LockMetrics {
        wait: Family<LockLabels, Counter<f64, AtomicU64>>,
        held: Family<LockLabels, Counter<f64, AtomicU64>>,
        acquisitions: Family<LockLabels, Counter>,
    }

    fn global() -> &'static LockMetrics {
        static METRICS: LazyLock<LockMetrics> = LazyLock::new(|| {
            let mut registry = metrics::component();
            let wait = Family::default();
            registry.register(
                "lock_wait_seconds",
                "Time spent waiting for the process's named locks, by lock",
                wait.clone(),
            );
            let held = Family::default();
            registry.register(
                "lock_held_seconds",
                "Time the process's named locks were held, by lock",
                held.clone(),
            );
            let acquisitions = Family::default();
            registry.register(
                "lock_acquisitions",
                "Times the process's named locks were taken, by lock",
                acquisitions.clone(),
            );
            metrics::global().register(registry);
            LockMetrics {
                wait,
                held,
                acquisitions,
            }
        });
        &METRICS
    }

    /// A lock taken at `since` after waiting from `asked`.
    pub(super) struct Held {
        name: &'static str,
        since: Instant,
    }

    impl Held {
        pub(super) fn since(name: &'static str, asked: Instant) -> Self {
            let since = Instant::now();
            let labels = LockLabels { lock: name };
            let metrics = global();
            metrics
                .wait
                .get_or_create(&labels)
                .inc_by((since - asked).as_secs_f64());
            metrics.acquisitions.get_or_create(&labels).inc();
            Self { name, since }
        }

        pub(super) fn release(&self) {
            global()
                .held
                .get_or_create(&LockLabels { lock: self.name })
                .inc_by(self.since.elapsed().as_secs_f64());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_named_lock_guards_its_value() {
        let lock = NamedMutex::new("test", 1);
        *lock.lock() += 1;
        assert_eq!(*lock.lock(), 2);
        assert!(format!("{lock:?}").contains("test"));
    }

    #[cfg(feature = "lock-timing")]
    #[test]
    fn with_lock_timing_its_hold_time_is_counted() {
        let lock = NamedMutex::new("timed_test", ());
        {
            let _held = lock.lock();
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let text = crate::metrics::global().render();
        let held: f64 = text
            .lines()
            .find_map(|line| {
                line.strip_prefix("skyport_lock_held_seconds_total{lock=\"timed_test\"} ")
            })
            .and_then(|value| value.parse().ok())
            .unwrap_or_default();
        assert!(held >= 0.005, "{text}");
    }
}
