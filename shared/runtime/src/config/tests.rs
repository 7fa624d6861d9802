//! The settings' own tests: layering, every section naming its keys, the
//! profile's defaults, and every error of a start reported at once.

use secrecy::ExposeSecret;
use skyport_core::ports::Lane;

use super::*;

fn cli(set: &[&str]) -> Cli {
    Cli {
        set: set.iter().map(|s| (*s).to_owned()).collect(),
        ..Cli::default()
    }
}

/// The error that names `key`; panics listing them all when none does.
fn named<'a>(errors: &'a ConfigErrors, key: &str) -> &'a ConfigError {
    errors
        .0
        .iter()
        .find(|e| e.key == key)
        .unwrap_or_else(|| panic!("no error names {key}: {errors}"))
}

fn assert_named(errors: &ConfigErrors, key: &str) {
    named(errors, key);
}

#[test]
fn every_bad_key_is_named_at_once() {
    let errors = Settings::load(&cli(&[
        "gateway.max_in_flight=0",
        "stream.partitions=0",
        "worker.checkpoint_interval_ms=1",
        "simulator.error_rate=2",
    ]))
    .expect_err("invalid");
    let keys: Vec<&str> = errors.0.iter().map(|e| e.key.as_str()).collect();
    assert_eq!(
        keys,
        [
            "gateway.max_in_flight",
            "stream.partitions",
            "worker.checkpoint_interval_ms",
            "simulator.error_rate"
        ]
    );
}

#[test]
fn defaults_are_valid() {
    Settings::default().validate().expect("defaults validate");
}

#[test]
fn flags_set_nested_keys() {
    let settings =
        Settings::load(&cli(&["worker.max_in_flight=7", "stream.partitions=4"])).expect("valid");
    assert_eq!(settings.worker.max_in_flight, 7);
    assert_eq!(settings.stream.partitions, 4);
}

#[test]
fn a_wrong_type_names_its_key() {
    let errors = Settings::load(&cli(&["worker.max_in_flight=lots"])).expect_err("invalid");
    assert_named(&errors, "worker.max_in_flight");
}

#[test]
fn an_unknown_key_is_named() {
    let errors = Settings::load(&cli(&["worker.max_inflight=7"])).expect_err("invalid");
    assert_named(&errors, "worker.max_inflight");
}

#[test]
fn the_azure_profile_streams_through_event_hubs() {
    let errors = Settings::load(&cli(&[
        "profile=azure",
        "cosmos.endpoint=https://a.documents.azure.com:443/",
        "cosmos.key=k",
    ]))
    .expect_err("invalid");
    assert_named(&errors, "eventhubs.connection_string");
}

#[test]
fn event_hubs_settings_name_their_key() {
    let base = [
        "stream.backend=eventhubs",
        "eventhubs.connection_string=Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=send;SharedAccessKey=c2VjcmV0",
    ];
    let load = |extra: &[&str]| {
        let mut set = base.to_vec();
        set.extend_from_slice(extra);
        Settings::load(&cli(&set))
    };
    let settings = load(&["eventhubs.hubs=[\"d-0\", \"d-1\"]"]).expect("valid");
    assert_eq!(settings.stream_backend(), StreamBackend::EventHubs);
    assert_eq!(settings.eventhubs.hubs, ["d-0", "d-1"]);
    for (extra, key) in [
        ("eventhubs.hubs=[]", "eventhubs.hubs"),
        ("eventhubs.hubs=[\"a\", \"a\"]", "eventhubs.hubs"),
        ("eventhubs.hubs=[\"a/b\"]", "eventhubs.hubs"),
        (
            "eventhubs.connection_string=Endpoint=sb://x/",
            "eventhubs.connection_string",
        ),
        ("eventhubs.auth=entra", "eventhubs.namespace"),
        (
            "eventhubs.custom_endpoint=http://127.0.0.1:1",
            "eventhubs.custom_endpoint",
        ),
        ("eventhubs.max_batch_bytes=10", "eventhubs.max_batch_bytes"),
        (
            "eventhubs.partition_expiration_ms=100",
            "eventhubs.partition_expiration_ms",
        ),
        ("store.backend=cosmos", "cosmos.endpoint"),
    ] {
        let errors = load(&[extra]).expect_err(extra);
        assert_named(&errors, key);
    }
}

#[test]
fn an_unknown_backend_is_named() {
    let errors = Settings::load(&cli(&["stream.backend=carrier-pigeon"])).expect_err("invalid");
    assert_named(&errors, "stream.backend");
}

