//! Authentication of the `/api` routes over real HTTP: API keys and their
//! scopes, HS256 bearer tokens, RS256 tokens checked against a JWKS that the
//! test serves itself, and ops routes that never need credentials.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use jsonwebtoken::jwk::{Jwk, JwkSet};
use jsonwebtoken::{Algorithm, EncodingKey, Header, encode, get_current_timestamp};
use secrecy::SecretString;
use serde_json::{Value, json};
use skyport_core::status::DeliveryState;
use skyport_runtime::config::{JwtSettings, Scope, Settings};
use skyport_tests::{TestApp, delivery_request, test_settings, with_api_keys};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

const WRITER: &str = "portal-key-0123456789abcdef0123456789";
const READER: &str = "dashboard-key-0123456789abcdef01234567";
const OPS: &str = "ops-key-0123456789abcdef0123456789abcd";
const SECRET: &str = "an HS256 secret of at least 32 characters";
const ISSUER: &str = "https://issuer.example/";
const AUDIENCE: &str = "api://skyport";
const RS256_PRIVATE: &str = include_str!("../../fixtures/jwt/rs256-private.pem");
const WAIT: Duration = Duration::from_secs(30);

/// Auth on, with a read-write key, a read-only key, an operator's key (read
/// and admin) and HS256 tokens.
fn auth_settings(dir: &Path) -> Settings {
    let mut settings = test_settings(dir);
    with_api_keys(
        &mut settings,
        &[
            ("portal", WRITER, &[Scope::Read, Scope::Write]),
            ("dashboard", READER, &[Scope::Read]),
            ("ops", OPS, &[Scope::Read, Scope::Admin]),
        ],
    );
    settings.gateway.auth.jwt = Some(JwtSettings {
        issuer: ISSUER.into(),
        audience: AUDIENCE.into(),
        hs256_secret: Some(SecretString::from(SECRET)),
        ..JwtSettings::default()
    });
    settings
}

fn claims(scopes: &str, expires_in: i64) -> Value {
    json!({
        "iss": ISSUER,
        "aud": AUDIENCE,
        "sub": "client-1",
        "exp": get_current_timestamp().saturating_add_signed(expires_in),
        "scp": scopes,
    })
}

fn hs256(claims: &Value) -> String {
    let key = EncodingKey::from_secret(SECRET.as_bytes());
    encode(&Header::new(Algorithm::HS256), claims, &key).unwrap()
}

