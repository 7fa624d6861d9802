//! The chart's monitors and Grafana dashboard (`metrics.monitor`,
//! `metrics.grafanaDashboard`, `helm/skyport/dashboards/skyport.json`), judged
//! by the schemas their projects publish (vendored under `tests/fixtures/crds`,
//! checked by `skyport_tests::crds`). Each monitor choice (PodMonitor or
//! ServiceMonitor, in the Prometheus operator's group or Azure Managed
//! Prometheus's) is rendered on each shape (the all-in-one, `ci/azure-values.yaml`,
//! `ci/kafka-values.yaml`): the built-in kinds pass `kubernetes-validate
//! --strict`, the monitor passes its CRD's schema, selects every Skyport pod
//! (or its metrics Service) on port `internal` and labels each series with its
//! namespace and pod, and no pod keeps a scrape annotation. The dashboard
//! passes Grafana's schema and filters every query by `$namespace` and `$pod`.
//! The checker is shown to refuse broken objects, so a pass means something.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use skyport_tests::crds::{check_dashboard, check_objects, validate, validate_dashboard};
use skyport_tests::helm::*;
use skyport_tests::workspace;

/// A credential, which every install needs.
/// The label kube-prometheus-stack's Prometheus selects monitors by.
const RELEASE_LABEL: &str = "kube-prometheus-stack";
const MONITOR_KINDS: [&str; 2] = ["PodMonitor", "ServiceMonitor"];
const API_GROUPS: [&str; 2] = ["monitoring.coreos.com", "azmonitoring.coreos.com"];
/// The label limits Azure Managed Prometheus asks every monitor to state.
const AZURE_LIMITS: [(&str, u64); 3] = [
    ("labelLimit", 63),
    ("labelNameLengthLimit", 511),
    ("labelValueLengthLimit", 1023),
];

/// The objects no bundled Kubernetes schema covers: those of a group outside Kubernetes' own.
fn custom_objects(rendering: &Rendering) -> Vec<&Value> {
    rendering
        .objects
        .iter()
        .filter(|o| {
            let api_version = o["apiVersion"].as_str().unwrap();
            let group = api_version.rsplit_once('/').map_or("", |(g, _)| g);
            group.contains('.') && !group.ends_with(".k8s.io")
        })
        .collect()
}

/// The name, port and target port of each port of a Service.
fn service_ports(service: &Value) -> Vec<(String, Value, Value)> {
    service["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap().to_owned(),
                p["port"].clone(),
                p["targetPort"].clone(),
            )
        })
        .collect()
}

/// Whether every label of `selector` is among `labels`.
fn matches(selector: &Value, labels: &Value) -> bool {
    selector
        .as_object()
        .unwrap()
        .iter()
        .all(|(k, v)| &labels[k] == v)
}

/// The monitor scrapes `/metrics` on port `internal` at the interval given, and relabels every
/// series with its namespace and pod.
fn check_endpoint(monitor: &Value, what: &str) {
    let kind = monitor["kind"].as_str().unwrap();
    let field = if kind == "ServiceMonitor" {
        "endpoints"
    } else {
        "podMetricsEndpoints"
    };
    let endpoints = monitor["spec"][field].as_array().unwrap();
    assert_eq!(endpoints.len(), 1, "{what}: {endpoints:?}");
    let endpoint = &endpoints[0];
    assert_eq!(endpoint["port"], "internal", "{what}");
    assert_eq!(endpoint["path"], "/metrics", "{what}");
    assert_eq!(endpoint["interval"], "30s", "{what}");
    for (label, source) in [
        ("namespace", "__meta_kubernetes_namespace"),
        ("pod", "__meta_kubernetes_pod_name"),
    ] {
        assert!(
            endpoint["relabelings"]
                .as_array()
                .unwrap()
                .iter()
                .any(|r| r["targetLabel"] == label
                    && r["sourceLabels"] == json!([source])
                    && r["action"] == "replace"),
            "{what}: no relabeling sets {label} from {source}"
        );
    }
}

