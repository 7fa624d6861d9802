//! `skyport-worker`: runs the delivery workflow for every accepted request.

use std::process::ExitCode;

use skyport_runtime::process::Binary;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const BINARY: Binary = Binary::new(
    "skyport-worker",
    "Skyport worker: runs the delivery workflow for every accepted request.",
)
.listening_on("worker.listen");

fn main() -> ExitCode {
    BINARY.run(skyport::worker::run)
}
