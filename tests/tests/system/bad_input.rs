//! Every kind of bad input gets the right 4xx with a problem+json body, never a 5xx.

#![allow(clippy::unwrap_used)]

use serde_json::{Value, json};
use skyport_tests::{TestApp, delivery_request};

struct Case {
    name: &'static str,
    content_type: Option<&'static str>,
    body: Vec<u8>,
    status: u16,
    code: &'static str,
    /// For 422: a field the problem must name.
    field: Option<&'static str>,
}

fn case(name: &'static str, body: impl Into<Vec<u8>>, status: u16, code: &'static str) -> Case {
    Case {
        name,
        content_type: Some("application/json"),
        body: body.into(),
        status,
        code,
        field: None,
    }
}

fn invalid(name: &'static str, body: &Value, field: &'static str) -> Case {
    Case {
        field: Some(field),
        ..case(name, body.to_string(), 422, "ValidationFailed")
    }
}

fn with(change: impl FnOnce(&mut Value)) -> Value {
    let mut body = delivery_request(1);
    change(&mut body);
    body
}

fn cases() -> Vec<Case> {
    let deep = "[".repeat(10_000);
    let mut oversized = delivery_request(1);
    oversized["packageInfo"]["tag"] = Value::String("x".repeat(70 * 1024));
    vec![
        case("truncated JSON", r#"{"ownerId": "#, 400, "MalformedJson"),
        case("not JSON", "hello", 400, "MalformedJson"),
        case("empty body", "", 400, "MalformedJson"),
        case(
            "trailing garbage",
            format!("{} }}", delivery_request(1)),
            400,
            "MalformedJson",
        ),
        case(
            "invalid UTF-8",
            b"{\"ownerId\": \"\xff\xfe\"}".to_vec(),
            400,
            "MalformedJson",
        ),
        case("10,000 nested arrays", deep, 400, "MalformedJson"),
        Case {
            field: Some("(body)"),
            ..case("an array, not an object", "[1,2]", 422, "ValidationFailed")
        },
        invalid(
            "weight as a string",
            &with(|b| b["packageInfo"]["weight"] = json!("heavy")),
            "packageInfo.weight",
        ),
        invalid(
            "expedited as a string",
            &with(|b| b["expedited"] = json!("yes")),
            "expedited",
        ),
        invalid(
            "ownerId as a number",
            &with(|b| b["ownerId"] = json!(42)),
            "ownerId",
        ),
        invalid(
            "pickupTime not RFC 3339",
            &with(|b| b["pickupTime"] = json!("tomorrow")),
            "pickupTime",
        ),
        invalid(
            "the reference implementation's own test deadline",
            &with(|b| b["deadline"] = json!("LineOfDeadlyZombiatedPeople")),
            "deadline",
        ),
        invalid(
            "pickupTime past year 9999 in milliseconds",
            &with(|b| b["pickupTime"] = json!(253_402_300_800_000_i64)),
            "pickupTime",
        ),
        invalid(
            "a null weight",
            &with(|b| b["packageInfo"]["weight"] = json!(null)),
            "packageInfo.weight",
        ),
        invalid(
            "both spellings of dropoffLocation",
            &with(|b| b["dropOffLocation"] = json!("47.61,-122.20")),
            "dropoffLocation",
        ),
        invalid(
            "unknown package size",
            &with(|b| b["packageInfo"]["size"] = json!("Huge")),
            "packageInfo.size",
        ),
        invalid(
            "unknown confirmation",
            &with(|b| b["confirmationRequired"] = json!("Smoke")),
            "confirmationRequired",
        ),
        invalid(
            "missing ownerId",
            &with(|b| {
                b.as_object_mut().unwrap().remove("ownerId");
            }),
            "ownerId",
        ),
        invalid(
            "missing packageId",
            &with(|b| {
                b["packageInfo"]
                    .as_object_mut()
                    .unwrap()
                    .remove("packageId");
            }),
            "packageInfo.packageId",
        ),
        invalid(
            "missing packageInfo",
            &with(|b| {
                b.as_object_mut().unwrap().remove("packageInfo");
            }),
            "packageInfo",
        ),
        invalid(
            "extra top-level field",
            &with(|b| b["colour"] = json!("red")),
            "colour",
        ),
        invalid(
            "extra nested field",
            &with(|b| b["packageInfo"]["colour"] = json!("red")),
            "packageInfo.colour",
        ),
        invalid(
            "deadline before pickup",
            &with(|b| b["deadline"] = json!("2029-01-01T00:00:00Z")),
            "deadline",
        ),
        invalid(
            "zero weight",
            &with(|b| b["packageInfo"]["weight"] = json!(0)),
            "packageInfo.weight",
        ),
        invalid(
            "delivery id with a space",
            &with(|b| b["deliveryId"] = json!("a b")),
            "deliveryId",
        ),
        invalid(
            "empty pickup location",
            &with(|b| b["pickupLocation"] = json!("  ")),
            "pickupLocation",
        ),
        invalid(
            "callback not http",
            &with(|b| b["callbackUrl"] = json!("javascript:alert(1)")),
            "callbackUrl",
        ),
        case(
            "oversized body",
            oversized.to_string(),
            413,
            "PayloadTooLarge",
        ),
        Case {
            content_type: Some("text/plain"),
            ..case(
                "text/plain",
                delivery_request(1).to_string(),
                415,
                "UnsupportedMediaType",
            )
        },
        Case {
            content_type: Some("application/xml"),
            ..case("XML", "<a/>", 415, "UnsupportedMediaType")
        },
        Case {
            content_type: None,
            ..case(
                "no content type",
                delivery_request(1).to_string(),
                415,
                "UnsupportedMediaType",
            )
        },
    ]
}

async fn assert_problem(response: reqwest::Response, status: u16, code: &str, what: &str) -> Value {
    assert_eq!(response.status().as_u16(), status, "{what}");
    let content_type = response.headers()["content-type"]
        .to_str()
        .unwrap()
        .to_owned();
    assert_eq!(content_type, "application/problem+json", "{what}");
    let problem: Value = response.json().await.unwrap();
    assert_eq!(problem["status"], status, "{what}: {problem}");
    assert_eq!(problem["code"], code, "{what}: {problem}");
    assert!(
        problem["title"].is_string() && problem["detail"].is_string(),
        "{what}: {problem}"
    );
    problem
}

#[tokio::test]
async fn bad_requests_get_the_right_problem_and_never_a_server_error() {
    let dir = tempfile::tempdir().unwrap();
    let app = TestApp::spawn(&dir).await;
    let http = &app.client.http;
    let url = format!("{}/api/deliveryrequests", app.client.base);
    for case in cases() {
        let mut request = http.post(&url).body(case.body.clone());
        if let Some(content_type) = case.content_type {
            request = request.header("content-type", content_type);
        }
        let response = request.send().await.unwrap();
        let problem = assert_problem(response, case.status, case.code, case.name).await;
        if let Some(field) = case.field {
            let named: Vec<&str> = problem["errors"]
                .as_array()
                .unwrap_or_else(|| panic!("{}: no errors in {problem}", case.name))
                .iter()
                .map(|e| e["field"].as_str().unwrap())
                .collect();
            assert!(
                named.contains(&field),
                "{}: {named:?} should name {field}",
                case.name
            );
        }
    }
    let idempotency = http
        .post(&url)
        .header("content-type", "application/json")
        .header("idempotency-key", "")
        .body(delivery_request(1).to_string())
        .send()
        .await
        .unwrap();
    assert_problem(idempotency, 400, "BadRequest", "empty Idempotency-Key").await;
    app.app.stop().await.unwrap();
}

#[tokio::test]
async fn unknown_ids_routes_and_methods_are_problems_too() {
    let dir = tempfile::tempdir().unwrap();
    let app = TestApp::spawn(&dir).await;
    let http = &app.client.http;
    let base = &app.client.base;
    let accepted = app.client.post_delivery(&delivery_request(1)).await;
    let forged = accepted.status_url.replace("delivery-1", "delivery-2");
    let gets = [
        (
            format!("{base}/api/deliveryrequests/no-such-id/status"),
            404,
            "NotFound",
        ),
        (
            format!("{base}/api/deliveryrequests/no-such-id/status?receipt=AAAA"),
            404,
            "NotFound",
        ),
        (
            format!("{base}/api/deliveryrequests/a%20b/status"),
            404,
            "NotFound",
        ),
        (
            app.client.base.clone() + &forged[forged.find("/api/").unwrap()..],
            404,
            "NotFound",
        ),
        (format!("{base}/api/nothing-here"), 404, "NotFound"),
    ];
    for (url, status, code) in gets {
        assert_problem(http.get(&url).send().await.unwrap(), status, code, &url).await;
    }
    let wrong_method = http
        .delete(format!("{base}/api/deliveryrequests"))
        .send()
        .await
        .unwrap();
    assert_problem(
        wrong_method,
        405,
        "MethodNotAllowed",
        "DELETE on the collection",
    )
    .await;
    let put_status = http
        .put(format!("{base}/api/deliveryrequests/delivery-1/status"))
        .send()
        .await
        .unwrap();
    assert_problem(put_status, 405, "MethodNotAllowed", "PUT on a status").await;
    // Status URLs are absolute and built from Host: one that is not a host is refused.
    for host in ["user@example.com", ""] {
        let response = http
            .post(format!("{base}/api/deliveryrequests"))
            .header("host", host)
            .header("content-type", "application/json")
            .body(delivery_request(90).to_string())
            .send()
            .await
            .unwrap();
        assert_problem(response, 400, "BadRequest", &format!("Host {host:?}")).await;
    }
    app.app.stop().await.unwrap();
}
