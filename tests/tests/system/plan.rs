//! `skyport plan`'s Helm values, layered over `helm/skyport/ci/azure-values.yaml`
//! (without its throughput groups) as the values' header says: the chart
//! renders them (`helm template`, `kubernetes-validate --strict`), the
//! workloads and the autoscaler carry the plan's replicas, and the rendered
//! `skyport.toml` loads in the binaries' own loader with the plan's hubs,
//! windows and throughput groups. With KEDA and the alerts turned on, the
//! `ScaledObject`'s demand threshold is the plan's workflows per worker and
//! the backlog alert fires past the plan's drain goal.

#![allow(clippy::unwrap_used)]

use skyport::plan::{self, Costs, Limits, Target};
use skyport_runtime::config::{GroupScope, Priority, Work};
use skyport_tests::helm::*;

#[tokio::test]
async fn the_plans_helm_values_render_over_the_azure_example_and_load() {
    let work = tempfile::tempdir().unwrap();
    let target = Target::new(10_000.0, 100_000.0);
    let costs = Costs {
        gateway_cpu_us_per_request: 50.0,
        worker_cpu_us_per_workflow: 216.0,
        workflow_overhead_ms: 8.0,
        gateway_rss_mib: Some(49.0),
        worker_rss_mib: Some(300.0),
        cosmos_ru: None,
    };
    let deployment = plan::plan(&target, &costs, &Limits::event_hubs()).unwrap();
    let values = work.path().join("plan-values.yaml");
    std::fs::write(
        &values,
        plan::helm_values(
            &target,
            &deployment,
            "skyport plan --sustained 10000 --spike 100000",
        ),
    )
    .unwrap();
    // As the values' header says, the example's own throughput groups go
    // first: Helm merges maps, and a work may be in one group only.
    let base = work.path().join("azure-values.yaml");
    let mut strip = python();
    strip
        .arg("-c")
        .arg(
            "import sys, yaml\n\
             values = yaml.safe_load(open(sys.argv[1]))\n\
             del values['config']['cosmos']['throughput_groups']\n\
             yaml.safe_dump(values, open(sys.argv[2], 'w'))\n",
        )
        .arg(azure_values())
        .arg(&base);
    succeed("PyYAML: the example without its groups", strip, work.path()).await;
    let rendering = render(&[&base, &values], &[], work.path()).await;

    let worker = rendering.get("StatefulSet", "skyport-worker");
    assert_eq!(worker["spec"]["replicas"], deployment.workers.replicas);
    let hpa = rendering.get("HorizontalPodAutoscaler", "skyport-gateway");
    assert_eq!(hpa["spec"]["minReplicas"], deployment.gateways.min);
    assert_eq!(hpa["spec"]["maxReplicas"], deployment.gateways.max);
    // 300 MiB measured: 640Mi requested, twice that the limit.
    let resources = &container(worker)["resources"];
    assert_eq!(resources["requests"]["memory"], "640Mi");
    assert_eq!(resources["limits"]["memory"], "1280Mi");
    assert_eq!(resources["requests"]["cpu"], "1");

    let required = secret_refs(&rendering, "skyport-secrets", false);
    let settings = load_settings(&rendering, worker, &required, work.path());
    assert_eq!(settings.eventhubs.hubs, deployment.stream.names);
    assert_eq!(settings.eventhubs.hubs.len(), 4);
    assert_eq!(settings.worker.max_in_flight, 30);
    assert_eq!(settings.worker.read_ahead, 512);
    let groups = &settings.cosmos.throughput_groups;
    assert_eq!(
        groups.keys().collect::<Vec<_>>(),
        ["clients", "worker"],
        "{groups:#?}"
    );
    let workers = &groups["worker"];
    assert_eq!(workers.work, [Work::StatusWrites, Work::DeadLetters]);
    assert_eq!(workers.target_fraction, Some(0.80));
    assert_eq!(workers.effective_priority(), Priority::Low);
    assert_eq!(workers.scope, GroupScope::Global);
    let clients = &groups["clients"];
    assert_eq!(clients.work, [Work::StatusReads, Work::Reservations]);
    assert_eq!(clients.target_fraction, Some(0.10));
    assert_eq!(clients.target_ru_per_s, None);
    assert_eq!(clients.effective_priority(), Priority::High);

    let kit = render(
        &[&base, &values],
        &[
            "worker.keda.enabled=true",
            "worker.keda.prometheus.serverAddress=http://prometheus-operated.monitoring:9090",
            "alerts.prometheusRule.enabled=true",
        ],
        work.path(),
    )
    .await;
    let workers = &deployment.workers;
    let per_worker = (workers.capacity.workflows_per_s / f64::from(workers.replicas)).floor();
    let scaled = kit.get("ScaledObject", "skyport-worker");
    let demand = scaled["spec"]["triggers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|trigger| trigger["name"] == "demand")
        .unwrap();
    assert_eq!(demand["metadata"]["threshold"], per_worker.to_string());
    assert_eq!(
        scaled["spec"]["maxReplicaCount"],
        deployment.stream.partitions
    );
    let rules = kit.get("PrometheusRule", "skyport");
    let backlog = rules["spec"]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|group| group["rules"].as_array().unwrap())
        .find(|rule| rule["alert"] == "SkyportBacklogOld")
        .unwrap();
    assert!(
        backlog["expr"].as_str().unwrap().ends_with("> 600"),
        "{backlog}"
    );
}