/// A ServiceMonitor selects one headless metrics Service per workload, each exposing port
/// `internal` (9090) alone and selecting that workload's pods; the API's Service is not selected
/// and still exposes the API alone.
fn check_metrics_services(rendering: &Rendering, monitor: &Value, what: &str) {
    let selector = &monitor["spec"]["selector"]["matchLabels"];
    let selected: Vec<&Value> = rendering
        .all("Service")
        .into_iter()
        .filter(|s| matches(selector, &s["metadata"]["labels"]))
        .collect();
    let workloads = rendering.workloads();
    assert_eq!(selected.len(), workloads.len(), "{what}: {selected:?}");
    for service in &selected {
        let service_name = name(service);
        assert_eq!(
            service["spec"]["clusterIP"], "None",
            "{what} {service_name}"
        );
        assert_eq!(
            service_ports(service),
            [(
                "internal".to_owned(),
                json!(INTERNAL_PORT),
                json!("internal")
            )],
            "{what} {service_name}"
        );
        let backed: Vec<&&Value> = workloads
            .iter()
            .filter(|w| selects(&service["spec"]["selector"], w))
            .collect();
        assert_eq!(backed.len(), 1, "{what}: {service_name} selects {backed:?}");
    }
    for workload in &workloads {
        assert!(
            selected
                .iter()
                .any(|s| selects(&s["spec"]["selector"], workload)),
            "{what}: no metrics Service selects {}",
            name(workload)
        );
    }
    let api = rendering.get("Service", RELEASE);
    assert!(
        !selected.contains(&api),
        "{what}: the API's Service is selected"
    );
    assert_eq!(
        service_ports(api)
            .into_iter()
            .map(|(port, _, _)| port)
            .collect::<Vec<_>>(),
        ["http"],
        "{what}: the API's Service"
    );
}

/// Renders `values` with each monitor choice and checks what each must hold; `components` are the
/// shape's workloads.
async fn check_shape(values: fn(&Path) -> Vec<PathBuf>, components: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let files = values(dir);
    let files: Vec<&Path> = files.iter().map(PathBuf::as_path).collect();
    for kind in MONITOR_KINDS {
        for group in API_GROUPS {
            let what = format!("{kind} of {group} on {components:?}");
            let set = [
                format!("metrics.monitor.kind={kind}"),
                format!("metrics.monitor.apiGroup={group}"),
                format!("metrics.monitor.labels.release={RELEASE_LABEL}"),
                "networkPolicy.enabled=true".to_owned(),
            ];
            let set: Vec<&str> = set.iter().map(String::as_str).collect();
            // kubernetes-validate --strict passes the built-in kinds (it skips the monitor).
            let rendering = render(&files, &set, dir).await;
            let custom = custom_objects(&rendering);
            assert_eq!(custom.len(), 1, "{what}: {:?}", rendering.inventory());
            validate(&custom, dir).await;

            let monitor = rendering.get(kind, RELEASE);
            assert_eq!(monitor["apiVersion"], format!("{group}/v1"), "{what}");
            assert_eq!(
                monitor["metadata"]["labels"]["release"], RELEASE_LABEL,
                "{what}"
            );
            for (limit, value) in AZURE_LIMITS {
                let expected = (group == "azmonitoring.coreos.com").then_some(value);
                assert_eq!(monitor["spec"][limit].as_u64(), expected, "{what}: {limit}");
            }
            check_endpoint(monitor, &what);
            let selector = &monitor["spec"]["selector"]["matchLabels"];
            let mut seen = BTreeSet::new();
            for workload in rendering.workloads() {
                let pod = &workload["spec"]["template"];
                seen.insert(
                    pod["metadata"]["labels"]["app.kubernetes.io/component"]
                        .as_str()
                        .unwrap(),
                );
                let internal = container(workload)["ports"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|p| p["name"] == "internal")
                    .unwrap_or_else(|| panic!("{what}: {} has no port internal", name(workload)));
                assert_eq!(internal["containerPort"], INTERNAL_PORT, "{what}");
                if kind == "PodMonitor" {
                    assert!(selects(selector, workload), "{what}: {}", name(workload));
                }
                let annotations = pod["metadata"]["annotations"].as_object().unwrap();
                assert!(
                    annotations.keys().all(|k| !k.starts_with("prometheus.io/")),
                    "{what}: {} is annotated for scraping too: {annotations:?}",
                    name(workload)
                );
            }
            assert_eq!(
                seen,
                components.iter().copied().collect::<BTreeSet<_>>(),
                "{what}"
            );
            if kind == "ServiceMonitor" {
                check_metrics_services(&rendering, monitor, &what);
            } else {
                assert!(
                    !rendering
                        .inventory()
                        .iter()
                        .any(|(k, n)| k == "Service" && n.ends_with("-metrics")),
                    "{what}: a metrics Service without a ServiceMonitor"
                );
            }
            check_scraper_admitted(&rendering, &what);
        }
    }
}

