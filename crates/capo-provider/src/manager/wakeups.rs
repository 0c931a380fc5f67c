//! The bridge from the membership engine to the controllers: each verdict change wakes the
//! objects it names through `Controller::reconcile_on`, and a subscriber that fell behind
//! re-syncs every object (`reconcile_all_on`). Nothing is polled. The wake-ups waiting for a
//! controller are bounded: when its queue is full, the controller is re-synced instead, so a
//! burst costs at most the bound in memory and loses no wake-up.

use std::sync::Arc;

use futures::channel::mpsc;
use kube::runtime::reflector::ObjectRef;
use tokio_util::sync::CancellationToken;

use super::controllers::{ClusterWakeups, MachineWakeups};
use crate::controllers::{Context, cluster, machine};
use crate::membership::{Changes, Notice, OwnerKind};

/// Wake-ups waiting for one controller at once.
pub const WAKEUPS_BUFFERED: usize = 4096;

/// The sending half of every controller's wake-ups.
pub struct WakeupSenders {
    clusters: mpsc::Sender<ObjectRef<cluster::Watched>>,
    cluster_resync: mpsc::Sender<()>,
    machines: mpsc::Sender<ObjectRef<machine::Watched>>,
    machine_resync: mpsc::Sender<()>,
}

/// Channels for the cluster and machine controllers' wake-ups. A re-sync channel holds one
/// message: one re-sync waiting covers any number.
pub fn channels() -> (WakeupSenders, ClusterWakeups, MachineWakeups) {
    let (clusters, cluster_changed) = mpsc::channel(WAKEUPS_BUFFERED);
    let (cluster_resync, cluster_resync_received) = mpsc::channel(0);
    let (machines, machine_changed) = mpsc::channel(WAKEUPS_BUFFERED);
    let (machine_resync, machine_resync_received) = mpsc::channel(0);
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
    mut senders: WakeupSenders,
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
                let _ = senders.cluster_resync.try_send(());
                let _ = senders.machine_resync.try_send(());
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
                            wake(&mut senders.clusters, &mut senders.cluster_resync, target);
                        }
                        OwnerKind::OpenStackMachine => {
                            let target = ObjectRef::new(&object.name).within(&object.namespace);
                            wake(&mut senders.machines, &mut senders.machine_resync, target);
                        }
                    }
                }
            }
        }
    }
}

/// Queues a wake-up for `target`, or, when the controller's queue is full, a re-sync in its
/// place (a re-sync already waiting is enough).
fn wake<T>(queue: &mut mpsc::Sender<T>, resync: &mut mpsc::Sender<()>, target: T) {
    if queue
        .try_send(target)
        .is_err_and(|refused| refused.is_full())
    {
        let _ = resync.try_send(());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;

    #[test]
    fn a_full_queue_turns_into_one_resync() {
        let (mut queue, mut woken) = mpsc::channel::<u32>(2);
        let (mut resync, mut resyncs) = mpsc::channel::<()>(0);
        for target in 0..100 {
            wake(&mut queue, &mut resync, target);
        }
        drop((queue, resync));
        let queued: Vec<u32> = futures::executor::block_on((&mut woken).collect());
        assert!(
            queued.len() < 100 && queued.len() <= 3,
            "bounded: {queued:?}"
        );
        let resynced: Vec<()> = futures::executor::block_on((&mut resyncs).collect());
        assert_eq!(
            resynced.len(),
            1,
            "one re-sync stands for every wake-up that did not fit"
        );
    }
}
