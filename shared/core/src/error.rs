//! The error every port boxes its sources in, so that no adapter's types leak out.

/// A source error, boxed so that no adapter's types leak out of it.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A request a backend refused for now because a budget is spent (a
/// throughput control group's, say); the caller may try again after
/// `retry_after`. Carried as the source of an `Unavailable` error, so that
/// the gateway can tell a client when to come back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} has spent its budget for now; retry after {} ms", retry_after.as_millis())]
pub struct Throttled {
    pub what: String,
    pub retry_after: std::time::Duration,
}

impl Throttled {
    /// Whole seconds to wait, at least 1, for a `Retry-After` header.
    pub fn retry_after_s(&self) -> u32 {
        let millis = self.retry_after.as_millis().max(1);
        u32::try_from(millis.div_ceil(1_000)).unwrap_or(u32::MAX)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_wait_is_whole_seconds_rounded_up_and_never_zero() {
        let after = |millis| {
            Throttled {
                what: "a group".into(),
                retry_after: Duration::from_millis(millis),
            }
            .retry_after_s()
        };
        assert_eq!(after(0), 1);
        assert_eq!(after(999), 1);
        assert_eq!(after(1_001), 2);
        assert_eq!(after(3_000), 3);
    }
}
