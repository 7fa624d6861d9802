//! The OpenAPI document judged by outside tools: Redocly's linter, a Python, a
//! TypeScript and a Rust client generated from it (at test time, into a temporary
//! directory or, for Rust, `target/sdk/rust`) driving a running gateway, and
//! schemathesis fuzzing that gateway against it.
//!
//! The tools live under `target/tools` (installed on first use); a missing one
//! fails its test, never skips it. Each runs as a child process with a time limit
//! and its output is printed (shown on failure, or with `--nocapture`). The
//! gateway runs with auth on; the drivers and schemathesis get its API key in
//! `SKYPORT_API_KEY` and send it as `X-API-Key`.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use secrecy::SecretString;
use skyport_runtime::config::{ApiKeySettings, Scope};
use skyport_tests::{TestApp, installed_tool, run_tool_ok as run, test_settings, workspace};
use tokio::process::Command;

/// The API key the gateway accepts (with both scopes), passed to the tools in `SKYPORT_API_KEY`.
const API_KEY: &str = "openapi-clients-key-0123456789abcdef";

/// The whole system with auth on: `/api` routes need `X-API-Key: API_KEY`.
async fn spawn_with_auth(data: &tempfile::TempDir) -> TestApp {
    let mut settings = test_settings(data.path());
    settings.gateway.auth.enabled = Some(true);
    settings.gateway.auth.api_keys.insert(
        "openapi-clients".into(),
        ApiKeySettings {
            key: SecretString::from(API_KEY),
            scopes: Scope::all(),
        },
    );
    TestApp::spawn_with(settings).await
}

fn spec() -> PathBuf {
    workspace().join("openapi/openapi.json")
}

/// The driver scripts and tool settings.
fn clients() -> PathBuf {
    workspace().join("tests/clients")
}

/// A command for an installed tool, with the venv's and node's tools first on PATH
/// (openapi-python-client runs `ruff`) and Redocly's telemetry off.
fn command(program: &Path) -> Command {
    let tools = workspace().join("target/tools");
    let mut path =
        std::env::join_paths([tools.join("venv/bin"), tools.join("node/node_modules/.bin")])
            .unwrap();
    if let Some(inherited) = std::env::var_os("PATH") {
        path = std::env::join_paths(
            std::env::split_paths(&path).chain(std::env::split_paths(&inherited)),
        )
        .unwrap();
    }
    let mut command = Command::new(program);
    command
        .env("PATH", path)
        .env("SKYPORT_API_KEY", API_KEY)
        .env("REDOCLY_TELEMETRY", "off")
        .env("NO_COLOR", "1");
    command
}

#[tokio::test]
async fn the_spec_passes_redocly_lint() {
    let dir = tempfile::tempdir().unwrap();
    let mut lint = command(&installed_tool("node/node_modules/.bin/redocly"));
    lint.current_dir(workspace())
        .arg("lint")
        .arg(spec())
        .arg("--config")
        .arg(clients().join("redocly.yaml"));
    run("redocly lint", lint, Duration::from_secs(120), dir.path()).await;
}

#[tokio::test]
async fn a_generated_python_client_drives_the_gateway() {
    let dir = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let app = spawn_with_auth(&data).await;

    let mut generate = command(&installed_tool("venv/bin/openapi-python-client"));
    generate
        .current_dir(dir.path())
        .arg("generate")
        .arg("--path")
        .arg(spec())
        .args(["--meta", "none", "--fail-on-warning", "--output-path"])
        .arg(dir.path().join("skyport_client"));
    run(
        "openapi-python-client generate",
        generate,
        Duration::from_secs(300),
        dir.path(),
    )
    .await;

    let mut drive = command(&installed_tool("venv/bin/python"));
    drive
        .current_dir(dir.path())
        .env("PYTHONPATH", dir.path())
        .arg(clients().join("python_driver.py"))
        .arg(&app.client.base);
    run(
        "the Python driver",
        drive,
        Duration::from_secs(180),
        dir.path(),
    )
    .await;
}

