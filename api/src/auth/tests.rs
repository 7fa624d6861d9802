use axum::http::StatusCode;
use axum::response::IntoResponse;
use jsonwebtoken::{EncodingKey, Header, encode, get_current_timestamp};
use secrecy::SecretString;
use serde_json::json;
use skyport_runtime::config::{ApiKeySettings, JwtSettings};

use super::*;

const WRITER: &str = "writer-key-0123456789abcdef0123456789";
const READER: &str = "reader-key-0123456789abcdef0123456789";
const SECRET: &str = "an HS256 secret of at least 32 characters";

fn settings(api_keys: bool, jwt: bool) -> Settings {
    let mut settings = Settings::default();
    let auth = &mut settings.gateway.auth;
    auth.enabled = Some(true);
    if api_keys {
        for (name, key, scopes) in [
            ("portal", WRITER, Scope::all()),
            ("dashboard", READER, vec![Scope::Read]),
        ] {
            auth.api_keys.insert(
                name.into(),
                ApiKeySettings {
                    key: SecretString::from(key),
                    scopes,
                },
            );
        }
    }
    if jwt {
        auth.jwt = Some(JwtSettings {
            issuer: "https://issuer.example/".into(),
            audience: "api://skyport".into(),
            hs256_secret: Some(SecretString::from(SECRET)),
            ..JwtSettings::default()
        });
    }
    settings
}

async fn auth(api_keys: bool, jwt: bool) -> Auth {
    Auth::from_settings(&settings(api_keys, jwt))
        .await
        .unwrap()
        .unwrap()
}

fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
    pairs
        .iter()
        .map(|(name, value)| {
            (
                header::HeaderName::from_static(name),
                HeaderValue::from_str(value).unwrap(),
            )
        })
        .collect()
}

fn token(scp: &str) -> String {
    let claims = json!({
        "iss": "https://issuer.example/",
        "aud": "api://skyport",
        "sub": "client-1",
        "exp": get_current_timestamp() + 600,
        "scp": scp,
    });
    let key = EncodingKey::from_secret(SECRET.as_bytes());
    encode(&Header::default(), &claims, &key).unwrap()
}

/// The status, `WWW-Authenticate` and detail of a refusal.
fn refusal(error: ApiError) -> (StatusCode, Option<String>, String) {
    let detail = error.to_string();
    let response = error.into_response();
    let challenge = response
        .headers()
        .get(header::WWW_AUTHENTICATE)
        .map(|value| value.to_str().unwrap().to_owned());
    (response.status(), challenge, detail)
}

#[tokio::test]
async fn auth_is_off_unless_enabled() {
    assert!(
        Auth::from_settings(&Settings::default())
            .await
            .unwrap()
            .is_none()
    );
}

#[tokio::test]
async fn an_api_key_is_its_principal_within_its_scopes() {
    let auth = auth(true, false).await;
    let writer = headers(&[(API_KEY_HEADER, WRITER)]);
    let reader = headers(&[(API_KEY_HEADER, READER)]);
    for scope in [Scope::Read, Scope::Write] {
        let principal = auth.authenticate(&writer, scope).await.unwrap();
        assert_eq!(principal.name, "portal");
    }
    let principal = auth.authenticate(&reader, Scope::Read).await.unwrap();
    assert_eq!(principal.name, "dashboard");
    let (status, challenge, detail) =
        refusal(auth.authenticate(&reader, Scope::Write).await.unwrap_err());
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(challenge, None);
    assert_eq!(
        detail,
        "the API key dashboard does not have the deliveries.write scope"
    );
}

#[tokio::test]
async fn missing_and_unknown_credentials_are_401_with_a_challenge() {
    let auth = auth(true, false).await;
    for (headers, detail) in [
        (
            headers(&[]),
            "this request needs credentials: an X-API-Key header",
        ),
        (
            headers(&[(API_KEY_HEADER, "writer-key-0123456789abcdef0123456788")]),
            "the API key is not known",
        ),
        (
            headers(&[("authorization", "Bearer abc")]),
            "bearer tokens are not accepted here; send an X-API-Key header",
        ),
        (
            headers(&[(API_KEY_HEADER, WRITER), ("authorization", "Bearer abc")]),
            "send one credential: either X-API-Key or Authorization, not both",
        ),
    ] {
        let (status, challenge, text) =
            refusal(auth.authenticate(&headers, Scope::Read).await.unwrap_err());
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert_eq!(challenge.as_deref(), Some("ApiKey"));
        assert_eq!(text, detail);
    }
}

