//! The planner's tests: the worked example, the model's bounds, the inputs it
//! refuses, the benchmark's figures, the command and the Helm values.

use std::ffi::OsString;
use std::path::Path;
use std::process::ExitCode;

use serde_json::{Value, json};
use skyport_runtime::config::EXIT_CONFIG;

use super::helm::{cpu_quantity, workflows_per_worker};
use super::sizing::memory_request;
use super::*;

/// Round figures near what the benchmark measured (BENCHMARKS.json at
/// 1f61523: 51.7 µs, 216 µs, 7.8 ms), so the arithmetic checks by hand.
fn costs() -> Costs {
    Costs {
        gateway_cpu_us_per_request: 50.0,
        worker_cpu_us_per_workflow: 216.0,
        workflow_overhead_ms: 8.0,
        gateway_rss_mib: Some(49.0),
        worker_rss_mib: Some(132.0),
        cosmos_ru: None,
    }
}

fn shape(workers: u32, partitions: u32, max_in_flight: u32) -> Shape {
    Shape {
        workers,
        partitions,
        max_in_flight,
        cores_per_worker: 1.0,
        service_latency_ms: 20.0,
        shared_cores: None,
        other_cpu_us_per_workflow: 0.0,
        backlog: 0.0,
    }
}

pub(super) fn close(actual: f64, expected: f64) {
    assert!(
        (actual - expected).abs() <= expected.abs() * 1e-6 + 1e-9,
        "{actual} is not {expected}"
    );
}

