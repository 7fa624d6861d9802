//! Durations as configuration holds them: a whole number in the unit the
//! key's name ends with (`*_ms`, `*_s`), read as a [`Duration`] by the code.

use std::time::Duration;

use serde::{Deserialize, Serialize};

macro_rules! duration_in {
    ($(#[$doc:meta])* $name:ident, $from:path) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[cfg_attr(test, derive(schemars::JsonSchema))]
        #[serde(transparent)]
        pub struct $name(u64);

        impl $name {
            pub const fn new(count: u64) -> Self {
                Self(count)
            }

            /// The number as configured, in this unit.
            pub const fn count(self) -> u64 {
                self.0
            }

            pub fn duration(self) -> Duration {
                $from(self.0)
            }
        }

        impl From<$name> for Duration {
            fn from(value: $name) -> Self {
                value.duration()
            }
        }
    };
}

duration_in!(
    /// A duration in milliseconds (keys ending in `_ms`).
    Millis,
    Duration::from_millis
);

duration_in!(
    /// A duration in seconds (keys ending in `_s`).
    Seconds,
    Duration::from_secs
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_duration_reads_in_the_unit_of_its_key() {
        assert_eq!(Millis::new(1_500).duration(), Duration::from_millis(1_500));
        assert_eq!(Duration::from(Seconds::new(2)), Duration::from_secs(2));
        assert_eq!(Seconds::new(7).count(), 7);
    }
}
