//! Secrets never leave the process: the real binary is configured with known
//! API keys, a JWT secret, a receipt key, a Cosmos DB key and an Event Hubs
//! connection string, driven through successes and failures (good and bad
//! credentials, forged receipts, bad bodies, unknown routes) with debug logs
//! on and traces exported to a receiver in this test; then started with bad
//! configuration and with backends it cannot reach. No log line, exported
//! span, `/metrics` line, answer header or answer body holds any secret.

#![allow(clippy::unwrap_used)]

use std::process::{Command, Output};
use std::time::Duration;

use jsonwebtoken::{EncodingKey, Header};
use serde_json::json;
use skyport_core::status::DeliveryState;
use skyport_tests::delivery_request;
use skyport_tests::otlp::OtlpReceiver;

use crate::spawn_skyport;

const API_KEY: &str = "sk-api-key-7f3a9c1e5b2d4f60a8e7c9b1d3f5a7e9";
const JWT_SECRET: &str = "jwt-hs256-secret-0a1b2c3d4e5f60718293a4b5c6d7e8f9";
const RECEIPT_KEY: &str = "receipt-key-9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b";
const COSMOS_KEY: &str =
    "LUJ3RsOGnBdg7T9gGYVMBStCvu+fJ11fSz4ifgFurvBWBejSybCGZX74KET8rVB07ftWx103jUcQYESRooU7Og==";
const EVENTHUBS_KEY: &str = "EhSasKey+9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b=";

const SECRETS: [(&str, &str); 5] = [
    ("gateway.auth.api_keys.portal.key", API_KEY),
    ("gateway.auth.jwt.hs256_secret", JWT_SECRET),
    ("gateway.receipt_keys", RECEIPT_KEY),
    ("cosmos.key", COSMOS_KEY),
    ("eventhubs.connection_string", EVENTHUBS_KEY),
];

/// Panics naming the secret and where it was found, if `text` holds one.
fn assert_no_secret(place: &str, text: &str) {
    for (key, secret) in SECRETS {
        assert!(
            !text.contains(secret),
            "{place} holds the secret of {key}:\n{text}"
        );
    }
}

fn connection_string() -> String {
    format!(
        "Endpoint=sb://skyport-secrets.servicebus.windows.net/;SharedAccessKeyName=send;SharedAccessKey={EVENTHUBS_KEY}"
    )
}

/// The settings that configure every secret.
fn secret_settings() -> Vec<String> {
    [
        format!("gateway.auth.api_keys.portal.key={API_KEY}"),
        "gateway.auth.jwt.issuer=https://issuer.test/".to_owned(),
        "gateway.auth.jwt.audience=skyport-test".to_owned(),
        format!("gateway.auth.jwt.hs256_secret={JWT_SECRET}"),
        format!("gateway.receipt_keys=[\"{RECEIPT_KEY}\"]"),
        format!("cosmos.key={COSMOS_KEY}"),
        format!("eventhubs.connection_string=\"{}\"", connection_string()),
    ]
    .into()
}

fn token(secret: &str) -> String {
    let claims = json!({
        "iss": "https://issuer.test/",
        "aud": "skyport-test",
        "sub": "secrets-test",
        "scp": "deliveries.read deliveries.write",
        "exp": 4_102_444_800_u64,
    });
    jsonwebtoken::encode(
        &Header::default(),
        &claims,
        &EncodingKey::from_secret(secret.as_bytes()),
    )
    .unwrap()
}

