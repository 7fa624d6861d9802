//! The container images (`docker/*.Dockerfile`), checked as far as a machine
//! without a container engine can: each Dockerfile is parsed (continuation lines
//! joined, instructions split into stages) and must build with a multi-stage
//! `cargo build --release --locked -p PACKAGE --bin BINARY` in a Debian 12
//! (bookworm) Rust image, where BINARY really is a binary target of PACKAGE
//! (`cargo metadata`), and run it from a distroless `nonroot` Debian 12 image as
//! a numeric non-root user, from `/usr/local/bin/BINARY` with an exec-form
//! `ENTRYPOINT`, listening on 0.0.0.0 at a port it `EXPOSE`s. Every binary of
//! the workspace but the build tool `skyport-openapi` has an image, and the
//! build context leaves out `target/` and `.git`.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// Binary targets that are build tools, not services: no image.
const NO_IMAGE: [&str; 1] = ["skyport-openapi"];
/// The uid and gid the images run as: distroless's `nonroot`.
const NONROOT: &str = "65532:65532";

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// One instruction: its keyword (upper case) and the rest of its (joined) line.
#[derive(Debug, Clone)]
struct Instruction {
    keyword: String,
    args: String,
}

/// One build stage: the image it starts `FROM`, its name and its instructions.
#[derive(Debug)]
struct Stage {
    image: String,
    name: Option<String>,
    instructions: Vec<Instruction>,
}

impl Stage {
    fn all(&self, keyword: &str) -> impl Iterator<Item = &Instruction> {
        self.instructions
            .iter()
            .filter(move |i| i.keyword == keyword)
    }
}

/// Parses a Dockerfile into stages: comments and blank lines dropped, lines ending in `\` joined.
fn parse(text: &str) -> Vec<Stage> {
    let mut logical = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if current.is_empty() && (trimmed.is_empty() || trimmed.starts_with('#')) {
            continue;
        }
        if trimmed.starts_with('#') {
            continue; // a comment inside a continued instruction
        }
        match trimmed.strip_suffix('\\') {
            Some(part) => {
                current.push_str(part.trim_end());
                current.push(' ');
            }
            None => {
                current.push_str(trimmed);
                logical.push(std::mem::take(&mut current));
            }
        }
    }
    assert!(current.is_empty(), "the last instruction ends with a \\");
    let mut stages: Vec<Stage> = Vec::new();
    for line in logical {
        let (keyword, args) = line.split_once(char::is_whitespace).unwrap_or((&line, ""));
        let instruction = Instruction {
            keyword: keyword.to_ascii_uppercase(),
            args: args.trim().to_owned(),
        };
        if instruction.keyword == "FROM" {
            let words: Vec<&str> = instruction
                .args
                .split_whitespace()
                .filter(|w| !w.starts_with("--"))
                .collect();
            let name = match words.as_slice() {
                [_] => None,
                [_, as_, name] if as_.eq_ignore_ascii_case("as") => Some((*name).to_owned()),
                _ => panic!("cannot read FROM {}", instruction.args),
            };
            stages.push(Stage {
                image: words[0].to_owned(),
                name,
                instructions: Vec::new(),
            });
        } else {
            stages
                .last_mut()
                .unwrap_or_else(|| panic!("{} before any FROM", instruction.keyword))
                .instructions
                .push(instruction);
        }
    }
    stages
}

/// The arguments of an exec-form (JSON array) `ENTRYPOINT` or `CMD`.
fn exec_form(instruction: &Instruction) -> Vec<String> {
    serde_json::from_str(&instruction.args).unwrap_or_else(|e| {
        panic!(
            "{} {} is not in exec form (a JSON array): {e}",
            instruction.keyword, instruction.args
        )
    })
}

/// `KEY=VALUE` pairs of an `ENV` instruction (values without spaces or quotes, as ours are).
fn env_pairs(instruction: &Instruction) -> Vec<(String, String)> {
    let words: Vec<&str> = instruction.args.split_whitespace().collect();
    if !words[0].contains('=') {
        // The legacy form: ENV KEY VALUE.
        return vec![(words[0].to_owned(), words[1..].join(" "))];
    }
    words
        .iter()
        .map(|w| {
            let (k, v) = w.split_once('=').unwrap();
            (k.to_owned(), v.trim_matches('"').to_owned())
        })
        .collect()
}

/// The package and binary a `cargo build` in `RUN` names, and its flags.
struct CargoBuild {
    package: String,
    binary: String,
    flags: BTreeSet<String>,
}

