//! The Cosmos DB store on the SDK's in-memory emulator, for tests (feature
//! `cosmos-emulator`). The emulator is an internal SDK API, pinned with the
//! SDK; it runs the whole client pipeline and replaces only the HTTP layer.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use azure_core::credentials::Secret;
use azure_core::http::{Request, Url};
use azure_data_cosmos::options::{Region, RoutingStrategy};
use azure_data_cosmos::{
    AccountEndpoint, AccountReference, CosmosClientBuilder, CosmosRuntimeBuilder,
};
use azure_data_cosmos_driver::in_memory_emulator::{
    InMemoryEmulatorHttpClient, RequestObserver, VirtualAccountConfig, VirtualRegion,
};

use super::{CosmosOpenError, CosmosStore, no_throttle_retry};
use crate::config::CosmosSettings;

const GATEWAY: &str = "https://eastus.emulator.local";
const KEY: &str = "c2t5cG9ydC1lbXVsYXRvci1rZXk=";

/// Counts the document requests that reach the emulator: what went on the wire.
#[derive(Debug, Default)]
pub struct WireRequests(AtomicU64);

impl WireRequests {
    pub fn documents(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

impl RequestObserver for WireRequests {
    fn on_request(&self, request: &Request) {
        if request.url().path().contains("/docs") {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A store on a fresh emulator; `throttling` makes it answer 429 past the
/// containers' provisioned throughput (`settings.throughput`).
///
/// # Errors
/// [`CosmosOpenError`] when the emulator or the containers cannot be set up.
pub async fn open(
    settings: &CosmosSettings,
    throttling: bool,
) -> Result<(Arc<CosmosStore>, Arc<WireRequests>), CosmosOpenError> {
    let connect = |e: Box<dyn std::error::Error + Send + Sync>| CosmosOpenError::Connect(e);
    let gateway = Url::parse(GATEWAY).map_err(|e| connect(Box::new(e)))?;
    let config = VirtualAccountConfig::new(vec![VirtualRegion::new("East US", gateway)])
        .map_err(|e| connect(Box::new(e)))?
        .with_throttling_enabled(throttling);
    let wire = Arc::new(WireRequests::default());
    let emulator =
        Arc::new(InMemoryEmulatorHttpClient::new(config).with_request_observer(wire.clone()));
    let runtime = CosmosRuntimeBuilder::from(emulator.runtime_builder())
        .build()
        .await
        .map_err(|e| connect(Box::new(e)))?;
    let endpoint: AccountEndpoint = GATEWAY
        .parse()
        .map_err(|e: azure_data_cosmos::CosmosError| connect(Box::new(e)))?;
    let client = CosmosClientBuilder::new()
        .with_runtime(runtime)
        .with_default_operation_options(no_throttle_retry())
        .build(
            AccountReference::with_authentication_key(endpoint, Secret::new(KEY)),
            RoutingStrategy::ProximityTo(Region::EAST_US),
        )
        .await
        .map_err(|e| connect(Box::new(e)))?;
    Ok((CosmosStore::on_client(client, settings).await?, wire))
}
