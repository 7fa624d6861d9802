//! `[cosmos.throughput_groups.NAME]` and `[cosmos.throughput_control]`:
//! client-side throughput control. A group caps the request units per
//! second that some of Skyport's work spends, so that bulk work (the worker's
//! status writes) never starves what a client waits on (status reads, the
//! reservations of named requests), and so that several processes share one
//! budget (a global group).

use std::collections::BTreeMap;

use serde::Deserialize;

use super::checks::Checks;
use super::duration::Millis;

/// A kind of Skyport's work on Cosmos DB, which a throughput group controls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum Work {
    /// The worker's status writes (Processing, each step, the outcome).
    StatusWrites,
    /// The worker's dead letters.
    DeadLetters,
    /// The gateway's status reads (a client polling its status URL, or
    /// listing deliveries).
    StatusReads,
    /// The gateway's idempotency reservations (a named POST).
    Reservations,
    /// The Event Hubs consumer's ownership and checkpoint leases.
    Leases,
    /// The change-feed processor's reads of the status container's change
    /// feed (its feed ranges, its pages and its estimates of what is
    /// pending).
    ChangeFeed,
    /// The worker's timers of Waiting deliveries: each written beside its
    /// status write, the due ones read and removed once fired, their count,
    /// and the search for lost ones (which queries the status container).
    Timers,
}

impl Work {
    pub const ALL: [Self; 7] = [
        Self::StatusWrites,
        Self::DeadLetters,
        Self::StatusReads,
        Self::Reservations,
        Self::Leases,
        Self::ChangeFeed,
        Self::Timers,
    ];

    /// Whether a client waits on this work: over budget it is refused at
    /// once (503 + Retry-After) rather than held until the next cycle.
    pub fn holds_a_client(self) -> bool {
        matches!(self, Self::StatusReads | Self::Reservations)
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::StatusWrites => "status_writes",
            Self::DeadLetters => "dead_letters",
            Self::StatusReads => "status_reads",
            Self::Reservations => "reservations",
            Self::Leases => "leases",
            Self::ChangeFeed => "change_feed",
            Self::Timers => "timers",
        }
    }
}

/// The server-side priority a group's requests carry (`x-ms-cosmos-priority-level`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum Priority {
    High,
    Low,
}

/// What a group does when its control cannot start (the offer cannot be
/// read for `target_fraction`, the control container is missing).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum OnInitError {
    /// The process does not start, naming the group and the cause.
    #[default]
    Fail,
    /// The group's work runs uncontrolled (its priority still sent), with a warning.
    Continue,
}

/// Whether a group's budget is this process's own or shared.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum GroupScope {
    /// Each process spends up to the whole budget.
    #[default]
    Local,
    /// The processes running the group share the budget through the control
    /// container, each by its load.
    Global,
}

/// One throughput control group.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields)]
pub struct ThroughputGroupSettings {
    /// The container (one of `cosmos.*_container`) whose provisioned
    /// throughput `target_fraction` is a share of, and whose otherwise
    /// unassigned work the group takes when it is the `default`.
    pub container: String,
    /// The work the group controls, in whichever container it runs.
    pub work: Vec<Work>,
    /// Request units per second.
    pub target_ru_per_s: Option<u32>,
    /// A share (0, 1] of the container's provisioned throughput; with
    /// `target_ru_per_s` too, the smaller wins.
    pub target_fraction: Option<f64>,
    /// Unset: `low` when all of the group's work is the worker's (status
    /// writes, dead letters, leases, the change feed), else `high`.
    pub priority: Option<Priority>,
    /// Takes the work on `container` that no group names.
    pub default: bool,
    pub scope: GroupScope,
    pub on_init_error: OnInitError,
}

impl ThroughputGroupSettings {
    /// The priority the group's requests carry.
    pub fn effective_priority(&self) -> Priority {
        self.priority.unwrap_or_else(|| {
            if self.work.iter().all(|work| !work.holds_a_client()) && !self.work.is_empty() {
                Priority::Low
            } else {
                Priority::High
            }
        })
    }
}

