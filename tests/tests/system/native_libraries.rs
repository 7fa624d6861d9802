//! Every crate that links a C library builds it from source with what a bare
//! machine has (a C compiler, make, perl): no pkg-config, no `-dev` package,
//! no cmake. The crates that declare `links` in `cargo metadata` are checked
//! against [`NATIVE`] in the dependency graph each workspace member really
//! builds (`cargo tree`, per member, so that no member leans on another's
//! features), and in the fuzzing workspace's: a crate not listed, or a listed
//! one without a feature it must have or with one it must not, fails the test
//! naming it and the path that brings it in.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use serde_json::Value;
use skyport_tests::workspace;

/// A crate allowed to link a native library, and how it must build it.
struct Native {
    name: &'static str,
    /// Features without which it would look for the library on the system.
    required: &'static [&'static str],
    /// Features that need something a bare machine lacks.
    forbidden: &'static [&'static str],
}

/// The crates allowed to declare `links`.
const NATIVE: &[Native] = &[
    // OpenSSL 3 from openssl-src, one copy for native-tls (reqwest, the
    // Cosmos SDK, fe2o3-amqp) and librdkafka; bindgen would need libclang.
    Native {
        name: "openssl-sys",
        required: &["vendored"],
        forbidden: &["bindgen"],
    },
    // librdkafka by its configure script (cmake-build needs cmake), against
    // the vendored OpenSSL, a zlib built from source and zstd-sys.
    Native {
        name: "rdkafka-sys",
        required: &["ssl-vendored", "libz-static"],
        forbidden: &[
            "cmake-build",
            "cmake_build",
            "dynamic-linking",
            "dynamic_linking",
            "zstd-pkg-config",
            "gssapi",
            "gssapi-vendored",
            "sasl",
            "curl",
            "curl-static",
            "external-lz4",
            "external_lz4",
        ],
    },
    // zlib from its bundled sources rather than the system's.
    Native {
        name: "libz-sys",
        required: &["static"],
        forbidden: &["zlib-ng"],
    },
    // zstd from its bundled sources (with cc).
    Native {
        name: "zstd-sys",
        required: &[],
        forbidden: &["pkg-config"],
    },
    // mimalloc from its bundled sources (with cc).
    Native {
        name: "libmimalloc-sys",
        required: &[],
        forbidden: &[],
    },
];

