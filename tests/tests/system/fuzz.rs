//! Property-based fuzzing (proptest) of every decoder in
//! `skyport_tests::decoders`: arbitrary bytes, valid inputs with bytes
//! replaced, inserted and deleted or hostile tokens spliced in (`1e400`, lone
//! surrogates, `NaN`, deep nesting), and valid JSON with one value swapped
//! for an arbitrary one. A failure is shrunk to its smallest input.
//!
//! In the test run it is short and deterministic (a fixed seed, a few
//! thousand cases per decoder). `SKYPORT_FUZZ_SECONDS=600` makes it a long
//! run over that many seconds in all, from a random seed:
//! `SKYPORT_FUZZ_SECONDS=600 cargo test -p skyport-tests --test system fuzz -- --nocapture`.
//!
//! The coverage-guided fuzzer (`tests/fuzz/`, libFuzzer through cargo-fuzz without
//! sanitizers) gets a short run here too, which also keeps its target
//! building as the decoders change.

#![allow(clippy::unwrap_used)]

use std::process::Command;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use serde_json::Value;
use skyport_tests::decoders::{DECODERS, Decoder};
use skyport_tests::{installed_tool, workspace};

/// Cases per decoder in the test run.
const SHORT_CASES: u32 = 10_000;

/// Tokens that have broken JSON decoders elsewhere, spliced into inputs.
const HOSTILE: &[&str] = &[
    "null",
    "1e400",
    "-1e400",
    "NaN",
    "-0",
    "1.7976931348623157e309",
    "99999999999999999999999",
    "\"\\ud800\"",
    "\"\\udfff\\ud800\"",
    "\u{0}",
    "\u{feff}",
    "[[[[[[[[[[[[[[[[",
    "{\"\":",
    "\"",
    "\\",
    "\"\u{1F4E6}\"",
    "true",
    "[]",
    "{}",
    "=",
    "[x]\n",
    "\n[a.b]\nc = 1\n",
    "0x10",
    "2026-13-40",
    "\u{7f}\u{80}",
    "\r\n",
];

/// One edit of a mutation: what to do, where, and with which byte or token.
#[derive(Debug, Clone)]
enum Edit {
    Replace(Index, u8),
    Insert(Index, u8),
    Delete(Index),
    Splice(Index, &'static str),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (any::<Index>(), any::<u8>()).prop_map(|(at, byte)| Edit::Replace(at, byte)),
        (any::<Index>(), any::<u8>()).prop_map(|(at, byte)| Edit::Insert(at, byte)),
        any::<Index>().prop_map(Edit::Delete),
        (any::<Index>(), proptest::sample::select(HOSTILE)).prop_map(|(at, t)| Edit::Splice(at, t)),
    ]
}

fn mutate(mut bytes: Vec<u8>, edits: Vec<Edit>) -> Vec<u8> {
    for edit in edits {
        let room = bytes.len() + 1;
        match edit {
            Edit::Replace(at, byte) if !bytes.is_empty() => {
                let at = at.index(bytes.len());
                bytes[at] = byte;
            }
            Edit::Insert(at, byte) => bytes.insert(at.index(room), byte),
            Edit::Delete(at) if !bytes.is_empty() => {
                bytes.remove(at.index(bytes.len()));
            }
            Edit::Splice(at, token) => {
                let at = at.index(room);
                bytes.splice(at..at, token.bytes());
            }
            Edit::Replace(..) | Edit::Delete(..) => {}
        }
    }
    bytes
}

/// Any JSON value, nested a few levels.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        ".{0,40}".prop_map(Value::String),
        proptest::sample::select(HOSTILE).prop_map(|t| Value::String(t.to_owned())),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::btree_map(".{0,12}", inner, 0..4)
                .prop_map(|map| Value::Object(map.into_iter().collect())),
        ]
    })
}

/// Every value in `value`, as JSON pointers.
fn pointers(value: &Value, at: String, found: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, child) in map {
                pointers(
                    child,
                    format!("{at}/{}", key.replace('~', "~0").replace('/', "~1")),
                    found,
                );
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter().enumerate() {
                pointers(child, format!("{at}/{i}"), found);
            }
        }
        _ => {}
    }
    found.push(at);
}

