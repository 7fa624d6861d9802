//! The Cosmos DB adapter's Prometheus series: request units by operation
//! and by what they were for, and each throughput control group's budget,
//! allocation, share, load and what it held or refused. Registered in the
//! process's exposition (`skyport_runtime::metrics`) the first time
//! [`global`] is read, when a store opens.

use std::sync::LazyLock;
use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use skyport_runtime::metrics;

/// The adapter's series, registered once per process.
pub(crate) fn global() -> &'static CosmosMetrics {
    static METRICS: LazyLock<CosmosMetrics> =
        LazyLock::new(|| CosmosMetrics::registered_in(metrics::global()));
    &METRICS
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct SpendLabels {
    /// The request: `read`, `write`, `query`, `delete`, `change_feed` or
    /// `listing_write`.
    pub(crate) operation: &'static str,
    /// What it was for: a [`Spend`](super::request_units::Spend)'s name.
    pub(crate) work: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct GroupLabels {
    /// A Cosmos DB throughput control group, as configured.
    pub(crate) group: String,
}

type Ratio = Gauge<f64, AtomicU64>;

/// Every series of the adapter.
#[derive(Debug)]
pub(crate) struct CosmosMetrics {
    pub(crate) request_units: Family<SpendLabels, Counter<f64, AtomicU64>>,
    pub(crate) group_budget: Family<GroupLabels, Ratio>,
    pub(crate) group_allocated: Family<GroupLabels, Ratio>,
    pub(crate) group_share: Family<GroupLabels, Ratio>,
    pub(crate) group_load_factor: Family<GroupLabels, Ratio>,
    pub(crate) group_request_units: Family<GroupLabels, Counter<f64, AtomicU64>>,
    pub(crate) group_delayed: Family<GroupLabels, Counter>,
    pub(crate) group_throttled: Family<GroupLabels, Counter>,
}

impl CosmosMetrics {
    fn registered_in(exposition: &metrics::Metrics) -> Self {
        let mut registry = metrics::component();
        let request_units = Family::default();
        registry.register(
            "cosmos_request_units",
            "Cosmos DB request units charged, by operation and by what they were for",
            request_units.clone(),
        );
        let group_budget = Family::default();
        registry.register(
            "throughput_group_budget_ru_per_s",
            "A throughput control group's budget: its target, or its fraction of the container's offer",
            group_budget.clone(),
        );
        let group_allocated = Family::default();
        registry.register(
            "throughput_group_allocated_ru_per_s",
            "The part of a group's budget this process may spend each second",
            group_allocated.clone(),
        );
        let group_share = Family::default();
        registry.register(
            "throughput_group_share",
            "This process's share of a global group's budget (1 for a local group)",
            group_share.clone(),
        );
        let group_load_factor = Family::default();
        registry.register(
            "throughput_group_load_factor",
            "How much of its allocation this process used over the last renewal (at least 0.1)",
            group_load_factor.clone(),
        );
        let group_request_units = Family::default();
        registry.register(
            "throughput_group_request_units",
            "Request units charged to a group (errors included)",
            group_request_units.clone(),
        );
        let group_delayed = Family::default();
        registry.register(
            "throughput_group_delayed",
            "Requests a group held until a later cycle had budget",
            group_delayed.clone(),
        );
        let group_throttled = Family::default();
        registry.register(
            "throughput_group_throttled",
            "Requests a group refused at once (its budget spent; not the service's own 429s)",
            group_throttled.clone(),
        );
        exposition.register(registry);
        Self {
            request_units,
            group_budget,
            group_allocated,
            group_share,
            group_load_factor,
            group_request_units,
            group_delayed,
            group_throttled,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_adapters_series_are_exposed_under_their_names() {
        let exposition = metrics::Metrics::new();
        let cosmos = CosmosMetrics::registered_in(&exposition);
        cosmos
            .request_units
            .get_or_create(&SpendLabels {
                operation: "read",
                work: "status_reads",
            })
            .inc_by(2.5);
        cosmos
            .group_throttled
            .get_or_create(&GroupLabels {
                group: "ingest".into(),
            })
            .inc();
        let text = exposition.render();
        assert!(
            text.contains(
                "skyport_cosmos_request_units_total{operation=\"read\",work=\"status_reads\"} 2.5"
            ),
            "{text}"
        );
        assert!(
            text.contains("skyport_throughput_group_throttled_total{group=\"ingest\"} 1"),
            "{text}"
        );
    }
}
