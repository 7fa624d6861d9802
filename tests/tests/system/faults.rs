//! The workflow against misbehaving services: flaky, refusing, down, slow.

#![allow(clippy::unwrap_used)]

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::Value;
use skyport_core::status::{DeliveryState, Step, StepResult};
use skyport_runtime::config::Millis;
use skyport_simulator::Behaviour;
use skyport_tests::{TestApp, delivery_request, eventually, test_settings};

fn urls(accepted: &[skyport_gateway::routes::deliveries::resources::Accepted]) -> Vec<String> {
    accepted.iter().map(|a| a.status_url.clone()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_percent_transient_errors_everywhere_still_schedule_everything_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = test_settings(dir.path());
    settings.simulator.error_rate = 0.10;
    let app = TestApp::spawn_with(settings).await;
    let accepted = app.client.post_many(500).await;
    let documents = app
        .client
        .wait_for_terminal(&urls(&accepted), Duration::from_secs(120))
        .await;
    assert!(
        documents
            .iter()
            .all(|d| d.state == DeliveryState::Scheduled)
    );
    let retried: u32 = documents
        .iter()
        .flat_map(|d| &d.steps)
        .map(|s| s.calls - 1)
        .sum();
    let stats = app.simulator().stats();
    for service in Step::ALL {
        let counters = stats.get(service);
        assert_eq!(counters.created, 500, "{service:?}: {counters:?}");
        assert!(counters.injected_failures > 0, "{service:?}: {counters:?}");
    }
    assert!(retried > 0);
    app.app.stop().await.unwrap();
}

#[tokio::test]
async fn suspended_owners_fail_at_account_and_leave_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = test_settings(dir.path());
    // delivery_request(n) belongs to owner-(n % 97): deliveries 5, 102 and 199.
    settings.simulator.suspended_owners = vec!["owner-5".into()];
    let app = TestApp::spawn_with(settings).await;
    let accepted = app.client.post_many(200).await;
    let documents = app
        .client
        .wait_for_terminal(&urls(&accepted), Duration::from_secs(60))
        .await;
    let failed: Vec<_> = documents
        .iter()
        .filter(|d| d.state == DeliveryState::Failed)
        .collect();
    assert_eq!(failed.len(), 3, "deliveries 5, 102 and 199");
    for document in failed {
        let failure = document.failure.as_ref().unwrap();
        assert_eq!(
            (failure.step, failure.code.as_str()),
            (Step::Account, "AccountSuspended")
        );
        assert_eq!(document.steps.len(), 1);
    }
    let stats = app.simulator().stats();
    for service in [Step::Package, Step::Delivery, Step::ThirdParty, Step::Drone] {
        assert_eq!(stats.get(service).created, 197, "{service:?}");
    }
    app.app.stop().await.unwrap();
}

