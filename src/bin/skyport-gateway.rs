//! `skyport-gateway`: accepts delivery requests and serves their status.

use std::process::ExitCode;

use skyport_runtime::process::Binary;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const BINARY: Binary = Binary::new(
    "skyport-gateway",
    "Skyport gateway: accepts delivery requests and serves their status.",
);

fn main() -> ExitCode {
    BINARY.run(skyport::gateway::run)
}
