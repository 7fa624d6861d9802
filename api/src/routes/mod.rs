//! The gateway's routes.

pub mod deliveries;
pub mod status_page;