#[tokio::test]
async fn a_permanent_failure_at_drone_undoes_delivery_and_package() {
    let dir = tempfile::tempdir().unwrap();
    let app = TestApp::spawn(&dir).await;
    let refused: HashSet<String> = ["delivery-7", "delivery-8"].map(String::from).into();
    app.simulator().set_behaviour(
        Step::Drone,
        Behaviour {
            rejected_ids: Arc::new(refused),
            ..Behaviour::default()
        },
    );
    let accepted = app.client.post_many(20).await;
    let documents = app
        .client
        .wait_for_terminal(&urls(&accepted), Duration::from_secs(60))
        .await;
    for document in &documents {
        if document.id == "delivery-7" || document.id == "delivery-8" {
            assert_eq!(document.state, DeliveryState::Failed);
            assert_eq!(document.failure.as_ref().unwrap().step, Step::Drone);
            let result = |step| {
                document
                    .steps
                    .iter()
                    .find(|s| s.step == step)
                    .unwrap()
                    .result
            };
            assert_eq!(result(Step::Account), StepResult::Succeeded);
            assert_eq!(result(Step::Package), StepResult::Compensated);
            assert_eq!(result(Step::Delivery), StepResult::Compensated);
            assert_eq!(result(Step::ThirdParty), StepResult::Succeeded);
            assert_eq!(result(Step::Drone), StepResult::Failed);
        } else {
            assert_eq!(document.state, DeliveryState::Scheduled);
        }
    }
    let stats = app.simulator().stats();
    assert_eq!(stats.package.deleted, 2);
    assert_eq!(stats.delivery.deleted, 2);
    assert_eq!(stats.drone.rejected, 2);
    assert_eq!(stats.drone.created, 18);
    app.app.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drone_outage_pauses_intake_and_fails_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = test_settings(dir.path());
    settings.services.breaker_open_ms = Millis::new(1_000);
    let app = TestApp::spawn_with(settings).await;
    let down = Behaviour {
        error_rate: 1.0,
        ..Behaviour::default()
    };
    app.simulator().set_behaviour(Step::Drone, down);
    let accepted = app.client.post_many(300).await;
    let outage = tokio::time::Instant::now();
    let readyz = format!("{}/readyz", app.client.base);
    let mut saw_pause = false;
    while outage.elapsed() < Duration::from_secs(20) {
        let ready: Value = app
            .client
            .http
            .get(&readyz)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(
            ready["status"], "ready",
            "the gateway keeps accepting during an outage"
        );
        saw_pause |= ready["degraded"]
            .to_string()
            .contains("drone service's circuit is open");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(saw_pause, "/readyz named the open circuit");
    let during = app.simulator().stats().drone.calls;
    app.simulator()
        .set_behaviour(Step::Drone, Behaviour::default());
    let documents = app
        .client
        .wait_for_terminal(&urls(&accepted), Duration::from_secs(60))
        .await;
    let failed = documents
        .iter()
        .filter(|d| d.state != DeliveryState::Scheduled)
        .count();
    assert_eq!(failed, 0, "not one delivery failed because of the outage");
    assert_eq!(app.simulator().stats().drone.created, 300);
    // Waiting calls do not hammer a service that is down: a few probes, not thousands of retries.
    assert!(during < 1_000, "{during} drone calls during a 20 s outage");
    app.app.stop().await.unwrap();
}

#[tokio::test]
async fn a_lone_delivery_that_probes_a_long_outage_again_and_again_does_not_fail() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = test_settings(dir.path());
    settings.services.breaker_open_ms = Millis::new(50);
    settings.services.breaker_consecutive_failures = 2;
    settings.services.max_attempts = 3;
    let app = TestApp::spawn_with(settings).await;
    let down = Behaviour {
        error_rate: 1.0,
        ..Behaviour::default()
    };
    app.simulator().set_behaviour(Step::Drone, down);
    let accepted = app.client.post_delivery(&delivery_request(1)).await;
    eventually(
        "the delivery called (and probed) more often than it has attempts",
        Duration::from_secs(10),
        || async { (app.simulator().stats().drone.calls > 3).then_some(()) },
    )
    .await;
    app.simulator()
        .set_behaviour(Step::Drone, Behaviour::default());
    let document = app
        .client
        .wait_for_state(
            &accepted.status_url,
            DeliveryState::Scheduled,
            Duration::from_secs(30),
        )
        .await;
    let drone = document
        .steps
        .iter()
        .find(|s| s.step == Step::Drone)
        .unwrap();
    assert!(drone.calls > 3, "{drone:?}");
    app.app.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_delivery_calls_hold_back_only_the_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let app = TestApp::spawn(&dir).await;
    app.simulator().set_behaviour(
        Step::Delivery,
        Behaviour {
            latency: Duration::from_millis(1),
            slow_rate: 0.05,
            slow_latency: Duration::from_secs(2),
            ..Behaviour::default()
        },
    );
    let store = app.embedded();
    let tally = app.app.tally.clone();
    let accepted = app.client.post_many(1_000).await;
    // While the slow 5 % are still out, the fast 95 % finish and the checkpoint moves.
    let mut fast_done_while_slow_pending = false;
    let mut moved_while_slow_pending = false;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let terminal = tally.scheduled.load(Ordering::Relaxed);
        let covered = checkpointed(&store);
        if terminal < 1_000 {
            fast_done_while_slow_pending |= terminal >= 900;
            moved_while_slow_pending |= covered > 0;
        } else {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{terminal} of 1000 terminal"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        fast_done_while_slow_pending,
        "fast deliveries finished while slow ones were out"
    );
    assert!(
        moved_while_slow_pending,
        "the checkpoint advanced while slow calls were out"
    );
    // Once the slow ones finished, the checkpoint covers everything.
    let heads = app.published();
    eventually(
        "the checkpoint covers every event",
        Duration::from_secs(5),
        || async { (checkpointed(&store) >= heads).then_some(()) },
    )
    .await;
    let documents = app
        .client
        .wait_for_terminal(&urls(&accepted), Duration::from_secs(10))
        .await;
    assert!(
        documents
            .iter()
            .all(|d| d.state == DeliveryState::Scheduled)
    );
    app.app.stop().await.unwrap();
}

/// How many events the worker's checkpoints cover, over all partitions.
fn checkpointed(store: &skyport_embedded::EmbeddedStore) -> u64 {
    let checkpoints = store.checkpoints("skyport-worker");
    checkpoints.iter().map(|(_, offset)| offset + 1).sum()
}

#[tokio::test]
async fn a_backlog_that_stays_too_old_stops_the_worker_with_an_error_naming_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = test_settings(dir.path());
    settings.worker.allow_backlog_to_ms = Millis::new(300);
    settings.worker.backlog_grace_period_ms = Millis::new(500);
    settings.worker.shutdown_grace_period_ms = Millis::new(100);
    let app = TestApp::spawn_with(settings).await;
    app.simulator().set_behaviour(
        Step::Drone,
        Behaviour {
            latency: Duration::from_secs(3),
            ..Behaviour::default()
        },
    );
    app.client.post_delivery(&delivery_request(1)).await;
    let error = tokio::time::timeout(Duration::from_secs(20), app.app.wait())
        .await
        .expect("the worker stops by itself")
        .expect_err("a backlog breach is an error");
    let message = format!("{error:#}");
    assert!(message.contains("worker.allow_backlog_to_ms"), "{message}");
}
