//! The gateway's routes.

pub(crate) mod access;
pub mod deliveries;
pub mod operations;
