//! `GET /api/deliveryrequests` over HTTP on the embedded store, 1,000
//! deliveries of three owners posted by two clients: a client's own
//! deliveries newest first, filtered and paged exactly while new ones
//! arrive; another client sees none of them; the admin scope sees every
//! client's; with authentication off the items carry no receipt.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use secrecy::SecretString;
use serde_json::Value;
use skyport_core::status::Step;
use skyport_runtime::config::{ApiKeySettings, Scope};
use skyport_simulator::Behaviour;
use skyport_tests::{Client, TestApp, delivery_request, test_settings};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

const ALICE: &str = "alice-key-0123456789abcdef0123456789ab";
const BOB: &str = "bob-key-0123456789abcdef0123456789abcd";
const OPS: &str = "ops-key-0123456789abcdef0123456789abcd";
const WAIT: Duration = Duration::from_secs(120);
const DELIVERIES: usize = 1_000;

/// What delivery `n` ends as: every fifth is refused by the Package
/// service, the one after it cancelled, the rest scheduled.
fn expected_state(n: usize) -> &'static str {
    match n % 5 {
        0 => "Failed",
        1 => "Cancelled",
        _ => "Scheduled",
    }
}

/// Delivery `n`, of one of three owners: `owner-{n % 3}`.
fn request(n: usize) -> Value {
    let mut request = delivery_request(n);
    request["ownerId"] = Value::from(format!("owner-{}", n % 3));
    request
}

/// Alice posts the even deliveries, Bob the odd ones.
fn poster(n: usize) -> &'static str {
    if n.is_multiple_of(2) { "alice" } else { "bob" }
}

async fn page(client: &Client, query: &str) -> Value {
    let response = client
        .http
        .get(format!("{}/api/deliveryrequests?{query}", client.base))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200, "{query}");
    response.json().await.unwrap()
}

/// Every item of a listing, following `next` with pages of `limit`;
/// `between` runs between two pages.
async fn all_pages<F, Fut>(client: &Client, query: &str, limit: usize, mut between: F) -> Vec<Value>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut items = Vec::new();
    let mut cursor = String::new();
    loop {
        let body = page(client, &format!("{query}&limit={limit}{cursor}")).await;
        let page_items = body["items"].as_array().unwrap();
        assert!(page_items.len() <= limit);
        items.extend(page_items.iter().cloned());
        between().await;
        match body["next"].as_str() {
            Some(next) => cursor = format!("&cursor={next}"),
            None => return items,
        }
    }
}

/// Where an item sorts: its accept time in Unix ms, and its id.
fn position(item: &Value) -> (i64, String) {
    let at = OffsetDateTime::parse(item["createdAt"].as_str().unwrap(), &Rfc3339).unwrap();
    let ms = i64::try_from(at.unix_timestamp_nanos() / 1_000_000).unwrap();
    (ms, item["id"].as_str().unwrap().to_owned())
}

