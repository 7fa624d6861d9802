//! `cargo run --release`: the whole Skyport on one machine, data under `./data`;
//! `skyport plan …`: the capacity planner ([`skyport::plan`]).

use std::process::ExitCode;

use skyport_runtime::process::Binary;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const BINARY: Binary = Binary::new(
    "skyport",
    "Skyport all-in-one: gateway, worker and simulated services on the embedded store.",
);

fn main() -> ExitCode {
    if std::env::args_os()
        .nth(1)
        .is_some_and(|first| first == "plan")
    {
        return skyport::plan::main(std::env::args_os().skip(1));
    }
    BINARY.run(skyport::app::run)
}