/// Finds the `cargo build` command among the `RUN` instructions of `stage` (the words from
/// `cargo build` to the next `&&`, `;` or `|`).
fn cargo_build(stage: &Stage) -> Option<CargoBuild> {
    for run in stage.all("RUN") {
        let words: Vec<&str> = run.args.split_whitespace().collect();
        let Some(start) = words.windows(2).position(|w| w == ["cargo", "build"]) else {
            continue;
        };
        let command: Vec<&str> = words[start + 2..]
            .iter()
            .take_while(|w| !matches!(**w, "&&" | ";" | "|" | "||"))
            .copied()
            .collect();
        let (mut package, mut binary, mut flags) = (None, None, BTreeSet::new());
        let mut i = 0;
        while i < command.len() {
            let word = command[i];
            let value = |prefix: &str| -> Option<String> {
                if word == prefix {
                    command.get(i + 1).map(|v| (*v).to_owned())
                } else {
                    word.strip_prefix(&format!("{prefix}=")).map(str::to_owned)
                }
            };
            if let Some(p) = value("-p").or_else(|| value("--package")) {
                package = Some(p);
                i += usize::from(!word.contains('='));
            } else if let Some(b) = value("--bin") {
                binary = Some(b);
                i += usize::from(!word.contains('='));
            } else {
                flags.insert(word.to_owned());
            }
            i += 1;
        }
        return Some(CargoBuild {
            package: package.expect("cargo build names its package (-p)"),
            binary: binary.expect("cargo build names its binary (--bin)"),
            flags,
        });
    }
    None
}

/// Binary targets of the workspace's packages, by binary name: the package that has it.
fn workspace_binaries() -> BTreeMap<String, String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let output = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .arg("--manifest-path")
        .arg(workspace().join("Cargo.toml"))
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let metadata: Value = serde_json::from_slice(&output.stdout).unwrap();
    let mut binaries = BTreeMap::new();
    for package in metadata["packages"].as_array().unwrap() {
        for target in package["targets"].as_array().unwrap() {
            if target["kind"]
                .as_array()
                .unwrap()
                .iter()
                .any(|k| k == "bin")
            {
                let previous = binaries.insert(
                    target["name"].as_str().unwrap().to_owned(),
                    package["name"].as_str().unwrap().to_owned(),
                );
                assert!(previous.is_none(), "two binaries named {}", target["name"]);
            }
        }
    }
    binaries
}

fn dockerfiles() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(workspace().join("docker"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(".Dockerfile"))
        .collect();
    files.sort();
    files
}

