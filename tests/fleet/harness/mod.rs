//! The fleet's processes and servers: the Helm chart's shapes rendered into
//! each process's arguments ([`shape`]), the shared servers as processes of
//! their own ([`servers`]), and gateways and workers started, stopped and
//! counted ([`fleet`]). The fleet test drives it through its scenarios; the
//! benchmark's fleet phases (`benches/skyport/fleets.rs`) measure it.
//! Like a test, it panics on what it does not expect.

#![allow(clippy::unwrap_used)]

pub(crate) mod fleet;
pub(crate) mod servers;
pub(crate) mod shape;