/// A JSON seed with one of its values (or itself) replaced; any other seed
/// with the value's text spliced in.
fn swap_value(seed: &[u8], pick: Index, replacement: Value) -> Vec<u8> {
    let Ok(mut document) = serde_json::from_slice::<Value>(seed) else {
        let mut bytes = seed.to_vec();
        let at = pick.index(bytes.len() + 1);
        bytes.splice(at..at, replacement.to_string().into_bytes());
        return bytes;
    };
    let mut found = Vec::new();
    pointers(&document, String::new(), &mut found);
    let pointer = &found[pick.index(found.len())];
    if let Some(slot) = document.pointer_mut(pointer) {
        *slot = replacement;
    }
    serde_json::to_vec(&document).unwrap()
}

fn inputs(decoder: &Decoder) -> impl Strategy<Value = Vec<u8>> + use<> {
    let seeds = (decoder.seeds)();
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..512),
        (
            proptest::sample::select(seeds.clone()),
            proptest::collection::vec(edit(), 1..8)
        )
            .prop_map(|(seed, edits)| mutate(seed, edits)),
        (
            proptest::sample::select(seeds),
            any::<Index>(),
            json_value()
        )
            .prop_map(|(seed, pick, value)| swap_value(&seed, pick, value)),
    ]
}

/// Runs `decoder` over `cases` inputs: how many decoded, or the failure,
/// shrunk, if one broke it.
fn fuzz(decoder: &Decoder, cases: u32, rng: TestRng) -> Result<u32, String> {
    let config = Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    };
    let mut runner = TestRunner::new_with_rng(config, rng);
    let decoded = std::cell::Cell::new(0);
    runner
        .run(&inputs(decoder), |input| {
            if (decoder.check)(&input) {
                decoded.set(decoded.get() + 1);
            }
            Ok(())
        })
        .map_err(|failure| format!("{}: {failure}", decoder.name))?;
    Ok(decoded.get())
}

#[test]
fn every_decoder_survives_hostile_input() {
    let long_run = std::env::var("SKYPORT_FUZZ_SECONDS")
        .ok()
        .map(|s| Duration::from_secs(s.parse().expect("SKYPORT_FUZZ_SECONDS is whole seconds")));
    let share = long_run.map(|total| total / u32::try_from(DECODERS.len()).unwrap());
    let mut failures = Vec::new();
    for decoder in DECODERS {
        let started = Instant::now();
        let (mut cases, mut decoded) = (0_u64, 0_u64);
        loop {
            let rng = match share {
                Some(_) => TestRng::from_seed(RngAlgorithm::ChaCha, &rand_seed()),
                None => TestRng::deterministic_rng(RngAlgorithm::ChaCha),
            };
            match fuzz(decoder, SHORT_CASES, rng) {
                Ok(valid) => decoded += u64::from(valid),
                Err(failure) => {
                    failures.push(failure);
                    break;
                }
            }
            cases += u64::from(SHORT_CASES);
            if share.is_none_or(|share| started.elapsed() >= share) {
                break;
            }
        }
        let seconds = started.elapsed().as_secs_f64();
        println!(
            "{:<18} {cases:>10} cases ({decoded:>8} decoded) in {seconds:>7.1} s ({:>8.0}/s)",
            decoder.name,
            cases as f64 / seconds
        );
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// A seed for a long run's random generator.
fn rand_seed() -> [u8; 32] {
    let mut seed = [0_u8; 32];
    for chunk in seed.chunks_mut(8) {
        chunk.copy_from_slice(&fastrand::u64(..).to_le_bytes());
    }
    seed
}

/// Seconds of the coverage-guided fuzzer's run in the tests.
const COVERAGE_GUIDED_SECONDS: u32 = 30;

#[test]
fn the_coverage_guided_fuzzer_finds_nothing_in_a_short_run() {
    let cargo_fuzz = installed_tool("cargo-fuzz/bin/cargo-fuzz");
    // The instrumented build (about 11 min of CPU, the tests' largest part)
    // runs beside the other tests at the lowest priority: it takes what
    // their waits leave of both cores, and their timings do not suffer.
    let output = Command::new("nice")
        .args(["-n", "19"])
        .arg(cargo_fuzz)
        .args(["fuzz", "run", "-s", "none", "decoders", "--"])
        .arg(format!("-max_total_time={COVERAGE_GUIDED_SECONDS}"))
        .current_dir(workspace().join("tests/fuzz"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    let done = stderr
        .lines()
        .find(|line| line.starts_with("Done "))
        .unwrap_or_else(|| panic!("the fuzzer did not finish ({}):\n{stderr}", output.status));
    println!("coverage-guided, {COVERAGE_GUIDED_SECONDS} s: {done}");
    assert!(output.status.success(), "{}:\n{stderr}", output.status);
}
