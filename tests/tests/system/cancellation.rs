//! `DELETE /api/deliveryrequests/{id}`: before the drone is scheduled the
//! delivery stops at its next step; after, its steps are undone; it ends
//! Cancelled, and a second DELETE changes nothing.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use serde_json::Value;
use skyport_core::status::{DeliveryState, Step, StepResult};
use skyport_runtime::config::Millis;
use skyport_simulator::Behaviour;
use skyport_tests::{TestApp, delivery_request, eventually, test_settings};

const WAIT: Duration = Duration::from_secs(30);

#[tokio::test]
async fn a_request_cancelled_right_after_it_was_accepted_never_books_a_drone() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = test_settings(dir.path());
    // The cancellation follows its request in the same partition and is read
    // while the request is still at its first steps.
    settings.stream.partitions = 1;
    settings.simulator.latency_ms = Millis::new(100);
    settings.simulator.jitter_ms = Millis::new(0);
    let app = TestApp::spawn_with(settings).await;
    let kept = app.client.post_delivery(&delivery_request(1)).await;
    let cancelled = app.client.post_delivery(&delivery_request(2)).await;
    let response = app.client.cancel(&cancelled.status_url).await;
    assert_eq!(response.status(), 202);
    let body: Value = response.json().await.unwrap();
    assert!(
        ["Accepted", "Processing"].contains(&body["status"].as_str().unwrap()),
        "{body}"
    );
    let document = app
        .client
        .wait_for_state(&cancelled.status_url, DeliveryState::Cancelled, WAIT)
        .await;
    assert!(
        document.steps.iter().all(|s| s.step != Step::Drone),
        "{:?}",
        document.steps
    );
    for outcome in &document.steps {
        if matches!(outcome.step, Step::Package | Step::Delivery) {
            assert_eq!(outcome.result, StepResult::Compensated, "{outcome:?}");
        }
    }
    app.client
        .wait_for_state(&kept.status_url, DeliveryState::Scheduled, WAIT)
        .await;
    assert_eq!(
        app.simulator().stats().drone.created,
        1,
        "only the kept delivery booked a drone"
    );
    app.app.stop().await.unwrap();
}

#[tokio::test]
async fn a_running_delivery_stops_at_its_next_step_and_undoes_what_it_did() {
    let dir = tempfile::tempdir().unwrap();
    let app = TestApp::spawn(&dir).await;
    // Third-party is slow, so the cancellation arrives after Package and Delivery succeeded.
    app.simulator().set_behaviour(
        Step::ThirdParty,
        Behaviour {
            latency: Duration::from_millis(800),
            ..Behaviour::default()
        },
    );
    let accepted = app.client.post_delivery(&delivery_request(1)).await;
    eventually("the delivery was created", WAIT, || async {
        (app.simulator().stats().delivery.created > 0).then_some(())
    })
    .await;
    assert_eq!(app.client.cancel(&accepted.status_url).await.status(), 202);
    let document = app
        .client
        .wait_for_state(&accepted.status_url, DeliveryState::Cancelled, WAIT)
        .await;
    let result = |step| {
        document
            .steps
            .iter()
            .find(|s| s.step == step)
            .map(|s| s.result)
    };
    assert_eq!(result(Step::Package), Some(StepResult::Compensated));
    assert_eq!(result(Step::Delivery), Some(StepResult::Compensated));
    assert_eq!(result(Step::Drone), None, "no drone was booked");
    let stats = app.simulator().stats();
    assert_eq!((stats.package.deleted, stats.delivery.deleted), (1, 1));
    assert_eq!(stats.drone.created, 0);
    app.app.stop().await.unwrap();
}

#[tokio::test]
async fn a_scheduled_delivery_is_undone_then_cancelled_and_a_second_delete_is_harmless() {
    let dir = tempfile::tempdir().unwrap();
    let app = TestApp::spawn(&dir).await;
    let accepted = app.client.post_delivery(&delivery_request(1)).await;
    app.client
        .wait_for_state(&accepted.status_url, DeliveryState::Scheduled, WAIT)
        .await;
    let response = app.client.cancel(&accepted.status_url).await;
    assert_eq!(response.status(), 202);
    let document = app
        .client
        .wait_for_state(&accepted.status_url, DeliveryState::Cancelled, WAIT)
        .await;
    assert!(document.drone_id.is_none());
    for step in [Step::Package, Step::Delivery, Step::Drone] {
        let outcome = document.steps.iter().find(|s| s.step == step).unwrap();
        assert_eq!(outcome.result, StepResult::Compensated, "{step:?}");
    }
    let stats = app.simulator().stats();
    assert_eq!(
        (
            stats.package.deleted,
            stats.delivery.deleted,
            stats.drone.deleted
        ),
        (1, 1, 1)
    );
    let published = app.published();
    let again = app.client.cancel(&accepted.status_url).await;
    assert_eq!(again.status(), 202);
    let body: Value = again.json().await.unwrap();
    assert_eq!(body["status"], "Cancelled");
    assert_eq!(
        app.published(),
        published,
        "a second cancellation publishes nothing for the worker to do"
    );
    let stats = app.simulator().stats();
    assert_eq!(
        (
            stats.package.deleted,
            stats.delivery.deleted,
            stats.drone.deleted
        ),
        (1, 1, 1)
    );
    app.app.stop().await.unwrap();
}

#[tokio::test]
async fn a_failed_delivery_cannot_be_cancelled_and_an_unknown_one_is_not_found() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = test_settings(dir.path());
    settings.simulator.suspended_owners = vec!["owner-1".into()];
    let app = TestApp::spawn_with(settings).await;
    let accepted = app.client.post_delivery(&delivery_request(1)).await;
    app.client
        .wait_for_state(&accepted.status_url, DeliveryState::Failed, WAIT)
        .await;
    let response = app.client.cancel(&accepted.status_url).await;
    assert_eq!(response.status(), 409);
    let problem: Value = response.json().await.unwrap();
    assert_eq!(problem["code"], "Conflict");
    let unknown = app
        .client
        .http
        .delete(format!(
            "{}/api/deliveryrequests/no-such-delivery",
            app.client.base
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(unknown.status(), 404);
    app.app.stop().await.unwrap();
}
