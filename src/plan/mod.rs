//! `skyport plan`: the capacity planner. From a target (a sustained rate and
//! a spike), the costs the benchmark measured and the services' documented
//! limits it sizes the stream, the gateways, the workers and Cosmos DB, prints
//! each figure beside the rule that gave it, and writes Helm values that
//! realise it.
//!
//! The model is two pure functions: [`plan`] and [`predict`], the capacity of
//! a given shape of workers and partitions, which `plan` sizes the workers
//! with. The benchmark calls `predict` to hold the model to what a fleet
//! measured, so the figures the planner prints come from the same arithmetic
//! the benchmark checks. The rules, their constants and their sources:
//! `docs/capacity.md`.

mod cli;
mod error;
mod format;
mod helm;
mod limits;
mod machine;
mod measured;
mod model;
mod report;
mod sizing;

pub use self::cli::main;
pub use self::error::PlanError;
pub use self::format::thousands;
pub use self::helm::helm_values;
pub use self::limits::*;
pub use self::machine::{Machine, MachineCosts, plan_machine, render_machine};
pub use self::measured::{
    BENCHMARKS, BenchmarkFigures, MeasuredCosts, Sourced, SourcedRu, measured_costs,
};
pub use self::model::{
    Bound, Costs, Prediction, README_BODY, Shape, StreamKind, Target, event_bytes, predict,
};
pub use self::sizing::{
    BacklogPlan, CosmosPlan, Deployment, GatewayPlan, Namespace, OtherContainers, StreamPlan, Tier,
    WorkerPlan, plan,
};

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
