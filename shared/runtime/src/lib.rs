//! What every Skyport process shares besides the domain: its configuration,
//! telemetry (logs, traces, and metrics over OTLP), metrics, the shutdown
//! signal, the process runner every binary's `main` is, the HTTP server every
//! listener runs, the admin routes every server mounts, and how a retry waits
//! ([`backoff`]) and a failure is told ([`error_chain`]).
//!
//! No storage engine and no cloud SDK: adapters depend on this crate, never
//! the other way round.

pub mod admin;
pub mod backoff;
pub mod balance;
pub mod config;
pub mod dashboard;
pub mod destination;
pub mod error_chain;
pub mod foreground;
pub mod host;
pub mod http;
pub mod locks;
pub mod metrics;
mod otlp;
pub mod priority;
pub mod problem;
pub mod process;
pub mod shutdown;
pub mod tasks;
pub mod telemetry;