/// Checks one Dockerfile; returns the binary it builds.
fn check(path: &Path, binaries: &BTreeMap<String, String>) -> String {
    let file = path.file_name().unwrap().to_string_lossy().into_owned();
    let stages = parse(&std::fs::read_to_string(path).unwrap());
    assert!(
        stages.len() >= 2,
        "{file}: {} stage(s); the build and the runtime are separate stages",
        stages.len()
    );
    let (runtime, builders) = stages.split_last().unwrap();

    // The build: cargo, release, locked, in a Debian 12 Rust image (the runtime's glibc).
    let (builder, build) = builders
        .iter()
        .find_map(|s| cargo_build(s).map(|b| (s, b)))
        .unwrap_or_else(|| panic!("{file}: no stage runs cargo build"));
    assert!(
        builder.image.starts_with("rust:") && builder.image.ends_with("-bookworm"),
        "{file}: builds in {}, not a Debian 12 (bookworm) Rust image",
        builder.image
    );
    for flag in ["--release", "--locked"] {
        assert!(
            build.flags.contains(flag),
            "{file}: cargo build without {flag}"
        );
    }
    assert_eq!(
        binaries.get(&build.binary),
        Some(&build.package),
        "{file}: --bin {} is not a binary of package {} (the workspace's: {binaries:?})",
        build.binary,
        build.package
    );
    assert!(
        !NO_IMAGE.contains(&build.binary.as_str()),
        "{file}: {} is a build tool",
        build.binary
    );

    // The runtime: distroless, nonroot, Debian 12.
    let (image, tag) = runtime
        .image
        .rsplit_once(':')
        .unwrap_or((&runtime.image, ""));
    assert!(
        image.starts_with("gcr.io/distroless/") && image.ends_with("-debian12"),
        "{file}: the final stage runs on {}, not a Debian 12 distroless image",
        runtime.image
    );
    assert!(
        tag.split('@')
            .next()
            .unwrap()
            .split('-')
            .any(|t| t == "nonroot"),
        "{file}: the final stage's image {} is not a nonroot variant",
        runtime.image
    );
    let users: Vec<_> = runtime.all("USER").collect();
    assert_eq!(users.len(), 1, "{file}: one USER in the final stage");
    let user = &users[0].args;
    let ids: Vec<&str> = user.split(':').collect();
    assert!(
        ids.iter()
            .all(|id| id.parse::<u32>().is_ok_and(|id| id != 0)),
        "{file}: USER {user} is not a numeric non-root uid[:gid]"
    );
    assert_eq!(user, NONROOT, "{file}: the distroless nonroot user");

    // The binary: copied from the build stage to /usr/local/bin and run from there.
    let installed = format!("/usr/local/bin/{}", build.binary);
    let builder_name = builder.name.as_deref().unwrap_or("0");
    assert!(
        runtime.all("COPY").any(|copy| {
            let words: Vec<&str> = copy.args.split_whitespace().collect();
            words.contains(&format!("--from={builder_name}").as_str())
                && words.last() == Some(&installed.as_str())
        }),
        "{file}: no COPY --from={builder_name} … {installed}"
    );
    let entrypoints: Vec<_> = runtime.all("ENTRYPOINT").collect();
    assert_eq!(entrypoints.len(), 1, "{file}: one ENTRYPOINT");
    assert_eq!(
        exec_form(entrypoints[0]),
        std::slice::from_ref(&installed),
        "{file}: ENTRYPOINT runs the binary alone"
    );

    // It listens on every address, at a port it exposes.
    let exposed: BTreeSet<u16> = runtime
        .all("EXPOSE")
        .flat_map(|e| {
            e.args
                .split_whitespace()
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .map(|p| p.trim_end_matches("/tcp").parse().unwrap())
        .collect();
    let mut listens: Vec<String> = runtime
        .all("ENV")
        .flat_map(env_pairs)
        .filter(|(k, _)| k.starts_with("SKYPORT__") && k.ends_with("__LISTEN"))
        .map(|(_, v)| v)
        .collect();
    for cmd in runtime.all("CMD") {
        let args = exec_form(cmd);
        if let Some(i) = args.iter().position(|a| a == "--listen") {
            listens.push(args[i + 1].clone());
        }
    }
    assert!(!listens.is_empty(), "{file}: no listen address is set");
    for listen in &listens {
        let addr: std::net::SocketAddr = listen.parse().unwrap();
        assert!(
            addr.ip().is_unspecified(),
            "{file}: listens on {listen}, unreachable from outside the container"
        );
        assert!(
            exposed.contains(&addr.port()),
            "{file}: listens on {listen} but exposes {exposed:?}"
        );
    }
    build.binary
}

#[test]
fn every_service_binary_has_a_distroless_nonroot_image() {
    let binaries = workspace_binaries();
    let mut imaged = BTreeMap::new();
    for path in dockerfiles() {
        let binary = check(&path, &binaries);
        println!("{}: {binary}", path.display());
        if let Some(other) = imaged.insert(binary.clone(), path.clone()) {
            panic!(
                "{binary} has two images: {} and {}",
                other.display(),
                path.display()
            );
        }
    }
    let wanted: BTreeSet<&String> = binaries
        .keys()
        .filter(|b| !NO_IMAGE.contains(&b.as_str()))
        .collect();
    let have: BTreeSet<&String> = imaged.keys().collect();
    assert_eq!(
        have, wanted,
        "each binary but {NO_IMAGE:?} has one docker/*.Dockerfile"
    );
}

#[test]
fn the_all_in_one_keeps_its_data_in_a_volume() {
    let stages =
        parse(&std::fs::read_to_string(workspace().join("docker/skyport.Dockerfile")).unwrap());
    let runtime = stages.last().unwrap();
    assert!(
        runtime.all("VOLUME").any(|v| v
            .args
            .split_whitespace()
            .any(|d| d.trim_matches(|c| c == '[' || c == ']' || c == '"') == "/data")),
        "VOLUME /data"
    );
    let env: BTreeMap<String, String> = runtime.all("ENV").flat_map(env_pairs).collect();
    assert_eq!(
        env.get("SKYPORT__EMBEDDED__DATA_DIR").map(String::as_str),
        Some("/data")
    );
    // A fresh volume takes the image directory's owner: the runtime user's, or it could not write.
    assert!(
        runtime
            .all("COPY")
            .any(|c| c.args.contains(&format!("--chown={NONROOT}"))
                && c.args.split_whitespace().last() == Some("/data")),
        "/data is owned by {NONROOT}"
    );
}

#[test]
fn the_build_context_leaves_out_build_output_and_history() {
    let ignore = std::fs::read_to_string(workspace().join(".dockerignore")).unwrap();
    let patterns: BTreeSet<&str> = ignore
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| l.trim_end_matches('/'))
        .collect();
    for needed in ["target", ".git", "data"] {
        assert!(
            patterns.contains(needed),
            ".dockerignore does not leave out {needed}"
        );
    }
    // What the build needs must stay in: every workspace member's manifest and the lock file.
    for kept in [
        "Cargo.toml",
        "Cargo.lock",
        "shared",
        "gateway",
        "worker",
        "callbacks",
        "tests",
        "src",
        "benches",
    ] {
        assert!(!patterns.contains(kept), ".dockerignore leaves out {kept}");
    }
}