#[test]
fn ten_thousand_sustained_and_a_hundred_thousand_spike_plan_as_worked_by_hand() {
    let target = Target::new(10_000.0, 100_000.0);
    let deployment = plan(&target, &costs(), &Limits::event_hubs()).unwrap();
    let Deployment {
        stream,
        namespace,
        gateways,
        workers,
        backlog,
        cosmos,
        warnings,
    } = &deployment;

    // The README's request is about 690 B on the stream: under 1,000 B,
    // so the partitions' and TUs' event limits bind before their bytes.
    assert!((600.0..1_000.0).contains(&stream.event_bytes));
    // 100,000/s ÷ 1,000/s a partition = 100; ceil(100 ÷ 32) = 4 hubs of 25.
    assert_eq!(stream.partitions_needed, 100);
    assert_eq!((stream.hubs, stream.partitions_per_hub), (4, 25));
    assert_eq!(stream.partitions, 100);
    assert_eq!(
        stream.names,
        [
            "deliveries-0",
            "deliveries-1",
            "deliveries-2",
            "deliveries-3"
        ]
    );

    // Needed: max(1.25 × 10,000 = 12,500, drain: (100,000 × 60 + 10,000 × 600)
    // ÷ (60 + 600) = 12,000,000 ÷ 660 = 18,181.8) = 18,181.8/s.
    close(workers.needed_per_s, 12_000_000.0 / 660.0);
    // A worker: 1e6 ÷ 216 µs = 4,629.6/s; ceil(18,181.8 ÷ 4,629.6) = ceil(3.93) = 4,
    // 18,518.5/s together, bound by their CPU.
    close(workers.cpu_per_worker_per_s, 1e6 / 216.0);
    assert_eq!(workers.replicas, 4);
    close(workers.capacity.workflows_per_s, 4.0 * 1e6 / 216.0);
    assert_eq!(workers.capacity.bound, Bound::Cpu);
    // A workflow: 5 × 20 ms + 8 ms = 108 ms. A worker's 25 partitions at
    // 4,629.6 ÷ 25 = 185.2/s each: 185.2 × 0.108 s × 1.5 = 30 in flight.
    close(workers.capacity.workflow_latency_s, 0.108);
    close(workers.partition_rate_per_s, 1e6 / 216.0 / 25.0);
    assert_eq!(workers.max_in_flight, 30);
    assert_eq!(workers.read_ahead, 512);
    // The windows allow 100 × 30 ÷ 0.108 s = 27,777.8/s: not the bound.
    close(workers.capacity.window_per_s, 100.0 * 30.0 / 0.108);

    // TUs: ingress 100,000 ÷ 1,000 = 100 by events (bytes: ~69); egress
    // 18,518.5 ÷ 4,096 = 4.5 → 5. 100 > 40: Premium; ~69 MB/s ÷ 5 MB/s
    // = 14 PUs, sold as 16.
    assert_eq!(namespace.ingress_tus.0, 100);
    assert!(namespace.ingress_tus.1 < 100);
    assert_eq!(namespace.egress_tus.0, 5);
    assert_eq!(namespace.throughput_units(), 100);
    assert_eq!(namespace.sustained_tus, 10);
    assert!(
        matches!(namespace.tier, Tier::Premium { pus: 16, needed } if (13..=16).contains(&needed))
    );

    // Gateways: 100,000 × 50 µs = 5 cores ÷ 0.7 = 7.1 → 8; 10,000 × 50 µs
    // = 0.5 cores ÷ 0.7 = 0.7 → 1, at least 2.
    assert_eq!((gateways.min, gateways.max), (2, 8));
    close(gateways.cores_spike, 5.0);

    // Backlog: (100,000 − 18,518.5) × 60 s = 4,888,889; drained at
    // 18,518.5 − 10,000 = 8,518.5/s in 573.9 s (9.6 min, within the 10);
    // the spike's last request waits 4,888,889 ÷ 18,518.5 = 264 s.
    let capacity = 4.0 * 1e6 / 216.0;
    close(backlog.peak, (100_000.0 - capacity) * 60.0);
    close(
        backlog.drain_s,
        (100_000.0 - capacity) * 60.0 / (capacity - 10_000.0),
    );
    assert!((573.0..575.0).contains(&backlog.drain_s));
    close(
        backlog.longest_wait_s,
        (100_000.0 - capacity) * 60.0 / capacity,
    );
    close(backlog.bytes, backlog.peak * stream.event_bytes);

    // Cosmos DB: 108 ms < 1 s, one write a workflow; 18,518.5/s × (8 + 1 + 1)
    // = 185,185.2 RU/s. Shares: 8/10 = 0.80, 1/10 = 0.10;
    // 148,148 RU/s ÷ 0.80 = 185,185 → 186,000 RU/s max, 19 partitions for it;
    // 10,000/s × 7 days × 1.1 KB = 6,653 GB → 134 partitions of 50 GB.
    assert_eq!(cosmos.writes_per_workflow, 1);
    close(cosmos.write_ru_per_s, capacity * 8.0);
    close(
        cosmos.write_ru_per_s + cosmos.change_feed_ru_per_s + cosmos.read_ru_per_s,
        capacity * 10.0,
    );
    close(cosmos.sustained_ru_per_s, 100_000.0);
    assert_eq!(cosmos.worker_fraction, 0.80);
    assert_eq!(cosmos.clients_fraction, 0.10);
    assert!(cosmos.worker_fraction + cosmos.clients_fraction <= 1.0);
    assert_eq!(cosmos.autoscale_max_ru_per_s, 186_000.0);
    assert!(cosmos.worker_fraction * cosmos.autoscale_max_ru_per_s >= cosmos.write_ru_per_s);
    assert_eq!(cosmos.partitions_for_ru, 19);
    close(cosmos.storage_gb, 6_652.8);
    assert_eq!(cosmos.partitions_for_storage, 134);
    assert_eq!(cosmos.physical_partitions(), 134);
    assert!(warnings.is_empty(), "{warnings:?}");
}

#[test]
fn slow_services_widen_the_windows_so_the_workers_stay_bound_by_their_cpu() {
    // 5 × 400 ms = 2 s a workflow: past worker.processing_after_ms, so two writes.
    let mut target = Target::new(1_000.0, 5_000.0);
    target.service_latency_ms = 400.0;
    let costs = Costs {
        worker_cpu_us_per_workflow: 200.0,
        workflow_overhead_ms: 0.0,
        ..costs()
    };
    let deployment = plan(&target, &costs, &Limits::event_hubs()).unwrap();
    let workers = &deployment.workers;
    // 5 partitions in one hub; one worker at 1e6 ÷ 200 = 5,000/s covers
    // max(1,250, (5,000 × 60 + 1,000 × 600) ÷ 660 = 1,363.6).
    assert_eq!(deployment.stream.partitions, 5);
    assert_eq!(deployment.stream.names, ["deliveries"]);
    assert_eq!(workers.replicas, 1);
    // 5,000/s over 5 partitions = 1,000/s each × 2 s × 1.5 = 3,000 in flight;
    // read_ahead follows it past 512.
    assert_eq!(workers.max_in_flight, 3_000);
    assert_eq!(workers.read_ahead, 3_000);
    assert_eq!(workers.capacity.bound, Bound::Cpu);
    close(workers.capacity.workflows_per_s, 5_000.0);
    assert_eq!(deployment.cosmos.writes_per_workflow, 2);
    // The default window (128) would leave the same shape bound by the
    // latency: 5 × 128 ÷ 2 s = 320/s.
    let mut default_window = shape(1, 5, 128);
    default_window.service_latency_ms = 400.0;
    let prediction = predict(&costs, &default_window);
    assert_eq!(prediction.bound, Bound::Window);
    close(prediction.workflows_per_s, 320.0);
}

