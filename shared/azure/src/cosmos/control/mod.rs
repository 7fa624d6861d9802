//! Client-side throughput control groups (`[cosmos.throughput_groups.NAME]`):
//! a group caps the request units per second its work spends, in 1 s cycles
//! charged with every response's actual request charge ([`budget`]); the
//! worker's requests over budget wait for a cycle with budget, a client's
//! (a status read, a reservation) are refused at once, for a 503 +
//! Retry-After. Each group's requests carry its server-side priority. A
//! global group's budget is shared by the processes running it through the
//! control container ([`global`]); a `target_fraction` is of the container's
//! provisioned throughput, read at start and every
//! `cosmos.throughput_control.offer_refresh_interval_ms` ([`offer`]).

mod budget;
mod global;
mod offer;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use super::metrics::{self, GroupLabels};
use azure_data_cosmos::options::{
    OperationOptions, OperationOptionsBuilder, PriorityLevel, ThroughputControlOptionsBuilder,
};
use azure_data_cosmos::{ContainerClient, CosmosClient};
use skyport_core::error::Throttled;
use skyport_runtime::config::{
    CosmosSettings, GroupScope, OnInitError, Priority, ThroughputGroupSettings, Work,
};
use skyport_runtime::error_chain::error_chain;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use self::budget::{Budget, group_budget};
use self::global::Member;
use super::error::CosmosOpenError;
use super::request_units::RequestUnits;

pub(crate) use self::budget::Ticket;

/// What a group tells about itself (for tests and tools).
#[derive(Debug, Clone, PartialEq)]
pub struct GroupReport {
    pub name: String,
    /// The group's budget, RU/s; `None` for a priority-only or uncontrolled group.
    pub budget: Option<f64>,
    /// The part of it this process may spend each second.
    pub allocated: Option<f64>,
    pub share: f64,
    /// Request units charged to the group so far.
    pub spent: f64,
    pub delayed: u64,
    pub throttled: u64,
}

#[derive(Debug)]
struct State {
    budget: Budget,
    /// The group's whole budget (RU/s), known once its offer is.
    group_ru: Option<f64>,
    /// The offer behind `target_fraction`.
    offer: Option<u32>,
    share: f64,
    spent: f64,
    delayed: u64,
    throttled: u64,
}

/// One throughput control group in this process.
pub(crate) struct Group {
    name: String,
    settings: ThroughputGroupSettings,
    options: OperationOptions,
    /// False for a priority-only group, or one whose control could not start.
    controlled: AtomicBool,
    /// The offer behind `target_fraction` changed the budget since a global
    /// group's processes last agreed on one (their config item).
    offer_changed: AtomicBool,
    state: Mutex<State>,
    labels: GroupLabels,
}

