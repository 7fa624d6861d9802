//! Callbacks: every terminal status reaches the request's `callbackUrl`,
//! signed as Standard Webhooks specifies (checked by the `standardwebhooks`
//! Python package) and known by an opaque `webhook-id`, through receivers
//! that fail for a while or for good, on the embedded store and on Cosmos
//! DB; with auth on, each principal's callbacks verify with its own derived
//! secrets and no one else's; destinations in the way of the address policy
//! are refused and never contacted, and the client's status says so without
//! saying what a name resolved to; a gateway takes callback URLs without
//! holding any secret.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::time::{Duration, Instant};

use secrecy::{ExposeSecret, SecretString};
use serde_json::Value;
use skyport::Backends;
use skyport::callbacks::notifier;
use skyport_azure::cosmos::emulator::Emulator;
use skyport_callbacks::notify::MasterSecrets;
use skyport_core::status::{CallbackState, DeliveryState, StatusDocument};
use skyport_gateway::Gateway;
use skyport_gateway::auth::Auth;
use skyport_runtime::config::{
    ApiKeySettings, ConfigError, CosmosAuth, Millis, Scope, Settings, StoreBackend, decode_secret,
};
use skyport_runtime::destination::CallbackAcceptance;
use skyport_tests::webhooks::{
    Behaviour, CALLBACK_WAIT, Received, Receiver, message_ids, post_with_callbacks,
    verified_by_python, verify_with_python,
};
use skyport_tests::{Client, TestApp, delivery_request, eventually, test_settings};
use tokio_util::sync::CancellationToken;

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const LOOPBACK: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
/// The trace context delivery 0 is posted with.
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";

/// Settings with callbacks signed by [`SECRET`], allowed to `allow`, and a
/// change-feed processor that polls and balances quickly.
fn callback_settings(dir: &Path, allow: &[&str]) -> Settings {
    let mut settings = test_settings(dir);
    // With auth off, the reports at /admin only on purpose.
    settings.gateway.admin_without_auth = true;
    settings.callbacks.secrets = vec![SecretString::from(SECRET)];
    settings.callbacks.allow = allow.iter().map(|a| (*a).to_owned()).collect();
    settings.callbacks.backoff_initial_ms = Millis::new(100);
    settings.callbacks.backoff_max_ms = Millis::new(1_000);
    settings.change_feed.poll_interval_ms = Millis::new(100);
    settings.change_feed.acquire_interval_ms = Millis::new(500);
    settings.change_feed.renew_interval_ms = Millis::new(1_000);
    settings.change_feed.expiry_ms = Millis::new(5_000);
    settings.change_feed.estimate_interval_ms = Millis::new(500);
    settings
}

