//! Compensation: undoing the steps a delivery left behind, latest first.

use skyport_core::status::{Step, StepOutcome, StepResult};
use skyport_runtime::trace_span;
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::engine::Workflow;
use super::retry::Interrupted;
use super::steps::{self, UndoTarget};
use crate::resilience::client::StepError;

impl Workflow {
    /// Undoes `undo` (done in `target`'s epoch) in the order given and marks
    /// each step Compensated in `outcomes`. A compensation the service refuses is logged and noted on
    /// the step; it does not stop the others.
    pub(super) async fn compensate(
        &self,
        target: &UndoTarget<'_>,
        undo: &[Step],
        outcomes: &mut Vec<StepOutcome>,
        traceparent: Option<&str>,
        abandon: &CancellationToken,
    ) -> Result<(), Interrupted> {
        let delivery_id = target.delivery_id;
        for &step in undo {
            let Some(call) = steps::by_id(step).undo(target) else {
                continue;
            };
            let key = steps::call_key(delivery_id, target.epoch, step, true);
            let span = trace_span!(
                "undo",
                otel.name = %format_args!("undo {}", step.as_str()),
                step = step.as_str(),
            );
            let answer = self
                .client
                .call(step, &call, &key, traceparent, abandon)
                .instrument(span)
                .await;
            let index = outcomes
                .iter()
                .position(|o| o.step == step)
                .unwrap_or_else(|| {
                    outcomes.push(StepOutcome {
                        step,
                        result: StepResult::Succeeded,
                        at: OffsetDateTime::now_utc(),
                        calls: 0,
                        detail: None,
                    });
                    outcomes.len() - 1
                });
            let outcome = &mut outcomes[index];
            outcome.calls += answer.calls;
            outcome.at = OffsetDateTime::now_utc();
            match answer.result {
                Ok(_) => outcome.result = StepResult::Compensated,
                Err(StepError::Abandoned) => return Err(Interrupted::Abandoned),
                Err(StepError::Permanent { code, message }) => {
                    tracing::error!(%delivery_id, step = step.as_str(), %code, %message, "Could not undo a step; it needs a person.");
                    outcome.detail = Some(format!("compensation failed: {code}: {message}"));
                }
            }
        }
        Ok(())
    }
}

/// The steps that succeeded, latest first: the order to undo them in.
pub(super) fn succeeded_latest_first(outcomes: &[StepOutcome]) -> Vec<Step> {
    outcomes
        .iter()
        .rev()
        .filter(|o| o.result == StepResult::Succeeded)
        .map(|o| o.step)
        .collect()
}
