//! The process's exposition ([`crate::metrics::Metrics::render`]) as one
//! OTLP `ExportMetricsServiceRequest`: the same series `/metrics` shows, read
//! back from the same text (with the dashboard's sample parser), so nothing
//! is counted twice and nothing is counted apart.
//!
//! A counter is a cumulative monotonic Sum named as its samples are
//! (`…_total`), a gauge a Gauge, a histogram a cumulative explicit-bucket
//! Histogram with its bounds, count and sum; labels become attributes. The
//! cumulative series start at the process's start. Other kinds (the registry
//! has none) are left out.

use std::collections::BTreeMap;

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::{
    AggregationTemporality, Gauge, Histogram, HistogramDataPoint, Metric, NumberDataPoint,
    ResourceMetrics, ScopeMetrics, Sum, metric, number_data_point,
};
use opentelemetry_proto::tonic::resource::v1::Resource;

use crate::dashboard::{Sample, parse};

/// When the series were read and since when the cumulative ones count, in
/// nanoseconds since the Unix epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Times {
    pub(crate) start: u64,
    pub(crate) now: u64,
}

/// The request that carries every counter, gauge and histogram of `text`
/// (OpenMetrics exposition text) for `resource`.
pub(crate) fn request(
    text: &str,
    resource: &Resource,
    times: Times,
) -> ExportMetricsServiceRequest {
    let metrics = families(text)
        .into_iter()
        .filter_map(|family| family.metric(times))
        .collect();
    ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            resource: Some(resource.clone()),
            scope_metrics: vec![ScopeMetrics {
                scope: Some(InstrumentationScope {
                    name: "skyport".to_owned(),
                    version: env!("CARGO_PKG_VERSION").to_owned(),
                    ..InstrumentationScope::default()
                }),
                metrics,
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
    }
}

/// One family of the exposition: its descriptors and its samples, in order.
#[derive(Debug, Default)]
struct Family {
    name: String,
    kind: String,
    help: String,
    unit: String,
    samples: Vec<(String, Sample)>,
}

/// The families of `text`: each `# TYPE` line begins one, its `# HELP` and
/// `# UNIT` lines describe it, and the samples that follow are its own.
fn families(text: &str) -> Vec<Family> {
    let mut families: Vec<Family> = Vec::new();
    let mut descriptions: BTreeMap<&str, (&str, &str)> = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# ") {
            let mut fields = rest.splitn(3, ' ');
            let (Some(keyword), Some(name)) = (fields.next(), fields.next()) else {
                continue;
            };
            let value = fields.next().unwrap_or("");
            let described = descriptions.entry(name).or_default();
            match keyword {
                "HELP" => described.0 = value,
                "UNIT" => described.1 = value,
                "TYPE" => families.push(Family {
                    name: name.to_owned(),
                    kind: value.to_owned(),
                    ..Family::default()
                }),
                _ => {}
            }
        } else if let (Some(family), Some(sample)) = (families.last_mut(), parse(line).next())
            && sample.0.starts_with(&family.name)
        {
            family.samples.push(sample);
        }
    }
    for family in &mut families {
        if let Some((help, unit)) = descriptions.get(family.name.as_str()) {
            family.help = (*help).to_owned();
            family.unit = (*unit).to_owned();
        }
    }
    families
}

impl Family {
    /// The family as an OTLP metric; `None` for a kind OTLP is not given,
    /// and for a family with no series yet (a point-less metric is invalid).
    fn metric(self, times: Times) -> Option<Metric> {
        if self.samples.is_empty() {
            return None;
        }
        let (name, data) = match self.kind.as_str() {
            "counter" => {
                let name = format!("{}_total", self.name);
                let data_points = self.points(&name, times.start, times.now);
                let sum = Sum {
                    data_points,
                    aggregation_temporality: AggregationTemporality::Cumulative as i32,
                    is_monotonic: true,
                };
                (name, metric::Data::Sum(sum))
            }
            "gauge" => {
                let data_points = self.points(&self.name, 0, times.now);
                (
                    self.name.clone(),
                    metric::Data::Gauge(Gauge { data_points }),
                )
            }
            "histogram" => {
                let histogram = Histogram {
                    data_points: self.histogram_points(times),
                    aggregation_temporality: AggregationTemporality::Cumulative as i32,
                };
                (self.name.clone(), metric::Data::Histogram(histogram))
            }
            _ => return None,
        };
        Some(Metric {
            name,
            description: self.help,
            unit: self.unit,
            data: Some(data),
            ..Metric::default()
        })
    }

