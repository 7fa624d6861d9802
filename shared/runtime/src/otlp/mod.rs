//! OTLP, as the OpenTelemetry specification's `OTEL_EXPORTER_OTLP_*`
//! variables configure it for each signal: the protocol (`grpc` or
//! `http/protobuf`), where to send, which headers, and the time limit of one
//! export (always uncompressed). A signal's own variable wins over the general one; a value Skyport
//! cannot honour is refused, naming the variable, before anything starts.
//!
//! Spans go through `opentelemetry-otlp` (`crate::telemetry`, which uses
//! this module), metrics through [`metrics`]: both read their destination
//! here, so the same variables mean the same for both.

mod client;
mod convert;
mod metrics;

use std::time::Duration;

use secrecy::SecretString;

pub(crate) use self::client::RuntimeClient;
pub(crate) use self::metrics::{MetricsExport, MetricsExporter};

/// An `OTEL_*` variable Skyport cannot honour, named with the reason.
#[derive(Debug, thiserror::Error)]
#[error("{variable}: {message}")]
pub struct TelemetryError {
    pub variable: &'static str,
    pub message: String,
}

impl TelemetryError {
    pub(crate) fn new(variable: &'static str, message: impl Into<String>) -> Self {
        Self {
            variable,
            message: message.into(),
        }
    }
}

/// An environment: the value of a variable, `None` when it is unset or blank.
pub(crate) type Vars<'a> = &'a dyn Fn(&str) -> Option<String>;

/// The process's environment, as [`Vars`].
pub(crate) fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// The time limit of one export when no variable sets it (the specification's).
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// What OTLP carries: each has variables of its own beside the general ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Signal {
    Traces,
    Metrics,
}

impl Signal {
    /// The path a general `http/protobuf` endpoint gets for this signal.
    fn path(self) -> &'static str {
        match self {
            Self::Traces => "/v1/traces",
            Self::Metrics => "/v1/metrics",
        }
    }
}

/// What an `OTEL_EXPORTER_OTLP_*` variable sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Variable {
    Endpoint,
    Protocol,
    Headers,
    Timeout,
    Compression,
}

impl Variable {
    /// The signal's own variable, then the general one.
    pub(crate) fn names(self, signal: Signal) -> [&'static str; 2] {
        use Signal::{Metrics, Traces};
        let own = match (self, signal) {
            (Self::Endpoint, Traces) => "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            (Self::Endpoint, Metrics) => "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
            (Self::Protocol, Traces) => "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            (Self::Protocol, Metrics) => "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
            (Self::Headers, Traces) => "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
            (Self::Headers, Metrics) => "OTEL_EXPORTER_OTLP_METRICS_HEADERS",
            (Self::Timeout, Traces) => "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
            (Self::Timeout, Metrics) => "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT",
            (Self::Compression, Traces) => "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION",
            (Self::Compression, Metrics) => "OTEL_EXPORTER_OTLP_METRICS_COMPRESSION",
        };
        let general = match self {
            Self::Endpoint => "OTEL_EXPORTER_OTLP_ENDPOINT",
            Self::Protocol => "OTEL_EXPORTER_OTLP_PROTOCOL",
            Self::Headers => "OTEL_EXPORTER_OTLP_HEADERS",
            Self::Timeout => "OTEL_EXPORTER_OTLP_TIMEOUT",
            Self::Compression => "OTEL_EXPORTER_OTLP_COMPRESSION",
        };
        [own, general]
    }
}

/// The value of `signal`'s own `variable`, else of the general one, with the name of the one set.
pub(crate) fn first(
    vars: Vars<'_>,
    variable: Variable,
    signal: Signal,
) -> Option<(&'static str, String)> {
    variable
        .names(signal)
        .into_iter()
        .find_map(|name| Some((name, vars(name)?)))
}

/// How OTLP reaches the collector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Protocol {
    /// Protobuf over gRPC (a collector's port 4317): the default.
    Grpc,
    /// Protobuf in an HTTP POST (a collector's port 4318).
    HttpProtobuf,
}

impl Protocol {
    /// The protocol `signal` uses: gRPC when no variable names one.
    fn of(vars: Vars<'_>, signal: Signal) -> Result<Self, TelemetryError> {
        match first(vars, Variable::Protocol, signal) {
            None => Ok(Self::Grpc),
            Some((_, value)) if value.trim() == "grpc" => Ok(Self::Grpc),
            Some((_, value)) if value.trim() == "http/protobuf" => Ok(Self::HttpProtobuf),
            Some((variable, value)) => Err(TelemetryError::new(
                variable,
                format!(
                    "`{value}` is not supported: Skyport exports over `grpc` (port 4317 of a \
                     collector) or `http/protobuf` (port 4318)"
                ),
            )),
        }
    }
}

