use std::path::Path;

use serde_json::json;

use super::*;
use crate::plan::tests::close;

fn sourced(value: f64) -> Sourced {
    Sourced {
        value,
        source: "test".into(),
    }
}

/// Round figures near what the all-in-one phase measured on 2 cores
/// (about 400 µs a workflow, ingest about 50 µs a request, 8 ms overhead).
fn costs() -> MachineCosts {
    MachineCosts {
        workflow_cpu: sourced(400.0),
        ingest_cpu: sourced(50.0),
        overhead: sourced(8.0),
        rss: Some(sourced(170.0)),
    }
}

#[test]
fn a_thousand_sustained_with_spikes_of_ten_thousand_as_worked_by_hand() {
    let target = Target::new(1_000.0, 10_000.0);
    let machine = plan_machine(&target, &costs()).unwrap();
    // Work off max(1.25 × 1,000, (10,000 × 60 + 1,000 × 600) ÷ 660 = 1,818.2).
    close(machine.needed_per_s, 1_200_000.0 / 660.0);
    // Cores: sustained 1,000 × 400 µs ÷ 0.7 = 0.57; work off 1,818.2 × 400 µs
    // = 0.73; the spike's intake 10,000 × 50 µs ÷ 0.7 = 0.71: 1 core.
    close(machine.cores_sustained, 0.4 / 0.7);
    close(machine.cores_needed, 1_200_000.0 / 660.0 * 400e-6);
    close(machine.cores_spike, 0.5 / 0.7);
    assert_eq!(machine.cores, 1);
    // At least the default 8 partitions; 1,818.2/s × 108 ms × 1.5 = 294.5 in
    // flight, ÷ 8 = 36.8 → 37.
    assert_eq!(machine.partitions, 8);
    close(machine.in_flight, 1_200_000.0 / 660.0 * 0.108 * 1.5);
    assert_eq!(machine.max_in_flight, 37);
    // During the spike: (1e6 − 10,000 × 50) ÷ 350 = 1,428.6/s worked off;
    // backlog (10,000 − 1,428.6) × 60 = 514,286, gone at 2,500 − 1,000 =
    // 1,500/s in 342.9 s.
    close(machine.drain_during_spike_per_s, 500_000.0 / 350.0);
    close(machine.backlog_peak, (10_000.0 - 500_000.0 / 350.0) * 60.0);
    close(machine.backlog_drain_s, machine.backlog_peak / 1_500.0);
    // Disk: 1,000/s × 7 days × 1,334 B = 806.8 GB; a day of reservations 28.9 GB.
    close(machine.documents_bytes, 1_000.0 * 604_800.0 * 1_334.0);
    close(machine.reservations_bytes, 1_000.0 * 86_400.0 * 334.0);
    assert!(machine.warnings.is_empty(), "{:?}", machine.warnings);
}

#[test]
fn the_seeds_target_is_beyond_one_machine_and_the_plan_says_so() {
    let machine = plan_machine(&Target::new(10_000.0, 100_000.0), &costs()).unwrap();
    // Work off 18,181.8/s at 400 µs: 7.3 cores; the spike's intake 5 ÷ 0.7
    // = 7.1; sustained 4 ÷ 0.7 = 5.7: 8 cores, 8 partitions.
    assert_eq!(machine.cores, 8);
    assert_eq!(machine.partitions, 8);
    assert!(
        machine
            .warnings
            .iter()
            .any(|w| w.contains("5,800/s") && w.contains("--stream eventhubs")),
        "{:?}",
        machine.warnings
    );
}

#[test]
fn many_cores_get_a_partition_each() {
    let machine = plan_machine(&Target::new(3_000.0, 3_000.0), &costs()).unwrap();
    // 1.25 × 3,000 × 400 µs = 1.5; 3,000 × 400 µs ÷ 0.7 = 1.71: 2 cores.
    assert_eq!(machine.cores, 2);
    let mut dear = costs();
    dear.workflow_cpu = sourced(4_000.0);
    let machine = plan_machine(&Target::new(3_000.0, 3_000.0), &dear).unwrap();
    assert_eq!(machine.cores, 18);
    assert_eq!(machine.partitions, 18);
    assert_eq!(machine.backlog_peak, 0.0);
    // Never more partitions than the setting takes.
    dear.workflow_cpu = sourced(1e6);
    let machine = plan_machine(&Target::new(3_000.0, 3_000.0), &dear).unwrap();
    assert!(machine.cores > MAX_PARTITIONS);
    assert_eq!(machine.partitions, MAX_PARTITIONS);
}

