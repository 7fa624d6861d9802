//! Only you can touch your delivery: with auth on, Bob — holding Alice's
//! receipts, ids, request bodies and `Idempotency-Key`s, as anyone who sees
//! a forwarded callback, a log or a support ticket may — tries every route
//! that reads or changes a delivery (a POST with a taken id, status, a held
//! read, the status page, cancel, reschedule, listing, redrive, resend, the
//! reports, the dashboard's data), and a hostile `DeliveryRequested` for her
//! id is written straight to the stream, as a gateway of an earlier build
//! let through. Each is answered as an unknown id is (or refused for its
//! scope) and leaves her deliveries, their bookings and their callbacks as
//! they were — on the embedded store and on Cosmos DB (the emulator).

#![allow(clippy::unwrap_used)]

use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::time::Duration;

use secrecy::SecretString;
use serde_json::{Value, json};
use skyport_core::event::{DeliveryRequested, Event};
use skyport_core::ports::Lane;
use skyport_core::request::DeliveryRequest;
use skyport_core::status::{DeliveryState, StatusDocument};
use skyport_runtime::config::{Millis, Scope, Seconds, Settings};
use skyport_tests::webhooks::{Behaviour, Receiver};
use skyport_tests::{Client, TestApp, eventually, test_settings, with_api_keys};
use time::OffsetDateTime;

const ALICE: &str = "alice-key-0123456789abcdef0123456789ab";
const BOB: &str = "bob-key-0123456789abcdef0123456789abcd";
const OPS: &str = "ops-key-0123456789abcdef0123456789abcd";
const LOOPBACK: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
const WAIT: Duration = Duration::from_secs(60);
/// How long a reservation holds a name here: short, so that a test sees
/// the status keep a name taken after its reservation is gone.
const RESERVED_S: u64 = 2;

/// Auth on with Alice's and Bob's keys (read and write) and an operator's
/// (read and admin); callbacks to loopback; reservations of seconds.
fn tenancy_settings(dir: &Path) -> Settings {
    let mut settings = test_settings(dir);
    with_api_keys(
        &mut settings,
        &[
            ("alice", ALICE, &[Scope::Read, Scope::Write]),
            ("bob", BOB, &[Scope::Read, Scope::Write]),
            ("ops", OPS, &[Scope::Read, Scope::Admin]),
        ],
    );
    settings.callbacks.secrets = vec![SecretString::from("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")];
    settings.callbacks.allow = vec!["127.0.0.1".into()];
    settings.change_feed.poll_interval_ms = Millis::new(100);
    settings.gateway.idempotency_retention_s = Seconds::new(RESERVED_S);
    settings.worker.allow_backlog_to_ms = Millis::new(RESERVED_S * 1000);
    settings.store.status_retention_s = Seconds::new(24 * 60 * 60);
    settings
}

/// A request body of `who`'s, with its callback to `callback`.
fn body(who: &str, n: usize, callback: &str) -> Value {
    json!({
        "ownerId": format!("{who}-owner"),
        "pickupLocation": format!("47.{n:04},-122.1368"),
        "pickupTime": "2030-01-01T10:00:00Z",
        "deadline": "2030-01-01T12:00:00Z",
        "dropoffLocation": "47.6101,-122.2015",
        "packageInfo": {"packageId": format!("{who}-package-{n}"), "size": "Small", "weight": 1.5},
        "callbackUrl": callback,
    })
}

/// One of Alice's deliveries, as she holds it.
#[derive(Debug, Clone)]
struct Hers {
    id: String,
    receipt: String,
    status_url: String,
    /// The body she posted (with `deliveryId` when she named it).
    body: Value,
    key: Option<String>,
}

/// The answer to a route of a delivery nobody may see: exactly an unknown id's.
async fn assert_unknown(response: reqwest::Response, id: &str, what: &str) {
    assert_eq!(response.status(), 404, "{what}");
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json",
        "{what}"
    );
    assert!(response.headers().get("retry-after").is_none(), "{what}");
    assert!(response.headers().get("etag").is_none(), "{what}");
    let problem: Value = response.json().await.unwrap();
    assert_eq!(problem["code"], "NotFound", "{what}: {problem}");
    assert_eq!(
        problem["detail"],
        format!("no delivery request {id} is known"),
        "{what}: {problem}"
    );
}

