//! The built-in OpenSSL's TLS paths in the real binary, certificate checks
//! included, each against a peer on 127.0.0.1 whose certificate a test
//! authority signed, which the process trusts only because `SSL_CERT_FILE`
//! names it (as an operator hands a private authority to a process):
//! callbacks over HTTPS (native-tls, as the Cosmos DB, Entra and Event Hubs
//! clients use it), and the Kafka stream over TLS (librdkafka). A receiver
//! whose certificate another authority signed, or whose certificate names
//! another host, gets no callback: the handshake fails, the callback is
//! retried, the status document says that the connection failed and the log
//! says why.

#![allow(clippy::unwrap_used)]

use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::time::Duration;

use skyport_core::status::{CallbackState, DeliveryState, StatusDocument};
use skyport_tests::kafka::Broker;
use skyport_tests::tls::{Authority, SubjectName};
use skyport_tests::webhooks::{Behaviour, Receiver};
use skyport_tests::{ChildApp, Client, delivery_request, eventually};

use crate::configured_args;

const LOOPBACK: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// Callbacks to loopback allowed, retried quickly and for long.
const CONFIG: &str = r#"
[simulator]
latency_ms = 1

[callbacks]
allow = ["127.0.0.0/8"]
retry_for_ms = 300000
backoff_initial_ms = 100
backoff_max_ms = 500
"#;

/// The `skyport` binary with the configuration `config`, trusting the
/// authorities in `ca_file` through `SSL_CERT_FILE`, and logging each
/// callback's failed attempt (at debug).
async fn spawn(dir: &Path, config: &str, ca_file: &Path) -> ChildApp {
    let config_file = dir.join("skyport.toml");
    std::fs::write(&config_file, config).unwrap();
    ChildApp::spawn_with_env(
        Path::new(env!("CARGO_BIN_EXE_skyport")),
        &configured_args(&config_file, &dir.join("data")),
        &[
            ("SSL_CERT_FILE", ca_file.to_str().unwrap().to_owned()),
            (
                "RUST_LOG",
                "info,skyport_callbacks::notify=debug".to_owned(),
            ),
        ],
        dir.join("skyport.log"),
    )
    .await
}

/// Posts one delivery whose callback goes to `url`; its status URL.
async fn post(client: &Client, n: usize, url: String) -> String {
    let mut request = delivery_request(n);
    request["callbackUrl"] = serde_json::Value::String(url);
    client.post_delivery(&request).await.status_url
}

/// Polls the document behind `url` until `done` holds for it; panics after
/// `within`, naming `what`.
async fn wait_for(
    client: &Client,
    url: &str,
    what: &str,
    within: Duration,
    done: impl Fn(&StatusDocument) -> bool,
) -> StatusDocument {
    eventually(what, within, || async {
        let document: StatusDocument = client.status(url).await.json().await.unwrap();
        done(&document).then_some(document)
    })
    .await
}

fn callback_is(document: &StatusDocument, state: CallbackState) -> bool {
    document.state == DeliveryState::Scheduled
        && document.callback.as_ref().is_some_and(|c| c.state == state)
}

