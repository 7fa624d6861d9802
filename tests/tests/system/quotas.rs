//! Per-client quotas (`gateway.quotas`): a client's POSTs, PATCHes and
//! DELETEs share its bucket, a retry that finds its delivery is not charged,
//! a client with a quota of its own has it, every metered answer carries
//! the IETF RateLimit header fields, a bearer token's client is the claim
//! `client_claim` names, and the dashboard's data counts the busiest
//! clients without a metric label per client.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use jsonwebtoken::{Algorithm, EncodingKey, Header, encode, get_current_timestamp};
use secrecy::SecretString;
use serde_json::{Value, json};
use skyport_runtime::config::{ClientQuota, JwtSettings};
use skyport_tests::{TestApp, delivery_request, eventually, test_settings};

/// Delivery `n` of owner `owner`.
fn owned(n: usize, owner: &str) -> Value {
    let mut request = delivery_request(n);
    request["ownerId"] = owner.into();
    request
}

fn ratelimit(response: &reqwest::Response) -> Option<(String, String)> {
    let policy = response.headers().get("ratelimit-policy")?;
    let limit = response.headers().get("ratelimit")?;
    Some((
        policy.to_str().unwrap().to_owned(),
        limit.to_str().unwrap().to_owned(),
    ))
}

#[tokio::test]
async fn a_client_over_its_quota_gets_429s_and_the_others_do_not() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = test_settings(dir.path());
    // One a minute after a burst of 3: nothing refills within the test.
    settings.gateway.quotas.default_per_s = Some(1);
    settings.gateway.quotas.burst = Some(3);
    settings.gateway.quotas.clients = BTreeMap::from([(
        "bulk".to_owned(),
        ClientQuota {
            per_s: 1,
            burst: Some(20),
        },
    )]);
    let app = TestApp::spawn_with(settings).await;
    let post = |body: Value| app.client.post_raw("application/json", body.to_string());

    let mut urls = Vec::new();
    for (n, left) in [(0, "2"), (1, "1"), (2, "0")] {
        let response = post(owned(n, "alice")).await;
        assert_eq!(response.status(), 202);
        let (policy, limit) = ratelimit(&response).unwrap();
        assert_eq!(policy, "\"default\";q=3;w=3");
        assert!(
            limit.starts_with(&format!("\"default\";r={left};")),
            "{limit}"
        );
        let accepted: Value = response.json().await.unwrap();
        urls.push(accepted["statusUrl"].as_str().unwrap().to_owned());
    }
    let refused = post(owned(3, "alice")).await;
    assert_eq!(refused.status(), 429);
    assert_eq!(refused.headers()["retry-after"], "1");
    let (_, limit) = ratelimit(&refused).unwrap();
    assert_eq!(limit, "\"default\";r=0;t=1");
    let problem: Value = refused.json().await.unwrap();
    assert_eq!(problem["code"], "QuotaExceeded", "{problem}");

    // A retry before the worker has written a status publishes the request
    // again (a write to the stream), so it is charged like a new one: with
    // the bucket spent, refused. One once the status exists is not.
    let early = post(owned(0, "alice")).await;
    if early.status() == 202 {
        // The worker was quicker than this retry: the status was there.
        assert!(
            ratelimit(&early).is_none(),
            "a retry that finds its status is not metered"
        );
    } else {
        assert_eq!(
            early.status(),
            429,
            "a retry that publishes again is charged"
        );
    }

    // Another client has its own bucket; a client with a quota of its own, its own.
    assert_eq!(post(owned(10, "bob")).await.status(), 202);
    for n in 20..40 {
        let response = post(owned(n, "bulk")).await;
        assert_eq!(response.status(), 202, "bulk's burst is 20");
        assert!(ratelimit(&response).unwrap().0.starts_with("\"client\""));
    }
    assert_eq!(post(owned(40, "bulk")).await.status(), 429);

    // A DELETE and a PATCH share alice's bucket, once the status names her:
    // spent (by POSTs until one is refused), both are refused too.
    eventually(
        "alice's delivery written",
        Duration::from_secs(30),
        || async {
            let document: Value = app.client.status(&urls[0]).await.json().await.unwrap();
            (document["ownerId"] == "alice").then_some(())
        },
    )
    .await;
    let retried = post(owned(0, "alice")).await;
    assert_eq!(retried.status(), 202);
    assert!(
        ratelimit(&retried).is_none(),
        "a retry that finds its status is not metered"
    );
    for n in 100.. {
        if post(owned(n, "alice")).await.status() == 429 {
            break;
        }
    }
    assert_eq!(app.client.cancel(&urls[0]).await.status(), 429);
    let patch = app
        .client
        .http
        .patch(urls[0].replacen("/status?", "?", 1))
        .header("content-type", "application/merge-patch+json")
        .body(r#"{"pickupLocation":"47.1,-122.1"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(patch.status(), 429);
    // Status reads are never metered.
    for _ in 0..10 {
        let read = app.client.status(&urls[1]).await;
        assert_eq!(read.status(), 200);
        assert!(ratelimit(&read).is_none());
    }
    app.app.stop().await.unwrap();
}

