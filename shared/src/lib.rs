//! Skyport's shared core: the domain (requests, events, status), configuration,
//! the ports every backend implements, and the adapters behind them.
//!
//! Nothing outside `adapters` sees a storage or SDK type: the gateway and the
//! worker are written against [`ports`] only.

pub mod adapters;
pub mod config;
pub mod event;
pub mod partitioning;
pub mod ports;
pub mod request;
pub mod shutdown;
pub mod status;
pub mod telemetry;