fn url(client: &Client, path: &str) -> String {
    format!("{}{path}", client.base)
}

/// Every route Bob can try on one of Alice's deliveries with her receipt and
/// his own key: each answered as the unknown id `unknown` (with a receipt
/// Bob signed for himself) is.
async fn bob_reads_and_changes_nothing(bob: &Client, hers: &Hers, unknown: &(String, String)) {
    let (id, receipt) = (&hers.id, &hers.receipt);
    let status = url(
        bob,
        &format!("/api/deliveryrequests/{id}/status?receipt={receipt}"),
    );
    let resource = url(
        bob,
        &format!("/api/deliveryrequests/{id}?receipt={receipt}"),
    );
    // The same routes for an id nobody used, for the shape of the answer.
    let (never, never_receipt) = unknown;
    let read = |id: &str, receipt: &str| {
        let status = url(
            bob,
            &format!("/api/deliveryrequests/{id}/status?receipt={receipt}"),
        );
        async move { bob.http.get(status).send().await.unwrap() }
    };
    assert_unknown(read(never, never_receipt).await, never, "unknown").await;

    assert_unknown(bob.http.get(&status).send().await.unwrap(), id, "status").await;
    let held = tokio::time::Instant::now();
    let response = bob
        .http
        .get(format!("{status}&wait=5"))
        .header("if-none-match", "*")
        .send()
        .await
        .unwrap();
    assert!(
        held.elapsed() < Duration::from_secs(4),
        "a held read was held"
    );
    assert_unknown(response, id, "held read").await;
    let response = bob
        .http
        .get(&status)
        .header("prefer", "wait=5")
        .send()
        .await
        .unwrap();
    assert_unknown(response, id, "Prefer: wait").await;
    let response = bob
        .http
        .get(format!("{status}&respond=async"))
        .send()
        .await
        .unwrap();
    assert_unknown(response, id, "long-running operation").await;
    let page = bob
        .http
        .get(&status)
        .header("accept", "text/html")
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 404, "status page");
    assert!(
        !page
            .text()
            .await
            .unwrap()
            .contains(&hers.body["ownerId"].as_str().unwrap().to_owned()),
        "the status page shows nothing of hers"
    );
    assert_unknown(
        bob.http.delete(&resource).send().await.unwrap(),
        id,
        "cancel",
    )
    .await;
    let patch = bob
        .http
        .patch(&resource)
        .header("content-type", "application/merge-patch+json")
        .body(r#"{"pickupTime":"2030-01-01T11:00:00Z","deadline":"2030-01-01T13:00:00Z"}"#)
        .send()
        .await
        .unwrap();
    assert_unknown(patch, id, "reschedule").await;
    // Her receipt for another id, and his own receipt for her id, open nothing.
    assert_unknown(read(id, never_receipt).await, id, "his receipt").await;
    // No credential at all: asked for one, told nothing.
    let anonymous = reqwest::get(&status).await.unwrap();
    assert_eq!(anonymous.status(), 401);
    assert!(!anonymous.text().await.unwrap().contains(id.as_str()));
}

