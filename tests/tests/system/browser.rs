//! Skyport's pages in a real browser: Debian's Chromium (installed on first
//! use when the tests run as root), headless, driven by
//! npm's playwright-core (tests/clients/browser/pages.cjs), against the whole
//! system in-process. The dashboard's figures must move while the test posts
//! deliveries, with quotas on, and its top clients name the one over its
//! quota; a status URL opened as a browser opens it must show the
//! delivery's steps, drone or failure; with auth on (and quotas off), the
//! dashboard must ask for a key and show its figures once given one, with no
//! top clients. No page may log a console
//! error, fail a request or fetch anything from another origin.
//!
//! Screenshots are kept under `target/browser/`. With
//! `SKYPORT_UPDATE_SCREENSHOTS=1` they also replace those the README and
//! docs/operations.md show, under `docs/images/`.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use secrecy::SecretString;
use serde_json::{Value, json};
use skyport_core::status::{DeliveryState, StatusDocument};
use skyport_runtime::config::{ApiKeySettings, ClientQuota, Millis, Scope};
use skyport_tests::{
    TestApp, chromium, delivery_request, installed_tool, run_tool_ok, test_settings, workspace,
};
use tokio::process::Command;
use tokio_util::sync::CancellationToken;

/// Where the screenshots are kept after the run.
fn screenshots() -> PathBuf {
    let dir = workspace().join("target/browser");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `node pages.cjs ARGS…` with playwright-core from the installed node tools.
fn pages(args: &[&str]) -> Command {
    let modules = installed_tool("node/node_modules");
    let mut command = Command::new("node");
    command
        .env("NODE_PATH", modules)
        .env("CHROMIUM", chromium())
        .arg(workspace().join("tests/clients/browser/pages.cjs"))
        .args(args);
    command
}

async fn run(what: &str, command: Command, dir: &Path) {
    run_tool_ok(what, command, Duration::from_secs(180), dir).await;
}

/// Copies `name` from the screenshots to `docs/images/` when asked to.
fn publish(name: &str) {
    if std::env::var_os("SKYPORT_UPDATE_SCREENSHOTS").is_some_and(|v| v == "1") {
        let images = workspace().join("docs/images");
        std::fs::create_dir_all(&images).unwrap();
        std::fs::copy(screenshots().join(name), images.join(name)).unwrap();
    }
}

#[tokio::test]
async fn the_dashboard_shows_the_figures_moving_while_deliveries_are_posted() {
    let data = tempfile::tempdir().unwrap();
    let mut settings = test_settings(data.path());
    // Calls of a few milliseconds and an occasional 503, as services have.
    settings.simulator.latency_ms = Millis::new(5);
    settings.simulator.error_rate = 0.02;
    // Quotas none of the 97 owners reaches, and one client's that it does.
    settings.gateway.quotas.default_per_s = Some(1000);
    settings.gateway.quotas.clients = BTreeMap::from([(
        "flood".to_owned(),
        ClientQuota {
            per_s: 2,
            burst: None,
        },
    )]);
    let app = TestApp::spawn_with(settings).await;

    // Deliveries at about 150/s for as long as the browser watches.
    let posting = CancellationToken::new();
    let poster = tokio::spawn({
        let client = app.client.clone();
        let posting = posting.clone();
        async move {
            let mut n = 0;
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            while !posting.is_cancelled() {
                tick.tick().await;
                let batch: Vec<_> = (n..n + 15).map(delivery_request).collect();
                n += 15;
                futures_util::future::join_all(
                    batch.iter().map(|request| client.post_delivery(request)),
                )
                .await;
            }
            n
        }
    });
    // "flood" at about 20/s, most of it refused.
    let flooding = tokio::spawn({
        let client = app.client.clone();
        let posting = posting.clone();
        async move {
            let mut refused = 0;
            let mut tick = tokio::time::interval(Duration::from_millis(50));
            for n in 1_000_000.. {
                if posting.is_cancelled() {
                    break;
                }
                tick.tick().await;
                let mut request = delivery_request(n);
                request["ownerId"] = "flood".into();
                let response = client
                    .post_raw("application/json", request.to_string())
                    .await;
                match response.status().as_u16() {
                    202 => {}
                    429 => refused += 1,
                    other => panic!("flood was answered {other}"),
                }
            }
            refused
        }
    });

    let dir = tempfile::tempdir().unwrap();
    let out = screenshots();
    run(
        "the dashboard in Chromium",
        pages(&["dashboard", &app.client.base, out.to_str().unwrap()]),
        dir.path(),
    )
    .await;
    posting.cancel();
    let posted = poster.await.unwrap();
    let refused = flooding.await.unwrap();
    println!(
        "{posted} deliveries posted while the browser watched; flood was refused {refused} times"
    );
    publish("dashboard.png");
    app.app.stop().await.unwrap();
}

#[tokio::test]
async fn with_auth_on_the_dashboard_asks_for_a_key_and_shows_its_figures_once_given_one() {
    const READER: &str = "browser-reader-key-0123456789abcdef";
    let data = tempfile::tempdir().unwrap();
    let mut settings = test_settings(data.path());
    settings.gateway.auth.enabled = Some(true);
    settings.gateway.auth.api_keys.insert(
        "browser".into(),
        ApiKeySettings {
            key: SecretString::from(READER),
            // The dashboard's data is every client's: the admin scope's.
            scopes: vec![Scope::Read, Scope::Admin],
        },
    );
    let app = TestApp::spawn_with(settings).await;
    let dir = tempfile::tempdir().unwrap();
    run(
        "signing in to the dashboard in Chromium",
        pages(&["signin", &app.client.base, READER]),
        dir.path(),
    )
    .await;
    app.app.stop().await.unwrap();
}

/// What the status page of `document` must show.
fn expected(document: &StatusDocument) -> Value {
    match document.state {
        DeliveryState::Scheduled => json!({
            "state": "Scheduled",
            "steps": document.steps.len(),
            "succeeded": document.steps.len(),
            "drone": document.drone_id,
        }),
        DeliveryState::Failed => {
            let failure = document.failure.as_ref().unwrap();
            json!({
                "state": "Failed",
                "failedStep": format!("{:?}", failure.step),
                "reason": failure.message,
            })
        }
        other => panic!("no page check for {other:?}"),
    }
}

#[tokio::test]
async fn a_status_url_opened_in_a_browser_shows_the_steps_the_drone_or_the_failure() {
    let data = tempfile::tempdir().unwrap();
    let mut settings = test_settings(data.path());
    settings.simulator.suspended_owners = vec!["owner-5".into()];
    let app = TestApp::spawn_with(settings).await;
    let wait = Duration::from_secs(30);

    let scheduled = app.client.post_delivery(&delivery_request(1)).await;
    let failed = app.client.post_delivery(&delivery_request(5)).await;
    let scheduled_document = app
        .client
        .wait_for_state(&scheduled.status_url, DeliveryState::Scheduled, wait)
        .await;
    let failed_document = app
        .client
        .wait_for_state(&failed.status_url, DeliveryState::Failed, wait)
        .await;
    assert_eq!(scheduled_document.steps.len(), 5);
    assert_eq!(
        failed_document.failure.as_ref().unwrap().code,
        "AccountSuspended"
    );

    let dir = tempfile::tempdir().unwrap();
    let out = screenshots();
    for (name, accepted, document) in [
        ("scheduled", &scheduled, &scheduled_document),
        ("failed", &failed, &failed_document),
    ] {
        run(
            &format!("the {name} status page in Chromium"),
            pages(&[
                "status",
                out.to_str().unwrap(),
                name,
                &accepted.status_url,
                &expected(document).to_string(),
            ]),
            dir.path(),
        )
        .await;
        publish(&format!("status-{name}.png"));
    }

    // Anything but a browser still gets JSON from the same URL.
    let answer = app.client.status(&scheduled.status_url).await;
    assert_eq!(answer.headers()["content-type"], "application/json");
    assert!(
        answer
            .headers()
            .get_all("vary")
            .iter()
            .any(|value| value == "accept"),
        "{:?}",
        answer.headers()
    );
    app.app.stop().await.unwrap();
}