/// Each workload's NetworkPolicy admits `networkPolicy.metricsFrom` on the port the monitor scrapes
/// (`internal`).
fn check_scraper_admitted(rendering: &Rendering, what: &str) {
    let policies = rendering.all("NetworkPolicy");
    for workload in rendering.workloads() {
        let policy = policies
            .iter()
            .find(|p| selects(&p["spec"]["podSelector"]["matchLabels"], workload))
            .unwrap_or_else(|| panic!("{what}: no NetworkPolicy selects {}", name(workload)));
        let rules = policy["spec"]["ingress"].as_array().unwrap();
        assert!(
            rules.iter().any(|rule| {
                rule["ports"] == json!([{"port": "internal", "protocol": "TCP"}])
                    && rule["from"].as_array().is_some_and(|from| !from.is_empty())
            }),
            "{what}: {} admits no scraper to port internal: {rules:?}",
            name(policy)
        );
    }
}

#[tokio::test]
async fn every_monitor_of_the_all_in_one_validates_and_scrapes_it() {
    check_shape(default_values, &["all-in-one"]).await;
}

#[tokio::test]
async fn every_monitor_of_the_azure_install_validates_and_scrapes_every_pod() {
    check_shape(|_| vec![azure_values()], &["gateway", "worker"]).await;
}

#[tokio::test]
async fn every_monitor_of_the_kafka_install_validates_and_scrapes_every_pod() {
    check_shape(|_| vec![kafka_values()], &["gateway", "worker"]).await;
}

#[tokio::test]
async fn without_a_monitor_the_pods_keep_their_scrape_annotations_unless_told() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let files = default_values(dir);
    let files: Vec<&Path> = files.iter().map(PathBuf::as_path).collect();
    for (set, annotated) in [(None, true), (Some("metrics.podAnnotations=false"), false)] {
        let set: Vec<&str> = set.into_iter().collect();
        let rendering = render(&files, &set, dir).await;
        assert!(custom_objects(&rendering).is_empty(), "{set:?}");
        assert_eq!(
            rendering.all("ConfigMap").len(),
            1,
            "no dashboard by default"
        );
        let pod = &rendering.get("StatefulSet", RELEASE)["spec"]["template"];
        let scrape = pod["metadata"]["annotations"].get("prometheus.io/scrape");
        assert_eq!(scrape.is_some(), annotated, "{set:?}");
    }
}

#[tokio::test]
async fn monitor_values_outside_the_schema_fail_the_render() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let files = default_values(dir);
    let files: Vec<&Path> = files.iter().map(PathBuf::as_path).collect();
    for (set, names) in [
        ("metrics.monitor.kind=Probe", "kind"),
        ("metrics.monitor.apiGroup=example.com", "apiGroup"),
        ("metrics.monitor.interval=soon", "interval"),
        ("metrics.monitor.scheme=https", "scheme"),
    ] {
        let printed = render_fails(&files, &[set], dir).await;
        assert!(printed.contains(names), "{set}: {printed}");
    }
}

