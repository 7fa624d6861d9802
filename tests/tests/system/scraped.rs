//! Every series selector of the operator's kit — the alert rules
//! (`docs/monitoring/skyport-alerts.rules.yaml`), the Grafana dashboard
//! (`helm/skyport/dashboards/skyport.json`) and KEDA's triggers (rendered
//! from the chart) — matches a series that a real Prometheus (Debian's)
//! scraped from a running all-in-one under load, with `namespace` and `pod`
//! added by relabelling as a Kubernetes scrape adds them. Two all-in-ones
//! are scraped: one with status on the Cosmos SDK's emulator, so its request
//! units and change feed are scraped, which takes the load (callbacks go to
//! a receiver that refuses them for the first seconds, so some are
//! retried); and one on the embedded store, whose retention sweeper exports
//! its own series. The series that only a fault makes are listed, each with
//! why.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use secrecy::SecretString;
use serde_json::Value;
use skyport_runtime::config::Millis;
use skyport_tests::helm::{azure_values, python, render_unvalidated, succeed};
use skyport_tests::prometheus::{Prometheus, Target, selectors};
use skyport_tests::webhooks::{Behaviour, Receiver, post_with_callbacks};
use skyport_tests::{TestApp, eventually, test_settings, workspace};
use tokio::time::Instant;

/// The namespace and pods the scraped series carry, as the chart's
/// all-in-one pods in namespace `skyport` would.
const NAMESPACE: &str = "skyport";
const PODS: [&str; 2] = ["skyport-0", "skyport-1"];

