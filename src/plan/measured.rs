//! The costs from a benchmark run (`BENCHMARKS.json`) or the flags:
//! [`measured_costs`], each figure with its source.

use std::path::Path;

use serde_json::Value;

use super::error::PlanError;
use super::format::thousands;
use super::limits::BENCH_SERVICE_LATENCY_MS;
use super::model::{Costs, RuPerDelivery, STEPS, StreamKind};

/// Where `cargo bench --bench skyport` writes its results, from the
/// repository's root: the default of `--benchmarks`.
pub const BENCHMARKS: &str = "benches/BENCHMARKS.json";

/// A cost, and where it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Sourced {
    /// The figure.
    pub value: f64,
    /// Where it came from, for the output.
    pub source: String,
}

/// [`Costs`] with the source of each figure.
#[derive(Debug, Clone, PartialEq)]
pub struct MeasuredCosts {
    /// Gateway CPU µs per request.
    pub gateway_cpu: Sourced,
    /// Worker CPU µs per workflow.
    pub worker_cpu: Sourced,
    /// Workflow overhead ms.
    pub overhead: Sourced,
    /// Gateway RSS MiB.
    pub gateway_rss: Option<Sourced>,
    /// Worker RSS MiB.
    pub worker_rss: Option<Sourced>,
    /// Request units a delivery on Cosmos DB; `None`: modelled from `--ru-per-write`.
    pub cosmos_ru: Option<SourcedRu>,
}

/// Request units a delivery, and where they came from.
#[derive(Debug, Clone, PartialEq)]
pub struct SourcedRu {
    pub value: RuPerDelivery,
    pub source: String,
}

impl SourcedRu {
    /// The request units a delivery of `json`'s `cosmos_cost` run (a
    /// `BENCHMARKS.json`), when it has one.
    pub fn from_json(json: &Value) -> Option<Self> {
        let run = &json["cosmos_cost"];
        let mix = &run["with_callbacks"];
        let deliveries = mix["posted"]["statuses"]["202"].as_f64()?;
        if deliveries <= 0.0 {
            return None;
        }
        let units = mix["units"].as_array()?;
        let per_delivery = |kinds: &[&str]| {
            units
                .iter()
                .filter(|u| u["work"].as_str().is_some_and(|w| kinds.contains(&w)))
                .filter_map(|u| u["units"].as_f64())
                .sum::<f64>()
                / deliveries
        };
        let value = RuPerDelivery {
            status_writes: per_delivery(&["status_writes"]),
            reservations: per_delivery(&["reservations"]),
        };
        Some(Self {
            value,
            source: format!(
                "cosmos_cost: {} deliveries at {}/s on the emulator, each named, with a callback",
                thousands(deliveries),
                run["rate"]
            ),
        })
    }
}

impl MeasuredCosts {
    /// The figures alone.
    pub fn costs(&self) -> Costs {
        Costs {
            gateway_cpu_us_per_request: self.gateway_cpu.value,
            worker_cpu_us_per_workflow: self.worker_cpu.value,
            workflow_overhead_ms: self.overhead.value,
            gateway_rss_mib: self.gateway_rss.as_ref().map(|s| s.value),
            worker_rss_mib: self.worker_rss.as_ref().map(|s| s.value),
            cosmos_ru: self.cosmos_ru.as_ref().map(|s| s.value),
        }
    }
}

/// The figures a benchmark run (`BENCHMARKS.json`) holds for `stream`: its
/// fleet run with one worker when there is one, else what the single-process
/// phases measured, each named.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BenchmarkFigures {
    /// Gateway CPU µs per request.
    pub gateway_cpu: Option<Sourced>,
    /// Worker CPU µs per workflow.
    pub worker_cpu: Option<Sourced>,
    /// Workflow overhead ms.
    pub overhead: Option<Sourced>,
    /// Gateway RSS MiB.
    pub gateway_rss: Option<Sourced>,
    /// Worker RSS MiB.
    pub worker_rss: Option<Sourced>,
    /// Request units a delivery on Cosmos DB.
    pub cosmos_ru: Option<SourcedRu>,
}

impl BenchmarkFigures {
    /// Reads them from `json` (a `BENCHMARKS.json`).
    pub fn from_json(json: &Value, stream: StreamKind) -> Self {
        let fleet_key = match stream {
            StreamKind::EventHubs => "fleet_eventhubs",
            StreamKind::Kafka => "fleet_kafka",
        };
        let fleet = json[fleet_key]["runs"]
            .as_array()
            .and_then(|runs| runs.iter().find(|run| run["workers"].as_u64() == Some(1)));
        let from_fleet = |key: &str| {
            let value = fleet?.get(key)?.as_f64()?;
            Some(Sourced {
                value,
                source: format!("{fleet_key}.runs[workers = 1].{key}"),
            })
        };
        let ingest = ingest_run(json);
        let end_to_end = match stream {
            StreamKind::Kafka if json["kafka"]["end_to_end"].is_object() => {
                ("kafka.end_to_end", &json["kafka"]["end_to_end"])
            }
            _ => ("end_to_end", &json["end_to_end"]),
        };
        Self {
            // Its CPU while it took the requests, when the run has it: over
            // the whole run it also spent what it costs idle while the
            // workers drained, which sizing by rate should not count.
            gateway_cpu: from_fleet("gateway_posting_cpu_us_per_request")
                .or_else(|| from_fleet("gateway_cpu_us_per_request"))
                .or_else(|| gateway_cpu_from_ingest(json)),
            worker_cpu: from_fleet("worker_cpu_us_per_workflow").or_else(|| {
                Some(Sourced {
                    value: end_to_end.1["cpu_us_per_workflow"].as_f64()?,
                    source: format!(
                        "{}.cpu_us_per_workflow (gateway and worker in one process: an upper bound)",
                        end_to_end.0
                    ),
                })
            }),
            overhead: from_fleet("workflow_overhead_ms")
                .or_else(|| overhead_from_time_to_terminal(json)),
            gateway_rss: from_fleet("gateway_rss_mib").or_else(|| {
                let run = ingest?;
                Some(Sourced {
                    value: run["peak_rss_mib"].as_f64()?,
                    source: format!("ingest at {} connections: peak_rss_mib", run["connections"]),
                })
            }),
            worker_rss: from_fleet("worker_rss_mib").or_else(|| {
                Some(Sourced {
                    value: end_to_end.1["peak_rss_mib"].as_f64()?,
                    source: format!("{}.peak_rss_mib (gateway included)", end_to_end.0),
                })
            }),
            cosmos_ru: SourcedRu::from_json(json),
        }
    }
}

