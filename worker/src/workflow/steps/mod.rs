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