/// Series that only a fault makes, so a healthy run under load lacks them:
/// the metric name, and why.
const ABSENT_WHEN_HEALTHY: [(&str, &str); 1] = [(
    "skyport_consumer_rewinds_total",
    "its first series comes with the first event handed back to the stream (a nack)",
)];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_selector_of_the_rules_the_dashboard_and_keda_matches_a_scraped_series() {
    let dir = tempfile::tempdir().unwrap();
    let wanted = wanted_selectors(dir.path()).await;
    assert!(wanted.len() > 20, "too few selectors found: {wanted:?}");

    let receiver = Receiver::start(
        IpAddr::V4(Ipv4Addr::LOCALHOST),
        Behaviour::UnavailableUntil(std::time::Instant::now() + Duration::from_secs(3)),
    )
    .await;
    let mut settings = test_settings(dir.path());
    settings.callbacks.secrets = vec![SecretString::from(
        "whsec_c2NyYXBlZC1zZXJpZXMtY2FsbGJhY2stc2VjcmV0LTA=",
    )];
    settings.callbacks.allow = vec!["127.0.0.0/8".to_owned()];
    settings.callbacks.backoff_initial_ms = Millis::new(200);
    settings.change_feed.poll_interval_ms = Millis::new(100);
    settings.change_feed.estimate_interval_ms = Millis::new(500);
    let app = TestApp::spawn_on_cosmos(settings).await;
    let embedded_dir = tempfile::tempdir().unwrap();
    let embedded = TestApp::spawn(&embedded_dir).await;
    let addresses = [&app, &embedded].map(|each| each.app.gateway_addr.to_string());
    let targets: Vec<Target<'_>> = addresses
        .iter()
        .zip(PODS)
        .map(|(address, pod)| Target {
            address,
            namespace: NAMESPACE,
            pod,
        })
        .collect();
    let prometheus = Prometheus::scraping(&targets, dir.path()).await;

    let urls = post_with_callbacks(&app.client, 300, None, |n| {
        receiver.url("127.0.0.1", &format!("d{n}"))
    })
    .await;
    app.client
        .wait_for_terminal(&urls, Duration::from_secs(120))
        .await;
    let refused = app.client.post_raw("application/json", "{not json").await;
    assert_eq!(refused.status(), 400);
    eventually(
        "every callback acknowledged",
        Duration::from_secs(60),
        || async {
            let acknowledged = receiver
                .received()
                .iter()
                .filter(|r| r.acknowledged)
                .count();
            (acknowledged >= urls.len()).then_some(())
        },
    )
    .await;
    // Three scrapes after the load: every series the load made is stored.
    let scrapes = format!("count_over_time(up{{namespace=\"{NAMESPACE}\"}}[1m])");
    let since = Instant::now();
    eventually(
        "three scrapes after the load",
        Duration::from_secs(30),
        || async {
            let ok = since.elapsed() > Duration::from_secs(3)
                && !prometheus.query(&scrapes).await.is_empty();
            ok.then_some(())
        },
    )
    .await;

    let mut unmatched = BTreeSet::new();
    for selector in &wanted {
        if prometheus.series(selector).await.is_empty() {
            unmatched.insert(selector.clone());
        }
    }
    let allowed: BTreeSet<&str> = ABSENT_WHEN_HEALTHY.iter().map(|(name, _)| *name).collect();
    let wrong: Vec<&String> = unmatched
        .iter()
        .filter(|selector| !allowed.contains(metric_name(selector)))
        .collect();
    assert!(
        wrong.is_empty(),
        "{} of {} selectors match no scraped series:\n{}",
        wrong.len(),
        wanted.len(),
        wrong
            .iter()
            .map(|s| format!("  {s}"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    app.app.stop().await.unwrap();
    embedded.app.stop().await.unwrap();
}

/// The metric name of a selector.
fn metric_name(selector: &str) -> &str {
    selector.split('{').next().unwrap_or(selector)
}

/// The selectors of the rules, the dashboard and KEDA's triggers, with the
/// dashboard's variables set as a user who picks every pod of the
/// namespace would.
async fn wanted_selectors(dir: &std::path::Path) -> BTreeSet<String> {
    let mut expressions = rule_expressions(dir).await;
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(workspace().join("helm/skyport/dashboards/skyport.json")).unwrap(),
    )
    .unwrap();
    collect_queries(&dashboard, &mut expressions);
    let keda = render_unvalidated(
        &[&azure_values()],
        &[
            "worker.keda.enabled=true",
            "worker.keda.prometheus.serverAddress=http://prometheus:9090",
            "worker.keda.partitions=8",
        ],
        dir,
    )
    .await;
    for trigger in keda.get("ScaledObject", "skyport-worker")["spec"]["triggers"]
        .as_array()
        .unwrap()
    {
        if let Some(query) = trigger["metadata"]["query"].as_str() {
            expressions.push(query.to_owned());
        }
    }
    expressions
        .iter()
        .flat_map(|expression| selectors(&with_variables(expression)))
        .collect()
}

/// The `expr` of every rule in the plain rules file.
async fn rule_expressions(dir: &std::path::Path) -> Vec<String> {
    let mut convert = python();
    convert
        .arg("-c")
        .arg(
            "import json, sys, yaml\n\
             rules = yaml.safe_load(open(sys.argv[1]))\n\
             json.dump([r['expr'] for g in rules['groups'] for r in g['rules']], sys.stdout)\n",
        )
        .arg(workspace().join("docs/monitoring/skyport-alerts.rules.yaml"));
    let json = succeed("PyYAML: the rules' expressions", convert, dir).await;
    let expressions: Vec<String> = serde_json::from_str(&json).unwrap();
    assert!(!expressions.is_empty(), "no rule in the rules file");
    expressions
}

/// Every `expr` and templating `query` in the dashboard.
fn collect_queries(value: &Value, into: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, item) in map {
                match (key.as_str(), item) {
                    ("expr", Value::String(expression)) => into.push(expression.clone()),
                    ("query", Value::String(query)) if query.contains("skyport_") => {
                        into.push(query.clone());
                    }
                    ("query", Value::Object(query)) => {
                        if let Some(Value::String(text)) = query.get("query") {
                            into.push(text.clone());
                        }
                    }
                    _ => collect_queries(item, into),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|item| collect_queries(item, into)),
        _ => {}
    }
}

/// `expression` with the dashboard's variables set: the namespace, every
/// pod, and Grafana's intervals.
fn with_variables(expression: &str) -> String {
    let mut text = expression.to_owned();
    for (variable, value) in [
        ("namespace", NAMESPACE),
        ("pod", ".*"),
        ("__rate_interval", "1m"),
        ("__interval", "1m"),
        ("__range", "5m"),
    ] {
        for form in [
            format!("${{{variable}:regex}}"),
            format!("${{{variable}:pipe}}"),
            format!("${{{variable}}}"),
            format!("${variable}"),
        ] {
            text = text.replace(&form, value);
        }
    }
    text
}
