//! The gateway's routes.

pub mod deliveries;
pub mod resources;
pub mod status_page;
