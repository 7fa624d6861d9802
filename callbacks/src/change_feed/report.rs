//! What a processor reports (in the process's admin reports): the
//! leases this instance owns and the estimator's last count of each lease's
//! pending changes. Its own file, below both the processor that owns the
//! report and the estimator that fills in its counts.

use serde::Serialize;

/// One lease's pending changes, as the estimator counted them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LeaseEstimate {
    pub lease: String,
    pub owner: Option<String>,
    pub pending: u64,
}

/// What the processor reports: the leases this instance owns and the last estimate.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProcessorReport {
    pub processor: String,
    pub instance: String,
    pub owned: Vec<String>,
    pub pending: u64,
    pub leases: Vec<LeaseEstimate>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}