/// `cargo ARGS…` in `dir`; panics with what it printed when it fails.
fn cargo(dir: &Path, args: &[&str]) -> String {
    let program = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let output = Command::new(&program)
        .current_dir(dir)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot start cargo {args:?}: {e}"));
    assert!(
        output.status.success(),
        "cargo {args:?} in {} failed ({}):\n{}",
        dir.display(),
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// The platform the build runs on, as rustc names it.
fn host() -> String {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let output = Command::new(rustc).arg("-vV").output().unwrap();
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .find_map(|line| line.strip_prefix("host: "))
        .unwrap()
        .to_owned()
}

/// The names of the crates in the workspace at `dir` that declare `links`,
/// and the workspace's members.
fn metadata(dir: &Path, host: &str) -> (BTreeSet<String>, Vec<String>) {
    let metadata: Value = serde_json::from_str(&cargo(
        dir,
        &[
            "metadata",
            "--format-version",
            "1",
            "--locked",
            "--filter-platform",
            host,
        ],
    ))
    .unwrap();
    let packages = metadata["packages"].as_array().unwrap();
    let links = packages
        .iter()
        .filter(|p| p["links"].is_string())
        .map(|p| p["name"].as_str().unwrap().to_owned())
        .collect();
    let members = metadata["workspace_members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|id| {
            let package = packages.iter().find(|p| p["id"] == *id).unwrap();
            package["name"].as_str().unwrap().to_owned()
        })
        .collect();
    (links, members)
}

/// Each crate of `member`'s build graph with its features and the first path
/// that reaches it (`member → … → crate`).
fn build_graph(dir: &Path, member: &str) -> BTreeMap<String, (BTreeSet<String>, String)> {
    let tree = cargo(
        dir,
        &[
            "tree",
            "--locked",
            "--package",
            member,
            "--edges",
            "normal,build,dev",
            "--prefix",
            "depth",
            "--format",
            "{p}|{f}",
        ],
    );
    let mut graph = BTreeMap::new();
    let mut path: Vec<String> = Vec::new();
    for line in tree.lines() {
        let digits = line.find(|c: char| !c.is_ascii_digit()).unwrap_or(0);
        let Ok(depth) = line[..digits].parse::<usize>() else {
            continue;
        };
        let (package, features) = line[digits..].split_once('|').unwrap();
        let name = package.split(' ').next().unwrap().to_owned();
        path.truncate(depth);
        path.push(name.clone());
        let features = features
            .trim_end_matches(" (*)")
            .split(',')
            .filter(|f| !f.is_empty())
            .map(str::to_owned)
            .collect();
        graph
            .entry(name)
            .or_insert_with(|| (features, path.join(" → ")));
    }
    graph
}

/// What is wrong with the native crates of each member of the workspace at `dir`.
fn problems(dir: &Path, host: &str) -> Vec<String> {
    let (links, members) = metadata(dir, host);
    let mut problems = Vec::new();
    for member in members {
        for (name, (features, path)) in build_graph(dir, &member) {
            if !links.contains(&name) {
                continue;
            }
            let Some(native) = NATIVE.iter().find(|n| n.name == name) else {
                problems.push(format!(
                    "{name} links a native library and is not in NATIVE (build it from source, \
                     then list it with the features that make it so): {path}"
                ));
                continue;
            };
            for feature in native.required {
                if !features.contains(*feature) {
                    problems.push(format!(
                        "{name} lacks the feature {feature} (it would look for the library on \
                         the system): {path}"
                    ));
                }
            }
            for feature in native.forbidden {
                if features.contains(*feature) {
                    problems.push(format!(
                        "{name} has the feature {feature}, which needs what a bare machine \
                         lacks: {path}"
                    ));
                }
            }
        }
    }
    problems
}

/// [`problems`] of another workspace, each named by its directory.
fn problems_in(dir: &Path, host: &str) -> Vec<String> {
    problems(dir, host)
        .into_iter()
        .map(|problem| format!("{}: {problem}", dir.display()))
        .collect()
}

#[test]
fn every_native_library_is_built_from_source_in_every_member() {
    let host = host();
    let root = workspace();
    let mut problems = problems(&root, &host);
    problems.extend(problems_in(&root.join("tests/fuzz"), &host));
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Writes a crate `name` under `root` with `manifest` after its package
/// line, and the build script a `links` key needs.
fn scratch_crate(root: &Path, name: &str, manifest: &str) {
    let dir = root.join(name);
    std::fs::create_dir_all(dir.join("src")).unwrap();
    std::fs::write(
        dir.join("Cargo.toml"),
        format!(
            "[package]\nname = \"{name}\"\nversion = \"0.1.0\"\nedition = \"2024\"\n{manifest}"
        ),
    )
    .unwrap();
    std::fs::write(dir.join("src/lib.rs"), "").unwrap();
    std::fs::write(dir.join("build.rs"), "fn main() {}\n").unwrap();
}

#[test]
fn an_unlisted_native_crate_and_a_forbidden_feature_are_named_with_their_path() {
    let root = tempfile::tempdir().unwrap();
    scratch_crate(
        root.path(),
        "app",
        "[workspace]\n[dependencies]\nmiddle = { path = \"../middle\" }\n",
    );
    scratch_crate(
        root.path(),
        "middle",
        "[dependencies]\n\
         rdkafka-sys = { path = \"../rdkafka-sys\", features = [\"ssl-vendored\", \"libz-static\", \"cmake-build\"] }\n\
         libpq-sys = { path = \"../libpq-sys\" }\n",
    );
    scratch_crate(
        root.path(),
        "rdkafka-sys",
        "links = \"rdkafka\"\n[features]\nssl-vendored = []\nlibz-static = []\ncmake-build = []\n",
    );
    scratch_crate(root.path(), "libpq-sys", "links = \"pq\"\n");
    let app = root.path().join("app");
    cargo(&app, &["generate-lockfile", "--offline"]);

    let problems = problems(&app, &host());
    assert_eq!(
        problems,
        [
            "libpq-sys links a native library and is not in NATIVE (build it from source, \
             then list it with the features that make it so): app → middle → libpq-sys",
            "rdkafka-sys has the feature cmake-build, which needs what a bare machine lacks: \
             app → middle → rdkafka-sys",
        ]
    );
}