/// Bob's POSTs naming her delivery: by its id (the gateway's shape, or her
/// chosen one), by her body replayed, by her key. None is a 202 for her
/// delivery; a taken name is told only that it is taken.
async fn bob_takes_no_name(bob: &Client, hers: &Hers, bobs_hook: &str) {
    let mut replay = hers.body.clone();
    replay["deliveryId"] = Value::String(hers.id.clone());
    let mut his = body("bob", 900, bobs_hook);
    his["deliveryId"] = Value::String(hers.id.clone());
    for (what, attempt) in [("his body", his), ("her body", replay)] {
        let response = bob.post_raw("application/json", attempt.to_string()).await;
        let status = response.status().as_u16();
        let problem: Value = response.json().await.unwrap();
        if hers.id.starts_with("sp-") || hers.id.starts_with("k-") {
            assert_eq!(status, 422, "{what}: {problem}");
            assert_eq!(problem["errors"][0]["field"], "deliveryId", "{problem}");
        } else {
            assert_eq!(status, 409, "{what}: {problem}");
            assert_eq!(
                problem["detail"],
                format!(
                    "deliveryId {} is taken; a retry must repeat its first request exactly",
                    hers.id
                ),
                "{what}"
            );
        }
        assert!(problem.get("receipt").is_none() && problem.get("statusUrl").is_none());
    }
    // Her Idempotency-Key is a name in her namespace only: his is another delivery.
    if let Some(key) = &hers.key {
        let response = bob
            .http
            .post(url(bob, "/api/deliveryrequests"))
            .header("content-type", "application/json")
            .header("idempotency-key", key)
            .body(body("bob", 901, bobs_hook).to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 202);
        let accepted: Value = response.json().await.unwrap();
        assert_ne!(accepted["deliveryId"], hers.id.as_str());
    }
}

/// What Alice's status reads now, as she reads it.
async fn her_documents(alice: &Client, hers: &[Hers]) -> Vec<Value> {
    let mut documents = Vec::new();
    for delivery in hers {
        let response = alice.status(&delivery.status_url).await;
        assert_eq!(response.status(), 200);
        let mut document: Value = response.json().await.unwrap();
        // What the pacing computes at each read, not what is stored.
        document.as_object_mut().unwrap().remove("links");
        documents.push(document);
    }
    documents
}

