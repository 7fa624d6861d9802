//! The engine of a throughput control group in one process: 1 s cycles, a
//! budget per cycle charged with each response's actual request charge,
//! overspending carried into the next cycle as debt, unused budget lost.
//! Pure: every call is given the time, so it runs on tokio's paused clock.
//!
//! Admission goes past the Java SDK's (which passes any request while the
//! cycle has budget left, however many are in flight, and does not charge a
//! response that comes after its cycle ended): a request reserves the
//! charge its group's requests have been costing, so the requests in
//! flight at a cycle's start cannot all pass on the same remainder; and a
//! late response is charged to its own cycle, out of what that cycle left
//! unused, any excess becoming debt of the current one. So every request
//! unit spent is charged exactly once.

use std::time::Duration;

use tokio::time::Instant;

/// The length of a cycle.
pub(crate) const CYCLE: Duration = Duration::from_secs(1);

/// The least load factor, so that an idle process keeps a share to start from.
pub(crate) const MIN_LOAD_FACTOR: f64 = 0.1;

/// How much the estimate of a request's charge moves towards each actual one.
const ESTIMATE_WEIGHT: f64 = 0.2;

/// An admitted request, to be settled with its actual charge.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Ticket {
    cycle: u64,
    estimate: f64,
}

/// Why a request cannot pass now, and when it may.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Spent {
    /// The start of the first cycle that may have budget for it.
    pub(crate) until: Instant,
}

#[derive(Debug)]
pub(crate) struct Budget {
    origin: Instant,
    /// The current cycle, counted from `origin`.
    cycle: u64,
    /// What this process may spend per cycle (its allocation).
    scheduled: f64,
    /// The allocation from the next cycle on.
    next_scheduled: Option<f64>,
    /// The current cycle's budget less the charges settled against it;
    /// negative: debt.
    available: f64,
    /// Estimates of the requests admitted in this cycle and not settled.
    pending: f64,
    /// Estimates of the previous cycle's requests not settled yet.
    previous_pending: f64,
    /// What the previous cycle left unused, which its late responses spend first.
    previous_slack: f64,
    /// Estimates of requests from older cycles not settled yet.
    older_pending: f64,
    /// The charge a request is expected to cost.
    estimate: f64,
    /// Whether a request was held or refused in this cycle (demand beyond it).
    wanted_more: bool,
    /// The usage of the cycles closed since the last [`Budget::take_load_factor`].
    usage_sum: f64,
    usage_cycles: u32,
    /// Whether no request has been admitted yet.
    fresh: bool,
}

impl Budget {
    pub(crate) fn new(now: Instant, scheduled: f64) -> Self {
        Self {
            origin: now,
            cycle: 0,
            scheduled,
            next_scheduled: None,
            available: scheduled,
            pending: 0.0,
            previous_pending: 0.0,
            previous_slack: 0.0,
            older_pending: 0.0,
            estimate: 1.0,
            wanted_more: false,
            usage_sum: 0.0,
            usage_cycles: 0,
            fresh: true,
        }
    }

    /// Whether no request has been admitted yet: a first allocation may
    /// then apply at once.
    pub(crate) fn is_fresh(&self) -> bool {
        self.fresh
    }

    /// The allocation per cycle, from the next cycle on.
    pub(crate) fn set_allocation(&mut self, now: Instant, scheduled: f64) {
        self.roll(now);
        self.next_scheduled = Some(scheduled.max(0.0));
    }

    pub(crate) fn allocation(&self) -> f64 {
        self.next_scheduled.unwrap_or(self.scheduled)
    }

    /// Admits a request if the cycle has budget beyond what is in flight.
    pub(crate) fn admit(&mut self, now: Instant) -> Result<Ticket, Spent> {
        self.roll(now);
        let headroom = self.headroom();
        if headroom > 0.0 {
            self.fresh = false;
            self.pending += self.estimate;
            return Ok(Ticket {
                cycle: self.cycle,
                estimate: self.estimate,
            });
        }
        self.wanted_more = true;
        let scheduled = self.allocation();
        let cycles = if scheduled > 0.0 {
            (-headroom / scheduled).floor() as u64 + 1
        } else {
            1
        };
        Err(Spent {
            until: self.start_of(self.cycle + cycles),
        })
    }

