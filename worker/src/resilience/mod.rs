//! How the workflow talks to its services over HTTP and survives them: the
//! one client every step calls through ([`client`], over HTTP/2 with prior
//! knowledge through [`h2c`] when configured), what an answer means
//! ([`classify`]; the waits between retries are `skyport_runtime::backoff`'s),
//! and a circuit breaker per service that pauses intake while its service is
//! down ([`breaker`]).

pub mod breaker;
pub(crate) mod classify;
pub mod client;
mod h2c;
