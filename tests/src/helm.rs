//! The Helm chart checker: renders `helm/skyport` with helm, validates every
//! rendering with `kubernetes-validate --strict`, reads the objects back, and
//! checks what every workload must hold; `tests/tests/system/helm_chart.rs`
//! runs it on each set of values, a small test each.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::{ToolOutput, installed_tool, run_tool, workspace};
use serde_json::Value;
use skyport_runtime::config::{Cli, ConfigErrors, Settings};
use tokio::process::Command;

/// The release name the chart is rendered under; with the chart name in it, objects are named `skyport…`.
pub const RELEASE: &str = "skyport";
/// The namespace the chart is rendered for.
pub const NAMESPACE: &str = "skyport";
/// The oldest Kubernetes the chart supports (the preStop `sleep` action is in 1.30's API) and the newest
/// kubernetes-validate bundles: every rendering must be valid for both.
pub const KUBERNETES_VERSIONS: [&str; 2] = ["1.30.0", "1.37.0"];
/// The uid of the images' user (distroless `nonroot`).
pub const NONROOT_UID: u64 = 65532;
/// The workload-identity client id in `ci/azure-values.yaml`.
pub const AZURE_CLIENT_ID: &str = "6b3f2a0e-8c1d-4e59-9a7b-2d4c8e1f0a93";
/// Each tool's time limit.
pub const LIMIT: Duration = Duration::from_secs(120);
/// What a container gets for `callbacks.secrets` when its Secret is not in the rendering: a list of
/// one valid signing secret, in the form one environment variable holds a list in.
pub const CALLBACK_SECRETS_STAND_IN: &str =
    r#"["whsec_c3RhbmQtaW4tY2FsbGJhY2stc2VjcmV0LTAxMjM0NTY="]"#;
/// What a container gets for `gateway.receipt_keys` when its Secret is not in the rendering: a list
/// of one key, in the same form.
pub const RECEIPT_KEYS_STAND_IN: &str = r#"["receipt-keys-stand-in-0123456789abcdef0123456789"]"#;
/// The port every pod serves its probes and `/metrics` on, apart from the API (named `internal`).
pub const INTERNAL_PORT: u64 = 9090;
/// The port the gateway and the all-in-one serve the API on (named `http`).
pub const API_PORT: u64 = 8080;

pub fn chart() -> PathBuf {
    workspace().join("helm/skyport")
}

pub fn azure_values() -> PathBuf {
    chart().join("ci/azure-values.yaml")
}

/// The API key the all-in-one's values are given (`secrets.apiKeys.portal`).
pub const PORTAL_KEY: &str = "portal-key-from-values-0123456789abcdef";

/// The chart's own values and the one they cannot do without: a credential
/// ([`PORTAL_KEY`]), as an overlay written in `dir`. Rendered alone, the
/// all-in-one.
pub fn default_values(dir: &Path) -> Vec<PathBuf> {
    let overlay = dir.join("api-key-values.yaml");
    std::fs::write(
        &overlay,
        format!("secrets:\n  apiKeys:\n    portal: {PORTAL_KEY}\n"),
    )
    .unwrap();
    vec![overlay]
}

/// `ci/kafka-values.yaml`: gateway and worker on Event Hubs' Kafka endpoint.
pub fn kafka_values() -> PathBuf {
    chart().join("ci/kafka-values.yaml")
}

/// Runs `command` within [`LIMIT`], its output in files in `dir`.
pub async fn run(what: &str, command: Command, dir: &Path) -> ToolOutput {
    run_tool(what, command, LIMIT, dir).await
}

/// Runs `command` and fails the test, with its output, unless it exits 0.
pub async fn succeed(what: &str, command: Command, dir: &Path) -> String {
    let output = run(what, command, dir).await;
    assert!(
        output.status.success(),
        "{what} failed ({}):\n{}\n{}",
        output.status,
        output.stdout,
        output.stderr
    );
    if !output.stderr.trim().is_empty() {
        println!("{}", output.stderr);
    }
    output.stdout
}