/// How the processes of a global group share it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields)]
pub struct GlobalControlSettings {
    /// The control container (partition key `/groupId`), created when
    /// missing with `cosmos.create_if_missing`.
    pub container: String,
    /// How often each process renews its item and recomputes its share (≥ 5,000).
    pub renew_interval_ms: Millis,
    /// A process whose item has not been renewed for this long is counted as
    /// gone (≥ 2 × renew + 1,000).
    pub expire_interval_ms: Millis,
    /// How often the offer behind `target_fraction` is read again.
    pub offer_refresh_interval_ms: Millis,
}

impl Default for GlobalControlSettings {
    fn default() -> Self {
        Self {
            container: "throughputcontrol".into(),
            renew_interval_ms: Millis::new(5_000),
            expire_interval_ms: Millis::new(11_000),
            offer_refresh_interval_ms: Millis::new(15 * 60 * 1_000),
        }
    }
}

/// The least renewal interval of a global group.
pub const MIN_RENEW_INTERVAL_MS: u64 = 5_000;

impl GlobalControlSettings {
    pub(super) fn validate(&self, checks: &mut Checks<'_>) {
        checks.check(
            !self.container.trim().is_empty(),
            "container",
            "must not be empty",
        );
        let renew = self.renew_interval_ms.count();
        checks.at_least(renew, MIN_RENEW_INTERVAL_MS, "renew_interval_ms");
        checks.check(
            self.expire_interval_ms.count() >= 2 * renew + 1_000,
            "expire_interval_ms",
            format!(
                "must be at least twice renew_interval_ms plus 1,000 ({})",
                2 * renew + 1_000
            ),
        );
        checks.at_least(
            self.offer_refresh_interval_ms.count(),
            1_000,
            "offer_refresh_interval_ms",
        );
    }
}

/// Checks the groups against the containers Skyport uses (`containers`).
pub(super) fn validate_groups(
    groups: &BTreeMap<String, ThroughputGroupSettings>,
    containers: &[&str],
    checks: &mut Checks<'_>,
) {
    let mut owner: BTreeMap<Work, &str> = BTreeMap::new();
    let mut defaults: BTreeMap<&str, &str> = BTreeMap::new();
    for (name, group) in groups {
        let mut checks = checks.section(name);
        checks.check(
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'),
            "",
            "a group's name is letters, digits, '-' and '_'",
        );
        checks.check(
            containers.contains(&group.container.as_str()),
            "container",
            format!(
                "must be one of Skyport's containers: {}",
                containers.join(", ")
            ),
        );
        checks.check(
            group.target_ru_per_s.is_some()
                || group.target_fraction.is_some()
                || group.priority.is_some(),
            "target_ru_per_s",
            "a group needs target_ru_per_s, target_fraction or priority",
        );
        if let Some(ru) = group.target_ru_per_s {
            checks.at_least(ru, 1, "target_ru_per_s");
        }
        if let Some(fraction) = group.target_fraction {
            checks.check(
                fraction > 0.0 && fraction <= 1.0,
                "target_fraction",
                "must be above 0 and at most 1",
            );
        }
        checks.check(
            !group.work.is_empty() || group.default,
            "work",
            "must name the work the group controls (status_writes, dead_letters, status_reads, reservations, leases, change_feed), or the group must be its container's default",
        );
        for work in &group.work {
            if let Some(other) = owner.insert(*work, name) {
                checks.fail(
                    "work",
                    format!("{} is already controlled by group {other}", work.name()),
                );
            }
        }
        if group.default
            && let Some(other) = defaults.insert(group.container.as_str(), name)
        {
            checks.fail(
                "default",
                format!(
                    "group {other} is already the default of {}",
                    group.container
                ),
            );
        }
    }
}
