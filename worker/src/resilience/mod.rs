//! How the workflow talks to its services over HTTP and survives them: the
//! one client every step calls through ([`client`], over HTTP/2 with prior
//! knowledge through [`h2c`] when configured), what an answer means
//! ([`classify`]), how long to wait before trying again ([`backoff`]), and a
//! circuit breaker per service that pauses intake while its service is down
//! ([`breaker`]).

pub mod backoff;
pub mod breaker;
pub(crate) mod classify;
pub mod client;
mod h2c;
