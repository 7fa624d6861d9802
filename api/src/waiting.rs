//! Status reads that wait for a change (`Prefer: wait=N`, RFC 7240, or
//! `?wait=N`), and POSTs that wait for their delivery's outcome (`Prefer:
//! wait=N`), N from 1 to 30 seconds.
//!
//! Admission ([`admit`]) gives such a read a place among
//! `gateway.max_waiting` (and among its client's
//! `gateway.max_waiting_per_client`) rather than among
//! `gateway.max_in_flight`, and
//! marks it [`Held`] so that its time is kept apart from the answers'. The
//! handler registers with [`Waiters`] before it reads the status, then waits
//! until the delivery's id is written again, and reads once more.
//! [`follow`] learns which ids were written from the store's change feed,
//! read from "now" and with no leases: on the embedded store it is woken by
//! the status write itself; on Cosmos DB it reads every
//! `gateway.wait_poll_interval_ms`, and only while someone waits.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use axum::extract::{ConnectInfo, MatchedPath, Query, Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use prometheus_client::metrics::gauge::Gauge;
use serde::Deserialize;
use skyport_core::ports::{ChangeFeedError, ChangeSource, FeedRange, StartFrom};
use tokio::sync::{Notify, Semaphore, watch};
use tokio_util::sync::CancellationToken;

use crate::auth::Principal;
use crate::error::ApiError;
use crate::prefer;

/// How many changed ids one read of a range hands over.
const PAGE: u32 = 1000;

/// The route whose reads may wait: a delivery's status.
pub const STATUS_ROUTE: &str = "/api/deliveryrequests/{id}/status";

/// The route whose POSTs may wait for their delivery's outcome.
pub const CREATE_ROUTE: &str = "/api/deliveryrequests";

/// How long `request` asks to be held: a GET of a status with `?wait=N`
/// (which wins) or `Prefer: wait=N`, or a POST of a delivery request with
/// `Prefer: wait=N`. Any other request is admitted among those in flight,
/// whatever it asks.
fn requested_wait(request: &Request) -> Option<Duration> {
    let route = request.extensions().get::<MatchedPath>()?.as_str();
    match (request.method(), route) {
        (&Method::GET, STATUS_ROUTE) => {
            if let Ok(Query(WaitParameter { wait: Some(wait) })) =
                Query::try_from_uri(request.uri())
            {
                return prefer::wait_from_query(&wait);
            }
            prefer::wait(request.headers())
        }
        (&Method::POST, CREATE_ROUTE) => prefer::wait(request.headers()),
        _ => None,
    }
}

/// The `wait` of a query, as it came.
#[derive(Debug, Deserialize)]
struct WaitParameter {
    wait: Option<String>,
}

/// A request's leave to wait, put in its extensions by [`admit`].
#[derive(Debug, Clone, Copy)]
pub struct Hold {
    pub wait: Duration,
}

/// Marks the answer of a request that was allowed to wait, so that its time
/// is kept apart from the other answers' (the `held` class of
/// `http_request_duration_seconds`).
#[derive(Debug, Clone, Copy)]
pub struct Held;

/// The API's load limits: requests handled at once, reads held waiting, and
/// reads held waiting by one client.
#[derive(Debug, Clone)]
pub struct Admission {
    in_flight: Arc<Semaphore>,
    waiting: Arc<Semaphore>,
    per_client: Arc<HeldByClient>,
    retry_after_s: u32,
}

impl Admission {
    pub fn new(
        max_in_flight: usize,
        max_waiting: usize,
        max_waiting_per_client: usize,
        retry_after_s: u32,
    ) -> Self {
        Self {
            in_flight: Arc::new(Semaphore::new(max_in_flight)),
            waiting: Arc::new(Semaphore::new(max_waiting)),
            per_client: Arc::new(HeldByClient {
                limit: max_waiting_per_client,
                held: Mutex::default(),
            }),
            retry_after_s,
        }
    }
}

/// The reads each client has held, so that no client takes every place.
#[derive(Debug)]
struct HeldByClient {
    limit: usize,
    held: Mutex<HashMap<String, usize>>,
}

