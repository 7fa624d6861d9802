//! 429s and request charges: the SDK's own retries are off, so this adapter
//! waits out a 429 after the server's `x-ms-retry-after-ms` (or
//! `cosmos.throttle_retry_ms`) and tries again, counting it; every response's
//! `x-ms-request-charge` is recorded.

use std::future::Future;
use std::time::Duration;

use azure_core::http::StatusCode;
use azure_data_cosmos::CosmosError;
use azure_data_cosmos::options::{
    OperationOptions, OperationOptionsBuilder, ThrottlingRetryOptionsBuilder,
};

use super::request_units::RequestUnits;

/// Operation options that turn the SDK's own 429 retries off: this adapter retries them itself.
pub(crate) fn no_throttle_retry() -> OperationOptions {
    OperationOptionsBuilder::new()
        .with_throttling_retry_options(
            ThrottlingRetryOptionsBuilder::new()
                .with_max_retry_count(0)
                .build(),
        )
        .build()
}

/// Runs `call` until it is not throttled: a 429 is counted, waited out
/// (`x-ms-retry-after-ms`, else `default_wait`) and tried again.
pub(crate) async fn retry_throttled<T, F, Fut>(
    units: &RequestUnits,
    default_wait: Duration,
    call: F,
) -> Result<T, CosmosError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, CosmosError>>,
{
    retry_throttled_up_to(units, default_wait, u32::MAX, call).await
}

/// Like [`retry_throttled`], but answers the 429 after waiting out `patience`
/// of them: a client's status read is better served a fast 503 than a wait.
pub(crate) async fn retry_throttled_up_to<T, F, Fut>(
    units: &RequestUnits,
    default_wait: Duration,
    patience: u32,
    mut call: F,
) -> Result<T, CosmosError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, CosmosError>>,
{
    let mut throttled = 0;
    loop {
        match call().await {
            Err(e) if e.status().is_throttled() && throttled < patience => {
                throttled += 1;
                units.throttled();
                let wait = e
                    .response()
                    .and_then(|r| r.headers().retry_after_ms)
                    .map_or(default_wait, Duration::from_millis);
                tracing::debug!(
                    wait_ms = wait.as_millis(),
                    "Cosmos DB throttled a request; waiting it out."
                );
                tokio::time::sleep(wait).await;
            }
            other => return other,
        }
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

/// Whether a conditional write lost to another writer: 409 (a create found
/// the item), 412 (its ETag moved on) or 404 (a replace found it gone).
pub(crate) fn lost_race(error: &CosmosError) -> bool {
    matches!(
        error.status().status_code(),
        StatusCode::Conflict | StatusCode::PreconditionFailed | StatusCode::NotFound
    )
}
