use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use axum::Router;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response as AxumResponse};
use reqwest::dns::{Name, Resolve};
use skyport_runtime::config::Millis;
use time::macros::datetime;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::*;

const HEADERS: WebhookHeaders<'static> = WebhookHeaders {
    id: "msg_1",
    timestamp: 1_700_000_000,
    signature: "v1,c2lnbmF0dXJl",
    traceparent: Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
};

/// Local receivers are loopback: the tests allow it unless they test refusal.
fn settings(allow: &[&str], timeout_ms: u64) -> CallbackSettings {
    CallbackSettings {
        allow: allow.iter().map(|&entry| entry.to_owned()).collect(),
        timeout_ms: Millis::new(timeout_ms),
        ..CallbackSettings::default()
    }
}

fn client(settings: &CallbackSettings) -> CallbackClient {
    CallbackClient::new(settings, AddressPolicy::new(settings.allowed())).expect("client")
}

fn local() -> CallbackClient {
    client(&settings(&["127.0.0.0/8"], 5_000))
}

fn url(text: &str) -> Url {
    Url::parse(text).expect("url")
}

async fn send(client: &CallbackClient, url: &Url) -> Attempt {
    client
        .send(
            url,
            &HEADERS,
            Bytes::from_static(br#"{"status":"Delivered"}"#),
        )
        .await
}

/// A receiver on `bind` that answers every request with `respond` and
/// keeps what it was sent.
struct Server {
    address: SocketAddr,
    received: Arc<Mutex<Vec<(HeaderMap, Bytes)>>>,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl Server {
    /// `None` when `bind` is not available here (no IPv6).
    async fn start<F, Fut>(bind: &str, respond: F) -> Option<Self>
    where
        F: Fn() -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = AxumResponse> + Send + 'static,
    {
        let listener = TcpListener::bind(bind).await.ok()?;
        let address = listener.local_addr().expect("address");
        let received = Arc::new(Mutex::new(Vec::new()));
        let keep = Arc::clone(&received);
        let app = Router::new().fallback(move |headers: HeaderMap, body: Bytes| {
            keep.lock().expect("lock").push((headers, body));
            respond()
        });
        let stop = CancellationToken::new();
        let shutdown = stop.clone().cancelled_owned();
        let task = tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(shutdown)
                .await
                .expect("serves");
        });
        Some(Self {
            address,
            received,
            stop,
            task,
        })
    }

    fn url(&self, host: &str) -> Url {
        url(&format!("http://{host}:{}/hook", self.address.port()))
    }

    fn own_url(&self) -> Url {
        url(&format!("http://{}/hook", self.address))
    }

    fn hits(&self) -> usize {
        self.received.lock().expect("lock").len()
    }

    async fn stop(self) {
        self.stop.cancel();
        tokio::time::timeout(Duration::from_secs(5), self.task)
            .await
            .expect("the server stops")
            .expect("the server task ends");
    }
}

async fn answering(status: u16) -> Server {
    Server::start("127.0.0.1:0", move || async move {
        StatusCode::from_u16(status)
            .expect("status")
            .into_response()
    })
    .await
    .expect("a local server")
}

/// A raw TCP receiver that accepts connections and runs `serve` on each.
async fn raw<F, Fut>(serve: F) -> (SocketAddr, JoinHandle<()>)
where
    F: Fn(tokio::net::TcpStream) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    let task = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(serve(stream));
        }
    });
    (address, task)
}

#[tokio::test]
async fn a_2xx_is_delivered_with_the_webhook_headers() {
    let server = answering(200).await;
    assert_eq!(
        send(&local(), &server.own_url()).await,
        Attempt::Delivered { status: 200 }
    );
    {
        let received = server.received.lock().expect("lock");
        let (headers, body) = &received[0];
        let header = |name: &str| headers.get(name).expect(name).to_str().expect(name);
        assert_eq!(header("webhook-id"), "msg_1");
        assert_eq!(header("webhook-timestamp"), "1700000000");
        assert_eq!(header("webhook-signature"), "v1,c2lnbmF0dXJl");
        assert_eq!(header("traceparent"), HEADERS.traceparent.expect("set"));
        assert_eq!(header("content-type"), "application/json");
        assert!(header("user-agent").starts_with("skyport-callbacks/"));
        assert_eq!(&body[..], br#"{"status":"Delivered"}"#);
    }
    server.stop().await;
}

#[tokio::test]
async fn a_503_is_retried_when_the_receiver_says() {
    let server = Server::start("127.0.0.1:0", || async {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            [(RETRY_AFTER, "2")],
            "  down for maintenance ",
        )
            .into_response()
    })
    .await
    .expect("a local server");
    assert_eq!(
        send(&local(), &server.own_url()).await,
        Attempt::Retry {
            failure: Failure::new(
                "the receiver answered 503",
                "503 Service Unavailable: down for maintenance"
            ),
            after: Some(Duration::from_secs(2)),
        }
    );
    server.stop().await;
}

