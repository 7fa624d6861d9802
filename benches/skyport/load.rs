//! The load generator: oha, run as its own process so that its work and the
//! server's are accounted apart, with its JSON report parsed.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};

pub(crate) use skyport_tests::tools::OHA_VERSION;

/// One run of the load generator against `POST url`.
#[derive(Debug, Clone)]
pub(crate) struct Load {
    pub(crate) connections: u32,
    /// How long to send (closed or open loop); the run waits for the requests still open.
    pub(crate) duration: Duration,
    /// Open loop at this many requests/s, latency measured from when each was due.
    pub(crate) rate: Option<u32>,
}

/// What one run measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Measured {
    pub(crate) requests: u64,
    pub(crate) seconds: f64,
    pub(crate) requests_per_s: f64,
    pub(crate) p50_ms: f64,
    pub(crate) p99_ms: f64,
    pub(crate) p99_9_ms: f64,
    pub(crate) max_ms: f64,
    /// Every percentile oha reports, `p10` to `p99.99`: the latency chart's
    /// curve (absent from runs before it was kept). oha's histogram is not
    /// kept: 11 equal bins from the fastest answer to the slowest, so one
    /// slow answer puts nearly all the others in the first.
    #[serde(default)]
    pub(crate) percentiles_ms: BTreeMap<String, f64>,
    /// Answers by HTTP status.
    pub(crate) statuses: BTreeMap<String, u64>,
    /// Requests that got no answer, by oha's kind of error.
    pub(crate) errors: BTreeMap<String, u64>,
}

impl Measured {
    pub(crate) fn status(&self, code: &str) -> u64 {
        self.statuses.get(code).copied().unwrap_or(0)
    }
}

/// Requests that were not answered `code`, counted by what they got instead.
pub(crate) fn other_than(
    statuses: &BTreeMap<String, u64>,
    errors: &BTreeMap<String, u64>,
    code: &str,
) -> BTreeMap<String, u64> {
    statuses
        .iter()
        .filter(|(status, _)| status.as_str() != code)
        .map(|(status, n)| (format!("HTTP {status}"), *n))
        .chain(errors.iter().map(|(e, n)| (e.clone(), *n)))
        .collect()
}

/// The oha binary: `$OHA`, else the one installed under `target/tools` (on
/// first use: it is built from crates.io).
pub(crate) fn oha() -> anyhow::Result<PathBuf> {
    if let Some(path) = std::env::var_os("OHA") {
        return Ok(path.into());
    }
    let installed =
        std::panic::catch_unwind(|| skyport_tests::tools::installed_tool("oha/bin/oha"));
    installed.map_err(|_| {
        anyhow::anyhow!("cannot install the load generator oha {OHA_VERSION} (see above)")
    })
}

/// The version `oha --version` reports.
pub(crate) fn oha_version(oha: &PathBuf) -> String {
    Command::new(oha)
        .arg("--version")
        .output()
        .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_owned())
        .unwrap_or_default()
}

/// Runs `load` against `url` with `body` and waits for oha's report.
pub(crate) async fn run(
    oha: PathBuf,
    url: String,
    body: String,
    load: Load,
) -> anyhow::Result<Measured> {
    tokio::task::spawn_blocking(move || run_blocking(&oha, &url, &body, &load))
        .await
        .context("the load generator's thread panicked")?
}

fn run_blocking(oha: &PathBuf, url: &str, body: &str, load: &Load) -> anyhow::Result<Measured> {
    let mut command = Command::new(oha);
    command
        .args(["--no-tui", "--output-format", "json", "-m", "POST"])
        .args(["-T", "application/json", "-d", body])
        .args(["-c", &load.connections.to_string()]);
    // -w: at the deadline, wait for the requests in flight instead of abandoning them.
    command.args(["-z", &format!("{}ms", load.duration.as_millis()), "-w"]);
    if let Some(rate) = load.rate {
        command.args(["-q", &rate.to_string(), "--latency-correction"]);
    }
    command.arg(url);
    let out = command
        .output()
        .with_context(|| format!("cannot run {}", oha.display()))?;
    if !out.status.success() {
        bail!(
            "oha failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let report: Report = serde_json::from_slice(&out.stdout).with_context(|| {
        format!(
            "oha's report is not the JSON expected: {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })?;
    let statuses = report.status_code_distribution;
    let errors = report.error_distribution;
    let requests = statuses.values().chain(errors.values()).sum();
    let ms = |s: Option<f64>| s.unwrap_or(f64::NAN) * 1_000.0;
    let percentile = |name: &str| report.latency_percentiles.get(name).copied().flatten();
    Ok(Measured {
        requests,
        seconds: report.summary.total,
        requests_per_s: report.summary.requests_per_sec,
        p50_ms: ms(percentile("p50")),
        p99_ms: ms(percentile("p99")),
        p99_9_ms: ms(percentile("p99.9")),
        max_ms: ms(report.summary.slowest),
        percentiles_ms: report
            .latency_percentiles
            .iter()
            .filter_map(|(name, s)| Some((name.clone(), (*s)? * 1_000.0)))
            .collect(),
        statuses,
        errors,
    })
}

/// The parts of oha's `--output-format json` report used here.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Report {
    summary: Summary,
    /// Seconds by percentile (`p10` … `p99.99`); null when nothing was answered.
    latency_percentiles: BTreeMap<String, Option<f64>>,
    status_code_distribution: BTreeMap<String, u64>,
    error_distribution: BTreeMap<String, u64>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Summary {
    total: f64,
    slowest: Option<f64>,
    requests_per_sec: f64,
}