#[test]
fn out_of_range_values_name_their_key() {
    let errors = Settings::load(&cli(&["simulator.error_rate=1.5"])).expect_err("invalid");
    assert_named(&errors, "simulator.error_rate");
    let errors = Settings::load(&cli(&["stream.partitions=0"])).expect_err("invalid");
    assert_named(&errors, "stream.partitions");
}

#[test]
fn a_file_is_read_and_flags_win_over_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("skyport.toml");
    std::fs::write(
        &path,
        "[worker]\nmax_in_flight = 3\ncheckpoint_interval_ms = 100\n",
    )
    .expect("write");
    let settings = Settings::load(&Cli {
        config: Some(path),
        ..cli(&["worker.max_in_flight=9"])
    })
    .expect("valid");
    assert_eq!(settings.worker.max_in_flight, 9);
    assert_eq!(settings.worker.checkpoint_interval_ms, Millis::new(100));
}

#[test]
fn a_missing_file_is_reported() {
    let errors = Settings::load(&Cli {
        config: Some("/nonexistent/skyport.toml".into()),
        ..Cli::default()
    })
    .expect_err("missing");
    assert_named(&errors, "--config");
}

#[test]
fn attempts_that_run_out_before_the_circuit_opens_are_refused() {
    let errors = Settings::load(&cli(&["services.max_attempts=5"])).expect_err("invalid");
    assert_named(&errors, "services.max_attempts");
}

#[test]
fn h2c_is_refused_for_services_over_tls() {
    let errors = Settings::load(&cli(&[
        "services.protocol=h2c",
        "services.base_url=https://services.example/",
    ]))
    .expect_err("invalid");
    assert_named(&errors, "services.protocol");
    let errors = Settings::load(&cli(&["services.protocol=http3"])).expect_err("invalid");
    assert_named(&errors, "services.protocol");
    let settings = Settings::load(&cli(&[
        "services.protocol=h2c",
        "services.base_url=http://127.0.0.1:9000/",
    ]))
    .expect("valid");
    assert_eq!(settings.services.protocol, ServicesProtocol::H2c);
}

#[test]
fn the_azure_profile_needs_a_cosmos_endpoint_and_key() {
    let errors = Settings::load(&cli(&["profile=azure"])).expect_err("invalid");
    assert_named(&errors, "cosmos.endpoint");
    let errors = Settings::load(&cli(&[
        "profile=azure",
        "cosmos.endpoint=https://a.documents.azure.com/",
    ]))
    .expect_err("invalid");
    assert_named(&errors, "cosmos.key");
    let settings = Settings::load(&cli(&[
        "profile=azure",
        "cosmos.endpoint=https://a.documents.azure.com/",
        "cosmos.auth=entra",
        "eventhubs.auth=entra",
        "eventhubs.namespace=ns.servicebus.windows.net",
        "gateway.receipt_keys=[\"0123456789abcdef0123456789abcdef\"]",
        "gateway.auth.jwt.issuer=https://login.microsoftonline.com/tenant/v2.0",
        "gateway.auth.jwt.audience=api://skyport",
        "gateway.auth.jwt.jwks_url=https://login.microsoftonline.com/tenant/discovery/v2.0/keys",
    ]))
    .expect("valid");
    assert_eq!(settings.store_backend(), StoreBackend::Cosmos);
    assert_eq!(settings.stream_backend(), StreamBackend::EventHubs);
    assert!(settings.auth_enabled());
}

/// A gateway holds no callback secret: on Cosmos DB `callbacks.enabled =
/// true` alone loads and turns callbacks on (the process that signs them
/// checks for a secret at its start); left unset without a secret, they are off.
#[test]
fn callbacks_are_on_without_a_secret_when_enabled() {
    let azure = [
        "profile=azure",
        "cosmos.endpoint=https://a.documents.azure.com/",
        "cosmos.auth=entra",
        "eventhubs.auth=entra",
        "eventhubs.namespace=ns.servicebus.windows.net",
        "gateway.receipt_keys=[\"0123456789abcdef0123456789abcdef\"]",
        "gateway.auth.api_keys.portal.key=portal-key-0123456789abcdef0123456789",
    ];
    let settings = Settings::load(&cli(&azure)).expect("valid");
    assert!(!settings.callbacks_enabled());
    let mut enabled = azure.to_vec();
    enabled.push("callbacks.enabled=true");
    let settings = Settings::load(&cli(&enabled)).expect("valid without a secret");
    assert_eq!(settings.store_backend(), StoreBackend::Cosmos);
    assert!(settings.callbacks.secrets.is_empty());
    assert!(settings.callbacks_enabled());
}

