//! The gateway's routes.

pub mod deliveries;