#[test]
fn an_expensive_workflow_takes_many_workers_bound_by_their_cpu() {
    // 1,000 µs a workflow: 1,000/s a worker. Needed: max(12,500, (20,000 × 60
    // + 10,000 × 600) ÷ 660 = 10,909) = 12,500 → 13 workers on 20 partitions.
    let target = Target::new(10_000.0, 20_000.0);
    let costs = Costs {
        worker_cpu_us_per_workflow: 1_000.0,
        ..costs()
    };
    let deployment = plan(&target, &costs, &Limits::event_hubs()).unwrap();
    let workers = &deployment.workers;
    assert_eq!(deployment.stream.partitions, 20);
    assert_eq!(workers.replicas, 13);
    assert_eq!(workers.capacity.bound, Bound::Cpu);
    close(workers.capacity.workflows_per_s, 13_000.0);
    // The workers holding one partition run it at 1,000/s: 1,000 × 0.108 × 1.5 = 162.
    assert_eq!(workers.max_in_flight, 162);
    // (20,000 − 13,000) × 60 = 420,000, drained at 3,000/s in 140 s.
    close(deployment.backlog.peak, 420_000.0);
    close(deployment.backlog.drain_s, 140.0);
    // 20 TUs for the spike: Standard, auto-inflating from the sustained 10.
    assert_eq!(deployment.namespace.tier, Tier::Standard { max_tus: 20 });
}

#[test]
fn never_more_workers_than_partitions() {
    // 100/s a worker: 1,250/s needs 13 workers, so the one partition the
    // spike needs becomes 13.
    let target = Target::new(1_000.0, 1_000.0);
    let costs = Costs {
        worker_cpu_us_per_workflow: 10_000.0,
        ..costs()
    };
    let deployment = plan(&target, &costs, &Limits::event_hubs()).unwrap();
    assert_eq!(deployment.stream.partitions_needed, 1);
    assert_eq!(deployment.workers.replicas, 13);
    assert_eq!(deployment.stream.partitions, 13);
    assert_eq!(deployment.backlog.peak, 0.0);
}

#[test]
fn kafka_partitions_follow_the_partition_rate_given() {
    let mut target = Target::new(10_000.0, 100_000.0);
    target.stream = StreamKind::Kafka;
    let deployment = plan(&target, &costs(), &Limits::kafka(5_000.0)).unwrap();
    // 100,000 ÷ 5,000 = 20 partitions in one topic.
    assert_eq!(deployment.stream.partitions, 20);
    assert_eq!(deployment.stream.hubs, 1);
}

#[test]
fn predict_spreads_partitions_and_idles_workers_without_one() {
    let costs = Costs {
        worker_cpu_us_per_workflow: 250.0,
        workflow_overhead_ms: 0.0,
        ..costs()
    };
    // 4,000/s a worker; windows of 128 over 100 ms: 1,280/s a partition.
    let two = predict(&costs, &shape(2, 8, 128));
    assert_eq!(two.bound, Bound::Cpu);
    close(two.workflows_per_s, 8_000.0);
    close(two.window_per_s, 10_240.0);
    // 10 workers on 4 partitions: 4 work, 6 idle.
    let idle = predict(&costs, &shape(10, 4, 128));
    close(idle.cpu_per_s, 16_000.0);
    close(idle.workflows_per_s, 4.0 * 1_280.0);
    assert_eq!(idle.bound, Bound::Window);
    // 3 workers on 8 partitions (3, 3, 2) with windows of 16: 160/s a partition.
    let uneven = predict(&costs, &shape(3, 8, 16));
    close(uneven.workflows_per_s, 8.0 * 160.0);
    let none = predict(&costs, &shape(0, 8, 16));
    assert_eq!(none.workflows_per_s, 0.0);
    let mut backlog = shape(0, 8, 16);
    backlog.backlog = 10.0;
    assert!(predict(&costs, &backlog).drain_s.is_infinite());
}