#[tokio::test]
async fn a_generated_typescript_client_drives_the_gateway() {
    let dir = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let app = spawn_with_auth(&data).await;

    // The spec is validated by the generator (no --skip-validate-spec): an invalid one fails here.
    let mut generate = command(&installed_tool("venv/bin/openapi-generator-cli"));
    generate
        .current_dir(dir.path())
        .arg("generate")
        .arg("--input-spec")
        .arg(spec())
        .args(["--generator-name", "typescript-fetch", "--output"])
        .arg(dir.path().join("generated"));
    run(
        "openapi-generator typescript-fetch",
        generate,
        Duration::from_secs(300),
        dir.path(),
    )
    .await;

    // The driver is compiled with the generated client beside it, against the node tools' types.
    for file in ["driver.ts", "tsconfig.json"] {
        std::fs::copy(
            clients().join("typescript").join(file),
            dir.path().join(file),
        )
        .unwrap();
    }
    std::os::unix::fs::symlink(
        installed_tool("node/node_modules"),
        dir.path().join("node_modules"),
    )
    .unwrap();
    let mut compile = command(&installed_tool("node/node_modules/.bin/tsc"));
    compile
        .current_dir(dir.path())
        .arg("--project")
        .arg(dir.path());
    run("tsc", compile, Duration::from_secs(300), dir.path()).await;

    let mut drive = command(Path::new("node"));
    drive
        .current_dir(dir.path())
        .arg(dir.path().join("out/driver.js"))
        .arg(&app.client.base);
    run(
        "the TypeScript driver",
        drive,
        Duration::from_secs(180),
        dir.path(),
    )
    .await;
}

#[tokio::test]
async fn a_generated_rust_client_drives_the_gateway() {
    // The client is generated where the driver's manifest (tests/clients/rust) names it,
    // and built into a target directory later runs reuse; runs in other processes
    // wait for this one, as they would regenerate the crate under its build.
    let sdk = workspace().join("target/sdk/rust");
    std::fs::create_dir_all(&sdk).unwrap();
    let lock = std::fs::File::create(sdk.join(".lock")).unwrap();
    lock.lock().unwrap();
    let dir = tempfile::tempdir().unwrap();

    let generated = sdk.join("skyport-client");
    if generated.exists() {
        std::fs::remove_dir_all(&generated).unwrap();
    }
    // The package name and version are the ones tests/clients/rust/Cargo.lock records.
    let mut generate = command(&installed_tool("venv/bin/openapi-generator-cli"));
    generate
        .current_dir(dir.path())
        .arg("generate")
        .arg("--input-spec")
        .arg(spec())
        .args([
            "--generator-name",
            "rust",
            "--additional-properties",
            "packageName=skyport-client,packageVersion=0.1.0",
            "--output",
        ])
        .arg(&generated);
    run(
        "openapi-generator rust",
        generate,
        Duration::from_secs(300),
        dir.path(),
    )
    .await;

    let target = sdk.join("target");
    let mut build = command(Path::new(
        &std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()),
    ));
    build
        .current_dir(clients().join("rust"))
        .env("CARGO_TARGET_DIR", &target)
        .args(["build", "--locked"]);
    run(
        "cargo build (the Rust driver)",
        build,
        Duration::from_secs(900),
        dir.path(),
    )
    .await;

    let data = tempfile::tempdir().unwrap();
    let app = spawn_with_auth(&data).await;
    let mut drive = command(&target.join("debug/skyport-rust-driver"));
    drive.current_dir(dir.path()).arg(&app.client.base);
    run(
        "the Rust driver",
        drive,
        Duration::from_secs(180),
        dir.path(),
    )
    .await;
}

#[tokio::test]
async fn schemathesis_finds_no_failures() {
    let dir = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let app = spawn_with_auth(&data).await;

    // Phases, checks, bounds and the hook are in tests/clients/schemathesis.toml, which
    // names the hook file relative to the working directory: both are copied to one
    // where schemathesis may keep its caches.
    std::fs::copy(
        clients().join("schemathesis_hooks.py"),
        dir.path().join("schemathesis_hooks.py"),
    )
    .unwrap();
    let mut config = std::fs::read_to_string(clients().join("schemathesis.toml")).unwrap();
    // The key, from the environment; ignored_auth checks requests without it are refused.
    config.push_str("\n[auth.openapi.apiKey]\napi_key = \"${SKYPORT_API_KEY}\"\n");
    let config_file = dir.path().join("schemathesis.toml");
    std::fs::write(&config_file, config).unwrap();

    let mut fuzz = command(&installed_tool("venv/bin/schemathesis"));
    fuzz.current_dir(dir.path())
        .arg("--config-file")
        .arg(&config_file)
        .arg("run")
        .arg(spec())
        .args(["--url", &app.client.base, "--no-color"]);
    run("schemathesis", fuzz, Duration::from_secs(900), dir.path()).await;
}
