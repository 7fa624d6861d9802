//! Waiting out a store that fails: the wait grows with each failure (the
//! workflow's backoff) until the store answers or the event is given up at
//! shutdown (it is then read again after a restart).

use std::fmt::Display;
use std::future::Future;

use tokio_util::sync::CancellationToken;

use crate::resilience::backoff::Backoff;

/// The event was given up before its write was durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Abandoned;

/// The failures of one write so far, and how long to wait after the next.
#[derive(Debug)]
pub(crate) struct Retries<'a> {
    backoff: Backoff,
    abandon: &'a CancellationToken,
    failures: u32,
}

impl<'a> Retries<'a> {
    pub(crate) fn new(backoff: Backoff, abandon: &'a CancellationToken) -> Self {
        Self {
            backoff,
            abandon,
            failures: 0,
        }
    }

    /// Logs `error` (what `what` names failed) and waits before the next try.
    ///
    /// # Errors
    /// [`Abandoned`] when `abandon` fires first.
    pub(crate) async fn wait_out(
        &mut self,
        what: &str,
        error: &(dyn Display + Sync),
    ) -> Result<(), Abandoned> {
        let wait = self.backoff.delay(self.failures);
        self.failures += 1;
        tracing::warn!(%error, retries = self.failures, "{what} failed; retrying.");
        tokio::select! {
            () = self.abandon.cancelled() => Err(Abandoned),
            () = tokio::time::sleep(wait) => Ok(()),
        }
    }

    /// Runs `attempt` until it succeeds.
    ///
    /// # Errors
    /// [`Abandoned`] when `abandon` fires first.
    pub(crate) async fn until_done<T, E: Display + Sync, Fut>(
        &mut self,
        what: &str,
        mut attempt: impl FnMut() -> Fut,
    ) -> Result<T, Abandoned>
    where
        Fut: Future<Output = Result<T, E>>,
    {
        loop {
            match attempt().await {
                Ok(done) => return Ok(done),
                Err(e) => self.wait_out(what, &e).await?,
            }
        }
    }
}
