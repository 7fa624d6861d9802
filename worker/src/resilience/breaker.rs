//! A circuit breaker per service.
//!
//! Closed: calls go through; it opens after `consecutive_failures` transient
//! failures in a row, or when at least `failure_percent` of the last `window`
//! calls failed. Open: calls wait (intake is paused, so no new work piles up)
//! until `open_duration` has passed; then one probe goes through (half-open).
//! A probe that succeeds closes the circuit and the waiting calls go on; one
//! that fails opens it again. Only transient failures count: a service that
//! answers a permanent 4xx is up.

use std::collections::VecDeque;
use std::time::Duration;

use crate::metrics::{self, BreakerState};
use skyport_core::status::Step;
use skyport_runtime::config::ServicesSettings;
use skyport_runtime::locks::{NamedGuard, NamedMutex};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::intake::pauses::Pauses;

#[derive(Debug, Clone, Copy)]
pub struct BreakerSettings {
    pub window: usize,
    pub failure_percent: u32,
    pub consecutive_failures: u32,
    pub open_duration: Duration,
}

impl From<&ServicesSettings> for BreakerSettings {
    fn from(settings: &ServicesSettings) -> Self {
        Self {
            window: settings.breaker_window,
            failure_percent: settings.breaker_failure_percent,
            consecutive_failures: settings.breaker_consecutive_failures,
            open_duration: settings.breaker_open_ms.duration(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Closed,
    Open {
        until: Instant,
    },
    /// One probe is in flight.
    HalfOpen,
}

/// What a caller may do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    Call,
    /// Call, as the probe whose outcome decides the circuit.
    Probe,
    /// Wait until this instant (or, with `None`, until the probe's outcome).
    Wait(Option<Instant>),
}

#[derive(Debug)]
struct Tally {
    state: State,
    recent: VecDeque<bool>,
    consecutive: u32,
}

#[derive(Debug)]
pub struct Breaker {
    service: &'static str,
    settings: BreakerSettings,
    tally: NamedMutex<Tally>,
    changed: watch::Sender<()>,
    intake: Pauses,
}

impl Breaker {
    pub fn new(service: &'static str, settings: BreakerSettings, intake: Pauses) -> Self {
        metrics::global().breaker(service, BreakerState::Closed);
        Self {
            service,
            settings,
            tally: NamedMutex::new(
                "breaker_tally",
                Tally {
                    state: State::Closed,
                    recent: VecDeque::with_capacity(settings.window),
                    consecutive: 0,
                },
            ),
            changed: watch::Sender::new(()),
            intake,
        }
    }

    pub fn state(&self) -> State {
        self.lock().state
    }

    fn lock(&self) -> NamedGuard<'_, Tally> {
        self.tally.lock()
    }

    pub fn admit(&self, now: Instant) -> Admission {
        let mut tally = self.lock();
        match tally.state {
            State::Closed => Admission::Call,
            State::Open { until } if now >= until => {
                tally.state = State::HalfOpen;
                metrics::global().breaker(self.service, BreakerState::HalfOpen);
                Admission::Probe
            }
            State::Open { until } => Admission::Wait(Some(until)),
            State::HalfOpen => Admission::Wait(None),
        }
    }

    /// Records the outcome of a call admitted as `admission` (`ok`: the service answered for good).
    pub fn record(&self, admission: Admission, ok: bool, now: Instant) {
        let mut tally = self.lock();
        match (tally.state, admission) {
            (State::HalfOpen, Admission::Probe) if ok => self.close(&mut tally),
            (State::HalfOpen, Admission::Probe) => self.open(&mut tally, now),
            (State::Closed, Admission::Call) => {
                if tally.recent.len() == self.settings.window {
                    tally.recent.pop_front();
                }
                tally.recent.push_back(ok);
                tally.consecutive = if ok { 0 } else { tally.consecutive + 1 };
                let failures = tally.recent.iter().filter(|ok| !**ok).count();
                let full = tally.recent.len() == self.settings.window;
                let too_many = full
                    && failures * 100
                        >= self.settings.failure_percent as usize * self.settings.window;
                if tally.consecutive >= self.settings.consecutive_failures || too_many {
                    self.open(&mut tally, now);
                }
            }
            // Outcomes of calls admitted before the circuit changed decide nothing.
            _ => {}
        }
    }

    /// A probe given up without an outcome: let the next caller probe.
    pub fn release_probe(&self, now: Instant) {
        let mut tally = self.lock();
        if tally.state == State::HalfOpen {
            tally.state = State::Open { until: now };
            metrics::global().breaker(self.service, BreakerState::Open);
            self.changed.send_replace(());
        }
    }

    /// What wakes a caller that [`Self::admit`] tells to wait. Taken before
    /// `admit`: a change between the two (the probe's outcome) then wakes
    /// it, where a subscription taken after would miss it and wait for a
    /// change that may never come.
    pub fn changes(&self) -> watch::Receiver<()> {
        self.changed.subscribe()
    }

    /// Waits until `until`, or until the circuit changes after `changed`
    /// was taken (with [`Self::changes`]).
    pub async fn wait(mut changed: watch::Receiver<()>, until: Option<Instant>) {
        match until {
            Some(until) => {
                tokio::select! {
                    _ = changed.changed() => {}
                    () = tokio::time::sleep_until(until) => {}
                }
            }
            None => {
                let _ = changed.changed().await;
            }
        }
    }

    fn open(&self, tally: &mut Tally, now: Instant) {
        if tally.state == State::Closed {
            tracing::warn!(
                service = self.service,
                "Opened the circuit: the service keeps failing."
            );
        }
        tally.state = State::Open {
            until: now + self.settings.open_duration,
        };
        metrics::global().breaker(self.service, BreakerState::Open);
        self.intake.pause(
            &format!("circuit:{}", self.service),
            format!("the {} service's circuit is open", self.service),
        );
        self.changed.send_replace(());
    }

    fn close(&self, tally: &mut Tally) {
        tracing::info!(
            service = self.service,
            "Closed the circuit: the service answers again."
        );
        tally.state = State::Closed;
        metrics::global().breaker(self.service, BreakerState::Closed);
        tally.recent.clear();
        tally.consecutive = 0;
        self.intake.resume(&format!("circuit:{}", self.service));
        self.changed.send_replace(());
    }
}

/// One breaker per service.
#[derive(Debug)]
pub struct Breakers {
    account: Breaker,
    package: Breaker,
    delivery: Breaker,
    third_party: Breaker,
    drone: Breaker,
}

impl Breakers {
    pub fn new(settings: BreakerSettings, intake: &Pauses) -> Self {
        let breaker = |step: Step| Breaker::new(step.as_str(), settings, intake.clone());
        Self {
            account: breaker(Step::Account),
            package: breaker(Step::Package),
            delivery: breaker(Step::Delivery),
            third_party: breaker(Step::ThirdParty),
            drone: breaker(Step::Drone),
        }
    }

