//! Waiting out a store that fails: the wait grows with each failure (the
//! workflow's backoff) until the store answers, the event is given up at
//! shutdown (it is then read again by the partition's next owner), or it has
//! failed `worker.redeliver_after_failures` times in a row: then it is handed
//! back to the stream (a nack) and read again from there.

use std::fmt::Display;
use std::future::Future;

use skyport_runtime::backoff::Backoff;
use tokio_util::sync::CancellationToken;

/// Why an event stopped before its write was durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interrupted {
    /// Given up at shutdown or revocation: the partition's next owner reads it again.
    Abandoned,
    /// Failed too often in a row: this worker reads it again from the stream.
    Redeliver,
}

/// How the workflow retries a write that fails.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    pub backoff: Backoff,
    /// Failures in a row after which the event is read again from the stream
    /// instead of waiting once more; `None` waits until the store answers.
    pub redeliver_after: Option<u32>,
}

/// The failures of one write so far, and how long to wait after the next.
#[derive(Debug)]
pub(crate) struct Retries<'a> {
    policy: RetryPolicy,
    abandon: &'a CancellationToken,
    failures: u32,
}

impl<'a> Retries<'a> {
    pub(crate) fn new(policy: RetryPolicy, abandon: &'a CancellationToken) -> Self {
        Self {
            policy,
            abandon,
            failures: 0,
        }
    }

    /// Logs `error` (what `what` names failed) and waits before the next try.
    ///
    /// # Errors
    /// [`Interrupted::Abandoned`] when `abandon` fires first;
    /// [`Interrupted::Redeliver`] once the failures reach the policy's limit.
    pub(crate) async fn wait_out(
        &mut self,
        what: &str,
        error: &(dyn Display + Sync),
    ) -> Result<(), Interrupted> {
        let wait = self.policy.backoff.delay(self.failures);
        self.failures += 1;
        if self
            .policy
            .redeliver_after
            .is_some_and(|limit| self.failures >= limit)
        {
            tracing::warn!(%error, failures = self.failures, "{what} failed; the event will be read again from the stream.");
            return Err(Interrupted::Redeliver);
        }
        tracing::warn!(%error, retries = self.failures, "{what} failed; retrying.");
        tokio::select! {
            () = self.abandon.cancelled() => Err(Interrupted::Abandoned),
            () = tokio::time::sleep(wait) => Ok(()),
        }
    }

    /// Runs `attempt` until it succeeds.
    ///
    /// # Errors
    /// As [`Retries::wait_out`].
    pub(crate) async fn until_done<T, E: Display + Sync, Fut>(
        &mut self,
        what: &str,
        mut attempt: impl FnMut() -> Fut,
    ) -> Result<T, Interrupted>
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
