//! A receiver for the deliveries' callbacks, on 127.0.0.1 port 0: each
//! callback's delay after the terminal write it announces (its envelope's
//! `timestamp`, the status document's `updatedAt`), on this machine's one
//! clock.

use std::sync::{Arc, Mutex, PoisonError};

use anyhow::Context;
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use bytes::Bytes;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Microseconds from each terminal write to its callback's arrival.
type Delays = Arc<Mutex<Vec<u32>>>;

#[derive(Debug)]
pub(crate) struct Receiver {
    /// Where requests ask for their callbacks.
    pub(crate) url: String,
    delays: Delays,
    shutdown: CancellationToken,
    task: JoinHandle<()>,
}

async fn receive(State(delays): State<Delays>, body: Bytes) -> StatusCode {
    let arrived = OffsetDateTime::now_utc();
    let written = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|envelope| {
            let timestamp = envelope.get("timestamp")?.as_str()?.to_owned();
            OffsetDateTime::parse(&timestamp, &Rfc3339).ok()
        });
    let Some(written) = written else {
        return StatusCode::BAD_REQUEST;
    };
    let micros = (arrived - written).whole_microseconds().max(0);
    delays
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(u32::try_from(micros).unwrap_or(u32::MAX));
    StatusCode::NO_CONTENT
}

impl Receiver {
    pub(crate) async fn start() -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("cannot bind the callback receiver")?;
        let url = format!("http://{}/hooks", listener.local_addr()?);
        let delays = Delays::default();
        let router = Router::new()
            .route("/hooks/{name}", post(receive))
            .with_state(Arc::clone(&delays));
        let shutdown = CancellationToken::new();
        let task = tokio::spawn({
            let shutdown = shutdown.clone();
            async move {
                if let Err(e) = axum::serve(listener, router)
                    .with_graceful_shutdown(shutdown.cancelled_owned())
                    .await
                {
                    eprintln!("the callback receiver stopped: {e}");
                }
            }
        });
        Ok(Self {
            url,
            delays,
            shutdown,
            task,
        })
    }

    /// Callbacks received so far.
    pub(crate) fn received(&self) -> usize {
        self.delays
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Stops the receiver; the delays of every callback it received.
    pub(crate) async fn stop(self) -> anyhow::Result<Vec<u32>> {
        self.shutdown.cancel();
        self.task.await.context("the callback receiver panicked")?;
        Ok(std::mem::take(
            &mut *self.delays.lock().unwrap_or_else(PoisonError::into_inner),
        ))
    }
}
