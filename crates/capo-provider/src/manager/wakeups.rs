//! The bridge from the membership engine to the controllers: each verdict change wakes the
//! objects it names through `Controller::reconcile_on`, and a subscriber that fell behind
//! re-syncs every object (`reconcile_all_on`). Nothing is polled.

use std::sync::Arc;

use futures::channel::mpsc;
use kube::runtime::reflector::ObjectRef;
use tokio_util::sync::CancellationToken;

use super::controllers::ClusterWakeups;
use crate::controllers::{Context, cluster};
use crate::membership::{Changes, Notice, OwnerKind};

/// The sending half of every controller's wake-ups.
pub struct WakeupSenders {
    clusters: mpsc::UnboundedSender<ObjectRef<cluster::Watched>>,
    cluster_resync: mpsc::UnboundedSender<()>,
}

/// Channels for the cluster controller's wake-ups.
pub fn channels() -> (WakeupSenders, ClusterWakeups) {
    let (clusters, changed) = mpsc::unbounded();
    let (cluster_resync, resync) = mpsc::unbounded();
    (
        WakeupSenders {
            clusters,
            cluster_resync,
        },
        ClusterWakeups { changed, resync },
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
            }
            Some(Notice::Changed(change)) => {
                for (kind, object) in change.wakes() {
                    // OpenStackMachines are woken by their own controller (a later part).
                    if kind != OwnerKind::OpenStackCluster {
                        continue;
                    }
                    ctx.note_wake(
                        cluster::object_key(&object.namespace, &object.name),
                        change.observed,
                    );
                    let target = ObjectRef::new(&object.name).within(&object.namespace);
                    let _ = senders.clusters.unbounded_send(target);
                }
            }
        }
    }
}