impl fmt::Debug for Group {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Group")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl Group {
    fn new(name: &str, settings: &ThroughputGroupSettings) -> Self {
        let priority = match settings.effective_priority() {
            Priority::High => PriorityLevel::High,
            Priority::Low => PriorityLevel::Low,
        };
        let options = OperationOptionsBuilder::new()
            .with_throughput_control(
                ThroughputControlOptionsBuilder::new()
                    .with_priority_level(priority)
                    .build(),
            )
            .build();
        // A fraction waits for the offer (Control::start reads it).
        let group_ru = match settings.target_fraction {
            Some(_) => None,
            None => settings.target_ru_per_s.map(f64::from),
        };
        let group = Self {
            name: name.to_owned(),
            settings: settings.clone(),
            options,
            controlled: AtomicBool::new(group_ru.is_some() || settings.target_fraction.is_some()),
            offer_changed: AtomicBool::new(false),
            state: Mutex::new(State {
                budget: Budget::new(Instant::now(), group_ru.unwrap_or(0.0)),
                group_ru,
                offer: None,
                share: 1.0,
                spent: 0.0,
                delayed: 0,
                throttled: 0,
            }),
            labels: GroupLabels {
                group: name.to_owned(),
            },
        };
        group.publish(&group.lock());
        group
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn controlled(&self) -> bool {
        self.controlled.load(Ordering::Relaxed)
    }

    /// Stops controlling the group (its control could not start and it
    /// continues uncontrolled); its priority is still sent.
    fn uncontrol(&self) {
        self.controlled.store(false, Ordering::Relaxed);
    }

    /// The key of the group's settings, for messages.
    fn key(&self) -> String {
        format!("cosmos.throughput_groups.{}", self.name)
    }

    /// Admits one request: `Ok(None)` when the group does not control it.
    /// Over budget, a request that may wait (`hold`) waits for a cycle with
    /// budget; one that may not is refused.
    pub(crate) async fn admit(&self, hold: bool) -> Result<Option<Ticket>, Throttled> {
        if !self.controlled() {
            return Ok(None);
        }
        let mut counted = false;
        loop {
            let now = Instant::now();
            let until = {
                let mut state = self.lock();
                match state.budget.admit(now) {
                    Ok(ticket) => return Ok(Some(ticket)),
                    Err(spent) => {
                        if !hold {
                            state.throttled += 1;
                            metrics::global()
                                .group_throttled
                                .get_or_create(&self.labels)
                                .inc();
                            return Err(Throttled {
                                what: format!("throughput control group {}", self.name),
                                retry_after: spent.until - now,
                            });
                        }
                        if !counted {
                            counted = true;
                            state.delayed += 1;
                            metrics::global()
                                .group_delayed
                                .get_or_create(&self.labels)
                                .inc();
                        }
                        spent.until
                    }
                }
            };
            tokio::time::sleep_until(until).await;
        }
    }

    /// Charges a response's request charge (errors included) to the group.
    pub(crate) fn settle(&self, ticket: Option<Ticket>, charge: f64) {
        let mut state = self.lock();
        state.spent += charge;
        if let Some(ticket) = ticket {
            state.budget.settle(Instant::now(), ticket, charge);
        }
        drop(state);
        if charge > 0.0 {
            metrics::global()
                .group_request_units
                .get_or_create(&self.labels)
                .inc_by(charge);
        }
    }

    /// The server-side priority the group's requests carry.
    pub(crate) fn options(&self) -> OperationOptions {
        self.options.clone()
    }

    /// A new offer for `target_fraction`: the budget follows it.
    fn set_offer(&self, offer: u32) {
        let mut state = self.lock();
        state.offer = Some(offer);
        let group_ru = group_budget(
            self.settings.target_ru_per_s,
            self.settings.target_fraction,
            Some(offer),
        );
        if group_ru != state.group_ru {
            self.offer_changed.store(true, Ordering::Relaxed);
        }
        state.group_ru = group_ru;
        self.reallocate(&mut state);
    }

    /// Whether the offer changed the budget since the last call.
    fn take_offer_change(&self) -> bool {
        self.offer_changed.swap(false, Ordering::Relaxed)
    }

    /// A budget agreed with the other processes of a global group.
    fn set_group_budget(&self, ru: f64) {
        let mut state = self.lock();
        state.group_ru = Some(ru);
        self.reallocate(&mut state);
    }

    fn set_share(&self, share: f64) {
        let mut state = self.lock();
        state.share = share;
        self.reallocate(&mut state);
    }

    fn group_ru(&self) -> Option<f64> {
        self.lock().group_ru
    }

    fn allocation(&self) -> f64 {
        self.lock().budget.allocation()
    }

    fn take_load_factor(&self) -> f64 {
        let load = self.lock().budget.take_load_factor(Instant::now());
        metrics::global()
            .group_load_factor
            .get_or_create(&self.labels)
            .set(load);
        load
    }

    fn reallocate(&self, state: &mut State) {
        let allocation = state.group_ru.unwrap_or(0.0) * state.share;
        if state.budget.is_fresh() {
            // Nothing spent yet (the store is opening): the first cycle
            // already has the allocation.
            state.budget = Budget::new(Instant::now(), allocation);
        } else {
            state.budget.set_allocation(Instant::now(), allocation);
        }
        self.publish(state);
    }

    fn publish(&self, state: &State) {
        let metrics = metrics::global();
        if let Some(ru) = state.group_ru {
            metrics.group_budget.get_or_create(&self.labels).set(ru);
        }
        metrics
            .group_allocated
            .get_or_create(&self.labels)
            .set(state.budget.allocation());
        metrics
            .group_share
            .get_or_create(&self.labels)
            .set(state.share);
    }

    fn report(&self) -> GroupReport {
        let state = self.lock();
        let controlled = self.controlled();
        GroupReport {
            name: self.name.clone(),
            budget: state.group_ru.filter(|_| controlled),
            allocated: controlled.then(|| state.budget.allocation()),
            share: state.share,
            spent: state.spent,
            delayed: state.delayed,
            throttled: state.throttled,
        }
    }
}

/// The containers a group may be on, by configured name, and the database.
pub(crate) struct Targets<'a> {
    pub(crate) client: &'a CosmosClient,
    pub(crate) containers: BTreeMap<&'a str, &'a ContainerClient>,
    pub(crate) control: Option<&'a ContainerClient>,
}

