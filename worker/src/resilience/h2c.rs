//! HTTP/2 over cleartext with prior knowledge (`services.protocol` h2c):
//! `services.h2c_connections` connections to the services, the calls
//! spread over them in turn, each call a stream on its connection, through
//! hyper's client connection. reqwest's client adds a redirect layer, a
//! retry layer and a pool around each call, which cost more CPU than the
//! call itself (BENCHMARKS.md, issue 21); with multiplexed connections and
//! the workflow's own retries none of them is needed. One connection's
//! framing runs in one task on each side, a serial part of every workflow:
//! several connections spread it over the cores.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::client::conn::http2::{self, SendRequest};
use hyper::{HeaderMap, Request, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use skyport_runtime::tasks::Task;
use tokio::net::TcpStream;

/// The largest answer read from a service.
const MAX_ANSWER_BYTES: usize = 4 * 1024 * 1024;

/// A service's answer: status, headers and the whole body.
#[derive(Debug)]
pub(crate) struct Answered {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum H2cError {
    #[error("cannot connect to {authority}")]
    Connect {
        authority: String,
        #[source]
        source: std::io::Error,
    },
    #[error("connecting to {0} timed out")]
    ConnectTimeout(String),
    #[error("the HTTP/2 handshake with {authority} failed")]
    Handshake {
        authority: String,
        #[source]
        source: hyper::Error,
    },
    #[error("the call failed")]
    Http(#[source] hyper::Error),
    #[error("the answer could not be read whole (over {MAX_ANSWER_BYTES} bytes, or cut off)")]
    Body(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// HTTP/2 connections to `authority`, each opened on first use and again
/// after it closes (the call that found it broken fails and is retried).
#[derive(Debug)]
pub(crate) struct H2c {
    authority: String,
    connect_timeout: Duration,
    connections: Box<[Connection]>,
    /// The next call's connection, counted up and taken modulo their number.
    next: AtomicUsize,
}

#[derive(Debug, Default)]
struct Connection {
    sender: Mutex<Option<SendRequest<Full<Bytes>>>>,
    /// Held while connecting, so that one call connects and the others wait for it.
    connecting: tokio::sync::Mutex<()>,
}

impl H2c {
    /// `authority`: `host:port`; `connections`: how many (at least one).
    pub(crate) fn new(authority: String, connect_timeout: Duration, connections: usize) -> Self {
        Self {
            authority,
            connect_timeout,
            connections: (0..connections.max(1))
                .map(|_| Connection::default())
                .collect(),
            next: AtomicUsize::new(0),
        }
    }

    /// Sends `request` (its URI absolute) on the next connection in turn
    /// and reads the whole answer.
    pub(crate) async fn send(&self, request: Request<Full<Bytes>>) -> Result<Answered, H2cError> {
        let turn = self.next.fetch_add(1, Ordering::Relaxed) % self.connections.len();
        let mut sender = self.sender(&self.connections[turn]).await?;
        let response = sender.send_request(request).await.map_err(H2cError::Http)?;
        let (parts, body) = response.into_parts();
        let body = Limited::new(body, MAX_ANSWER_BYTES)
            .collect()
            .await
            .map_err(H2cError::Body)?
            .to_bytes();
        Ok(Answered {
            status: parts.status,
            headers: parts.headers,
            body,
        })
    }

    fn open(connection: &Connection) -> Option<SendRequest<Full<Bytes>>> {
        connection
            .sender
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .filter(|sender| !sender.is_closed())
            .cloned()
    }

    async fn sender(&self, connection: &Connection) -> Result<SendRequest<Full<Bytes>>, H2cError> {
        if let Some(sender) = Self::open(connection) {
            return Ok(sender);
        }
        let _connecting = connection.connecting.lock().await;
        if let Some(sender) = Self::open(connection) {
            return Ok(sender);
        }
        let stream =
            tokio::time::timeout(self.connect_timeout, TcpStream::connect(&self.authority))
                .await
                .map_err(|_| H2cError::ConnectTimeout(self.authority.clone()))?
                .map_err(|source| H2cError::Connect {
                    authority: self.authority.clone(),
                    source,
                })?;
        // Small frames are written as they come; a failure here costs only latency.
        let _ = stream.set_nodelay(true);
        let (sender, driver) = http2::Builder::new(TokioExecutor::new())
            .handshake(TokioIo::new(stream))
            .await
            .map_err(|source| H2cError::Handshake {
                authority: self.authority.clone(),
                source,
            })?;
        let authority = self.authority.clone();
        tokio::spawn(Task::H2cClient.monitor().instrument(async move {
            if let Err(e) = driver.await {
                tracing::debug!(%authority, error = %e, "The HTTP/2 connection to the services ended.");
            }
        }));
        *connection
            .sender
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(sender.clone());
        tracing::debug!(authority = %self.authority, "Opened an HTTP/2 connection to the services.");
        Ok(sender)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::convert::Infallible;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use hyper::Response;
    use hyper::service::service_fn;
    use tokio::net::TcpListener;
    use tokio::task::JoinSet;

    use super::*;

    fn get(authority: &str) -> Request<Full<Bytes>> {
        Request::builder()
            .uri(format!("http://{authority}/account/a-1"))
            .body(Full::default())
            .unwrap()
    }

    /// An h2c server on 127.0.0.1 answering `{}`; its connections are
    /// counted and can be dropped (closing them) all at once.
    async fn server() -> (String, Arc<AtomicUsize>, tokio::sync::mpsc::Sender<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let authority = listener.local_addr().unwrap().to_string();
        let accepted = Arc::new(AtomicUsize::new(0));
        let (drop_all, mut dropped) = tokio::sync::mpsc::channel::<()>(1);
        let counted = Arc::clone(&accepted);
        tokio::spawn(async move {
            let mut connections = JoinSet::new();
            loop {
                tokio::select! {
                    Ok((stream, _)) = listener.accept() => {
                        counted.fetch_add(1, Ordering::SeqCst);
                        connections.spawn(async move {
                            let answer = service_fn(|_request| async {
                                Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"{}"))))
                            });
                            let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                                .serve_connection(TokioIo::new(stream), answer)
                                .await;
                        });
                    }
                    Some(()) = dropped.recv() => connections.abort_all(),
                    else => return,
                }
            }
        });
        (authority, accepted, drop_all)
    }

    #[tokio::test]
    async fn calls_share_one_connection_and_a_closed_one_is_opened_again() {
        let (authority, accepted, drop_all) = server().await;
        let h2c = H2c::new(authority.clone(), Duration::from_secs(5), 1);
        for _ in 0..3 {
            let answered = h2c.send(get(&authority)).await.unwrap();
            assert_eq!(answered.status, StatusCode::OK);
            assert_eq!(&answered.body[..], b"{}");
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
        drop_all.send(()).await.unwrap();
        // The call that finds the connection broken fails (the workflow
        // retries it); one after it opens a new connection.
        let mut answered = None;
        for _ in 0..50 {
            if let Ok(answer) = h2c.send(get(&authority)).await {
                answered = Some(answer);
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(answered.unwrap().status, StatusCode::OK);
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn calls_take_the_connections_in_turn() {
        let (authority, accepted, _drop_all) = server().await;
        let h2c = H2c::new(authority.clone(), Duration::from_secs(5), 3);
        for _ in 0..9 {
            let answered = h2c.send(get(&authority)).await.unwrap();
            assert_eq!(answered.status, StatusCode::OK);
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 3, "each opened once");
    }

    #[tokio::test]
    async fn a_service_that_is_not_listening_is_a_connect_error() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let authority = listener.local_addr().unwrap().to_string();
        drop(listener);
        let h2c = H2c::new(authority.clone(), Duration::from_secs(5), 1);
        let error = h2c.send(get(&authority)).await.unwrap_err();
        assert!(matches!(error, H2cError::Connect { .. }), "{error:?}");
    }
}
