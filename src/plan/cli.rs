//! The command line: `skyport plan`'s flags, [`main`] and its exit codes (64
//! on a bad flag or missing costs, 1 when the Helm values cannot be written).

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use skyport_runtime::config::EXIT_CONFIG;

use super::error::PlanError;
use super::helm::helm_values;
use super::limits::{Limits, PARTITION_EVENTS_PER_S, RU_PER_STATUS_WRITE};
use super::machine::{MachineCosts, plan_machine, render_machine};
use super::measured::{BENCHMARKS, measured_costs};
use super::model::{StreamKind, Target};
use super::report::render;
use super::sizing::plan;

/// `--stream`'s values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum StreamArg {
    #[value(name = "eventhubs")]
    EventHubs,
    #[value(name = "kafka")]
    Kafka,
    #[value(name = "embedded")]
    Embedded,
}

/// `skyport plan`'s flags.
#[derive(Debug, Parser)]
#[command(
    name = "skyport plan",
    bin_name = "skyport plan",
    about = "Sizes a Skyport deployment for a sustained rate and a spike: the stream's partitions and tier, gateways, workers and their windows, Cosmos DB; prints each figure with its rule and writes Helm values that realise it."
)]
struct Args {
    /// Requests a second, all day.
    #[arg(long, value_name = "PER_S", allow_negative_numbers = true)]
    sustained: f64,
    /// Requests a second at the top of a spike (all accepted).
    #[arg(long, value_name = "PER_S", allow_negative_numbers = true)]
    spike: f64,
    /// How long a spike lasts.
    #[arg(
        long,
        value_name = "S",
        default_value_t = 60.0,
        allow_negative_numbers = true
    )]
    spike_seconds: f64,
    /// Each service call's latency (5 calls a workflow).
    #[arg(
        long,
        value_name = "MS",
        default_value_t = 20.0,
        allow_negative_numbers = true
    )]
    service_latency_ms: f64,
    /// RU a status write costs in Cosmos DB, modelling what a delivery
    /// spends [default: what --benchmarks measured a delivery to spend;
    /// without that, 8 a write].
    #[arg(long, value_name = "RU", allow_negative_numbers = true)]
    ru_per_write: Option<f64>,
    /// A request body's bytes [default: the README's example, 230].
    #[arg(long, value_name = "BYTES", allow_negative_numbers = true)]
    request_bytes: Option<f64>,
    /// How long the stream keeps an event.
    #[arg(
        long,
        value_name = "H",
        default_value_t = 24.0,
        allow_negative_numbers = true
    )]
    retention_hours: f64,
    /// How long after a spike its backlog may last.
    #[arg(
        long,
        value_name = "MIN",
        default_value_t = 10.0,
        allow_negative_numbers = true
    )]
    drain_minutes: f64,
    /// How long settled status documents are kept (store.status_retention_s) [default: 7].
    #[arg(long, value_name = "DAYS", allow_negative_numbers = true)]
    status_retention_days: Option<f64>,
    /// The stream: a fleet on Event Hubs or Kafka with Cosmos DB, or one
    /// machine on the embedded stream and store (`embedded`: the flags of
    /// hubs, pods and Cosmos DB do not apply; --worker-cpu-us is then the
    /// whole process's per workflow).
    #[arg(long, value_enum, default_value = "eventhubs")]
    stream: StreamArg,
    /// Events a second a Kafka partition takes (--stream kafka).
    #[arg(long, value_name = "PER_S", default_value_t = PARTITION_EVENTS_PER_S, allow_negative_numbers = true)]
    kafka_partition_rate: f64,
    /// A gateway pod's CPU, in cores.
    #[arg(
        long,
        value_name = "CORES",
        default_value_t = 1.0,
        allow_negative_numbers = true
    )]
    cores_per_gateway: f64,
    /// A worker pod's CPU, in cores.
    #[arg(
        long,
        value_name = "CORES",
        default_value_t = 1.0,
        allow_negative_numbers = true
    )]
    cores_per_worker: f64,
    /// The benchmark's results, where the costs come from.
    #[arg(long, value_name = "FILE", default_value = BENCHMARKS)]
    benchmarks: PathBuf,
    /// A gateway's CPU µs per accepted request, instead of the benchmark's.
    #[arg(long, value_name = "US", allow_negative_numbers = true)]
    gateway_cpu_us: Option<f64>,
    /// A worker's CPU µs per workflow, instead of the benchmark's.
    #[arg(long, value_name = "US", allow_negative_numbers = true)]
    worker_cpu_us: Option<f64>,
    /// A workflow's time beyond its service calls, instead of the benchmark's.
    #[arg(long, value_name = "MS", allow_negative_numbers = true)]
    workflow_overhead_ms: Option<f64>,
    /// Write Helm values realising the plan to this file.
    #[arg(long, value_name = "FILE")]
    helm_values: Option<PathBuf>,
}