    /// Charges `charge` request units for `ticket`'s request.
    pub(crate) fn settle(&mut self, now: Instant, ticket: Ticket, charge: f64) {
        self.roll(now);
        let charge = if charge.is_finite() {
            charge.max(0.0)
        } else {
            0.0
        };
        self.estimate += ESTIMATE_WEIGHT * (charge - self.estimate);
        if ticket.cycle == self.cycle {
            self.pending = (self.pending - ticket.estimate).max(0.0);
            self.available -= charge;
        } else if ticket.cycle + 1 == self.cycle {
            self.previous_pending = (self.previous_pending - ticket.estimate).max(0.0);
            self.previous_slack -= charge;
            if self.previous_slack < 0.0 {
                self.available += self.previous_slack;
                self.previous_slack = 0.0;
            }
        } else {
            self.older_pending = (self.older_pending - ticket.estimate).max(0.0);
            self.available -= charge;
        }
    }

    /// The mean usage of the cycles closed since it was last taken, at least
    /// [`MIN_LOAD_FACTOR`]; 1 before any cycle closed.
    pub(crate) fn take_load_factor(&mut self, now: Instant) -> f64 {
        self.roll(now);
        let load = if self.usage_cycles == 0 {
            1.0
        } else {
            self.usage_sum / f64::from(self.usage_cycles)
        };
        self.usage_sum = 0.0;
        self.usage_cycles = 0;
        load.max(MIN_LOAD_FACTOR)
    }

    /// What a new request may still spend in this cycle.
    fn headroom(&self) -> f64 {
        self.available
            - self.pending
            - (self.previous_pending - self.previous_slack).max(0.0)
            - self.older_pending
    }

    fn start_of(&self, cycle: u64) -> Instant {
        self.origin + CYCLE * u32::try_from(cycle).unwrap_or(u32::MAX)
    }

    /// Closes the cycles that have ended by `now`.
    fn roll(&mut self, now: Instant) {
        let cycle =
            (now.saturating_duration_since(self.origin).as_millis() / CYCLE.as_millis()) as u64;
        if cycle <= self.cycle {
            return;
        }
        let closed = cycle - self.cycle;
        let usage = if self.wanted_more {
            1.0
        } else if self.scheduled > 0.0 {
            ((self.scheduled - self.available) / self.scheduled).clamp(0.0, 1.0)
        } else {
            0.0
        };
        self.usage_sum += usage;
        self.usage_cycles += u32::try_from(closed).unwrap_or(u32::MAX);
        self.wanted_more = false;
        if let Some(next) = self.next_scheduled.take() {
            self.scheduled = next;
        }
        let debt = self.available.min(0.0);
        if closed == 1 {
            self.older_pending += self.previous_pending;
            self.previous_pending = self.pending;
            self.previous_slack = self.available.max(0.0);
            self.available = debt + self.scheduled;
        } else {
            // The cycles between were idle: the debt is paid off a cycle's
            // budget at a time, and the last of them left its budget unused.
            let steps = (closed - 1) as f64;
            self.older_pending += self.previous_pending + self.pending;
            self.previous_pending = 0.0;
            self.previous_slack = (debt + steps * self.scheduled).clamp(0.0, self.scheduled);
            self.available = (debt + steps * self.scheduled).min(0.0) + self.scheduled;
        }
        self.pending = 0.0;
        self.cycle = cycle;
    }
}

/// This process's share of a global group: its load factor over the sum of
/// the live processes' (its own included), each at least [`MIN_LOAD_FACTOR`].
pub(crate) fn share(own: f64, others: impl IntoIterator<Item = f64>) -> f64 {
    let own = own.max(MIN_LOAD_FACTOR);
    let total: f64 = own
        + others
            .into_iter()
            .map(|l| l.max(MIN_LOAD_FACTOR))
            .sum::<f64>();
    own / total
}