fn ids(items: &[Value]) -> Vec<String> {
    items
        .iter()
        .map(|item| item["id"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn a_client_lists_its_own_deliveries_exactly_and_the_admin_scope_every_clients() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = test_settings(dir.path());
    let auth = &mut settings.gateway.auth;
    auth.enabled = Some(true);
    for (name, key, scopes) in [
        ("alice", ALICE, Scope::all()),
        ("bob", BOB, Scope::all()),
        ("ops", OPS, vec![Scope::Read, Scope::Admin]),
    ] {
        let key = SecretString::from(key);
        auth.api_keys
            .insert(name.into(), ApiKeySettings { key, scopes });
    }
    let app = TestApp::spawn_with(settings).await;
    let refused: HashSet<String> = (0..DELIVERIES)
        .filter(|n| expected_state(*n) == "Failed")
        .map(|n| format!("package-{n}"))
        .collect();
    app.simulator().set_behaviour(
        Step::Package,
        Behaviour {
            rejected_ids: Arc::new(refused),
            ..Behaviour::default()
        },
    );
    let clients: BTreeMap<&str, Client> = [("alice", ALICE), ("bob", BOB), ("ops", OPS)]
        .into_iter()
        .map(|(name, key)| (name, app.client.with_header("x-api-key", key)))
        .collect();
    let mut urls: BTreeMap<&str, Vec<(usize, String)>> = BTreeMap::new();
    for n in 0..DELIVERIES {
        let client = &clients[poster(n)];
        let accepted = client.post_delivery(&request(n)).await;
        if expected_state(n) == "Cancelled" {
            assert_eq!(client.cancel(&accepted.status_url).await.status(), 202);
        }
        urls.entry(poster(n))
            .or_default()
            .push((n, accepted.status_url));
    }
    // A receipt is signed for its owner: each waits for its own.
    let mut documents = vec![None; DELIVERIES];
    for (poster, posted) in &urls {
        let status_urls: Vec<String> = posted.iter().map(|(_, url)| url.clone()).collect();
        let done = clients[poster].wait_for_terminal(&status_urls, WAIT).await;
        for ((n, _), document) in posted.iter().zip(done) {
            documents[*n] = Some(document);
        }
    }
    let documents: Vec<_> = documents.into_iter().map(Option::unwrap).collect();
    for (n, document) in documents.iter().enumerate() {
        assert_eq!(
            serde_json::to_value(document.state).unwrap(),
            expected_state(n),
            "{document:?}"
        );
    }

    // Alice pages through hers while she posts new ones between pages.
    let mut arrivals = DELIVERIES;
    let alice = clients["alice"].clone();
    let listed = all_pages(&alice, "", 37, || {
        arrivals += 2;
        let request = request(arrivals);
        let alice = alice.clone();
        async move {
            alice.post_delivery(&request).await;
        }
    })
    .await;
    let hers: Vec<usize> = (0..DELIVERIES).filter(|n| poster(*n) == "alice").collect();
    let as_listed: Vec<(i64, String)> = listed.iter().map(position).collect();
    let mut expected = as_listed.clone();
    expected.sort_by(|a, b| b.cmp(a));
    assert_eq!(as_listed, expected, "newest first");
    let listed_ids: HashSet<String> = ids(&listed).into_iter().collect();
    let hers_ids: HashSet<String> = hers.iter().map(|n| format!("delivery-{n}")).collect();
    let missing: Vec<_> = hers_ids.difference(&listed_ids).collect();
    let extra: Vec<_> = listed_ids.difference(&hers_ids).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "each of hers exactly once, none newer than the first page: missing {missing:?}, extra {extra:?}"
    );
    assert_eq!(listed.len(), hers.len());

    // Filters, each checked against what the deliveries are.
    let failed_of_owner_1 = page(&alice, "ownerId=owner-1&state=Failed&limit=500").await;
    let want: HashSet<String> = hers
        .iter()
        .filter(|n| *n % 3 == 1 && expected_state(**n) == "Failed")
        .map(|n| format!("delivery-{n}"))
        .collect();
    let got: HashSet<String> = ids(failed_of_owner_1["items"].as_array().unwrap())
        .into_iter()
        .collect();
    assert_eq!(got, want);
    let (since, until) = (&listed[20], &listed[10]);
    let window = page(
        &alice,
        &format!(
            "since={}&until={}&limit=500",
            since["createdAt"].as_str().unwrap(),
            until["createdAt"].as_str().unwrap()
        ),
    )
    .await;
    let (since_ms, until_ms) = (position(since).0, position(until).0);
    let want: Vec<String> = expected
        .iter()
        .filter(|(ms, _)| (since_ms..until_ms).contains(ms))
        .map(|(_, id)| id.clone())
        .collect();
    assert!(want.len() >= 9, "{want:?}");
    assert_eq!(
        ids(window["items"].as_array().unwrap()),
        want,
        "since inclusive, until exclusive"
    );

    // Alice's items carry working links; Bob sees none of hers.
    let first = &listed[0];
    let status = first["links"]["self"].as_str().unwrap();
    assert_eq!(alice.status(status).await.status(), 200);
    let bobs = all_pages(&clients["bob"], "", 500, || async {}).await;
    assert!(ids(&bobs).iter().all(|id| !listed_ids.contains(id)));
    assert_eq!(bobs.len(), DELIVERIES / 2);

    // The admin scope sees every client's.
    let owner_2 = all_pages(&clients["ops"], "ownerId=owner-2", 500, || async {}).await;
    // Alice's later arrivals may be listed too, once the worker has read them.
    let originals: HashSet<String> = (0..DELIVERIES)
        .filter(|n| n % 3 == 2)
        .map(|n| format!("delivery-{n}"))
        .collect();
    let listed: HashSet<String> = ids(&owner_2)
        .into_iter()
        .filter(|id| id.trim_start_matches("delivery-").parse::<usize>().unwrap() < DELIVERIES)
        .collect();
    assert_eq!(listed, originals);
    let posters: HashSet<&str> = owner_2
        .iter()
        .map(|item| item["principal"].as_str().unwrap())
        .collect();
    assert_eq!(posters, HashSet::from(["alice", "bob"]));

    // Bad parameters are 400 problems.
    for query in [
        "limit=0",
        "limit=501",
        "state=Lost",
        "since=yesterday",
        "cursor=forged!",
        "colour=red",
    ] {
        let response = alice
            .http
            .get(format!("{}/api/deliveryrequests?{query}", alice.base))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 400, "{query}");
    }
    app.app.stop().await.unwrap();
}

#[tokio::test]
async fn without_authentication_a_listing_hands_out_no_receipt() {
    let dir = tempfile::tempdir().unwrap();
    let app = TestApp::spawn(&dir).await;
    let accepted = app.client.post_many(5).await;
    let urls: Vec<String> = accepted.iter().map(|a| a.status_url.clone()).collect();
    app.client.wait_for_terminal(&urls, WAIT).await;
    let body = page(&app.client, "limit=10").await;
    let items = body["items"].as_array().unwrap();
    assert_eq!(items.len(), 5);
    for item in items {
        assert!(item.get("links").is_none(), "{item}");
        assert!(!item.to_string().contains("receipt"), "{item}");
        assert_eq!(item["terminal"], true);
    }
    app.app.stop().await.unwrap();
}