#[test]
fn shared_cores_cap_predict_at_their_cpu_over_every_process() {
    // 4 workers alone: 4 × 1e6 ÷ 216 = 18,518/s. On 2 shared cores with
    // 50 + 216 + 134 = 400 µs a workflow over every process: 5,000/s.
    let mut shared = shape(4, 100, 30);
    shared.shared_cores = Some(2.0);
    shared.other_cpu_us_per_workflow = 134.0;
    shared.backlog = 100_000.0;
    let prediction = predict(&costs(), &shared);
    assert_eq!(prediction.bound, Bound::SharedCores);
    close(prediction.shared_per_s.unwrap(), 5_000.0);
    close(prediction.workflows_per_s, 5_000.0);
    close(prediction.drain_s, 20.0);
    // Apart, the same shape is bound by the workers' CPU.
    shared.shared_cores = None;
    let apart = predict(&costs(), &shared);
    assert_eq!(apart.bound, Bound::Cpu);
    close(apart.workflows_per_s, 4.0 * 1e6 / 216.0);
}

fn invalid_flag(target: &Target, costs: &Costs) -> &'static str {
    match plan(target, costs, &Limits::event_hubs()) {
        Err(e @ PlanError::Invalid { flag, .. }) => {
            assert_eq!(e.exit_code(), EXIT_CONFIG);
            flag
        }
        other => panic!("expected an invalid flag, got {other:?}"),
    }
}

#[test]
fn bad_inputs_name_their_flag() {
    let good = Target::new(10_000.0, 100_000.0);
    assert_eq!(
        invalid_flag(&Target::new(10_000.0, 5_000.0), &costs()),
        "--spike"
    );
    assert_eq!(
        invalid_flag(&Target::new(0.0, 5_000.0), &costs()),
        "--sustained"
    );
    assert_eq!(
        invalid_flag(&Target::new(-1.0, 5_000.0), &costs()),
        "--sustained"
    );
    let mut nan = good.clone();
    nan.service_latency_ms = f64::NAN;
    assert_eq!(invalid_flag(&nan, &costs()), "--service-latency-ms");
    let mut infinite = good.clone();
    infinite.spike_seconds = f64::INFINITY;
    assert_eq!(invalid_flag(&infinite, &costs()), "--spike-seconds");
    let free = Costs {
        worker_cpu_us_per_workflow: 0.0,
        ..costs()
    };
    assert_eq!(invalid_flag(&good, &free), "--worker-cpu-us");
    let negative = Costs {
        workflow_overhead_ms: -1.0,
        ..costs()
    };
    assert_eq!(invalid_flag(&good, &negative), "--workflow-overhead-ms");
    let message = plan(&Target::new(10.0, 5.0), &costs(), &Limits::event_hubs())
        .unwrap_err()
        .to_string();
    assert_eq!(message, "--spike: must be at least --sustained (10), got 5");
}

#[test]
fn a_retention_shorter_than_the_drain_is_refused() {
    // The example's spike and drain take 60 + 574 s = 0.18 h.
    let mut target = Target::new(10_000.0, 100_000.0);
    target.retention_hours = 0.1;
    let error = plan(&target, &costs(), &Limits::event_hubs()).unwrap_err();
    assert!(
        matches!(error, PlanError::RetentionTooShort { .. }),
        "{error}"
    );
    assert_eq!(error.exit_code(), EXIT_CONFIG);
    assert!(error.to_string().starts_with("--retention-hours"));
}

#[test]
fn an_event_is_the_request_and_its_envelope() {
    let readme = event_bytes(README_BODY.len() as f64).unwrap();
    assert!(readme > README_BODY.len() as f64 + 36.0 + 55.0);
    close(event_bytes(1_230.0).unwrap(), readme + 1_000.0);
}

