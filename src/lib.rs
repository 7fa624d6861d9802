//! The Skyport processes: the all-in-one [`App`] (gateway, worker and the
//! simulated services on the embedded store), the gateway alone and the
//! worker alone, each over the [`Backends`] the settings choose. The binaries
//! in `src/main.rs` and `src/bin/` are this crate's functions run by the
//! shared process runner.

pub mod app;
pub mod backends;
pub mod callback_secret;
pub mod callbacks;
pub mod gateway;
pub mod kafka_entra;
pub mod listing;
pub mod plan;
pub mod worker;

pub use self::app::App;
pub use self::backends::{BackendError, Backends, Store};
