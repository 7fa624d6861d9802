//! Content codings over real HTTP: request bodies compressed with gzip, br,
//! zstd or deflate are decoded and run like any other; the decoded size is
//! what `max_body_bytes` bounds (a bomb is a 413); an unknown coding is a 415
//! naming the ones the gateway decodes; a body that is not what its coding
//! says is a 400. Large answers come back compressed when the client asks.

#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::time::Duration;

use serde_json::Value;
use skyport_core::status::DeliveryState;
use skyport_tests::{TestApp, delivery_request};

/// Compresses a body in one content coding.
type Encoder = fn(&[u8]) -> Vec<u8>;

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    encoder.write_all(bytes).unwrap();
    encoder.finish().unwrap()
}

fn deflate(bytes: &[u8]) -> Vec<u8> {
    // HTTP's "deflate" is the zlib format (RFC 9110 §8.4.1.2).
    let mut encoder = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
    encoder.write_all(bytes).unwrap();
    encoder.finish().unwrap()
}

fn brotli(bytes: &[u8]) -> Vec<u8> {
    let mut encoded = Vec::new();
    {
        let mut encoder = brotli::CompressorWriter::new(&mut encoded, 4096, 5, 22);
        encoder.write_all(bytes).unwrap();
    }
    encoded
}

fn zstd(bytes: &[u8]) -> Vec<u8> {
    zstd::encode_all(bytes, 3).unwrap()
}

async fn post_encoded(app: &TestApp, encoding: &str, body: Vec<u8>) -> reqwest::Response {
    app.client
        .http
        .post(format!("{}/api/deliveryrequests", app.client.base))
        .header("content-type", "application/json")
        .header("content-encoding", encoding)
        .body(body)
        .send()
        .await
        .unwrap()
}

async fn problem(response: reqwest::Response) -> Value {
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json"
    );
    response.json().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compressed_bodies_are_decoded_and_scheduled() {
    let dir = tempfile::tempdir().unwrap();
    let app = TestApp::spawn(&dir).await;
    let encoders: [(&str, Encoder); 5] = [
        ("gzip", gzip),
        ("br", brotli),
        ("zstd", zstd),
        ("deflate", deflate),
        // Content codings are case-insensitive.
        ("GZip", gzip),
    ];
    let mut accepted = Vec::new();
    for (n, (encoding, encode)) in encoders.into_iter().enumerate() {
        let body = encode(delivery_request(n).to_string().as_bytes());
        let response = post_encoded(&app, encoding, body).await;
        assert_eq!(
            response.status(),
            202,
            "{encoding}: {:?}",
            response.text().await
        );
        let answer: Value = response.json().await.unwrap();
        accepted.push(answer["statusUrl"].as_str().unwrap().to_owned());
    }
    for status_url in &accepted {
        app.client
            .wait_for_state(
                status_url,
                DeliveryState::Scheduled,
                Duration::from_secs(30),
            )
            .await;
    }

    // A status document and the spec come back compressed when asked for.
    let status = app
        .client
        .http
        .get(&accepted[0])
        .header("accept-encoding", "gzip")
        .send()
        .await
        .unwrap();
    assert_eq!(status.status(), 200);
    assert_eq!(status.headers()["content-encoding"], "gzip");
    let mut document = String::new();
    flate2::read::GzDecoder::new(&status.bytes().await.unwrap()[..])
        .read_to_string(&mut document)
        .unwrap();
    let document: Value = serde_json::from_str(&document).unwrap();
    assert_eq!(document["state"], "Scheduled", "{document}");
    let spec = app
        .client
        .http
        .get(format!("{}/openapi.json", app.client.base))
        .header("accept-encoding", "br")
        .send()
        .await
        .unwrap();
    assert_eq!(spec.headers()["content-encoding"], "br");
    let compressed = spec.bytes().await.unwrap();
    let mut text = String::new();
    brotli::Decompressor::new(&compressed[..], 4096)
        .read_to_string(&mut text)
        .unwrap();
    assert!(
        text.len() > 2 * compressed.len(),
        "the spec compresses well"
    );
    let spec: Value = serde_json::from_str(&text).unwrap();
    assert!(spec["paths"]["/api/deliveryrequests"].is_object());
    app.app.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bombs_unknown_codings_and_false_codings_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let app = TestApp::spawn(&dir).await;

    // 10 MB of zeros in about 10 KB: refused once 64 KiB have been decoded.
    let bomb = gzip(&vec![0_u8; 10 * 1024 * 1024]);
    assert!(bomb.len() < 16 * 1024, "{}", bomb.len());
    let response = post_encoded(&app, "gzip", bomb).await;
    assert_eq!(response.status(), 413);
    assert_eq!(problem(response).await["code"], "PayloadTooLarge");

    let body = delivery_request(1).to_string().into_bytes();
    let response = post_encoded(&app, "rot13", body.clone()).await;
    assert_eq!(response.status(), 415);
    assert_eq!(
        response.headers()["accept-encoding"],
        "gzip, br, zstd, deflate"
    );
    let refused = problem(response).await;
    assert_eq!(refused["code"], "UnsupportedEncoding", "{refused}");
    assert!(
        refused["detail"].as_str().unwrap().contains("rot13"),
        "{refused}"
    );
    let response = post_encoded(&app, "gzip, br", body.clone()).await;
    assert_eq!(response.status(), 415, "one coding at a time");

    // Plain JSON that claims to be gzip.
    let response = post_encoded(&app, "gzip", body).await;
    assert_eq!(response.status(), 400);
    assert_eq!(problem(response).await["code"], "BadRequest");

    assert_eq!(app.published(), 0, "nothing refused reached the stream");
    app.app.stop().await.unwrap();
}
