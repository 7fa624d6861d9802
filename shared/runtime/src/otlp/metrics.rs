//! Metrics over OTLP, when `OTEL_METRICS_EXPORTER=otlp` asks for them: every
//! `OTEL_METRIC_EXPORT_INTERVAL` (60 s by default) a task reads the process's
//! registry, the one `/metrics` renders, converts it ([`super::convert`]) and
//! sends it over gRPC or as an HTTP POST to the collector. `/metrics` stays:
//! both read the same counters, so nothing is counted twice.
//!
//! A failed export is logged (the first, then at most one line per
//! [`LOG_EVERY`] while it keeps failing) and the next interval sends the
//! totals again: the series are cumulative, so a lost export loses no count.
//! The task holds nothing the rest of the process waits for, and every
//! export ends within its time limit. Shutdown sends once more.

use std::time::{Duration, SystemTime};

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_client::MetricsServiceClient;
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::transform::common::tonic::ResourceAttributesWithSchema;
use prost::Message;
use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use secrecy::ExposeSecret;
use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;
use tonic::metadata::{MetadataKey, MetadataMap, MetadataValue};
use tonic::transport::Channel;
use tracing::Instrument;

use super::convert::{Times, request};
use super::{Protocol, Signal, SignalSettings, TelemetryError, Vars, client, milliseconds};
use crate::error_chain::error_chain;
use crate::metrics::Metrics;

/// The interval when `OTEL_METRIC_EXPORT_INTERVAL` does not set one (the specification's).
const DEFAULT_INTERVAL: Duration = Duration::from_secs(60);

/// How often a failing export is logged while it keeps failing.
const LOG_EVERY: Duration = Duration::from_secs(300);

const METRICS_EXPORTER: &str = "OTEL_METRICS_EXPORTER";
const INTERVAL: &str = "OTEL_METRIC_EXPORT_INTERVAL";

/// What the variables ask of the metrics export.
#[derive(Debug, Clone)]
pub(crate) struct MetricsExport {
    settings: SignalSettings,
    interval: Duration,
}

impl MetricsExport {
    /// The export `OTEL_METRICS_EXPORTER` asks for: `None` when it is unset,
    /// `none` or `prometheus` (what `/metrics` always serves).
    ///
    /// # Errors
    /// [`TelemetryError`] naming the variable Skyport cannot honour: an
    /// exporter other than `otlp`, `prometheus` or `none`, an interval that
    /// is not a positive number of milliseconds, or any of
    /// [`SignalSettings::from_vars`]'s.
    pub(crate) fn from_vars(vars: Vars<'_>) -> Result<Option<Self>, TelemetryError> {
        let Some(exporters) = vars(METRICS_EXPORTER) else {
            return Ok(None);
        };
        let mut otlp = false;
        for exporter in exporters.split(',').map(str::trim) {
            match exporter {
                "otlp" => otlp = true,
                "prometheus" | "none" => {}
                other => {
                    return Err(TelemetryError::new(
                        METRICS_EXPORTER,
                        format!(
                            "`{other}` is not supported: Skyport sends metrics with `otlp`, and \
                             serves them at /metrics whatever this says (`prometheus`, `none`)"
                        ),
                    ));
                }
            }
        }
        if !otlp {
            return Ok(None);
        }
        let settings = SignalSettings::from_vars(vars, Signal::Metrics)?;
        let interval = match vars(INTERVAL) {
            Some(text) => Duration::from_millis(milliseconds(INTERVAL, &text)?),
            None => DEFAULT_INTERVAL,
        };
        Ok(Some(Self { settings, interval }))
    }
}

/// The running export; [`MetricsExporter::shutdown`] sends the last reading.
#[derive(Debug)]
pub(crate) struct MetricsExporter {
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl MetricsExporter {
    /// Starts sending `metrics`, as `resource` (the traces' resource), every
    /// interval; the cumulative series count from now, the process's start.
    /// Must be called on the runtime that will carry the export.
    ///
    /// # Errors
    /// [`TelemetryError`] naming the endpoint's variable when the client
    /// cannot be made.
    pub(crate) fn start(
        export: MetricsExport,
        resource: &opentelemetry_sdk::Resource,
        metrics: &'static Metrics,
    ) -> Result<Self, TelemetryError> {
        let transport = Transport::new(&export.settings)?;
        let resource = ResourceAttributesWithSchema::from(resource);
        let sender = Sender {
            transport,
            url: export.settings.url.clone(),
            resource: Resource {
                attributes: resource.attributes.0,
                ..Resource::default()
            },
            metrics,
            start: unix_nanos(SystemTime::now()),
            timeout: export.settings.timeout,
            failures: Failures::default(),
        };
        let stop = CancellationToken::new();
        let span = tracing::debug_span!("otlp metrics");
        let task = tokio::spawn(sender.run(export.interval, stop.clone()).instrument(span));
        Ok(Self { stop, task })
    }

    /// Sends the last reading (within the export's time limit) and stops.
    pub(crate) async fn shutdown(self) {
        self.stop.cancel();
        // A panic in the task has been logged by the panic hook already.
        let _ = self.task.await;
    }
}

fn unix_nanos(at: SystemTime) -> u64 {
    at.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |since| {
            u64::try_from(since.as_nanos()).unwrap_or(u64::MAX)
        })
}

