//! The Cosmos DB store on the SDK's in-memory emulator, for tests (feature
//! `cosmos-emulator`). The emulator is an internal SDK API, pinned with the
//! SDK; it runs the whole client pipeline and replaces only the HTTP layer.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use azure_core::credentials::Secret;
use azure_core::http::headers::HeaderName;
use azure_core::http::{Request, Url};
use azure_data_cosmos::options::{Region, RoutingStrategy};
use azure_data_cosmos::{
    AccountEndpoint, AccountReference, CosmosClient, CosmosClientBuilder, CosmosRuntimeBuilder,
};
use azure_data_cosmos_driver::in_memory_emulator::{
    Epk, InMemoryEmulatorHttpClient, RequestObserver, VirtualAccountConfig, VirtualRegion,
};

use skyport_core::ports::{BoxError, FeedRange};
use skyport_runtime::config::{CosmosSettings, StoreSettings};

use super::error::CosmosOpenError;
use super::store::CosmosStore;
use super::throttle::no_throttle_retry;

pub mod server;

const GATEWAY: &str = "https://eastus.emulator.local";
const KEY: &str = "c2t5cG9ydC1lbXVsYXRvci1rZXk=";

/// Counts the document requests that reach the emulator: what went on the
/// wire, and the server-side priority they asked for.
#[derive(Debug, Default)]
pub struct WireRequests {
    documents: AtomicU64,
    high: AtomicU64,
    low: AtomicU64,
}

impl WireRequests {
    pub fn documents(&self) -> u64 {
        self.documents.load(Ordering::Relaxed)
    }

    /// Document requests that carried `x-ms-cosmos-priority-level`: (High, Low).
    pub fn by_priority(&self) -> (u64, u64) {
        (
            self.high.load(Ordering::Relaxed),
            self.low.load(Ordering::Relaxed),
        )
    }
}

impl RequestObserver for WireRequests {
    fn on_request(&self, request: &Request) {
        if request.url().path().contains("/docs") {
            self.documents.fetch_add(1, Ordering::Relaxed);
            let priority = request
                .headers()
                .get_optional_str(&HeaderName::from_static("x-ms-cosmos-priority-level"));
            match priority {
                Some(level) if level.eq_ignore_ascii_case("high") => {
                    self.high.fetch_add(1, Ordering::Relaxed);
                }
                Some(level) if level.eq_ignore_ascii_case("low") => {
                    self.low.fetch_add(1, Ordering::Relaxed);
                }
                _ => {}
            }
        }
    }
}

/// One in-memory Cosmos DB account; every store opened on it shares its data,
/// as separate processes share a real account.
#[derive(Debug, Clone)]
pub struct Emulator {
    http: Arc<InMemoryEmulatorHttpClient>,
    wire: Arc<WireRequests>,
    /// The account's one region's address: what clients connect to.
    gateway: Url,
}

impl Emulator {
    /// A fresh account; `throttling` makes it answer 429 past the containers'
    /// provisioned throughput (`settings.throughput`).
    ///
    /// # Errors
    /// [`CosmosOpenError`] when the emulator cannot be set up.
    pub fn new(throttling: bool) -> Result<Self, CosmosOpenError> {
        Self::at(
            Url::parse(GATEWAY).map_err(|e| connect(Box::new(e)))?,
            throttling,
        )
    }

    /// [`Emulator::new`] with its one region ("East US") at `gateway`: a
    /// request reaches the account only when its URL has that scheme, host
    /// and port, so an account served over HTTP names the address it is
    /// served on ([`server::serve`]).
    ///
    /// # Errors
    /// [`CosmosOpenError`] when the emulator cannot be set up.
    pub fn at(gateway: Url, throttling: bool) -> Result<Self, CosmosOpenError> {
        let config =
            VirtualAccountConfig::new(vec![VirtualRegion::new("East US", gateway.clone())])
                .map_err(|e| connect(Box::new(e)))?
                .with_throttling_enabled(throttling);
        let wire = Arc::new(WireRequests::default());
        let http =
            Arc::new(InMemoryEmulatorHttpClient::new(config).with_request_observer(wire.clone()));
        Ok(Self {
            http,
            wire,
            gateway,
        })
    }

