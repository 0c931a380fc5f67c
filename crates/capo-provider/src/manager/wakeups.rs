//! The bridge from the membership engine to the controllers: each verdict change wakes the
//! objects it names through `Controller::reconcile_on`, and a subscriber that fell behind
//! re-syncs every object (`reconcile_all_on`). Nothing is polled.

use std::sync::Arc;

use futures::channel::mpsc;
use kube::runtime::reflector::ObjectRef;
use tokio_util::sync::CancellationToken;

use super::controllers::{ClusterWakeups, MachineWakeups};
use crate::controllers::{Context, cluster, machine};
use crate::membership::{Changes, Notice, OwnerKind};

/// The sending half of every controller's wake-ups.
pub struct WakeupSenders {
    clusters: mpsc::UnboundedSender<ObjectRef<cluster::Watched>>,
    cluster_resync: mpsc::UnboundedSender<()>,
    machines: mpsc::UnboundedSender<ObjectRef<machine::Watched>>,
    machine_resync: mpsc::UnboundedSender<()>,
}

/// Channels for the cluster and machine controllers' wake-ups.
pub fn channels() -> (WakeupSenders, ClusterWakeups, MachineWakeups) {
    let (clusters, cluster_changed) = mpsc::unbounded();
    let (cluster_resync, cluster_resync_received) = mpsc::unbounded();
    let (machines, machine_changed) = mpsc::unbounded();
    let (machine_resync, machine_resync_received) = mpsc::unbounded();
    (
        WakeupSenders {
            clusters,
            cluster_resync,
            machines,
            machine_resync,
        },
        ClusterWakeups {
            changed: cluster_changed,
            resync: cluster_resync_received,
        },
        MachineWakeups {
            changed: machine_changed,
            resync: machine_resync_received,
        },
    )
}

/// Forwards the engine's changes until the engine or `shutdown` stops. Each woken cluster
/// also has the observation's time noted, so its reconcile can report how long the verdict
/// took to reach its condition.
pub async fn forward(
    mut changes: Changes,
    senders: WakeupSenders,
    ctx: Arc<Context>,
    shutdown: CancellationToken,
) {
    loop {
        let notice = tokio::select! {
            () = shutdown.cancelled() => return,
            notice = changes.recv() => notice,
        };
        match notice {
            None => return,
            Some(Notice::Resync { .. }) => {
                let _ = senders.cluster_resync.unbounded_send(());
                let _ = senders.machine_resync.unbounded_send(());
            }
            Some(Notice::Changed(change)) => {
                for (kind, object) in change.wakes() {
                    match kind {
                        OwnerKind::OpenStackCluster => {
                            ctx.note_wake(
                                cluster::object_key(&object.namespace, &object.name),
                                change.observed,
                            );
                            let target = ObjectRef::new(&object.name).within(&object.namespace);
                            let _ = senders.clusters.unbounded_send(target);
                        }
                        OwnerKind::OpenStackMachine => {
                            let target = ObjectRef::new(&object.name).within(&object.namespace);
                            let _ = senders.machines.unbounded_send(target);
                        }
                    }
                }
            }
        }
    }
}
