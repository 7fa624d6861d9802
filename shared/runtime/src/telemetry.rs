//! What a Skyport process tells its operator, besides `/metrics`: log lines on
//! stderr (human-readable or JSON, filtered by `RUST_LOG`, default `info`),
//! spans exported over OTLP (gRPC or `http/protobuf`) when the standard
//! `OTEL_*` variables ask for it, and the `/metrics` registry over OTLP too
//! when `OTEL_METRICS_EXPORTER=otlp` does (the `otlp` module).
//!
//! One trace covers a delivery end to end: the gateway's request span takes
//! the caller's W3C `traceparent` as its parent, the event carries the
//! gateway's own `traceparent` through the stream, the worker's span continues
//! it, and every backend call sends the current span's `traceparent` on.
//!
//! `RUST_LOG` filters log lines only; every `skyport*` span at INFO is
//! exported. The spans of the hot paths are made with [`trace_span!`]: at INFO
//! while spans are exported and at DEBUG otherwise, because an enabled span
//! costs each request the formatting and bookkeeping of its fields (12–17 %
//! of the gateway's ingest throughput, BENCHMARKS.md), worth paying only when
//! a collector or a debug log reads it.

use std::collections::HashMap;
use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{Layer, fmt};

use crate::config::LogFormat;
pub use crate::otlp::TelemetryError;
use crate::otlp::{
    MetricsExport, MetricsExporter, Protocol, RuntimeClient, Signal, SignalSettings, Vars,
    process_env,
};

/// The W3C header (and event property) that carries a trace's context.
pub const TRACEPARENT: &str = "traceparent";

/// Whether this process exports spans (set once, by [`Telemetry::init`]).
static EXPORTING: AtomicBool = AtomicBool::new(false);

/// Whether this process exports spans: [`trace_span!`]'s level depends on it.
pub fn exporting() -> bool {
    EXPORTING.load(Ordering::Relaxed)
}

/// A span of a hot path (a request, a step, a call): `tracing::info_span!`
/// while spans are exported, `tracing::debug_span!` otherwise (same arguments).
#[macro_export]
macro_rules! trace_span {
    ($($arguments:tt)*) => {
        if $crate::telemetry::exporting() {
            ::tracing::info_span!($($arguments)*)
        } else {
            ::tracing::debug_span!($($arguments)*)
        }
    };
}

/// The installed logging, tracing and metrics export; [`Telemetry::shutdown`]
/// sends the spans still buffered and the last reading of the metrics.
#[derive(Debug)]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
    metrics: Option<MetricsExporter>,
}

impl Telemetry {
    /// Installs the global subscriber: logs in `format`, and spans and
    /// metrics exported as `service` (unless `OTEL_SERVICE_NAME` names it)
    /// when the `OTEL_*` variables ask for them. Must run inside the Tokio
    /// runtime (the exporters' connections live there). A second call (as in
    /// tests) leaves the first subscriber in place and exports nothing.
    ///
    /// # Errors
    /// [`TelemetryError`] naming an `OTEL_*` variable that asks for what Skyport does not do.
    pub fn init(format: LogFormat, service: &'static str) -> Result<Self, TelemetryError> {
        let vars: Vars<'_> = &process_env;
        let disabled = vars("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"));
        let traces = if disabled {
            None
        } else {
            traces_requested(vars)?
        };
        let metrics = if disabled {
            None
        } else {
            MetricsExport::from_vars(vars)?
        };
        let resource = resource(vars, service);
        let provider = traces
            .map(|settings| tracer_provider(&settings, resource.clone()))
            .transpose()?;
        let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
        let logs = match format {
            LogFormat::Human => fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(std::io::stderr().is_terminal())
                .with_filter(filter)
                .boxed(),
            LogFormat::Json => fmt::layer()
                .json()
                .with_current_span(true)
                .with_span_list(false)
                .with_writer(std::io::stderr)
                .with_filter(filter)
                .boxed(),
        };
        let traces = provider.as_ref().map(|p| {
            tracing_opentelemetry::layer()
                .with_tracer(p.tracer(service))
                .with_filter(Targets::new().with_target("skyport", tracing::Level::INFO))
        });
        let installed = tracing_subscriber::registry()
            .with(logs)
            .with(traces)
            .try_init()
            .is_ok();
        let provider = provider.filter(|_| installed);
        EXPORTING.store(provider.is_some(), Ordering::Relaxed);
        let metrics = metrics
            .filter(|_| installed)
            .map(|export| MetricsExporter::start(export, &resource, crate::metrics::global()))
            .transpose()?;
        Ok(Self { provider, metrics })
    }

    /// Logs every panic once, as an error in the span it happened in (a
    /// request's span names the request), instead of the default hook's
    /// lines on stderr. For binaries: a test keeps the default hook, which
    /// shows its failed assertions.
    pub fn log_panics(&self) {
        std::panic::set_hook(Box::new(|info| {
            let location = info.location().map(ToString::to_string);
            let message = info.payload_as_str().unwrap_or("a panic without a message");
            tracing::error!(panic = message, location, "A task panicked.");
        }));
    }

    /// Exports the spans still buffered and the metrics' last reading (each
    /// waiting at most its exporter's timeout) and stops exporting.
    pub async fn shutdown(self) {
        let spans = async {
            let Some(provider) = self.provider else {
                return;
            };
            let flushed = tokio::task::spawn_blocking(move || {
                provider.shutdown_with_timeout(Duration::from_secs(10))
            })
            .await;
            if let Ok(Err(e)) = flushed {
                eprintln!("could not export the last spans: {e}");
            }
        };
        let metrics = async {
            if let Some(metrics) = self.metrics {
                metrics.shutdown().await;
            }
        };
        tokio::join!(spans, metrics);
    }
}

