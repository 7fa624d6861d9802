//! The HTTP client of the `http/protobuf` span exporter: `reqwest`, run on
//! the process's Tokio runtime. The batch span processor exports from a
//! thread of its own, where an async client finds no reactor (it panics) and
//! a blocking one would bring a runtime of its own; so each request is
//! spawned onto the runtime and awaited from there.

use std::time::Duration;

use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};

use super::TelemetryError;

/// `reqwest` on the runtime that made it.
#[derive(Debug, Clone)]
pub(crate) struct RuntimeClient {
    client: reqwest::Client,
    runtime: tokio::runtime::Handle,
}

impl RuntimeClient {
    /// A client whose requests each end within `timeout`. Must be called on
    /// the runtime that will carry its requests.
    ///
    /// # Errors
    /// [`TelemetryError`] naming `variable` (the endpoint's) when the TLS
    /// stack cannot be set up.
    pub(crate) fn new(timeout: Duration, variable: &'static str) -> Result<Self, TelemetryError> {
        Ok(Self {
            client: http_client(timeout, variable)?,
            runtime: tokio::runtime::Handle::current(),
        })
    }
}

/// A `reqwest` client for OTLP over HTTP: each request ends within `timeout`.
///
/// # Errors
/// [`TelemetryError`] naming `variable` when the TLS stack cannot be set up.
pub(crate) fn http_client(
    timeout: Duration,
    variable: &'static str,
) -> Result<reqwest::Client, TelemetryError> {
    reqwest::Client::builder()
        .timeout(timeout)
        .user_agent(concat!("skyport/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| TelemetryError::new(variable, format!("cannot make the HTTP client: {e}")))
}

#[async_trait::async_trait]
impl HttpClient for RuntimeClient {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let request = reqwest::Request::try_from(request)?;
        let client = self.client.clone();
        // Awaited here, so owned by this export; it ends within the client's timeout.
        let (status, headers, body) = self
            .runtime
            .spawn(async move {
                let response = client.execute(request).await?.error_for_status()?;
                let status = response.status();
                let headers = response.headers().clone();
                let body = response.bytes().await?;
                Ok::<_, reqwest::Error>((status, headers, body))
            })
            .await??;
        let mut response = Response::new(body);
        *response.status_mut() = status;
        *response.headers_mut() = headers;
        Ok(response)
    }
}
