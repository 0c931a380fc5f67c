//! The wake-up contract between the engine and the controllers.
//!
//! Every verdict change is published as a [`Change`] naming the objects to wake, each with its
//! kind, so a manager can route the OpenStackCluster to the cluster controller and each
//! OpenStackMachine to the machine controller.
//!
//! Delivery is bounded, and never silently lossy: a subscriber that falls more than the
//! buffer behind receives [`Notice::Resync`] in place of what it missed. It must then
//! re-read everything it cares about (with kube-runtime, `Controller::reconcile_all_on`); the
//! engine's [`snapshot`](super::Engine::snapshot)s always hold the current verdicts, so
//! nothing is lost, only coalesced.

use prometheus::IntCounter;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use super::model::ObjectName;
use super::verdict::Reason;

/// The kinds a change wakes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OwnerKind {
    /// The OpenStackCluster whose API load balancer changed: the cluster controller's.
    OpenStackCluster,
    /// An OpenStackMachine with a member in (or leaving) it: the machine controller's.
    OpenStackMachine,
}

impl OwnerKind {
    /// The Kubernetes kind.
    pub fn as_str(self) -> &'static str {
        match self {
            OwnerKind::OpenStackCluster => "OpenStackCluster",
            OwnerKind::OpenStackMachine => "OpenStackMachine",
        }
    }
}

/// A load balancer's verdict changed.
#[derive(Clone, Debug)]
pub struct Change {
    /// The Octavia load balancer's id.
    pub lb_id: String,
    /// The desired-state generation the verdict reflects (see [`Engine::ensure`](super::Engine::ensure)).
    pub generation: u64,
    /// The OpenStackCluster whose load balancer it is.
    pub cluster: ObjectName,
    /// The OpenStackMachines with a desired member in it, each once.
    pub machines: Vec<ObjectName>,
    /// The verdict's new reason (the gate condition's reason).
    pub reason: Reason,
    /// When the poll's answer arrived (real time): subscribers can measure wake-up latency.
    pub observed: std::time::Instant,
}

impl Change {
    /// Every object to wake, with its kind: the cluster first, then the machines.
    pub fn wakes(&self) -> impl Iterator<Item = (OwnerKind, &ObjectName)> {
        std::iter::once((OwnerKind::OpenStackCluster, &self.cluster)).chain(
            self.machines
                .iter()
                .map(|machine| (OwnerKind::OpenStackMachine, machine)),
        )
    }
}

/// What a subscriber receives.
#[derive(Clone, Debug)]
pub enum Notice {
    /// One load balancer's verdict changed: wake the objects it names.
    Changed(Change),
    /// The subscriber fell behind and `missed` changes were dropped for it: treat every
    /// object as changed (re-read snapshots, or reconcile all).
    Resync {
        /// How many changes were dropped for this subscriber.
        missed: u64,
    },
}

/// One subscriber's changes, from [`Engine::subscribe`](super::Engine::subscribe).
pub struct Changes {
    receiver: broadcast::Receiver<Change>,
    resyncs: IntCounter,
    shutdown: CancellationToken,
}

impl Changes {
    pub(crate) fn new(
        receiver: broadcast::Receiver<Change>,
        resyncs: IntCounter,
        shutdown: CancellationToken,
    ) -> Self {
        Changes {
            receiver,
            resyncs,
            shutdown,
        }
    }

    /// The next notice; `None` once the engine shuts down (changes already published are
    /// delivered first).
    pub async fn recv(&mut self) -> Option<Notice> {
        let received = tokio::select! {
            biased;
            received = self.receiver.recv() => received,
            () = self.shutdown.cancelled() => return None,
        };
        match received {
            Ok(change) => Some(Notice::Changed(change)),
            Err(broadcast::error::RecvError::Lagged(missed)) => {
                self.resyncs.inc();
                tracing::warn!(
                    missed,
                    "a change subscriber fell behind; it re-syncs everything"
                );
                Some(Notice::Resync { missed })
            }
            Err(broadcast::error::RecvError::Closed) => None,
        }
    }
}