/// Waits (at most `within` in all) until `done` holds for every status
/// behind `urls`; their documents, in order.
async fn wait_for_each(
    client: &Client,
    urls: &[String],
    within: Duration,
    done: impl Fn(&StatusDocument) -> bool,
) -> Vec<StatusDocument> {
    let deadline = Instant::now() + within;
    let mut documents = Vec::with_capacity(urls.len());
    for url in urls {
        loop {
            let document: StatusDocument = client.status(url).await.json().await.unwrap();
            if done(&document) {
                documents.push(document);
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{}: {:?}, callback {:?}, after {within:?}",
                document.id,
                document.state,
                document.callback
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    documents
}

/// Waits until `receiver` has acknowledged the callback announcing the
/// state of every status behind `urls`, and none is retried any more: one
/// delivered at its first attempt records nothing on its document, one
/// delivered after retries records Delivered.
async fn wait_for_delivered(
    client: &Client,
    receiver: &Receiver,
    urls: &[String],
    within: Duration,
) -> Vec<StatusDocument> {
    wait_for_each(client, urls, within, |document| {
        let announced = message(&document.id, &state_name(document.state));
        document.state.is_terminal()
            && receiver
                .received()
                .iter()
                .any(|r| r.acknowledged && r.message() == announced)
            && document
                .callback
                .as_ref()
                .filter(|c| c.announced == document.state)
                .is_none_or(|c| c.state == CallbackState::Delivered)
    })
    .await
}

/// Waits until every status behind `urls` records a callback in `state`.
async fn wait_for_callbacks(
    client: &Client,
    urls: &[String],
    state: CallbackState,
    within: Duration,
) -> Vec<StatusDocument> {
    wait_for_each(client, urls, within, |document| {
        document
            .callback
            .as_ref()
            .is_some_and(|c| c.state == state && c.announced == document.state)
    })
    .await
}

/// A state as a callback's type names it (`scheduled`).
fn state_name(state: DeliveryState) -> String {
    format!("{state:?}").to_lowercase()
}

/// Callbacks by message, (delivery id, type), the first of each, and how
/// many were duplicates; asserts each message came with one opaque id of its own.
fn by_message(received: &[Received]) -> (BTreeMap<(String, String), Value>, usize) {
    message_ids(received);
    let mut first = BTreeMap::new();
    let mut duplicates = 0;
    for callback in received {
        if first.insert(callback.message(), callback.json()).is_some() {
            duplicates += 1;
        }
    }
    (first, duplicates)
}

/// The key of a message in [`by_message`]'s map.
fn message(delivery_id: &str, kind: &str) -> (String, String) {
    (delivery_id.to_owned(), format!("delivery.{kind}"))
}

async fn every_terminal_status_reaches_its_callback(app: TestApp, receiver: Receiver) {
    let traceparent = format!("00-{TRACE_ID}-00f067aa0ba902b7-01");
    let urls = post_with_callbacks(&app.client, 500, Some(&traceparent), |n| {
        receiver.url("127.0.0.1", &format!("d{n}"))
    })
    .await;
    app.expect_all_scheduled_once(&urls, Duration::from_secs(120))
        .await;
    // Five are cancelled after they were scheduled: each announces both states.
    for url in &urls[..5] {
        assert_eq!(app.client.cancel(url).await.status(), 202);
        app.client
            .wait_for_state(url, DeliveryState::Cancelled, Duration::from_secs(60))
            .await;
    }
    let documents = wait_for_delivered(&app.client, &receiver, &urls, CALLBACK_WAIT).await;
    let received = receiver.received();
    let (callbacks, duplicates) = by_message(&received);
    println!(
        "{} callbacks received for {} terminal states ({duplicates} duplicates)",
        received.len(),
        callbacks.len()
    );
    for (n, document) in documents.iter().enumerate() {
        let scheduled = &callbacks[&message(&document.id, "scheduled")];
        assert_eq!(scheduled["type"], "delivery.scheduled");
        assert_eq!(scheduled["data"]["state"], "Scheduled");
        assert_eq!(scheduled["data"]["id"], document.id.as_str());
        assert!(scheduled["data"]["droneId"].is_string(), "{scheduled}");
        if n < 5 {
            let cancelled = &callbacks[&message(&document.id, "cancelled")];
            assert_eq!(cancelled["data"]["state"], "Cancelled");
        }
        // Acknowledged at its one attempt: nothing was written back.
        let announced = message(&document.id, &state_name(document.state));
        if received.iter().filter(|r| r.message() == announced).count() == 1 {
            assert_eq!(document.callback, None, "{}", document.id);
        }
    }
    assert_eq!(callbacks.len(), 505, "one callback per terminal state");
    let traced = received
        .iter()
        .find(|r| r.message() == message(&documents[0].id, "scheduled"))
        .and_then(|r| r.traceparent.clone())
        .unwrap_or_default();
    assert!(
        traced.contains(TRACE_ID),
        "the callback continues its delivery's trace: {traced:?}"
    );
    assert_eq!(verify_with_python(SECRET, &received), received.len());
    // The estimator drains to 0, in /readyz, at /admin/change-feed and in the metrics.
    let get = |path: &'static str| {
        let client = app.client.clone();
        async move {
            client
                .http
                .get(format!("{}{path}", client.base))
                .send()
                .await
                .unwrap()
        }
    };
    let report = eventually("nothing pending", Duration::from_secs(30), || async {
        let ready: Value = get("/readyz").await.json().await.unwrap();
        let report = ready["details"]["changeFeed"].clone();
        (report["pending"] == 0 && !report["leases"].as_array()?.is_empty()).then_some(report)
    })
    .await;
    assert!(!report["owned"].as_array().unwrap().is_empty(), "{report}");
    let admin: Value = get("/admin/change-feed").await.json().await.unwrap();
    assert_eq!(admin["processor"], "skyport-callbacks", "{admin}");
    let metrics = get("/metrics").await.text().await.unwrap();
    for series in [
        "skyport_change_feed_lag_events{lease=\"range.",
        "skyport_callbacks_total{outcome=\"delivered\"}",
        "skyport_callback_duration_seconds_count",
    ] {
        assert!(metrics.contains(series), "{series} is not in /metrics");
    }
    app.app.stop().await.unwrap();
    receiver.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_embedded_store_every_terminal_status_is_called_back_signed() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start(LOOPBACK, Behaviour::Accept).await;
    let app = TestApp::spawn_with(callback_settings(dir.path(), &["127.0.0.0/8"])).await;
    every_terminal_status_reaches_its_callback(app, receiver).await;
}

/// On the embedded store a status write wakes the change-feed processor: with
/// a poll interval of a minute, every callback still arrives within seconds
/// of its delivery's terminal write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_embedded_store_a_status_write_wakes_the_callbacks() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start(LOOPBACK, Behaviour::Accept).await;
    let mut settings = callback_settings(dir.path(), &["127.0.0.0/8"]);
    settings.change_feed.poll_interval_ms = Millis::new(60_000);
    let app = TestApp::spawn_with(settings).await;
    let urls = post_with_callbacks(&app.client, 20, None, |n| {
        receiver.url("127.0.0.1", &format!("w{n}"))
    })
    .await;
    let documents = app
        .client
        .wait_for_terminal(&urls, Duration::from_secs(30))
        .await;
    eventually("every callback", Duration::from_secs(15), || async {
        (receiver.received().len() >= urls.len()).then_some(())
    })
    .await;
    let latest_write = documents.iter().map(|d| d.updated_at).max().unwrap();
    let arrived = time::OffsetDateTime::now_utc();
    assert!(
        arrived - latest_write < time::Duration::seconds(15),
        "the callbacks came {} after the last terminal write, as if polled",
        arrived - latest_write
    );
    app.app.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_cosmos_db_every_terminal_status_is_called_back_signed() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start(LOOPBACK, Behaviour::Accept).await;
    let app = TestApp::spawn_on_cosmos(callback_settings(dir.path(), &["127.0.0.0/8"])).await;
    every_terminal_status_reaches_its_callback(app, receiver).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_down_for_20_s_gets_every_callback_afterwards() {
    let dir = tempfile::tempdir().unwrap();
    let up_at = Instant::now() + Duration::from_secs(20);
    let receiver = Receiver::start(LOOPBACK, Behaviour::UnavailableUntil(up_at)).await;
    let mut settings = callback_settings(dir.path(), &["127.0.0.1"]);
    settings.callbacks.retry_for_ms = Millis::new(120_000);
    settings.callbacks.backoff_max_ms = Millis::new(2_000);
    let app = TestApp::spawn_with(settings).await;
    let urls = post_with_callbacks(&app.client, 100, None, |n| {
        receiver.url("127.0.0.1", &format!("d{n}"))
    })
    .await;
    app.expect_all_scheduled_once(&urls, Duration::from_secs(60))
        .await;
    let documents = wait_for_delivered(&app.client, &receiver, &urls, CALLBACK_WAIT).await;
    assert!(Instant::now() >= up_at);
    let received = receiver.received();
    let refused = received.iter().filter(|r| r.id.is_empty()).count();
    assert_eq!(refused, 0);
    let (callbacks, duplicates) = by_message(&received);
    println!(
        "{} POSTs for {} callbacks over the outage ({duplicates} repeats of a message id)",
        received.len(),
        callbacks.len()
    );
    assert_eq!(callbacks.len(), 100);
    let retried = documents
        .iter()
        .filter(|d| d.callback.as_ref().is_some_and(|c| c.attempts > 1))
        .count();
    println!("{retried} of 100 callbacks were retried through the outage");
    assert!(
        retried > 0,
        "the outage refused callbacks that were retried"
    );
    assert_eq!(verify_with_python(SECRET, &received), received.len());
    app.app.stop().await.unwrap();
    receiver.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_that_never_answers_ends_with_dead_lettered_callbacks() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start(LOOPBACK, Behaviour::Silent).await;
    let mut settings = callback_settings(dir.path(), &["127.0.0.1"]);
    settings.callbacks.timeout_ms = Millis::new(300);
    settings.callbacks.retry_for_ms = Millis::new(2_000);
    let app = TestApp::spawn_with(settings).await;
    let urls = post_with_callbacks(&app.client, 20, None, |n| {
        receiver.url("127.0.0.1", &format!("d{n}"))
    })
    .await;
    app.expect_all_scheduled_once(&urls, Duration::from_secs(60))
        .await;
    let documents = wait_for_callbacks(
        &app.client,
        &urls,
        CallbackState::DeadLettered,
        CALLBACK_WAIT,
    )
    .await;
    for document in &documents {
        let outcome = document.callback.as_ref().unwrap();
        let error = outcome.last_error.as_deref().unwrap_or_default();
        assert!(
            error.starts_with("the receiver did not answer within 300 ms (gave up after "),
            "{outcome:?}"
        );
        assert!(outcome.delivered_at.is_none());
    }
    let report: Value = app
        .client
        .http
        .get(format!(
            "{}/admin/change-feed/dead-letters",
            app.client.base
        ))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(report.get("next").is_some_and(Value::is_null), "{report}");
    let listed = report["items"].as_array().unwrap();
    let keys: BTreeSet<&str> = listed.iter().filter_map(|l| l["key"].as_str()).collect();
    for document in &documents {
        assert!(keys.contains(format!("{}:scheduled", document.id).as_str()));
    }
    assert_eq!(listed.len(), 20, "{listed:?}");
    app.app.stop().await.unwrap();
    receiver.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callbacks_to_special_addresses_are_refused_and_never_sent() {
    let dir = tempfile::tempdir().unwrap();
    // Only 127.0.0.2 is allowed: `localhost` (127.0.0.1) is not.
    let allowed = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
    let redirector = Receiver::start(
        allowed,
        Behaviour::Redirect("http://10.0.0.1/hooks/x".into()),
    )
    .await;
    let local = Receiver::start(LOOPBACK, Behaviour::Accept).await;
    let app = TestApp::spawn_with(callback_settings(dir.path(), &["127.0.0.2"])).await;
    for literal in [
        "http://169.254.169.254/latest/meta-data/",
        "http://10.0.0.1/hooks/x",
        "http://[::1]:9/hooks/x",
        &local.url("127.0.0.1", "literal"),
    ] {
        let mut request = delivery_request(1);
        request["callbackUrl"] = Value::String(literal.to_owned());
        let response = app
            .client
            .post_raw("application/json", request.to_string())
            .await;
        assert_eq!(response.status(), 422, "{literal}");
        let problem: Value = response.json().await.unwrap();
        assert_eq!(problem["errors"][0]["field"], "callbackUrl", "{problem}");
    }
    // A name is checked where it resolves, a redirect is never followed.
    let urls = post_with_callbacks(&app.client, 2, None, |n| {
        if n == 0 {
            local.url("localhost", "by-name")
        } else {
            redirector.url("127.0.0.2", "redirect")
        }
    })
    .await;
    let documents = wait_for_callbacks(
        &app.client,
        &urls,
        CallbackState::DeadLettered,
        CALLBACK_WAIT,
    )
    .await;
    // The client reads why, in general terms: neither what `localhost`
    // resolved to nor where the receiver redirected (the log has those).
    let by_name = documents[0].callback.as_ref().unwrap();
    assert_eq!(
        by_name.last_error.as_deref(),
        Some("the destination is not allowed"),
        "{by_name:?}"
    );
    let redirected = documents[1].callback.as_ref().unwrap();
    assert_eq!(
        redirected.last_error.as_deref(),
        Some("the receiver redirected (callbacks do not follow redirects)"),
        "{redirected:?}"
    );
    assert!(local.received().is_empty(), "localhost was contacted");
    assert_eq!(redirector.received().len(), 1, "the redirect was retried");
    app.app.stop().await.unwrap();
    local.stop().await;
    redirector.stop().await;
}

/// The second master secret of a rotation: the older one, configured second.
const OLDER_SECRET: &str = "whsec_AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
const ALICE_KEY: &str = "alice-key-0123456789abcdef0123456789ab";
const BOB_KEY: &str = "bob-key-0123456789abcdef0123456789abcd";

/// Posts deliveries `from..from + count` as the client `as_principal`, each
/// with a callback to `receiver`; their status URLs.
async fn post_as(
    as_principal: &Client,
    receiver: &Receiver,
    from: usize,
    count: usize,
) -> Vec<String> {
    let mut urls = Vec::with_capacity(count);
    for n in from..from + count {
        let mut request = delivery_request(n);
        request["callbackUrl"] = Value::String(receiver.url("127.0.0.1", &format!("p{n}")));
        urls.push(as_principal.post_delivery(&request).await.status_url);
    }
    urls
}

/// The callbacks in `received` of deliveries made by `principal`.
fn made_by(received: &[Received], principal: &str) -> Vec<Received> {
    received
        .iter()
        .filter(|r| r.json()["data"]["principal"] == principal)
        .cloned()
        .collect()
}

/// With auth on and two master secrets (a rotation), each callback carries
/// two signatures, each made with its principal's secret under one master:
/// the `standardwebhooks` verifier accepts Alice's callbacks with either of
/// her secrets, and refuses them with Bob's and with the masters themselves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_auth_on_each_principals_callbacks_verify_with_its_own_secrets_only() {
    const EACH: usize = 10;
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start(LOOPBACK, Behaviour::Accept).await;
    let mut settings = callback_settings(dir.path(), &["127.0.0.0/8"]);
    settings.callbacks.secrets = vec![SecretString::from(SECRET), SecretString::from(OLDER_SECRET)];
    settings.gateway.auth.enabled = Some(true);
    for (name, key) in [("alice", ALICE_KEY), ("bob", BOB_KEY)] {
        settings.gateway.auth.api_keys.insert(
            name.into(),
            ApiKeySettings {
                key: SecretString::from(key),
                scopes: Scope::all(),
            },
        );
    }
    let app = TestApp::spawn_with(settings).await;
    let alice = app.client.with_header("x-api-key", ALICE_KEY);
    let bob = app.client.with_header("x-api-key", BOB_KEY);
    let alices = post_as(&alice, &receiver, 0, EACH).await;
    let bobs = post_as(&bob, &receiver, EACH, EACH).await;
    wait_for_delivered(&alice, &receiver, &alices, CALLBACK_WAIT).await;
    wait_for_delivered(&bob, &receiver, &bobs, CALLBACK_WAIT).await;
    let received = receiver.received();
    message_ids(&received);
    let (to_alice, to_bob) = (made_by(&received, "alice"), made_by(&received, "bob"));
    assert!(
        to_alice.len() >= EACH && to_bob.len() >= EACH,
        "{received:?}"
    );
    for callback in &received {
        assert_eq!(
            callback.signature.split(' ').count(),
            2,
            "one signature per master: {}",
            callback.signature
        );
    }
    let keys: Vec<Vec<u8>> = [SECRET, OLDER_SECRET]
        .map(|secret| decode_secret(secret).unwrap())
        .to_vec();
    let masters = MasterSecrets::new(&keys).unwrap();
    let secrets = |principal: &str| -> Vec<String> {
        masters
            .principal_secrets(principal)
            .iter()
            .map(|secret| secret.expose_secret().to_owned())
            .collect()
    };
    let (alice_secrets, bob_secrets) = (secrets("alice"), secrets("bob"));
    for (own, callbacks, others) in [
        (&alice_secrets, &to_alice, &bob_secrets),
        (&bob_secrets, &to_bob, &alice_secrets),
    ] {
        for secret in own {
            assert_eq!(verify_with_python(secret, callbacks), callbacks.len());
        }
        for secret in others
            .iter()
            .map(String::as_str)
            .chain([SECRET, OLDER_SECRET])
        {
            assert_eq!(
                verified_by_python(secret, callbacks),
                0,
                "a callback verified with a secret not its principal's"
            );
        }
    }
    app.app.stop().await.unwrap();
    receiver.stop().await;
}

/// A gateway holds no callback secret: on Cosmos DB with `callbacks.enabled
/// = true` and none, its settings load and it takes a request with a
/// `callbackUrl` (202); the notifier, which signs, does not start without
/// one, naming `callbacks.secrets` (the worker and the all-in-one check the
/// same before they open anything).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_cosmos_db_a_gateway_takes_callback_urls_with_no_secret_and_the_notifier_needs_one() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = test_settings(dir.path());
    settings.store.backend = Some(StoreBackend::Cosmos);
    settings.cosmos.endpoint = Some("https://skyport.documents.azure.com/".parse().unwrap());
    settings.cosmos.auth = CosmosAuth::Entra;
    settings.callbacks.enabled = Some(true);
    settings.validate().unwrap();
    assert!(settings.callbacks.secrets.is_empty());
    let cosmos = Emulator::new(false)
        .unwrap()
        .store_with(&settings.cosmos, &settings.store)
        .await
        .unwrap();
    let backends = Backends::open_with(&settings, Some(cosmos)).await.unwrap();
    let gateway = Gateway::bind(
        &backends.ports,
        &settings.gateway_settings(),
        CallbackAcceptance::from_settings(&settings),
        Auth::from_settings(&settings).await.unwrap(),
        Vec::new(),
    )
    .await
    .unwrap();
    let client = Client::new(format!("http://{}", gateway.local_addr().unwrap()));
    let shutdown = CancellationToken::new();
    let serving = tokio::spawn(gateway.serve(shutdown.clone()));
    let mut request = delivery_request(1);
    request["callbackUrl"] = Value::String("https://receiver.example/hooks/1".into());
    let accepted = client.post_delivery(&request).await;
    assert!(!accepted.status_url.is_empty());
    shutdown.cancel();
    serving.await.unwrap();
    let error = notifier(&settings, &backends).expect_err("no secret to sign with");
    let config = error
        .downcast_ref::<ConfigError>()
        .unwrap_or_else(|| panic!("not a configuration error: {error:#}"));
    assert_eq!(config.key, "callbacks.secrets", "{config}");
    assert_eq!(
        skyport::callbacks::check_secrets(&settings)
            .unwrap_err()
            .key,
        "callbacks.secrets"
    );
    backends.close().await;
}