    /// A number point for each sample named `name`.
    fn points(&self, name: &str, start: u64, now: u64) -> Vec<NumberDataPoint> {
        self.samples
            .iter()
            .filter(|(sample_name, _)| sample_name == name)
            .map(|(_, sample)| NumberDataPoint {
                attributes: attributes(&sample.labels),
                start_time_unix_nano: start,
                time_unix_nano: now,
                value: Some(number_data_point::Value::AsDouble(sample.value)),
                ..NumberDataPoint::default()
            })
            .collect()
    }

    /// A histogram point for each label set: OpenMetrics' cumulative
    /// `_bucket{le}` counts become the count of each bucket alone.
    fn histogram_points(&self, times: Times) -> Vec<HistogramDataPoint> {
        let bucket = format!("{}_bucket", self.name);
        let sum = format!("{}_sum", self.name);
        let count = format!("{}_count", self.name);
        let mut series: Vec<(BTreeMap<String, String>, Series)> = Vec::new();
        for (name, sample) in &self.samples {
            let mut labels = sample.labels.clone();
            let le = labels.remove("le");
            let at = match series.iter().position(|(l, _)| *l == labels) {
                Some(at) => at,
                None => {
                    series.push((labels, Series::default()));
                    series.len() - 1
                }
            };
            let parts = &mut series[at].1;
            match le.and_then(|le| le.parse::<f64>().ok()) {
                Some(le) if *name == bucket => parts.buckets.push((le, sample.value)),
                _ if *name == sum => parts.sum = sample.value,
                _ if *name == count => parts.count = sample.value,
                _ => {}
            }
        }
        series
            .into_iter()
            .map(|(labels, parts)| parts.point(&labels, times))
            .collect()
    }
}

/// The samples of one histogram series.
#[derive(Debug, Default)]
struct Series {
    /// (upper bound, cumulative count), in the order written (ascending, `+Inf` last).
    buckets: Vec<(f64, f64)>,
    sum: f64,
    count: f64,
}

impl Series {
    fn point(mut self, labels: &BTreeMap<String, String>, times: Times) -> HistogramDataPoint {
        self.buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        let explicit_bounds: Vec<f64> = self
            .buckets
            .iter()
            .map(|(le, _)| *le)
            .filter(|le| le.is_finite())
            .collect();
        let mut bucket_counts = Vec::with_capacity(explicit_bounds.len() + 1);
        let mut below = 0.0;
        for (_, cumulative) in self.buckets.iter().take(explicit_bounds.len()) {
            bucket_counts.push((cumulative - below).max(0.0) as u64);
            below = *cumulative;
        }
        // The last bucket, past every bound, holds what the finite ones do not.
        bucket_counts.push((self.count - below).max(0.0) as u64);
        HistogramDataPoint {
            attributes: attributes(labels),
            start_time_unix_nano: times.start,
            time_unix_nano: times.now,
            count: self.count as u64,
            sum: Some(self.sum),
            bucket_counts,
            explicit_bounds,
            ..HistogramDataPoint::default()
        }
    }
}

