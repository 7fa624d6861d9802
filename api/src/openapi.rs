//! The OpenAPI document: derived from the handlers and types, served at
//! `/openapi.json` and committed as `openapi/openapi.json` (written by
//! `cargo run -p skyport-gateway --bin skyport-openapi`; a test fails when the
//! committed file drifts from the code).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use skyport_core::status::StatusDocument;
use skyport_runtime::problem::{PROBLEM_JSON, Problem};
use utoipa::openapi::header::HeaderBuilder;
use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{Content, RefOr, Response, ResponseBuilder};
use utoipa::{IntoResponses, Modify, OpenApi, PartialSchema, ToSchema};

/// Where the committed document lives, relative to the workspace root.
pub const COMMITTED_PATH: &str = "openapi/openapi.json";

/// The header an API key travels in.
pub const API_KEY_HEADER: &str = "X-API-Key";

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Skyport",
        description = "The front door of a drone-delivery scheduler. POST a delivery request: the answer is 202 once it is durable, with a status URL to poll (asynchronous request-reply). Errors are `application/problem+json` (RFC 9457).\n\nAuthentication is configurable (`gateway.auth`): off in the embedded default, on in the Azure profile, by API key (`X-API-Key`) or JWT bearer token.",
        license(name = "MIT", identifier = "MIT"),
    ),
    tags(
        (name = "deliveries", description = "Delivery requests and their status."),
        (name = "operations", description = "Liveness and readiness probes, and the operators' redrive and callback resend (admin scope)."),
        (name = "callbacks", description = "What Skyport sends to a request's `callbackUrl` (see `webhooks`)."),
    ),
    components(schemas(CallbackPayload, Problem)),
    modifiers(&SecuritySchemes),
)]
pub(crate) struct ApiDoc;

/// A response with `description` only: [`Problems`] gives it its body.
fn refusal(description: &str) -> RefOr<Response> {
    ResponseBuilder::new()
        .description(description)
        .build()
        .into()
}

/// The refusals every delivery route may answer, whatever it does: listed
/// once here, and named in each route's `responses`.
pub(crate) struct Refusals;

impl IntoResponses for Refusals {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        let unauthorized = ResponseBuilder::new()
            .description("No valid credentials (when auth is on).")
            .header(
                "WWW-Authenticate",
                HeaderBuilder::new()
                    .schema(String::schema())
                    .description(Some("The schemes accepted."))
                    .build(),
            )
            .build();
        BTreeMap::from([
            ("401".to_owned(), unauthorized.into()),
            (
                "431".to_owned(),
                refusal("The request's head is larger than `gateway.http.max_header_bytes`."),
            ),
        ])
    }
}

/// The refusal of a route metered by `gateway.quotas`.
pub(crate) struct QuotaRefusal;

impl IntoResponses for QuotaRefusal {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        let header = |description: &str| {
            HeaderBuilder::new()
                .schema(String::schema())
                .description(Some(description))
                .build()
        };
        let refused = ResponseBuilder::new()
            .description("The client is over its quota (`gateway.quotas`); retry after `Retry-After`.")
            .header(
                "Retry-After",
                HeaderBuilder::new()
                    .schema(u32::schema())
                    .description(Some("Seconds until the quota lets the next request through."))
                    .build(),
            )
            .header(
                "RateLimit-Policy",
                header("The client's quota (draft-ietf-httpapi-ratelimit-headers): `\"default\";q=BURST;w=SECONDS`."),
            )
            .header(
                "RateLimit",
                header("`\"default\";r=0;t=SECONDS`: nothing left, and when the next is let through."),
            )
            .build();
        BTreeMap::from([("429".to_owned(), refused.into())])
    }
}

/// The refusals of a route that names a delivery by its id and receipt.
pub(crate) struct DeliveryRefusals;

impl IntoResponses for DeliveryRefusals {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        BTreeMap::from([
            (
                "400".to_owned(),
                refusal("A malformed query or Host header."),
            ),
            (
                "404".to_owned(),
                refusal(
                    "No such delivery, the receipt is not its own, or (with authentication on) the delivery is another principal's and the credentials lack the admin scope: all answered alike.",
                ),
            ),
        ])
    }
}

