//! Skyport's domain and ports: the request a client posts, the events that
//! travel through the stream, the status document a client polls, how keys
//! map to partitions, and the traits every backend implements.
//!
//! Light on purpose: no SDK, no storage engine, no runtime. The gateway and
//! the worker are written against this crate and `skyport-runtime` only;
//! the adapter crates implement [`ports`].

pub mod error;
pub mod event;
pub mod lane;
pub mod partitioning;
pub mod ports;
pub mod request;
pub mod status;