#[test]
fn bad_inputs_name_their_flag() {
    let flag = |target: &Target, costs: &MachineCosts| match plan_machine(target, costs) {
        Err(PlanError::Invalid { flag, .. }) => flag,
        other => panic!("not refused: {other:?}"),
    };
    assert_eq!(flag(&Target::new(0.0, 10.0), &costs()), "--sustained");
    assert_eq!(flag(&Target::new(10.0, 5.0), &costs()), "--spike");
    let mut target = Target::new(10.0, 10.0);
    target.status_retention_days = f64::NAN;
    assert_eq!(flag(&target, &costs()), "--status-retention-days");
    let mut free = costs();
    free.workflow_cpu = sourced(-1.0);
    assert_eq!(flag(&Target::new(10.0, 10.0), &free), "--worker-cpu-us");
    let mut early = costs();
    early.overhead = sourced(-1.0);
    assert_eq!(
        flag(&Target::new(10.0, 10.0), &early),
        "--workflow-overhead-ms"
    );
}

#[test]
fn the_costs_come_from_the_all_in_one_phase_unless_a_flag_gives_them() {
    let figures = json!({
        "machine": {"cores": 2},
        "ingest": [{"connections": 64, "skyport": {"requests_per_s": 40_000.0}}],
        "all_in_one": {
            "work": [
                {"cpu_us_per_workflow": 413.3},
                {"cpu_us_per_workflow": 371.8},
                {"cpu_us_per_workflow": 361.8}
            ],
            "peak_rss_mib": 170.1
        },
        "time_to_terminal": [{"rate": 1000, "terminal": {"p50_ms": 107.5}}]
    });
    let path = Path::new("BENCHMARKS.json");
    let costs = MachineCosts::read(path, Ok(&figures), None, None, None).unwrap();
    close(costs.workflow_cpu.value, 371.8);
    assert!(costs.workflow_cpu.source.contains("median of 3 rounds"));
    close(costs.ingest_cpu.value, 50.0);
    close(costs.overhead.value, 7.5);
    close(costs.rss.unwrap().value, 170.1);
    let given = MachineCosts::read(path, Ok(&figures), Some(500.0), Some(60.0), Some(2.0)).unwrap();
    assert_eq!(
        (
            given.workflow_cpu.value,
            given.ingest_cpu.value,
            given.overhead.value
        ),
        (500.0, 60.0, 2.0)
    );
    assert_eq!(given.workflow_cpu.source, "--worker-cpu-us");
    let error = MachineCosts::read(path, Err("cannot be read (gone)"), None, None, None)
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("BENCHMARKS.json: cannot be read (gone)")
            && error.contains("--worker-cpu-us"),
        "{error}"
    );
}

#[test]
fn the_report_names_each_setting_and_its_rule() {
    let target = Target::new(1_000.0, 10_000.0);
    let machine = plan_machine(&target, &costs()).unwrap();
    let text = render_machine(&target, &costs(), &machine, Path::new("BENCHMARKS.json"));
    for wanted in [
        "Skyport on one machine (embedded stream and store): 1,000/s sustained",
        "stream.partitions = 8",
        "worker.max_in_flight = 37",
        "806.8 GB",
        "170 MiB",
    ] {
        assert!(text.contains(wanted), "{wanted} is not in:\n{text}");
    }
}

#[test]
fn the_command_plans_one_machine_from_the_repositorys_results_and_refuses_helm_values() {
    let run = |args: &[&str]| {
        crate::plan::main(
            ["plan", "--stream", "embedded"]
                .into_iter()
                .chain(args.iter().copied())
                .map(std::ffi::OsString::from),
        )
    };
    // Run from the package's root, as `cargo test` does: benches/BENCHMARKS.json.
    assert_eq!(
        run(&["--sustained", "1000", "--spike", "10000"]),
        std::process::ExitCode::SUCCESS
    );
    let code = std::process::ExitCode::from(skyport_runtime::config::EXIT_CONFIG);
    let values = tempfile::tempdir().unwrap();
    let values = values.path().join("values.yaml");
    assert_eq!(
        run(&[
            "--sustained",
            "1000",
            "--spike",
            "10000",
            "--helm-values",
            values.to_str().unwrap()
        ]),
        code
    );
    assert!(!values.exists());
    assert_eq!(run(&["--sustained", "1000", "--spike", "10"]), code);
}
