//! The timers of Waiting deliveries: a task that reads the timers the
//! status store keeps and, for each one due, publishes a `DeliveryDue` to its
//! delivery's partition, where the workflow runs the delivery if it is still
//! Waiting at the timer's revision.
//!
//! The store keeps the timers in shards ([`Timers::shards`]); the workers
//! share them out through leases ([`shards`]), so each shard is read by one
//! worker, and a killed worker's shards are read by another once its leases
//! expire.
//!
//! Each held shard's due timers are read every `worker.timer_poll_ms`.
//!
//! At least once: a fire is remembered here until its delivery leaves the
//! index (its steps start, a reschedule moves it, or the store removes the
//! fired entry), and fired again after [`FIRE_AGAIN_AFTER`] if it has not
//! (its event dead-lettered, say); a restart fires every due timer again.
//! The holder of shard 0 also asks the store, every [`SWEEP`], for Waiting
//! deliveries overdue by [`FIRE_AGAIN_AFTER`] whose timer was lost (a store
//! that writes it beside the document, and stopped between the two). A
//! duplicate finds its delivery no longer Waiting, or Waiting at another
//! revision, and does nothing.

mod shards;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use skyport_core::event::{DeliveryDue, Event};
use skyport_core::ports::{Due, LeaseStore, Publisher, Timers};
use time::OffsetDateTime;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use self::shards::Shards;
use crate::metrics;

/// The most timers read at once.
const PAGE: usize = 1_000;

/// How long a fire that did not start its delivery waits to be fired again.
const FIRE_AGAIN_AFTER: Duration = Duration::from_secs(600);

/// How often the holder of shard 0 looks for lost timers.
const SWEEP: Duration = Duration::from_secs(60);

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What the timer task runs on.
#[derive(Debug, Clone)]
pub struct Firing {
    pub timers: Arc<dyn Timers>,
    pub publisher: Arc<dyn Publisher>,
    /// Where the shards' leases are kept.
    pub leases: Arc<dyn LeaseStore>,
    /// This worker's name in the leases, unique among the workers.
    pub owner: String,
    /// How long a lease not renewed stays its owner's (`worker.timer_lease_expiry_ms`).
    pub expiry: Duration,
    /// How often a held shard's due timers are read (`worker.timer_poll_ms`).
    pub poll: Duration,
}

/// Fires the due timers of the shards this worker holds until `shutdown`,
/// then gives the shards up.
pub async fn fire(firing: Firing, shutdown: CancellationToken) {
    let Firing {
        timers,
        publisher,
        leases,
        owner,
        expiry,
        poll,
    } = firing;
    let mut shards = Shards::new(leases, timers.shards(), owner, expiry);
    let mut fired: BTreeMap<u32, Fired> = BTreeMap::new();
    let mut swept = Fired::default();
    let mut balance_at = Instant::now();
    let mut sweep_at = Instant::now() + SWEEP;
    loop {
        if Instant::now() >= balance_at {
            balance_at = Instant::now() + expiry / 4;
            if let Err(e) = balanced(&mut shards, timers.as_ref(), &mut fired).await {
                warn("balance the timer shards", e.as_ref());
            }
        }
        for (shard, fired) in &mut fired {
            if let Err(e) = fired
                .round(*shard, timers.as_ref(), publisher.as_ref())
                .await
            {
                warn("fire the timers of Waiting deliveries", e.as_ref());
            }
        }
        if fired.contains_key(&0) && Instant::now() >= sweep_at {
            sweep_at = Instant::now() + SWEEP;
            if let Err(e) = swept.sweep(timers.as_ref(), publisher.as_ref()).await {
                warn("look for lost timers", e.as_ref());
            }
        }
        tokio::select! {
            () = tokio::time::sleep(poll) => {}
            () = shutdown.cancelled() => break,
        }
    }
    shards.release().await;
}

/// A name for this worker in the shards' leases: the host, the process and a
/// random suffix (several workers may run in one process).
pub fn owner_name() -> String {
    format!(
        "{}-{}-{:04x}",
        skyport_runtime::host::name(),
        std::process::id(),
        fastrand::u16(..)
    )
}