#[test]
fn an_explicit_backend_wins_over_the_profile() {
    let settings = Settings::load(&cli(&[
        "profile=azure",
        "store.backend=embedded",
        "stream.backend=embedded",
        "gateway.auth.enabled=false",
    ]))
    .expect("valid");
    assert_eq!(settings.store_backend(), StoreBackend::Embedded);
    assert_eq!(settings.stream_backend(), StreamBackend::Embedded);
    assert!(!settings.auth_enabled());
}

#[test]
fn receipt_keys_are_long_and_unique_and_the_single_key_names_its_successor() {
    let key = "0123456789abcdef0123456789abcdef";
    let settings = Settings::load(&cli(&[&format!(
        "gateway.receipt_keys=[\"{key}\", \"{key}-older\"]"
    )]))
    .expect("two keys, newest first");
    assert_eq!(settings.gateway.receipt_keys.len(), 2);
    for keys in ["[\"short\"]".to_owned(), format!("[\"{key}\", \"{key}\"]")] {
        let errors =
            Settings::load(&cli(&[&format!("gateway.receipt_keys={keys}")])).expect_err("invalid");
        assert_named(&errors, "gateway.receipt_keys");
    }
    let errors =
        Settings::load(&cli(&[&format!("gateway.receipt_key={key}")])).expect_err("renamed");
    let renamed = named(&errors, "gateway.receipt_key");
    assert!(
        renamed.message.contains("gateway.receipt_keys"),
        "{renamed}"
    );
}

#[test]
fn only_a_process_that_serves_the_gateway_needs_a_receipt_key() {
    let settings = Settings::load(&cli(&[
        "profile=azure",
        "cosmos.endpoint=https://a.documents.azure.com/",
        "cosmos.auth=entra",
        "eventhubs.auth=entra",
        "eventhubs.namespace=ns.servicebus.windows.net",
        "gateway.auth.enabled=false",
    ]))
    .expect("a worker's settings need no receipt key");
    let missing = settings.check_gateway().expect_err("a gateway's do");
    assert_eq!(missing.key, "gateway.receipt_keys");
    let embedded = Settings::load(&Cli::default()).expect("the defaults");
    embedded
        .check_gateway()
        .expect("the embedded store keeps a key");
}

#[test]
fn held_reads_leave_connections_and_places_for_other_clients() {
    let settings = Settings::load(&Cli::default()).expect("the defaults");
    assert!(settings.gateway.max_waiting < settings.gateway.http.max_connections);
    assert!(settings.gateway.max_waiting_per_client < settings.gateway.max_waiting);
    for (set, key) in [
        (vec!["gateway.max_waiting=8192"], "gateway.max_waiting"),
        (
            vec![
                "gateway.max_waiting=100",
                "gateway.max_waiting_per_client=101",
            ],
            "gateway.max_waiting_per_client",
        ),
        (
            vec!["gateway.max_waiting_per_client=0"],
            "gateway.max_waiting_per_client",
        ),
        (
            vec!["gateway.internal_listen=127.0.0.1:8080"],
            "gateway.internal_listen",
        ),
    ] {
        let errors = Settings::load(&cli(&set)).expect_err(key);
        assert_named(&errors, key);
    }
}

#[test]
fn a_reservation_outlives_the_backlog() {
    let errors = Settings::load(&cli(&[
        "gateway.idempotency_retention_s=60",
        "store.status_retention_s=60",
    ]))
    .expect_err("shorter than worker.allow_backlog_to_ms");
    let shorter = named(&errors, "gateway.idempotency_retention_s");
    assert!(shorter.message.contains("600000 ms"), "{shorter}");
    Settings::load(&cli(&[
        "gateway.idempotency_retention_s=60",
        "store.status_retention_s=60",
        "worker.allow_backlog_to_ms=60000",
    ]))
    .expect("as long as the backlog");
}

const KEY_A: &str = "gateway.auth.api_keys.portal.key=aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const KEY_B: &str = "gateway.auth.api_keys.batch.key=bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
const RS256_PUBLIC: &str = include_str!("../../../../tests/fixtures/jwt/rs256-public.pem");

#[test]
fn auth_is_off_in_the_embedded_profile_and_on_in_azure() {
    assert!(!Settings::default().auth_enabled());
    let azure = Settings {
        profile: Profile::Azure,
        ..Settings::default()
    };
    assert!(azure.auth_enabled());
    let settings = Settings::load(&cli(&["gateway.auth.enabled=true", KEY_A])).expect("valid");
    assert!(settings.auth_enabled());
}

