//! The Kafka scenarios of `kafka.rs` (and the handed-back events of
//! `disk_faults.rs`) against Event Hubs' Kafka endpoint (feature `live`). The
//! "Live tests" section of docs/testing.md says how to run them; they read their
//! target from the environment:
//!
//! - `SKYPORT_LIVE_KAFKA_CONNECTION_STRING`: a namespace-level key with Send
//!   and Listen rights (the SASL password; the user is `$ConnectionString`).
//! - `SKYPORT_LIVE_KAFKA_TOPIC`: an event hub of six partitions that nothing
//!   else writes to while the tests run.
//!
//! Each test reads through a consumer group of its own, whose offsets start
//! at the topic's end when the test begins, so earlier runs' events are
//! never read; status, dead letters and reservations stay in the embedded
//! store of a temporary directory.
//!
//! `live_kafka_entra_two_thousand_requests_reach_scheduled` runs the end to
//! end scenario with `kafka.auth = "entra"` instead of the key (which only
//! sets up its consumer group): the environment's Entra ID credential (`az
//! login`, a managed identity or workload identity) needs the roles Azure
//! Event Hubs Data Sender and Data Receiver on the namespace.

#![cfg(feature = "live")]
#![allow(clippy::unwrap_used)]

use skyport_runtime::config::{KafkaAuth, KafkaSecurity, Millis, Settings, StreamBackend};
use skyport_tests::eventhubs::run_tag;
use skyport_tests::kafka::start_group_at_the_end;
use skyport_tests::test_settings;

use crate::disk_faults::handed_back_events_are_read_again_and_end_scheduled;
use crate::kafka::{
    a_revocation_mid_batch_commits_the_in_flight_work_first,
    keys_spread_evenly_and_keep_their_order, members_join_and_leave_mid_load,
    two_thousand_requests_reach_scheduled,
};

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} must be set for the live tests"))
}

/// Settings on the namespace's Kafka endpoint with the settings Microsoft
/// recommends, and a consumer group of this run that starts at the end.
async fn live_settings(dir: &tempfile::TempDir) -> Settings {
    let connection_string = env("SKYPORT_LIVE_KAFKA_CONNECTION_STRING");
    let namespace = connection_string
        .split(';')
        .find_map(|part| part.strip_prefix("Endpoint=sb://"))
        .map(|host| host.trim_end_matches('/').to_owned())
        .expect("the connection string names its namespace (Endpoint=sb://…)");
    let mut settings = test_settings(dir.path());
    settings.stream.backend = Some(StreamBackend::Kafka);
    settings.kafka.brokers = vec![format!("{namespace}:9093")];
    settings.kafka.topics = vec![env("SKYPORT_LIVE_KAFKA_TOPIC")];
    settings.kafka.security = Some(KafkaSecurity::SaslSsl);
    settings.kafka.connection_string = Some(connection_string.into());
    settings.kafka.session_timeout_ms = Millis::new(30_000);
    settings.kafka.delivery_timeout_ms = Millis::new(30_000);
    for (key, value) in [
        ("request.timeout.ms", "60000"),
        ("metadata.max.age.ms", "180000"),
        ("connections.max.idle.ms", "180000"),
    ] {
        settings.kafka.properties.insert(key.into(), value.into());
    }
    settings.worker.consumer_group = format!("skyport-live-{}", run_tag());
    start_group_at_the_end(&settings.kafka, &settings.worker.consumer_group).await;
    settings
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_kafka_keys_spread_evenly_and_keep_their_order() {
    let dir = tempfile::tempdir().unwrap();
    let settings = live_settings(&dir).await;
    keys_spread_evenly_and_keep_their_order(&settings.kafka, &run_tag()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_kafka_two_thousand_requests_reach_scheduled() {
    let dir = tempfile::tempdir().unwrap();
    two_thousand_requests_reach_scheduled(live_settings(&dir).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_kafka_entra_two_thousand_requests_reach_scheduled() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = live_settings(&dir).await;
    settings.kafka.auth = KafkaAuth::Entra;
    settings.kafka.security = None;
    settings.kafka.connection_string = None;
    settings
        .validate()
        .expect("entra on the namespace's Kafka endpoint");
    two_thousand_requests_reach_scheduled(settings).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_kafka_members_join_and_leave_mid_load() {
    let dir = tempfile::tempdir().unwrap();
    members_join_and_leave_mid_load(live_settings(&dir).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_kafka_a_revocation_mid_batch_commits_the_in_flight_work_first() {
    let dir = tempfile::tempdir().unwrap();
    a_revocation_mid_batch_commits_the_in_flight_work_first(live_settings(&dir).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_kafka_handed_back_events_are_redelivered_by_seeking_back() {
    let dir = tempfile::tempdir().unwrap();
    handed_back_events_are_read_again_and_end_scheduled(live_settings(&dir).await).await;
}
