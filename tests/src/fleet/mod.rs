//! The fleet's processes and servers: the Helm chart's shapes rendered into
//! each process's arguments ([`shape`]), the shared servers as processes of
//! their own ([`servers`]), and gateways and workers started, stopped and
//! counted ([`Fleet`]). The fleet test drives it through its scenarios; the
//! benchmark's fleet phases (`benches/skyport/phases/fleet/`) measure it.
//! Like a test, it panics on what it does not expect.

mod members;
pub mod servers;
pub mod shape;

pub use members::{
    Fleet, HUB_PARTITIONS, HUBS, KAFKA_PARTITIONS, LEASES, Logs, Member, Options, Pool, even,
};