/// helm, with its cache, configuration and data in `dir` (nothing read from or written to `$HOME`).
pub fn helm(dir: &Path) -> Command {
    let mut command = Command::new(installed_tool("node/node_modules/.bin/helm"));
    for (variable, sub) in [
        ("HELM_CACHE_HOME", "helm-cache"),
        ("HELM_CONFIG_HOME", "helm-config"),
        ("HELM_DATA_HOME", "helm-data"),
    ] {
        command.env(variable, dir.join(sub));
    }
    command
}

pub fn python() -> Command {
    Command::new(installed_tool("venv/bin/python"))
}

/// `helm lint --strict` of the chart with `values` (files) on top of its own.
pub async fn lint(values: &[&Path], dir: &Path) {
    let mut command = helm(dir);
    command.arg("lint").arg("--strict").arg(chart());
    for file in values {
        command.arg("--values").arg(file);
    }
    let out = succeed("helm lint --strict", command, dir).await;
    println!("{out}");
    assert!(
        out.contains("0 chart(s) failed"),
        "helm lint did not pass:\n{out}"
    );
}

/// `helm template` of the chart with `values` files and `--set` assignments.
pub fn template_command(values: &[&Path], set: &[&str], dir: &Path) -> Command {
    let mut command = helm(dir);
    command
        .arg("template")
        .arg(RELEASE)
        .arg(chart())
        .args(["--namespace", NAMESPACE]);
    for file in values {
        command.arg("--values").arg(file);
    }
    for assignment in set {
        command.arg("--set").arg(assignment);
    }
    command
}

/// One rendering of the chart: its objects.
#[derive(Debug)]
pub struct Rendering {
    pub objects: Vec<Value>,
}

impl Rendering {
    /// The objects of `kind`.
    pub fn all(&self, kind: &str) -> Vec<&Value> {
        self.objects.iter().filter(|o| o["kind"] == kind).collect()
    }

    /// The one object of `kind` named `name`.
    pub fn get(&self, kind: &str, name: &str) -> &Value {
        let found: Vec<_> = self
            .all(kind)
            .into_iter()
            .filter(|o| o["metadata"]["name"] == name)
            .collect();
        assert_eq!(found.len(), 1, "expected one {kind} {name}: {found:?}");
        found[0]
    }