#[test]
fn the_dashboard_is_on_in_the_embedded_profile_and_off_in_azure_unless_enabled() {
    let embedded = Settings::default();
    assert_eq!(embedded.gateway_settings().dashboard, Some(true));
    assert!(embedded.worker_dashboard());
    let azure = Settings {
        profile: Profile::Azure,
        ..Settings::default()
    };
    assert_eq!(azure.gateway_settings().dashboard, Some(false));
    assert!(!azure.worker_dashboard());
    let mut enabled = azure;
    enabled.gateway.dashboard = Some(true);
    enabled.worker.dashboard = Some(true);
    assert_eq!(enabled.gateway_settings().dashboard, Some(true));
    assert!(enabled.worker_dashboard());
    let settings = Settings::load(&cli(&["gateway.dashboard=false", "worker.dashboard=false"]))
        .expect("valid");
    assert_eq!(settings.gateway_settings().dashboard, Some(false));
    assert!(!settings.worker_dashboard());
}

#[test]
fn logs_are_human_in_the_embedded_profile_and_json_in_azure() {
    assert_eq!(Settings::default().log_format(), LogFormat::Human);
    let azure = Settings {
        profile: Profile::Azure,
        ..Settings::default()
    };
    assert_eq!(azure.log_format(), LogFormat::Json);
    let settings = Settings::load(&cli(&["telemetry.log_format=json"])).expect("valid");
    assert_eq!(settings.log_format(), LogFormat::Json);
    let errors = Settings::load(&cli(&["telemetry.log_format=xml"])).expect_err("invalid");
    assert_named(&errors, "telemetry.log_format");
}

#[test]
fn auth_on_without_credentials_says_what_to_set() {
    let errors = Settings::load(&cli(&[
        "profile=azure",
        "store.backend=embedded",
        "stream.backend=embedded",
    ]))
    .expect_err("invalid");
    let auth = named(&errors, "gateway.auth");
    assert!(
        auth.message.contains("profile azure")
            && auth.message.contains("gateway.auth.api_keys")
            && auth.message.contains("gateway.auth.jwt")
            && auth.message.contains("gateway.auth.enabled = false"),
        "{}",
        auth.message
    );
    let errors = Settings::load(&cli(&["gateway.auth.enabled=true"])).expect_err("invalid");
    assert_named(&errors, "gateway.auth");
}

#[test]
fn api_keys_may_do_everything_unless_scoped() {
    let settings = Settings::load(&cli(&[
        KEY_A,
        KEY_B,
        "gateway.auth.api_keys.batch.scopes=[\"deliveries.read\"]",
    ]))
    .expect("valid");
    let keys = &settings.gateway.auth.api_keys;
    assert_eq!(keys["portal"].scopes, [Scope::Read, Scope::Write]);
    assert_eq!(keys["batch"].scopes, [Scope::Read]);
    assert_eq!(
        keys["portal"].key.expose_secret(),
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
    );
}

#[test]
fn api_key_settings_name_their_key() {
    for (set, key) in [
        (
            vec!["gateway.auth.api_keys.portal.key=short"],
            "gateway.auth.api_keys.portal.key",
        ),
        (
            vec![
                KEY_A,
                "gateway.auth.api_keys.copy.key=aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
            ],
            "gateway.auth.api_keys.portal.key",
        ),
        (
            vec![KEY_A, "gateway.auth.api_keys.portal.scopes=[]"],
            "gateway.auth.api_keys.portal.scopes",
        ),
        (
            vec![
                KEY_A,
                "gateway.auth.api_keys.portal.scopes=[\"deliveries.everything\"]",
            ],
            "gateway.auth.api_keys.portal.scopes.0",
        ),
        (
            vec![KEY_A, "gateway.auth.write_scope=a b"],
            "gateway.auth.write_scope",
        ),
    ] {
        let errors = Settings::load(&cli(&set)).expect_err(key);
        assert_named(&errors, key);
    }
}

