//! A bad configuration stops the real binary before it starts anything: exit
//! code 64 and a message that names the key, whichever layer the value came from.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::{Command, Output};

use skyport_embedded::EmbeddedStore;
use skyport_runtime::config::EmbeddedSettings;

fn run(args: &[&str], env: &[(&str, &str)]) -> Output {
    let output = Command::new(env!("CARGO_BIN_EXE_skyport"))
        .args(args)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    assert!(
        output.stdout.is_empty(),
        "nothing started: {}",
        String::from_utf8_lossy(&output.stdout)
    );
    output
}

fn assert_names(output: &Output, key: &str) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(64), "{stderr}");
    assert!(
        stderr.contains(key),
        "the message should name {key}: {stderr}"
    );
}

#[test]
fn a_bad_flag_value_names_its_key() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap();
    assert_names(
        &run(
            &["--data-dir", data, "--set", "worker.max_in_flight=lots"],
            &[],
        ),
        "worker.max_in_flight",
    );
    assert_names(
        &run(&["--data-dir", data, "--listen", "not-an-address"], &[]),
        "gateway.listen",
    );
}

#[test]
fn a_bad_environment_value_names_its_key() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap();
    assert_names(
        &run(
            &["--data-dir", data],
            &[("SKYPORT__STREAM__PARTITIONS", "0")],
        ),
        "stream.partitions",
    );
    assert_names(
        &run(&["--data-dir", data], &[("SKYPORT__WORKER__TYPO", "1")]),
        "worker.typo",
    );
}

#[test]
fn auth_settings_from_the_environment_name_their_key() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap();
    assert_names(
        &run(
            &["--data-dir", data],
            &[("SKYPORT__GATEWAY__AUTH__ENABLED", "true")],
        ),
        "gateway.auth: auth is on (gateway.auth.enabled = true) but neither gateway.auth.api_keys nor gateway.auth.jwt is set",
    );
    assert_names(
        &run(
            &["--data-dir", data],
            &[("SKYPORT__GATEWAY__AUTH__API_KEYS__PORTAL__KEY", "short")],
        ),
        "gateway.auth.api_keys.portal.key: must be at least 32 characters",
    );
}

#[test]
fn a_bad_file_names_its_key() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("skyport.toml");
    std::fs::write(&file, "[simulator]\nerror_rate = 2.0\n").unwrap();
    let data = dir.path().join("data");
    let output = run(
        &[
            "--config",
            file.to_str().unwrap(),
            "--data-dir",
            data.to_str().unwrap(),
        ],
        &[],
    );
    assert_names(&output, "simulator.error_rate");
    assert_names(
        &run(&["--config", "/nonexistent/skyport.toml"], &[]),
        "--config",
    );
}

#[test]
fn an_otel_variable_asking_for_what_skyport_does_not_do_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap();
    let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318");
    let metrics = ("OTEL_METRICS_EXPORTER", "otlp");
    for (env, variable) in [
        (
            vec![endpoint, ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")],
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ),
        (
            vec![endpoint, ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http")],
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        ),
        (
            vec![("OTEL_TRACES_EXPORTER", "zipkin")],
            "OTEL_TRACES_EXPORTER",
        ),
        (
            vec![("OTEL_METRICS_EXPORTER", "statsd")],
            "OTEL_METRICS_EXPORTER",
        ),
        (
            vec![
                metrics,
                ("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "http/json"),
            ],
            "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
        ),
        (
            vec![metrics, ("OTEL_METRIC_EXPORT_INTERVAL", "1m")],
            "OTEL_METRIC_EXPORT_INTERVAL",
        ),
        (
            vec![
                metrics,
                ("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "collector:4317"),
            ],
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
        ),
    ] {
        assert_names(&run(&["--data-dir", data], &env), variable);
    }
    assert_names(
        &run(
            &["--data-dir", data, "--set", "telemetry.log_format=xml"],
            &[],
        ),
        "telemetry.log_format",
    );
}

#[test]
fn an_unknown_flag_is_a_usage_error() {
    let output = run(&["--frobnicate"], &[]);
    assert_names(&output, "--frobnicate");
}

#[test]
fn a_partition_count_that_does_not_match_the_data_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let settings = EmbeddedSettings {
        data_dir: dir.path().to_path_buf(),
        segment_size_mb: 1,
        ..EmbeddedSettings::default()
    };
    drop(EmbeddedStore::open(&settings, 2).unwrap());
    let output = run(&["--data-dir", path(dir.path())], &[]);
    assert_names(&output, "stream.partitions");
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn kafka_settings_name_their_key_including_a_property_librdkafka_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap();
    assert_names(
        &run(&["--data-dir", data, "--set", "stream.backend=kafka"], &[]),
        "kafka.brokers",
    );
    assert_names(
        &run(
            &["--data-dir", data],
            &[
                ("SKYPORT__STREAM__BACKEND", "kafka"),
                ("SKYPORT__KAFKA__BROKERS", "[\"127.0.0.1:9\"]"),
                ("SKYPORT__KAFKA__PROPERTIES__NO__SUCH__PROPERTY", "1"),
            ],
        ),
        "kafka.properties.no.such.property",
    );
}

#[test]
fn a_bad_throughput_group_names_its_key() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap();
    assert_names(
        &run(
            &["--data-dir", data],
            &[
                (
                    "SKYPORT__COSMOS__THROUGHPUT_GROUPS__BULK__CONTAINER",
                    "status",
                ),
                (
                    "SKYPORT__COSMOS__THROUGHPUT_GROUPS__BULK__WORK",
                    "[\"status_writes\"]",
                ),
                (
                    "SKYPORT__COSMOS__THROUGHPUT_GROUPS__BULK__TARGET_FRACTION",
                    "2",
                ),
            ],
        ),
        "cosmos.throughput_groups.bulk.target_fraction",
    );
    assert_names(
        &run(
            &[
                "--data-dir",
                data,
                "--set",
                "cosmos.throughput_control.renew_interval_ms=1000",
            ],
            &[],
        ),
        "cosmos.throughput_control.renew_interval_ms",
    );
}
