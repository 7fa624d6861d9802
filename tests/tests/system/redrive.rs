//! The operators' routes, on the embedded store and on Cosmos DB (the SDK's
//! emulator): a redrive runs Failed deliveries again in a new attempt epoch
//! (and publishes dead-lettered events again), a repeated one changes
//! nothing; a resend delivers callbacks that were dead-lettered while their
//! receiver was down.

#![allow(clippy::unwrap_used)]

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use secrecy::SecretString;
use serde_json::{Value, json};
use skyport_core::event::{DeliveryRequested, Event};
use skyport_core::ports::DeadLetter;
use skyport_core::ports::Lane;
use skyport_core::status::{DeliveryState, Step};
use skyport_gateway::receipt::Receipts;
use skyport_runtime::config::{ApiKeySettings, Millis, Scope, Settings};
use skyport_simulator::Behaviour;
use skyport_tests::webhooks::{self, Receiver, post_with_callbacks, verify_with_python};
use skyport_tests::{Client, TestApp, delivery_request, eventually, test_settings};
use time::OffsetDateTime;

const ADMIN: &str = "ops-key-0123456789abcdef0123456789abcd";
const WRITER: &str = "portal-key-0123456789abcdef0123456789a";
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const WAIT: Duration = Duration::from_secs(60);
const FAILED: usize = 200;

/// Auth on: a writer, and an operator with the admin scope.
fn operator_settings(dir: &std::path::Path) -> Settings {
    let mut settings = test_settings(dir);
    let auth = &mut settings.gateway.auth;
    auth.enabled = Some(true);
    for (name, key, scopes) in [
        ("portal", WRITER, Scope::all()),
        ("ops", ADMIN, vec![Scope::Read, Scope::Write, Scope::Admin]),
    ] {
        let key = SecretString::from(key);
        auth.api_keys
            .insert(name.into(), ApiKeySettings { key, scopes });
    }
    settings
}

