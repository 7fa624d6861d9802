//! The operators' routes, on the embedded store and on Cosmos DB (the SDK's
//! emulator): a redrive runs Failed deliveries again in a new attempt epoch
//! (and publishes dead-lettered events again), a repeated one changes
//! nothing; thousands go a page at a time, each queued once, following
//! `next`; a forged cursor is refused; a resend delivers callbacks that were
//! dead-lettered while their receiver was down. And the dead-letter store's
//! contract (paged reads) on both adapters.

#![allow(clippy::unwrap_used)]

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::{StreamExt, stream};
use secrecy::SecretString;
use serde_json::{Value, json};
use skyport_azure::cosmos::emulator;
use skyport_core::event::{DeliveryRequested, Event};
use skyport_core::ports::{DeadLetter, DeadLetterStore, Lane, Precondition};
use skyport_core::request::DeliveryRequest;
use skyport_core::status::{DeliveryState, Failure, StatusDocument, Step, StepOutcome, StepResult};
use skyport_embedded::EmbeddedStore;
use skyport_gateway::receipt::Receipts;
use skyport_runtime::config::{ApiKeySettings, CosmosSettings, Millis, Scope, Settings};
use skyport_simulator::Behaviour;
use skyport_tests::dead_letters_contract::dead_letter_store_contract;
use skyport_tests::webhooks::{self, Receiver, post_with_callbacks, verify_with_python};
use skyport_tests::{Client, TestApp, delivery_request, eventually, test_settings};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

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
    dead_letters
        .put(dead_letter(5_000, 1_000_000))
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
        store.events(None, 10).await.unwrap().is_empty(),
        "redriven, then forgotten"
    );
    let (_, again) = operate(&ops, "/admin/redrive", &json!({"deadLetters": true})).await;
    assert_eq!(again["deadLetters"], 0);
    app.app.stop().await.unwrap();
}

/// Posts `body` to `path?query`, then again with each answer's `next` as
/// `cursor` until an answer has none; answers every answer. Each must be a
/// 200 or 202 of at most 512 bytes, however much the operation covers.
async fn follow(client: &Client, path: &str, body: &Value, query: &str) -> Vec<Value> {
    let mut answers = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut url = format!("{}{path}?{query}", client.base);
        if let Some(cursor) = &cursor {
            url.push_str(&format!("&cursor={cursor}"));
        }
        let response = client.http.post(url).json(body).send().await.unwrap();
        let status = response.status().as_u16();
        let bytes = response.bytes().await.unwrap();
        let answer: Value = serde_json::from_slice(&bytes).unwrap();
        assert!(matches!(status, 200 | 202), "{status}: {answer}");
        assert!(bytes.len() <= 512, "an answer of {} bytes", bytes.len());
        cursor = answer["next"].as_str().map(str::to_owned);
        answers.push(answer);
        if cursor.is_none() {
            return answers;
        }
        assert!(answers.len() < 1_000, "an operation that never ends");
    }
}

/// The sum of `field` over `answers`.
fn total(answers: &[Value], field: &str) -> u64 {
    answers
        .iter()
        .map(|answer| answer[field].as_u64().unwrap())
        .sum()
}

/// A delivery as the worker leaves one whose Package step failed at `at`,
/// with its request, made by `portal`.
fn failed_document(n: usize, at: OffsetDateTime) -> StatusDocument {
    let request: DeliveryRequest = serde_json::from_value(delivery_request(n)).unwrap();
    StatusDocument {
        state: DeliveryState::Failed,
        steps: vec![StepOutcome {
            step: Step::Package,
            result: StepResult::Failed,
            at,
            calls: 1,
            detail: None,
        }],
        failure: Some(Failure {
            step: Step::Package,
            code: "Rejected".into(),
            message: "the package was refused".into(),
        }),
        owner_id: Some(request.owner_id.clone()),
        principal: Some("portal".into()),
        request: Some(request),
        lane: Lane::Normal,
        updated_at: at,
        attempt: 1,
        ..StatusDocument::accepted(format!("delivery-{n}"), at)
    }
}

