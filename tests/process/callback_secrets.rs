//! Callback secrets through the real binaries: `skyport callbacks secret
//! PRINCIPAL` prints the secrets a principal's receiver verifies with (the
//! `standardwebhooks` package accepts that principal's callbacks with each
//! and refuses another's), reads the settings as every command does, reads
//! the embedded store's kept secret beside the running process, and refuses
//! what it cannot answer with exit code 64 naming why; a worker or an
//! all-in-one with callbacks enabled on Cosmos DB and no secret stops at
//! once, naming `callbacks.secrets`.

#![allow(clippy::unwrap_used)]

use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use serde_json::Value;
use skyport_callbacks::notify::MasterSecrets;
use skyport_runtime::config::decode_secret;
use skyport_tests::webhooks::{
    Behaviour, Received, Receiver, message_ids, verified_by_python, verify_with_python,
};
use skyport_tests::{ChildApp, Client, delivery_request, eventually};

use crate::configured_args;

const NEWER: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const OLDER: &str = "whsec_AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
const ALICE_KEY: &str = "alice-key-0123456789abcdef0123456789ab";
const BOB_KEY: &str = "bob-key-0123456789abcdef0123456789abcd";
const EACH: usize = 3;

/// Auth on with Alice's and Bob's API keys, and two master secrets, newest
/// first, as in a rotation.
fn config() -> String {
    format!(
        r#"
[simulator]
latency_ms = 1

[gateway.auth]
enabled = true

[gateway.auth.api_keys.alice]
key = "{ALICE_KEY}"

[gateway.auth.api_keys.bob]
key = "{BOB_KEY}"

[callbacks]
secrets = ["{NEWER}", "{OLDER}"]
allow = ["127.0.0.0/8"]

[change_feed]
poll_interval_ms = 100
acquire_interval_ms = 500
"#
    )
}

/// `skyport callbacks ARGS…`, run to its end.
fn callbacks_command(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_skyport"))
        .arg("callbacks")
        .args(args)
        .output()
        .unwrap()
}

/// The secrets the command printed, one a line; asserts it succeeded.
fn printed_secrets(output: &Output) -> Vec<String> {
    let stdout = String::from_utf8(output.stdout.clone()).unwrap();
    assert!(
        output.status.success(),
        "{}: {stdout}{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let secrets: Vec<String> = stdout.lines().map(str::to_owned).collect();
    for secret in &secrets {
        assert!(
            decode_secret(secret).is_some(),
            "not a whsec_ secret: {stdout}"
        );
    }
    secrets
}

/// Asserts the command or binary stopped with exit code 64, printing
/// nothing on stdout and naming `what` on stderr.
fn assert_refused(output: &Output, what: &str) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(64), "{stderr}");
    assert!(
        output.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&output.stdout)
    );
    assert!(
        stderr.contains(what),
        "the message should name {what}: {stderr}"
    );
}

/// Posts deliveries `from..from + EACH` as `client`, each with a callback to `receiver`.
async fn post_as(client: &Client, receiver: &Receiver, from: usize) {
    for n in from..from + EACH {
        let mut request = delivery_request(n);
        request["callbackUrl"] = Value::String(receiver.url("127.0.0.1", &format!("d{n}")));
        client.post_delivery(&request).await;
    }
}

