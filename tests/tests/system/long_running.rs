//! Skyport as an Azure long-running operation: `Prefer: respond-async` on a
//! POST, `Operation-Location`, 202 while the delivery runs, and the Azure
//! `status` of the Microsoft REST API guidelines, driven by the Azure SDKs'
//! own poller (Python `azure-core`) and checked by hand.

#![allow(clippy::unwrap_used)]

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use skyport_core::status::Step;
use skyport_runtime::config::Millis;
use skyport_simulator::Behaviour;
use skyport_tests::{
    TestApp, delivery_request, installed_tool, run_tool_ok, test_settings, workspace,
};
use tokio::process::Command;

#[tokio::test]
async fn an_azure_core_lro_poller_drives_deliveries_to_their_outcome() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = test_settings(dir.path());
    // Slow enough (five steps of 150 ms) for the poller to see it run.
    settings.simulator.latency_ms = Millis::new(150);
    settings.simulator.jitter_ms = Millis::new(0);
    let app = TestApp::spawn_with(settings).await;
    let refused = "azure-refused-by-drone";
    app.simulator().set_behaviour(
        Step::Drone,
        Behaviour {
            latency: Duration::from_millis(150),
            rejected_ids: Arc::new(HashSet::from([refused.to_owned()])),
            ..Behaviour::default()
        },
    );
    let mut poll = Command::new(installed_tool("venv/bin/python"));
    poll.arg(workspace().join("tests/clients/azure_poller.py"))
        .arg(&app.client.base)
        .arg(refused);
    run_tool_ok(
        "azure-core's LROPoller",
        poll,
        Duration::from_secs(120),
        dir.path(),
    )
    .await;
    app.app.stop().await.unwrap();
}

#[tokio::test]
async fn without_respond_async_a_status_is_200_and_the_switch_makes_every_one_an_operation() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = test_settings(dir.path());
    settings.simulator.latency_ms = Millis::new(2_000);
    let app = TestApp::spawn_with(settings).await;
    let plain = app
        .client
        .post_raw("application/json", delivery_request(1).to_string())
        .await;
    assert_eq!(plain.status(), 202);
    assert!(plain.headers().get("operation-location").is_none());
    let accepted: Value = plain.json().await.unwrap();
    let status_url = accepted["statusUrl"].as_str().unwrap();
    let read = app.client.status(status_url).await;
    assert_eq!(
        read.status(),
        200,
        "a plain status URL answers 200 while running"
    );
    let body: Value = read.json().await.unwrap();
    assert_eq!(body["status"], "NotStarted");
    let read = app
        .client
        .status(&format!("{status_url}&respond=async"))
        .await;
    assert_eq!(
        read.status(),
        202,
        "respond=async answers 202 while running"
    );
    assert!(read.headers().contains_key("retry-after-ms"));
    let unknown = app
        .client
        .status(&format!("{status_url}&respond=later"))
        .await;
    assert_eq!(unknown.status(), 400, "respond takes async only");
    app.app.stop().await.unwrap();

    let mut settings = test_settings(dir.path());
    settings.gateway.respond_async = true;
    settings.simulator.latency_ms = Millis::new(2_000);
    let app = TestApp::spawn_with(settings).await;
    let posted = app
        .client
        .post_raw("application/json", delivery_request(2).to_string())
        .await;
    assert_eq!(posted.status(), 202);
    let operation = posted.headers()["operation-location"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(operation.ends_with("&respond=async"), "{operation}");
    let accepted: Value = posted.json().await.unwrap();
    let read = app
        .client
        .status(accepted["statusUrl"].as_str().unwrap())
        .await;
    assert_eq!(
        read.status(),
        202,
        "with the switch every status is an operation"
    );
    app.app.stop().await.unwrap();
}