    /// `(kind, name)` of every object.
    pub fn inventory(&self) -> BTreeSet<(String, String)> {
        self.objects
            .iter()
            .map(|o| {
                (
                    o["kind"].as_str().unwrap().to_owned(),
                    o["metadata"]["name"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    }

    /// The Deployments and StatefulSets.
    pub fn workloads(&self) -> Vec<&Value> {
        self.objects
            .iter()
            .filter(|o| o["kind"] == "Deployment" || o["kind"] == "StatefulSet")
            .collect()
    }

    /// The one ConfigMap's `skyport.toml` (the gateway's, or the all-in-one's).
    pub fn config_toml(&self) -> &str {
        self.config_named("skyport.toml")
    }

    /// The one ConfigMap's file `file`.
    pub fn config_named(&self, file: &str) -> &str {
        let maps = self.all("ConfigMap");
        assert_eq!(maps.len(), 1, "expected one ConfigMap");
        maps[0]["data"][file]
            .as_str()
            .unwrap_or_else(|| panic!("the ConfigMap has no {file}"))
    }

    /// The files of the one ConfigMap, by name.
    pub fn config_files(&self) -> BTreeMap<&str, &str> {
        let maps = self.all("ConfigMap");
        assert_eq!(maps.len(), 1, "expected one ConfigMap");
        maps[0]["data"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(file, text)| (file.as_str(), text.as_str().unwrap()))
            .collect()
    }

    /// The configuration `workload`'s container reads: the ConfigMap's file its `--config` names.
    pub fn config_of(&self, workload: &Value) -> &str {
        self.config_named(config_file(workload))
    }
}

/// The ConfigMap's file a workload's container reads (`--config /etc/skyport/FILE`).
pub fn config_file(workload: &Value) -> &str {
    let args = container(workload)["args"].as_array().unwrap();
    assert_eq!(args.len(), 2, "{}: args {args:?}", name(workload));
    assert_eq!(args[0], "--config", "{}", name(workload));
    args[1]
        .as_str()
        .unwrap()
        .strip_prefix("/etc/skyport/")
        .unwrap_or_else(|| panic!("{}: --config outside /etc/skyport", name(workload)))
}

/// `helm template`, then `kubernetes-validate --strict` for each supported Kubernetes version, then the
/// objects read back through PyYAML.
pub async fn render(values: &[&Path], set: &[&str], dir: &Path) -> Rendering {
    let file = template(values, set, dir).await;
    for version in KUBERNETES_VERSIONS {
        let mut validate = Command::new(installed_tool("venv/bin/kubernetes-validate"));
        validate
            .args(["--strict", "--kubernetes-version", version])
            .arg(&file);
        let out = succeed(&format!("kubernetes-validate {version}"), validate, dir).await;
        println!("{out}");
        assert!(
            !out.contains("ERROR") && out.contains("passed"),
            "kubernetes-validate {version}:\n{out}"
        );
    }
    read_back(&file, dir).await
}

/// `helm template`, the objects read back through PyYAML, unvalidated: what a
/// test that runs the rendered configuration needs (the chart's tests validate it).
pub async fn render_unvalidated(values: &[&Path], set: &[&str], dir: &Path) -> Rendering {
    let file = template(values, set, dir).await;
    read_back(&file, dir).await
}

/// `helm template` into `dir/rendered.yaml`.
async fn template(values: &[&Path], set: &[&str], dir: &Path) -> PathBuf {
    let yaml = succeed("helm template", template_command(values, set, dir), dir).await;
    let file = dir.join("rendered.yaml");
    std::fs::write(&file, &yaml).unwrap();
    file
}

async fn read_back(file: &Path, dir: &Path) -> Rendering {
    let mut convert = python();
    convert.arg("-c").arg(
        "import json, sys, yaml\n\
         with open(sys.argv[1]) as f:\n    \
             docs = [d for d in yaml.safe_load_all(f) if d is not None]\n\
         json.dump(docs, sys.stdout)\n",
    );
    convert.arg(file);
    let json = succeed("PyYAML to JSON", convert, dir).await;
    let objects: Vec<Value> = serde_json::from_str(&json).unwrap();
    assert!(!objects.is_empty(), "the rendering holds no object");
    Rendering { objects }
}

/// `helm template` that must fail; returns what it printed.
pub async fn render_fails(values: &[&Path], set: &[&str], dir: &Path) -> String {
    let output = run(
        "helm template (must fail)",
        template_command(values, set, dir),
        dir,
    )
    .await;
    let printed = format!("{}{}", output.stdout, output.stderr);
    println!("{printed}");
    assert!(
        !output.status.success(),
        "helm template succeeded but should have failed:\n{printed}"
    );
    printed
}

/// The TOML as JSON (Python's tomllib) and its SHA-256 (hashlib): computed apart from Helm and the chart.
pub async fn toml_facts(toml: &str, dir: &Path) -> (Value, String) {
    let file = dir.join("skyport.toml");
    std::fs::write(&file, toml).unwrap();
    let mut command = python();
    command.arg("-c").arg(
        "import hashlib, json, sys, tomllib\n\
         raw = open(sys.argv[1], 'rb').read()\n\
         json.dump({'toml': tomllib.loads(raw.decode()), 'sha256': hashlib.sha256(raw).hexdigest()}, sys.stdout)\n",
    );
    command.arg(&file);
    let facts: Value = serde_json::from_str(&succeed("tomllib", command, dir).await).unwrap();
    (
        facts["toml"].clone(),
        facts["sha256"].as_str().unwrap().to_owned(),
    )
}

/// The one container of a workload's pod template.
pub fn container(workload: &Value) -> &Value {
    let containers = workload["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap();
    assert_eq!(containers.len(), 1, "one container per pod");
    &containers[0]
}

pub fn name(object: &Value) -> &str {
    object["metadata"]["name"].as_str().unwrap()
}

/// The value of a key in the TOML (as JSON), or `default` when it is not set.
pub fn toml_u64(toml: &Value, section: &str, key: &str, default: u64) -> u64 {
    toml.get(section)
        .and_then(|s| s.get(key))
        .map_or(default, |v| v.as_u64().unwrap())
}

/// Checks every workload's pod: non-root, read-only, hardened; the API on its `http` port (8080, the
/// gateway and the all-in-one; the worker has none) and the probes and the scrape annotations on its
/// `internal` port (9090), apart from it; configured from the ConfigMap with `checksum/config` equal to
/// the hash of the file it reads; `/tmp` an emptyDir; a grace period longer than what the process
/// takes to stop. `components` are the workloads' components, one each.
pub async fn check_pods(rendering: &Rendering, components: &[&str], dir: &Path) {
    let config_map = name(rendering.all("ConfigMap")[0]).to_owned();
    let mut seen: Vec<&str> = Vec::new();
    for workload in rendering.workloads() {
        let what = format!("{} {}", workload["kind"], name(workload));
        let pod = &workload["spec"]["template"];
        let spec = &pod["spec"];
        let c = container(workload);
        let (toml, sha256) = toml_facts(rendering.config_of(workload), dir).await;
        let gateway_grace_ms = toml_u64(&toml, "gateway", "shutdown_grace_period_ms", 10_000);
        let worker_grace_ms = toml_u64(&toml, "worker", "shutdown_grace_period_ms", 30_000);

        // Non-root, read-only, hardened.
        let pod_security = &spec["securityContext"];
        assert_eq!(pod_security["runAsNonRoot"], true, "{what}");
        assert_eq!(pod_security["runAsUser"], NONROOT_UID, "{what}");
        assert_eq!(
            pod_security["seccompProfile"]["type"], "RuntimeDefault",
            "{what}"
        );
        let security = &c["securityContext"];
        assert_eq!(security["runAsNonRoot"], true, "{what}");
        assert_ne!(security["runAsUser"].as_u64(), Some(0), "{what}");
        assert_eq!(security["readOnlyRootFilesystem"], true, "{what}");
        assert_eq!(security["allowPrivilegeEscalation"], false, "{what}");
        assert_eq!(
            security["capabilities"]["drop"],
            serde_json::json!(["ALL"]),
            "{what}"
        );
        assert_eq!(spec["automountServiceAccountToken"], false, "{what}");

        // The API on its port, the probes and metrics on the internal one.
        let component = pod["metadata"]["labels"]["app.kubernetes.io/component"]
            .as_str()
            .unwrap();
        seen.push(component);
        let ports: BTreeMap<&str, u64> = c["ports"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                (
                    p["name"].as_str().unwrap(),
                    p["containerPort"].as_u64().unwrap(),
                )
            })
            .collect();
        let mut expected = BTreeMap::from([("internal", INTERNAL_PORT)]);
        if component != "worker" {
            expected.insert("http", API_PORT);
        }
        assert_eq!(ports, expected, "{what}: its ports");
        assert_eq!(
            toml["gateway"]["internal_listen"], "0.0.0.0:9090",
            "{what}: the probes and metrics apart from the API"
        );
        for (probe, path) in [
            ("startupProbe", "/healthz"),
            ("livenessProbe", "/healthz"),
            ("readinessProbe", "/readyz"),
        ] {
            let get = &c[probe]["httpGet"];
            assert_eq!(get["path"], path, "{what} {probe}");
            assert!(
                get["port"] == "internal" || get["port"] == INTERNAL_PORT,
                "{what} {probe} port {}",
                get["port"]
            );
        }

        // The configuration: the ConfigMap, read-only, passed with --config; its hash on the pod.
        let volumes = spec["volumes"].as_array().unwrap();
        let volume = |name: &str| {
            volumes
                .iter()
                .find(|v| v["name"] == name)
                .unwrap_or_else(|| panic!("{what}: no volume {name}"))
        };
        let mount = |path: &str| {
            c["volumeMounts"]
                .as_array()
                .unwrap()
                .iter()
                .find(|m| m["mountPath"] == path)
                .unwrap_or_else(|| panic!("{what}: nothing mounted on {path}"))
                .clone()
        };
        let config_mount = mount("/etc/skyport");
        assert_eq!(config_mount["readOnly"], true, "{what}");
        assert_eq!(
            volume(config_mount["name"].as_str().unwrap())["configMap"]["name"],
            config_map.as_str(),
            "{what}"
        );
        let tmp = mount("/tmp");
        assert!(
            volume(tmp["name"].as_str().unwrap())
                .get("emptyDir")
                .is_some(),
            "{what}: /tmp is not an emptyDir"
        );
        assert_eq!(
            pod["metadata"]["annotations"]["checksum/config"],
            sha256,
            "{what}: checksum/config is not the SHA-256 of {}",
            config_file(workload)
        );
        assert_eq!(
            pod["metadata"]["annotations"]["prometheus.io/port"],
            INTERNAL_PORT.to_string(),
            "{what}"
        );
        assert_eq!(
            pod["metadata"]["annotations"]["prometheus.io/path"], "/metrics",
            "{what}"
        );

        // Longer to die than the process takes to stop (the preStop sleep first, then SIGTERM).
        let grace_s = spec["terminationGracePeriodSeconds"].as_u64().unwrap();
        let pre_stop_ms = c["lifecycle"]["preStop"]["sleep"]["seconds"]
            .as_u64()
            .unwrap_or(0)
            * 1000;
        let needed_ms = match component {
            "gateway" => pre_stop_ms + gateway_grace_ms,
            "worker" => worker_grace_ms,
            _ => pre_stop_ms + gateway_grace_ms + worker_grace_ms,
        };
        assert!(
            grace_s * 1000 > needed_ms,
            "{what}: terminationGracePeriodSeconds {grace_s} is not longer than {needed_ms} ms"
        );
    }
    seen.sort_unstable();
    let mut components = components.to_vec();
    components.sort_unstable();
    assert_eq!(seen, components, "workloads: {:?}", rendering.inventory());
}

/// The Services the rendering holds expose only the API port (8080) of the gateway or the all-in-one,
/// and the internal port (9090) of the worker only on its headless Service: the probes and `/metrics`
/// are not behind the API's Services.
pub fn check_services(rendering: &Rendering) {
    for service in rendering.all("Service") {
        let what = format!("Service {}", name(service));
        let component = service["spec"]["selector"]["app.kubernetes.io/component"]
            .as_str()
            .unwrap();
        let targets: Vec<&Value> = service["spec"]["ports"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| &p["targetPort"])
            .collect();
        let expected = if component == "worker" {
            assert_eq!(service["spec"]["clusterIP"], "None", "{what}");
            "internal"
        } else {
            "http"
        };
        assert_eq!(targets, [expected], "{what}: its ports");
    }
}

/// Every secret the pods read comes from the Secret named `secret`, which the rendering holds when the
/// chart makes it; returns the `SKYPORT__…` variables that read a key the pods cannot start without.
pub fn secret_refs(rendering: &Rendering, secret: &str, chart_made: bool) -> BTreeSet<String> {
    let held: BTreeSet<String> = if chart_made {
        rendering.get("Secret", secret)["data"]
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect()
    } else {
        assert!(
            rendering.all("Secret").is_empty(),
            "no Secret is made with existingSecret"
        );
        BTreeSet::new()
    };
    let mut required = BTreeSet::new();
    for workload in rendering.workloads() {
        for env in container(workload)["env"].as_array().unwrap() {
            let Some(reference) = env.get("valueFrom").and_then(|v| v.get("secretKeyRef")) else {
                continue;
            };
            let variable = env["name"].as_str().unwrap();
            assert!(variable.starts_with("SKYPORT__"), "{variable}");
            assert_eq!(reference["name"], secret, "{variable}");
            let key = reference["key"].as_str().unwrap();
            if chart_made {
                assert!(held.contains(key), "{variable}: the Secret has no {key}");
            }
            if reference.get("optional") != Some(&Value::Bool(true)) {
                required.insert(variable.to_owned());
            }
        }
    }
    required
}

/// The value of `key` in the Secret named `secret`, decoded, when the rendering holds that Secret.
pub fn secret_value(rendering: &Rendering, secret: &str, key: &str) -> Option<String> {
    let held = rendering
        .all("Secret")
        .into_iter()
        .find(|s| s["metadata"]["name"] == secret)?;
    let encoded = held["data"].get(key)?.as_str().unwrap();
    Some(String::from_utf8(decode_base64(encoded)).unwrap())
}

/// Standard base64 (the `data` of a Secret), padding ignored.
fn decode_base64(text: &str) -> Vec<u8> {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut bits: u32 = 0;
    let mut held = 0;
    let mut bytes = Vec::new();
    for byte in text.bytes().filter(|b| *b != b'=') {
        let value = ALPHABET
            .iter()
            .position(|a| *a == byte)
            .unwrap_or_else(|| panic!("{text:?} is not base64"));
        bits = (bits << 6) | u32::try_from(value).unwrap();
        held += 6;
        if held >= 8 {
            held -= 8;
            bytes.push(u8::try_from(bits >> held).unwrap());
            bits &= (1 << held) - 1;
        }
    }
    bytes
}

/// Loads the configuration file `workload`'s container reads with `Settings::load`, as the container
/// would with the `SKYPORT__…` variables it gets (literal values, the pod name, the value of each secret
/// the rendering's own Secret holds, and a stand-in for each other secret it cannot start without),
/// given as `--set` flags: they go through the same parsing of values as the environment.
pub fn try_load_settings(
    rendering: &Rendering,
    workload: &Value,
    secrets: &BTreeSet<String>,
    dir: &Path,
) -> (Result<Settings, ConfigErrors>, Vec<String>) {
    let file = dir.join(format!("{}.toml", name(workload)));
    std::fs::write(&file, rendering.config_of(workload)).unwrap();
    let mut set = Vec::new();
    for env in container(workload)["env"].as_array().unwrap() {
        let variable = env["name"].as_str().unwrap();
        let Some(key) = variable.strip_prefix("SKYPORT__") else {
            continue;
        };
        let key = key.split("__").collect::<Vec<_>>().join(".").to_lowercase();
        let value = if let Some(value) = env.get("value") {
            value.as_str().unwrap().to_owned()
        } else if env["valueFrom"].get("fieldRef").is_some() {
            format!("{}-0", name(workload))
        } else if let Some(value) = env["valueFrom"]
            .get("secretKeyRef")
            .and_then(|r| secret_value(rendering, r["name"].as_str()?, r["key"].as_str()?))
        {
            value
        } else if secrets.contains(variable) && key == "callbacks.secrets" {
            CALLBACK_SECRETS_STAND_IN.to_owned()
        } else if secrets.contains(variable) && key == "gateway.receipt_keys" {
            RECEIPT_KEYS_STAND_IN.to_owned()
        } else if secrets.contains(variable) && key.ends_with("connection_string") {
            "Endpoint=sb://stand-in.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey=s"
                .to_owned()
        } else if secrets.contains(variable) {
            format!("{key}-stand-in-0123456789abcdef0123456789abcdef")
        } else {
            continue;
        };
        set.push(format!("{key}={value}"));
    }
    let load = |set: Vec<String>| {
        Settings::load(&Cli {
            config: Some(file.clone()),
            set,
            ..Cli::default()
        })
    };
    (load(set.clone()), set)
}

/// [`try_load_settings`], failing the test when the configuration does not load (an unknown key, a
/// bad value, a missing secret).
pub fn load_settings(
    rendering: &Rendering,
    workload: &Value,
    secrets: &BTreeSet<String>,
    dir: &Path,
) -> Settings {
    let (loaded, set) = try_load_settings(rendering, workload, secrets, dir);
    loaded.unwrap_or_else(|errors| {
        panic!(
            "{}: the rendered {} (with --set {set:?}) does not load:\n{errors:#?}\n{}",
            name(workload),
            config_file(workload),
            rendering.config_of(workload)
        )
    })
}

/// No file of the ConfigMap holds a secret key: those come from the Secret.
pub async fn check_no_secret_keys(rendering: &Rendering, dir: &Path) {
    for (file, text) in rendering.config_files() {
        let (toml, _) = toml_facts(text, dir).await;
        for (section, key) in [
            ("cosmos", "key"),
            ("eventhubs", "connection_string"),
            ("kafka", "connection_string"),
            ("kafka", "sasl_password"),
            ("gateway", "receipt_keys"),
            ("gateway", "receipt_key"),
            ("callbacks", "secrets"),
        ] {
            assert!(
                toml.get(section).and_then(|s| s.get(key)).is_none(),
                "{section}.{key} is in the ConfigMap's {file}"
            );
        }
        let auth = &toml["gateway"]["auth"];
        assert!(
            auth["jwt"].get("hs256_secret").is_none(),
            "gateway.auth.jwt.hs256_secret is in the ConfigMap's {file}"
        );
        if let Some(keys) = auth["api_keys"].as_object() {
            for (key_name, api_key) in keys {
                assert!(
                    api_key.get("key").is_none(),
                    "gateway.auth.api_keys.{key_name}.key is in the ConfigMap's {file}"
                );
            }
        }
    }
}

/// The `SKYPORT__…` variables `workload`'s container reads from a Secret.
pub fn secret_variables(workload: &Value) -> BTreeSet<String> {
    container(workload)["env"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|env| env["valueFrom"].get("secretKeyRef").is_some())
        .map(|env| env["name"].as_str().unwrap().to_owned())
        .collect()
}

/// The labels a selector matches are on the pods of `workload`.
pub fn selects(selector: &Value, workload: &Value) -> bool {
    let labels = &workload["spec"]["template"]["metadata"]["labels"];
    selector
        .as_object()
        .unwrap()
        .iter()
        .all(|(k, v)| &labels[k] == v)
}

/// A rendering that several small tests read: linted, rendered and validated
/// once per test process, in a directory that lasts as long as the process.
#[derive(Debug)]
pub struct SharedRendering {
    /// Where the overlays and the rendering's tool output live; tests that
    /// run tools again use directories of their own (they run at once).
    _dir: tempfile::TempDir,
    /// The values files it was rendered with, in order.
    pub values: Vec<PathBuf>,
    pub rendering: Rendering,
}

/// The rendering of `cell`, made the first time with the values files that
/// `values` names (it may write overlays into the directory it is given).
pub async fn shared(
    cell: &'static tokio::sync::OnceCell<SharedRendering>,
    values: fn(&Path) -> Vec<PathBuf>,
) -> &'static SharedRendering {
    cell.get_or_init(|| async move {
        let dir = tempfile::tempdir().unwrap();
        let values = values(dir.path());
        let refs: Vec<&Path> = values.iter().map(PathBuf::as_path).collect();
        lint(&refs, dir.path()).await;
        let rendering = render(&refs, &[], dir.path()).await;
        SharedRendering {
            _dir: dir,
            values,
            rendering,
        }
    })
    .await
}