/// `skyport plan ARGS…` (`args` starts with the subcommand's name): prints
/// the plan, writes the Helm values when asked. Exits 64 on a bad flag or
/// missing costs, naming them.
pub fn main(args: impl IntoIterator<Item = OsString>) -> ExitCode {
    let args: Vec<OsString> = args.into_iter().collect();
    let command = std::iter::once("skyport".into())
        .chain(args.iter().map(|arg| arg.to_string_lossy()))
        .collect::<Vec<_>>()
        .join(" ");
    let args = match Args::try_parse_from(args) {
        Ok(args) => args,
        Err(e) => {
            let code = if e.use_stderr() { EXIT_CONFIG } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    match run(&args, &command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("skyport plan: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

/// The target the flags describe (on the default stream).
fn target(args: &Args) -> Target {
    let mut target = Target::new(args.sustained, args.spike);
    target.spike_seconds = args.spike_seconds;
    target.request_bytes = args.request_bytes.unwrap_or(target.request_bytes);
    target.service_latency_ms = args.service_latency_ms;
    target.ru_per_write = args.ru_per_write.unwrap_or(RU_PER_STATUS_WRITE);
    target.retention_hours = args.retention_hours;
    target.drain_minutes = args.drain_minutes;
    target.status_retention_days = args
        .status_retention_days
        .unwrap_or(target.status_retention_days);
    target.cores_per_gateway = args.cores_per_gateway;
    target.cores_per_worker = args.cores_per_worker;
    target
}

/// Plans, prints, writes; `command` is the command line, for the values' header.
fn run(args: &Args, command: &str) -> Result<(), PlanError> {
    let stream = match args.stream {
        StreamArg::EventHubs => StreamKind::EventHubs,
        StreamArg::Kafka => StreamKind::Kafka,
        StreamArg::Embedded => return run_machine(args),
    };
    let mut target = target(args);
    target.stream = stream;
    let limits = match stream {
        StreamKind::EventHubs => Limits::event_hubs(),
        StreamKind::Kafka => Limits::kafka(args.kafka_partition_rate),
    };
    let measured = measured_costs(
        &args.benchmarks,
        stream,
        args.gateway_cpu_us,
        args.worker_cpu_us,
        args.workflow_overhead_ms,
        args.ru_per_write.is_some(),
    )?;
    let deployment = plan(&target, &measured.costs(), &limits)?;
    print!(
        "{}",
        render(&target, &measured, &limits, &deployment, &args.benchmarks)
    );
    if let Some(path) = &args.helm_values {
        std::fs::write(path, helm_values(&target, &deployment, command)).map_err(|source| {
            PlanError::Write {
                path: path.clone(),
                source,
            }
        })?;
        println!("Helm values: {}", path.display());
    }
    Ok(())
}

/// `--stream embedded`: one machine, planned and printed.
fn run_machine(args: &Args) -> Result<(), PlanError> {
    if args.helm_values.is_some() {
        return Err(PlanError::Invalid {
            flag: "--helm-values",
            reason: "the embedded stream and store run in one process, which the chart does not install; plan a fleet with --stream eventhubs or kafka".into(),
        });
    }
    let read = std::fs::read_to_string(&args.benchmarks)
        .map_err(|e| format!("cannot be read ({e})"))
        .and_then(|text| {
            serde_json::from_str::<serde_json::Value>(&text)
                .map_err(|e| format!("is not JSON ({e})"))
        });
    let costs = MachineCosts::read(
        &args.benchmarks,
        read.as_ref().map_err(String::as_str),
        args.worker_cpu_us,
        args.gateway_cpu_us,
        args.workflow_overhead_ms,
    )?;
    let target = target(args);
    let machine = plan_machine(&target, &costs)?;
    print!(
        "{}",
        render_machine(&target, &costs, &machine, &args.benchmarks)
    );
    Ok(())
}