fn figures_json() -> Value {
    json!({
        "machine": {"cores": 2},
        "ingest": [
            {"connections": 256, "skyport": {"requests_per_s": 50_000.0}, "peak_rss_mib": 60.0},
            {"connections": 64, "skyport": {"requests_per_s": 40_000.0}, "peak_rss_mib": 50.0},
        ],
        "end_to_end": {"cpu_us_per_workflow": 216.0, "peak_rss_mib": 130.0},
        "kafka": {"end_to_end": {"cpu_us_per_workflow": 240.0, "peak_rss_mib": 140.0}},
        "time_to_terminal": [
            {"rate": 2000, "terminal": {"p50_ms": 110.0}},
            {"rate": 1000, "terminal": {"p50_ms": 107.5}},
        ],
    })
}

#[test]
fn without_fleet_runs_the_costs_come_from_the_single_process_phases() {
    let figures = BenchmarkFigures::from_json(&figures_json(), StreamKind::EventHubs);
    // 2 cores ÷ 40,000/s at 64 connections = 50 µs.
    close(figures.gateway_cpu.as_ref().unwrap().value, 50.0);
    assert!(
        figures
            .gateway_cpu
            .unwrap()
            .source
            .starts_with("ingest at 64 connections")
    );
    close(figures.worker_cpu.as_ref().unwrap().value, 216.0);
    // 107.5 ms at the lowest rate less 5 calls of 20 ms.
    close(figures.overhead.unwrap().value, 7.5);
    close(figures.gateway_rss.unwrap().value, 50.0);
    close(figures.worker_rss.unwrap().value, 130.0);
    let kafka = BenchmarkFigures::from_json(&figures_json(), StreamKind::Kafka);
    close(kafka.worker_cpu.as_ref().unwrap().value, 240.0);
    assert!(
        kafka
            .worker_cpu
            .unwrap()
            .source
            .starts_with("kafka.end_to_end")
    );
}

#[test]
fn a_fleet_run_with_one_worker_is_preferred() {
    let mut json = figures_json();
    json["fleet_eventhubs"] = json!({"runs": [
        {"workers": 2, "gateway_cpu_us_per_request": 1.0, "worker_cpu_us_per_workflow": 1.0},
        {"workers": 1, "gateway_cpu_us_per_request": 30.0, "worker_cpu_us_per_workflow": 150.0,
         "workflow_overhead_ms": 12.0, "gateway_rss_mib": 40.0, "worker_rss_mib": 90.0},
    ]});
    let figures = BenchmarkFigures::from_json(&json, StreamKind::EventHubs);
    close(figures.gateway_cpu.as_ref().unwrap().value, 30.0);
    assert_eq!(
        figures.gateway_cpu.unwrap().source,
        "fleet_eventhubs.runs[workers = 1].gateway_cpu_us_per_request"
    );
    close(figures.worker_cpu.unwrap().value, 150.0);
    close(figures.overhead.unwrap().value, 12.0);
    close(figures.worker_rss.unwrap().value, 90.0);
    // The Kafka plan does not take Event Hubs' fleet.
    let kafka = BenchmarkFigures::from_json(&json, StreamKind::Kafka);
    close(kafka.worker_cpu.unwrap().value, 240.0);
}

#[test]
fn a_fleet_gateways_cpu_while_posting_is_preferred_to_the_whole_runs() {
    let mut json = figures_json();
    json["fleet_kafka"] = json!({"runs": [
        {"workers": 1, "gateway_cpu_us_per_request": 66.0,
         "gateway_posting_cpu_us_per_request": 48.0, "worker_cpu_us_per_workflow": 700.0},
    ]});
    let gateway = BenchmarkFigures::from_json(&json, StreamKind::Kafka)
        .gateway_cpu
        .unwrap();
    close(gateway.value, 48.0);
    assert_eq!(
        gateway.source,
        "fleet_kafka.runs[workers = 1].gateway_posting_cpu_us_per_request"
    );
}