#[test]
fn jwt_settings_name_their_key() {
    let base = [
        "gateway.auth.enabled=true",
        "gateway.auth.jwt.issuer=https://issuer.example",
        "gateway.auth.jwt.audience=skyport",
    ];
    let load = |extra: &[&str]| {
        let mut set = base.to_vec();
        set.extend_from_slice(extra);
        Settings::load(&cli(&set))
    };
    let settings =
        load(&["gateway.auth.jwt.hs256_secret=0123456789abcdef0123456789abcdef"]).expect("valid");
    let jwt = settings.gateway.auth.jwt.expect("jwt");
    assert_eq!(
        (jwt.leeway_s.count(), jwt.jwks_refresh_s.count()),
        (60, 3_600)
    );
    let rs256 = format!("gateway.auth.jwt.public_key_pem={RS256_PUBLIC}");
    let settings = load(&[&rs256]).expect("valid");
    let key = settings.gateway.auth.jwt.and_then(|jwt| jwt.public_key_pem);
    assert_eq!(key.as_deref().map(str::trim), Some(RS256_PUBLIC.trim()));
    let jwks = "gateway.auth.jwt.jwks_url=http://127.0.0.1:1/keys";
    load(&[jwks]).expect("valid");
    for (extra, key) in [
        (vec![], "gateway.auth.jwt"),
        (
            vec![
                jwks,
                "gateway.auth.jwt.hs256_secret=0123456789abcdef0123456789abcdef",
            ],
            "gateway.auth.jwt",
        ),
        (
            vec![jwks, "gateway.auth.jwt.issuer="],
            "gateway.auth.jwt.issuer",
        ),
        (
            vec![jwks, "gateway.auth.jwt.audience= "],
            "gateway.auth.jwt.audience",
        ),
        (
            vec!["gateway.auth.jwt.hs256_secret=short"],
            "gateway.auth.jwt.hs256_secret",
        ),
        (
            vec!["gateway.auth.jwt.jwks_url=ftp://keys.example/"],
            "gateway.auth.jwt.jwks_url",
        ),
        (
            vec!["gateway.auth.jwt.jwks_url=not a url"],
            "gateway.auth.jwt.jwks_url",
        ),
        (
            vec![jwks, "gateway.auth.jwt.jwks_refresh_s=5"],
            "gateway.auth.jwt.jwks_refresh_s",
        ),
        (
            vec![jwks, "gateway.auth.jwt.tenant=x"],
            "gateway.auth.jwt.tenant",
        ),
        (
            vec!["gateway.auth.jwt.jwks_url=http://keys.example/"],
            "gateway.auth.jwt.jwks_url",
        ),
        (
            vec![jwks, "gateway.auth.jwt.leeway_s=301"],
            "gateway.auth.jwt.leeway_s",
        ),
        (
            vec![jwks, "gateway.auth.admin_scope="],
            "gateway.auth.admin_scope",
        ),
        (
            vec![jwks, "gateway.auth.admin_scope=deliveries.read"],
            "gateway.auth.admin_scope",
        ),
        (
            vec![
                jwks,
                "gateway.auth.api_keys.\"jwt:portal\".key=aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
            ],
            "gateway.auth.api_keys.\"jwt:portal\"",
        ),
    ] {
        let errors = load(&extra).expect_err(key);
        assert_named(&errors, key);
    }
}

#[test]
fn the_kafka_profile_needs_brokers_and_checks_its_keys() {
    let errors = Settings::load(&cli(&["profile=kafka"])).expect_err("invalid");
    assert_named(&errors, "kafka.brokers");
    let errors = Settings::load(&cli(&[
        "stream.backend=kafka",
        "kafka.brokers=[\"localhost\"]",
    ]))
    .expect_err("invalid");
    assert_named(&errors, "kafka.brokers");
    let errors = Settings::load(&cli(&[
        "stream.backend=kafka",
        "kafka.brokers=[\"b:9092\"]",
        "kafka.security=sasl_ssl",
        "kafka.properties.acks=1",
        "kafka.drain_timeout_ms=60000",
    ]))
    .expect_err("invalid");
    assert_named(&errors, "kafka.sasl_password");
    assert_named(&errors, "kafka.properties.acks");
    assert_named(&errors, "kafka.drain_timeout_ms");
    let settings = Settings::load(&cli(&[
        "profile=kafka",
        "gateway.auth.enabled=false",
        "kafka.brokers=[\"ns.servicebus.windows.net:9093\"]",
        "kafka.security=sasl_ssl",
        "kafka.connection_string=Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey=s",
        "kafka.properties.request.timeout.ms=60000",
    ]))
    .expect("valid");
    assert_eq!(
        settings
            .kafka
            .properties
            .get("request.timeout.ms")
            .map(String::as_str),
        Some("60000")
    );
    assert_eq!(settings.stream_backend(), StreamBackend::Kafka);
    assert_eq!(settings.store_backend(), StoreBackend::Embedded);
    let (user, _) = settings.kafka.sasl_credentials().expect("credentials");
    assert_eq!(user, "$ConnectionString");
}