/// The throughput control groups of one store.
#[derive(Debug)]
pub(crate) struct Control {
    groups: Vec<Arc<Group>>,
    /// The group of each kind of work, if any.
    routes: BTreeMap<Work, Arc<Group>>,
    members: Vec<Arc<Member>>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    stop: CancellationToken,
}

impl Control {
    /// Starts the groups of `settings`: reads the offers behind fractions,
    /// joins global groups, and starts their refresh and renewal.
    ///
    /// # Errors
    /// [`CosmosOpenError::ThroughputControl`] names the group whose control
    /// could not start, unless it says `on_init_error = "continue"`.
    pub(crate) async fn start(
        settings: &CosmosSettings,
        targets: &Targets<'_>,
        units: &Arc<RequestUnits>,
    ) -> Result<Self, CosmosOpenError> {
        let mut groups = Vec::new();
        let mut members = Vec::new();
        let mut tasks = Vec::new();
        let stop = CancellationToken::new();
        for (name, group_settings) in &settings.throughput_groups {
            let group = Arc::new(Group::new(name, group_settings));
            let started = Self::start_group(settings, targets, units, &group, &stop).await;
            match started {
                Ok((member, group_tasks)) => {
                    members.extend(member);
                    tasks.extend(group_tasks);
                }
                Err(error) => match group_settings.on_init_error {
                    OnInitError::Fail => {
                        stop.cancel();
                        for task in tasks {
                            task.abort();
                        }
                        for member in &members {
                            member.leave().await;
                        }
                        return Err(CosmosOpenError::ThroughputControl {
                            key: group.key(),
                            source: error,
                        });
                    }
                    OnInitError::Continue => {
                        tracing::warn!(
                            group = %name,
                            error = %error_chain(&*error),
                            "The throughput control group could not start; its work runs uncontrolled (on_init_error = \"continue\")."
                        );
                        group.uncontrol();
                    }
                },
            }
            groups.push(group);
        }
        let routes = Self::routes(settings, &groups);
        Ok(Self {
            groups,
            routes,
            members,
            tasks: Mutex::new(tasks),
            stop,
        })
    }

    async fn start_group(
        settings: &CosmosSettings,
        targets: &Targets<'_>,
        units: &Arc<RequestUnits>,
        group: &Arc<Group>,
        stop: &CancellationToken,
    ) -> Result<(Option<Arc<Member>>, Vec<JoinHandle<()>>), skyport_core::ports::BoxError> {
        let group_settings = &group.settings;
        let offer_of = match group_settings.target_fraction {
            Some(_) => Some(
                *targets
                    .containers
                    .get(group_settings.container.as_str())
                    .ok_or_else(|| format!("no container named {}", group_settings.container))?,
            ),
            None => None,
        };
        if let Some(container) = offer_of {
            match offer::read(container, targets.client, &settings.database).await {
                Ok(offer) => group.set_offer(offer),
                Err(error) => {
                    let Some(target) = group_settings.target_ru_per_s else {
                        return Err(error);
                    };
                    tracing::warn!(
                        group = %group.name,
                        target,
                        error = %error_chain(&*error),
                        "The container's throughput cannot be read; the group runs on its target_ru_per_s until it can."
                    );
                    group.set_group_budget(f64::from(target));
                }
            }
        }
        let member = if group_settings.scope == GroupScope::Global {
            let control = targets.control.ok_or("the control container is not open")?;
            Some(Arc::new(
                Member::join(
                    control.clone(),
                    &settings.database,
                    Arc::clone(group),
                    &settings.throughput_control,
                    Arc::clone(units),
                )
                .await?,
            ))
        } else {
            None
        };
        // Started only once the group has started, so a failed start leaves no task behind.
        let mut tasks = Vec::new();
        if let Some(container) = offer_of {
            tasks.push(offer::refresh(
                container.clone(),
                targets.client.clone(),
                settings.database.clone(),
                Arc::clone(group),
                settings
                    .throughput_control
                    .offer_refresh_interval_ms
                    .duration(),
                stop.clone(),
            ));
        }
        if let Some(member) = &member {
            tasks.push(global::renew(Arc::clone(member), stop.clone()));
        }
        Ok((member, tasks))
    }