    pub fn get(&self, step: Step) -> &Breaker {
        match step {
            Step::Account => &self.account,
            Step::Package => &self.package,
            Step::Delivery => &self.delivery,
            Step::ThirdParty => &self.third_party,
            Step::Drone => &self.drone,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn breaker() -> (Breaker, Pauses) {
        let intake = Pauses::default();
        let settings = BreakerSettings {
            window: 10,
            failure_percent: 50,
            consecutive_failures: 3,
            open_duration: Duration::from_secs(2),
        };
        (Breaker::new("drone", settings, intake.clone()), intake)
    }

    #[test]
    fn consecutive_failures_open_the_circuit_and_pause_intake() {
        let (breaker, intake) = breaker();
        let now = Instant::now();
        for _ in 0..3 {
            assert_eq!(breaker.admit(now), Admission::Call);
            breaker.record(Admission::Call, false, now);
        }
        assert_eq!(
            breaker.state(),
            State::Open {
                until: now + Duration::from_secs(2)
            }
        );
        assert_eq!(
            breaker.admit(now),
            Admission::Wait(Some(now + Duration::from_secs(2)))
        );
        assert_eq!(intake.reasons(), ["the drone service's circuit is open"]);
    }

    #[test]
    fn a_failure_ratio_over_the_window_opens_the_circuit() {
        let (breaker, _) = breaker();
        let now = Instant::now();
        for ok in [true, false, true, false, true, false, true, false, true] {
            breaker.record(Admission::Call, ok, now);
        }
        assert_eq!(breaker.state(), State::Closed, "the window is not full yet");
        breaker.record(Admission::Call, false, now);
        assert!(matches!(breaker.state(), State::Open { .. }));
    }

    #[test]
    fn scattered_failures_keep_it_closed() {
        let (breaker, _) = breaker();
        let now = Instant::now();
        for i in 0..100 {
            breaker.record(Admission::Call, i % 4 != 0, now);
        }
        assert_eq!(breaker.state(), State::Closed);
    }

    #[test]
    fn after_the_open_duration_one_probe_decides() {
        let (breaker, intake) = breaker();
        let now = Instant::now();
        for _ in 0..3 {
            breaker.record(Admission::Call, false, now);
        }
        let later = now + Duration::from_secs(2);
        assert_eq!(breaker.admit(later), Admission::Probe);
        assert_eq!(
            breaker.admit(later),
            Admission::Wait(None),
            "one probe at a time"
        );
        breaker.record(Admission::Probe, false, later);
        assert_eq!(
            breaker.state(),
            State::Open {
                until: later + Duration::from_secs(2)
            }
        );
        let again = later + Duration::from_secs(2);
        assert_eq!(breaker.admit(again), Admission::Probe);
        breaker.record(Admission::Probe, true, again);
        assert_eq!(breaker.state(), State::Closed);
        assert!(intake.reasons().is_empty());
        assert_eq!(breaker.admit(again), Admission::Call);
    }

    #[test]
    fn late_outcomes_of_earlier_calls_decide_nothing() {
        let (breaker, _) = breaker();
        let now = Instant::now();
        for _ in 0..3 {
            breaker.record(Admission::Call, false, now);
        }
        breaker.record(Admission::Call, true, now);
        assert!(matches!(breaker.state(), State::Open { .. }));
    }

    #[tokio::test(start_paused = true)]
    async fn a_probe_that_ends_before_a_caller_waits_still_wakes_it() {
        let (breaker, _) = breaker();
        let now = Instant::now();
        for _ in 0..3 {
            breaker.record(Admission::Call, false, now);
        }
        let later = now + Duration::from_secs(2);
        assert_eq!(breaker.admit(later), Admission::Probe);
        let changes = breaker.changes();
        assert_eq!(breaker.admit(later), Admission::Wait(None));
        // The probe succeeds before the waiting caller gets to wait.
        breaker.record(Admission::Probe, true, later);
        tokio::time::timeout(Duration::from_secs(60), Breaker::wait(changes, None))
            .await
            .expect("the closed circuit wakes the caller told to wait before it closed");
        assert_eq!(breaker.admit(later), Admission::Call);
    }

    #[test]
    fn a_probe_given_up_lets_the_next_caller_probe() {
        let (breaker, _) = breaker();
        let now = Instant::now();
        for _ in 0..3 {
            breaker.record(Admission::Call, false, now);
        }
        let later = now + Duration::from_secs(3);
        assert_eq!(breaker.admit(later), Admission::Probe);
        breaker.release_probe(later);
        assert_eq!(breaker.admit(later), Admission::Probe);
    }
}
