//! `skyport-simulator`: the five simulated backend services alone, on
//! `simulator.listen` (`--listen`; 127.0.0.1:7070 unless set).

use std::process::ExitCode;

use skyport_runtime::process::Binary;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const BINARY: Binary = Binary::new(
    "skyport-simulator",
    "Skyport's five simulated backend services; their counters at /_sim/stats.",
)
.listening_on("simulator.listen")
.with_defaults(&[("simulator.listen", "127.0.0.1:7070")]);

fn main() -> ExitCode {
    BINARY.run(|settings, shutdown| {
        skyport_simulator::serve(
            settings.simulator,
            settings.gateway.listen_backlog,
            shutdown,
        )
    })
}
