//! The five steps: what each asks of its service, what it keeps from the
//! answer, and how it is undone — one [`Step`] implementation per file.
//!
//! [`ORDER`] is the one place the order of the workflow is written. A sixth
//! step is its file, a place in [`ORDER`] and a variant of the status
//! document's step enum.

mod account;
mod delivery;
mod drone;
mod package;
mod step;
mod third_party;

use skyport_core::status;

pub use self::step::{Progress, Step, UndoTarget};

/// The workflow, in order.
pub const ORDER: [&dyn Step; 5] = [
    &account::Account,
    &package::Package,
    &delivery::Delivery,
    &third_party::ThirdParty,
    &drone::Drone,
];

/// The step named `id`.
pub fn by_id(id: status::Step) -> &'static dyn Step {
    ORDER
        .into_iter()
        .find(|step| step.id() == id)
        .unwrap_or_else(|| unreachable!("every step is in ORDER"))
}

/// The idempotency key of `step`'s call (`undo`: its compensation) for a
/// delivery in attempt `epoch`: the first epoch's keys are the delivery and
/// the step, each later epoch's carry it, so a redrive makes new calls and a
/// replay within an epoch the same ones.
pub fn call_key(delivery_id: &str, epoch: u32, step: status::Step, undo: bool) -> String {
    let undo = if undo { ":undo" } else { "" };
    match epoch {
        0 => format!("{delivery_id}:{}{undo}", step.as_str()),
        epoch => format!("{delivery_id}:e{epoch}:{}{undo}", step.as_str()),
    }
}

/// The idempotency key of `step`'s update for revision `revision` of a
/// delivery in attempt `epoch` (`revert`: putting the previous revision back).
pub fn update_key(
    delivery_id: &str,
    epoch: u32,
    step: status::Step,
    revision: u32,
    revert: bool,
) -> String {
    let revert = if revert { ":revert" } else { "" };
    format!(
        "{}:r{revision}{revert}",
        call_key(delivery_id, epoch, step, false)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_later_epoch_calls_under_keys_of_its_own() {
        let step = status::Step::Package;
        assert_eq!(call_key("d-1", 0, step, false), "d-1:package");
        assert_eq!(call_key("d-1", 0, step, true), "d-1:package:undo");
        assert_eq!(call_key("d-1", 2, step, false), "d-1:e2:package");
        assert_eq!(call_key("d-1", 2, step, true), "d-1:e2:package:undo");
        let step = status::Step::Drone;
        assert_eq!(update_key("d-1", 0, step, 3, false), "d-1:drone:r3");
        assert_eq!(
            update_key("d-1", 1, step, 3, true),
            "d-1:e1:drone:r3:revert"
        );
    }
}