/// Asserts `response` is a problem document with `status` and `code`; returns its detail.
async fn problem(response: reqwest::Response, status: u16, code: &str) -> String {
    assert_eq!(response.status(), status);
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json"
    );
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["code"], code, "{body}");
    body["detail"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn api_routes_need_credentials_and_ops_routes_do_not() {
    let dir = tempfile::tempdir().unwrap();
    let app = TestApp::spawn_with(auth_settings(dir.path())).await;
    let accepted = app
        .client
        .with_header("x-api-key", WRITER)
        .post_delivery(&delivery_request(1))
        .await;
    let anonymous = &app.client;
    for response in [
        anonymous
            .post_raw("application/json", delivery_request(2).to_string())
            .await,
        anonymous.status(&accepted.status_url).await,
        anonymous.cancel(&accepted.status_url).await,
    ] {
        assert_eq!(
            response.headers()["www-authenticate"],
            "Bearer realm=\"skyport\", ApiKey"
        );
        let detail = problem(response, 401, "Unauthorized").await;
        assert_eq!(
            detail,
            "this request needs credentials: an X-API-Key header or an Authorization: Bearer token"
        );
    }
    let unknown = anonymous.with_header("x-api-key", "not-a-key-but-long-enough-to-be-one");
    let response = unknown.status(&accepted.status_url).await;
    assert!(response.headers().contains_key("www-authenticate"));
    let detail = problem(response, 401, "Unauthorized").await;
    assert_eq!(detail, "the API key is not known");
    for path in ["/healthz", "/readyz"] {
        let response = anonymous
            .http
            .get(format!("{}{path}", anonymous.base))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{path}");
    }
    // The reference implementation's readiness route, as its probes read it.
    let probe = anonymous
        .http
        .get(format!("{}/api/probe", anonymous.base))
        .send()
        .await
        .unwrap();
    assert_eq!(probe.status(), 200);
    assert_eq!(probe.json::<Value>().await.unwrap(), "OK");
    // The reports of the change-feed processor hold every client's data:
    // the admin scope's, as the dashboard's data (every client's figures).
    let reader = anonymous.with_header("x-api-key", READER);
    let ops = anonymous.with_header("x-api-key", OPS);
    let page = format!("{}/dashboard", anonymous.base);
    let response = anonymous.http.get(&page).send().await.unwrap();
    assert_eq!(response.status(), 200, "the page carries no data");
    for path in ["/admin/change-feed/dead-letters", "/dashboard/data"] {
        let url = format!("{}{path}", anonymous.base);
        let response = anonymous.http.get(&url).send().await.unwrap();
        problem(response, 401, "Unauthorized").await;
        let response = reader.http.get(&url).send().await.unwrap();
        let detail = problem(response, 403, "Forbidden").await;
        assert!(detail.contains("deliveries.admin"), "{detail}");
        let token = hs256(&claims("deliveries.read deliveries.write", 60));
        let response = anonymous
            .http
            .get(&url)
            .bearer_auth(token)
            .send()
            .await
            .unwrap();
        problem(response, 403, "Forbidden").await;
        let response = ops.http.get(&url).send().await.unwrap();
        assert_eq!(response.status(), 200, "{path}");
        let token = hs256(&claims("deliveries.read deliveries.admin", 60));
        let response = anonymous
            .http
            .get(&url)
            .bearer_auth(token)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{path}");
    }
    let snapshot: Value = ops
        .http
        .get(format!("{}/dashboard/data", ops.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(snapshot["metrics"].is_object(), "{snapshot}");
    assert!(snapshot.get("topClients").is_none(), "quotas are off");
    let response = anonymous
        .http
        .get(format!("{}/api/nothing-here", anonymous.base))
        .send()
        .await
        .unwrap();
    problem(response, 404, "NotFound").await;
    let response = anonymous
        .http
        .put(format!("{}/api/deliveryrequests", anonymous.base))
        .send()
        .await
        .unwrap();
    problem(response, 405, "MethodNotAllowed").await;
    app.app.stop().await.unwrap();
}

#[tokio::test]
async fn a_gateway_with_its_dashboard_off_serves_none_of_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = auth_settings(dir.path());
    settings.gateway.dashboard = Some(false);
    let app = TestApp::spawn_with(settings).await;
    let reader = app.client.with_header("x-api-key", READER);
    for path in ["/dashboard", "/dashboard/data"] {
        let response = reader
            .http
            .get(format!("{}{path}", reader.base))
            .send()
            .await
            .unwrap();
        problem(response, 404, "NotFound").await;
    }
    app.app.stop().await.unwrap();
}

#[tokio::test]
async fn a_key_with_the_write_scope_posts_and_polls_and_another_principals_read_only_key_sees_nothing()
 {
    let dir = tempfile::tempdir().unwrap();
    let app = TestApp::spawn_with(auth_settings(dir.path())).await;
    let writer = app.client.with_header("x-api-key", WRITER);
    let reader = app.client.with_header("x-api-key", READER);
    let accepted = writer.post_delivery(&delivery_request(1)).await;
    writer
        .wait_for_state(&accepted.status_url, DeliveryState::Scheduled, WAIT)
        .await;
    // Another principal's: as if the id were unknown.
    problem(reader.status(&accepted.status_url).await, 404, "NotFound").await;
    let response = reader
        .post_raw("application/json", delivery_request(2).to_string())
        .await;
    assert!(!response.headers().contains_key("www-authenticate"));
    let detail = problem(response, 403, "Forbidden").await;
    assert_eq!(
        detail,
        "the API key dashboard does not have the deliveries.write scope"
    );
    let response = reader.cancel(&accepted.status_url).await;
    problem(response, 403, "Forbidden").await;
    app.app.stop().await.unwrap();
}

#[tokio::test]
async fn a_bearer_token_with_the_write_scope_posts() {
    let dir = tempfile::tempdir().unwrap();
    let app = TestApp::spawn_with(auth_settings(dir.path())).await;
    let bearer = |token: String| {
        app.client
            .with_header("authorization", &format!("Bearer {token}"))
    };
    let writer = bearer(hs256(&claims("deliveries.read deliveries.write", 600)));
    let accepted = writer.post_delivery(&delivery_request(1)).await;
    writer
        .wait_for_state(&accepted.status_url, DeliveryState::Scheduled, WAIT)
        .await;
    let reader = bearer(hs256(&claims("deliveries.read", 600)));
    assert_eq!(reader.status(&accepted.status_url).await.status(), 200);
    let response = reader
        .post_raw("application/json", delivery_request(2).to_string())
        .await;
    let detail = problem(response, 403, "Forbidden").await;
    assert!(detail.contains("deliveries.write"), "{detail}");
    let expired = bearer(hs256(&claims("deliveries.write", -600)));
    let response = expired
        .post_raw("application/json", delivery_request(3).to_string())
        .await;
    let detail = problem(response, 401, "Unauthorized").await;
    assert_eq!(detail, "the bearer token has expired");
    app.app.stop().await.unwrap();
}

/// A JWKS document at `/keys` on 127.0.0.1, counting its fetches, until `stop` fires.
struct JwksServer {
    url: String,
    fetches: Arc<AtomicUsize>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl JwksServer {
    async fn start(keys: JwkSet) -> Self {
        let fetches = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&fetches);
        let document = serde_json::to_string(&keys).unwrap();
        let router = Router::new().route(
            "/keys",
            get(move || {
                counter.fetch_add(1, Ordering::SeqCst);
                let document = document.clone();
                async move { ([("content-type", "application/json")], document) }
            }),
        );
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/keys", listener.local_addr().unwrap());
        let stop = CancellationToken::new();
        let task = tokio::spawn(
            axum::serve(listener, router)
                .with_graceful_shutdown(stop.clone().cancelled_owned())
                .into_future(),
        );
        Self {
            url,
            fetches,
            stop,
            task,
        }
    }

    async fn stop(self) {
        self.stop.cancel();
        self.task.await.unwrap().unwrap();
    }
}

#[tokio::test]
async fn rs256_tokens_are_checked_against_the_issuers_jwks() {
    let private = EncodingKey::from_rsa_pem(RS256_PRIVATE.as_bytes()).unwrap();
    let mut jwk = Jwk::from_encoding_key(&private, Algorithm::RS256).unwrap();
    jwk.common.key_id = Some("test-key".into());
    let jwks = JwksServer::start(JwkSet { keys: vec![jwk] }).await;
    let dir = tempfile::tempdir().unwrap();
    let mut settings = test_settings(dir.path());
    settings.gateway.auth.enabled = Some(true);
    settings.gateway.auth.jwt = Some(JwtSettings {
        issuer: ISSUER.into(),
        audience: AUDIENCE.into(),
        jwks_url: Some(jwks.url.parse().unwrap()),
        ..JwtSettings::default()
    });
    let app = TestApp::spawn_with(settings).await;
    assert_eq!(jwks.fetches.load(Ordering::SeqCst), 1, "fetched at start");
    let signed = |kid: &str| {
        let mut header = Header::new(Algorithm::RS256);
        header.kid = Some(kid.into());
        let claims = json!({
            "iss": ISSUER,
            "aud": AUDIENCE,
            "sub": "service-principal-1",
            "exp": get_current_timestamp() + 600,
            "roles": ["deliveries.write"],
        });
        let token = encode(&header, &claims, &private).unwrap();
        app.client
            .with_header("authorization", &format!("Bearer {token}"))
    };
    signed("test-key").post_delivery(&delivery_request(1)).await;
    let response = signed("rotated-key")
        .post_raw("application/json", delivery_request(2).to_string())
        .await;
    let detail = problem(response, 401, "Unauthorized").await;
    assert_eq!(
        detail,
        "the bearer token is signed with a key the issuer does not publish"
    );
    assert_eq!(
        jwks.fetches.load(Ordering::SeqCst),
        1,
        "an unknown key id fetches again at most once a minute"
    );
    app.app.stop().await.unwrap();
    jwks.stop().await;
}

#[tokio::test]
async fn a_jwks_that_cannot_be_fetched_stops_the_start() {
    // A port that was just free: nothing listens there.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    drop(listener);
    let dir = tempfile::tempdir().unwrap();
    let mut settings = test_settings(dir.path());
    settings.gateway.auth.enabled = Some(true);
    settings.gateway.auth.jwt = Some(JwtSettings {
        issuer: ISSUER.into(),
        audience: AUDIENCE.into(),
        jwks_url: Some(format!("http://{address}/keys").parse().unwrap()),
        ..JwtSettings::default()
    });
    let error = skyport::App::start(settings, CancellationToken::new())
        .await
        .unwrap_err();
    let message = format!("{error:#}");
    assert!(
        message.starts_with(&format!(
            "cannot fetch the token signing keys at gateway.auth.jwt.jwks_url = http://{address}/keys: the request failed"
        )),
        "{message}"
    );
}
