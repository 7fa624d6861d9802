//! `skyport-openapi`: writes the gateway's OpenAPI document to
//! `openapi/openapi.json` (or the path given), the file SDKs are generated from.

use std::path::PathBuf;

use anyhow::Context;

fn main() -> anyhow::Result<()> {
    let path = std::env::args_os().nth(1).map_or_else(
        || {
            let workspace = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .parent()
                .unwrap_or_else(|| unreachable!("the api crate lives in the workspace"));
            workspace.join(skyport_gateway::openapi::COMMITTED_PATH)
        },
        PathBuf::from,
    );
    let json = skyport_gateway::openapi::to_json(&skyport_gateway::openapi());
    std::fs::write(&path, json).with_context(|| format!("cannot write {}", path.display()))?;
    println!("Wrote {}", path.display());
    Ok(())
}