/// The refusals of an operators' route (a JSON body, the admin scope).
pub(crate) struct OperationRefusals;

impl IntoResponses for OperationRefusals {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        BTreeMap::from([
            ("400".to_owned(), refusal("Malformed JSON or query.")),
            (
                "403".to_owned(),
                refusal("The credentials lack the admin scope."),
            ),
            (
                "408".to_owned(),
                refusal(
                    "The body did not arrive within `gateway.http.body_read_timeout_ms`; the connection is closed.",
                ),
            ),
            (
                "413".to_owned(),
                refusal("The body, once decoded, is larger than `gateway.max_body_bytes`."),
            ),
            ("415".to_owned(), refusal("The body is not JSON.")),
            (
                "422".to_owned(),
                refusal("The body has invalid fields; `errors` lists them."),
            ),
        ])
    }
}

/// Every 4xx and 5xx answer is a problem (RFC 9457), and every 503 says when
/// to retry: written once here for every operation, so a route's `responses`
/// give an error status its description only. Applied by [`to_json`], to the
/// document with every route merged in (a modifier of [`ApiDoc`] would see
/// none of the routers' paths).
struct Problems;

impl Modify for Problems {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let operations = openapi.paths.paths.values_mut().flat_map(|item| {
            [
                &mut item.get,
                &mut item.put,
                &mut item.post,
                &mut item.delete,
                &mut item.patch,
            ]
            .into_iter()
            .flatten()
        });
        for operation in operations {
            for (status, response) in &mut operation.responses.responses {
                let RefOr::T(response) = response else {
                    continue;
                };
                if !(status.starts_with('4') || status.starts_with('5')) {
                    continue;
                }
                if response.content.is_empty() {
                    response.content.insert(
                        PROBLEM_JSON.to_owned(),
                        Content::new(Some(RefOr::Ref(utoipa::openapi::Ref::from_schema_name(
                            "Problem",
                        )))),
                    );
                }
                if status == "503" {
                    response
                        .headers
                        .entry("Retry-After".to_owned())
                        .or_insert_with(|| {
                            HeaderBuilder::new()
                                .schema(u32::schema())
                                .description(Some("Seconds to wait before retrying."))
                                .build()
                        });
                }
            }
        }
    }
}

/// The body of a callback: a Standard Webhooks envelope around the status
/// of a delivery that reached a terminal state.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct CallbackPayload {
    /// `delivery.scheduled`, `delivery.failed` or `delivery.cancelled`.
    #[schema(example = "delivery.scheduled")]
    #[serde(rename = "type")]
    pub kind: String,
    /// When the delivery reached the state (its `updatedAt`).
    #[schema(format = DateTime)]
    pub timestamp: String,
    /// The status document (without the callback's own outcome).
    pub data: StatusDocument,
}

struct SecuritySchemes;

impl Modify for SecuritySchemes {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "apiKey",
            SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::with_description(
                API_KEY_HEADER,
                "A key from gateway.auth.api_keys.",
            ))),
        );
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format("JWT")
                    .description(Some(
                        "A JWT from the configured issuer, for the configured audience, with the deliveries.read, deliveries.write or deliveries.admin scope.",
                    ))
                    .build(),
            ),
        );
    }
}

/// The document as committed: every error answer a problem, pretty JSON
/// with a final newline.
pub fn to_json(openapi: &utoipa::openapi::OpenApi) -> String {
    let mut openapi = openapi.clone();
    Problems.modify(&mut openapi);
    let mut document = serde_json::to_value(&openapi)
        .unwrap_or_else(|e| unreachable!("an OpenAPI document always serializes: {e}"));
    camel_case_links(&mut document);
    add_webhooks(&mut document);
    // A patch that changes nothing is refused (utoipa 5 does not model
    // `minProperties` on a struct).
    if let Some(reschedule) = document.pointer_mut("/components/schemas/Reschedule") {
        reschedule["minProperties"] = json!(1);
    }
    let mut json = serde_json::to_string_pretty(&document)
        .unwrap_or_else(|e| unreachable!("a JSON value always serializes: {e}"));
    json.push('\n');
    json
}

