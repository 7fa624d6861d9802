//! What a Cosmos DB response was charged: the `x-ms-request-charge` of an
//! item response, of an error response, and of every page of a query read
//! whole. Read by the request path (throttle.rs) and by the throughput
//! control that budgets those charges (control/), so neither imports the
//! other for it.

use azure_data_cosmos::CosmosError;
use azure_data_cosmos::models::ItemResponse;

/// What a response was charged.
pub(crate) trait Charged {
    fn request_charge(&self) -> f64;
}

impl Charged for ItemResponse {
    fn request_charge(&self) -> f64 {
        charge(self.headers())
    }
}

/// The items of every page of a query, and what the pages were charged.
#[derive(Debug)]
pub(crate) struct Paged<T> {
    pub(crate) items: Vec<T>,
    pub(crate) charge: f64,
}

impl<T> Charged for Paged<T> {
    fn request_charge(&self) -> f64 {
        self.charge
    }
}

impl<T: serde::de::DeserializeOwned + Send + 'static> Paged<T> {
    /// Reads every page of a query.
    pub(crate) async fn read_all(
        query: azure_data_cosmos::feed::QueryItemIterator<T>,
    ) -> Result<Self, CosmosError> {
        let mut pages = query.into_pages();
        let mut paged = Self {
            items: Vec::new(),
            charge: 0.0,
        };
        while let Some(page) = futures_util::TryStreamExt::try_next(&mut pages).await? {
            paged.charge += charge(page.headers());
            paged.items.extend(page.into_items());
        }
        Ok(paged)
    }
}

/// The request charge a response carried (`x-ms-request-charge`).
pub(crate) fn charge(headers: &azure_data_cosmos::models::ResponseHeaders) -> f64 {
    headers.request_charge().map_or(0.0, |c| c.value())
}

/// The request charge an error response carried, if any.
pub(crate) fn error_charge(error: &CosmosError) -> f64 {
    error
        .response()
        .and_then(|r| r.headers().request_charge)
        .map_or(0.0, |charge| charge.value())
}