#[tokio::test]
async fn throttling_and_request_timeouts_are_retried_other_4xx_refused() {
    for (status, retried) in [
        (429, true),
        (408, true),
        (500, true),
        (404, false),
        (400, false),
    ] {
        let server = answering(status).await;
        let attempt = send(&local(), &server.own_url()).await;
        assert_eq!(
            matches!(attempt, Attempt::Retry { .. }),
            retried,
            "{status}: {attempt:?}"
        );
        if !retried {
            assert_eq!(
                attempt,
                Attempt::Refused {
                    failure: Failure::new(
                        format!("the receiver answered {status}"),
                        StatusCode::from_u16(status).expect("status").to_string()
                    )
                }
            );
        }
        server.stop().await;
    }
}

#[tokio::test]
async fn redirects_are_refused_and_not_followed() {
    let target = answering(200).await;
    for location in [
        target.own_url().to_string(),
        "http://169.254.169.254/".into(),
    ] {
        let redirect = location.clone();
        let server = Server::start("127.0.0.1:0", move || {
            let redirect = redirect.clone();
            async move { (StatusCode::FOUND, [(LOCATION, redirect)]).into_response() }
        })
        .await
        .expect("a local server");
        assert_eq!(
            send(&local(), &server.own_url()).await,
            Attempt::Refused {
                failure: Failure::new(
                    "the receiver redirected (callbacks do not follow redirects)",
                    format!("302 Found: redirects are not followed: Location {location}")
                )
            }
        );
        server.stop().await;
    }
    assert_eq!(target.hits(), 0, "the redirect's target was contacted");
    target.stop().await;
}

#[tokio::test]
async fn a_receiver_that_never_answers_times_out_and_is_retried() {
    let (address, task) = raw(|mut stream| async move {
        let mut request = [0u8; 1024];
        let _ = stream.read(&mut request).await;
        // Holds the connection open without answering.
        std::future::pending::<()>().await;
    })
    .await;
    let client = client(&settings(&["127.0.0.0/8"], 300));
    let started = Instant::now();
    let attempt = send(&client, &url(&format!("http://{address}/hook"))).await;
    let took = started.elapsed();
    assert!(
        matches!(&attempt, Attempt::Retry { failure, after: None }
            if failure.reason == "the receiver did not answer within 300 ms"),
        "{attempt:?}"
    );
    assert!(
        took >= Duration::from_millis(250) && took < Duration::from_secs(2),
        "{took:?}"
    );
    task.abort();
}

#[tokio::test]
async fn refused_literal_addresses_are_never_contacted() {
    let v4 = answering(200).await;
    let v6 = Server::start("[::1]:0", || async { StatusCode::OK.into_response() }).await;
    let mut urls = vec![
        url("http://10.0.0.1/hook"),
        url("http://169.254.169.254/latest/meta-data"),
        url("http://[::ffff:169.254.169.254]/"),
        v4.own_url(),
    ];
    urls.extend(v6.as_ref().map(Server::own_url));
    // No allow-list, and a timeout a connection attempt would run into.
    let client = client(&settings(&[], 5_000));
    for url in urls {
        let started = Instant::now();
        let attempt = send(&client, &url).await;
        assert!(
            matches!(&attempt, Attempt::Refused { failure }
                if failure.reason == NOT_ALLOWED && failure.detail.contains("callbacks may not reach")),
            "{url}: {attempt:?}"
        );
        assert!(started.elapsed() < Duration::from_secs(1), "{url}");
    }
    assert_eq!(v4.hits(), 0);
    v4.stop().await;
    if let Some(v6) = v6 {
        assert_eq!(v6.hits(), 0);
        v6.stop().await;
    }
}

#[tokio::test]
async fn only_http_and_https_are_sent() {
    for text in ["ftp://example.com/hook", "file:///etc/passwd"] {
        let attempt = send(&local(), &url(text)).await;
        assert!(
            matches!(attempt, Attempt::Refused { .. }),
            "{text}: {attempt:?}"
        );
    }
}