/// The callback Skyport sends (OpenAPI 3.1 `webhooks`, which utoipa 5.5
/// does not model): a POST to the request's `callbackUrl`, signed as
/// Standard Webhooks specifies.
fn add_webhooks(document: &mut Value) {
    let header = |name: &str, description: &str, example: &str| {
        json!({
            "name": name,
            "in": "header",
            "required": true,
            "description": description,
            "schema": {"type": "string"},
            "example": example,
        })
    };
    let Some(root) = document.as_object_mut() else {
        return;
    };
    root.insert(
        "webhooks".into(),
        json!({
            "deliveryStatus": {
                "post": {
                    "operationId": "deliveryStatusCallback",
                    "tags": ["callbacks"],
                    "summary": "A delivery reached a terminal state (Scheduled, Failed or Cancelled).",
                    "description": "Sent to the request's `callbackUrl` once per terminal state, at least once: a receiver drops repeats by `webhook-id`, an opaque id, the same for every attempt of one message and another for each message (the delivery and its state are in the body). Signed as Standard Webhooks specifies: `webhook-signature` holds `v1,` and the base64 HMAC-SHA256 of `{webhook-id}.{webhook-timestamp}.{body}` under each of the secrets of the principal who made the delivery (`whsec_…`, one per master secret, which its operator hands over; with auth off, the master secrets), space-separated; verify with any Standard Webhooks library. Answer 2xx to acknowledge. 5xx, 408, 429 (with `Retry-After` honoured), timeouts and connection errors are retried with backoff for `callbacks.retry_for_ms`; other answers, redirects (never followed) and that time running out dead-letter the callback, which the status document's `callback` records.",
                    "parameters": [
                        header("webhook-id", "The message id: opaque, the same for every attempt of one message.", "msg_L25nPE0g1QKApOoLgD0LNA"),
                        header("webhook-timestamp", "Seconds since the Unix epoch when this attempt was signed.", "1764072000"),
                        header("webhook-signature", "`v1,<base64 HMAC-SHA256>` per secret (two during a rotation), space-separated.", "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="),
                    ],
                    "requestBody": {
                        "required": true,
                        "content": {
                            "application/json": {
                                "schema": {"$ref": "#/components/schemas/CallbackPayload"}
                            }
                        }
                    },
                    "responses": {
                        "2XX": {"description": "Received; the callback is delivered."},
                        "5XX": {"description": "Not received now; the callback is retried."}
                    },
                    "security": []
                }
            }
        }),
    );
}

/// utoipa 5.5 serializes a Link Object's fields in snake case
/// (`operation_id`); OpenAPI names them `operationId`, `operationRef` and
/// `requestBody`, and tools ignore or reject the others.
fn camel_case_links(document: &mut Value) {
    let Some(paths) = document.get_mut("paths").and_then(Value::as_object_mut) else {
        return;
    };
    let links = paths
        .values_mut()
        .filter_map(Value::as_object_mut)
        .flat_map(|item| item.values_mut())
        .filter_map(|operation| operation.get_mut("responses")?.as_object_mut())
        .flat_map(|responses| responses.values_mut())
        .filter_map(|response| response.get_mut("links")?.as_object_mut())
        .flat_map(|links| links.values_mut())
        .filter_map(Value::as_object_mut);
    for link in links {
        for (snake, camel) in [
            ("operation_id", "operationId"),
            ("operation_ref", "operationRef"),
            ("request_body", "requestBody"),
        ] {
            if let Some(value) = link.remove(snake) {
                link.insert(camel.to_owned(), value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn links_name_their_operation_in_camel_case() {
        let json = super::to_json(&crate::openapi());
        assert!(json.contains("\"operationId\": \"getDeliveryStatus\""));
        assert!(!json.contains("operation_id"));
    }
}
