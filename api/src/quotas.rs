//! Per-client quotas (`[gateway.quotas]`): a GCRA bucket per client
//! (governor's), held in an LRU map bounded by `max_clients`, metered per
//! gateway process.
//!
//! Every metered answer tells the client where it stands in the IETF
//! RateLimit header fields (draft-ietf-httpapi-ratelimit-headers):
//! `RateLimit-Policy: "default";q=BURST;w=SECONDS` (the bucket: BURST
//! requests, refilled over SECONDS) and `RateLimit: "default";r=LEFT;t=SECONDS`
//! (requests left now, and seconds until the bucket is full again, or, on a
//! 429, until the next one is let through). A client with a quota of its own
//! has the policy `"client"`.
//!
//! Beside the buckets, under the same lock, the quotas count what they let
//! through and refuse for their busiest clients ([`HeavyHitters`], at most
//! [`CAPACITY`] of them), which the dashboard shows.

use std::num::NonZeroU32;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use axum::http::{HeaderName, HeaderValue};
use governor::clock::{Clock, DefaultClock};
use governor::middleware::StateInformationMiddleware;
use governor::state::{InMemoryState, NotKeyed};
use governor::{Quota, RateLimiter};
use lru::LruCache;
use skyport_runtime::config::QuotaSettings;
use skyport_runtime::dashboard::{ClientCount, TopClients};

use crate::error::ApiError;
use crate::heavy_hitters::{CAPACITY, HeavyHitters};

pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// One client's bucket.
type Bucket<C> = RateLimiter<NotKeyed, InMemoryState, C, StateInformationMiddleware>;

/// A quota as configured: its policy's name, rate and burst, and its
/// `RateLimit-Policy` (made once: it never changes).
#[derive(Debug, Clone)]
struct Limit {
    policy: &'static str,
    per_s: NonZeroU32,
    burst: NonZeroU32,
    policy_header: HeaderValue,
}

impl Limit {
    fn new(policy: &'static str, per_s: u32, burst: Option<u32>) -> Option<Self> {
        let per_s = NonZeroU32::new(per_s)?;
        let burst = burst.and_then(NonZeroU32::new).unwrap_or(per_s);
        let window = u64::from(burst.get())
            .div_ceil(u64::from(per_s.get()))
            .max(1);
        Some(Self {
            policy,
            per_s,
            burst,
            policy_header: header(&format!("\"{policy}\";q={burst};w={window}")),
        })
    }

    fn quota(&self) -> Quota {
        Quota::per_second(self.per_s).allow_burst(self.burst)
    }

    /// Whole seconds (at least 1) the bucket takes to refill `requests`.
    fn seconds_for(&self, requests: u32) -> u64 {
        u64::from(requests)
            .div_ceil(u64::from(self.per_s.get()))
            .max(1)
    }
}

fn header(text: &str) -> HeaderValue {
    HeaderValue::from_str(text).unwrap_or_else(|_| HeaderValue::from_static("\"default\""))
}

/// What metering a request decided, with the headers its answer carries.
#[derive(Debug)]
pub struct Charged {
    pub headers: [(HeaderName, HeaderValue); 2],
}

/// The quotas of a gateway process; `None` from [`Quotas::new`] when off.
pub struct Quotas<C: Clock = DefaultClock> {
    default: Limit,
    clients: std::collections::HashMap<String, Limit>,
    metered: Mutex<Metered<C>>,
    clock: C,
}

/// What every charge changes.
struct Metered<C: Clock> {
    buckets: LruCache<String, Bucket<C>>,
    busiest: HeavyHitters,
}

impl<C: Clock> std::fmt::Debug for Quotas<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Quotas")
            .field("default", &self.default)
            .field("clients", &self.clients.len())
            .finish_non_exhaustive()
    }
}

impl Quotas {
    /// The quotas `settings` configure, on the monotonic clock; `None` while
    /// `default_per_s` is unset.
    pub fn new(settings: &QuotaSettings) -> Option<Self> {
        Self::with_clock(settings, DefaultClock::default())
    }
}

impl<C: Clock + Clone> Quotas<C> {
    pub fn with_clock(settings: &QuotaSettings, clock: C) -> Option<Self> {
        let default = Limit::new("default", settings.default_per_s?, settings.burst)?;
        let clients = settings
            .clients
            .iter()
            .filter_map(|(name, quota)| {
                Limit::new("client", quota.per_s, quota.burst).map(|limit| (name.clone(), limit))
            })
            .collect();
        let capacity = NonZeroU32::new(u32::try_from(settings.max_clients).unwrap_or(u32::MAX))
            .and_then(|n| std::num::NonZeroUsize::new(n.get() as usize))
            .unwrap_or(std::num::NonZeroUsize::MIN);
        Some(Self {
            default,
            clients,
            metered: Mutex::new(Metered {
                buckets: LruCache::new(capacity),
                busiest: HeavyHitters::new(CAPACITY),
            }),
            clock,
        })
    }

