//! Azure Cosmos DB: the status store, the Event Hubs checkpoint and ownership
//! store, and dead letters.

pub mod bulk;