impl HeldByClient {
    fn held(&self) -> MutexGuard<'_, HashMap<String, usize>> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A place for one more read of `client`'s, unless it holds its limit.
    fn take(self: &Arc<Self>, client: String) -> Option<ClientPlace> {
        let mut held = self.held();
        let count = held.entry(client.clone()).or_default();
        if *count >= self.limit {
            if *count == 0 {
                held.remove(&client);
            }
            return None;
        }
        *count += 1;
        Some(ClientPlace {
            of: Arc::clone(self),
            client,
        })
    }
}

/// One of a client's held reads; given back when dropped.
struct ClientPlace {
    of: Arc<HeldByClient>,
    client: String,
}

impl Drop for ClientPlace {
    fn drop(&mut self) {
        let mut held = self.of.held();
        if let Some(count) = held.get_mut(&self.client) {
            *count -= 1;
            if *count == 0 {
                held.remove(&self.client);
            }
        }
    }
}

/// Who a held read is counted against: its principal when auth is on, else
/// the address it came from.
fn client_of(request: &Request) -> String {
    if let Some(principal) = request.extensions().get::<Principal>() {
        return principal.name.clone();
    }
    request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(peer)| peer.ip().to_string())
        .unwrap_or_default()
}

/// Admits a request: one that asks to wait takes a place among the waiting
/// reads, and one among its client's, while there are (else it is handled
/// as if it had not asked); any other takes a slot among those in flight,
/// or is refused at once with 503 and `Retry-After` when none is free.
pub async fn admit(
    State(admission): State<Admission>,
    mut request: Request,
    next: Next,
) -> Response {
    if let Some(wait) = requested_wait(&request)
        && let Ok(place) = Arc::clone(&admission.waiting).try_acquire_owned()
        && let Some(client_place) = admission.per_client.take(client_of(&request))
    {
        request.extensions_mut().insert(Hold { wait });
        let counted = Counted::new(&skyport_runtime::metrics::global().http_held);
        let mut response = next.run(request).await;
        drop((counted, client_place, place));
        response.extensions_mut().insert(Held);
        return response;
    }
    let Ok(slot) = Arc::clone(&admission.in_flight).try_acquire_owned() else {
        return ApiError::Overloaded {
            retry_after_s: admission.retry_after_s,
        }
        .into_response();
    };
    let response = next.run(request).await;
    drop(slot);
    response
}

/// One on a gauge while it lives (a request whose client went away is
/// dropped mid-wait, and uncounted then).
struct Counted<'a>(&'a Gauge);

