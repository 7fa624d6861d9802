//! [`PlanError`]: why a plan cannot be made, and the exit code of each.

use std::path::PathBuf;

use skyport_runtime::config::EXIT_CONFIG;

use super::limits::MAX_WORKERS;

/// Why a plan cannot be made. Every one is the caller's input (exit 64),
/// but a Helm values file that cannot be written (exit 1).
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// A flag's value is out of its range.
    #[error("{flag}: {reason}")]
    Invalid {
        /// The flag (or the field, for an input no flag sets).
        flag: &'static str,
        /// What is wrong with its value.
        reason: String,
    },
    /// The costs could not be read, and no flag gave them.
    #[error("{path}: {reason}; run `cargo bench --bench skyport` to measure them, or pass {flags}")]
    Costs {
        /// The benchmark file.
        path: PathBuf,
        /// Why no figure came from it.
        reason: String,
        /// The flags that give the costs instead.
        flags: &'static str,
    },
    /// The stream would not keep the oldest event of a spike until it is read.
    #[error(
        "--retention-hours: the stream keeps events {have} h, but a spike's first events wait until its backlog is drained, {need:.2} h after it started"
    )]
    RetentionTooShort {
        /// `--retention-hours`.
        have: f64,
        /// The spike and its drain, in hours.
        need: f64,
    },
    /// The target needs an absurd number of workers.
    #[error(
        "the target needs more than {MAX_WORKERS} workers at {per_worker:.0} workflows/s each: check --worker-cpu-us and --cores-per-worker"
    )]
    TooManyWorkers {
        /// What one worker completes a second.
        per_worker: f64,
    },
    /// The README's request could not be encoded as an event (a bug).
    #[error("the README's request does not decode as a delivery request: {0}")]
    Event(String),
    /// The Helm values file could not be written.
    #[error("--helm-values {path}: {source}")]
    Write {
        /// `--helm-values`.
        path: PathBuf,
        /// Why it could not be written.
        #[source]
        source: std::io::Error,
    },
}

impl PlanError {
    /// The process's exit code for it.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Write { .. } | Self::Event(_) => 1,
            Self::Invalid { .. }
            | Self::Costs { .. }
            | Self::RetentionTooShort { .. }
            | Self::TooManyWorkers { .. } => EXIT_CONFIG,
        }
    }
}