#[test]
fn throughput_groups_load_from_flags_and_name_their_keys() {
    let settings = Settings::load(&cli(&[
        "cosmos.throughput_groups.bulk.container=status",
        "cosmos.throughput_groups.bulk.work=[\"status_writes\", \"dead_letters\"]",
        "cosmos.throughput_groups.bulk.target_ru_per_s=200",
        "cosmos.throughput_groups.bulk.target_fraction=0.5",
        "cosmos.throughput_groups.bulk.scope=global",
        "cosmos.throughput_groups.clients.container=status",
        "cosmos.throughput_groups.clients.work=[\"status_reads\"]",
        "cosmos.throughput_groups.clients.target_ru_per_s=100",
    ]))
    .expect("valid");
    let bulk = &settings.cosmos.throughput_groups["bulk"];
    assert_eq!(bulk.work, [Work::StatusWrites, Work::DeadLetters]);
    assert_eq!(bulk.target_ru_per_s, Some(200));
    assert_eq!(bulk.target_fraction, Some(0.5));
    assert_eq!(bulk.scope, GroupScope::Global);
    assert_eq!(bulk.effective_priority(), Priority::Low);
    let clients = &settings.cosmos.throughput_groups["clients"];
    assert_eq!(clients.effective_priority(), Priority::High);
    assert!(settings.cosmos.has_global_groups());

    let errors = Settings::load(&cli(&[
        "cosmos.throughput_groups.a.container=nowhere",
        "cosmos.throughput_groups.a.work=[\"status_writes\"]",
        "cosmos.throughput_groups.a.target_fraction=1.5",
        "cosmos.throughput_groups.b.container=status",
        "cosmos.throughput_groups.b.work=[\"status_writes\"]",
        "cosmos.throughput_groups.c.container=status",
        "cosmos.throughput_groups.c.work=[\"status_reads\"]",
        "cosmos.throughput_control.renew_interval_ms=1000",
        "cosmos.throughput_control.expire_interval_ms=2000",
    ]))
    .expect_err("invalid");
    assert_named(&errors, "cosmos.throughput_groups.a.container");
    assert_named(&errors, "cosmos.throughput_groups.a.target_fraction");
    assert!(
        named(&errors, "cosmos.throughput_groups.b.work")
            .message
            .contains("group a")
    );
    assert_named(&errors, "cosmos.throughput_groups.c.target_ru_per_s");
    assert_named(&errors, "cosmos.throughput_control.renew_interval_ms");
    assert_named(&errors, "cosmos.throughput_control.expire_interval_ms");

    let errors = Settings::load(&cli(&[
        "cosmos.throughput_groups.a.container=status",
        "cosmos.throughput_groups.a.work=[\"no_such_work\"]",
    ]))
    .expect_err("invalid");
    assert!(
        errors
            .0
            .iter()
            .any(|e| e.key.starts_with("cosmos.throughput_groups")),
        "{errors}"
    );
}

/// The variable that tells a child run of
/// [`a_list_comes_from_one_environment_variable_in_brackets`] which case it
/// checks.
const ENV_CASE: &str = "SKYPORT_TEST_ENV_CASE";
const ENV_SECRET_ONE: &str = "whsec_ZW52LWxpc3QtY2FsbGJhY2stc2VjcmV0LW51bWJlcjE=";
const ENV_SECRET_TWO: &str = "whsec_ZW52LWxpc3QtY2FsbGJhY2stc2VjcmV0LW51bWJlcjI=";

/// A list from the environment: `SKYPORT__CALLBACKS__SECRETS` holding the
/// list in brackets, its items quoted (as the Helm chart writes
/// `secrets.callbackSecrets` into its Secret), loads into `callbacks.secrets`;
/// neither a bare value nor indexed variables (`…__SECRETS__0`) do. Each
/// case loads in a child run of this test, so its variables never reach the
/// other tests, which load settings at the same time.
#[test]
fn a_list_comes_from_one_environment_variable_in_brackets() {
    match std::env::var(ENV_CASE).as_deref() {
        Ok("list") => {
            let settings = Settings::load(&Cli::default()).expect("valid");
            let secrets: Vec<&str> = settings
                .callbacks
                .secrets
                .iter()
                .map(|s| s.expose_secret())
                .collect();
            assert_eq!(secrets, [ENV_SECRET_ONE, ENV_SECRET_TWO]);
            assert_eq!(settings.callbacks.keys().len(), 2);
            assert!(settings.callbacks_enabled());
            return;
        }
        Ok("bare" | "indexed") => {
            let errors = Settings::load(&Cli::default()).expect_err("not a list");
            assert_named(&errors, "callbacks.secrets");
            return;
        }
        Ok(other) => panic!("unknown case {other}"),
        Err(_) => {}
    }
    let list = format!("[\"{ENV_SECRET_ONE}\", \"{ENV_SECRET_TWO}\"]");
    let cases = [
        ("list", vec![("SKYPORT__CALLBACKS__SECRETS", list.as_str())]),
        (
            "bare",
            vec![("SKYPORT__CALLBACKS__SECRETS", ENV_SECRET_ONE)],
        ),
        (
            "indexed",
            vec![
                ("SKYPORT__CALLBACKS__SECRETS__0", ENV_SECRET_ONE),
                ("SKYPORT__CALLBACKS__SECRETS__1", ENV_SECRET_TWO),
            ],
        ),
    ];
    let module = module_path!()
        .split_once("::")
        .map_or(module_path!(), |(_, path)| path);
    let test = format!("{module}::a_list_comes_from_one_environment_variable_in_brackets");
    for (case, variables) in cases {
        let mut child = std::process::Command::new(std::env::current_exe().expect("test binary"));
        child.args([
            test.as_str(),
            "--exact",
            "--nocapture",
            "--test-threads",
            "1",
        ]);
        for (name, _) in std::env::vars() {
            if name.starts_with(ENV_PREFIX) {
                child.env_remove(name);
            }
        }
        child.env(ENV_CASE, case).envs(variables);
        let output = child.output().expect("the child run starts");
        let printed = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(
            output.status.success() && printed.contains("1 passed"),
            "{case}: {printed}"
        );
    }
}