#[test]
fn measured_request_units_replace_the_modelled_status_writes_and_size_the_other_containers() {
    let json = json!({"cosmos_cost": {"rate": 300, "with_callbacks": {"posted": {"statuses": {"202": 1000}},
        "units": [{"work": "status_writes", "units": 40_000.0}, {"work": "reservations", "units": 8_000.0},
                  {"work": "listing", "units": 30.0}, {"work": "leases", "units": 1_500.0},
                  {"work": "throughput_control", "units": 500.0}, {"work": "change_feed", "units": 100.0}]}}});
    let ru = SourcedRu::from_json(&json).unwrap().value;
    assert_eq!((ru.status_writes, ru.reservations), (40.0, 8.0));
    assert!(
        SourcedRu::from_json(&json!({"cosmos_cost": {"with_callbacks": {"units": []}}})).is_none()
    );
    let target = Target::new(10_000.0, 100_000.0);
    let modelled = plan(&target, &costs(), &Limits::event_hubs())
        .unwrap()
        .cosmos;
    assert_eq!(modelled.others, None);
    let measured = Costs {
        cosmos_ru: Some(ru),
        ..costs()
    };
    let deployment = plan(&target, &measured, &Limits::event_hubs()).unwrap();
    let (cosmos, capacity) = (
        deployment.cosmos,
        deployment.workers.capacity.workflows_per_s,
    );
    close(cosmos.write_ru_per_s, capacity * 40.0);
    // The change feed and the clients' reads stay modelled.
    close(cosmos.change_feed_ru_per_s, modelled.change_feed_ru_per_s);
    close(cosmos.read_ru_per_s, modelled.read_ru_per_s);
    close(
        cosmos.sustained_ru_per_s,
        10_000.0 * (40.0 + RU_CHANGE_FEED_PER_WRITE + RU_PER_STATUS_READ),
    );
    assert!(cosmos.worker_fraction * cosmos.autoscale_max_ru_per_s >= cosmos.write_ru_per_s);
    let others = cosmos.others.unwrap();
    close(others.reservations_ru_per_s, 100_000.0 * 8.0);
}

#[test]
fn run_from_the_repositorys_root_the_plan_finds_the_benchmarks_results() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let figures = measured_costs(
        &root.join(BENCHMARKS),
        StreamKind::Kafka,
        None,
        None,
        None,
        false,
    )
    .expect("the committed results give every cost");
    assert!(figures.worker_cpu.value > 0.0);
}

#[test]
fn a_missing_benchmark_file_names_itself_and_the_flags_unless_they_are_given() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("BENCHMARKS.json");
    let error =
        measured_costs(&path, StreamKind::EventHubs, Some(50.0), None, None, false).unwrap_err();
    assert_eq!(error.exit_code(), EXIT_CONFIG);
    let message = error.to_string();
    assert!(
        message.starts_with(&path.display().to_string()),
        "{message}"
    );
    assert!(
        message.contains("--gateway-cpu-us and --worker-cpu-us"),
        "{message}"
    );
    let given = measured_costs(
        &path,
        StreamKind::EventHubs,
        Some(50.0),
        Some(200.0),
        None,
        false,
    )
    .unwrap();
    assert_eq!(given.worker_cpu.source, "--worker-cpu-us");
    assert_eq!(given.overhead.value, 0.0);
    assert_eq!(given.costs().gateway_rss_mib, None);
    std::fs::write(&path, figures_json().to_string()).unwrap();
    let read =
        measured_costs(&path, StreamKind::EventHubs, None, Some(200.0), None, false).unwrap();
    close(read.gateway_cpu.value, 50.0);
    close(read.worker_cpu.value, 200.0);
}

#[test]
fn the_command_exits_64_on_a_bad_flag() {
    let run = |args: &[&str]| {
        main(
            std::iter::once("plan")
                .chain(args.iter().copied())
                .map(OsString::from),
        )
    };
    let costs = ["--gateway-cpu-us", "50", "--worker-cpu-us", "216"];
    let code = ExitCode::from(EXIT_CONFIG);
    assert_eq!(
        run(&[&["--sustained", "-5", "--spike", "10"][..], &costs].concat()),
        code
    );
    assert_eq!(
        run(&[&["--sustained", "NaN", "--spike", "10"][..], &costs].concat()),
        code
    );
    assert_eq!(run(&["--sustained", "5"]), code);
    assert_eq!(
        run(&[
            &["--sustained", "5", "--spike", "10", "--stream", "pigeon"][..],
            &costs
        ]
        .concat()),
        code
    );
    assert_eq!(
        run(&[&["--sustained", "5", "--spike", "10"][..], &costs].concat()),
        ExitCode::SUCCESS
    );
}

