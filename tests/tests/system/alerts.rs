//! The alert rules, written once in the chart (`helm/skyport/templates/_alerts.tpl`):
//! the PrometheusRule it renders with `alerts.prometheusRule.enabled` passes the
//! chart's checks; `docs/monitoring/` holds the same rules, made from the chart's
//! rendering with its default values for namespace `skyport`, as a Prometheus rules
//! file and as an ARM template of `Microsoft.AlertsManagement/prometheusRuleGroups`,
//! and a test fails when they drift from it (with [`WRITE`] set it writes them
//! instead: [`REGENERATE`]). Debian's promtool (Prometheus 2.42, installed on
//! first use) checks the rules file and runs
//! `tests/fixtures/monitoring/skyport-alerts.test.yaml`, where each alert fires on
//! synthetic series of its symptom, with its labels and annotations, and stays
//! quiet on healthy ones.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value, json};
use skyport_tests::crds;
use skyport_tests::helm::*;
use skyport_tests::tools::promtool;
use skyport_tests::workspace;
use tokio::process::Command;
use tokio::sync::OnceCell;

/// Set to `1`, the drift test writes the generated files instead of comparing them.
const WRITE: &str = "SKYPORT_WRITE_GENERATED";
/// The command that writes the generated files.
const REGENERATE: &str =
    "SKYPORT_WRITE_GENERATED=1 cargo test -p skyport-tests --test system -- alerts::";
/// The Prometheus rules file, under the workspace.
const RULES_FILE: &str = "docs/monitoring/skyport-alerts.rules.yaml";
/// The ARM template, under the workspace.
const ARM_FILE: &str = "docs/monitoring/skyport-alerts.arm.json";
/// promtool's unit tests of the rules, under the workspace.
const UNIT_TESTS: &str = "tests/fixtures/monitoring/skyport-alerts.test.yaml";
/// The label kube-prometheus-stack's Prometheus selects rules by, as an install would give it.
const RELEASE_LABEL: &str = "kube-prometheus-stack";
/// The API key the rendering needs (authentication is on).
const API_KEY: &str = "alerts-key-from-values-0123456789abcdef";

static RULES: OnceCell<SharedRendering> = OnceCell::const_new();

/// The chart's own values with a credential, the PrometheusRule on and the label that selects it.
fn rule_values(dir: &Path) -> Vec<PathBuf> {
    let overlay = dir.join("alerts-values.yaml");
    std::fs::write(
        &overlay,
        format!(
            "secrets:\n  apiKeys:\n    portal: {API_KEY}\n\
             alerts:\n  prometheusRule:\n    enabled: true\n    labels:\n      release: {RELEASE_LABEL}\n"
        ),
    )
    .unwrap();
    vec![overlay]
}

/// The one PrometheusRule of the shared rendering.
async fn prometheus_rule() -> &'static Value {
    let rendering = &shared(&RULES, rule_values).await.rendering;
    let rules = rendering.all("PrometheusRule");
    assert_eq!(rules.len(), 1, "{:?}", rendering.inventory());
    rules[0]
}

/// Every alerting rule of `groups`.
fn rules_of(groups: &Value) -> Vec<&Value> {
    groups
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|group| group["rules"].as_array().unwrap())
        .collect()
}

/// The string at `key` of `rule` (or of any object).
fn text<'a>(rule: &'a Value, key: &str) -> &'a str {
    rule[key]
        .as_str()
        .unwrap_or_else(|| panic!("{key} of {rule}"))
}

/// A scalar as YAML: plain when it is a word YAML reads as a string (a name,
/// `critical`, `5m`), else double-quoted as JSON writes it (a JSON string is a
/// YAML one).
fn scalar(value: &str) -> String {
    let word = value
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    let keyword = ["true", "false", "null", "yes", "no", "on", "off", "y", "n"]
        .contains(&value.to_lowercase().as_str());
    let starts_with_letter = value.starts_with(|c: char| c.is_ascii_alphabetic());
    let duration = value.len() > 1
        && value[..value.len() - 1].chars().all(|c| c.is_ascii_digit())
        && value.ends_with(['s', 'm', 'h']);
    if word && !keyword && (starts_with_letter || duration) {
        value.to_owned()
    } else {
        serde_json::to_string(value).unwrap()
    }
}

