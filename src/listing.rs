//! Composition of the listing view on Cosmos DB: a change-feed processor of
//! its own over the status container, whose handler brings the view up to
//! each batch of changes ([`CosmosStore::update_listing`]). The embedded
//! store lists its documents in the transaction that writes them and needs
//! none.

use std::sync::Arc;

use async_trait::async_trait;
use skyport_azure::cosmos::CosmosStore;
use skyport_callbacks::change_feed::{ChangeHandler, Processor, ProcessorSettings};
use skyport_core::error::BoxError;
use skyport_core::ports::{Change, StartFrom};
use skyport_runtime::config::Settings;

use crate::backends::{Backends, Store};

/// The listing processor's name: its lease group, apart from the
/// notifier's (`change_feed.processor_name`), and its dead letters' key.
pub const PROCESSOR: &str = "skyport-listing";

/// The processor that keeps the listing view, when the store is Cosmos DB;
/// run it with [`Processor::run`]. It runs with `[change_feed]`'s settings,
/// but always from the beginning of the feed (whatever
/// `change_feed.start_from` says), so that every delivery is listed, and
/// over every document.
pub fn listing(settings: &Settings, backends: &Backends) -> Option<Arc<Processor>> {
    let Store::Cosmos(cosmos) = &backends.store else {
        return None;
    };
    let processor_settings = ProcessorSettings {
        processor: PROCESSOR.to_owned(),
        start: StartFrom::Beginning,
        only_with_field: None,
        ..ProcessorSettings::from(&settings.change_feed)
    };
    Some(Processor::new(
        processor_settings,
        backends.store.changes(),
        backends.store.leases(),
        Arc::clone(&backends.ports.dead_letters),
        Arc::new(ListingView(Arc::clone(cosmos))),
    ))
}

/// The listing processor's handler.
struct ListingView(Arc<CosmosStore>);

#[async_trait]
impl ChangeHandler for ListingView {
    async fn handle(&self, changes: &[Change]) -> Result<(), BoxError> {
        self.0.update_listing(changes).await.map_err(Into::into)
    }
}
