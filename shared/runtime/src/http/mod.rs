//! The HTTP/1.1 server every Skyport listener runs (the gateway, the worker's
//! admin routes), with the limits of [`HttpSettings`]: no connection can hold
//! it by connecting and sending nothing, sending a head slowly, or idling
//! between requests, and no more than `max_connections` are open at once.
//! Its listeners are bound with [`listen`], for a listen backlog of their own.
//!
//! A request's body has its own deadline, kept by whoever reads it (the
//! gateway reads it whole before the request takes an in-flight slot).

mod activity;
mod listen;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

pub use self::listen::listen;

use self::activity::{Activity, Watched};
use crate::config::HttpSettings;
use crate::metrics::{self, ClosedLabels};
use crate::problem::Problem;

/// How much larger than `max_header_bytes` a head may be before hyper itself
/// refuses it (a bare 431, the connection closed) instead of it reaching
/// [`head_size`] for a problem document.
const HARD_HEAD_FACTOR: usize = 4;

/// A listener's limits, from [`HttpSettings`].
#[derive(Debug, Clone)]
pub struct Server {
    settings: HttpSettings,
    grace: Duration,
    builder: http1::Builder,
}

impl Server {
    /// A server with `settings`' limits that lets requests in progress
    /// finish for at most `grace` after the shutdown signal.
    pub fn new(settings: &HttpSettings, grace: Duration) -> Self {
        let hard_limit = settings.max_header_bytes.saturating_mul(HARD_HEAD_FACTOR);
        let mut builder = http1::Builder::new();
        // The connection's watchdog keeps the head's deadline (see `activity`).
        builder
            .header_read_timeout(None)
            .max_header_size(hard_limit)
            .max_buf_size(hard_limit);
        Self {
            settings: settings.clone(),
            grace,
            builder,
        }
    }

    /// Serves `router` on `listener` until `shutdown` fires, then lets the
    /// requests in progress finish within the grace period; idle connections
    /// close at once. A failed accept (out of file descriptors, a connection
    /// reset while queued) is logged and accepting goes on.
    pub async fn serve(self, listener: TcpListener, router: Router, shutdown: CancellationToken) {
        let connections = Arc::new(Semaphore::new(self.settings.max_connections));
        let graceful = GracefulShutdown::new();
        loop {
            let permit = tokio::select! {
                permit = Arc::clone(&connections).acquire_owned() => permit,
                () = shutdown.cancelled() => break,
            };
            let Ok(permit) = permit else { break };
            let (stream, peer) = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(error) => {
                        accept_failed(&error).await;
                        continue;
                    }
                },
                () = shutdown.cancelled() => break,
            };
            let connection = self.connection(stream, peer, router.clone(), &graceful);
            let open = &metrics::global().http_connections;
            open.inc();
            tokio::spawn(async move {
                connection.await;
                metrics::global().http_connections.dec();
                drop(permit);
            });
        }
        drop(listener);
        tokio::select! {
            () = graceful.shutdown() => {}
            () = tokio::time::sleep(self.grace) => {
                tracing::warn!(grace_ms = self.grace.as_millis(), "The drain timed out; open connections were dropped.");
            }
        }
    }

    /// Serves one connection until it ends, fails, or its watchdog closes it.
    fn connection(
        &self,
        stream: TcpStream,
        peer: SocketAddr,
        router: Router,
        graceful: &GracefulShutdown,
    ) -> impl Future<Output = ()> + Send + 'static {
        if let Err(error) = stream.set_nodelay(true) {
            tracing::debug!(%peer, %error, "Cannot set TCP_NODELAY.");
        }
        let settings = &self.settings;
        let activity = Arc::new(Activity::new(
            settings.header_read_timeout_ms.duration(),
            settings.idle_timeout_ms.duration(),
        ));
        let max_header_bytes = settings.max_header_bytes;
        let requests = Arc::clone(&activity);
        let service = hyper::service::service_fn(move |mut request: Request<Incoming>| {
            let in_flight = requests.begin();
            // Who sent it, for the limits kept per client when there is no principal.
            request
                .extensions_mut()
                .insert(axum::extract::ConnectInfo(peer));
            let size = head_size(&request);
            let answer = (size <= max_header_bytes).then(|| router.clone().oneshot(request));
            async move {
                let response = match answer {
                    Some(answer) => answer.await?,
                    None => head_too_large(size, max_header_bytes),
                };
                drop(in_flight);
                Ok::<Response<Body>, Infallible>(response)
            }
        });
        let io = TokioIo::new(Watched::new(stream, Arc::clone(&activity)));
        let connection = graceful.watch(self.builder.serve_connection(io, service));
        async move {
            // Pinned outside the select so that an expired connection is
            // counted before it is dropped, and so closed, for its client.
            tokio::pin!(connection);
            tokio::select! {
                served = &mut connection => {
                    if let Err(error) = served {
                        tracing::debug!(%peer, %error, "A connection ended with an error.");
                    }
                }
                expiry = activity.expired() => {
                    tracing::debug!(%peer, reason = expiry.reason(), "Closed a connection that was idle or sent its request head too slowly.");
                    metrics::global()
                        .http_connections_closed
                        .get_or_create(&ClosedLabels { reason: expiry.reason() })
                        .inc();
                }
            }
        }
    }
}

/// Logs a failed accept; unless only that connection failed (out of file
/// descriptors, say), waits a little for the cause to pass.
async fn accept_failed(error: &std::io::Error) {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    if matches!(
        error.kind(),
        ConnectionAborted | ConnectionRefused | ConnectionReset
    ) {
        tracing::debug!(%error, "A connection failed before it was accepted.");
    } else {
        tracing::warn!(%error, "Cannot accept connections; trying again in 100 ms.");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The bytes of a request's head as it came: request line and header lines.
fn head_size<B>(request: &Request<B>) -> usize {
    let target = request
        .uri()
        .path_and_query()
        .map_or(1, |target| target.as_str().len());
    let request_line = request.method().as_str().len() + target + " HTTP/1.1\r\n".len() + 1;
    let headers: usize = request
        .headers()
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + ": \r\n".len())
        .sum();
    request_line + headers + "\r\n".len()
}

fn head_too_large(size: usize, limit: usize) -> Response<Body> {
    Problem::new(
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
        "Request header fields too large",
        "HeadersTooLarge",
        format!("the request's head is {size} bytes; at most {limit} are accepted"),
    )
    .respond(None)
}
