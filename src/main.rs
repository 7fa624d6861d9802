//! `cargo run --release`: the whole Skyport on one machine, data under `./data`.

use std::process::ExitCode;

use skyport_runtime::process::Binary;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const BINARY: Binary = Binary::new(
    "skyport",
    "Skyport all-in-one: gateway, worker and simulated services on the embedded store.",
);

fn main() -> ExitCode {
    BINARY.run(skyport::app::run)
}
