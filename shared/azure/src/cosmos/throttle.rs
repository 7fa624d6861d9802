//! How the adapter makes a request: through its work's throughput control
//! group (admitted, or held, or refused; its priority sent; charged with the
//! response's request charge, errors included), and past 429s: the SDK's own
//! retries are off, so a 429 is counted, waited out after the server's
//! `x-ms-retry-after-ms` (or `cosmos.throttle_retry_ms`) and tried again.
//! Every response's `x-ms-request-charge` is recorded.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use azure_core::http::StatusCode;
use azure_data_cosmos::CosmosError;
use azure_data_cosmos::options::{
    OperationOptions, OperationOptionsBuilder, ThrottlingRetryOptionsBuilder,
};
use skyport_runtime::config::Work;

use skyport_core::error::{BoxError, Throttled};

use super::charge::{Charged, error_charge};
use super::control::Control;
use super::request_units::{Operation, RequestUnits, Spend};

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

/// Why a request failed: the service answered an error, or the work's
/// throughput control group refused it before it was sent.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Failure {
    #[error(transparent)]
    Cosmos(#[from] CosmosError),
    #[error(transparent)]
    Refused(#[from] Throttled),
}

impl Failure {
    /// The service's status code; 429 for a request the control refused.
    pub(crate) fn status_code(&self) -> StatusCode {
        match self {
            Self::Cosmos(error) => error.status().status_code(),
            Self::Refused(_) => StatusCode::TooManyRequests,
        }
    }

    /// The error itself, boxed for a port's error: a refusal stays a
    /// [`Throttled`], so the gateway can answer with its `Retry-After`.
    pub(crate) fn into_box(self) -> BoxError {
        match self {
            Self::Cosmos(error) => Box::new(error),
            Self::Refused(throttled) => Box::new(throttled),
        }
    }

    /// Whether a conditional write lost to another writer: 409 (a create
    /// found the item), 412 (its ETag moved on) or 404 (a replace found it gone).
    pub(crate) fn lost_race(&self) -> bool {
        matches!(
            self.status_code(),
            StatusCode::Conflict | StatusCode::PreconditionFailed | StatusCode::NotFound
        )
    }
}

/// Makes the store's requests: see the module's documentation.
#[derive(Debug)]
pub(crate) struct Requests {
    pub(crate) units: Arc<RequestUnits>,
    throttle_retry: Duration,
    control: Control,
    /// The options of work no group controls.
    uncontrolled: OperationOptions,
}

impl Requests {
    pub(crate) fn new(
        units: Arc<RequestUnits>,
        throttle_retry: Duration,
        control: Control,
    ) -> Self {
        Self {
            units,
            throttle_retry,
            control,
            uncontrolled: OperationOptionsBuilder::new().build(),
        }
    }

    pub(crate) fn control(&self) -> &Control {
        &self.control
    }

    /// Runs `call` for `work` until it is not throttled by the service, or
    /// until it has waited out `patience` 429s. `call` gets the options its
    /// group's priority asks for.
    pub(crate) async fn run<T, F, Fut>(
        &self,
        work: Work,
        operation: Operation,
        patience: u32,
        mut call: F,
    ) -> Result<T, Failure>
    where
        T: Charged,
        F: FnMut(OperationOptions) -> Fut,
        Fut: Future<Output = Result<T, CosmosError>>,
    {
        let group = self.control.group(work);
        let options = group.map_or_else(|| self.uncontrolled.clone(), |group| group.options());
        let mut throttled = 0;
        loop {
            let ticket = match group {
                Some(group) => group.admit(!work.holds_a_client()).await?,
                None => None,
            };
            let result = call(options.clone()).await;
            let charged = match &result {
                Ok(response) => response.request_charge(),
                Err(error) => error_charge(error),
            };
            let throttled_by_service = matches!(&result, Err(e) if e.status().is_throttled());
            if !throttled_by_service {
                // A 429 is counted as throttled, not as a request done.
                self.units
                    .record(Spend::of(work, operation), operation, charged);
            }
            if let Some(group) = group {
                group.settle(ticket, charged);
            }
            match result {
                Err(e) if e.status().is_throttled() && throttled < patience => {
                    throttled += 1;
                    self.units.throttled();
                    let wait = e
                        .response()
                        .and_then(|r| r.headers().retry_after_ms)
                        .map_or(self.throttle_retry, Duration::from_millis);
                    tracing::debug!(
                        wait_ms = wait.as_millis(),
                        "Cosmos DB throttled a request; waiting it out."
                    );
                    tokio::time::sleep(wait).await;
                }
                Err(e) => {
                    if e.status().is_throttled() {
                        self.units.throttled();
                    }
                    return Err(e.into());
                }
                Ok(response) => return Ok(response),
            }
        }
    }
}