/// The rule groups as a Prometheus rules file: each rule's keys in the order
/// Prometheus documents them, its expression as a literal block.
fn rules_file(groups: &Value) -> String {
    let mut out = String::new();
    writeln!(
        out,
        "# Skyport's alert rules for namespace skyport, made from the Helm chart\n\
         # (helm/skyport/templates/_alerts.tpl) with its default values; do not edit:\n\
         # {REGENERATE}\n\
         # writes it again. Runbooks: docs/operations.md, \"Alerts\".\n\
         groups:"
    )
    .unwrap();
    for group in groups.as_array().unwrap() {
        writeln!(out, "  - name: {}", scalar(text(group, "name"))).unwrap();
        writeln!(out, "    rules:").unwrap();
        for rule in group["rules"].as_array().unwrap() {
            writeln!(out, "      - alert: {}", scalar(text(rule, "alert"))).unwrap();
            writeln!(out, "        expr: |-").unwrap();
            for line in text(rule, "expr").lines() {
                writeln!(out, "          {line}").unwrap();
            }
            if let Some(duration) = rule.get("for") {
                writeln!(out, "        for: {}", scalar(duration.as_str().unwrap())).unwrap();
            }
            for map in ["labels", "annotations"] {
                writeln!(out, "        {map}:").unwrap();
                for (key, value) in rule[map].as_object().unwrap() {
                    writeln!(out, "          {key}: {}", scalar(value.as_str().unwrap())).unwrap();
                }
            }
        }
    }
    out
}

/// A Prometheus duration (`5m`, `1h`, `30s`) in ISO 8601 (`PT5M`), as Azure takes it.
fn iso_duration(duration: &str) -> String {
    let (count, unit) = duration.split_at(duration.len() - 1);
    assert!(
        count.parse::<u32>().is_ok() && matches!(unit, "s" | "m" | "h"),
        "{duration}: not a duration of whole seconds, minutes or hours"
    );
    format!("PT{count}{}", unit.to_uppercase())
}

/// Azure's severity (0 critical … 4 verbose) of a rule's `severity` label.
fn azure_severity(rule: &Value) -> u64 {
    match text(&rule["labels"], "severity") {
        "critical" => 0,
        "warning" => 2,
        other => panic!("{}: severity {other} has no Azure severity", rule["alert"]),
    }
}

/// A string ARM reads as it is: one that begins with `[` would be an expression.
fn literal(value: &str) -> Value {
    Value::String(if value.starts_with('[') {
        format!("[{value}")
    } else {
        value.to_owned()
    })
}

/// A map of strings, each [`literal`].
fn literal_map(map: &Value) -> Value {
    Value::Object(
        map.as_object()
            .unwrap()
            .iter()
            .map(|(key, value)| (key.clone(), literal(value.as_str().unwrap())))
            .collect::<Map<_, _>>(),
    )
}

