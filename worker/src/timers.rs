//! The timers of Waiting deliveries: a task that reads the timers the
//! status store keeps and, for each one due, publishes a `DeliveryDue` to its
//! delivery's partition, where the workflow runs the delivery if it is still
//! Waiting at the timer's revision.
//!
//! At least once: a fire is remembered here until its delivery leaves the
//! index (its steps start, or a reschedule moves it), and fired again after
//! [`FIRE_AGAIN_AFTER`] if it has not (its event dead-lettered, say); a
//! restart fires every due timer again. A duplicate finds its delivery no
//! longer Waiting, or Waiting at another revision, and does nothing.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use skyport_core::event::{DeliveryDue, Event};
use skyport_core::ports::{Due, Publisher, Timers};
use time::OffsetDateTime;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::metrics;

/// How often the due timers are read.
const POLL: Duration = Duration::from_millis(100);

/// The most timers read at once.
const PAGE: usize = 1_000;

/// How long a fire that did not start its delivery waits to be fired again.
const FIRE_AGAIN_AFTER: Duration = Duration::from_secs(600);

/// Fires the due timers of `timers` into `publisher` until `shutdown`.
pub async fn fire(
    timers: Arc<dyn Timers>,
    publisher: Arc<dyn Publisher>,
    shutdown: CancellationToken,
) {
    let mut fired = Fired::default();
    loop {
        if let Err(e) = fired.round(timers.as_ref(), publisher.as_ref()).await {
            tracing::warn!(
                error = skyport_runtime::error_chain::error_chain(e.as_ref()),
                "Cannot fire the timers of Waiting deliveries now; trying again."
            );
        }
        tokio::select! {
            () = tokio::time::sleep(POLL) => {}
            () = shutdown.cancelled() => return,
        }
    }
}

/// The timers fired and not yet gone from the index, by delivery: the
/// revision fired and when.
#[derive(Default)]
struct Fired(HashMap<String, (u32, Instant)>);

impl Fired {
    /// Reads every due timer, page by page, and fires those not fired yet,
    /// a page's at once (so that the stream packs them).
    async fn round(
        &mut self,
        timers: &dyn Timers,
        publisher: &dyn Publisher,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        let now = OffsetDateTime::now_utc();
        let mut after: Option<Due> = None;
        let mut seen = HashSet::new();
        loop {
            let page = timers.due(after.as_ref(), now, PAGE).await?;
            let full = page.len() == PAGE;
            let to_fire: Vec<&Due> = page
                .iter()
                .filter(|due| match self.0.get(&due.delivery_id) {
                    Some((revision, at)) => {
                        *revision != due.revision || at.elapsed() >= FIRE_AGAIN_AFTER
                    }
                    None => true,
                })
                .collect();
            let published = join_all(to_fire.iter().map(|due| {
                let event = Event::DeliveryDue(DeliveryDue {
                    delivery_id: due.delivery_id.clone(),
                    revision: due.revision,
                    runs_at: due.runs_at,
                });
                publisher.publish(event.outbound(due.lane))
            }))
            .await;
            for (due, result) in to_fire.into_iter().zip(published) {
                result?;
                self.fired(due, now);
            }
            seen.extend(page.iter().map(|due| due.delivery_id.clone()));
            match page.into_iter().last() {
                Some(last) if full => after = Some(last),
                _ => break,
            }
        }
        // A delivery gone from the index has started, or moved its timer.
        self.0.retain(|id, _| seen.contains(id));
        let waiting = timers.waiting().await?;
        metrics::global()
            .timers_waiting
            .set(i64::try_from(waiting).unwrap_or(i64::MAX));
        Ok(())
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