#[tokio::test]
async fn tokens_with_one_subject_and_different_client_claims_have_separate_buckets() {
    const SECRET: &str = "an HS256 secret of at least 32 characters";
    let dir = tempfile::tempdir().unwrap();
    let mut settings = test_settings(dir.path());
    settings.gateway.auth.enabled = Some(true);
    settings.gateway.auth.jwt = Some(JwtSettings {
        issuer: "https://issuer.example/".into(),
        audience: "api://skyport".into(),
        hs256_secret: Some(SecretString::from(SECRET)),
        ..JwtSettings::default()
    });
    settings.gateway.quotas.default_per_s = Some(1);
    settings.gateway.quotas.burst = Some(2);
    settings.gateway.quotas.client_claim = Some("azp".to_owned());
    let app = TestApp::spawn_with(settings).await;
    // Every token has the same subject; `azp` names the application.
    let bearer = |azp: Option<&str>| {
        let mut claims = json!({
            "iss": "https://issuer.example/",
            "aud": "api://skyport",
            "sub": "shared-subject",
            "exp": get_current_timestamp() + 600,
            "scp": "deliveries.read deliveries.write",
        });
        if let Some(azp) = azp {
            claims["azp"] = azp.into();
        }
        let key = EncodingKey::from_secret(SECRET.as_bytes());
        let token = encode(&Header::new(Algorithm::HS256), &claims, &key).unwrap();
        app.client
            .with_header("authorization", &format!("Bearer {token}"))
    };
    let (mobile, portal) = (bearer(Some("mobile-app")), bearer(Some("partner-portal")));
    let post = |client: &skyport_tests::Client, n: usize| {
        let client = client.clone();
        async move {
            client
                .post_raw("application/json", delivery_request(n).to_string())
                .await
        }
    };

    for n in 0..2 {
        assert_eq!(post(&mobile, n).await.status(), 202);
    }
    let refused = post(&mobile, 2).await;
    assert_eq!(refused.status(), 429);
    let problem: Value = refused.json().await.unwrap();
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .starts_with("client \"jwt:mobile-app\" is over its quota"),
        "{problem}"
    );
    // The same subject under another application: a bucket of its own.
    for n in 10..12 {
        let response = post(&portal, n).await;
        assert_eq!(response.status(), 202);
        assert!(ratelimit(&response).is_some());
    }
    assert_eq!(post(&portal, 12).await.status(), 429);

    // A token that does not name its application is refused, naming the claim.
    let unnamed = post(&bearer(None), 20).await;
    assert_eq!(unnamed.status(), 401);
    assert!(unnamed.headers().contains_key("www-authenticate"));
    let problem: Value = unnamed.json().await.unwrap();
    assert_eq!(
        problem["detail"],
        "the bearer token has no `azp` claim with a string value, which names its client for quotas"
    );
    app.app.stop().await.unwrap();
}

#[tokio::test]
async fn the_dashboards_data_counts_each_clients_accepted_and_refused_requests() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = test_settings(dir.path());
    settings.gateway.quotas.default_per_s = Some(1);
    settings.gateway.quotas.burst = Some(3);
    let app = TestApp::spawn_with(settings).await;
    let mut n = 0;
    // What each owner was answered: (name, accepted, refused).
    let mut answered = Vec::new();
    for (owner, posts) in [("top-alice", 5), ("top-bob", 2), ("top-carol", 1)] {
        let (mut accepted, mut refused) = (0, 0);
        for _ in 0..posts {
            n += 1;
            let status = app
                .client
                .post_raw("application/json", owned(n, owner).to_string())
                .await
                .status();
            match status.as_u16() {
                202 => accepted += 1,
                429 => refused += 1,
                other => panic!("{owner} was answered {other}"),
            }
        }
        answered.push((owner, accepted, refused));
    }
    // A burst of 3 at 1 a second: alice is refused at least once.
    assert!(answered[0].2 >= 1, "{answered:?}");
    let data = format!("{}/dashboard/data", app.client.base);
    let snapshot: Value = app
        .client
        .http
        .get(&data)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let counts: Vec<(&str, u64, u64)> = snapshot["topClients"]
        .as_array()
        .unwrap_or_else(|| panic!("no topClients: {snapshot}"))
        .iter()
        .map(|client| {
            (
                client["name"].as_str().unwrap(),
                client["accepted"].as_u64().unwrap(),
                client["refused"].as_u64().unwrap(),
            )
        })
        .collect();
    // Busiest first, each counted as it was answered.
    assert_eq!(counts, answered);
    // No series is labelled with a client: the metrics do not grow with them.
    for (name, samples) in snapshot["metrics"].as_object().unwrap() {
        for sample in samples.as_array().unwrap() {
            let labels = sample["labels"].to_string();
            assert!(!labels.contains("top-alice"), "{name} {labels}");
        }
    }
    app.app.stop().await.unwrap();
}