    /// The account key every client of the emulator may use (it checks none).
    pub fn key() -> &'static str {
        KEY
    }

    /// The document requests that reached the account so far.
    pub fn wire(&self) -> Arc<WireRequests> {
        Arc::clone(&self.wire)
    }

    /// A store with a client of its own on this account, keeping settled
    /// documents and dead letters for the default retentions.
    ///
    /// # Errors
    /// [`CosmosOpenError`] when the client or the containers cannot be set up.
    pub async fn store(
        &self,
        settings: &CosmosSettings,
    ) -> Result<Arc<CosmosStore>, CosmosOpenError> {
        self.store_with(settings, &StoreSettings::default()).await
    }

    /// A store with a client of its own on this account, keeping settled
    /// documents and dead letters for `store`'s retentions (the emulator
    /// keeps the items' `ttl` but never expires them).
    ///
    /// # Errors
    /// [`CosmosOpenError`] when the client or the containers cannot be set up.
    pub async fn store_with(
        &self,
        settings: &CosmosSettings,
        store: &StoreSettings,
    ) -> Result<Arc<CosmosStore>, CosmosOpenError> {
        CosmosStore::on_client(self.client().await?, settings, store).await
    }

    /// A client of its own on this account.
    pub(crate) async fn client(&self) -> Result<CosmosClient, CosmosOpenError> {
        let runtime = CosmosRuntimeBuilder::from(self.http.runtime_builder())
            .build()
            .await
            .map_err(|e| connect(Box::new(e)))?;
        let endpoint: AccountEndpoint = self
            .gateway
            .as_str()
            .parse()
            .map_err(|e: azure_data_cosmos::CosmosError| connect(Box::new(e)))?;
        CosmosClientBuilder::new()
            .with_runtime(runtime)
            .with_default_operation_options(no_throttle_retry())
            .build(
                AccountReference::with_authentication_key(endpoint, Secret::new(KEY)),
                RoutingStrategy::ProximityTo(Region::EAST_US),
            )
            .await
            .map_err(|e| connect(Box::new(e)))
    }

    /// Splits the physical partition of `container` (in `database`) that
    /// `range` covers (the first, if it covers several) at its middle, as
    /// Cosmos DB does when a partition grows, and waits until the two
    /// children serve. For `lock` before that the partition answers 410
    /// (completing split), which the SDK retries. Containers are created with
    /// 4 physical partitions, so the status container has 4 feed ranges.
    ///
    /// # Errors
    /// When `range` is not in hex, no partition is in it, or the
    /// split fails.
    pub async fn split(
        &self,
        database: &str,
        container: &str,
        range: &FeedRange,
        lock: Duration,
    ) -> Result<(), BoxError> {
        let store = self.http.store();
        let min = Epk::try_from(range.min.as_str())?;
        let max = Epk::try_from(range.max.as_str())?;
        // The children of no particular parents are all the partitions.
        let (partition, middle) = store
            .child_partition_ids(database, container, &[])
            .into_iter()
            .find_map(|id| {
                let middle = store.midpoint_split_epk(database, container, id).ok()?;
                (min < middle && middle < max).then_some((id, middle))
            })
            .ok_or_else(|| {
                format!("no physical partition of {database}/{container} is in {range:?}")
            })?;
        store
            .split_partition_and_wait(database, container, partition, middle, lock)
            .await?;
        Ok(())
    }
}

impl Emulator {
    /// Merges the two adjacent physical partitions of `container` (in
    /// `database`) that serve `a` and `b`, as Cosmos DB does when throughput
    /// shrinks, and waits until the merged partition serves; for `lock`
    /// before that both answer 410 (completing merge), which the SDK retries.
    ///
    /// # Errors
    /// When a range is not in hex, no partition serves it, or the merge fails.
    pub async fn merge(
        &self,
        database: &str,
        container: &str,
        a: &FeedRange,
        b: &FeedRange,
        lock: Duration,
    ) -> Result<(), BoxError> {
        let store = self.http.store();
        let partition = |range: &FeedRange| -> Result<u32, BoxError> {
            let min = Epk::try_from(range.min.as_str())?;
            let max = Epk::try_from(range.max.as_str())?;
            store
                .child_partition_ids(database, container, &[])
                .into_iter()
                .find(|&id| {
                    store
                        .midpoint_split_epk(database, container, id)
                        .is_ok_and(|middle| min < middle && middle < max)
                })
                .ok_or_else(|| {
                    format!("no physical partition of {database}/{container} serves {range:?}")
                        .into()
                })
        };
        let (first, second) = (partition(a)?, partition(b)?);
        store
            .merge_partitions_and_wait(database, container, first, second, lock)
            .await?;
        Ok(())
    }
}

/// A store on a fresh emulator, and the count of what reaches it.
///
/// # Errors
/// [`CosmosOpenError`] when the emulator or the containers cannot be set up.
pub async fn open(
    settings: &CosmosSettings,
    throttling: bool,
) -> Result<(Arc<CosmosStore>, Arc<WireRequests>), CosmosOpenError> {
    let emulator = Emulator::new(throttling)?;
    Ok((emulator.store(settings).await?, emulator.wire()))
}

fn connect(e: Box<dyn std::error::Error + Send + Sync>) -> CosmosOpenError {
    CosmosOpenError::Connect(e)
}