#[tokio::test]
async fn a_bearer_token_is_its_subject_within_its_scopes() {
    let auth = auth(true, true).await;
    let bearer = |token: &str| headers(&[("authorization", &format!("Bearer {token}"))]);
    let principal = auth
        .authenticate(&bearer(&token("deliveries.write")), Scope::Write)
        .await
        .unwrap();
    // A token's principal is kept apart from every API key's name.
    assert_eq!(principal.name, "jwt:client-1");
    assert_eq!(principal.client(), "jwt:client-1");
    assert_eq!(principal.legacy.as_deref(), Some("client-1"));
    assert!(principal.may_touch(Some("jwt:client-1")));
    assert!(
        principal.may_touch(Some("client-1")),
        "made before the namespaces"
    );
    assert!(!principal.may_touch(Some("portal")));
    assert!(!principal.may_touch(None));
    let lowercase = headers(&[(
        "authorization",
        &format!("bearer {}", token("deliveries.read")),
    )]);
    assert!(auth.authenticate(&lowercase, Scope::Read).await.is_ok());
    let (status, _, detail) = refusal(
        auth.authenticate(&bearer(&token("deliveries.read")), Scope::Write)
            .await
            .unwrap_err(),
    );
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(detail.contains("deliveries.write"), "{detail}");
    for authorization in ["Basic dXNlcjpwYXNz", "Bearer ", "Bearer"] {
        let (status, challenge, detail) = refusal(
            auth.authenticate(&headers(&[("authorization", authorization)]), Scope::Read)
                .await
                .unwrap_err(),
        );
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{authorization}");
        assert_eq!(
            challenge.as_deref(),
            Some("Bearer realm=\"skyport\", ApiKey")
        );
        assert_eq!(detail, "the Authorization header must be `Bearer <token>`");
    }
    let (_, _, detail) = refusal(
        auth.authenticate(&bearer("not-a-jwt"), Scope::Read)
            .await
            .unwrap_err(),
    );
    assert_eq!(detail, "the bearer token is not a well-formed JWT");
}

#[tokio::test]
async fn with_a_client_claim_a_token_is_charged_to_it_and_an_api_key_to_its_name() {
    let mut settings = settings(true, true);
    settings.gateway.quotas.default_per_s = Some(10);
    settings.gateway.quotas.client_claim = Some("azp".into());
    let auth = Auth::from_settings(&settings).await.unwrap().unwrap();
    let bearer = |azp: Option<&str>| {
        let mut claims = json!({
            "iss": "https://issuer.example/",
            "aud": "api://skyport",
            "sub": "client-1",
            "exp": get_current_timestamp() + 600,
            "scp": "deliveries.write",
        });
        if let Some(azp) = azp {
            claims["azp"] = azp.into();
        }
        let key = EncodingKey::from_secret(SECRET.as_bytes());
        let token = encode(&Header::default(), &claims, &key).unwrap();
        headers(&[("authorization", &format!("Bearer {token}"))])
    };
    let principal = auth
        .authenticate(&bearer(Some("mobile-app")), Scope::Write)
        .await
        .unwrap();
    assert_eq!(principal.name, "jwt:client-1", "the subject still owns");
    assert_eq!(principal.client(), "jwt:mobile-app");
    let (status, challenge, detail) = refusal(
        auth.authenticate(&bearer(None), Scope::Write)
            .await
            .unwrap_err(),
    );
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(challenge.is_some());
    assert_eq!(
        detail,
        "the bearer token has no `azp` claim with a string value, which names its client for quotas"
    );
    let key = auth
        .authenticate(&headers(&[(API_KEY_HEADER, WRITER)]), Scope::Write)
        .await
        .unwrap();
    assert_eq!(key.client(), "portal");
}

#[tokio::test]
async fn with_tokens_only_an_api_key_is_refused() {
    let auth = auth(false, true).await;
    let (status, challenge, detail) = refusal(
        auth.authenticate(&headers(&[(API_KEY_HEADER, WRITER)]), Scope::Read)
            .await
            .unwrap_err(),
    );
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(challenge.as_deref(), Some("Bearer realm=\"skyport\""));
    assert_eq!(
        detail,
        "API keys are not accepted here; send an Authorization: Bearer token"
    );
}

#[test]
fn reads_need_the_read_scope_admin_operations_the_admin_scope_and_the_rest_the_write_scope() {
    let api = "/api/deliveryrequests";
    assert_eq!(scope_for(&Method::GET, api), Scope::Read);
    assert_eq!(scope_for(&Method::HEAD, api), Scope::Read);
    assert_eq!(scope_for(&Method::POST, api), Scope::Write);
    assert_eq!(scope_for(&Method::DELETE, api), Scope::Write);
    assert_eq!(scope_for(&Method::POST, "/admin/redrive"), Scope::Admin);
    // The reports and the dashboard's data hold every client's.
    assert_eq!(
        scope_for(&Method::GET, "/admin/change-feed/dead-letters"),
        Scope::Admin
    );
    assert_eq!(scope_for(&Method::GET, "/dashboard/data"), Scope::Admin);
}

#[tokio::test]
async fn a_token_whose_subject_is_an_api_keys_name_is_not_that_key() {
    let auth = auth(true, true).await;
    let claims = json!({
        "iss": "https://issuer.example/",
        "aud": "api://skyport",
        "sub": "portal",
        "exp": get_current_timestamp() + 600,
        "scp": "deliveries.read deliveries.write",
    });
    let token = encode(
        &Header::default(),
        &claims,
        &EncodingKey::from_secret(SECRET.as_bytes()),
    )
    .unwrap();
    let token = auth
        .authenticate(
            &headers(&[("authorization", &format!("Bearer {token}"))]),
            Scope::Read,
        )
        .await
        .unwrap();
    let key = auth
        .authenticate(&headers(&[(API_KEY_HEADER, WRITER)]), Scope::Read)
        .await
        .unwrap();
    assert_eq!(key.name, "portal");
    assert_eq!(token.name, "jwt:portal");
    assert_eq!(token.legacy, None, "an API key has that name");
    assert!(!token.may_touch(Some("portal")));
    assert!(!key.may_touch(Some("jwt:portal")));
}