/// Where and how one signal is exported, from the variables.
#[derive(Debug, Clone)]
pub(crate) struct SignalSettings {
    pub(crate) protocol: Protocol,
    /// The URL: over gRPC the collector's address; over HTTP the whole URL
    /// POSTed to (the general endpoint with the signal's `/v1/…` path, or the
    /// signal's own endpoint as it is).
    pub(crate) url: String,
    /// The variable the URL comes from (the general one when none is set).
    pub(crate) endpoint_variable: &'static str,
    /// Sent with every export (HTTP headers, or gRPC metadata); the values
    /// are secret (an API key, as often as not).
    pub(crate) headers: Vec<(String, SecretString)>,
    /// The variable the headers come from (the general one when none is set).
    pub(crate) headers_variable: &'static str,
    pub(crate) timeout: Duration,
}

impl SignalSettings {
    /// The settings of `signal`.
    ///
    /// # Errors
    /// [`TelemetryError`] naming the variable whose value is wrong: a
    /// protocol other than `grpc` or `http/protobuf`, an endpoint that is not
    /// an `http(s)` URL (or `https` over gRPC, which has no TLS here), a
    /// header that is not `key=value`, a compression other than `none`, a
    /// timeout that is not a number of milliseconds.
    pub(crate) fn from_vars(vars: Vars<'_>, signal: Signal) -> Result<Self, TelemetryError> {
        let protocol = Protocol::of(vars, signal)?;
        let [own, general] = Variable::Endpoint.names(signal);
        let (variable, url) = match (vars(own), vars(general), protocol) {
            (Some(url), _, _) => (own, url),
            (None, Some(base), Protocol::Grpc) => (general, base),
            (None, Some(base), Protocol::HttpProtobuf) => (
                general,
                format!("{}{}", base.trim_end_matches('/'), signal.path()),
            ),
            (None, None, Protocol::Grpc) => (general, "http://localhost:4317".to_owned()),
            (None, None, Protocol::HttpProtobuf) => {
                (general, format!("http://localhost:4318{}", signal.path()))
            }
        };
        let url = url.trim().to_owned();
        let scheme = url::Url::parse(&url).map(|parsed| parsed.scheme().to_owned());
        match (scheme.as_deref(), protocol) {
            (Ok("http"), _) | (Ok("https"), Protocol::HttpProtobuf) => {}
            (Ok("https"), Protocol::Grpc) => {
                return Err(TelemetryError::new(
                    variable,
                    format!(
                        "`{url}`: gRPC over TLS is not built in; use http:// (a collector \
                         beside the process) or `http/protobuf`, which speaks TLS"
                    ),
                ));
            }
            _ => {
                return Err(TelemetryError::new(
                    variable,
                    format!("`{url}` is not an http:// or https:// URL"),
                ));
            }
        }
        let [_, general_headers] = Variable::Headers.names(signal);
        let (headers_variable, headers) = match first(vars, Variable::Headers, signal) {
            Some((variable, text)) => (
                variable,
                headers(&text).map_err(|message| TelemetryError::new(variable, message))?,
            ),
            None => (general_headers, Vec::new()),
        };
        if let Some((variable, value)) = first(vars, Variable::Compression, signal)
            && value.trim() != "none"
        {
            return Err(TelemetryError::new(
                variable,
                format!("`{value}` is not supported: Skyport sends OTLP uncompressed (`none`)"),
            ));
        }
        let timeout = match first(vars, Variable::Timeout, signal) {
            Some((variable, text)) => Duration::from_millis(milliseconds(variable, &text)?),
            None => DEFAULT_TIMEOUT,
        };
        Ok(Self {
            protocol,
            url,
            endpoint_variable: variable,
            headers,
            headers_variable,
            timeout,
        })
    }
}

/// A positive whole number of milliseconds, from `variable`'s value `text`.
pub(crate) fn milliseconds(variable: &'static str, text: &str) -> Result<u64, TelemetryError> {
    text.trim()
        .parse()
        .ok()
        .filter(|ms| *ms > 0)
        .ok_or_else(|| {
            TelemetryError::new(
                variable,
                format!("`{text}` is not a positive number of milliseconds"),
            )
        })
}