#[test]
fn the_helm_values_carry_the_plan_in_the_charts_keys() {
    let target = Target::new(10_000.0, 100_000.0);
    let deployment = plan(&target, &costs(), &Limits::event_hubs()).unwrap();
    let values = helm_values(&target, &deployment, "skyport plan …");
    for line in [
        "config:",
        "  eventhubs:",
        r#"    hubs: ["deliveries-0","deliveries-1","deliveries-2","deliveries-3"]"#,
        "  worker:\n",
        "    max_in_flight: 30\n    read_ahead: 512\n",
        "    throughput_groups:\n      worker:\n        container: \"status\"\n        work: [\"status_writes\",\"dead_letters\"]\n        target_fraction: 0.80\n        priority: \"low\"\n        scope: \"global\"\n",
        "      clients:\n        container: \"status\"\n        work: [\"status_reads\",\"reservations\"]\n        target_fraction: 0.10\n        priority: \"high\"\n",
        "gateway:\n  autoscaling:\n",
        "    enabled: true\n    minReplicas: 2\n    maxReplicas: 8\n    targetCPUUtilizationPercentage: 70\n",
        "  resources:\n    requests:\n      cpu: \"1\"\n      memory: \"256Mi\"\n    limits:\n      memory: \"512Mi\"\n",
        "worker:\n",
        "  replicaCount: 4\n  autoscaling:\n    enabled: false\n",
    ] {
        assert!(values.contains(line), "no {line:?} in\n{values}");
    }
    assert!(
        values
            .lines()
            .all(|line| !line.ends_with(' ') && !line.contains('\t'))
    );
    let mut kafka = target.clone();
    kafka.stream = StreamKind::Kafka;
    let deployment = plan(&kafka, &costs(), &Limits::kafka(1_000.0)).unwrap();
    let values = helm_values(&kafka, &deployment, "skyport plan …");
    assert!(values.contains("  kafka:\n"), "{values}");
    assert!(values.contains("    topics: [\"deliveries-0\""), "{values}");
}

#[test]
fn kedas_threshold_is_the_plans_workflows_per_worker() {
    let target = Target::new(10_000.0, 100_000.0);
    let deployment = plan(&target, &costs(), &Limits::event_hubs()).unwrap();
    let workers = &deployment.workers;
    let per_worker = (workers.capacity.workflows_per_s / f64::from(workers.replicas)).floor();
    assert_eq!(f64::from(workflows_per_worker(workers)), per_worker);
    // 10,000/s × 1.25 at that rate a worker, rounded up: KEDA's floor.
    let floor = (12_500.0 / per_worker).ceil();
    let values = helm_values(&target, &deployment, "skyport plan …");
    let keda = format!(
        "  keda:\n    # With KEDA installed: keda.enabled true, prometheus.serverAddress set (docs/operations.md).\n    # The sustained rate × 1.25 at {per_worker} a worker; at most a worker a partition.\n    minReplicas: {floor}\n    maxReplicas: {partitions}\n    partitions: {partitions}\n    workflowsPerWorker: {per_worker}\n    drainSeconds: 600\n",
        partitions = deployment.stream.partitions
    );
    assert!(values.contains(&keda), "no {keda:?} in\n{values}");
    assert!(
        values.ends_with("alerts:\n  backlogAgeSeconds: 600\n"),
        "{values}"
    );
    assert!(floor >= 1.0 && floor <= f64::from(workers.replicas));
}

#[test]
fn quantities_are_written_as_kubernetes_writes_them() {
    assert_eq!(cpu_quantity(1.0), "1");
    assert_eq!(cpu_quantity(2.0), "2");
    assert_eq!(cpu_quantity(0.5), "500m");
    assert_eq!(memory_request(Some(49.0), 256), 256);
    // 300 × 2 = 600 → 640 (ten 64 MiB steps).
    assert_eq!(memory_request(Some(300.0), 512), 640);
    assert_eq!(memory_request(None, 512), 512);
    assert_eq!(thousands(18_518.6), "18,519");
    assert_eq!(thousands(999.0), "999");
    assert_eq!(thousands(1_000_000.0), "1,000,000");
}
