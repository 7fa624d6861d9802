//! Request-unit accounting: the charge of every Cosmos DB response, by
//! operation and by what it was for ([`Spend`]), and the 429s, summarised in
//! one line at shutdown and counted in `skyport_cosmos_request_units_total`
//! (labels `operation` and `work`) and `skyport_throttled_total`.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use skyport_runtime::config::Work;
use skyport_runtime::metrics;

use super::metrics::{self as cosmos_metrics, SpendLabels};

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
}

impl Operation {
    pub const ALL: [Self; 5] = [
        Self::Read,
        Self::Write,
        Self::Query,
        Self::Delete,
        Self::ChangeFeed,
    ];

    fn name(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Write => "write",
            Self::Query => "query",
            Self::Delete => "delete",
            Self::ChangeFeed => "change_feed",
        }
    }
}

/// What a request was for: the `work` label of the request units, so that
/// what a delivery costs shows by kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spend {
    /// The worker's status writes, and the callbacks' outcomes written back.
    StatusWrites,
    /// Status reads: a client's, or the worker's before it writes.
    StatusReads,
    /// The idempotency reservations of named requests.
    Reservations,
    /// The Event Hubs consumer's and the change-feed processors' leases.
    Leases,
    /// Dead-lettered events and changes.
    DeadLetters,
    /// Reads of the status container's change feed.
    ChangeFeed,
    /// Listing: the pages clients read.
    Listing,
    /// The global throughput control groups' own items.
    ThroughputControl,
    /// The timers of Waiting deliveries: written beside the status, read
    /// when due, removed once fired.
    Timers,
}

impl Spend {
    pub const ALL: [Self; 9] = [
        Self::StatusWrites,
        Self::StatusReads,
        Self::Reservations,
        Self::Leases,
        Self::DeadLetters,
        Self::ChangeFeed,
        Self::Listing,
        Self::ThroughputControl,
        Self::Timers,
    ];

    /// What a request of `work`'s throughput group doing `operation` is for.
    /// A listing's pages run as status reads (a status read's only query),
    /// so they count as listing.
    pub fn of(work: Work, operation: Operation) -> Self {
        match (work, operation) {
            (Work::StatusReads, Operation::Query) => Self::Listing,
            (Work::StatusWrites, _) => Self::StatusWrites,
            (Work::StatusReads, _) => Self::StatusReads,
            (Work::Reservations, _) => Self::Reservations,
            (Work::Leases, _) => Self::Leases,
            (Work::DeadLetters, _) => Self::DeadLetters,
            (Work::ChangeFeed, _) => Self::ChangeFeed,
            (Work::Timers, _) => Self::Timers,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::StatusWrites => "status_writes",
            Self::StatusReads => "status_reads",
            Self::Reservations => "reservations",
            Self::Leases => "leases",
            Self::DeadLetters => "dead_letters",
            Self::ChangeFeed => "change_feed",
            Self::Listing => "listing",
            Self::ThroughputControl => "throughput_control",
            Self::Timers => "timers",
        }
    }
}

#[derive(Debug, Default)]
struct Meter {
    requests: AtomicU64,
    /// Thousandths of a request unit, so that sums stay exact in an integer.
    milli_units: AtomicU64,
}

impl Meter {
    fn read(&self) -> (u64, u64) {
        (
            self.requests.load(Ordering::Relaxed),
            self.milli_units.load(Ordering::Relaxed),
        )
    }
}

/// Requests and thousandths of a request unit summed over `meters`, as
/// requests and request units.
fn sum<'a>(meters: impl Iterator<Item = &'a Meter>) -> (u64, f64) {
    let (requests, milli) = meters
        .map(Meter::read)
        .fold((0, 0), |(r, m), (requests, milli)| {
            (r + requests, m + milli)
        });
    (requests, milli as f64 / 1000.0)
}

/// Request units spent since the store opened.
#[derive(Debug)]
pub struct RequestUnits {
    /// By what they were for, then by operation.
    meters: [[Meter; Operation::ALL.len()]; Spend::ALL.len()],
    throttled: AtomicU64,
    since: Instant,
}