#[tokio::test]
async fn a_name_is_refused_unless_the_allow_list_admits_its_addresses() {
    let server = answering(204).await;
    let url = server.url("localhost");
    let attempt = send(&client(&settings(&[], 5_000)), &url).await;
    // The detail names the name and what it resolved to; the reason, which
    // the client reads, neither.
    assert!(
        matches!(&attempt, Attempt::Refused { failure }
            if failure.reason == NOT_ALLOWED
                && failure.detail.starts_with("localhost resolves only to addresses callbacks may not reach")
                && failure.detail.contains("127.0.0.1 is loopback")),
        "{attempt:?}"
    );
    assert_eq!(server.hits(), 0);
    assert_eq!(
        send(&local(), &url).await,
        Attempt::Delivered { status: 204 }
    );
    assert_eq!(server.hits(), 1);
    server.stop().await;
}

#[tokio::test]
async fn a_refused_connection_is_retried_with_a_generic_reason() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    drop(listener);
    let attempt = send(&local(), &url(&format!("http://{address}/hook"))).await;
    assert!(
        matches!(&attempt, Attempt::Retry { failure, after: None }
            if failure.reason == CONNECTION_FAILED && !failure.detail.is_empty()),
        "{attempt:?}"
    );
}

/// The ranges the review of 2026-11-28 found open, each as a literal.
const NEWLY_REFUSED: [&str; 13] = [
    "168.63.129.16",
    "192.0.0.8",
    "198.18.0.1",
    "198.19.1.1",
    "192.0.2.1",
    "198.51.100.1",
    "203.0.113.1",
    "2001:db8::1",
    "2001:0:4136:e378:8000:63bf:3fff:fdd2",
    "64:ff9b::a00:1",
    "64:ff9b::a83f:8110",
    "64:ff9b:1::a9fe:a9fe",
    "2002:a00:1::1",
];

#[tokio::test]
async fn the_newly_refused_ranges_are_refused_as_literals_before_sending() {
    let client = client(&settings(&[], 5_000));
    for text in NEWLY_REFUSED {
        let host = if text.contains(':') {
            format!("[{text}]")
        } else {
            text.to_owned()
        };
        let started = Instant::now();
        let attempt = send(&client, &url(&format!("http://{host}/hook"))).await;
        assert!(
            matches!(&attempt, Attempt::Refused { failure }
                if failure.reason == NOT_ALLOWED && failure.detail.contains("callbacks may not reach")),
            "{text}: {attempt:?}"
        );
        assert!(started.elapsed() < Duration::from_secs(1), "{text}");
    }
}

/// The resolver judges every address the system's lookup answers (here
/// each range written out, which the lookup answers as itself).
#[tokio::test]
async fn the_newly_refused_ranges_are_refused_where_names_resolve() {
    let resolver = GuardedResolver {
        policy: AddressPolicy::default(),
    };
    for text in NEWLY_REFUSED {
        let name: Name = text.parse().expect("a name");
        let Err(error) = resolver.resolve(name).await else {
            panic!("{text} resolved to an address callbacks may reach");
        };
        let refused = error.downcast_ref::<RefusedName>().expect("refused");
        let shown = text
            .parse::<std::net::IpAddr>()
            .expect("an address")
            .to_string();
        assert!(refused.reasons.starts_with(&shown), "{text}: {refused}");
    }
    let public: Name = "93.184.215.14".parse().expect("a name");
    let addresses: Vec<SocketAddr> = resolver
        .resolve(public)
        .await
        .expect("a public address passes")
        .collect();
    assert_eq!(addresses.len(), 1);
}

/// A receiver that takes `delay` to answer and counts the requests it
/// serves at once: (the server, the most at once).
async fn slow(delay: Duration) -> (Server, Arc<AtomicUsize>) {
    let current = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let (now, max) = (Arc::clone(&current), Arc::clone(&most));
    let server = Server::start("127.0.0.1:0", move || {
        let (now, max) = (Arc::clone(&now), Arc::clone(&max));
        async move {
            let at_once = now.fetch_add(1, Ordering::SeqCst) + 1;
            max.fetch_max(at_once, Ordering::SeqCst);
            tokio::time::sleep(delay).await;
            now.fetch_sub(1, Ordering::SeqCst);
            StatusCode::OK.into_response()
        }
    })
    .await
    .expect("a local server");
    (server, most)
}

