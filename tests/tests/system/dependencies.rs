//! The dependency tree against `deny.toml`: licenses, banned crates and
//! sources (`cargo deny check licenses bans sources`, with cargo-deny from the
//! test tools). `cargo deny check advisories` needs the RustSec database,
//! which these machines cannot fetch.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use skyport_tests::{installed_tool, run_tool, workspace};
use tokio::process::Command;

#[tokio::test]
async fn the_dependency_tree_passes_cargo_deny() {
    let dir = tempfile::tempdir().unwrap();
    let mut deny = Command::new(installed_tool("venv/bin/cargo-deny"));
    deny.current_dir(workspace())
        .args(["check", "licenses", "bans", "sources"]);
    let output = run_tool("cargo deny", deny, Duration::from_secs(300), dir.path()).await;
    assert!(
        output.status.success(),
        "cargo deny refused the tree:\n{}\n{}",
        output.stdout,
        output.stderr
    );
}
