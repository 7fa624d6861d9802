//! The gateway's routes.

pub mod deliveries;
pub mod listing;
pub mod operations;
pub mod reschedule;
pub mod resources;
pub mod status_page;
