//! The Helm values that realise a plan: [`helm_values`], written as YAML by
//! hand.

use std::fmt::{Display, Write as _};

use serde_json::Value;

use super::format::thousands;
use super::limits::{GATEWAY_UTILIZATION, WINDOW_MARGIN, WORKER_HEADROOM};
use super::model::{StreamKind, Target};
use super::sizing::{
    CosmosPlan, Deployment, GatewayPlan, Namespace, StreamPlan, Tier, WorkerPlan, whole,
};

/// YAML written by hand: nested maps, scalars and flow lists.
struct Yaml {
    /// The text so far.
    out: String,
    /// The maps open.
    depth: usize,
}

impl Yaml {
    /// Two spaces a level of nesting.
    fn indent(&mut self) {
        for _ in 0..self.depth {
            self.out.push_str("  ");
        }
    }

    /// `# text` at the current depth.
    fn comment(&mut self, text: &str) {
        self.indent();
        let _ = writeln!(self.out, "# {text}");
    }

    /// Opens map `key`; [`Yaml::close`] ends it.
    fn open(&mut self, key: &str) {
        self.indent();
        let _ = writeln!(self.out, "{key}:");
        self.depth += 1;
    }

    /// Ends the map [`Yaml::open`] opened last.
    fn close(&mut self) {
        self.depth -= 1;
    }

    /// `key: value`, the value written as it displays (numbers, booleans).
    fn plain(&mut self, key: &str, value: impl Display) {
        self.indent();
        let _ = writeln!(self.out, "{key}: {value}");
    }

    /// `key: "value"`, quoted as JSON quotes it (a YAML double-quoted scalar).
    fn text(&mut self, key: &str, value: &str) {
        self.plain(key, Value::from(value));
    }

    /// `key: ["a", "b"]`.
    fn list(&mut self, key: &str, items: &[String]) {
        self.plain(key, Value::from(items.to_vec()));
    }
}

/// A CPU quantity as Kubernetes writes it: whole cores, else millicores.
pub(super) fn cpu_quantity(cores: f64) -> String {
    let millis = (cores * 1_000.0).round();
    if millis % 1_000.0 == 0.0 {
        format!("{}", millis / 1_000.0)
    } else {
        format!("{millis}m")
    }
}

/// Helm values realising `deployment`: the stream's hubs or topics, the
/// worker's windows, the throughput groups, the gateways' autoscaler and the
/// workers' replicas. Layered over a profile's values (`-f` after them).
pub fn helm_values(target: &Target, deployment: &Deployment, command: &str) -> String {
    let Deployment {
        stream,
        namespace,
        gateways,
        workers,
        cosmos,
        ..
    } = deployment;
    let mut y = Yaml {
        out: String::new(),
        depth: 0,
    };
    header(&mut y, target, stream, namespace, cosmos, command);
    config(&mut y, target, stream, workers, cosmos);
    gateway(&mut y, target, gateways);
    worker(&mut y, target, stream, workers);
    alerts(&mut y, target);
    y.out
}

/// The workflows per second one worker completes: the plan's capacity
/// shared among its replicas, whole. KEDA's demand trigger divides the
/// demand by it.
pub(super) fn workflows_per_worker(workers: &WorkerPlan) -> u32 {
    whole((workers.capacity.workflows_per_s / f64::from(workers.replicas)).floor()).max(1)
}

/// The fewest workers for the sustained rate with the plan's headroom:
/// KEDA's floor, from which it scales for a spike's backlog.
fn sustained_replicas(target: &Target, workers: &WorkerPlan) -> u32 {
    whole(target.sustained_per_s * WORKER_HEADROOM / f64::from(workflows_per_worker(workers)))
        .clamp(1, workers.replicas)
}

/// The values' opening comments: the command that wrote them, the target,
/// how to layer them, and what to create first.
fn header(
    y: &mut Yaml,
    target: &Target,
    stream: &StreamPlan,
    namespace: &Namespace,
    cosmos: &CosmosPlan,
    command: &str,
) {
    y.comment(&format!("Written by `{command}`."));
    y.comment(&format!(
        "{}/s sustained, spikes of {}/s for {} s gone within {} min: docs/capacity.md.",
        thousands(target.sustained_per_s),
        thousands(target.spike_per_s),
        target.spike_seconds,
        target.drain_minutes
    ));
    y.comment("Layer it over a profile's values, after them:");
    y.comment(
        "  helm install skyport helm/skyport -f helm/skyport/ci/azure-values.yaml -f THIS_FILE",
    );
    y.comment("Helm merges maps: delete config.cosmos.throughput_groups from the base file first");
    y.comment("(ci/azure-values.yaml's bulk and clients), or its groups merge into these.");
    let tier = match namespace.tier {
        Tier::Standard { max_tus } => format!("Standard, auto-inflate up to {max_tus} TUs"),
        Tier::Premium { pus, .. } => format!("Premium, {pus} PUs"),
        Tier::Dedicated { .. } => "a Dedicated cluster".to_owned(),
    };
    y.comment(&format!(
        "Create the {} {}s of {} partitions first (namespace: {tier}), and the status container at",
        stream.hubs,
        target.stream.shard(),
        stream.partitions_per_hub
    ));
    y.comment(&format!(
        "autoscale max {} RU/s ({} physical partitions).",
        thousands(cosmos.autoscale_max_ru_per_s),
        cosmos.physical_partitions()
    ));
}