/// Where spans go, when the `OTEL_*` variables ask for them: an OTLP endpoint
/// is set (or `OTEL_TRACES_EXPORTER=otlp`), and `OTEL_TRACES_EXPORTER=none`
/// does not say otherwise.
fn traces_requested(vars: Vars<'_>) -> Result<Option<SignalSettings>, TelemetryError> {
    let exporter = vars("OTEL_TRACES_EXPORTER");
    match exporter.as_deref() {
        None | Some("otlp") => {}
        Some("none") => return Ok(None),
        Some(other) => {
            return Err(TelemetryError::new(
                "OTEL_TRACES_EXPORTER",
                format!(
                    "`{other}` is not supported: Skyport exports spans with `otlp` (or `none`)"
                ),
            ));
        }
    }
    let settings = SignalSettings::from_vars(vars, Signal::Traces)?;
    let requested = exporter.is_some()
        || vars("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_some()
        || vars("OTEL_EXPORTER_OTLP_ENDPOINT").is_some();
    Ok(requested.then_some(settings))
}

/// What every span and metric is about: `service` (unless `OTEL_SERVICE_NAME`
/// or `OTEL_RESOURCE_ATTRIBUTES` names it), with the attributes those
/// variables add and the SDK's own.
fn resource(vars: Vars<'_>, service: &'static str) -> Resource {
    let mut resource = Resource::builder();
    let named = vars("OTEL_SERVICE_NAME").is_some()
        || vars("OTEL_RESOURCE_ATTRIBUTES").is_some_and(|a| a.contains("service.name="));
    if !named {
        resource = resource.with_service_name(service);
    }
    resource.build()
}

/// Batches spans and sends them over OTLP to `settings`' URL, over gRPC or
/// as HTTP POSTs; the exporter reads its headers, timeout and compression
/// from `OTEL_EXPORTER_OTLP_*`, the sampler reads `OTEL_TRACES_SAMPLER*` and
/// the batch `OTEL_BSP_*`.
fn tracer_provider(
    settings: &SignalSettings,
    resource: Resource,
) -> Result<SdkTracerProvider, TelemetryError> {
    use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
    let builder = opentelemetry_otlp::SpanExporter::builder();
    let exporter = match settings.protocol {
        Protocol::Grpc => builder
            .with_tonic()
            .with_endpoint(settings.url.clone())
            .build(),
        Protocol::HttpProtobuf => builder
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_endpoint(settings.url.clone())
            .with_http_client(RuntimeClient::new(
                settings.timeout,
                settings.endpoint_variable,
            )?)
            .build(),
    }
    .map_err(|e| {
        TelemetryError::new(
            settings.endpoint_variable,
            format!("cannot make the OTLP exporter: {e}"),
        )
    })?;
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build())
}

/// The `traceparent` of the current span, when spans are exported; else the
/// one given (a caller's, passed on unchanged so that its trace still links up).
pub fn traceparent_or(fallback: Option<&str>) -> Option<String> {
    let context = tracing::Span::current().context();
    if !context.span().span_context().is_valid() {
        return fallback.map(str::to_owned);
    }
    let mut carrier = HashMap::new();
    TraceContextPropagator::new().inject_context(&context, &mut carrier);
    carrier
        .remove(TRACEPARENT)
        .or_else(|| fallback.map(str::to_owned))
}

/// Makes `span` continue the trace `traceparent` names (from an HTTP header or
/// an event); a malformed one is ignored and the span starts a trace of its own.
pub fn continue_trace(span: &tracing::Span, traceparent: Option<&str>) {
    let Some(traceparent) = traceparent else {
        return;
    };
    let carrier = HashMap::from([(TRACEPARENT.to_owned(), traceparent.to_owned())]);
    let context = TraceContextPropagator::new().extract(&carrier);
    if context.span().span_context().is_valid() {
        // Fails only when the span is disabled (filtered out), which leaves nothing to link.
        let _ = span.set_parent(context);
    }
}
