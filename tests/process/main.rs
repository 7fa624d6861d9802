//! The tests of the `skyport` package's binaries as processes (killed,
//! misconfigured, traced and their metrics sent over OTLP, fed bombs,
//! searched for secrets, calling over TLS, watched in a browser),
//! and of the worker's admin listener. No test here runs a system in this
//! process but the admin listener's, so the metrics registry it scrapes is
//! its own.

mod bomb;
mod callback_secrets;
mod callbacks_crash;
mod config_errors;
mod crash_recovery;
mod dashboard;
mod operability;
mod secrets;
mod telemetry;
mod telemetry_otlp;
mod tls;

use skyport_tests::ChildApp;

/// The `skyport` binary on `data`, listening on 127.0.0.1:0, its simulated
/// services answering within 1 ms, with `settings` (each a `--set`) and the
/// environment variables `env` added; it logs to `data/skyport.log`.
async fn spawn_skyport(
    data: &tempfile::TempDir,
    settings: &[String],
    env: &[(&str, String)],
) -> ChildApp {
    let path = data.path().to_str().expect("a UTF-8 temporary directory");
    let mut args: Vec<String> = ["--listen", "127.0.0.1:0", "--data-dir", path]
        .map(String::from)
        .to_vec();
    for setting in
        std::iter::once("simulator.latency_ms=1").chain(settings.iter().map(String::as_str))
    {
        args.extend(["--set".to_owned(), setting.to_owned()]);
    }
    ChildApp::spawn_with_env(
        std::path::Path::new(env!("CARGO_BIN_EXE_skyport")),
        &args,
        env,
        data.path().join("skyport.log"),
    )
    .await
}

/// The `skyport` binary's arguments for a data directory `data` and a
/// configuration file `config`, listening on 127.0.0.1:0.
fn configured_args(config: &std::path::Path, data: &std::path::Path) -> Vec<String> {
    [
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        data.to_str().expect("a UTF-8 data directory"),
        "--config",
        config.to_str().expect("a UTF-8 configuration path"),
    ]
    .map(String::from)
    .to_vec()
}