/// Pending with an error recorded, and tried at least twice.
fn retried_with_an_error(document: &StatusDocument) -> bool {
    callback_is(document, CallbackState::Pending)
        && document
            .callback
            .as_ref()
            .is_some_and(|c| c.attempts >= 2 && c.last_error.is_some())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_callbacks_trust_the_authority_in_ssl_cert_file_and_check_certificates() {
    let dir = tempfile::tempdir().unwrap();
    let authority = Authority::new("Skyport test authority");
    let stranger = Authority::new("An authority nobody trusts");
    let loopback = [SubjectName::Ip(LOOPBACK)];
    let trusted =
        Receiver::start_tls(LOOPBACK, authority.issue(&loopback), Behaviour::Accept).await;
    let untrusted =
        Receiver::start_tls(LOOPBACK, stranger.issue(&loopback), Behaviour::Accept).await;
    let misnamed = Receiver::start_tls(
        LOOPBACK,
        authority.issue(&[SubjectName::Dns("elsewhere.example".into())]),
        Behaviour::Accept,
    )
    .await;

    let ca_file = dir.path().join("authority.pem");
    std::fs::write(&ca_file, authority.pem()).unwrap();
    let app = spawn(dir.path(), CONFIG, &ca_file).await;

    let delivered = post(&app.client, 0, trusted.url("127.0.0.1", "trusted")).await;
    let refused = post(&app.client, 1, untrusted.url("127.0.0.1", "untrusted")).await;
    let wrong_name = post(&app.client, 2, misnamed.url("127.0.0.1", "misnamed")).await;

    let within = Duration::from_secs(60);
    let received = eventually("the callback over HTTPS", within, || async {
        let received = trusted.received();
        received.iter().any(|r| r.acknowledged).then_some(received)
    })
    .await;
    // Delivered at its first attempt: nothing is written back.
    let document = wait_for(&app.client, &delivered, "Scheduled", within, |d| {
        d.state == DeliveryState::Scheduled
    })
    .await;
    assert_eq!(document.callback, None);
    assert_eq!(received.len(), 1, "one callback over HTTPS");
    assert_eq!(received[0].json()["data"]["id"], document.id.as_str());
    assert_eq!(received[0].json()["data"]["state"], "Scheduled");
    assert!(trusted.handshake_failures().is_empty());

    for (url, receiver, what, reason) in [
        (
            &refused,
            &untrusted,
            "signed by an authority the process does not trust",
            "unable to get local issuer certificate",
        ),
        (
            &wrong_name,
            &misnamed,
            "for another host name",
            "IP address mismatch",
        ),
    ] {
        let document = wait_for(&app.client, url, "retried", within, retried_with_an_error).await;
        // The client reads that much; the log, why.
        let error = document
            .callback
            .as_ref()
            .unwrap()
            .last_error
            .clone()
            .unwrap();
        assert_eq!(error, "the connection failed", "a certificate {what}");
        let log = std::fs::read_to_string(&app.stderr).unwrap();
        let failure = log
            .lines()
            .find(|line| {
                line.contains("A callback failed; it is tried again.")
                    && line.contains(&format!("delivery_id={}", document.id))
            })
            .unwrap_or_else(|| panic!("no failed attempt of {} in the log:\n{log}", document.id));
        println!("a certificate {what}: {failure}");
        assert!(
            failure.contains("certificate verify failed") && failure.contains(reason),
            "a certificate {what} fails its check with {reason:?}: {failure}"
        );
        assert!(
            receiver.received().is_empty(),
            "nothing is sent past a certificate {what}"
        );
        assert!(
            !receiver.handshake_failures().is_empty(),
            "the receiver with a certificate {what} saw its handshakes fail"
        );
    }
    app.terminate().await;
    for receiver in [trusted, untrusted, misnamed] {
        receiver.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kafka_stream_over_tls_trusts_the_authority_in_ssl_cert_file() {
    const TOPIC: &str = "deliveries-over-tls";
    let dir = tempfile::tempdir().unwrap();
    let authority = Authority::new("Skyport test authority");
    let identity = authority.issue(&[SubjectName::Ip(LOOPBACK)]);
    let broker = Broker::start_tls(&[TOPIC], 2, identity).await;
    let ca_file = dir.path().join("authority.pem");
    std::fs::write(&ca_file, authority.pem()).unwrap();
    let config = format!(
        r#"
[simulator]
latency_ms = 1

[stream]
backend = "kafka"

[kafka]
brokers = ["{}"]
topics = ["{TOPIC}"]
security = "ssl"
"#,
        broker.address
    );
    let app = spawn(dir.path(), &config, &ca_file).await;
    let urls: Vec<String> = app
        .client
        .post_many(20)
        .await
        .into_iter()
        .map(|accepted| accepted.status_url)
        .collect();
    for document in app
        .client
        .wait_for_terminal(&urls, Duration::from_secs(60))
        .await
    {
        assert_eq!(document.state, DeliveryState::Scheduled, "{document:?}");
    }
    app.terminate().await;
}
