//! What a connection is doing, as its watchdog sees it: idle (no request in
//! progress: since it opened, or since its last response), receiving a head
//! (bytes of the next request have arrived, its handler has not started), or
//! in a request (a handler runs; the body's own deadline is the handler's).
//!
//! The connection's reads and writes and its requests' starts and ends
//! update it; [`Activity::expired`] resolves when the idle or the head
//! deadline passes, which closes the connection. This is how Go's net/http
//! separates `IdleTimeout` from `ReadHeaderTimeout`; hyper's own header
//! timer counts from the end of the previous response, so it would bound
//! keep-alive idleness and head reading with one number.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;
use tokio::time::Instant;

/// No head is being received.
const NO_HEAD: u64 = 0;

/// One connection's activity, shared by its I/O, its requests and its watchdog.
#[derive(Debug)]
pub(super) struct Activity {
    opened: Instant,
    header_read_timeout: u64,
    idle_timeout: u64,
    /// Requests whose handler has started and whose response is not yet produced.
    in_flight: AtomicUsize,
    /// Milliseconds since `opened` of the last byte read or written.
    last_io: AtomicU64,
    /// One more than the millisecond since `opened` when the first byte of
    /// the next head arrived; [`NO_HEAD`] when none has.
    head_started: AtomicU64,
    /// Wakes the watchdog when a deadline may have moved earlier.
    changed: Notify,
}

impl Activity {
    pub(super) fn new(header_read_timeout: Duration, idle_timeout: Duration) -> Self {
        Self {
            opened: Instant::now(),
            header_read_timeout: millis(header_read_timeout),
            idle_timeout: millis(idle_timeout),
            in_flight: AtomicUsize::new(0),
            last_io: AtomicU64::new(0),
            head_started: AtomicU64::new(NO_HEAD),
            changed: Notify::new(),
        }
    }

    fn now(&self) -> u64 {
        millis(self.opened.elapsed())
    }

    fn read(&self) {
        let now = self.now();
        self.last_io.store(now, Ordering::Relaxed);
        if self.in_flight.load(Ordering::Acquire) == 0
            && self
                .head_started
                .compare_exchange(NO_HEAD, now + 1, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            self.changed.notify_one();
        }
    }

    fn wrote(&self) {
        self.last_io.store(self.now(), Ordering::Relaxed);
    }

    /// A request's handler starts; the returned guard ends it when dropped
    /// (its response produced, or the request abandoned).
    pub(super) fn begin(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.head_started.store(NO_HEAD, Ordering::Release);
        InFlight(Arc::clone(self))
    }

    /// When the connection is to be closed, in milliseconds since it opened;
    /// `None` while a request is in progress.
    fn deadline(&self) -> Option<u64> {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return None;
        }
        match self.head_started.load(Ordering::Acquire) {
            NO_HEAD => Some(self.last_io.load(Ordering::Relaxed) + self.idle_timeout),
            started => Some(started - 1 + self.header_read_timeout),
        }
    }

    /// Resolves once the connection has been idle, or receiving a head, for
    /// longer than allowed, saying which.
    pub(super) async fn expired(&self) -> Expiry {
        loop {
            let now = self.now();
            match self.deadline() {
                Some(deadline) if deadline <= now => {
                    return if self.head_started.load(Ordering::Acquire) == NO_HEAD {
                        Expiry::Idle
                    } else {
                        Expiry::HeadTimeout
                    };
                }
                Some(deadline) => {
                    tokio::select! {
                        () = tokio::time::sleep(Duration::from_millis(deadline - now)) => {}
                        () = self.changed.notified() => {}
                    }
                }
                None => self.changed.notified().await,
            }
        }
    }
}

/// Why a connection's watchdog closed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Expiry {
    /// No request in progress for the idle timeout.
    Idle,
    /// A request head still incomplete at the header read timeout.
    HeadTimeout,
}

impl Expiry {
    /// The `reason` label of `skyport_http_connections_closed`.
    pub(super) fn reason(self) -> &'static str {
        match self {
            Self::Idle => "idle",
            Self::HeadTimeout => "head_timeout",
        }
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// A request in progress on its connection.
#[derive(Debug)]
pub(super) struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let activity = &self.0;
        activity.wrote();
        if activity.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            activity.changed.notify_one();
        }
    }
}

/// A connection's I/O, reporting every byte read or written to its [`Activity`].
#[derive(Debug)]
pub(super) struct Watched<I> {
    io: I,
    activity: Arc<Activity>,
}

impl<I> Watched<I> {
    pub(super) fn new(io: I, activity: Arc<Activity>) -> Self {
        Self { io, activity }
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for Watched<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.activity.read();
        }
        polled
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Watched<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.wrote();
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.wrote();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEAD: Duration = Duration::from_millis(200);
    const IDLE: Duration = Duration::from_millis(400);

    fn activity() -> Arc<Activity> {
        Arc::new(Activity::new(HEAD, IDLE))
    }

    /// Waits for `activity` to expire, returning why and how long that took (at most 5 s).
    async fn expiry(activity: &Activity) -> (Expiry, Duration) {
        let started = Instant::now();
        let expiry = tokio::time::timeout(Duration::from_secs(5), activity.expired())
            .await
            .expect("the connection expires");
        (expiry, started.elapsed())
    }

    #[tokio::test]
    async fn an_idle_connection_expires_after_the_idle_timeout() {
        let (why, waited) = expiry(&activity()).await;
        assert_eq!(why, Expiry::Idle);
        assert!(waited >= IDLE, "{waited:?}");
    }

    #[tokio::test]
    async fn a_head_that_started_arriving_expires_after_the_header_timeout() {
        let activity = activity();
        activity.read();
        let (why, waited) = expiry(&activity).await;
        assert_eq!(why, Expiry::HeadTimeout);
        assert!(waited >= HEAD && waited < IDLE, "{waited:?}");
    }

    #[tokio::test]
    async fn a_request_in_progress_never_expires_and_its_end_restarts_the_idle_clock() {
        let activity = activity();
        activity.read();
        let request = activity.begin();
        let expired = tokio::time::timeout(IDLE * 2, activity.expired()).await;
        assert!(expired.is_err(), "a handler at work holds the connection");
        drop(request);
        let (why, waited) = expiry(&activity).await;
        assert_eq!(why, Expiry::Idle);
        assert!(waited >= IDLE, "{waited:?}");
    }
}