/// The task's state: what it reads, where it sends, how it has fared.
#[derive(Debug)]
struct Sender {
    transport: Transport,
    url: String,
    resource: Resource,
    metrics: &'static Metrics,
    start: u64,
    timeout: Duration,
    failures: Failures,
}

impl Sender {
    async fn run(mut self, interval: Duration, stop: CancellationToken) {
        let mut ticks = tokio::time::interval_at(Instant::now() + interval, interval);
        ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut next = async || {
            ticks.tick().await;
            self.export().await;
        };
        // An export under way when the stop comes is dropped: the last one follows at once.
        while stop.run_until_cancelled(next()).await.is_some() {}
        self.export().await;
    }

    async fn export(&mut self) {
        let times = Times {
            start: self.start,
            now: unix_nanos(SystemTime::now()),
        };
        let request = request(&self.metrics.render(), &self.resource, times);
        let sent = tokio::time::timeout(self.timeout, self.transport.send(request))
            .await
            .unwrap_or(Err(ExportError::TimedOut(self.timeout)));
        match sent {
            Ok(()) => {
                if let Some(failed) = self.failures.succeeded() {
                    tracing::info!(
                        url = self.url,
                        failed,
                        "Metrics reach the OTLP collector again."
                    );
                }
            }
            Err(e) => {
                if let Some(failed) = self.failures.failed(Instant::now()) {
                    tracing::warn!(
                        url = self.url,
                        error = error_chain(&e),
                        failed,
                        "Could not export metrics over OTLP; each interval sends the totals again."
                    );
                }
            }
        }
    }
}

/// Consecutive failed exports, and when one was last logged.
#[derive(Debug, Default)]
struct Failures {
    count: u64,
    logged_at: Option<Instant>,
}

impl Failures {
    /// One more failure; the number so far when this one is to be logged
    /// (the first, and then one every [`LOG_EVERY`]).
    fn failed(&mut self, now: Instant) -> Option<u64> {
        self.count += 1;
        let due = self
            .logged_at
            .is_none_or(|at| now.duration_since(at) >= LOG_EVERY);
        due.then(|| {
            self.logged_at = Some(now);
            self.count
        })
    }

    /// A success; the number of failures before it when they were logged.
    fn succeeded(&mut self) -> Option<u64> {
        let failed = std::mem::take(&mut self.count);
        self.logged_at.take().map(|_| failed)
    }
}

