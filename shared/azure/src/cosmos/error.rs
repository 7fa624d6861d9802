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
    /// The status container lacks the composite indexes listing orders by,
    /// so Cosmos DB would refuse every listing.
    #[error(
        "{key}: {what} lacks the composite indexes a listing needs ((createdMs DESC, id DESC), \
         alone and after ownerId and principal), so every listing would fail; add them (see \
         docs/operations.md) or set cosmos.create_if_missing = true"
    )]
    NotIndexed { key: &'static str, what: String },
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