#[test]
fn status_retention_is_never_shorter_than_idempotency_retention() {
    let errors = Settings::load(&cli(&[
        "gateway.idempotency_retention_s=3600",
        "store.status_retention_s=60",
        "store.dead_letter_retention_s=0",
    ]))
    .expect_err("invalid");
    let shorter = named(&errors, "store.status_retention_s");
    assert!(
        shorter
            .message
            .contains("gateway.idempotency_retention_s (3600 s)"),
        "{shorter}"
    );
    assert_named(&errors, "store.dead_letter_retention_s");
    let settings = Settings::load(&cli(&[
        "gateway.idempotency_retention_s=2",
        "store.status_retention_s=2",
        "worker.allow_backlog_to_ms=2000",
    ]))
    .expect("a window of seconds, for tests");
    assert_eq!(settings.store.status_retention_s.count(), 2);
    assert_eq!(
        settings.store.dead_letter_retention_s.count(),
        30 * 24 * 60 * 60
    );
}

#[test]
fn quota_keys_are_named_when_wrong() {
    let errors = Settings::load(&cli(&[
        "gateway.quotas.default_per_s=0",
        "gateway.quotas.clients.bulk.per_s=0",
        "gateway.quotas.max_clients=0",
    ]))
    .expect_err("invalid");
    let keys: Vec<&str> = errors.0.iter().map(|e| e.key.as_str()).collect();
    assert_eq!(
        keys,
        [
            "gateway.quotas.default_per_s",
            "gateway.quotas.max_clients",
            "gateway.quotas.clients.bulk.per_s",
        ]
    );
    let errors =
        Settings::load(&cli(&["gateway.quotas.burst=5"])).expect_err("a burst without a rate");
    assert_eq!(errors.0[0].key, "gateway.quotas.burst");
    let settings = Settings::load(&cli(&[
        "gateway.quotas.default_per_s=10",
        "gateway.quotas.clients.bulk.per_s=1000",
    ]))
    .expect("valid");
    assert_eq!(settings.gateway.quotas.clients["bulk"].per_s, 1000);
}

#[test]
fn a_client_claim_must_name_a_claim_of_the_bearer_tokens_quotas_meter() {
    let jwt = [
        "gateway.auth.enabled=true",
        "gateway.auth.jwt.issuer=https://issuer.example",
        "gateway.auth.jwt.audience=skyport",
        "gateway.auth.jwt.hs256_secret=0123456789abcdef0123456789abcdef",
        "gateway.quotas.default_per_s=10",
    ];
    let load = |extra: &[&str]| {
        let mut set = jwt.to_vec();
        set.extend_from_slice(extra);
        Settings::load(&cli(&set))
    };
    for claim in ["", "  ", "scp", "roles"] {
        let errors = load(&[&format!("gateway.quotas.client_claim={claim}")])
            .expect_err("not a claim that names a client");
        assert_eq!(errors.0.len(), 1, "{errors}");
        assert_eq!(errors.0[0].key, "gateway.quotas.client_claim", "{claim:?}");
    }
    let empty = load(&["gateway.quotas.client_claim="]).expect_err("empty");
    assert_eq!(
        empty.to_string(),
        "gateway.quotas.client_claim: must name a token claim (unset: sub)"
    );
    let settings = load(&["gateway.quotas.client_claim=azp"]).expect("valid");
    assert_eq!(settings.gateway.quotas.client_claim.as_deref(), Some("azp"));
    assert_eq!(load(&[]).expect("valid").gateway.quotas.client_claim, None);
    // Without quotas there is nothing to name, and without tokens no claim.
    let errors = Settings::load(&cli(&[
        "gateway.auth.enabled=true",
        "gateway.auth.jwt.issuer=https://issuer.example",
        "gateway.auth.jwt.audience=skyport",
        "gateway.auth.jwt.hs256_secret=0123456789abcdef0123456789abcdef",
        "gateway.quotas.client_claim=azp",
    ]))
    .expect_err("no quotas");
    assert_eq!(
        errors.to_string(),
        "gateway.quotas.client_claim: needs default_per_s"
    );
    let errors = Settings::load(&cli(&[
        "gateway.quotas.default_per_s=10",
        "gateway.quotas.client_claim=azp",
    ]))
    .expect_err("no tokens");
    assert_eq!(
        errors.to_string(),
        "gateway.quotas.client_claim: names a bearer token's claim: needs auth on and gateway.auth.jwt"
    );
}

