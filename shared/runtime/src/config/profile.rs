//! `profile`: the family of backends that unset keys default to.

use serde::Deserialize;

/// A family of backends: what a setting left unset defaults to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum Profile {
    /// Everything on this machine, in the embedded store.
    #[default]
    Embedded,
    /// Azure: status, checkpoints and dead letters in Cosmos DB.
    Azure,
    /// The stream on Kafka; status in the embedded store unless `store.backend` says otherwise.
    Kafka,
}
