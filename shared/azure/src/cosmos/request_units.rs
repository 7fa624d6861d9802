//! Request-unit accounting: the charge of every Cosmos DB response, by
//! operation, and the 429s, summarised in one line at shutdown and counted in
//! `skyport_cosmos_request_units_total` and `skyport_throttled_total`.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use skyport_runtime::metrics;

use super::metrics::{self as cosmos_metrics, OperationLabels};

/// What a request did, for accounting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    Read,
    Write,
    Query,
    Delete,
    /// A read of the change feed (a page, or an estimate's probe) or of its
    /// feed ranges.
    ChangeFeed,
    /// An upsert or a delete of the listing view's items, kept apart from
    /// the status writes so that what the view costs shows on its own.
    ListingWrite,
}

impl Operation {
    const ALL: [Self; 6] = [
        Self::Read,
        Self::Write,
        Self::Query,
        Self::Delete,
        Self::ChangeFeed,
        Self::ListingWrite,
    ];

    fn name(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Write => "write",
            Self::Query => "query",
            Self::Delete => "delete",
            Self::ChangeFeed => "change_feed",
            Self::ListingWrite => "listing_write",
        }
    }
}

#[derive(Debug, Default)]
struct Meter {
    requests: AtomicU64,
    /// Thousandths of a request unit, so that sums stay exact in an integer.
    milli_units: AtomicU64,
}

/// Request units spent since the store opened.
#[derive(Debug)]
pub struct RequestUnits {
    meters: [Meter; 6],
    throttled: AtomicU64,
    since: Instant,
}

impl Default for RequestUnits {
    /// Nothing spent yet: every operation's series, and the 429s', at 0.
    fn default() -> Self {
        let units = &cosmos_metrics::global().request_units;
        for operation in Operation::ALL {
            units.get_or_create_owned(&OperationLabels {
                operation: operation.name(),
            });
        }
        metrics::global()
            .throttled
            .get_or_create_owned(&metrics::DependencyLabels {
                dependency: "cosmos",
            });
        Self {
            meters: Default::default(),
            throttled: AtomicU64::new(0),
            since: Instant::now(),
        }
    }
}

impl RequestUnits {
    fn meter(&self, operation: Operation) -> &Meter {
        &self.meters[operation as usize]
    }

    /// Records one response and its `x-ms-request-charge`.
    pub fn record(&self, operation: Operation, charge: f64) {
        let meter = self.meter(operation);
        meter.requests.fetch_add(1, Ordering::Relaxed);
        let milli = if charge.is_finite() && charge > 0.0 {
            (charge * 1000.0).round() as u64
        } else {
            0
        };
        meter.milli_units.fetch_add(milli, Ordering::Relaxed);
        if milli > 0 {
            cosmos_metrics::global()
                .request_units
                .get_or_create(&OperationLabels {
                    operation: operation.name(),
                })
                .inc_by(milli as f64 / 1000.0);
        }
    }

    /// Records a 429: throttled, not done, to be retried.
    pub fn throttled(&self) {
        self.throttled.fetch_add(1, Ordering::Relaxed);
        metrics::global().throttled_by("cosmos");
    }

    pub fn throttled_count(&self) -> u64 {
        self.throttled.load(Ordering::Relaxed)
    }

    /// Requests and request units of one operation so far.
    pub fn spent(&self, operation: Operation) -> (u64, f64) {
        let meter = self.meter(operation);
        (
            meter.requests.load(Ordering::Relaxed),
            meter.milli_units.load(Ordering::Relaxed) as f64 / 1000.0,
        )
    }
}

impl fmt::Display for RequestUnits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let seconds = self.since.elapsed().as_secs_f64().max(0.001);
        let mut total = 0.0;
        for operation in Operation::ALL {
            let (requests, units) = self.spent(operation);
            total += units;
            write!(
                f,
                "{} {requests} requests {units:.1} RU ({:.1} RU/s); ",
                operation.name(),
                units / seconds
            )?;
        }
        write!(
            f,
            "total {total:.1} RU ({:.1} RU/s); 429s {}",
            total / seconds,
            self.throttled_count()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_add_up_by_operation_and_429s_are_counted() {
        let units = RequestUnits::default();
        units.record(Operation::Write, 5.71);
        units.record(Operation::Write, 5.71);
        units.record(Operation::Read, 1.0);
        units.record(Operation::Read, f64::NAN);
        units.throttled();
        assert_eq!(units.spent(Operation::Write), (2, 11.42));
        assert_eq!(units.spent(Operation::Read), (2, 1.0));
        assert_eq!(units.throttled_count(), 1);
        let summary = units.to_string();
        assert!(summary.contains("write 2 requests 11.4 RU"), "{summary}");
        assert!(summary.ends_with("429s 1"), "{summary}");
    }
}
