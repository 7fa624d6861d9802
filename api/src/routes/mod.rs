//! The gateway's routes.

pub mod deliveries;
pub mod health;