/// `key=value` pairs separated by commas, each value percent-encoded (the
/// W3C Baggage form the specification prescribes).
fn headers(text: &str) -> Result<Vec<(String, SecretString)>, String> {
    text.split(',')
        .map(str::trim)
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (key, value) = pair
                .split_once('=')
                .ok_or_else(|| format!("`{pair}` is not `key=value`"))?;
            let key = key.trim();
            let valid = !key.is_empty()
                && key
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
            if !valid {
                return Err(format!("`{key}` is not a header name"));
            }
            let value = percent_decoded(value.trim())
                .filter(|v| v.bytes().all(|b| b == b'\t' || (b' '..=b'~').contains(&b)))
                .ok_or_else(|| format!("the value of `{key}` is not a header value"))?;
            Ok((key.to_ascii_lowercase(), SecretString::from(value)))
        })
        .collect()
}

/// `text` with each `%XX` replaced by its byte; `None` when that is not UTF-8 or an escape is cut short.
fn percent_decoded(text: &str) -> Option<String> {
    let mut bytes = Vec::with_capacity(text.len());
    let mut rest = text.as_bytes();
    while let Some((&byte, tail)) = rest.split_first() {
        if byte == b'%' {
            let hex = std::str::from_utf8(tail.get(..2)?).ok()?;
            bytes.push(u8::from_str_radix(hex, 16).ok()?);
            rest = &tail[2..];
        } else {
            bytes.push(byte);
            rest = tail;
        }
    }
    String::from_utf8(bytes).ok()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::collections::HashMap;

    use secrecy::ExposeSecret;

    use super::*;

    fn settings(pairs: &[(&str, &str)], signal: Signal) -> Result<SignalSettings, TelemetryError> {
        let env: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        SignalSettings::from_vars(&|name| env.get(name).cloned(), signal)
    }

    #[test]
    fn grpc_is_the_default_and_its_endpoint_is_used_as_it_is() {
        let traces = settings(
            &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317")],
            Signal::Traces,
        )
        .unwrap();
        assert_eq!(traces.protocol, Protocol::Grpc);
        assert_eq!(traces.url, "http://c:4317");
        assert_eq!(traces.timeout, Duration::from_secs(10));
        assert_eq!(
            settings(&[], Signal::Metrics).unwrap().url,
            "http://localhost:4317"
        );
    }

    #[test]
    fn over_http_the_general_endpoint_gets_the_signals_path_and_its_own_is_used_as_it_is() {
        let http = ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf");
        let base = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318/");
        assert_eq!(
            settings(&[http, base], Signal::Traces).unwrap().url,
            "http://c:4318/v1/traces"
        );
        assert_eq!(
            settings(&[http, base], Signal::Metrics).unwrap().url,
            "http://c:4318/v1/metrics"
        );
        let own = (
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
            "https://m.example/ingest",
        );
        assert_eq!(
            settings(&[http, base, own], Signal::Metrics).unwrap().url,
            "https://m.example/ingest"
        );
        assert_eq!(
            settings(&[http], Signal::Metrics).unwrap().url,
            "http://localhost:4318/v1/metrics"
        );
    }

    #[test]
    fn a_signals_own_variables_win_over_the_general_ones() {
        let chosen = settings(
            &[
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
                ("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "http/protobuf"),
                ("OTEL_EXPORTER_OTLP_TIMEOUT", "2000"),
                ("OTEL_EXPORTER_OTLP_METRICS_TIMEOUT", "500"),
                ("OTEL_EXPORTER_OTLP_HEADERS", "a=1"),
                (
                    "OTEL_EXPORTER_OTLP_METRICS_HEADERS",
                    "Api-Key=s%3Dcret, x-b = two",
                ),
            ],
            Signal::Metrics,
        )
        .unwrap();
        assert_eq!(chosen.protocol, Protocol::HttpProtobuf);
        assert_eq!(chosen.timeout, Duration::from_millis(500));
        let headers: Vec<(&str, &str)> = chosen
            .headers
            .iter()
            .map(|(key, value)| (key.as_str(), value.expose_secret()))
            .collect();
        assert_eq!(headers, [("api-key", "s=cret"), ("x-b", "two")]);
    }

    #[test]
    fn a_value_skyport_cannot_honour_names_its_variable() {
        for (name, value) in [
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
            ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "HTTP"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4317"),
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "https://collector:4317",
            ),
            ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "no-value"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "a=%zz"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "a b=1"),
            ("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "10s"),
            ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "0"),
        ] {
            let refused = settings(&[(name, value)], Signal::Traces).unwrap_err();
            assert_eq!(refused.variable, name, "{name}={value}");
        }
    }

    #[test]
    fn another_signals_variables_do_not_concern_this_one() {
        let traces = settings(
            &[("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "http/json")],
            Signal::Traces,
        );
        assert_eq!(traces.unwrap().protocol, Protocol::Grpc);
    }
}