    /// Charges one request to `client`.
    ///
    /// # Errors
    /// [`ApiError::TooManyRequests`] with the headers and the wait when its
    /// bucket is empty.
    pub fn charge(&self, client: &str) -> Result<Charged, ApiError> {
        let limit = self.clients.get(client).unwrap_or(&self.default);
        let mut guard = self.metered.lock().unwrap_or_else(PoisonError::into_inner);
        let metered = &mut *guard;
        let bucket = metered.buckets.get_or_insert_ref(client, || {
            RateLimiter::direct_with_clock(limit.quota(), self.clock.clone())
                .with_middleware::<StateInformationMiddleware>()
        });
        let decided = bucket.check();
        metered.busiest.count(client, decided.is_ok());
        drop(guard);
        match decided {
            Ok(state) => {
                let left = state.remaining_burst_capacity();
                let full_in = limit.seconds_for(limit.burst.get().saturating_sub(left));
                Ok(Charged {
                    headers: [
                        (RATELIMIT_POLICY, limit.policy_header.clone()),
                        (
                            RATELIMIT,
                            header(&format!("\"{}\";r={left};t={full_in}", limit.policy)),
                        ),
                    ],
                })
            }
            Err(not_until) => {
                let wait = not_until.wait_time_from(self.clock.now());
                let seconds = whole_seconds(wait);
                Err(ApiError::TooManyRequests {
                    retry_after_s: u32::try_from(seconds).unwrap_or(u32::MAX),
                    headers: Box::new([
                        (RATELIMIT_POLICY, limit.policy_header.clone()),
                        (
                            RATELIMIT,
                            header(&format!("\"{}\";r=0;t={seconds}", limit.policy)),
                        ),
                    ]),
                    detail: format!(
                        "client {client:?} is over its quota of {} requests a second (bursts of {}); retry after the Retry-After seconds",
                        limit.per_s, limit.burst
                    ),
                })
            }
        }
    }

    /// How many clients are remembered now.
    pub fn clients(&self) -> usize {
        self.metered
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .buckets
            .len()
    }
}

impl<C: Clock> TopClients for Quotas<C>
where
    Self: Send + Sync,
{
    fn top_clients(&self) -> Vec<ClientCount> {
        self.metered
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .busiest
            .clients()
    }
}

/// Whole seconds, rounded up, at least 1.
fn whole_seconds(wait: Duration) -> u64 {
    wait.as_nanos()
        .div_ceil(1_000_000_000)
        .try_into()
        .unwrap_or(u64::MAX)
        .max(1)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::collections::BTreeMap;

    use governor::clock::FakeRelativeClock;
    use skyport_runtime::config::ClientQuota;

    use super::*;

    fn settings(per_s: u32, burst: Option<u32>) -> QuotaSettings {
        QuotaSettings {
            default_per_s: Some(per_s),
            burst,
            clients: BTreeMap::from([(
                "bulk".to_owned(),
                ClientQuota {
                    per_s: 100,
                    burst: None,
                },
            )]),
            max_clients: 3,
            client_claim: None,
        }
    }

    fn value(charged: &Charged, name: &HeaderName) -> String {
        let (_, value) = charged.headers.iter().find(|(n, _)| n == name).unwrap();
        value.to_str().unwrap().to_owned()
    }

    #[test]
    fn a_bucket_lets_its_burst_through_then_refills_at_its_rate() {
        let clock = FakeRelativeClock::default();
        let quotas = Quotas::with_clock(&settings(2, Some(4)), clock.clone()).unwrap();
        for left in (0..4).rev() {
            let charged = quotas.charge("alice").unwrap();
            assert_eq!(value(&charged, &RATELIMIT_POLICY), "\"default\";q=4;w=2");
            assert!(
                value(&charged, &RATELIMIT).starts_with(&format!("\"default\";r={left};")),
                "{}",
                value(&charged, &RATELIMIT)
            );
        }
        let Err(ApiError::TooManyRequests {
            retry_after_s,
            headers,
            ..
        }) = quotas.charge("alice")
        else {
            panic!("the fifth in the same instant is refused");
        };
        assert_eq!(retry_after_s, 1);
        assert_eq!(headers[1].1, "\"default\";r=0;t=1");
        // Another client has a bucket of its own.
        quotas.charge("bob").unwrap();
        // Half a second refills one request at 2 a second.
        clock.advance(Duration::from_millis(500));
        quotas.charge("alice").unwrap();
        assert!(quotas.charge("alice").is_err());
    }

    #[test]
    fn a_client_with_a_quota_of_its_own_has_its_policy() {
        let quotas = Quotas::with_clock(&settings(1, None), FakeRelativeClock::default()).unwrap();
        for _ in 0..100 {
            let charged = quotas.charge("bulk").unwrap();
            assert_eq!(value(&charged, &RATELIMIT_POLICY), "\"client\";q=100;w=1");
        }
        assert!(quotas.charge("bulk").is_err());
        quotas.charge("alice").unwrap();
        assert!(quotas.charge("alice").is_err(), "the default: 1 a second");
    }

    #[test]
    fn memory_is_bounded_by_max_clients_forgetting_the_least_recently_seen() {
        let quotas = Quotas::with_clock(&settings(1, None), FakeRelativeClock::default()).unwrap();
        quotas.charge("a").unwrap();
        for client in ["b", "c", "d"] {
            quotas.charge(client).unwrap();
        }
        assert_eq!(quotas.clients(), 3);
        // "a" was forgotten, so it starts again with a full bucket.
        quotas.charge("a").unwrap();
        assert!(quotas.charge("d").is_err(), "d is still remembered");
    }

    #[test]
    fn what_a_charge_decides_is_counted_for_the_busiest_clients() {
        let quotas =
            Quotas::with_clock(&settings(1, Some(2)), FakeRelativeClock::default()).unwrap();
        let decided: Vec<bool> = (0..4).map(|_| quotas.charge("alice").is_ok()).collect();
        assert_eq!(decided, [true, true, false, false]);
        quotas.charge("bob").unwrap();
        let counts: Vec<_> = quotas
            .top_clients()
            .into_iter()
            .map(|c| (c.name, c.accepted, c.refused))
            .collect();
        assert_eq!(
            counts,
            [("alice".to_owned(), 2, 2), ("bob".to_owned(), 1, 0)]
        );
    }

    #[test]
    fn unset_is_off() {
        assert!(Quotas::new(&QuotaSettings::default()).is_none());
    }
}