/// The rule group as an ARM template deploying one `prometheusRuleGroups`
/// resource (API 2023-03-01) on an Azure Monitor workspace, evaluated every
/// minute for one cluster, each alert sent to an action group.
fn arm_template(groups: &Value) -> String {
    assert_eq!(
        groups.as_array().unwrap().len(),
        1,
        "the ARM template holds one rule group"
    );
    let rules: Vec<Value> = rules_of(groups)
        .into_iter()
        .map(|rule| {
            let mut azure = json!({
                "alert": literal(text(rule, "alert")),
                "expression": literal(text(rule, "expr")),
                "severity": azure_severity(rule),
                "labels": literal_map(&rule["labels"]),
                "annotations": literal_map(&rule["annotations"]),
                "enabled": true,
                "actions": [{"actionGroupId": "[parameters('actionGroupId')]"}],
                "resolveConfiguration": {"autoResolved": true, "timeToResolve": "PT5M"},
            });
            if let Some(duration) = rule.get("for") {
                azure["for"] = Value::String(iso_duration(duration.as_str().unwrap()));
            }
            azure
        })
        .collect();
    let parameter =
        |description: &str| json!({"type": "string", "metadata": {"description": description}});
    let template = json!({
        "$schema": "https://schema.management.azure.com/schemas/2019-04-01/deploymentTemplate.json#",
        "contentVersion": "1.0.0.0",
        "metadata": {
            "description": format!(
                "Skyport's alert rules for namespace skyport, made from the Helm chart \
                 (helm/skyport/templates/_alerts.tpl) with its default values; do not edit: \
                 {REGENERATE} writes it again. Runbooks: docs/operations.md, Alerts."
            ),
        },
        "parameters": {
            "azureMonitorWorkspaceId": parameter(
                "The resource id of the Azure Monitor workspace the cluster's metrics go to"
            ),
            "clusterName": parameter("The AKS cluster whose series the rules read"),
            "actionGroupId": parameter("The resource id of the action group that each alert notifies"),
            "ruleGroupName": {
                "type": "string",
                "defaultValue": "skyport-alerts",
                "metadata": {"description": "The rule group's name"},
            },
            "location": {
                "type": "string",
                "defaultValue": "[resourceGroup().location]",
                "metadata": {"description": "The rule group's region: the workspace's"},
            },
        },
        "resources": [{
            "type": "Microsoft.AlertsManagement/prometheusRuleGroups",
            "apiVersion": "2023-03-01",
            "name": "[parameters('ruleGroupName')]",
            "location": "[parameters('location')]",
            "properties": {
                "description": "Skyport's alerts (docs/operations.md, Alerts)",
                "scopes": ["[parameters('azureMonitorWorkspaceId')]"],
                "clusterName": "[parameters('clusterName')]",
                "enabled": true,
                "interval": "PT1M",
                "rules": rules,
            },
        }],
    });
    format!("{}\n", serde_json::to_string_pretty(&template).unwrap())
}

#[tokio::test]
async fn the_generated_rules_are_the_charts_rendering() {
    let groups = &prometheus_rule().await["spec"]["groups"];
    let write = std::env::var_os(WRITE).is_some_and(|value| value == "1");
    for (file, made) in [
        (RULES_FILE, rules_file(groups)),
        (ARM_FILE, arm_template(groups)),
    ] {
        let path = workspace().join(file);
        if write {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, &made).unwrap();
            println!("wrote {file}");
            continue;
        }
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            committed == made,
            "{file} is not what the chart renders (helm/skyport/templates/_alerts.tpl): \
             write it again with `{REGENERATE}`"
        );
    }
}