fn warn(what: &str, e: &(dyn std::error::Error + Send + Sync + 'static)) {
    tracing::warn!(
        error = skyport_runtime::error_chain::error_chain(e),
        "Cannot {what} now; trying again."
    );
}

/// Balances the shards, keeps a memory of fires for each one held, and
/// counts the timers they hold.
async fn balanced(
    shards: &mut Shards,
    timers: &dyn Timers,
    fired: &mut BTreeMap<u32, Fired>,
) -> Result<(), BoxError> {
    shards.balance().await?;
    let held: HashSet<u32> = shards.held().collect();
    fired.retain(|shard, _| held.contains(shard));
    let mut waiting = 0_u64;
    for shard in held {
        fired.entry(shard).or_default();
        waiting = waiting.saturating_add(timers.waiting(shard).await?);
    }
    metrics::global()
        .timers_waiting
        .set(i64::try_from(waiting).unwrap_or(i64::MAX));
    Ok(())
}

/// The timers fired and not yet gone from the index, by delivery: the
/// revision fired and when.
#[derive(Debug, Default)]
struct Fired(HashMap<String, (u32, Instant)>);

impl Fired {
    /// Reads every due timer of `shard`, page by page, and fires those not
    /// fired yet, a page's at once (so that the stream packs them).
    async fn round(
        &mut self,
        shard: u32,
        timers: &dyn Timers,
        publisher: &dyn Publisher,
    ) -> Result<(), BoxError> {
        let now = OffsetDateTime::now_utc();
        let mut after: Option<Due> = None;
        let mut seen = HashSet::new();
        loop {
            let page = timers.due(shard, after.as_ref(), now, PAGE).await?;
            let full = page.len() == PAGE;
            let (published, failed) = self.publish(&page, publisher, now).await;
            timers.fired(shard, &published).await?;
            failed?;
            seen.extend(page.iter().map(|due| due.delivery_id.clone()));
            match page.into_iter().last() {
                Some(last) if full => after = Some(last),
                _ => break,
            }
        }
        // A delivery gone from the index has started, or moved its timer.
        self.0.retain(|id, _| seen.contains(id));
        Ok(())
    }

    /// Fires the Waiting deliveries the store finds overdue from their
    /// documents.
    async fn sweep(
        &mut self,
        timers: &dyn Timers,
        publisher: &dyn Publisher,
    ) -> Result<(), BoxError> {
        let now = OffsetDateTime::now_utc();
        let overdue = timers.overdue(now - FIRE_AGAIN_AFTER, PAGE).await?;
        if !overdue.is_empty() {
            tracing::warn!(
                count = overdue.len(),
                "Found Waiting deliveries whose timer was lost; firing them."
            );
        }
        self.publish(&overdue, publisher, now).await.1?;
        let seen: HashSet<&str> = overdue.iter().map(|due| due.delivery_id.as_str()).collect();
        self.0.retain(|id, _| seen.contains(id.as_str()));
        Ok(())
    }

    /// Publishes the `DeliveryDue` of each of `page` not fired yet, at once:
    /// the ones published, and the first failure.
    async fn publish(
        &mut self,
        page: &[Due],
        publisher: &dyn Publisher,
        now: OffsetDateTime,
    ) -> (Vec<Due>, Result<(), BoxError>) {
        let to_fire: Vec<&Due> = page
            .iter()
            .filter(|due| match self.0.get(&due.delivery_id) {
                Some((revision, at)) => {
                    *revision != due.revision || at.elapsed() >= FIRE_AGAIN_AFTER
                }
                None => true,
            })
            .collect();
        let results = join_all(to_fire.iter().map(|due| {
            let event = Event::DeliveryDue(DeliveryDue {
                delivery_id: due.delivery_id.clone(),
                revision: due.revision,
                runs_at: due.runs_at,
            });
            publisher.publish(event.outbound(due.lane))
        }))
        .await;
        let mut published = Vec::with_capacity(to_fire.len());
        let mut failed = Ok(());
        for (due, result) in to_fire.into_iter().zip(results) {
            match result {
                Ok(_) => {
                    self.fired(due, now);
                    published.push(due.clone());
                }
                Err(e) if failed.is_ok() => failed = Err(e.into()),
                Err(_) => {}
            }
        }
        (published, failed)
    }

    /// Remembers the fire of `due`, and counts it.
    fn fired(&mut self, due: &Due, now: OffsetDateTime) {
        self.0
            .insert(due.delivery_id.clone(), (due.revision, Instant::now()));
        let metrics = metrics::global();
        metrics.timers_fired.inc();
        metrics
            .timer_lateness
            .observe((now - due.runs_at).as_seconds_f64().max(0.0));
    }
}