#[tokio::test]
async fn one_destination_is_limited_without_holding_others_up() {
    let delay = Duration::from_millis(300);
    let (busy, busy_most) = slow(delay).await;
    let (other, _) = slow(delay).await;
    let client = client(&CallbackSettings {
        per_destination: 1,
        max_in_flight: 8,
        ..settings(&["127.0.0.0/8"], 5_000)
    });
    let started = Instant::now();
    let timed = |url: Url| {
        let client = &client;
        async move {
            let attempt = send(client, &url).await;
            (attempt, started.elapsed())
        }
    };
    let (first, second, elsewhere) = tokio::join!(
        timed(busy.own_url()),
        timed(busy.own_url()),
        timed(other.own_url()),
    );
    for (attempt, _) in [&first, &second, &elsewhere] {
        assert_eq!(*attempt, Attempt::Delivered { status: 200 });
    }
    assert_eq!(busy.hits(), 2);
    assert_eq!(busy_most.load(Ordering::SeqCst), 1);
    assert!(first.1.max(second.1) >= delay * 2, "{first:?} {second:?}");
    assert!(elsewhere.1 < delay * 2, "{elsewhere:?}");
    busy.stop().await;
    other.stop().await;
}

#[tokio::test]
async fn the_overall_limit_holds_across_destinations() {
    let delay = Duration::from_millis(300);
    let (one, _) = slow(delay).await;
    let (two, _) = slow(delay).await;
    let client = client(&CallbackSettings {
        max_in_flight: 1,
        ..settings(&["127.0.0.0/8"], 5_000)
    });
    let started = Instant::now();
    let (one_url, two_url) = (one.own_url(), two.own_url());
    let (a, b) = tokio::join!(send(&client, &one_url), send(&client, &two_url));
    assert_eq!((a.clone(), b), (Attempt::Delivered { status: 200 }, a));
    assert!(started.elapsed() >= delay * 2);
    one.stop().await;
    two.stop().await;
}

#[tokio::test]
async fn idle_destinations_are_forgotten() {
    let client = local();
    let held = client.destination(Destination::of(&url("http://held.example/")).expect("host"));
    for n in 0..DESTINATIONS_KEPT + 10 {
        drop(
            client.destination(
                Destination::of(&url(&format!("http://h{n}.example/"))).expect("host"),
            ),
        );
    }
    let destinations = client.destinations.lock().expect("lock");
    assert!(
        destinations.len() <= DESTINATIONS_KEPT,
        "{}",
        destinations.len()
    );
    assert!(
        destinations
            .values()
            .any(|semaphore| Arc::ptr_eq(semaphore, &held))
    );
}

#[tokio::test]
async fn only_the_start_of_a_long_answer_is_read() {
    // An answer that claims a gigabyte and keeps sending until the client hangs up.
    let (address, task) = raw(|mut stream| async move {
        let mut request = [0u8; 4096];
        let _ = stream.read(&mut request).await;
        let head = "HTTP/1.1 500 Internal Server Error\r\ncontent-length: 1000000000\r\n\r\n";
        if stream.write_all(head.as_bytes()).await.is_err() {
            return;
        }
        let chunk = vec![b'x'; 16 * 1024];
        while stream.write_all(&chunk).await.is_ok() {}
    })
    .await;
    let client = client(&CallbackSettings {
        max_response_bytes: 1024,
        ..settings(&["127.0.0.0/8"], 10_000)
    });
    let started = Instant::now();
    let attempt = send(&client, &url(&format!("http://{address}/hook"))).await;
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(
        attempt,
        Attempt::Retry {
            failure: Failure::new(
                "the receiver answered 500",
                format!(
                    "500 Internal Server Error: {}",
                    "x".repeat(ERROR_TEXT_CHARS)
                )
            ),
            after: None,
        }
    );
    task.abort();
}

#[test]
fn retry_after_is_seconds_or_an_http_date() {
    let now = datetime!(1994-11-06 08:48:37 UTC);
    let parse = |text: &'static str| retry_after(&HeaderValue::from_static(text), now);
    assert_eq!(parse("120"), Some(Duration::from_secs(120)));
    assert_eq!(
        parse("Sun, 06 Nov 1994 08:49:37 GMT"),
        Some(Duration::from_secs(60))
    );
    assert_eq!(parse("Sun, 06 Nov 1994 08:40:00 GMT"), None);
    assert_eq!(parse("soon"), None);
}