/// A workflow's time beyond its calls, from the time-to-terminal run at the
/// lowest rate: its p50 less the calls the benchmark's services take.
pub(super) fn overhead_from_time_to_terminal(json: &Value) -> Option<Sourced> {
    let run = json["time_to_terminal"]
        .as_array()?
        .iter()
        .min_by_key(|run| run["rate"].as_u64().unwrap_or(u64::MAX))?;
    let p50 = run["terminal"]["p50_ms"].as_f64()?;
    Some(Sourced {
        value: (p50 - STEPS * BENCH_SERVICE_LATENCY_MS).max(0.0),
        source: format!(
            "time_to_terminal at {}/s: p50 {p50:.1} ms − {STEPS} calls × {BENCH_SERVICE_LATENCY_MS} ms",
            run["rate"]
        ),
    })
}

/// The ingest phase's run at the fewest connections, of those with a rate.
fn ingest_run(json: &Value) -> Option<&Value> {
    json["ingest"].as_array().and_then(|runs| {
        runs.iter()
            .filter(|run| run["skyport"]["requests_per_s"].as_f64().is_some())
            .min_by_key(|run| run["connections"].as_u64().unwrap_or(u64::MAX))
    })
}

/// A request's CPU at the gateway alone, from that run: the machine's cores
/// over its rate.
pub(super) fn gateway_cpu_from_ingest(json: &Value) -> Option<Sourced> {
    let run = ingest_run(json)?;
    let per_s = run["skyport"]["requests_per_s"].as_f64()?;
    let cores = json["machine"]["cores"].as_f64()?;
    Some(Sourced {
        value: cores * 1e6 / per_s,
        source: format!(
            "ingest at {} connections: {cores} cores ÷ {} requests/s (an upper bound: the load generator shared the cores)",
            run["connections"],
            thousands(per_s)
        ),
    })
}

/// The costs: the flags' where given, else `path`'s (a `BENCHMARKS.json`).
/// Request units are `path`'s unless `--ru-per-write` is given
/// (`ru_per_write_given`): then they are modelled from it.
///
/// # Errors
/// [`PlanError::Costs`] naming the file, what is wrong with it and the flags
/// to pass instead, when a CPU figure is neither given nor in the file.
pub fn measured_costs(
    path: &Path,
    stream: StreamKind,
    gateway_cpu_us: Option<f64>,
    worker_cpu_us: Option<f64>,
    workflow_overhead_ms: Option<f64>,
    ru_per_write_given: bool,
) -> Result<MeasuredCosts, PlanError> {
    const FLAGS: &str = "--gateway-cpu-us and --worker-cpu-us";
    let read = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot be read ({e})"))
        .and_then(|text| {
            serde_json::from_str::<Value>(&text).map_err(|e| format!("is not JSON ({e})"))
        });
    let figures = match &read {
        Ok(json) => BenchmarkFigures::from_json(json, stream),
        Err(_) => BenchmarkFigures::default(),
    };
    let flag = |value: Option<f64>, name: &str| {
        value.map(|value| Sourced {
            value,
            source: format!("--{name}"),
        })
    };
    let missing = |what: &str| PlanError::Costs {
        path: path.to_owned(),
        reason: match &read {
            Ok(_) => format!("holds no {what}"),
            Err(e) => e.clone(),
        },
        flags: FLAGS,
    };
    let gateway_cpu = flag(gateway_cpu_us, "gateway-cpu-us")
        .or(figures.gateway_cpu)
        .ok_or_else(|| missing("gateway CPU per request"))?;
    let worker_cpu = flag(worker_cpu_us, "worker-cpu-us")
        .or(figures.worker_cpu)
        .ok_or_else(|| missing("worker CPU per workflow"))?;
    let overhead = flag(workflow_overhead_ms, "workflow-overhead-ms")
        .or(figures.overhead)
        .unwrap_or_else(|| Sourced {
            value: 0.0,
            source: "not measured: 0 (pass --workflow-overhead-ms)".to_owned(),
        });
    Ok(MeasuredCosts {
        gateway_cpu,
        worker_cpu,
        overhead,
        gateway_rss: figures.gateway_rss,
        worker_rss: figures.worker_rss,
        cosmos_ru: figures.cosmos_ru.filter(|_| !ru_per_write_given),
    })
}
