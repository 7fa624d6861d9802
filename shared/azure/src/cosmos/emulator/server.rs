//! The in-memory emulator served over HTTP, so that separate processes (and
//! any Cosmos DB client) share one account through a real HTTP client with
//! `cosmos.endpoint = http://127.0.0.1:PORT/`. Each connection speaks
//! HTTP/1.1 or, when it opens with HTTP/2's preface, HTTP/2 (cleartext, prior
//! knowledge). `GET /_emulator/stats` answers what reached the account.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use azure_core::http::headers::{HeaderName, HeaderValue};
use azure_core::http::{Method, Request, Url};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use serde::Serialize;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::Emulator;
use crate::cosmos::error::CosmosOpenError;

/// The path of the counters; no Cosmos DB resource path starts with `_`.
pub const STATS_PATH: &str = "/_emulator/stats";

/// What the account answered, as `GET /_emulator/stats` reports it.
#[derive(Debug, Default, Serialize, serde::Deserialize, Clone, Copy, PartialEq, Eq)]
pub struct ServedStats {
    /// Every request that reached the account.
    pub requests: u64,
    /// Requests on documents (`…/docs…`).
    pub documents: u64,
    /// Document requests that asked for high and for low priority.
    pub high_priority: u64,
    pub low_priority: u64,
    /// Answers 429 (request rate too large).
    pub throttled: u64,
    /// Answers 5xx, and requests the emulator could not route.
    pub failed: u64,
}

#[derive(Debug, Default)]
struct Counters {
    requests: AtomicU64,
    throttled: AtomicU64,
    failed: AtomicU64,
}

/// A fresh account whose one region is `http://{listener's address}/`,
/// `throttling` as in [`Emulator::new`]: bind first, then make the account
/// (regions match on scheme, host and port).
///
/// # Errors
/// When the listener has no address or the emulator cannot be set up.
pub fn account_for(listener: &TcpListener, throttling: bool) -> Result<Emulator, CosmosOpenError> {
    let address = listener
        .local_addr()
        .map_err(|e| CosmosOpenError::Connect(Box::new(e)))?;
    let gateway = Url::parse(&format!("http://{address}/"))
        .map_err(|e| CosmosOpenError::Connect(Box::new(e)))?;
    Emulator::at(gateway, throttling)
}

/// Serves `emulator` on `listener` until `shutdown`, then lets the requests
/// in progress finish.
pub async fn serve(listener: TcpListener, emulator: Emulator, shutdown: CancellationToken) {
    let counters = Arc::new(Counters::default());
    let builder = auto::Builder::new(TokioExecutor::new());
    let graceful = GracefulShutdown::new();
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::warn!(%error, "The emulator cannot accept a connection; trying again in 100 ms.");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = shutdown.cancelled() => break,
        };
        if let Err(error) = stream.set_nodelay(true) {
            tracing::debug!(%peer, %error, "Cannot set TCP_NODELAY.");
        }
        let (emulator, counters) = (emulator.clone(), Arc::clone(&counters));
        let service = hyper::service::service_fn(move |request| {
            let (emulator, counters) = (emulator.clone(), Arc::clone(&counters));
            async move { Ok::<_, Infallible>(answer(&emulator, &counters, request).await) }
        });
        let connection = graceful.watch(
            builder
                .serve_connection(TokioIo::new(stream), service)
                .into_owned(),
        );
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%peer, %error, "A connection to the emulator ended with an error.");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

type Answer = hyper::Response<Full<Bytes>>;

async fn answer(
    emulator: &Emulator,
    counters: &Counters,
    request: hyper::Request<Incoming>,
) -> Answer {
    if request.uri().path() == STATS_PATH {
        return stats(emulator, counters);
    }
    counters.requests.fetch_add(1, Ordering::Relaxed);
    let answer = match forward(emulator, request).await {
        Ok(answer) => answer,
        Err((status, message)) => plain(status, message),
    };
    match answer.status().as_u16() {
        429 => counters.throttled.fetch_add(1, Ordering::Relaxed),
        500.. => counters.failed.fetch_add(1, Ordering::Relaxed),
        _ => 0,
    };
    answer
}

