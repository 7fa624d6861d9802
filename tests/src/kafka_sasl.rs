//! A Kafka endpoint of the test's own that authenticates as Event Hubs'
//! Kafka endpoint does, SASL OAUTHBEARER over TLS, and speaks only as much
//! of the protocol as librdkafka needs to authenticate and count as
//! connected:
//!
//! - ApiVersions: the versions below (v3, flexible, as librdkafka asks
//!   first; v0 to v2 too);
//! - SaslHandshake v0–v1: OAUTHBEARER only;
//! - SaslAuthenticate v0–v1: the client-first message
//!   `n,,\x01auth=Bearer TOKEN\x01\x01` (RFC 7628), its token recorded, and
//!   a session lifetime, after which librdkafka authenticates again on the
//!   same connection with the token it holds then (KIP-368);
//! - then Metadata v0–v4 (each topic asked for with one partition, led by
//!   this endpoint), InitProducerId v0–v1 (the idempotent producer's id) and
//!   FindCoordinator v0–v2 (answered "not available": a consumer group goes
//!   no further).
//!
//! A request before authentication, one of another API, or a malformed one
//! is recorded as a violation and closes its connection. Every connection
//! ends when the endpoint stops.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::serve::Listener as _;
use bytes::{BufMut, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::task::JoinSet;
use tokio_native_tls::native_tls::Identity;
use tokio_util::sync::CancellationToken;

use crate::tls::TlsListener;

/// The APIs spoken: (key, name, lowest version, highest version).
const APIS: [(i16, &str, i16, i16); 6] = [
    (18, "ApiVersions", 0, 3),
    (17, "SaslHandshake", 0, 1),
    (36, "SaslAuthenticate", 0, 1),
    (3, "Metadata", 0, 4),
    (22, "InitProducerId", 0, 1),
    (10, "FindCoordinator", 0, 2),
];

/// Kafka's error codes used here.
const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
const COORDINATOR_NOT_AVAILABLE: i16 = 15;
const SASL_AUTHENTICATION_FAILED: i16 = 58;

/// The largest request taken (librdkafka's requests here are a few hundred bytes).
const MAX_REQUEST: usize = 1 << 20;

/// What the endpoint saw.
#[derive(Debug, Default, Clone)]
pub struct Exchange {
    /// The bearer token of each authentication, in order.
    pub tokens: Vec<String>,
    /// The requests answered after an authentication, by their API's name.
    pub requests: Vec<&'static str>,
    /// What the endpoint refused, and why.
    pub violations: Vec<String>,
}

/// A running endpoint on 127.0.0.1, port 0.
#[derive(Debug)]
pub struct SaslEndpoint {
    /// Where clients connect: `127.0.0.1:PORT`, also the only broker in its metadata.
    pub address: String,
    exchange: Arc<Mutex<Exchange>>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

/// What every connection shares.
#[derive(Debug)]
struct Shared {
    port: i32,
    topics: Vec<String>,
    session_lifetime: Duration,
    exchange: Arc<Mutex<Exchange>>,
}

impl Shared {
    fn record(&self, change: impl FnOnce(&mut Exchange)) {
        change(&mut self.exchange.lock().unwrap_or_else(PoisonError::into_inner));
    }
}

impl SaslEndpoint {
    /// Serves TLS with `identity`, the metadata of `topics`, and sessions
    /// of `session_lifetime`.
    pub async fn start(identity: Identity, topics: &[&str], session_lifetime: Duration) -> Self {
        let mut listener = TlsListener::bind(IpAddr::V4(Ipv4Addr::LOCALHOST), identity).await;
        let local = listener.local_addr().unwrap();
        let exchange = Arc::new(Mutex::new(Exchange::default()));
        let shared = Arc::new(Shared {
            port: i32::from(local.port()),
            topics: topics.iter().map(|t| (*t).to_owned()).collect(),
            session_lifetime,
            exchange: Arc::clone(&exchange),
        });
        let stop = CancellationToken::new();
        let task = tokio::spawn({
            let stop = stop.clone();
            async move {
                let mut connections = JoinSet::new();
                loop {
                    tokio::select! {
                        () = stop.cancelled() => return,
                        (stream, _) = listener.accept() => {
                            connections.spawn(serve(stream, Arc::clone(&shared)));
                        }
                    }
                }
            }
        });
        Self {
            address: local.to_string(),
            exchange,
            stop,
            task,
        }
    }

    /// What the endpoint has seen so far.
    pub fn exchange(&self) -> Exchange {
        self.exchange
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Stops listening and ends every connection.
    pub async fn stop(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

/// Serves one connection until the client closes it or breaks the protocol.
async fn serve<S: AsyncRead + AsyncWrite + Unpin>(mut stream: S, shared: Arc<Shared>) {
    let mut authenticated = false;
    loop {
        let mut length = [0u8; 4];
        if stream.read_exact(&mut length).await.is_err() {
            return;
        }
        let length = usize::try_from(u32::from_be_bytes(length)).unwrap_or(usize::MAX);
        if length > MAX_REQUEST {
            shared.record(|e| e.violations.push(format!("a request of {length} bytes")));
            return;
        }
        let mut frame = vec![0u8; length];
        if stream.read_exact(&mut frame).await.is_err() {
            return;
        }
        let answer = match Request::parse(&frame) {
            Some(request) => answer(&request, &shared, &mut authenticated),
            None => Err("a malformed request header".to_owned()),
        };
        match answer {
            Ok(body) => {
                let mut out = BytesMut::with_capacity(4 + body.len());
                out.put_u32(u32::try_from(body.len()).unwrap());
                out.put_slice(&body);
                if stream.write_all(&out).await.is_err() {
                    return;
                }
            }
            Err(violation) => {
                shared.record(|e| e.violations.push(violation));
                return;
            }
        }
    }
}

/// A request: its header, and its body to read.
struct Request<'a> {
    api_key: i16,
    version: i16,
    correlation_id: i32,
    body: Reader<'a>,
}

impl<'a> Request<'a> {
    /// Reads the header: v1 (a nullable client id), and v2 (tagged fields
    /// after it) for ApiVersions v3 and later, the only flexible request here.
    fn parse(frame: &'a [u8]) -> Option<Self> {
        let mut reader = Reader(frame);
        let api_key = reader.i16()?;
        let version = reader.i16()?;
        let correlation_id = reader.i32()?;
        reader.nullable_string()?;
        if api_key == 18 && version >= 3 {
            reader.skip_tags()?;
        }
        Some(Self {
            api_key,
            version,
            correlation_id,
            body: reader,
        })
    }
}

/// The response to `request` (the correlation id, then the body), or the
/// violation that closes the connection.
fn answer(
    request: &Request<'_>,
    shared: &Shared,
    authenticated: &mut bool,
) -> Result<Vec<u8>, String> {
    let Some(&(_, name, low, high)) = APIS.iter().find(|api| api.0 == request.api_key) else {
        return Err(format!("API key {} is not spoken here", request.api_key));
    };
    if !(low..=high).contains(&request.version) && request.api_key != 18 {
        return Err(format!("{name} v{} was not offered", request.version));
    }
    let mut out = BytesMut::new();
    out.put_i32(request.correlation_id);
    let mut body = request.body;
    let malformed = || format!("a malformed {name} v{} request", request.version);
    match request.api_key {
        18 => api_versions(request.version, &mut out),
        17 => {
            let mechanism = body.string().ok_or_else(malformed)?;
            if mechanism != "OAUTHBEARER" {
                return Err(format!("SaslHandshake for {mechanism}"));
            }
            out.put_i16(0);
            out.put_i32(1);
            put_string(&mut out, "OAUTHBEARER");
        }
        36 => {
            let message = body.bytes().ok_or_else(malformed)?;
            match bearer_token(message) {
                Some(token) => {
                    shared.record(|e| e.tokens.push(token));
                    *authenticated = true;
                    out.put_i16(0);
                    out.put_i16(-1);
                    out.put_i32(0);
                }
                None => {
                    *authenticated = false;
                    out.put_i16(SASL_AUTHENTICATION_FAILED);
                    put_string(&mut out, "not an OAUTHBEARER client-first message");
                    out.put_i32(0);
                    shared.record(|e| {
                        e.violations.push(format!(
                            "a SaslAuthenticate of {:?}",
                            String::from_utf8_lossy(message)
                        ));
                    });
                }
            }
            if request.version >= 1 {
                out.put_i64(i64::try_from(shared.session_lifetime.as_millis()).unwrap());
            }
        }
        _ if !*authenticated => return Err(format!("{name} before authentication")),
        3 => metadata(request.version, &mut body, shared, &mut out).ok_or_else(malformed)?,
        22 => {
            out.put_i32(0);
            out.put_i16(0);
            out.put_i64(1_000);
            out.put_i16(0);
        }
        _ => {
            if request.version >= 1 {
                out.put_i32(0);
            }
            out.put_i16(COORDINATOR_NOT_AVAILABLE);
            if request.version >= 1 {
                out.put_i16(-1);
            }
            out.put_i32(-1);
            put_string(&mut out, "");
            out.put_i32(-1);
        }
    }
    if *authenticated && !matches!(request.api_key, 17 | 18 | 36) {
        shared.record(|e| e.requests.push(name));
    }
    Ok(out.to_vec())
}

/// The ApiVersions body: flexible from v3 (compact array, tagged fields).
fn api_versions(version: i16, out: &mut BytesMut) {
    out.put_i16(0);
    let flexible = version >= 3;
    if flexible {
        put_uvarint(out, APIS.len() + 1);
    } else {
        out.put_i32(i32::try_from(APIS.len()).unwrap());
    }
    for (key, _, low, high) in APIS {
        out.put_i16(key);
        out.put_i16(low);
        out.put_i16(high);
        if flexible {
            put_uvarint(out, 0);
        }
    }
    if version >= 1 {
        out.put_i32(0);
    }
    if flexible {
        put_uvarint(out, 0);
    }
}

/// The Metadata body: this endpoint as broker 0, each topic asked for (all
/// known ones when none is named) with one partition it leads.
fn metadata(
    version: i16,
    body: &mut Reader<'_>,
    shared: &Shared,
    out: &mut BytesMut,
) -> Option<()> {
    let count = body.i32()?;
    let asked: Vec<String> = if count < 0 {
        shared.topics.clone()
    } else {
        (0..count).map(|_| body.string()).collect::<Option<_>>()?
    };
    if version >= 3 {
        out.put_i32(0);
    }
    out.put_i32(1);
    out.put_i32(0);
    put_string(out, "127.0.0.1");
    out.put_i32(shared.port);
    if version >= 1 {
        out.put_i16(-1);
    }
    if version >= 2 {
        put_string(out, "skyport-test");
    }
    if version >= 1 {
        out.put_i32(0);
    }
    out.put_i32(i32::try_from(asked.len()).ok()?);
    for topic in &asked {
        let known = shared.topics.contains(topic);
        out.put_i16(if known { 0 } else { UNKNOWN_TOPIC_OR_PARTITION });
        put_string(out, topic);
        if version >= 1 {
            out.put_u8(0);
        }
        if known {
            out.put_i32(1);
            out.put_i16(0);
            out.put_i32(0);
            out.put_i32(0);
            for _ in 0..2 {
                out.put_i32(1);
                out.put_i32(0);
            }
        } else {
            out.put_i32(0);
        }
    }
    Some(())
}

/// The token of an OAUTHBEARER client-first message,
/// `n,,\x01auth=Bearer TOKEN\x01[key=value\x01]…\x01`.
fn bearer_token(message: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(message).ok()?;
    let pairs = text.strip_prefix("n,,\x01")?.strip_suffix("\x01\x01")?;
    let token = pairs
        .split('\x01')
        .find_map(|pair| pair.strip_prefix("auth=Bearer "))?;
    (!token.is_empty()).then(|| token.to_owned())
}

fn put_string(out: &mut BytesMut, text: &str) {
    out.put_i16(i16::try_from(text.len()).unwrap());
    out.put_slice(text.as_bytes());
}

fn put_uvarint(out: &mut BytesMut, mut value: usize) {
    while value >= 0x80 {
        out.put_u8(u8::try_from(value & 0x7f).unwrap() | 0x80);
        value >>= 7;
    }
    out.put_u8(u8::try_from(value).unwrap());
}

/// Reads Kafka's primitive types; `None` past the end.
#[derive(Clone, Copy)]
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (taken, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(taken)
    }

    fn i16(&mut self) -> Option<i16> {
        Some(i16::from_be_bytes(self.take(2)?.try_into().ok()?))
    }

    fn i32(&mut self) -> Option<i32> {
        Some(i32::from_be_bytes(self.take(4)?.try_into().ok()?))
    }

    fn uvarint(&mut self) -> Option<usize> {
        let mut value = 0usize;
        for shift in (0..35).step_by(7) {
            let byte = self.take(1)?[0];
            value |= usize::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Some(value);
            }
        }
        None
    }

    fn nullable_string(&mut self) -> Option<Option<String>> {
        let length = self.i16()?;
        if length < 0 {
            return Some(None);
        }
        let text = self.take(usize::try_from(length).ok()?)?;
        Some(Some(String::from_utf8_lossy(text).into_owned()))
    }

    fn string(&mut self) -> Option<String> {
        self.nullable_string()?
    }

    fn bytes(&mut self) -> Option<&'a [u8]> {
        let length = usize::try_from(self.i32()?).ok()?;
        self.take(length)
    }

    fn skip_tags(&mut self) -> Option<()> {
        for _ in 0..self.uvarint()? {
            self.uvarint()?;
            let size = self.uvarint()?;
            self.take(size)?;
        }
        Some(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bearer_token_is_read_from_the_client_first_message() {
        let token = |m: &str| bearer_token(m.as_bytes());
        assert_eq!(
            token("n,,\x01auth=Bearer abc.def\x01\x01").as_deref(),
            Some("abc.def")
        );
        assert_eq!(
            token("n,,\x01auth=Bearer t\x01traceId=1\x01\x01").as_deref(),
            Some("t")
        );
        assert_eq!(token("n,,\x01auth=Bearer \x01\x01"), None);
        assert_eq!(token("n,,\x01auth=Basic t\x01\x01"), None);
        assert_eq!(token("auth=Bearer t\x01\x01"), None);
    }
}