/// An event dead-lettered at `offset` of partition 0: a delivery request
/// for `delivery-{n}` that an older worker could not read.
fn dead_letter(n: usize, offset: u64) -> DeadLetter {
    let event = Event::DeliveryRequested(Box::new(DeliveryRequested {
        delivery_id: format!("delivery-{n}"),
        accepted_at: OffsetDateTime::now_utc(),
        traceparent: None,
        idempotency_key: None,
        principal: Some("portal".into()),
        epoch: 0,
        redrive: None,
        request: serde_json::from_value(delivery_request(n)).unwrap(),
    }));
    DeadLetter {
        partition: 0,
        offset,
        reason: "schema version 2 is not supported (this build reads version 1)".into(),
        payload: event.encode().into(),
        at: OffsetDateTime::now_utc(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redrive_of_thousands_goes_a_page_at_a_time_and_queues_each_once() {
    redrive_in_pages(false, 3_000, 250).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redrive_on_cosmos_goes_a_page_at_a_time_and_queues_each_once() {
    redrive_in_pages(true, 400, 70).await;
}

/// `failed` Failed deliveries and 25 dead-lettered events, redriven `limit`
/// a call.
async fn redrive_in_pages(cosmos: bool, failed: usize, limit: usize) {
    const LETTERS: usize = 25;
    let dir = tempfile::tempdir().unwrap();
    let mut settings = operator_settings(dir.path());
    // The worker begins one redrive a second, so that the deliveries stay
    // queued while the test looks (and the machine is not busy running them).
    settings.worker.redrive_per_s = 1;
    let app = spawn(settings, cosmos).await;
    let ops = app.client.with_header("x-api-key", ADMIN);
    let status = Arc::clone(&app.app.backends.ports.status);
    let dead_letters = Arc::clone(&app.app.backends.ports.dead_letters);
    let failed_at = OffsetDateTime::now_utc();
    stream::iter(0..failed)
        .map(|n| {
            let status = Arc::clone(&status);
            async move {
                status
                    .put(&failed_document(n, failed_at), Precondition::IfNoneMatch)
                    .await
                    .unwrap();
            }
        })
        .buffer_unordered(64)
        .collect::<Vec<()>>()
        .await;
    for k in 0..LETTERS {
        let letter = dead_letter(failed + k, 1_000_000 + k as u64);
        dead_letters.put(letter).await.unwrap();
    }
    let since = (failed_at - Duration::from_secs(60))
        .format(&Rfc3339)
        .unwrap();
    let body = json!({"failedSince": since, "deadLetters": true, "reason": "outage"});
    let dry_query = format!("dryRun=true&limit={limit}");
    // On Cosmos DB the listing follows the status a little later.
    let dry = eventually("a dry run finds every delivery", WAIT, || async {
        let answers = follow(&ops, "/admin/redrive", &body, &dry_query).await;
        (total(&answers, "matched") == failed as u64).then_some(answers)
    })
    .await;
    assert_eq!(total(&dry, "queued"), failed as u64);
    assert_eq!(total(&dry, "deadLetters"), LETTERS as u64);
    let published = app.published();
    let answers = follow(&ops, "/admin/redrive", &body, &format!("limit={limit}")).await;
    println!(
        "{failed} Failed deliveries and {LETTERS} dead letters redriven in {} calls of at most {limit}",
        answers.len()
    );
    assert!(
        answers.len() >= (failed + LETTERS).div_ceil(limit),
        "{}",
        answers.len()
    );
    for answer in &answers {
        let matched = total(std::slice::from_ref(answer), "matched")
            + total(std::slice::from_ref(answer), "deadLetters");
        assert!(matched <= limit as u64, "{answer}");
        assert_eq!(answer["dryRun"], false);
    }
    assert_eq!(total(&answers, "queued"), failed as u64);
    assert_eq!(total(&answers, "alreadyQueued"), 0);
    assert_eq!(total(&answers, "deadLetters"), LETTERS as u64);
    assert_eq!(
        app.published() - published,
        (failed + LETTERS) as u64,
        "each one published once"
    );
    for n in 0..failed {
        let document = status
            .get(&format!("delivery-{n}"))
            .await
            .unwrap()
            .unwrap()
            .document;
        let queued = document
            .redrive
            .as_ref()
            .is_some_and(|queued| queued.epoch == 1);
        assert!(queued || document.epoch == 1, "{document:?}");
    }
    assert!(dead_letters.events(None, 10).await.unwrap().is_empty());
    // The same redrive again queues nothing and publishes nothing.
    let again = follow(&ops, "/admin/redrive", &body, "limit=10000").await;
    assert_eq!(total(&again, "queued"), 0, "{again:?}");
    assert_eq!(app.published() - published, (failed + LETTERS) as u64);
    app.app.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_that_moved_on_since_it_failed_is_not_redriven_on_cosmos() {
    let dir = tempfile::tempdir().unwrap();
    let app = TestApp::spawn_on_cosmos(operator_settings(dir.path())).await;
    let ops = app.client.with_header("x-api-key", ADMIN);
    let status = Arc::clone(&app.app.backends.ports.status);
    let failed = failed_document(0, OffsetDateTime::now_utc());
    let etag = status
        .put(&failed, Precondition::IfNoneMatch)
        .await
        .unwrap();
    once_found(&ops, "/admin/redrive", &json!({}), "matched", 1).await;
    // A redrive the worker began: Processing in epoch 1.
    let begun = StatusDocument {
        state: DeliveryState::Processing,
        epoch: 1,
        steps: Vec::new(),
        failure: None,
        updated_at: OffsetDateTime::now_utc(),
        ..failed
    };
    status
        .put(&begun, Precondition::IfMatch(etag))
        .await
        .unwrap();
    let published = app.published();
    let (status_code, answer) = operate(&ops, "/admin/redrive", &json!({})).await;
    assert_eq!(status_code, 202, "{answer}");
    assert_eq!(answer["matched"], 0, "{answer}");
    assert_eq!(app.published(), published, "nothing published");
    let stored = status.get("delivery-0").await.unwrap().unwrap().document;
    assert_eq!(stored, begun, "left as the worker wrote it");
    app.app.stop().await.unwrap();
}

#[tokio::test]
async fn a_forged_cursor_or_a_limit_out_of_range_is_a_400() {
    let dir = tempfile::tempdir().unwrap();
    let app = spawn(operator_settings(dir.path()), false).await;
    let ops = app.client.with_header("x-api-key", ADMIN);
    let redrive = "/admin/redrive";
    let resend = "/admin/callbacks/resend";
    let nothing = json!({});
    let cases = [
        (redrive, "cursor=not%20base64!", &nothing),
        // "r.d.x.delivery-1": a time that is not a number.
        (redrive, "cursor=ci5kLnguZGVsaXZlcnktMQ", &nothing),
        // "r.d.1.bad id": not a delivery id.
        (redrive, "cursor=ci5kLjEuYmFkIGlk", &nothing),
        // "c.d.1.delivery-1": a resend's, not a redrive's.
        (redrive, "cursor=Yy5kLjEuZGVsaXZlcnktMQ", &nothing),
        // "r.l.1.2": in the dead letters, which this body does not ask for.
        (redrive, "cursor=ci5sLjEuMg", &nothing),
        (redrive, "limit=0", &nothing),
        (redrive, "limit=10001", &nothing),
        (redrive, "limit=-1", &nothing),
        (redrive, "page=2", &nothing),
        // "r.d.1.delivery-1": a redrive's, not a resend's.
        (resend, "cursor=ci5kLjEuZGVsaXZlcnktMQ", &nothing),
        // "c.l": a resend has no dead letters.
        (resend, "cursor=Yy5s", &nothing),
    ];
    let named = json!({"ids": ["delivery-1"]});
    for (path, query, body) in cases.into_iter().chain([
        (redrive, "limit=5", &named),
        (resend, "cursor=Yy5kLjEuZGVsaXZlcnktMQ", &named),
    ]) {
        let response = ops
            .http
            .post(format!("{}{path}?{query}", ops.base))
            .json(body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 400, "{path}?{query}");
        assert_eq!(
            response.headers()["content-type"],
            "application/problem+json",
            "{path}?{query}"
        );
    }
    // A token the redrive gave out in the dead letters goes on there.
    let (status, answer) = operate(
        &ops,
        "/admin/redrive?cursor=ci5sLjEuMg",
        &json!({"deadLetters": true}),
    )
    .await;
    assert_eq!(status, 202, "{answer}");
    assert_eq!(
        (answer["matched"].clone(), answer["deadLetters"].clone()),
        (json!(0), json!(0))
    );
    app.app.stop().await.unwrap();
}

#[tokio::test]
async fn the_embedded_store_keeps_the_dead_letter_contract() {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(&test_settings(dir.path()).embedded, 1).unwrap();
    dead_letter_store_contract(store).await;
}

#[tokio::test]
async fn cosmos_keeps_the_dead_letter_contract() {
    let settings = CosmosSettings {
        bulk_max_wait_ms: Millis::new(10),
        ..CosmosSettings::default()
    };
    let (store, _wire) = emulator::open(&settings, false).await.unwrap();
    dead_letter_store_contract(store.clone()).await;
    store.close().await;
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
    // 20 a call: 20, 20, then the last 10 and no `next`.
    let answers = follow(&app.client, "/admin/callbacks/resend", &window, "limit=20").await;
    let resent: Vec<&Value> = answers.iter().map(|answer| &answer["resent"]).collect();
    assert_eq!(resent, [20, 20, 10], "{answers:?}");
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
