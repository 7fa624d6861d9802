//! `[telemetry]`: how log lines are written; traces are switched on by the
//! standard `OTEL_*` variables instead.

use serde::Deserialize;

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// One readable line per event (colours on a terminal).
    Human,
    /// One JSON object per line, for a log pipeline.
    Json,
}

/// Logs; traces are switched on by the standard `OTEL_*` variables instead.
#[derive(Debug, Clone, Default, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields)]
pub struct TelemetrySettings {
    /// Unset: the profile's (embedded → human, azure → json).
    pub log_format: Option<LogFormat>,
}