fn attributes(labels: &BTreeMap<String, String>) -> Vec<KeyValue> {
    labels
        .iter()
        .map(|(key, value)| KeyValue {
            key: key.clone(),
            value: Some(AnyValue {
                value: Some(any_value::Value::StringValue(value.clone())),
            }),
            ..KeyValue::default()
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use prometheus_client::encoding::EncodeLabelSet;
    use prometheus_client::encoding::text::encode;
    use prometheus_client::metrics::counter::Counter;
    use prometheus_client::metrics::family::Family as Labelled;
    use prometheus_client::metrics::gauge::Gauge as PromGauge;
    use prometheus_client::metrics::histogram::Histogram as PromHistogram;

    use super::*;
    use crate::metrics::component;

    #[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
    struct Labels {
        route: &'static str,
        method: &'static str,
    }

    const TIMES: Times = Times {
        start: 1_000,
        now: 5_000,
    };

    fn attribute(key: &str, value: &str) -> KeyValue {
        KeyValue {
            key: key.to_owned(),
            value: Some(AnyValue {
                value: Some(any_value::Value::StringValue(value.to_owned())),
            }),
            ..KeyValue::default()
        }
    }

    fn number(attributes: Vec<KeyValue>, start: u64, value: f64) -> NumberDataPoint {
        NumberDataPoint {
            attributes,
            start_time_unix_nano: start,
            time_unix_nano: TIMES.now,
            value: Some(number_data_point::Value::AsDouble(value)),
            ..NumberDataPoint::default()
        }
    }

    #[test]
    fn a_registrys_counter_gauge_and_histogram_become_the_same_otlp_points() {
        let mut registry = component();
        let requests = Labelled::<Labels, Counter>::default();
        registry.register("requests", "Requests answered", requests.clone());
        let open = PromGauge::<i64>::default();
        registry.register("open", "Connections open now", open.clone());
        let duration = Labelled::<Labels, PromHistogram>::new_with_constructor(|| {
            PromHistogram::new([0.1, 1.0])
        });
        registry.register("duration_seconds", "Time to answer", duration.clone());
        let post = Labels {
            route: "/api/deliveryrequests",
            method: "POST",
        };
        let get = Labels {
            route: "/api/deliveryrequests/{id}",
            method: "GET",
        };
        requests.get_or_create(&post).inc_by(3);
        requests.get_or_create(&get).inc();
        open.set(7);
        for seconds in [0.05, 0.5, 0.7, 30.0] {
            duration.get_or_create(&post).observe(seconds);
        }
        let mut exposition = String::new();
        encode(&mut exposition, &registry).unwrap();
        let resource = Resource {
            attributes: vec![attribute("service.name", "skyport")],
            ..Resource::default()
        };

        let request = request(&exposition, &resource, TIMES);

        let [resource_metrics] = &request.resource_metrics[..] else {
            panic!("one resource: {request:?}");
        };
        assert_eq!(resource_metrics.resource.as_ref(), Some(&resource));
        let [scope] = &resource_metrics.scope_metrics[..] else {
            panic!("one scope: {request:?}");
        };
        assert_eq!(scope.scope.as_ref().unwrap().name, "skyport");
        let route = |labels: &Labels| {
            vec![
                attribute("method", labels.method),
                attribute("route", labels.route),
            ]
        };
        let expected = vec![
            Metric {
                name: "skyport_requests_total".to_owned(),
                description: "Requests answered.".to_owned(),
                data: Some(metric::Data::Sum(Sum {
                    data_points: vec![
                        number(route(&get), TIMES.start, 1.0),
                        number(route(&post), TIMES.start, 3.0),
                    ],
                    aggregation_temporality: AggregationTemporality::Cumulative as i32,
                    is_monotonic: true,
                })),
                ..Metric::default()
            },
            Metric {
                name: "skyport_open".to_owned(),
                description: "Connections open now.".to_owned(),
                data: Some(metric::Data::Gauge(Gauge {
                    data_points: vec![number(Vec::new(), 0, 7.0)],
                })),
                ..Metric::default()
            },
            Metric {
                name: "skyport_duration_seconds".to_owned(),
                description: "Time to answer.".to_owned(),
                data: Some(metric::Data::Histogram(Histogram {
                    data_points: vec![HistogramDataPoint {
                        attributes: route(&post),
                        start_time_unix_nano: TIMES.start,
                        time_unix_nano: TIMES.now,
                        count: 4,
                        sum: Some(31.25),
                        bucket_counts: vec![1, 2, 1],
                        explicit_bounds: vec![0.1, 1.0],
                        ..HistogramDataPoint::default()
                    }],
                    aggregation_temporality: AggregationTemporality::Cumulative as i32,
                })),
                ..Metric::default()
            },
        ];
        // A family keeps its series in a hash map: their order is not the exposition's concern.
        let mut metrics = scope.metrics.clone();
        if let Some(metric::Data::Sum(sum)) = &mut metrics[0].data {
            sum.data_points
                .sort_by_key(|point| format!("{:?}", point.attributes));
        }
        assert_eq!(metrics, expected, "from\n{exposition}");
    }

    #[test]
    fn a_family_without_a_series_and_the_kinds_otlp_is_not_given_are_left_out() {
        let exposition = "# HELP skyport_x Things.\n# TYPE skyport_x counter\n\
                          # TYPE skyport_s stateset\nskyport_s{skyport_s=\"a\"} 1\n\
                          # TYPE skyport_g gauge\nskyport_g 2.5\n# EOF\n";
        let request = request(exposition, &Resource::default(), TIMES);
        let metrics = &request.resource_metrics[0].scope_metrics[0].metrics;
        let names: Vec<&str> = metrics.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, ["skyport_g"]);
    }
}
