//! Everything that decides whether a partition may pull events and start
//! them: pauses held by name ([`pauses`]: an open circuit, a backlog past its
//! limit), the backlog guard ([`backlog`]), and the rate limiter
//! ([`rate_limit`]) whose slot each event waits for before it starts, and
//! the in-flight window ([`window`]), narrowed while a gateway beside the
//! worker answers slowly. In-flight events are never touched.

pub mod backlog;
pub mod pacer;
pub mod pauses;
pub mod rate_limit;
pub mod window;

use std::time::Duration;

use skyport_core::ports::Lane;
use skyport_runtime::config::WorkerSettings;
use tokio_util::sync::CancellationToken;

use self::backlog::{BacklogExceeded, BacklogGuard, Pending};
use self::pauses::Pauses;
use self::rate_limit::RateLimiter;
use self::window::Window;

/// How often the backlog guard looks at the partitions.
const BACKLOG_CHECK_PERIOD: Duration = Duration::from_secs(1);

/// One worker's intake control, shared by its partitions.
#[derive(Debug)]
pub struct Intake {
    pauses: Pauses,
    backlog: BacklogGuard,
    limiter: Option<RateLimiter>,
    window: Window,
}

impl Intake {
    /// Intake as `settings` limit it: the backlog guard's limits and, unless
    /// `rate_limit_per_s` is 0, a rate limiter.
    pub fn new(settings: &WorkerSettings) -> Self {
        Self {
            pauses: Pauses::default(),
            backlog: BacklogGuard::new(settings),
            limiter: (settings.rate_limit_per_s > 0)
                .then(|| RateLimiter::new(settings.rate_limit_per_s)),
            window: Window::new(settings),
        }
    }

    /// Who holds intake paused, and why; what circuit breakers pause it through.
    pub fn pauses(&self) -> &Pauses {
        &self.pauses
    }

    /// The events per second this worker starts, when limited.
    pub fn rate(&self) -> Option<u32> {
        self.limiter.as_ref().map(RateLimiter::rate)
    }

    /// Events each partition may have in flight now.
    pub fn window(&self) -> usize {
        self.window.get()
    }

    /// An entry in the backlog for a partition loop that starts now; it
    /// reports the loop's pending events until it is dropped.
    pub fn track(&self) -> Pending<'_> {
        self.backlog.track()
    }

    /// Waits until an event of `lane` may start (a rate-limit slot, the
    /// expedited lane's first, when limited):
    /// false when `stop` or `abandon` fired first, and the event has done
    /// nothing (it is read again after a restart).
    pub async fn admit(
        &self,
        lane: Lane,
        stop: &CancellationToken,
        abandon: &CancellationToken,
    ) -> bool {
        let Some(limiter) = &self.limiter else {
            return true;
        };
        tokio::select! {
            () = stop.cancelled() => false,
            () = abandon.cancelled() => false,
            () = limiter.acquire(lane) => true,
        }
    }

    /// Checks the backlog, refills the rate limiter and adjusts the window
    /// until `stop` fires.
    ///
    /// # Errors
    /// [`BacklogExceeded`] when the backlog stayed over its limit past its
    /// grace period; the caller stops the worker.
    pub async fn run(&self, stop: &CancellationToken) -> Result<(), BacklogExceeded> {
        let refill_stop = stop.child_token();
        let refill = async {
            if let Some(limiter) = &self.limiter {
                limiter.clone().refill(refill_stop.clone()).await;
            }
        };
        let guard = async {
            let result = self
                .backlog
                .watch(&self.pauses, BACKLOG_CHECK_PERIOD, stop)
                .await;
            refill_stop.cancel();
            result
        };
        let window = self
            .window
            .run(skyport_runtime::foreground::global(), &refill_stop);
        let ((), (), result) = tokio::join!(refill, window, guard);
        result
    }
}