/// The scenario, on whichever store `app` runs.
async fn another_principal_touches_nothing(app: TestApp) {
    let alice = app.client.with_header("x-api-key", ALICE);
    let bob = app.client.with_header("x-api-key", BOB);
    let ops = app.client.with_header("x-api-key", OPS);
    let (her_receiver, his_receiver) = (
        Receiver::start(LOOPBACK, Behaviour::Accept).await,
        Receiver::start(LOOPBACK, Behaviour::Accept).await,
    );
    let (her_hook, his_hook) = (
        her_receiver.url("127.0.0.1", "alice"),
        his_receiver.url("127.0.0.1", "bob"),
    );

    // Alice's deliveries: unnamed (the gateway's id), named by her, by her key.
    let mut hers = Vec::new();
    for (n, named, key) in [
        (0, None, None),
        (1, Some("alice-order-1"), None),
        (2, None, Some("alice-key-2")),
    ] {
        let mut request = body("alice", n, &her_hook);
        if let Some(id) = named {
            request["deliveryId"] = Value::String(id.to_owned());
        }
        let mut post = alice
            .http
            .post(url(&alice, "/api/deliveryrequests"))
            .header("content-type", "application/json");
        if let Some(key) = key {
            post = post.header("idempotency-key", key);
        }
        let response = post.body(request.to_string()).send().await.unwrap();
        assert_eq!(response.status(), 202);
        let accepted: Value = response.json().await.unwrap();
        hers.push(Hers {
            id: accepted["deliveryId"].as_str().unwrap().to_owned(),
            receipt: accepted["receipt"].as_str().unwrap().to_owned(),
            status_url: accepted["statusUrl"].as_str().unwrap().to_owned(),
            body: request,
            key: key.map(str::to_owned),
        });
    }
    assert!(hers[0].id.starts_with("sp-"), "{}", hers[0].id);
    assert!(hers[2].id.starts_with("k-"), "{}", hers[2].id);
    let urls: Vec<String> = hers.iter().map(|h| h.status_url.clone()).collect();
    let done = alice.wait_for_terminal(&urls, WAIT).await;
    assert!(
        done.iter().all(|d| d.state == DeliveryState::Scheduled),
        "{done:?}"
    );
    eventually("her callbacks", WAIT, || async {
        (her_receiver.received().len() >= hers.len()).then_some(())
    })
    .await;
    // Past every reservation: only the status keeps her names taken now.
    tokio::time::sleep(Duration::from_secs(RESERVED_S + 1)).await;

    let before = her_documents(&alice, &hers).await;
    let services = app.simulator().stats();
    let her_callbacks = her_receiver.received().len();
    let unknown = {
        let response = bob
            .post_raw("application/json", body("bob", 0, &his_hook).to_string())
            .await;
        assert_eq!(response.status(), 202);
        let accepted: Value = response.json().await.unwrap();
        // His own delivery runs; a never-used id with his own receipt for it:
        let receipt = accepted["receipt"].as_str().unwrap().to_owned();
        (format!("never-{}", hers.len()), receipt)
    };

    for delivery in &hers {
        bob_reads_and_changes_nothing(&bob, delivery, &unknown).await;
        bob_takes_no_name(&bob, delivery, &his_hook).await;
    }

    // The listing: his own only, however he filters; hers carry no trace.
    let listing: Value = bob
        .http
        .get(url(
            &bob,
            "/api/deliveryrequests?limit=500&ownerId=alice-owner",
        ))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(listing["items"], json!([]), "{listing}");
    let listing = bob
        .http
        .get(url(&bob, "/api/deliveryrequests?limit=500"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for delivery in &hers {
        assert!(!listing.contains(&delivery.id), "{listing}");
    }
    // The operators' routes and reports: not his scope.
    for (method, path, request) in [
        ("POST", "/admin/redrive", json!({"ids": [hers[0].id]})),
        (
            "POST",
            "/admin/callbacks/resend",
            json!({"ids": [hers[0].id]}),
        ),
        ("GET", "/admin/change-feed/dead-letters", Value::Null),
        ("GET", "/dashboard/data", Value::Null),
    ] {
        let builder = match method {
            "POST" => bob
                .http
                .post(url(&bob, path))
                .header("content-type", "application/json")
                .body(request.to_string()),
            _ => bob.http.get(url(&bob, path)),
        };
        let response = builder.send().await.unwrap();
        assert_eq!(response.status(), 403, "{method} {path}");
        let text = response.text().await.unwrap();
        assert!(!text.contains(&hers[0].id), "{text}");
    }

    // A request for her id straight on the stream, as a gateway of an
    // earlier build let through: the worker runs no step and dead-letters it.
    let hostile: DeliveryRequest = {
        let mut request = body("bob", 902, &his_hook);
        request["deliveryId"] = Value::String(hers[1].id.clone());
        serde_json::from_value(request).unwrap()
    };
    let event = Event::DeliveryRequested(Box::new(DeliveryRequested {
        delivery_id: hers[1].id.clone(),
        accepted_at: OffsetDateTime::now_utc(),
        traceparent: None,
        idempotency_key: None,
        principal: Some("bob".into()),
        epoch: 0,
        redrive: None,
        request: hostile,
    }));
    let dead_letters = &app.app.backends.ports.dead_letters;
    let letters_before = dead_letters.events(None, 10_000).await.unwrap().len();
    app.app
        .backends
        .ports
        .publisher
        .publish(event.outbound(Lane::Normal))
        .await
        .unwrap();
    let letters = eventually("the hostile request dead-lettered", WAIT, || async {
        let letters = dead_letters.events(None, 10_000).await.unwrap();
        (letters.len() > letters_before).then_some(letters)
    })
    .await;
    let reason = &letters.last().unwrap().reason;
    assert!(
        reason.contains(&hers[1].id) && reason.contains("\"alice\"") && reason.contains("\"bob\""),
        "{reason}"
    );

    // His own delivery ran meanwhile; the rest of the system is settled.
    eventually("his own delivery and the rest settled", WAIT, || async {
        let stats = app.simulator().stats();
        (stats.drone.created == services.drone.created + 2).then_some(())
    })
    .await;
    // Hers, as she reads them: untouched, and nothing booked or undone for them.
    assert_eq!(her_documents(&alice, &hers).await, before);
    let after = app.simulator().stats();
    for (service, then, now) in [
        ("package", &services.package, &after.package),
        ("delivery", &services.delivery, &after.delivery),
        ("drone", &services.drone, &after.drone),
    ] {
        // Bob's own two deliveries (his first and the one under her key) and nothing else.
        assert_eq!(now.created, then.created + 2, "{service}");
        assert_eq!(now.deleted, then.deleted, "{service}: nothing undone");
        assert_eq!(now.updated, then.updated, "{service}: nothing updated");
        assert_eq!(
            now.replayed, then.replayed,
            "{service}: no call under her keys"
        );
    }
    // Her callbacks as they were; his receiver heard nothing of hers.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(her_receiver.received().len(), her_callbacks);
    for received in his_receiver.received() {
        for delivery in &hers {
            assert!(!received.body.contains(&delivery.id), "{}", received.body);
        }
    }

    // The operator reads hers with her receipt, and her own retry after her
    // reservation is gone gets her delivery back.
    assert_eq!(ops.status(&hers[1].status_url).await.status(), 200);
    let retry = alice
        .post_raw("application/json", hers[1].body.to_string())
        .await;
    assert_eq!(retry.status(), 202);
    let retried: Value = retry.json().await.unwrap();
    assert_eq!(retried["deliveryId"], hers[1].id.as_str());
    assert_eq!(retried["status"], "Scheduled");
    assert_eq!(
        alice
            .status(retried["statusUrl"].as_str().unwrap())
            .await
            .status(),
        200
    );
    her_receiver.stop().await;
    his_receiver.stop().await;
    app.app.stop().await.unwrap();
}

#[tokio::test]
async fn another_principal_touches_nothing_of_a_delivery_on_the_embedded_store() {
    let dir = tempfile::tempdir().unwrap();
    let app = TestApp::spawn_with(tenancy_settings(dir.path())).await;
    another_principal_touches_nothing(app).await;
}

#[tokio::test]
async fn another_principal_touches_nothing_of_a_delivery_on_cosmos_db() {
    let dir = tempfile::tempdir().unwrap();
    let app = TestApp::spawn_on_cosmos(tenancy_settings(dir.path())).await;
    another_principal_touches_nothing(app).await;
}

/// A status document as the listing of an anonymous caller shows it.
fn listed(item: &Value) -> StatusDocument {
    serde_json::from_value(item.clone()).unwrap()
}

#[tokio::test]
async fn with_auth_off_the_admin_routes_are_off_and_a_listing_hands_out_nothing_to_replay() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = test_settings(dir.path());
    settings.callbacks.allow = vec!["127.0.0.1".into()];
    let app = TestApp::spawn_with(settings).await;
    let client = &app.client;
    let mut request = skyport_tests::delivery_request(1);
    request["callbackUrl"] = "http://127.0.0.1:9/hooks/anyone".into();
    let accepted = client.post_delivery(&request).await;
    client
        .wait_for_state(&accepted.status_url, DeliveryState::Scheduled, WAIT)
        .await;
    for (method, path) in [
        ("POST", "/admin/redrive"),
        ("POST", "/admin/callbacks/resend"),
        ("GET", "/admin/change-feed/dead-letters"),
        ("GET", "/admin/change-feed"),
    ] {
        let builder = match method {
            "POST" => client
                .http
                .post(url(client, path))
                .header("content-type", "application/json")
                .body("{}"),
            _ => client.http.get(url(client, path)),
        };
        let response = builder.send().await.unwrap();
        assert_eq!(response.status(), 404, "{method} {path}");
        let problem: Value = response.json().await.unwrap();
        assert_eq!(problem["code"], "NotFound", "{problem}");
    }
    let listing: Value = client
        .http
        .get(url(client, "/api/deliveryrequests"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let item = &listing["items"][0];
    assert_eq!(item["id"], "delivery-1", "{listing}");
    let document = listed(item);
    assert!(document.request.is_none(), "{item}");
    assert!(document.callback_url.is_none(), "{item}");
    assert!(item.get("links").is_none(), "{item}");
    // What the listing gives is not enough to replay: a body built from it is
    // another request under a taken name, answered without a receipt.
    let rebuilt = json!({
        "deliveryId": item["id"],
        "ownerId": item["ownerId"],
        "pickupLocation": "47.0001,-122.1368",
        "pickupTime": "2030-01-01T10:00:00Z",
        "deadline": "2030-01-01T12:00:00Z",
        "dropoffLocation": "47.6101,-122.2015",
        "packageInfo": {"packageId": item["packageId"], "size": "Small", "weight": 2.5},
    });
    let response = client
        .post_raw("application/json", rebuilt.to_string())
        .await;
    assert_eq!(response.status(), 409);
    assert!(!response.text().await.unwrap().contains("receipt"));

    // On purpose, an operator turns them on.
    app.app.stop().await.unwrap();
    let mut settings = test_settings(dir.path());
    settings.gateway.admin_without_auth = true;
    let app = TestApp::spawn_with(settings).await;
    let response = app
        .client
        .http
        .post(url(&app.client, "/admin/redrive?dryRun=true"))
        .header("content-type", "application/json")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    app.app.stop().await.unwrap();
}

#[tokio::test]
async fn a_client_holds_at_most_its_share_of_the_waiting_reads() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = tenancy_settings(dir.path());
    settings.gateway.max_waiting = 40;
    settings.gateway.max_waiting_per_client = 4;
    let app = TestApp::spawn_with(settings).await;
    let alice = app.client.with_header("x-api-key", ALICE);
    let bob = app.client.with_header("x-api-key", BOB);
    let receipts = skyport_gateway::receipt::Receipts::new(&app.app.backends.ports.receipt_keys);
    // Statuses that never change: deliveries signed for and never posted.
    let held_url = |who: &str, n: usize| {
        let id = format!("{who}-held-{n}");
        let receipt = receipts.sign(&id, OffsetDateTime::now_utc(), Lane::Normal, Some(who));
        format!("/api/deliveryrequests/{id}/status?receipt={receipt}&wait=3")
    };
    let started = tokio::time::Instant::now();
    let mut reads = tokio::task::JoinSet::new();
    for n in 0..6 {
        let (client, path) = (alice.clone(), held_url("alice", n));
        reads.spawn(async move {
            let response = client
                .http
                .get(url(&client, &path))
                .header("if-none-match", "\"accepted\"")
                .send()
                .await
                .unwrap();
            (response.status().as_u16(), started.elapsed())
        });
    }
    let (client, path) = (bob.clone(), held_url("bob", 0));
    let his = tokio::spawn(async move {
        let response = client
            .http
            .get(url(&client, &path))
            .header("if-none-match", "\"accepted\"")
            .send()
            .await
            .unwrap();
        (response.status().as_u16(), started.elapsed())
    });
    let answers = reads.join_all().await;
    let at_once = answers
        .iter()
        .filter(|(_, after)| *after < Duration::from_secs(2))
        .count();
    assert!(
        answers.iter().all(|(status, _)| *status == 304),
        "{answers:?}"
    );
    assert_eq!(
        at_once, 2,
        "two past her four answered at once: {answers:?}"
    );
    let (status, after) = his.await.unwrap();
    assert_eq!(status, 304);
    assert!(
        after >= Duration::from_secs(2),
        "Bob's read was held: {after:?}"
    );
    app.app.stop().await.unwrap();
}

#[tokio::test]
async fn the_probes_and_metrics_answer_on_the_internal_port_and_not_beside_the_api() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = tenancy_settings(dir.path());
    settings.gateway.internal_listen = Some("127.0.0.1:0".parse().unwrap());
    let app = TestApp::spawn_with(settings).await;
    let internal = app.app.gateway_internal_addr.expect("an internal listener");
    for path in ["/healthz", "/readyz", "/metrics"] {
        let inside = reqwest::get(format!("http://{internal}{path}"))
            .await
            .unwrap();
        assert_eq!(inside.status(), 200, "{path} inside");
        let outside = reqwest::get(url(&app.client, path)).await.unwrap();
        assert_eq!(outside.status(), 404, "{path} beside the API");
    }
    let api = reqwest::get(format!("http://{internal}/api/deliveryrequests"))
        .await
        .unwrap();
    assert_eq!(api.status(), 404, "no API on the internal port");
    // The reference probe stays with the API.
    assert_eq!(
        reqwest::get(url(&app.client, "/api/probe"))
            .await
            .unwrap()
            .status(),
        200
    );
    app.app.stop().await.unwrap();
}