impl<'a> Counted<'a> {
    fn new(gauge: &'a Gauge) -> Self {
        gauge.inc();
        Self(gauge)
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// The ids that status reads wait on, each with a channel its writes are
/// announced on.
#[derive(Debug, Default)]
pub struct Waiters {
    ids: Mutex<HashMap<String, watch::Sender<()>>>,
    /// Told when the first read starts waiting, so that [`follow`] reads
    /// the feed only while someone waits.
    arrived: Notify,
}

impl Waiters {
    fn ids(&self) -> MutexGuard<'_, HashMap<String, watch::Sender<()>>> {
        self.ids.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts watching `id`: every write of it announced from now on wakes
    /// the returned [`Watch`].
    pub fn watch(self: &Arc<Self>, id: &str) -> Watch {
        let mut ids = self.ids();
        let first = ids.is_empty();
        let receiver = ids
            .entry(id.to_owned())
            .or_insert_with(|| watch::channel(()).0)
            .subscribe();
        drop(ids);
        if first {
            self.arrived.notify_one();
        }
        Watch {
            waiters: Arc::clone(self),
            id: id.to_owned(),
            receiver: Some(receiver),
        }
    }

    /// How many ids are watched now.
    pub fn len(&self) -> usize {
        self.ids().len()
    }

    /// Whether nobody waits.
    pub fn is_empty(&self) -> bool {
        self.ids().is_empty()
    }

    /// Announces that `written` were written.
    fn wake<'a>(&self, written: impl IntoIterator<Item = &'a String>) {
        let ids = self.ids();
        if ids.is_empty() {
            return;
        }
        for id in written {
            if let Some(sender) = ids.get(id) {
                sender.send_replace(());
            }
        }
    }

    /// Wakes every waiting read, to read its status again.
    fn wake_all(&self) {
        for sender in self.ids().values() {
            sender.send_replace(());
        }
    }
}

/// A status read's registration for one id; dropping it ends it.
#[derive(Debug)]
pub struct Watch {
    waiters: Arc<Waiters>,
    id: String,
    receiver: Option<watch::Receiver<()>>,
}

impl Watch {
    /// Resolves at the next announced write of the id (at once when one
    /// came since the last call, or since [`Waiters::watch`]).
    pub async fn changed(&mut self) {
        let announced = match self.receiver.as_mut() {
            Some(receiver) => receiver.changed().await.is_ok(),
            None => false,
        };
        // The sender lives while this receiver does.
        if !announced {
            std::future::pending::<()>().await;
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let mut ids = self.waiters.ids();
        drop(self.receiver.take());
        if ids
            .get(&self.id)
            .is_some_and(|sender| sender.receiver_count() == 0)
        {
            ids.remove(&self.id);
        }
    }
}

/// Reads `source`'s changes from "now" and wakes the reads waiting on the
/// ids written, until `shutdown`. Nothing is read while nobody waits; when
/// a read starts waiting after that, the feed is taken up from "now" again
/// and every waiting read looks once more (a write between its registration
/// and the new start would otherwise go unseen).
pub async fn follow(
    waiters: Arc<Waiters>,
    source: Arc<dyn ChangeSource>,
    poll_interval: Duration,
    shutdown: CancellationToken,
) {
    let mut positions: Option<Vec<(FeedRange, String)>> = None;
    loop {
        if waiters.is_empty() {
            positions = None;
            tokio::select! {
                () = waiters.arrived.notified() => {}
                () = shutdown.cancelled() => return,
            }
            continue;
        }
        let seen = source.version();
        let pause = match catch_up(source.as_ref(), &waiters, &mut positions).await {
            Ok(()) => poll_interval,
            Err(e) => {
                tracing::warn!(
                    error = skyport_runtime::error_chain::error_chain(&e),
                    "Cannot read the status change feed for waiting status reads; they answer when their wait ends."
                );
                if matches!(e, ChangeFeedError::BadContinuation { .. }) {
                    positions = None;
                }
                poll_interval.max(Duration::from_secs(1))
            }
        };
        tokio::select! {
            () = next_change(source.as_ref(), seen, pause) => {}
            () = shutdown.cancelled() => return,
        }
    }
}

/// Resolves when `source` has more to read: at its next change when it can
/// tell, else after `pause`.
async fn next_change(source: &dyn ChangeSource, seen: Option<u64>, pause: Duration) {
    match seen {
        Some(seen) => source.changed_since(seen).await,
        None => tokio::time::sleep(pause).await,
    }
}

/// Reads every range from its position through its latest change, waking
/// the reads waiting on the ids written; without positions, takes them at
/// "now" (and wakes every waiting read).
async fn catch_up(
    source: &dyn ChangeSource,
    waiters: &Waiters,
    positions: &mut Option<Vec<(FeedRange, String)>>,
) -> Result<(), ChangeFeedError> {
    let Some(current) = positions else {
        let mut fresh = Vec::new();
        for range in source.ranges().await? {
            let page = source.read_ids(&range, None, StartFrom::Now, PAGE).await?;
            waiters.wake(&page.ids);
            fresh.push((range, page.continuation));
        }
        *positions = Some(fresh);
        waiters.wake_all();
        return Ok(());
    };
    for (range, continuation) in current {
        loop {
            let page = source
                .read_ids(range, Some(continuation.as_str()), StartFrom::Now, PAGE)
                .await?;
            waiters.wake(&page.ids);
            *continuation = page.continuation;
            if !page.more {
                break;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_watch_wakes_on_its_ids_write_and_its_registration_ends_with_it() {
        let waiters = Arc::new(Waiters::default());
        let mut first = waiters.watch("a");
        let mut second = waiters.watch("a");
        let other = waiters.watch("b");
        assert_eq!(waiters.len(), 2);
        waiters.wake(&["a".to_owned(), "c".to_owned()]);
        tokio::time::timeout(Duration::from_secs(1), first.changed())
            .await
            .unwrap();
        tokio::time::timeout(Duration::from_secs(1), second.changed())
            .await
            .unwrap();
        // Nothing more was written: the next change is still to come.
        assert!(
            tokio::time::timeout(Duration::from_millis(20), first.changed())
                .await
                .is_err()
        );
        drop(first);
        assert_eq!(waiters.len(), 2, "the second read still waits on a");
        drop(second);
        drop(other);
        assert!(waiters.is_empty());
    }
}