    /// Work goes to the group that names it, else to its container's default group.
    fn routes(settings: &CosmosSettings, groups: &[Arc<Group>]) -> BTreeMap<Work, Arc<Group>> {
        let mut routes = BTreeMap::new();
        for work in Work::ALL {
            let named = groups.iter().find(|g| g.settings.work.contains(&work));
            let container = container_of(work, settings);
            let default = || {
                groups
                    .iter()
                    .find(|g| g.settings.default && g.settings.container == container)
            };
            if let Some(group) = named.or_else(default) {
                routes.insert(work, Arc::clone(group));
            }
        }
        routes
    }

    /// The group that controls `work`, if any.
    pub(crate) fn group(&self, work: Work) -> Option<&Arc<Group>> {
        self.routes.get(&work)
    }

    pub(crate) fn reports(&self) -> Vec<GroupReport> {
        self.groups.iter().map(|g| g.report()).collect()
    }

    /// Stops refreshing and renewing; global groups remove this process's
    /// item, so the others take its share at their next renewal.
    pub(crate) async fn close(&self) {
        self.halt();
        for member in &self.members {
            member.leave().await;
        }
    }

    /// Stops refreshing and renewing and leaves the items behind, as a
    /// process that is killed does.
    pub(crate) fn halt(&self) {
        self.stop.cancel();
        for task in self
            .tasks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain(..)
        {
            task.abort();
        }
    }
}

/// The container `work` runs on.
fn container_of(work: Work, settings: &CosmosSettings) -> &str {
    match work {
        Work::StatusWrites | Work::StatusReads | Work::ChangeFeed => &settings.status_container,
        Work::DeadLetters => &settings.dead_letter_container,
        Work::Reservations => &settings.reservations_container,
        Work::Leases => &settings.leases_container,
        Work::Timers => &settings.timers_container,
    }
}

/// An error and its sources, on one line.
#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn settings(target: Option<u32>, fraction: Option<f64>) -> ThroughputGroupSettings {
        ThroughputGroupSettings {
            container: "status".into(),
            work: vec![Work::StatusWrites],
            target_ru_per_s: target,
            target_fraction: fraction,
            ..ThroughputGroupSettings::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_changed_offer_recomputes_the_fraction_from_the_next_cycle() {
        let group = Group::new("fraction", &settings(None, Some(0.25)));
        group.set_offer(1_200);
        assert_eq!(group.report().budget, Some(300.0));
        // A global group's processes agree on the budget again only when it changed.
        assert!(group.take_offer_change());
        group.set_offer(1_200);
        assert!(!group.take_offer_change());
        group.set_offer(4_000);
        assert!(group.take_offer_change());
        assert_eq!(group.report().budget, Some(1_000.0));
        assert_eq!(group.report().allocated, Some(1_000.0));
        // The smaller of an absolute target and the fraction.
        let both = Group::new("both", &settings(Some(500), Some(0.25)));
        both.set_offer(4_000);
        assert_eq!(both.report().budget, Some(500.0));
    }

    #[tokio::test(start_paused = true)]
    async fn over_budget_the_worker_waits_for_the_next_cycle_and_a_client_is_refused() {
        let group = Group::new("writes", &settings(Some(10), None));
        let ticket = group.admit(true).await.unwrap();
        group.settle(ticket, 25.0);
        let refused = group.admit(false).await.unwrap_err();
        // 15 over a budget of 10: two cycles until there is budget again.
        assert_eq!(refused.retry_after, Duration::from_secs(2));
        let started = Instant::now();
        let ticket = group.admit(true).await.unwrap();
        assert_eq!(started.elapsed(), Duration::from_secs(2));
        group.settle(ticket, 1.0);
        let report = group.report();
        assert_eq!(
            (report.delayed, report.throttled, report.spent),
            (1, 1, 26.0)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_priority_only_group_never_holds_a_request() {
        let mut only_priority = settings(None, None);
        only_priority.priority = Some(Priority::Low);
        let group = Group::new("priority", &only_priority);
        for _ in 0..100 {
            assert_eq!(group.admit(false).await.unwrap(), None);
            group.settle(None, 1_000.0);
        }
        assert_eq!(group.report().budget, None);
    }
}