/// A group's budget: its absolute target, its fraction of the container's
/// provisioned throughput, or the smaller of the two. `None` when it has a
/// fraction only and the offer is unknown.
pub(crate) fn group_budget(
    target_ru_per_s: Option<u32>,
    target_fraction: Option<f64>,
    offer_ru_per_s: Option<u32>,
) -> Option<f64> {
    let fraction = target_fraction
        .zip(offer_ru_per_s)
        .map(|(fraction, offer)| fraction * f64::from(offer));
    match (target_ru_per_s.map(f64::from), fraction) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (Some(a), None) => Some(a),
        (None, fraction) => fraction,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn at(start: Instant, millis: u64) -> Instant {
        start + Duration::from_millis(millis)
    }

    /// Admits and settles one request of `charge` at `millis`.
    fn spend(budget: &mut Budget, start: Instant, millis: u64, charge: f64) -> Result<(), Spent> {
        let ticket = budget.admit(at(start, millis))?;
        budget.settle(at(start, millis), ticket, charge);
        Ok(())
    }

    #[tokio::test(start_paused = true)]
    async fn overspending_is_carried_into_the_next_cycle_as_debt() {
        let start = Instant::now();
        let mut budget = Budget::new(start, 10.0);
        spend(&mut budget, start, 0, 25.0).unwrap();
        let spent = spend(&mut budget, start, 10, 1.0).unwrap_err();
        // 15 over: the next cycle starts at -5, the one after at 5.
        assert_eq!(spent.until, at(start, 2_000));
        assert!(
            spend(&mut budget, start, 1_000, 1.0).is_err(),
            "still in debt"
        );
        spend(&mut budget, start, 2_000, 1.0).unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn unused_budget_is_lost() {
        let start = Instant::now();
        let mut budget = Budget::new(start, 10.0);
        spend(&mut budget, start, 0, 2.0).unwrap();
        // 8 unused in cycle 0; cycle 1 has 10, not 18.
        for _ in 0..5 {
            spend(&mut budget, start, 1_000, 2.0).unwrap();
        }
        assert!(spend(&mut budget, start, 1_000, 2.0).is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn idle_cycles_pay_the_debt_off_a_cycle_at_a_time() {
        let start = Instant::now();
        let mut budget = Budget::new(start, 10.0);
        spend(&mut budget, start, 0, 45.0).unwrap();
        // -35 after cycle 0: cycles 1, 2 and 3 pay it down to -5; cycle 4 has 5.
        assert_eq!(
            budget.admit(at(start, 3_500)).unwrap_err().until,
            at(start, 4_000)
        );
        spend(&mut budget, start, 4_000, 5.0).unwrap();
        assert!(budget.admit(at(start, 4_000)).is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn requests_in_flight_reserve_their_expected_charge() {
        let start = Instant::now();
        let mut budget = Budget::new(start, 20.0);
        // Teach the estimate that a request costs about 5.
        for millis in 0..4 {
            spend(&mut budget, start, millis, 5.0).unwrap();
        }
        let mut tickets = Vec::new();
        while let Ok(ticket) = budget.admit(at(start, 1_000)) {
            tickets.push(ticket);
        }
        // The cycle's 20 pass about four requests of ~5, not any number.
        assert!((3..=7).contains(&tickets.len()), "{}", tickets.len());
    }

    #[tokio::test(start_paused = true)]
    async fn a_late_response_is_charged_to_its_own_cycle_first() {
        let start = Instant::now();
        let mut budget = Budget::new(start, 100.0);
        spend(&mut budget, start, 0, 50.0).unwrap();
        let late = budget.admit(at(start, 10)).unwrap();
        // Cycle 0 ends with 50 unused; the late 30 comes from it.
        budget.settle(at(start, 1_200), late, 30.0);
        for _ in 0..10 {
            spend(&mut budget, start, 1_300, 10.0).unwrap();
        }
        assert!(budget.admit(at(start, 1_300)).is_err(), "cycle 1 had 100");

        let late = budget.admit(at(start, 3_000)).unwrap();
        // Cycle 3 ends with nothing left: the late 80 is debt of cycle 4.
        spend(&mut budget, start, 3_001, 100.0).unwrap();
        budget.settle(at(start, 4_000), late, 80.0);
        for _ in 0..2 {
            spend(&mut budget, start, 4_000, 10.0).unwrap();
        }
        assert!(
            budget.admit(at(start, 4_000)).is_err(),
            "20 of 100 after 80 of debt"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_response_of_an_older_cycle_is_charged_to_the_current_one() {
        let start = Instant::now();
        let mut budget = Budget::new(start, 10.0);
        let slow = budget.admit(start).unwrap();
        budget.settle(at(start, 2_500), slow, 8.0);
        spend(&mut budget, start, 2_500, 2.0).unwrap();
        assert!(budget.admit(at(start, 2_600)).is_err(), "10 - 8 - 2");
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_allocation_applies_from_the_next_cycle() {
        let start = Instant::now();
        let mut budget = Budget::new(start, 10.0);
        budget.set_allocation(start, 100.0);
        spend(&mut budget, start, 0, 10.0).unwrap();
        assert!(budget.admit(at(start, 1)).is_err());
        for _ in 0..9 {
            spend(&mut budget, start, 1_000, 10.0).unwrap();
        }
        assert_eq!(budget.allocation(), 100.0);
    }

    #[tokio::test(start_paused = true)]
    async fn the_load_factor_is_the_mean_usage_and_demand_counts_as_full() {
        let start = Instant::now();
        let mut budget = Budget::new(start, 10.0);
        assert_eq!(budget.take_load_factor(start), 1.0, "no cycle closed yet");
        spend(&mut budget, start, 0, 5.0).unwrap();
        // Cycle 0 used half; cycle 1 was refused once; cycle 2 idle.
        spend(&mut budget, start, 1_000, 10.0).unwrap();
        assert!(budget.admit(at(start, 1_001)).is_err());
        let load = budget.take_load_factor(at(start, 3_000));
        assert!((load - 0.5).abs() < 1e-9, "{load}");
        assert_eq!(
            budget.take_load_factor(at(start, 10_000)),
            MIN_LOAD_FACTOR,
            "idle"
        );
    }

    #[test]
    fn shares_follow_the_load_factors_of_instances_joining_and_leaving() {
        assert_eq!(share(1.0, []), 1.0);
        let three = share(1.0, [1.0, 1.0]);
        assert!((three - 1.0 / 3.0).abs() < 1e-9);
        // One leaves: the other two split the budget.
        assert!((share(1.0, [1.0]) - 0.5).abs() < 1e-9);
        // An idle instance counts as 0.1; a busy one takes the rest.
        assert!((share(1.0, [0.0]) - 1.0 / 1.1).abs() < 1e-9);
        assert!((share(0.05, [1.0]) - 0.1 / 1.1).abs() < 1e-9);
    }

    #[test]
    fn the_budget_is_the_target_its_fraction_or_the_smaller() {
        assert_eq!(group_budget(Some(200), None, None), Some(200.0));
        assert_eq!(group_budget(None, Some(0.25), Some(1_200)), Some(300.0));
        assert_eq!(
            group_budget(Some(200), Some(0.25), Some(1_200)),
            Some(200.0)
        );
        assert_eq!(
            group_budget(Some(500), Some(0.25), Some(1_200)),
            Some(300.0)
        );
        assert_eq!(group_budget(None, Some(0.25), None), None, "no offer");
        assert_eq!(
            group_budget(Some(200), Some(0.25), None),
            Some(200.0),
            "no offer: the absolute target"
        );
        // The offer changes: the fraction follows it.
        assert_eq!(group_budget(None, Some(0.25), Some(4_000)), Some(1_000.0));
    }
}
