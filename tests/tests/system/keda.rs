//! The chart's KEDA `ScaledObject` (`worker.keda`): rendered over the Azure
//! and the Kafka examples it scales the worker workload on the Prometheus
//! triggers (demand and backlog age, every selector in the release's
//! namespace) and, on Kafka, on the consumer group's lag per topic; it
//! validates against KEDA's published CRD; the worker leaves its replicas to
//! it; and the combinations that cannot work are refused, naming the values.

#![allow(clippy::unwrap_used)]

use serde_json::Value;
use skyport_tests::crds;
use skyport_tests::helm::*;

const PROMETHEUS: &str = "http://prometheus-operated.monitoring:9090";

/// The values that turn KEDA on with `partitions` and a Prometheus server.
fn keda_on(partitions: u32) -> Vec<String> {
    vec![
        "worker.keda.enabled=true".to_owned(),
        format!("worker.keda.prometheus.serverAddress={PROMETHEUS}"),
        format!("worker.keda.partitions={partitions}"),
        format!("worker.keda.maxReplicas={partitions}"),
    ]
}

fn refs(set: &[String]) -> Vec<&str> {
    set.iter().map(String::as_str).collect()
}

/// The trigger of `scaled` named `name`.
fn trigger<'a>(scaled: &'a Value, name: &str) -> &'a Value {
    scaled["spec"]["triggers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == name)
        .unwrap_or_else(|| panic!("no trigger {name} in {scaled:#}"))
}

#[tokio::test]
async fn keda_scales_the_azure_workers_on_demand_and_backlog_age() {
    let work = tempfile::tempdir().unwrap();
    let mut set = keda_on(16);
    set.extend([
        "worker.keda.workflowsPerWorker=2400".to_owned(),
        "worker.keda.drainSeconds=900".to_owned(),
        "worker.keda.prometheus.azureWorkloadIdentity.enabled=true".to_owned(),
        "worker.keda.prometheus.azureWorkloadIdentity.identityId=0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0"
            .to_owned(),
    ]);
    let rendering = render(&[&azure_values()], &refs(&set), work.path()).await;
    let worker = rendering.get("StatefulSet", "skyport-worker");
    assert!(
        worker["spec"].get("replicas").is_none(),
        "KEDA owns the replicas: {worker:#}"
    );
    assert!(
        rendering
            .all("HorizontalPodAutoscaler")
            .iter()
            .all(|hpa| name(hpa) != "skyport-worker")
    );
    let scaled = rendering.get("ScaledObject", "skyport-worker");
    assert_eq!(scaled["spec"]["scaleTargetRef"]["kind"], "StatefulSet");
    assert_eq!(scaled["spec"]["scaleTargetRef"]["name"], "skyport-worker");
    assert_eq!(scaled["spec"]["maxReplicaCount"], 16);
    let behavior = &scaled["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"];
    // 5 s checkpoints + 30 s grace: one worker leaves at a time, that long apart.
    assert_eq!(behavior["scaleDown"]["stabilizationWindowSeconds"], 300);
    assert_eq!(behavior["scaleDown"]["policies"][0]["periodSeconds"], 35);

    let demand = trigger(scaled, "demand");
    assert_eq!(demand["metricType"], "AverageValue");
    assert_eq!(demand["metadata"]["threshold"], "2400");
    assert_eq!(demand["metadata"]["serverAddress"], PROMETHEUS);
    let query = demand["metadata"]["query"].as_str().unwrap();
    for part in [
        r#"sum(rate(skyport_deliveries_accepted_total{namespace="skyport"}[2m]))"#,
        r#"(sum(skyport_consumer_lag_events{namespace="skyport"}) or vector(0)) / 900"#,
    ] {
        assert!(query.contains(part), "{part} in {query}");
    }
    let age = trigger(scaled, "backlog-age");
    assert_eq!(age["metricType"], "Value");
    assert_eq!(age["metadata"]["threshold"], "900");
    assert_eq!(
        age["metadata"]["query"],
        r#"max(skyport_consumer_oldest_event_age_seconds{namespace="skyport"}) or vector(0)"#
    );
    let authentication = rendering.get("TriggerAuthentication", "skyport-worker-prometheus");
    assert_eq!(
        authentication["spec"]["podIdentity"]["provider"],
        "azure-workload"
    );
    for t in [demand, age] {
        assert_eq!(t["authenticationRef"]["name"], "skyport-worker-prometheus");
    }
    crds::validate(&[scaled, authentication], work.path()).await;
}