#[tokio::test]
async fn the_prometheus_rule_renders_beside_the_charts_objects_and_passes_their_checks() {
    let shared = shared(&RULES, rule_values).await;
    let rendering = &shared.rendering;
    let dir = tempfile::tempdir().unwrap();
    check_pods(rendering, &["all-in-one"], dir.path()).await;
    check_services(rendering);
    let rule = prometheus_rule().await;
    assert_eq!(rule["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(name(rule), "skyport");
    crds::validate(&[rule], dir.path()).await;
    let labels = &rule["metadata"]["labels"];
    assert_eq!(
        labels["release"], RELEASE_LABEL,
        "alerts.prometheusRule.labels"
    );
    assert_eq!(labels["app.kubernetes.io/instance"], RELEASE);

    // Every alert is located, explained, and points at its runbook.
    let runbooks = std::fs::read_to_string(workspace().join("docs/operations.md")).unwrap();
    let rules = rules_of(&rule["spec"]["groups"]);
    assert!(rules.len() >= 10, "{} alerts", rules.len());
    let mut names = BTreeSet::new();
    for rule in rules {
        let alert = text(rule, "alert");
        assert!(alert.starts_with("Skyport"), "{alert}");
        assert!(names.insert(alert), "{alert} twice");
        azure_severity(rule);
        let annotations = &rule["annotations"];
        assert!(!text(annotations, "summary").is_empty(), "{alert}");
        assert!(
            text(annotations, "description").contains("{{ $labels.namespace }}"),
            "{alert}: its description names the namespace"
        );
        assert_eq!(
            text(annotations, "runbook_url"),
            format!("docs/operations.md#{}", alert.to_lowercase()),
            "{alert}"
        );
        assert!(
            runbooks.lines().any(|line| line == format!("### {alert}")),
            "{alert}: docs/operations.md has no section ### {alert}"
        );
        for selector in text(rule, "expr").split('{').skip(1) {
            let selector = selector.split('}').next().unwrap();
            assert!(
                selector.contains(&format!("namespace=\"{NAMESPACE}\"")),
                "{alert}: the selector {{{selector}}} does not name the release's namespace"
            );
        }
    }
}

#[tokio::test]
async fn no_prometheus_rule_unless_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    let rendering = render_unvalidated(
        &[],
        &[&format!("secrets.apiKeys.portal={API_KEY}")],
        dir.path(),
    )
    .await;
    assert!(rendering.all("PrometheusRule").is_empty());
}

#[tokio::test]
async fn the_rules_follow_the_namespace_the_objectives_and_the_checkpoint_interval() {
    let dir = tempfile::tempdir().unwrap();
    let mut command = template_command(
        &[],
        &[
            &format!("secrets.apiKeys.portal={API_KEY}"),
            "alerts.prometheusRule.enabled=true",
            "alerts.backlogAgeSeconds=1800",
            "config.worker.checkpoint_interval_ms=2000",
            "config.store.status_retention_s=86400",
        ],
        dir.path(),
    );
    command.args([
        "--namespace",
        "fleet-b",
        "--show-only",
        "templates/prometheusrule.yaml",
    ]);
    let yaml = succeed("helm template (namespace fleet-b)", command, dir.path()).await;
    assert!(!yaml.contains("namespace=\"skyport\""), "{yaml}");
    let words = yaml.split_whitespace().collect::<Vec<_>>().join(" ");
    for expected in [
        "skyport_consumer_oldest_event_age_seconds{namespace=\"fleet-b\"}) > 1800 ",
        // Five intervals of 2 s.
        "skyport_checkpoint_age_seconds{namespace=\"fleet-b\"} > 10 ",
        // A day and the hour of slack.
        "kind=\"status\"} > 90000 ",
    ] {
        assert!(words.contains(expected), "no {expected:?} in\n{yaml}");
    }
}

/// promtool, run in `dir` with `args`; fails the test with its output unless it succeeds.
async fn run_promtool(args: &[&str], dir: &Path) -> String {
    let mut command = Command::new(promtool());
    command.args(args).current_dir(workspace());
    succeed(&format!("promtool {}", args.join(" ")), command, dir).await
}

#[tokio::test]
async fn promtool_accepts_the_rules_file() {
    let dir = tempfile::tempdir().unwrap();
    let out = run_promtool(&["check", "rules", RULES_FILE], dir.path()).await;
    println!("{out}");
    assert!(out.contains("SUCCESS"), "{out}");
}

#[tokio::test]
async fn each_alert_fires_on_its_symptom_and_stays_quiet_on_healthy_series() {
    let dir = tempfile::tempdir().unwrap();
    let out = run_promtool(&["test", "rules", UNIT_TESTS], dir.path()).await;
    println!("{out}");
    assert!(out.contains("SUCCESS"), "{out}");

    // Every alert of the rules file is tested both ways.
    let mut convert = python();
    convert
        .arg("-c")
        .arg("import json, sys, yaml\nprint(json.dumps([yaml.safe_load(open(f)) for f in sys.argv[1:]]))")
        .arg(workspace().join(RULES_FILE))
        .arg(workspace().join(UNIT_TESTS));
    let files: Value =
        serde_json::from_str(&succeed("PyYAML to JSON", convert, dir.path()).await).unwrap();
    let alerts: BTreeSet<&str> = rules_of(&files[0]["groups"])
        .into_iter()
        .map(|rule| text(rule, "alert"))
        .collect();
    let (mut fired, mut quiet) = (BTreeSet::new(), BTreeSet::new());
    for test in files[1]["tests"].as_array().unwrap() {
        for case in test["alert_rule_test"].as_array().unwrap() {
            let alert = text(case, "alertname");
            let expected = case["exp_alerts"].as_array().map_or(0, Vec::len);
            if expected == 0 {
                quiet.insert(alert);
            } else {
                fired.insert(alert);
                for one in case["exp_alerts"].as_array().unwrap() {
                    for key in ["summary", "description", "runbook_url"] {
                        assert!(
                            one["exp_annotations"].get(key).is_some(),
                            "{alert}: the test does not assert its {key}"
                        );
                    }
                }
            }
        }
    }
    assert_eq!(fired, alerts, "alerts tested firing");
    assert_eq!(quiet, alerts, "alerts tested quiet");
}