/// Sends `request` and returns its status line, headers and body as text.
async fn answer(request: reqwest::RequestBuilder) -> (u16, String) {
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let headers = format!("{:?}", response.headers());
    let body = response.text().await.unwrap();
    (status, format!("{headers}\n{body}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_reaches_logs_spans_metrics_or_answers() {
    let receiver = OtlpReceiver::start().await;

    let data = tempfile::tempdir().unwrap();
    let mut settings = secret_settings();
    settings.extend(["gateway.auth.enabled=true", "telemetry.log_format=json"].map(String::from));
    let env = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint.clone()),
        ("OTEL_BSP_SCHEDULE_DELAY", "100".to_owned()),
        ("RUST_LOG", "debug".to_owned()),
    ];
    let app = spawn_skyport(&data, &settings, &env).await;
    let base = app.client.base.clone();
    let with_key = app.client.with_header("x-api-key", API_KEY);
    let with_token = app
        .client
        .with_header("authorization", &format!("Bearer {}", token(JWT_SECRET)));
    let forged = app.client.with_header(
        "authorization",
        &format!(
            "Bearer {}",
            token("not-the-secret-but-just-as-long-0123456789")
        ),
    );
    let wrong_key = app
        .client
        .with_header("x-api-key", "sk-api-key-that-is-long-enough-but-not-known");

    let mut answers = Vec::new();
    let accepted = with_key.post_delivery(&delivery_request(1)).await;
    with_key
        .wait_for_state(
            &accepted.status_url,
            DeliveryState::Scheduled,
            Duration::from_secs(30),
        )
        .await;
    let by_token = with_token.post_delivery(&delivery_request(2)).await;
    answers.push(answer(with_token.http.get(&by_token.status_url)).await);
    answers.push(answer(with_key.http.get(&accepted.status_url)).await);
    let tampered = accepted.status_url.replace("receipt=", "receipt=AAAA");
    answers.push(answer(with_key.http.get(&tampered)).await);
    for client in [&forged, &wrong_key, &app.client] {
        answers.push(
            answer(
                client
                    .http
                    .post(format!("{base}/api/deliveryrequests"))
                    .json(&delivery_request(3)),
            )
            .await,
        );
    }
    answers.push(
        answer(
            with_key
                .http
                .post(format!("{base}/api/deliveryrequests"))
                .header("content-type", "application/json")
                .body("{\"ownerId\": 1e400"),
        )
        .await,
    );
    answers.push(answer(with_key.http.get(format!("{base}/api/nothing"))).await);
    answers.push(answer(with_key.http.get(format!("{base}/readyz"))).await);
    answers.push(answer(with_key.http.get(format!("{base}/openapi.json"))).await);
    let (status, metrics) = answer(app.client.http.get(format!("{base}/metrics"))).await;
    assert_eq!(status, 200);

    let statuses: Vec<u16> = answers.iter().map(|(status, _)| *status).collect();
    assert_eq!(statuses, [200, 200, 404, 401, 401, 401, 400, 404, 200, 200]);
    let log = app.terminate().await;
    let spans = format!("{:?}", receiver.stop().await);

    assert!(
        log.contains("\"request_id\""),
        "the log is the JSON debug log:\n{log}"
    );
    assert_no_secret("the log", &log);
    assert!(
        spans.contains("POST /api/deliveryrequests"),
        "spans were exported"
    );
    assert_no_secret("an exported span", &spans);
    assert_no_secret("/metrics", &metrics);
    for (status, text) in &answers {
        assert_no_secret(&format!("a {status} answer"), text);
    }
}

fn run(args: &[String]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_skyport"))
        .args(args)
        .env("RUST_LOG", "debug")
        .output()
        .unwrap()
}

#[test]
fn no_secret_reaches_the_errors_of_a_bad_start() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap().to_owned();
    let with = |extra: &[&str]| -> Vec<String> {
        let mut args = vec![
            "--data-dir".to_owned(),
            data.clone(),
            "--listen".to_owned(),
            "127.0.0.1:0".to_owned(),
        ];
        args.extend(
            secret_settings()
                .into_iter()
                .flat_map(|setting| ["--set".to_owned(), setting]),
        );
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        args
    };

    // A secret too short to be accepted: the message names the key, not the value.
    let short = run(&with(&[
        "--set",
        "gateway.auth.api_keys.other.key=short-but-secret-7f3a",
    ]));
    let stderr = String::from_utf8_lossy(&short.stderr);
    assert_eq!(short.status.code(), Some(64), "{stderr}");
    assert!(
        stderr.contains("gateway.auth.api_keys.other.key"),
        "{stderr}"
    );
    assert!(!stderr.contains("short-but-secret-7f3a"), "{stderr}");
    assert_no_secret("a configuration error", &stderr);

    // A connection string that is not one: named, never echoed.
    let malformed = run(&with(&[
        "--set",
        "profile=azure",
        "--set",
        &format!("eventhubs.connection_string=\"SharedAccessKey={EVENTHUBS_KEY}\""),
        "--set",
        "cosmos.endpoint=https://127.0.0.1:9/",
    ]));
    let stderr = String::from_utf8_lossy(&malformed.stderr);
    assert_eq!(malformed.status.code(), Some(64), "{stderr}");
    assert!(stderr.contains("eventhubs.connection_string"), "{stderr}");
    assert_no_secret("a configuration error", &stderr);

    // Backends it cannot reach: Cosmos DB and Event Hubs on a closed port.
    let unreachable = run(&with(&[
        "--set",
        "profile=azure",
        "--set",
        "cosmos.endpoint=https://127.0.0.1:9/",
        "--set",
        "eventhubs.custom_endpoint=amqp://127.0.0.1:9",
    ]));
    let stderr = String::from_utf8_lossy(&unreachable.stderr);
    assert!(!unreachable.status.success(), "{stderr}");
    assert_no_secret("the errors of an unreachable backend", &stderr);
    assert_no_secret("stdout", &String::from_utf8_lossy(&unreachable.stdout));
}
