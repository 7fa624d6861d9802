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
use skyport_runtime::config::{ChangeFeedSettings, Settings};

use crate::backends::{Backends, Store};

/// The listing processor's name: its lease group, apart from the
/// notifier's (`change_feed.processor_name`), and its dead letters' key.
pub const PROCESSOR: &str = "skyport-listing";

/// The processor that keeps the listing view, when the store is Cosmos DB;
/// run it with [`Processor::run`]. It runs with `[change_feed]`'s settings,
/// but over every document, always from the beginning of the feed (whatever
/// `change_feed.start_from` says), so that every delivery is listed, and one
/// batch of a lease at a time (whatever `change_feed.max_batches_in_flight`
/// says): an upsert is not conditional, so a document's later change must
/// not be written before an earlier one, which would list it as it was.
pub fn listing(settings: &Settings, backends: &Backends) -> Option<Arc<Processor>> {
    let Store::Cosmos(cosmos) = &backends.store else {
        return None;
    };
    Some(Processor::new(
        processor_settings(&settings.change_feed),
        backends.store.changes(),
        backends.store.leases(),
        Arc::clone(&backends.ports.dead_letters),
        Arc::new(ListingView(Arc::clone(cosmos))),
    ))
}

/// `[change_feed]` as the listing processor runs it (see [`listing`]).
fn processor_settings(change_feed: &ChangeFeedSettings) -> ProcessorSettings {
    ProcessorSettings {
        processor: PROCESSOR.to_owned(),
        start: StartFrom::Beginning,
        only_with_field: None,
        max_batches_in_flight: 1,
        ..ProcessorSettings::from(change_feed)
    }
}

/// The listing processor's handler.
struct ListingView(Arc<CosmosStore>);

#[async_trait]
impl ChangeHandler for ListingView {
    async fn handle(&self, changes: &[Change]) -> Result<(), BoxError> {
        self.0.update_listing(changes).await.map_err(Into::into)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use skyport_core::ports::StartFrom;
    use skyport_runtime::config::{ChangeFeedSettings, Millis};

    use super::{PROCESSOR, processor_settings};

    #[test]
    fn the_listing_processor_reads_every_document_from_the_beginning_one_batch_at_a_time() {
        let settings = processor_settings(&ChangeFeedSettings {
            start_from: "now".into(),
            max_batches_in_flight: 8,
            poll_interval_ms: Millis::new(250),
            ..ChangeFeedSettings::default()
        });
        assert_eq!(settings.processor, PROCESSOR);
        assert_ne!(
            settings.processor,
            ChangeFeedSettings::default().processor_name
        );
        assert_eq!(settings.start, StartFrom::Beginning);
        assert_eq!(settings.only_with_field, None);
        assert_eq!(settings.max_batches_in_flight, 1);
        assert_eq!(settings.poll_interval, Duration::from_millis(250));
    }
}
