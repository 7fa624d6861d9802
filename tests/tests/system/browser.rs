//! Skyport's pages in a real browser (`skyport_tests::browser`) against the
//! whole system in-process: a status URL opened as a browser opens it must
//! show the delivery's steps, drone or failure; with auth on (and quotas
//! off), the dashboard must ask for a key and show its figures once given
//! one, with no top clients. No page may log a console error, fail a request
//! or fetch anything from another origin. The dashboard's moving figures and
//! closed circuits are checked against a process of their own, in
//! `tests/process/dashboard.rs`.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use secrecy::SecretString;
use serde_json::{Value, json};
use skyport_core::status::{DeliveryState, StatusDocument};
use skyport_runtime::config::{ApiKeySettings, Scope};
use skyport_tests::browser::{pages, publish, run_pages, screenshots};
use skyport_tests::{TestApp, delivery_request, test_settings};

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
    run_pages(
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
        run_pages(
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
