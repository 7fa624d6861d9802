//! Skyport's shared core: the domain (requests, events, status), configuration,
//! the ports every backend implements, and the adapters behind them.
//!
//! Nothing outside `adapters` sees a storage or SDK type: the gateway and the
//! worker are written against [`ports`] only.

pub mod adapters;
pub mod config;
pub mod event;
pub mod metrics;
pub mod partitioning;
pub mod ports;
pub mod request;
pub mod shutdown;
pub mod status;
pub mod telemetry;

/// Every binary that links Skyport (gateway, worker, all-in-one, benchmark,
/// tests) allocates with mimalloc: on the ingest path glibc's malloc and free
/// were 13 % of the profile, and its arenas kept what a burst had freed.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
