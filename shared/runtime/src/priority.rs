//! A runtime for background work that yields the CPU to the work in front.
//!
//! The worker shares its machine with a gateway (in the all-in-one, or on a
//! shared node). Both are CPU-bound under a spike, and the stream exists so
//! that the spike is accepted at the gateway's rate and worked off later.
//! Linux schedules threads, not processes, by their niceness: a thread at
//! nice 10 gets about a tenth of the weight of one at 0 while both want the
//! CPU, and all of it while the other does not. So the worker runs on a
//! runtime of its own whose threads (workers and blocking pool) lower their
//! priority when they start; no fixed rate, no idle capacity wasted.

use std::future::Future;
use std::time::Duration;

use tokio::runtime::{Builder, Runtime};
use tokio::task::JoinHandle;

/// Sets the calling thread's niceness to `nice` (0 to 19; raising it needs
/// no privilege). Linux schedules threads by their own niceness, so this
/// touches no other thread.
///
/// # Errors
/// When the kernel refuses.
pub fn lower_this_thread(nice: i32) -> std::io::Result<()> {
    rustix::process::setpriority_process(Some(rustix::thread::gettid()), nice)
        .map_err(std::io::Error::from)
}

/// A multi-threaded runtime whose threads run at `nice`, named `name`.
#[derive(Debug)]
pub struct BackgroundRuntime {
    runtime: Option<Runtime>,
}

impl BackgroundRuntime {
    /// Builds the runtime, one worker thread per core.
    ///
    /// # Errors
    /// When the runtime's threads cannot be started.
    pub fn new(name: &str, nice: i32) -> std::io::Result<Self> {
        let runtime = Builder::new_multi_thread()
            .thread_name(name)
            .on_thread_start(move || {
                if let Err(e) = lower_this_thread(nice) {
                    tracing::warn!(error = %e, nice, "Could not lower a worker thread's priority; it competes with the gateway as an equal.");
                }
            })
            .enable_all()
            .build()?;
        Ok(Self {
            runtime: Some(runtime),
        })
    }

    /// Runs `future` on this runtime; await the handle from anywhere.
    pub fn spawn<F>(&self, future: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        match &self.runtime {
            Some(runtime) => runtime.spawn(future),
            None => unreachable!("the runtime is taken only when it stops"),
        }
    }

    /// Stops the runtime and waits, on a blocking thread and for at most
    /// `within`, until its threads have ended: every task still on it has
    /// been dropped, and what those held (the embedded store's lock on its
    /// file) is released once this returns.
    pub async fn shutdown(mut self, within: Duration) {
        if let Some(runtime) = self.runtime.take()
            && let Err(e) =
                tokio::task::spawn_blocking(move || runtime.shutdown_timeout(within)).await
        {
            tracing::warn!(error = %e, "The background runtime did not stop cleanly.");
        }
    }
}

impl Drop for BackgroundRuntime {
    /// Stops the runtime without waiting, so it may be dropped from async code.
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn its_threads_run_at_the_niceness_asked_for() {
        let runtime = BackgroundRuntime::new("test-background", 7).unwrap();
        let nice = runtime
            .spawn(async {
                rustix::process::getpriority_process(Some(rustix::thread::gettid())).unwrap()
            })
            .await
            .unwrap();
        assert_eq!(nice, 7);
        drop(runtime);
    }
}