#[test]
fn an_expedited_lane_needs_partitions_of_its_own_and_turns_a_read_ahead_of_a_window() {
    let errors = Settings::load(&cli(&[
        "stream.backend=kafka",
        "kafka.brokers=[\"broker:9092\"]",
        "kafka.expedited_topic=deliveries",
    ]))
    .expect_err("invalid");
    assert_named(&errors, "kafka.expedited_topic");
    let errors = Settings::load(&cli(&[
        "stream.backend=eventhubs",
        "eventhubs.expedited_hubs=[\"deliveries\"]",
    ]))
    .expect_err("invalid");
    assert_named(&errors, "eventhubs.expedited_hubs");
    let errors = Settings::load(&cli(&["worker.max_in_flight=64", "worker.read_ahead=32"]))
        .expect_err("invalid");
    assert_named(&errors, "worker.read_ahead");
    let settings = Settings::load(&cli(&[
        "stream.backend=kafka",
        "kafka.brokers=[\"broker:9092\"]",
        "kafka.expedited_topic=deliveries-expedited",
    ]))
    .expect("valid");
    assert_eq!(
        settings.kafka.lane_topics(),
        [
            ("deliveries".to_owned(), Lane::Normal),
            ("deliveries-expedited".to_owned(), Lane::Expedited)
        ]
    );
}

#[test]
fn the_worker_s_latency_goal_is_refused_naming_the_gateway_s_objective() {
    let errors = Settings::load(&cli(&["worker.gateway_latency_goal_ms=5"])).expect_err("replaced");
    let replaced = named(&errors, "worker.gateway_latency_goal_ms");
    assert!(
        replaced.message.contains("gateway.latency_objective_ms"),
        "{replaced}"
    );
    let settings = Settings::load(&cli(&["gateway.latency_objective_ms=0"])).expect("off");
    assert!(settings.gateway.latency_objective_ms.duration().is_zero());
}

#[test]
fn the_listing_container_is_refused_saying_that_listing_queries_the_status_container() {
    let errors = Settings::load(&cli(&["cosmos.listing_container=listing"])).expect_err("no view");
    let gone = named(&errors, "cosmos.listing_container");
    assert!(gone.message.contains("status container"), "{gone}");
}

#[test]
fn a_listen_backlog_of_none_is_refused() {
    let errors = Settings::load(&cli(&["gateway.listen_backlog=0"])).expect_err("no room");
    assert_named(&errors, "gateway.listen_backlog");
    let settings = Settings::load(&cli(&["gateway.listen_backlog=65535"])).expect("room");
    assert_eq!(settings.gateway.listen_backlog, 65_535);
}

#[test]
fn a_booking_lead_is_a_second_at_least_on_either_store_and_timer_shards_one() {
    let settings = Settings::load(&cli(&["worker.booking_lead_s=3600"])).expect("embedded");
    assert_eq!(
        settings.worker.booking_lead_s.map(|lead| lead.count()),
        Some(3_600)
    );
    let errors = Settings::load(&cli(&["worker.booking_lead_s=0"])).expect_err("no lead");
    assert_named(&errors, "worker.booking_lead_s");
    let cosmos = [
        "worker.booking_lead_s=3600",
        "store.backend=cosmos",
        "cosmos.endpoint=https://example.documents.azure.com:443/",
        "cosmos.key=a2V5",
    ];
    let settings = Settings::load(&cli(&cosmos)).expect("timers on Cosmos DB");
    assert_eq!(settings.cosmos.timer_shards, 16);
    let errors = Settings::load(&cli(&[&cosmos[..], &["cosmos.timer_shards=0"]].concat()))
        .expect_err("no shard");
    assert_named(&errors, "cosmos.timer_shards");
    let errors = Settings::load(&cli(&["worker.timer_lease_expiry_ms=10"])).expect_err("too short");
    assert_named(&errors, "worker.timer_lease_expiry_ms");
}
