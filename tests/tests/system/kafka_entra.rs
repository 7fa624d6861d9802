//! Kafka on Event Hubs with Entra ID (`kafka.auth = "entra"`): Skyport's
//! publisher and consumer go through librdkafka's real SASL OAUTHBEARER
//! exchange, over TLS, with a minimal endpoint of the test's own
//! (`skyport_tests::kafka_sasl`) that records each bearer token. The token
//! comes from a fake Entra ID credential, asked for the namespace's scope
//! once before any client exists, and again before it expires; the
//! endpoint's short sessions make librdkafka authenticate again, and the
//! next authentication presents the new token. The chart renders the Kafka
//! example with `config.kafka.auth: entra` handing no Kafka secret to any
//! container, and refuses Kafka secrets and KEDA's kafka trigger with it.

#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use azure_core::credentials::{AccessToken, TokenCredential, TokenRequestOptions};
use azure_core::time::OffsetDateTime;
use skyport::kafka_entra::EntraTokens;
use skyport_core::ports::Consumer as _;
use skyport_kafka::{BearerToken, KafkaConsumer, KafkaPublisher};
use skyport_runtime::config::{KafkaAuth, KafkaSettings, Millis};
use skyport_tests::eventually;
use skyport_tests::helm::{
    container, kafka_values, load_settings, name, render, render_fails, secret_refs,
};
use skyport_tests::kafka_sasl::{Exchange, SaslEndpoint};
use skyport_tests::tls::{Authority, SubjectName};

const SCOPE: &str = "https://skyport-test.servicebus.windows.net/.default";
const TOPIC: &str = "deliveries";

/// An Entra ID credential that issues `entra-token-1`, `entra-token-2`, …
/// of `lifetime` each, and keeps the scopes it was asked for.
#[derive(Debug)]
struct FakeCredential {
    lifetime: Duration,
    issued: AtomicUsize,
    scopes: Mutex<Vec<String>>,
}

#[async_trait]
impl TokenCredential for FakeCredential {
    async fn get_token(
        &self,
        scopes: &[&str],
        _options: Option<TokenRequestOptions<'_>>,
    ) -> azure_core::Result<AccessToken> {
        let n = self.issued.fetch_add(1, Ordering::SeqCst) + 1;
        self.scopes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(scopes.iter().map(|s| (*s).to_owned()));
        Ok(AccessToken::new(
            format!("entra-token-{n}"),
            OffsetDateTime::now_utc() + self.lifetime,
        ))
    }
}

/// Settings of entra on `endpoint`, trusting the test's authority in `ca_file`.
fn entra_settings(endpoint: &SaslEndpoint, ca_file: &std::path::Path) -> KafkaSettings {
    let mut settings = KafkaSettings {
        auth: KafkaAuth::Entra,
        brokers: vec![endpoint.address.clone()],
        topics: vec![TOPIC.into()],
        delivery_timeout_ms: Millis::new(10_000),
        ..KafkaSettings::default()
    };
    settings
        .properties
        .insert("ssl.ca.location".into(), ca_file.display().to_string());
    settings
}

