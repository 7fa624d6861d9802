//! The OpenAPI document: derived from the handlers and types, served at
//! `/openapi.json` and committed as `openapi/openapi.json` (written by
//! `cargo run -p skyport-api --bin skyport-openapi`; a test fails when the
//! committed file drifts from the code).

use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

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
        (name = "operations", description = "Liveness and readiness probes."),
    ),
    modifiers(&SecuritySchemes),
)]
pub(crate) struct ApiDoc;

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
                        "A JWT from the configured issuer, for the configured audience, with the deliveries.read or deliveries.write scope.",
                    ))
                    .build(),
            ),
        );
    }
}

/// The document as committed: pretty JSON with a final newline.
pub fn to_json(openapi: &utoipa::openapi::OpenApi) -> String {
    let mut json = serde_json::to_string_pretty(openapi)
        .unwrap_or_else(|e| unreachable!("an OpenAPI document always serializes: {e}"));
    json.push('\n');
    json
}
