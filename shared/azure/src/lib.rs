//! Skyport on Azure: the stream on Event Hubs (sharded over hubs) and status,
//! dead letters, reservations and leases on Cosmos DB, with Entra ID
//! credentials. The SDKs' types stay inside this crate: the rest of Skyport
//! sees the ports of `skyport-core`.

pub mod cosmos;
pub mod entra;
pub mod eventhubs;
