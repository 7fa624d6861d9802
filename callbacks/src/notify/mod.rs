//! The callback notifier's sending half: a delivery's terminal status is
//! POSTed to the `callbackUrl` its client gave, signed as Standard Webhooks
//! specifies so that the receiver can check where it came from.
//!
//! [`sign`] derives each principal's secret from the master secrets and makes
//! the `webhook-id` and `webhook-signature`; [`client`] sends one POST within
//! the address policy (a client's URL must not reach into our network) and
//! the concurrency limits, and says whether to try again, its names resolved
//! by the [`resolver`] to permitted addresses only; the [`Notifier`]
//! is the change-feed handler that decides what to send, retries, and
//! records the outcome.

pub(crate) mod client;
mod notifier;
mod resolver;
pub(crate) mod sign;

pub use self::notifier::Notifier;
pub use self::sign::MasterSecrets;
