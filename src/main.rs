//! `cargo run --release`: the whole Skyport on one machine, data under `./data`;
//! `skyport plan …`: the capacity planner ([`skyport::plan`]);
//! `skyport callbacks secret PRINCIPAL`: a principal's callback secret
//! ([`skyport::callback_secret`]).

use std::process::ExitCode;

use skyport_runtime::process::Binary;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const BINARY: Binary = Binary::new(
    "skyport",
    "Skyport all-in-one: gateway, worker and simulated services on the embedded store.",
);

fn main() -> ExitCode {
    match std::env::args_os().nth(1) {
        Some(first) if first == "plan" => skyport::plan::main(std::env::args_os().skip(1)),
        Some(first) if first == "callbacks" => {
            skyport::callback_secret::main(std::env::args_os().skip(1))
        }
        _ => BINARY.run(skyport::app::run),
    }
}
