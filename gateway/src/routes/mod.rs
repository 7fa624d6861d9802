//! The gateway's routes.

pub(crate) mod access;
pub mod deliveries;
pub mod listing;
pub mod operations;
pub mod reschedule;
pub mod resources;
pub mod status_page;