/// Waits (at most 30 s) until the endpoint's exchange passes `check`.
async fn seen(endpoint: &SaslEndpoint, what: &str, check: impl Fn(&Exchange) -> bool) -> Exchange {
    eventually(what, Duration::from_secs(30), || {
        let exchange = endpoint.exchange();
        std::future::ready(check(&exchange).then_some(exchange))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_publisher_and_the_consumer_present_the_entra_token_and_the_refreshed_one() {
    let dir = tempfile::tempdir().unwrap();
    let authority = Authority::new("Skyport test authority");
    let identity = authority.issue(&[SubjectName::Ip([127, 0, 0, 1].into())]);
    let ca_file = dir.path().join("authority.pem");
    std::fs::write(&ca_file, authority.pem()).unwrap();
    // librdkafka authenticates again at 90 % of a 3 s session; the tokens
    // live 8 s, so the cache replaces the first after 4 s.
    let endpoint = SaslEndpoint::start(identity, &[TOPIC], Duration::from_secs(3)).await;
    let settings = entra_settings(&endpoint, &ca_file);
    let credential = Arc::new(FakeCredential {
        lifetime: Duration::from_secs(8),
        issued: AtomicUsize::new(0),
        scopes: Mutex::default(),
    });

    let source = Arc::new(EntraTokens::new(credential.clone(), SCOPE.into()));
    let token = BearerToken::start(source, "skyport").await.unwrap();
    assert_eq!(
        credential.issued.load(Ordering::SeqCst),
        1,
        "fetched before any client"
    );
    assert_eq!(*credential.scopes.lock().unwrap(), [SCOPE]);

    let publisher = tokio::time::timeout(
        Duration::from_secs(30),
        KafkaPublisher::open_with(&settings, Some(token.clone())),
    )
    .await
    .expect("the publisher opens within 30 s")
    .expect("the publisher authenticates and reads the topic");
    let exchange = endpoint.exchange();
    assert_eq!(
        exchange.tokens.first().map(String::as_str),
        Some("entra-token-1")
    );
    assert!(exchange.requests.contains(&"Metadata"), "{exchange:?}");

    // The consumer's metadata probe and its group member each authenticate;
    // only the member looks for the group's coordinator.
    let consumer = Arc::new(KafkaConsumer::new_with(
        &settings,
        "entra-test",
        Some(token),
    ));
    let joining = tokio::spawn({
        let consumer = Arc::clone(&consumer);
        async move { consumer.next_partition().await.map(|_| ()) }
    });
    seen(&endpoint, "the group member authenticated", |e| {
        e.requests.contains(&"FindCoordinator")
    })
    .await;

    let exchange = seen(
        &endpoint,
        "an authentication with the refreshed token",
        |e| e.tokens.iter().any(|t| t == "entra-token-2"),
    )
    .await;
    assert!(
        credential.issued.load(Ordering::SeqCst) >= 2,
        "the cache asked the credential again"
    );
    assert!(
        exchange
            .tokens
            .iter()
            .all(|t| t.starts_with("entra-token-")),
        "{exchange:?}"
    );
    assert!(exchange.violations.is_empty(), "{exchange:?}");

    joining.abort();
    tokio::time::timeout(Duration::from_secs(30), consumer.stop())
        .await
        .expect("the consumer stops within 30 s");
    drop(publisher);
    endpoint.stop().await;
}

/// `ci/kafka-values.yaml` switched to entra, written in `dir`: `auth: entra`
/// in place of its SASL mechanism.
fn entra_values(dir: &std::path::Path) -> std::path::PathBuf {
    let text = std::fs::read_to_string(kafka_values()).unwrap();
    let line = "    sasl_mechanism: PLAIN\n";
    assert_eq!(text.matches(line).count(), 1, "the example's mechanism");
    let file = dir.join("kafka-entra-values.yaml");
    std::fs::write(&file, text.replace(line, "    auth: entra\n")).unwrap();
    file
}

#[tokio::test]
async fn the_chart_on_entra_hands_no_container_a_kafka_secret() {
    let work = tempfile::tempdir().unwrap();
    let dir = work.path();
    let values = entra_values(dir);
    let rendering = render(&[&values], &[], dir).await;
    let refs = secret_refs(&rendering, "skyport-secrets", false);
    for key in ["kafka-connection-string", "kafka-sasl-password"] {
        assert!(!refs.contains(key), "{key} is still handed out: {refs:?}");
    }
    for workload in rendering.workloads() {
        let env = container(workload)["env"].to_string();
        assert!(
            !env.contains("SKYPORT__KAFKA__"),
            "{}: {env}",
            name(workload)
        );
        let settings = load_settings(&rendering, workload, &refs, dir);
        assert_eq!(settings.kafka.auth, KafkaAuth::Entra, "{}", name(workload));
        assert!(settings.kafka.connection_string.is_none());
    }
    let printed = render_fails(
        &[&values],
        &[
            "existingSecret=",
            "secrets.kafkaConnectionString=Endpoint=sb://skyport-prod.servicebus.windows.net/",
        ],
        dir,
    )
    .await;
    assert!(
        printed.contains(
            "secrets.kafkaConnectionString and secrets.kafkaSaslPassword would be ignored"
        ),
        "{printed}"
    );
    let printed = render_fails(
        &[&values],
        &[
            "worker.keda.enabled=true",
            "worker.keda.prometheus.serverAddress=http://prometheus:9090",
            "worker.keda.partitions=6",
            "worker.keda.maxReplicas=6",
            "worker.keda.kafka.enabled=true",
        ],
        dir,
    )
    .await;
    assert!(
        printed.contains("worker.keda.kafka.enabled with config.kafka.auth = entra"),
        "{printed}"
    );
}