async fn operate(client: &Client, path: &str, body: &Value) -> (u16, Value) {
    let response = client
        .http
        .post(format!("{}{path}", client.base))
        .json(body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// The app on `settings`, with status on Cosmos DB when `cosmos`; the listing
/// view there follows the status container within a poll.
async fn spawn(mut settings: Settings, cosmos: bool) -> TestApp {
    if cosmos {
        settings.change_feed.poll_interval_ms = Millis::new(100);
        TestApp::spawn_on_cosmos(settings).await
    } else {
        TestApp::spawn_with(settings).await
    }
}

/// Answers `path` with `body` once (a dry run of) it finds `want` in `field`:
/// on Cosmos DB the listing it searches follows the status a little later.
async fn once_found(client: &Client, path: &str, body: &Value, field: &str, want: usize) -> Value {
    eventually(&format!("{path} finds {want}"), WAIT, || async {
        let (status, answer) = operate(client, &format!("{path}?dryRun=true"), body).await;
        assert_eq!(status, 200, "{answer}");
        (answer[field] == want).then_some(answer)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redrive_after_an_outage_schedules_every_delivery_it_failed_once() {
    redrive_after_an_outage(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redrive_on_cosmos_schedules_every_delivery_it_failed_once() {
    redrive_after_an_outage(true).await;
}

async fn redrive_after_an_outage(cosmos: bool) {
    let dir = tempfile::tempdir().unwrap();
    let app = spawn(operator_settings(dir.path()), cosmos).await;
    let portal = app.client.with_header("x-api-key", WRITER);
    let ops = app.client.with_header("x-api-key", ADMIN);
    // The Package service refuses every package (a permanent 422) for a while.
    let outage_began = OffsetDateTime::now_utc();
    let refused = (0..FAILED).map(|n| format!("package-{n}")).collect();
    app.simulator().set_behaviour(
        Step::Package,
        Behaviour {
            rejected_ids: Arc::new(refused),
            ..Behaviour::default()
        },
    );
    let mut urls = Vec::new();
    for n in 0..FAILED {
        urls.push(portal.post_delivery(&delivery_request(n)).await.status_url);
    }
    let documents = portal.wait_for_terminal(&urls, WAIT).await;
    assert!(documents.iter().all(|d| d.state == DeliveryState::Failed));
    app.simulator()
        .set_behaviour(Step::Package, Behaviour::default());
    let before = app.simulator().stats();

    let filter = json!({"failedStep": "Package", "failedSince": outage_began.format(&time::format_description::well_known::Rfc3339).unwrap(), "reason": "Package outage"});
    let (status, _) = operate(&portal, "/admin/redrive", &filter).await;
    assert_eq!(status, 403, "the admin scope is needed");
    let dry = once_found(&ops, "/admin/redrive", &filter, "matched", FAILED).await;
    assert_eq!(dry["queued"], FAILED, "{dry}");
    let (status, answer) = operate(&ops, "/admin/redrive", &filter).await;
    assert_eq!(status, 202, "{answer}");
    assert_eq!(answer["queued"], 200, "{answer}");

    let mut scheduled = Vec::new();
    for url in &urls {
        scheduled.push(
            portal
                .wait_for_state(url, DeliveryState::Scheduled, WAIT)
                .await,
        );
    }
    for document in &scheduled {
        assert_eq!(document.epoch, 1);
        assert_eq!(document.epochs.len(), 1, "{document:?}");
        let epoch = &document.epochs[0];
        assert_eq!(epoch.reason, "Package outage");
        assert_eq!(epoch.requested_by.as_deref(), Some("ops"));
        assert_eq!(epoch.after.as_ref().unwrap().step, Step::Package);
        assert!(document.failure.is_none());
        assert!(document.redrive.is_none());
    }
    let after = app.simulator().stats();
    for service in [Step::Package, Step::Delivery, Step::Drone] {
        let (was, now) = (before.get(service), after.get(service));
        assert_eq!(
            now.created - was.created,
            FAILED as u64,
            "{service:?}: one booking per delivery in the epoch that stood"
        );
        assert_eq!(now.conflicts, 0, "{service:?}");
    }

    // Nothing is Failed any more: the same redrive again changes nothing.
    let (status, again) = operate(&ops, "/admin/redrive", &filter).await;
    assert_eq!(status, 202);
    assert_eq!(again["matched"], 0, "{again}");
    assert_eq!(app.simulator().stats().drone.created, after.drone.created);

    // An event an older worker could not read, dead-lettered, runs once redriven.
    let store = app.embedded();
    let dead_letters = Arc::clone(&app.app.backends.ports.dead_letters);
    let request = delivery_request(5_000);
    let event = Event::DeliveryRequested(Box::new(DeliveryRequested {
        delivery_id: "delivery-5000".into(),
        accepted_at: OffsetDateTime::now_utc(),
        traceparent: None,
        idempotency_key: None,
        principal: Some("portal".into()),
        epoch: 0,
        redrive: None,
        request: serde_json::from_value(request).unwrap(),
    }));
    dead_letters
        .put(DeadLetter {
            partition: 0,
            offset: 1_000_000,
            reason: "schema version 2 is not supported (this build reads version 1)".into(),
            payload: event.encode().into(),
            at: OffsetDateTime::now_utc(),
        })
        .await
        .unwrap();
    let (status, answer) = operate(&ops, "/admin/redrive", &json!({"deadLetters": true})).await;
    assert_eq!(status, 202);
    assert_eq!(answer["deadLetters"], 1, "{answer}");
    let receipt = Receipts::new(&[store.receipt_key()]).sign(
        "delivery-5000",
        OffsetDateTime::now_utc(),
        Lane::Normal,
        Some("portal"),
    );
    portal
        .wait_for_state(
            &format!("/api/deliveryrequests/delivery-5000/status?receipt={receipt}"),
            DeliveryState::Scheduled,
            WAIT,
        )
        .await;
    assert!(
        store.dead_letters().await.unwrap().is_empty(),
        "redriven, then forgotten"
    );
    let (_, again) = operate(&ops, "/admin/redrive", &json!({"deadLetters": true})).await;
    assert_eq!(again["deadLetters"], 0);
    app.app.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resend_delivers_the_callbacks_dead_lettered_while_their_receiver_was_down() {
    resend_after_an_outage(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resend_on_cosmos_delivers_the_callbacks_dead_lettered_while_their_receiver_was_down() {
    resend_after_an_outage(true).await;
}

async fn resend_after_an_outage(cosmos: bool) {
    const CALLBACKS: usize = 50;
    let dir = tempfile::tempdir().unwrap();
    let down_for = Duration::from_secs(6);
    let receiver = Receiver::start(
        IpAddr::V4(Ipv4Addr::LOCALHOST),
        webhooks::Behaviour::UnavailableUntil(Instant::now() + down_for),
    )
    .await;
    let mut settings = test_settings(dir.path());
    // With auth off, the operators' routes only on purpose.
    settings.gateway.admin_without_auth = true;
    settings.callbacks.secrets = vec![SecretString::from(SECRET)];
    settings.callbacks.allow = vec!["127.0.0.1".into()];
    settings.callbacks.backoff_initial_ms = Millis::new(100);
    settings.callbacks.backoff_max_ms = Millis::new(500);
    settings.callbacks.retry_for_ms = Millis::new(1_000);
    settings.change_feed.poll_interval_ms = Millis::new(100);
    let app = spawn(settings, cosmos).await;
    let window_began = OffsetDateTime::now_utc();
    let urls = post_with_callbacks(&app.client, CALLBACKS, None, |n| {
        receiver.url("127.0.0.1", &format!("d{n}"))
    })
    .await;
    eventually("every callback is dead-lettered", WAIT, || async {
        let mut dead = 0;
        for url in &urls {
            let document: Value = app.client.status(url).await.json().await.unwrap();
            if document["callback"]["state"] == "DeadLettered" {
                dead += 1;
            }
        }
        (dead == CALLBACKS).then_some(())
    })
    .await;
    let refused = receiver.received().len();
    tokio::time::sleep(down_for).await;
    let window = json!({"since": window_began.format(&time::format_description::well_known::Rfc3339).unwrap()});
    once_found(
        &app.client,
        "/admin/callbacks/resend",
        &window,
        "resent",
        CALLBACKS,
    )
    .await;
    let (status, answer) = operate(&app.client, "/admin/callbacks/resend", &window).await;
    assert_eq!(status, 202, "{answer}");
    assert_eq!(answer["resent"], CALLBACKS, "{answer}");
    eventually("every callback is delivered", WAIT, || async {
        let mut delivered = 0;
        for url in &urls {
            let document: Value = app.client.status(url).await.json().await.unwrap();
            if document["callback"]["state"] == "Delivered" {
                delivered += 1;
            }
        }
        (delivered == CALLBACKS).then_some(())
    })
    .await;
    let received = receiver.received();
    let resent = &received[refused..];
    let ids: HashSet<&str> = resent.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids.len(), CALLBACKS, "each callback once more");
    assert_eq!(
        verify_with_python(SECRET, resent),
        resent.len(),
        "signed as before"
    );
    app.app.stop().await.unwrap();
    receiver.stop().await;
}