/// The series a PromQL expression reads, each with the text of its matchers (`name{…}`).
fn selectors(expr: &str) -> Vec<(String, String)> {
    let mut found = Vec::new();
    let mut rest = expr;
    while let Some(start) = rest.find("skyport_") {
        let tail = &rest[start..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        let after = &tail[end..];
        let matchers = after
            .strip_prefix('{')
            .map_or("", |m| &m[..m.find('}').unwrap()]);
        found.push((tail[..end].to_owned(), matchers.to_owned()));
        rest = after;
    }
    found
}

/// The label names an expression groups by or matches on.
fn labels_used(expr: &str, selectors: &[(String, String)]) -> BTreeSet<String> {
    let mut labels = BTreeSet::new();
    for group in expr.split("by (").skip(1) {
        let list = &group[..group.find(')').unwrap()];
        labels.extend(list.split(',').map(|l| l.trim().to_owned()));
    }
    for (_, matchers) in selectors {
        for matcher in matchers.split(',').filter(|m| !m.trim().is_empty()) {
            let end = matcher.find(['=', '!']).unwrap();
            labels.insert(matcher[..end].trim().to_owned());
        }
    }
    labels
}

/// docs/operations.md's "Metrics" section.
fn metrics_section() -> String {
    let text = std::fs::read_to_string(workspace().join("docs/operations.md")).unwrap();
    let start = text.find("\n## Metrics\n").unwrap();
    let end = text[start + 1..].find("\n## ").unwrap() + start + 1;
    text[start..end].to_owned()
}

fn dashboard() -> Value {
    let path = chart().join("dashboards/skyport.json");
    serde_json::from_slice(&std::fs::read(&path).unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[tokio::test]
async fn the_dashboard_passes_grafanas_schema_and_filters_every_query_by_namespace_and_pod() {
    let dir = tempfile::tempdir().unwrap();
    let board = dashboard();
    validate_dashboard(&board, dir.path()).await;
    assert!(board["schemaVersion"].as_u64().unwrap() >= 39);

    let variables = board["templating"]["list"].as_array().unwrap();
    let variable = |n: &str| {
        variables
            .iter()
            .find(|v| v["name"] == n)
            .unwrap_or_else(|| panic!("no variable {n}"))
    };
    assert_eq!(variable("datasource")["type"], "datasource");
    assert_eq!(variable("datasource")["query"], "prometheus");
    for n in ["namespace", "pod"] {
        let v = variable(n);
        assert_eq!(v["type"], "query", "{n}");
        assert_eq!(v["multi"], true, "{n}");
        assert_eq!(v["includeAll"], true, "{n}");
        assert_eq!(v["datasource"]["uid"], "${datasource}", "{n}");
    }

    let documented = metrics_section();
    let mut ids = BTreeSet::new();
    let mut queries = 0;
    for panel in board["panels"].as_array().unwrap() {
        let title = panel["title"].as_str().unwrap();
        assert!(
            ids.insert(panel["id"].as_u64().unwrap()),
            "{title}: its id repeats"
        );
        if panel["type"] == "row" {
            continue;
        }
        assert_eq!(panel["datasource"]["uid"], "${datasource}", "{title}");
        let targets = panel["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "{title}: no query");
        for target in targets {
            assert_eq!(target["datasource"]["uid"], "${datasource}", "{title}");
            let expr = target["expr"].as_str().unwrap();
            let found = selectors(expr);
            assert!(!found.is_empty(), "{title}: {expr} reads no Skyport series");
            for (series, matchers) in &found {
                assert!(
                    matchers.contains(r#"namespace=~"$namespace""#)
                        && matchers.contains(r#"pod=~"$pod""#),
                    "{title}: {series} is not filtered by $namespace and $pod in {expr}"
                );
                let name = series.strip_prefix("skyport_").unwrap();
                let listed = |n: &str| documented.contains(&format!("`{n}`"));
                let base = ["_bucket", "_count", "_sum"]
                    .iter()
                    .find_map(|s| name.strip_suffix(s).filter(|b| listed(b)))
                    .unwrap_or(name);
                assert!(
                    listed(base),
                    "{title}: {series} is not in docs/operations.md's Metrics"
                );
            }
            for label in labels_used(expr, &found) {
                assert!(
                    ["namespace", "pod", "le"].contains(&label.as_str())
                        || documented.contains(&format!("`{label}`")),
                    "{title}: label {label} of {expr} is not in docs/operations.md's Metrics"
                );
            }
            queries += 1;
        }
    }
    println!("{queries} queries in {} panels", ids.len());
}

#[tokio::test]
async fn the_dashboard_configmap_carries_the_sidecars_label_and_the_dashboard() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let files = default_values(dir);
    let files: Vec<&Path> = files.iter().map(PathBuf::as_path).collect();
    let on = "metrics.grafanaDashboard.enabled=true";
    for (set, label, value) in [
        (vec![on], "grafana_dashboard", "1"),
        (
            vec![
                on,
                "metrics.grafanaDashboard.label=dashboards",
                "metrics.grafanaDashboard.labelValue=skyport",
                "metrics.grafanaDashboard.annotations.grafana_folder=Skyport",
            ],
            "dashboards",
            "skyport",
        ),
    ] {
        let rendering = render(&files, &set, dir).await;
        let map = rendering.get("ConfigMap", "skyport-dashboard");
        assert_eq!(map["metadata"]["labels"][label], value, "{set:?}");
        if label == "dashboards" {
            assert_eq!(map["metadata"]["annotations"]["grafana_folder"], "Skyport");
        }
        let held: Value =
            serde_json::from_str(map["data"]["skyport.json"].as_str().unwrap()).unwrap();
        assert_eq!(
            held,
            dashboard(),
            "{set:?}: the ConfigMap's dashboard is not the file"
        );
    }
}

#[tokio::test]
async fn the_checker_refuses_broken_objects_and_dashboards() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let files = default_values(dir);
    let files: Vec<&Path> = files.iter().map(PathBuf::as_path).collect();
    let rendering = render(&files, &["metrics.monitor.kind=PodMonitor"], dir).await;
    let monitor = rendering.get("PodMonitor", RELEASE);
    validate(&[monitor], dir).await;

    let mut broken = monitor.clone();
    broken["spec"]["podMetricsEndpoints"][0]["port"] = json!(9090);
    broken["spec"]["podMetricsEndpoints"][0]["interval"] = json!("soon");
    broken["spec"]["podMetricEndpoints"] = json!([]);
    broken["metadata"]["labels"]["release"] = json!(1);
    let mut unserved = monitor.clone();
    unserved["apiVersion"] = json!("monitoring.coreos.com/v2");
    let unknown = json!({"apiVersion": "monitoring.coreos.com/v1", "kind": "Probe", "metadata": {"name": "x"}});
    let rules = json!({
        "apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule", "metadata": {"name": "r"},
        "spec": {"groups": [{"name": "skyport", "rules": []}, {"name": "skyport", "rules": []}]}
    });
    let findings = check_objects(&[&broken, &unserved, &unknown, &rules], dir).await;
    let said = findings.violations.join("\n");
    for expected in [
        "PodMonitor skyport: $.spec.podMetricsEndpoints[0].port: 9090 is not of type 'string'",
        "PodMonitor skyport: $.spec.podMetricsEndpoints[0].interval: 'soon' does not match",
        "PodMonitor skyport: $.spec: Additional properties are not allowed ('podMetricEndpoints' was unexpected)",
        "PodMonitor skyport: $.metadata.labels.release: 1 is not of type 'string'",
        "serves no version 'v2'",
        "no CRD of Probe in group 'monitoring.coreos.com' is vendored",
        "PrometheusRule r: $.spec.groups: item 1 repeats",
    ] {
        assert!(said.contains(expected), "not said: {expected}\n{said}");
    }

    let mut board = dashboard();
    board["panels"][1]["gridPos"]["w"] = json!(30);
    board["templating"]["list"][1]["multi"] = json!("yes");
    board.as_object_mut().unwrap().remove("schemaVersion");
    let said = check_dashboard(&board, dir).await.violations.join("\n");
    for expected in [
        "$.panels[1].gridPos.w: 30 is greater than the maximum of 24",
        "$.templating.list[1].multi: 'yes' is not of type 'boolean'",
        "$: 'schemaVersion' is a required property",
    ] {
        assert!(said.contains(expected), "not said: {expected}\n{said}");
    }
}

#[tokio::test]
async fn every_vendored_kind_admits_a_valid_object() {
    // What the chart may render next (alert rules, KEDA's scaler), in the served versions.
    let dir = tempfile::tempdir().unwrap();
    let objects = [
        json!({
            "apiVersion": "azmonitoring.coreos.com/v1", "kind": "ServiceMonitor",
            "metadata": {"name": "skyport", "labels": {"app.kubernetes.io/name": "skyport"}},
            "spec": {"labelLimit": 63, "selector": {"matchLabels": {"app": "skyport"}},
                     "endpoints": [{"port": "internal", "interval": "30s"}]}
        }),
        json!({
            "apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
            "metadata": {"name": "skyport"},
            "spec": {"groups": [{"name": "skyport", "rules": [{
                "alert": "SkyportDown", "expr": "up == 0", "for": "5m",
                "labels": {"severity": "page"}, "annotations": {"summary": "a process is down"}
            }]}]}
        }),
        json!({
            "apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": {"name": "skyport-worker"},
            "spec": {"scaleTargetRef": {"name": "skyport-worker", "kind": "StatefulSet"},
                     "minReplicaCount": 2, "maxReplicaCount": 8,
                     "triggers": [{"type": "prometheus", "authenticationRef": {"name": "skyport"},
                                   "metadata": {"serverAddress": "http://prometheus:9090",
                                                "query": "sum(skyport_consumer_lag_events)", "threshold": "1000"}}]}
        }),
        json!({
            "apiVersion": "keda.sh/v1alpha1", "kind": "TriggerAuthentication", "metadata": {"name": "skyport"},
            "spec": {"podIdentity": {"provider": "azure-workload"}}
        }),
    ];
    let refs: Vec<&Value> = objects.iter().collect();
    let findings = check_objects(&refs, dir.path()).await;
    assert!(findings.violations.is_empty(), "{:#?}", findings.violations);
    assert!(
        findings
            .unevaluated
            .iter()
            .any(|rule| rule.contains("minReplicaCount <=")),
        "ScaledObject's CEL rule is reported as not evaluated: {:?}",
        findings.unevaluated
    );
}
