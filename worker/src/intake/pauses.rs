//! Pauses of intake, held by name: whether partitions may pull new events,
//! and why not.
//!
//! Anything that needs the worker to stop taking work (an open circuit, a
//! backlog past its limit) pauses intake under its own name and resumes it
//! when it is over; intake flows only when nobody holds it paused. In-flight
//! events are not touched.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use skyport_core::ports::Diagnostics;
use tokio::sync::watch;

#[derive(Debug, Clone)]
pub struct Pauses {
    board: Arc<Board>,
}

/// Why intake is paused, by source, and whether it is.
#[derive(Debug)]
struct Board {
    reasons: Mutex<BTreeMap<String, String>>,
    paused: watch::Sender<bool>,
}

impl Default for Pauses {
    fn default() -> Self {
        Self {
            board: Arc::new(Board {
                reasons: Mutex::default(),
                paused: watch::Sender::new(false),
            }),
        }
    }
}

impl Pauses {
    /// Holds intake paused on behalf of `source` until [`Pauses::resume`] with the same source.
    pub fn pause(&self, source: &str, reason: String) {
        let mut reasons = self
            .board
            .reasons
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if reasons.insert(source.to_owned(), reason.clone()).is_none() {
            tracing::warn!(%source, %reason, "Paused intake: no new events are pulled.");
        }
        self.board.paused.send_replace(true);
    }

    pub fn resume(&self, source: &str) {
        let mut reasons = self
            .board
            .reasons
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if reasons.remove(source).is_some() {
            tracing::info!(%source, "Lifted an intake pause.");
        }
        self.board.paused.send_replace(!reasons.is_empty());
    }

    /// Why intake is paused (empty when it flows).
    pub fn reasons(&self) -> Vec<String> {
        let reasons = self
            .board
            .reasons
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        reasons.values().cloned().collect()
    }

    /// Follows whether intake is paused.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.board.paused.subscribe()
    }
}

#[async_trait::async_trait]
impl Diagnostics for Pauses {
    fn degraded(&self) -> Vec<String> {
        self.reasons()
            .into_iter()
            .map(|reason| format!("the worker paused intake: {reason}"))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intake_flows_only_when_no_source_holds_it() {
        let intake = Pauses::default();
        let paused = intake.subscribe();
        intake.pause("circuit:drone", "drone open".into());
        intake.pause("backlog", "too old".into());
        intake.resume("circuit:drone");
        assert!(*paused.borrow());
        assert_eq!(intake.reasons(), ["too old"]);
        intake.resume("backlog");
        assert!(!*paused.borrow());
        assert!(intake.reasons().is_empty());
    }
}