#[derive(Debug, thiserror::Error)]
enum ExportError {
    /// A gRPC status (its source, when any, is what its message says).
    #[error("the collector answered {code:?}: {message}")]
    Grpc { code: tonic::Code, message: String },
    #[error("the POST failed")]
    Http(#[from] reqwest::Error),
    #[error("no answer within {0:?}")]
    TimedOut(Duration),
}

impl From<tonic::Status> for ExportError {
    fn from(status: tonic::Status) -> Self {
        Self::Grpc {
            code: status.code(),
            message: status.message().to_owned(),
        }
    }
}

/// The collector, over either protocol.
#[derive(Debug)]
enum Transport {
    Grpc {
        client: MetricsServiceClient<Channel>,
        metadata: MetadataMap,
    },
    Http {
        client: reqwest::Client,
        url: String,
        headers: HeaderMap,
    },
}

impl Transport {
    /// A client for `settings` (a gRPC channel connects on first use, and again after a failure).
    fn new(settings: &SignalSettings) -> Result<Self, TelemetryError> {
        let bad_header = |e: &dyn std::fmt::Display| {
            TelemetryError::new(settings.headers_variable, format!("not a header: {e}"))
        };
        match settings.protocol {
            Protocol::Grpc => {
                let endpoint = tonic::transport::Endpoint::from_shared(settings.url.clone())
                    .map_err(|e| TelemetryError::new(settings.endpoint_variable, format!("{e}")))?
                    .connect_timeout(settings.timeout)
                    .timeout(settings.timeout);
                let mut metadata = MetadataMap::new();
                for (key, value) in &settings.headers {
                    let key =
                        MetadataKey::from_bytes(key.as_bytes()).map_err(|e| bad_header(&e))?;
                    let mut value = MetadataValue::try_from(value.expose_secret())
                        .map_err(|e| bad_header(&e))?;
                    value.set_sensitive(true);
                    metadata.insert(key, value);
                }
                Ok(Self::Grpc {
                    client: MetricsServiceClient::new(endpoint.connect_lazy()),
                    metadata,
                })
            }
            Protocol::HttpProtobuf => {
                let mut headers = HeaderMap::new();
                for (key, value) in &settings.headers {
                    let key = HeaderName::from_bytes(key.as_bytes()).map_err(|e| bad_header(&e))?;
                    let mut value =
                        HeaderValue::from_str(value.expose_secret()).map_err(|e| bad_header(&e))?;
                    value.set_sensitive(true);
                    headers.insert(key, value);
                }
                headers.insert(
                    CONTENT_TYPE,
                    HeaderValue::from_static("application/x-protobuf"),
                );
                Ok(Self::Http {
                    client: client::http_client(settings.timeout, settings.endpoint_variable)?,
                    url: settings.url.clone(),
                    headers,
                })
            }
        }
    }

    async fn send(&mut self, request: ExportMetricsServiceRequest) -> Result<(), ExportError> {
        match self {
            Self::Grpc { client, metadata } => {
                let mut request = tonic::Request::new(request);
                *request.metadata_mut() = metadata.clone();
                client.export(request).await?;
            }
            Self::Http {
                client,
                url,
                headers,
            } => {
                let response = client
                    .post(url.as_str())
                    .headers(headers.clone())
                    .body(request.encode_to_vec())
                    .send()
                    .await?
                    .error_for_status()?;
                // Read to the end, so that the connection serves the next export.
                response.bytes().await?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn export(pairs: &[(&str, &str)]) -> Result<Option<MetricsExport>, TelemetryError> {
        let env: HashMap<&str, &str> = pairs.iter().copied().collect();
        MetricsExport::from_vars(&|name| env.get(name).map(|v| (*v).to_owned()))
    }

    #[test]
    fn metrics_go_over_otlp_only_when_asked() {
        assert!(export(&[]).unwrap().is_none());
        for off in ["none", "prometheus"] {
            assert!(
                export(&[(METRICS_EXPORTER, off)]).unwrap().is_none(),
                "{off}"
            );
        }
        let on = export(&[(METRICS_EXPORTER, "prometheus,otlp")])
            .unwrap()
            .unwrap();
        assert_eq!(on.interval, Duration::from_secs(60));
        assert_eq!(on.settings.protocol, Protocol::Grpc);
        let quick = export(&[(METRICS_EXPORTER, "otlp"), (INTERVAL, "250")])
            .unwrap()
            .unwrap();
        assert_eq!(quick.interval, Duration::from_millis(250));
    }

    #[test]
    fn what_the_export_cannot_honour_names_its_variable() {
        let otlp = (METRICS_EXPORTER, "otlp");
        for (pairs, variable) in [
            (vec![(METRICS_EXPORTER, "statsd")], METRICS_EXPORTER),
            (vec![otlp, (INTERVAL, "1m")], INTERVAL),
            (
                vec![otlp, ("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "http/json")],
                "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
            ),
            (
                vec![otlp, ("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")],
                "OTEL_EXPORTER_OTLP_COMPRESSION",
            ),
        ] {
            let refused = export(&pairs).unwrap_err();
            assert_eq!(refused.variable, variable, "{pairs:?}");
        }
    }

    #[test]
    fn a_failing_export_is_logged_first_then_every_five_minutes_and_its_end_once() {
        let start = Instant::now();
        let mut failures = Failures::default();
        assert_eq!(failures.failed(start), Some(1));
        assert_eq!(failures.failed(start + Duration::from_secs(60)), None);
        assert_eq!(failures.failed(start + LOG_EVERY), Some(3));
        assert_eq!(failures.succeeded(), Some(3));
        assert_eq!(failures.succeeded(), None);
        assert_eq!(failures.failed(start + 2 * LOG_EVERY), Some(1));
    }
}
