//! The provisioned throughput behind a group's `target_fraction`: the
//! container's own offer, else its database's (shared throughput); the
//! larger of manual and autoscale maximum. Serverless accounts have none.

use std::sync::Arc;
use std::time::Duration;

use azure_data_cosmos::models::ThroughputProperties;
use azure_data_cosmos::{ContainerClient, CosmosClient};
use skyport_core::ports::BoxError;
use skyport_runtime::error_chain::error_chain;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::Group;

/// The RU/s provisioned for `container`.
pub(super) async fn read(
    container: &ContainerClient,
    client: &CosmosClient,
    database: &str,
) -> Result<u32, BoxError> {
    let own = container.read_throughput(None).await?;
    let offer = match own.as_ref().and_then(ru_per_s) {
        Some(ru) => Some(ru),
        None => client
            .database_client(database)
            .read_throughput(None)
            .await?
            .as_ref()
            .and_then(ru_per_s),
    };
    offer.ok_or_else(|| {
        "neither the container nor its database has provisioned throughput (serverless?): give the group target_ru_per_s".into()
    })
}

fn ru_per_s(properties: &ThroughputProperties) -> Option<u32> {
    let most = properties
        .throughput()
        .into_iter()
        .chain(properties.autoscale_maximum())
        .max()?;
    u32::try_from(most).ok()
}

/// Reads the offer again every `interval`; a changed offer changes the budget.
pub(super) fn refresh(
    container: ContainerClient,
    client: CosmosClient,
    database: String,
    group: Arc<Group>,
    interval: Duration,
    stop: CancellationToken,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(interval) => {}
            }
            match read(&container, &client, &database).await {
                Ok(offer) => {
                    let before = group.lock().offer;
                    if before != Some(offer) {
                        tracing::info!(group = %group.name, ?before, offer, "The container's throughput changed; the group's budget follows it.");
                        group.set_offer(offer);
                    }
                }
                Err(error) => {
                    tracing::warn!(group = %group.name, error = %error_chain(&*error), "Cannot read the container's throughput; the group keeps its budget.")
                }
            }
        }
    })
}
