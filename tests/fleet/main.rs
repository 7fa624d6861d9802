//! The fleet as the Helm chart installs it: `skyport-gateway` and
//! `skyport-worker` as separate processes on a shared stream (Kafka, or Event
//! Hubs over two hubs) and one Cosmos DB account (the SDK's emulator served
//! over HTTP), the simulated services in a process of their own; processes
//! killed, stopped, restarted and added under load, and what happened counted.
//!
//! `cargo test --test fleet` runs every scenario on both streams, one at a
//! time (no harness: nothing else runs beside them); `cargo test --test fleet
//! -- kafka` or `-- eventhubs/killed` runs the scenarios whose name contains
//! the argument. The same executable serves the shared servers
//! (`servers::ROLE`). The processes and servers are `skyport_tests::fleet`,
//! which the benchmark's fleet phases share.

#![allow(clippy::unwrap_used)]

mod load;
mod scenarios;

use skyport_tests::fleet::{servers, shape};

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some(servers::ROLE) {
        return servers::serve(&args[1..]);
    }
    let filter = args.iter().find(|a| !a.starts_with('-')).cloned();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("an async runtime");
    runtime.block_on(scenarios::run(filter.as_deref()))
}
