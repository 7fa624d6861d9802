//! The tests of the `skyport` package's binaries as processes (killed,
//! misconfigured, traced), and of the worker's admin listener. No test here
//! runs a system in this process but the admin listener's, so the metrics
//! registry it scrapes is its own.

mod bomb;
mod config_errors;
mod crash_recovery;
mod operability;
mod secrets;
mod telemetry;
