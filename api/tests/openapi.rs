//! The committed `openapi/openapi.json` is the document the code produces:
//! SDKs are generated from the file, so it must not drift.

use std::path::Path;

#[test]
fn the_committed_openapi_document_matches_the_code() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(skyport_gateway::openapi::COMMITTED_PATH);
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    let generated = skyport_gateway::openapi::to_json(&skyport_gateway::openapi());
    assert!(
        committed == generated,
        "{} is not what the code describes: run `cargo run -p skyport-gateway --bin skyport-openapi` and commit the result",
        path.display()
    );
}