/// `config`: the stream's hubs or topics, the worker's windows and the
/// status container's throughput groups.
fn config(
    y: &mut Yaml,
    target: &Target,
    stream: &StreamPlan,
    workers: &WorkerPlan,
    cosmos: &CosmosPlan,
) {
    y.open("config");
    match target.stream {
        StreamKind::EventHubs => y.open("eventhubs"),
        StreamKind::Kafka => y.open("kafka"),
    }
    y.comment(&format!(
        "{} × {} partitions: the spike at {}/s a partition.",
        stream.hubs,
        stream.partitions_per_hub,
        thousands(target.spike_per_s / f64::from(stream.partitions))
    ));
    match target.stream {
        StreamKind::EventHubs => y.list("hubs", &stream.names),
        StreamKind::Kafka => y.list("topics", &stream.names),
    }
    y.close();
    y.open("worker");
    y.comment(&format!(
        "Little's law: {:.0}/s a partition × {:.1} ms × {WINDOW_MARGIN}.",
        workers.partition_rate_per_s,
        workers.capacity.workflow_latency_s * 1_000.0
    ));
    y.plain("max_in_flight", workers.max_in_flight);
    y.plain("read_ahead", workers.read_ahead);
    y.close();
    y.open("cosmos");
    y.open("throughput_groups");
    for (name, work, fraction, priority) in [
        (
            "worker",
            ["status_writes", "dead_letters"],
            cosmos.worker_fraction,
            "low",
        ),
        (
            "clients",
            ["status_reads", "reservations"],
            cosmos.clients_fraction,
            "high",
        ),
    ] {
        y.open(name);
        y.text("container", "status");
        y.list("work", &work.map(str::to_owned));
        y.plain("target_fraction", format!("{fraction:.2}"));
        y.text("priority", priority);
        y.text("scope", "global");
        y.close();
    }
    y.close();
    y.close();
    y.close();
}

/// `gateway`: the autoscaler and the pods' resources.
fn gateway(y: &mut Yaml, target: &Target, gateways: &GatewayPlan) {
    y.open("gateway");
    y.open("autoscaling");
    y.comment(&format!(
        "{:.2} cores at the sustained rate, {:.2} at the spike, each pod at {} %.",
        gateways.cores_sustained,
        gateways.cores_spike,
        GATEWAY_UTILIZATION * 100.0
    ));
    y.plain("enabled", true);
    y.plain("minReplicas", gateways.min);
    y.plain("maxReplicas", gateways.max);
    y.plain(
        "targetCPUUtilizationPercentage",
        format!("{:.0}", GATEWAY_UTILIZATION * 100.0),
    );
    y.close();
    resources(y, target.cores_per_gateway, gateways.memory_mib);
    y.close();
}

/// `worker`: the replicas, KEDA's numbers and the pods' resources.
fn worker(y: &mut Yaml, target: &Target, stream: &StreamPlan, workers: &WorkerPlan) {
    y.open("worker");
    y.comment(&format!(
        "{}/s in all, bound by {}.",
        thousands(workers.capacity.workflows_per_s),
        workers.capacity.bound
    ));
    y.plain("replicaCount", workers.replicas);
    y.open("autoscaling");
    y.plain("enabled", false);
    y.close();
    y.open("keda");
    y.comment("With KEDA installed: keda.enabled true, prometheus.serverAddress set (docs/operations.md).");
    y.comment(&format!(
        "The sustained rate × {WORKER_HEADROOM} at {} a worker; at most a worker a partition.",
        workflows_per_worker(workers)
    ));
    y.plain("minReplicas", sustained_replicas(target, workers));
    y.plain("maxReplicas", stream.partitions);
    y.plain("partitions", stream.partitions);
    y.plain("workflowsPerWorker", workflows_per_worker(workers));
    y.plain("drainSeconds", drain_seconds(target));
    y.close();
    resources(y, target.cores_per_worker, workers.memory_mib);
    y.close();
}

/// The drain goal, in whole seconds.
fn drain_seconds(target: &Target) -> u32 {
    whole(target.drain_minutes * 60.0)
}

/// `alerts`: a backlog older than the drain goal pages.
fn alerts(y: &mut Yaml, target: &Target) {
    y.open("alerts");
    y.plain("backlogAgeSeconds", drain_seconds(target));
    y.close();
}

/// `resources`: the CPU the plan counted on as the request (the HPA's 100 %),
/// memory requested and limited at twice it.
fn resources(y: &mut Yaml, cores: f64, memory_mib: u32) {
    y.open("resources");
    y.open("requests");
    y.text("cpu", &cpu_quantity(cores));
    y.text("memory", &format!("{memory_mib}Mi"));
    y.close();
    y.open("limits");
    y.text("memory", &format!("{}Mi", memory_mib * 2));
    y.close();
    y.close();
}
