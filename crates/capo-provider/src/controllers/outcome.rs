//! How a reconcile that did not fail ended, and what that means for the next one.

use std::time::Duration;

use kube::runtime::controller::Action;

use super::metrics::ReconcileResult;

/// How a reconcile that did not fail ended: decides when the object is looked at again and
/// its `result` metric label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Nothing is on its way: look again when its next complete pass is due (within the
    /// sync period), for drift.
    Settled,
    /// Something in the cloud is on its way: look again after this long.
    Poll(Duration),
    /// Paused: nothing until the object or its Cluster changes.
    Paused,
    /// Deleted, finalizer removed.
    Deleted,
    /// The object does not decode: reported; nothing until it changes.
    Unreadable,
}

impl Outcome {
    /// What the controller does next; `settled_for` is how long a settled object may wait
    /// (`Context::settled_for`).
    pub fn action(self, settled_for: Duration) -> Action {
        match self {
            Outcome::Settled => Action::requeue(settled_for),
            Outcome::Poll(after) => Action::requeue(after),
            Outcome::Paused | Outcome::Deleted | Outcome::Unreadable => Action::await_change(),
        }
    }

    /// controller-runtime's `result` label: a requeue for a sync period is a success there
    /// too (it comes from the informer's resync, not from the result).
    pub fn result(self) -> ReconcileResult {
        match self {
            Outcome::Poll(_) => ReconcileResult::RequeueAfter,
            _ => ReconcileResult::Success,
        }
    }
}