/// The callbacks of deliveries made by `principal`.
fn made_by(received: &[Received], principal: &str) -> Vec<Received> {
    received
        .iter()
        .filter(|r| r.json()["data"]["principal"] == principal)
        .cloned()
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_printed_secrets_verify_their_principals_callbacks_and_no_one_elses() {
    let dir = tempfile::tempdir().unwrap();
    let config_file = dir.path().join("skyport.toml");
    std::fs::write(&config_file, config()).unwrap();
    let config_path = config_file.to_str().unwrap();
    let receiver = Receiver::start(IpAddr::V4(Ipv4Addr::LOCALHOST), Behaviour::Accept).await;
    let app = ChildApp::spawn(
        Path::new(env!("CARGO_BIN_EXE_skyport")),
        &configured_args(&config_file, &dir.path().join("data")),
        dir.path().join("skyport.log"),
    )
    .await;
    post_as(
        &app.client.with_header("x-api-key", ALICE_KEY),
        &receiver,
        0,
    )
    .await;
    post_as(
        &app.client.with_header("x-api-key", BOB_KEY),
        &receiver,
        EACH,
    )
    .await;
    let received = eventually(
        "a callback of every delivery",
        Duration::from_secs(60),
        || async {
            let received = receiver.received();
            (message_ids(&received).len() == 2 * EACH).then_some(received)
        },
    )
    .await;
    let log = app.terminate().await;
    receiver.stop().await;
    let (to_alice, to_bob) = (made_by(&received, "alice"), made_by(&received, "bob"));
    assert!(
        to_alice.len() >= EACH && to_bob.len() >= EACH,
        "{received:?}"
    );

    let alice = printed_secrets(&callbacks_command(&[
        "secret",
        "alice",
        "--config",
        config_path,
    ]));
    let bob = printed_secrets(&callbacks_command(&[
        "secret",
        "bob",
        "--config",
        config_path,
    ]));
    assert_eq!(alice.len(), 2, "one secret per master: {alice:?}");
    assert_eq!(bob.len(), 2, "one secret per master: {bob:?}");
    for secret in &alice {
        assert_eq!(verify_with_python(secret, &to_alice), to_alice.len());
        assert_eq!(
            verified_by_python(secret, &to_bob),
            0,
            "Alice's secret verifies Bob's callbacks"
        );
    }
    for secret in &bob {
        assert_eq!(verify_with_python(secret, &to_bob), to_bob.len());
        assert_eq!(
            verified_by_python(secret, &to_alice),
            0,
            "Bob's secret verifies Alice's callbacks"
        );
    }
    for master in [NEWER, OLDER] {
        assert_eq!(
            verified_by_python(master, &received),
            0,
            "a master signs a principal's callback"
        );
    }
    // The settings come from flags as from the file: the newest master alone, its one secret.
    let newest = printed_secrets(&callbacks_command(&[
        "secret",
        "alice",
        "--set",
        &format!("callbacks.secrets=[\"{NEWER}\"]"),
    ]));
    assert_eq!(newest, alice[..1]);
    assert!(
        !log.contains(&alice[0]) && !log.contains(NEWER),
        "a secret was logged"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_embedded_store_the_kept_secret_is_read_beside_the_running_process() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let data_path = data.to_str().unwrap();
    let before = callbacks_command(&["secret", "alice", "--data-dir", data_path]);
    assert_refused(&before, "callbacks.secrets");
    assert!(
        !data.join("callback-secret").exists(),
        "the command wrote the secret"
    );
    let app = ChildApp::spawn(
        Path::new(env!("CARGO_BIN_EXE_skyport")),
        &["--listen", "127.0.0.1:0", "--data-dir", data_path].map(String::from),
        dir.path().join("skyport.log"),
    )
    .await;
    let output = callbacks_command(&["secret", "alice", "--data-dir", data_path]);
    let printed = printed_secrets(&output);
    let kept = std::fs::read_to_string(data.join("callback-secret")).unwrap();
    let masters = MasterSecrets::new(&[decode_secret(kept.trim()).unwrap()]).unwrap();
    let expected: Vec<String> = masters
        .principal_secrets("alice")
        .iter()
        .map(|s| secrecy::ExposeSecret::expose_secret(s).to_owned())
        .collect();
    assert_eq!(printed, expected);
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("auth is off"),
        "the command says that with auth off the master signs"
    );
    // The process it ran beside still serves.
    app.client.post_delivery(&delivery_request(1)).await;
    app.terminate().await;
}

#[test]
fn the_command_refuses_a_blank_principal_and_a_store_with_no_master() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap();
    for blank in ["", "  "] {
        assert_refused(
            &callbacks_command(&[
                "secret",
                blank,
                "--set",
                &format!("callbacks.secrets=[\"{NEWER}\"]"),
            ]),
            "PRINCIPAL",
        );
    }
    let cosmos = [
        "--data-dir",
        data,
        "--set",
        "store.backend=cosmos",
        "--set",
        "cosmos.endpoint=https://skyport.documents.azure.com/",
        "--set",
        "cosmos.auth=entra",
    ];
    let mut args = vec!["secret", "alice"];
    args.extend(cosmos);
    assert_refused(&callbacks_command(&args), "callbacks.secrets");
    assert_refused(
        &callbacks_command(&[
            "secret",
            "alice",
            "--set",
            "callbacks.secrets=[\"whsec_short\"]",
        ]),
        "callbacks.secrets[0]",
    );
    // The processes that sign stop before they open anything.
    let mut signing = cosmos.to_vec();
    signing.extend([
        "--set",
        "callbacks.enabled=true",
        "--set",
        "services.base_url=http://127.0.0.1:9/",
    ]);
    for binary in [
        env!("CARGO_BIN_EXE_skyport-worker"),
        env!("CARGO_BIN_EXE_skyport"),
    ] {
        let output = Command::new(binary).args(&signing).output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(64), "{binary}: {stderr}");
        assert!(stderr.contains("callbacks.secrets"), "{binary}: {stderr}");
    }
}
