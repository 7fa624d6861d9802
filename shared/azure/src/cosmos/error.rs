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
    /// A container whose items carry a `ttl` has no default time to live,
    /// so Cosmos DB would ignore the `ttl` and keep its items forever.
    #[error(
        "{key}: {what} has no default time to live, so the items' ttl would be ignored and \
         nothing would expire ({retention}); enable it (defaultTtl = -1) or set \
         cosmos.create_if_missing = true"
    )]
    NoDefaultTtl {
        key: &'static str,
        what: String,
        retention: &'static str,
    },
    /// A container lacks the indexes its queries need (the status
    /// container's listing order, the timers' due order), so Cosmos DB
    /// would refuse them.
    #[error(
        "{key}: {what} lacks the indexes {needs}; add them (see docs/operations.md) or set \
         cosmos.create_if_missing = true"
    )]
    NotIndexed {
        key: &'static str,
        what: String,
        needs: &'static str,
    },
    #[error(
        "{key}: cannot turn on the default time to live of {what}, or give it the indexing it needs"
    )]
    Reconfigure {
        key: &'static str,
        what: String,
        #[source]
        source: BoxError,
    },
}