#[tokio::test]
async fn on_kafka_keda_also_reads_the_consumer_groups_lag() {
    let work = tempfile::tempdir().unwrap();
    let mut set = keda_on(6);
    set.extend([
        "worker.keda.kafka.enabled=true".to_owned(),
        "worker.keda.kafka.authenticationRef=eventhubs-kafka".to_owned(),
        "worker.keda.workflowsPerWorker=1000".to_owned(),
        "worker.keda.prometheus.extraMatchers=pod=~\"skyport-.*\"".to_owned(),
    ]);
    let rendering = render(&[&kafka_values()], &refs(&set), work.path()).await;
    let scaled = rendering.get("ScaledObject", "skyport-worker");
    assert_eq!(scaled["spec"]["scaleTargetRef"]["kind"], "Deployment");
    let query = trigger(scaled, "backlog-age")["metadata"]["query"]
        .as_str()
        .unwrap();
    assert!(
        query.contains(r#"{namespace="skyport",pod=~"skyport-.*"}"#),
        "{query}"
    );
    let kafka: Vec<&Value> = scaled["spec"]["triggers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["type"] == "kafka")
        .collect();
    assert_eq!(kafka.len(), 1, "one topic: {scaled:#}");
    let metadata = &kafka[0]["metadata"];
    assert_eq!(
        metadata["bootstrapServers"],
        "skyport-prod.servicebus.windows.net:9093"
    );
    assert_eq!(metadata["consumerGroup"], "skyport-worker");
    assert_eq!(metadata["topic"], "deliveries");
    // 1,000 a second a worker over the 600 s drain goal.
    assert_eq!(metadata["lagThreshold"], "600000");
    assert_eq!(
        (&metadata["tls"], &metadata["sasl"]),
        (&Value::from("enable"), &Value::from("plaintext"))
    );
    assert_eq!(kafka[0]["authenticationRef"]["name"], "eventhubs-kafka");
    crds::validate(&[scaled], work.path()).await;
}

#[tokio::test]
async fn keda_refuses_what_cannot_work_naming_the_values() {
    let work = tempfile::tempdir().unwrap();
    let dir = work.path();
    let azure = azure_values();
    let on = keda_on(8);
    let cases: [(&[&str], &str); 6] = [
        (
            &["worker.autoscaling.enabled=true"],
            "worker.keda.enabled and worker.autoscaling.enabled",
        ),
        (
            &["worker.keda.maxReplicas=9"],
            "worker.keda.maxReplicas (9) is more than worker.keda.partitions (8)",
        ),
        (
            &["worker.keda.minReplicas=9", "worker.keda.partitions=9"],
            "worker.keda.minReplicas (9) is more than worker.keda.maxReplicas (8)",
        ),
        (
            &["worker.keda.scaleDownStabilizationSeconds=35"],
            "worker.keda.scaleDownStabilizationSeconds (35 s) must be longer than config.worker.checkpoint_interval_ms (5000 ms) + config.worker.shutdown_grace_period_ms (30000 ms)",
        ),
        (
            &["worker.keda.kafka.enabled=true"],
            "worker.keda.kafka.enabled reads a Kafka consumer group's lag; profile azure",
        ),
        (
            &["worker.keda.prometheus.serverAddress="],
            "worker.keda.prometheus.enabled needs worker.keda.prometheus.serverAddress",
        ),
    ];
    for (extra, expected) in cases {
        let mut set = refs(&on);
        set.extend(extra);
        let printed = render_fails(&[&azure], &set, dir).await;
        assert!(
            printed.contains(expected),
            "{extra:?}: {expected} in {printed}"
        );
    }
    let api_key = format!("secrets.apiKeys.portal={PORTAL_KEY}");
    let printed = render_fails(&[], &[&api_key, "worker.keda.enabled=true"], dir).await;
    assert!(
        printed.contains("profile embedded runs one all-in-one pod"),
        "{printed}"
    );
}
