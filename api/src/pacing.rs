//! How long a client should wait before asking again: `Retry-After` (whole
//! seconds, at least 1) and `retry-after-ms` (which Azure's pollers read)
//! on a 202 and on a status that is not terminal yet.
//!
//! The gateway learns the recent time to terminal from the terminal
//! documents it serves (their last write less their acceptance, first
//! attempt epoch only), as a moving average that weighs the latest 1/16. A
//! delivery accepted at `t` is then expected at `t + typical`: a client is
//! told to come back then, or, once that moment has passed, after a quarter
//! of the typical time; never sooner than 100 ms nor later than a minute.
//! Until a delivery has been seen to end, the answer is
//! `gateway.retry_after_s`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::http::{HeaderName, HeaderValue, header};
use skyport_core::status::StatusDocument;
use time::OffsetDateTime;

/// The header Azure's long-running-operation pollers read before `Retry-After`.
pub const RETRY_AFTER_MS: HeaderName = HeaderName::from_static("retry-after-ms");

const SOONEST: Duration = Duration::from_millis(100);
const LATEST: Duration = Duration::from_secs(60);
/// The longest wait asked of a poller of a Waiting delivery: it sees what
/// changed within the hour, however far away its `runsAt`.
const WAITING_LATEST: Duration = Duration::from_secs(3_600);
/// The weight of the newest observation in the moving average, as a shift (1/16).
const WEIGHT_SHIFT: u32 = 4;

/// The recent time to terminal, and the waits it suggests.
#[derive(Debug)]
pub struct Pacing {
    /// The answer until a delivery has been seen to end.
    default: Duration,
    /// The moving average of the time to terminal, in microseconds; 0 until
    /// the first observation.
    typical_us: AtomicU64,
}

impl Pacing {
    /// Pacing that answers `default` until it has seen a delivery end.
    pub fn new(default: Duration) -> Self {
        Self {
            default,
            typical_us: AtomicU64::new(0),
        }
    }

    /// Learns from `document` when it is terminal and of the first attempt
    /// epoch (a redriven delivery's time counts from its redrive).
    pub fn observe(&self, document: &StatusDocument) {
        if !document.state.is_terminal() || document.epoch != 0 {
            return;
        }
        let took = document.updated_at - document.created_at;
        let Ok(took) = Duration::try_from(took) else {
            return;
        };
        let sample = u64::try_from(took.min(LATEST).as_micros()).unwrap_or(u64::MAX);
        let _ = self
            .typical_us
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |typical| {
                Some(if typical == 0 {
                    sample.max(1)
                } else {
                    let next = (typical << WEIGHT_SHIFT) - typical + sample;
                    (next >> WEIGHT_SHIFT).max(1)
                })
            });
    }

    /// The recent time to terminal, once a delivery has been seen to end.
    pub fn typical(&self) -> Option<Duration> {
        match self.typical_us.load(Ordering::Relaxed) {
            0 => None,
            us => Some(Duration::from_micros(us)),
        }
    }

    /// How long a client should wait before asking again about a delivery
    /// accepted at `accepted_at`, at `now`.
    pub fn wait(&self, accepted_at: OffsetDateTime, now: OffsetDateTime) -> Duration {
        let Some(typical) = self.typical() else {
            return self.default;
        };
        let expected = accepted_at + typical;
        let until = Duration::try_from(expected - now).unwrap_or_default();
        until.max(typical / 4).clamp(SOONEST, LATEST)
    }
}

/// How long a client should wait before asking again about `document`, at
/// `now`: until its `runsAt` while it is Waiting (at most [`WAITING_LATEST`],
/// and at least [`SOONEST`]), else as [`Pacing::wait`] says.
pub fn wait_for(pacing: &Pacing, document: &StatusDocument, now: OffsetDateTime) -> Duration {
    match document.due_at() {
        Some(runs_at) => Duration::try_from(runs_at - now)
            .unwrap_or_default()
            .clamp(SOONEST, WAITING_LATEST),
        None => pacing.wait(document.created_at, now),
    }
}

/// `Retry-After` (whole seconds, rounded up, at least 1) and `retry-after-ms` for `wait`.
pub fn headers(wait: Duration) -> [(HeaderName, HeaderValue); 2] {
    let millis = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
    [
        (header::RETRY_AFTER, HeaderValue::from(seconds(wait))),
        (RETRY_AFTER_MS, HeaderValue::from(millis)),
    ]
}