/// The request as the SDK's own transport would hand it to the emulator,
/// and the emulator's answer back as HTTP.
async fn forward(
    emulator: &Emulator,
    request: hyper::Request<Incoming>,
) -> Result<Answer, (u16, String)> {
    let (parts, body) = request.into_parts();
    let target = parts
        .uri
        .path_and_query()
        .map_or("/", hyper::http::uri::PathAndQuery::as_str);
    let url = emulator
        .gateway
        .join(target.trim_start_matches('/'))
        .map_err(|e| (400, format!("bad request target {target}: {e}")))?;
    let method: Method = parts
        .method
        .as_str()
        .parse()
        .map_err(|_| (405, format!("method {} is not Cosmos DB's", parts.method)))?;
    let mut core = Request::new(url, method);
    for (name, value) in &parts.headers {
        let Ok(value) = value.to_str() else {
            return Err((400, format!("header {name} is not text")));
        };
        core.headers_mut().insert(
            HeaderName::from(name.as_str().to_owned()),
            HeaderValue::from(value.to_owned()),
        );
    }
    let body = body
        .collect()
        .await
        .map_err(|e| (400, format!("cannot read the body: {e}")))?
        .to_bytes();
    if !body.is_empty() {
        core.set_body(body.to_vec());
    }
    let response = emulator
        .http
        .execute_request(&core)
        .await
        .map_err(|e| (503, e.to_string()))?
        .try_into_raw_response()
        .await
        .map_err(|e| (500, e.to_string()))?;
    let (status, headers, body) = response.deconstruct();
    let mut answer = hyper::Response::builder().status(u16::from(status));
    for (name, value) in headers.iter() {
        answer = answer.header(name.as_str(), value.as_str());
    }
    answer
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| (500, e.to_string()))
}

fn stats(emulator: &Emulator, counters: &Counters) -> Answer {
    let (high_priority, low_priority) = emulator.wire.by_priority();
    let stats = ServedStats {
        requests: counters.requests.load(Ordering::Relaxed),
        documents: emulator.wire.documents(),
        high_priority,
        low_priority,
        throttled: counters.throttled.load(Ordering::Relaxed),
        failed: counters.failed.load(Ordering::Relaxed),
    };
    let body = serde_json::to_vec(&stats).unwrap_or_default();
    hyper::Response::builder()
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .unwrap_or_else(|_| plain(500, "cannot answer".into()))
}

fn plain(status: u16, message: String) -> Answer {
    let mut answer = hyper::Response::new(Full::new(Bytes::from(message)));
    *answer.status_mut() =
        hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
    answer
}

/// Sets `container`'s manual RU/s (in `database`) on the account at
/// `endpoint` through the SDK's control plane (ReplaceOffer) over HTTP, as
/// an operator would on a real account.
///
/// # Errors
/// When the client cannot connect or the offer cannot be replaced.
pub async fn replace_throughput(
    endpoint: &str,
    database: &str,
    container: &str,
    ru_per_s: u64,
) -> Result<(), skyport_core::ports::BoxError> {
    use azure_core::credentials::Secret;
    use azure_data_cosmos::models::ThroughputProperties;
    use azure_data_cosmos::options::{Region, RoutingStrategy};
    use azure_data_cosmos::{AccountEndpoint, AccountReference, CosmosClientBuilder};

    let endpoint: AccountEndpoint = endpoint.parse()?;
    let client = CosmosClientBuilder::new()
        .build(
            AccountReference::with_authentication_key(endpoint, Secret::new(super::KEY)),
            RoutingStrategy::ProximityTo(Region::EAST_US),
        )
        .await?;
    client
        .database_client(database)
        .container_client(container, None)
        .await?
        .begin_replace_throughput(ThroughputProperties::manual(ru_per_s), None)
        .await?
        .await?;
    Ok(())
}
