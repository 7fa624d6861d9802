//! Why the Cosmos DB store did not open.

use skyport_core::ports::BoxError;

/// Why the Cosmos DB store did not open.
#[derive(Debug, thiserror::Error)]
pub enum CosmosOpenError {
    #[error("cosmos.endpoint is not a Cosmos DB account endpoint: {0}")]
    Endpoint(String),
    #[error("no Entra ID credential could be built (cosmos.auth = \"entra\")")]
    Credential(#[source] BoxError),
    #[error("cannot reach the Cosmos DB account")]
    Connect(#[source] BoxError),
    #[error("{what} does not exist and cosmos.create_if_missing is false")]
    Missing { what: String },
    #[error("{key}: the throughput control group cannot start")]
    ThroughputControl {
        key: String,
        #[source]
        source: BoxError,
    },
    #[error("cannot create {what}")]
    Create {
        what: String,
        #[source]
        source: BoxError,
    },
}
