//! Skyport's pages in a real browser: Debian's Chromium (installed on first
//! use when the tests run as root), headless, driven by npm's
//! playwright-core through `tests/clients/browser/pages.cjs`.
//!
//! Screenshots are kept under `target/browser/`. With
//! `SKYPORT_UPDATE_SCREENSHOTS=1` [`publish`] also copies them over those the
//! README and docs/operations.md show, under `docs/images/`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::process::Command;

use crate::{chromium, installed_tool, run_tool_ok, workspace};

/// Where the screenshots are kept after the run.
pub fn screenshots() -> PathBuf {
    let dir = workspace().join("target/browser");
    std::fs::create_dir_all(&dir).expect("target/browser can be created");
    dir
}

/// `node pages.cjs ARGS…` with playwright-core from the installed node tools.
pub fn pages(args: &[&str]) -> Command {
    let modules = installed_tool("node/node_modules");
    let mut command = Command::new("node");
    command
        .env("NODE_PATH", modules)
        .env("CHROMIUM", chromium())
        .arg(workspace().join("tests/clients/browser/pages.cjs"))
        .args(args);
    command
}

/// Runs a [`pages`] command in `dir`, failing the test with its output
/// unless it succeeds within three minutes.
pub async fn run_pages(what: &str, command: Command, dir: &Path) {
    run_tool_ok(what, command, Duration::from_secs(180), dir).await;
}

/// Copies the screenshot `name` to `docs/images/` when asked to.
pub fn publish(name: &str) {
    if std::env::var_os("SKYPORT_UPDATE_SCREENSHOTS").is_some_and(|v| v == "1") {
        let images = workspace().join("docs/images");
        std::fs::create_dir_all(&images).expect("docs/images can be created");
        std::fs::copy(screenshots().join(name), images.join(name))
            .expect("the screenshot can be copied to docs/images");
    }
}