impl Default for RequestUnits {
    /// Nothing spent yet: the 429s' series at 0 (a request-unit series
    /// appears with the first charge of its operation and work).
    fn default() -> Self {
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
    /// Records one response to `operation`, done for `spend`, and its
    /// `x-ms-request-charge`.
    pub fn record(&self, spend: Spend, operation: Operation, charge: f64) {
        let milli = if charge.is_finite() && charge > 0.0 {
            (charge * 1000.0).round() as u64
        } else {
            0
        };
        let meter = &self.meters[spend as usize][operation as usize];
        meter.requests.fetch_add(1, Ordering::Relaxed);
        meter.milli_units.fetch_add(milli, Ordering::Relaxed);
        if milli > 0 {
            cosmos_metrics::global()
                .request_units
                .get_or_create(&SpendLabels {
                    operation: operation.name(),
                    work: spend.name(),
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
        sum(self
            .meters
            .iter()
            .map(|by_operation| &by_operation[operation as usize]))
    }

    /// Requests and request units spent on one kind of work so far.
    pub fn spent_on(&self, spend: Spend) -> (u64, f64) {
        sum(self.meters[spend as usize].iter())
    }

    /// Requests and request units of one operation done for one kind of
    /// work so far: the status writes' writes alone, say, without the reads
    /// that decided them.
    pub fn spent_doing(&self, spend: Spend, operation: Operation) -> (u64, f64) {
        sum(std::iter::once(
            &self.meters[spend as usize][operation as usize],
        ))
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
            "total {total:.1} RU ({:.1} RU/s); 429s {}; by work:",
            total / seconds,
            self.throttled_count()
        )?;
        for spend in Spend::ALL {
            let (_, units) = self.spent_on(spend);
            if units > 0.0 {
                write!(f, " {} {units:.1} RU", spend.name())?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_add_up_by_operation_and_by_work_and_429s_are_counted() {
        let units = RequestUnits::default();
        units.record(Spend::StatusWrites, Operation::Write, 5.71);
        units.record(Spend::Reservations, Operation::Write, 5.71);
        units.record(Spend::StatusReads, Operation::Read, 1.0);
        units.record(Spend::StatusReads, Operation::Read, f64::NAN);
        units.record(Spend::StatusWrites, Operation::Read, 1.0);
        units.throttled();
        assert_eq!(units.spent(Operation::Write), (2, 11.42));
        assert_eq!(units.spent(Operation::Read), (3, 2.0));
        assert_eq!(units.spent_on(Spend::StatusWrites), (2, 6.71));
        assert_eq!(
            units.spent_doing(Spend::StatusWrites, Operation::Write),
            (1, 5.71)
        );
        assert_eq!(
            units.spent_doing(Spend::StatusReads, Operation::Write),
            (0, 0.0)
        );
        assert_eq!(units.spent_on(Spend::Reservations), (1, 5.71));
        assert_eq!(units.spent_on(Spend::StatusReads), (2, 1.0));
        assert_eq!(units.spent_on(Spend::Listing), (0, 0.0));
        assert_eq!(units.throttled_count(), 1);
        let summary = units.to_string();
        assert!(summary.contains("write 2 requests 11.4 RU"), "{summary}");
        assert!(
            summary.ends_with(
                "429s 1; by work: status_writes 6.7 RU status_reads 1.0 RU reservations 5.7 RU"
            ),
            "{summary}"
        );
    }

    #[test]
    fn a_listings_pages_count_as_listing() {
        assert_eq!(
            Spend::of(Work::StatusReads, Operation::Query),
            Spend::Listing
        );
        assert_eq!(
            Spend::of(Work::ChangeFeed, Operation::ChangeFeed),
            Spend::ChangeFeed
        );
        assert_eq!(
            Spend::of(Work::StatusReads, Operation::Read),
            Spend::StatusReads
        );
        for work in Work::ALL {
            assert_eq!(Spend::of(work, Operation::Write).name(), work.name());
        }
    }
}