/// `wait` in whole seconds, rounded up, at least 1 (what `Retry-After` can say).
pub fn seconds(wait: Duration) -> u32 {
    wait.as_millis()
        .div_ceil(1000)
        .max(1)
        .try_into()
        .unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use skyport_core::status::DeliveryState;
    use time::macros::datetime;

    use super::*;

    fn ended(after: Duration) -> StatusDocument {
        let accepted = datetime!(2026-11-26 10:00 UTC);
        let mut document = StatusDocument::accepted("d-1", accepted);
        document.state = DeliveryState::Scheduled;
        document.updated_at = accepted + after;
        document
    }

    #[test]
    fn the_default_holds_until_a_delivery_is_seen_to_end() {
        let pacing = Pacing::new(Duration::from_secs(1));
        let now = datetime!(2026-11-26 10:00 UTC);
        assert_eq!(pacing.wait(now, now), Duration::from_secs(1));
        let mut running = ended(Duration::from_millis(100));
        running.state = DeliveryState::Processing;
        pacing.observe(&running);
        let mut redriven = ended(Duration::from_millis(100));
        redriven.epoch = 1;
        pacing.observe(&redriven);
        assert_eq!(pacing.typical(), None);
    }

    #[test]
    fn a_client_is_told_to_come_back_when_the_delivery_is_expected_to_end() {
        let pacing = Pacing::new(Duration::from_secs(1));
        pacing.observe(&ended(Duration::from_millis(400)));
        assert_eq!(pacing.typical(), Some(Duration::from_millis(400)));
        let accepted = datetime!(2026-11-26 10:00 UTC);
        let wait = |since_ms: i64| {
            pacing.wait(accepted, accepted + time::Duration::milliseconds(since_ms))
        };
        assert_eq!(wait(0), Duration::from_millis(400));
        assert_eq!(wait(150), Duration::from_millis(250));
        // Past the expected end: a quarter of the typical time.
        assert_eq!(wait(350), Duration::from_millis(100));
        assert_eq!(wait(5_000), Duration::from_millis(100));
    }

    #[test]
    fn the_average_follows_recent_deliveries_and_the_waits_stay_bounded() {
        let pacing = Pacing::new(Duration::from_secs(1));
        pacing.observe(&ended(Duration::from_millis(100)));
        for _ in 0..200 {
            pacing.observe(&ended(Duration::from_secs(20)));
        }
        let typical = pacing.typical().expect("observed");
        assert!(typical > Duration::from_secs(19), "{typical:?}");
        for _ in 0..200 {
            pacing.observe(&ended(Duration::from_secs(600)));
        }
        let accepted = datetime!(2026-11-26 10:00 UTC);
        let longest = pacing.wait(accepted, accepted);
        assert!(
            longest > Duration::from_secs(59) && longest <= LATEST,
            "{longest:?}"
        );
        let quick = Pacing::new(Duration::from_secs(1));
        quick.observe(&ended(Duration::from_millis(8)));
        assert_eq!(quick.wait(accepted, accepted), SOONEST);
    }

    #[test]
    fn retry_after_rounds_up_to_whole_seconds_and_the_milliseconds_ride_beside() {
        let [(seconds, s), (millis, ms)] = headers(Duration::from_millis(1_250));
        assert_eq!((seconds, s), (header::RETRY_AFTER, HeaderValue::from(2)));
        assert_eq!((millis, ms), (RETRY_AFTER_MS, HeaderValue::from(1_250)));
        assert_eq!(super::seconds(Duration::from_millis(120)), 1);
        assert_eq!(super::seconds(Duration::from_secs(3)), 3);
    }

    #[test]
    fn a_waiting_delivery_is_polled_at_its_time_at_most_an_hour_ahead() {
        let pacing = Pacing::new(Duration::from_secs(1));
        let now = datetime!(2026-11-26 10:00 UTC);
        let mut document = StatusDocument::accepted("d-1", now);
        document.state = DeliveryState::Waiting;
        document.runs_at = Some(now + time::Duration::minutes(5));
        assert_eq!(wait_for(&pacing, &document, now), Duration::from_secs(300));
        document.runs_at = Some(now + time::Duration::days(400));
        assert_eq!(wait_for(&pacing, &document, now), WAITING_LATEST);
        document.runs_at = Some(now - time::Duration::seconds(5));
        assert_eq!(wait_for(&pacing, &document, now), SOONEST, "due: soon");
        document.state = DeliveryState::Processing;
        assert_eq!(wait_for(&pacing, &document, now), Duration::from_secs(1));
    }
}
