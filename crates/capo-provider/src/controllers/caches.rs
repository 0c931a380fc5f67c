//! What reconcilers read of the objects around theirs: the stores of the manager's shared
//! watches, not the API server. A store may lag a write by a moment; every object read here
//! also wakes the reader when it changes, so a late read is followed by a fresh one. Reads
//! that decide something irreversible (a finalizer removed because a server is gone) confirm
//! with the API server.

use std::sync::Arc;

use capo_api::capi::{self, Cluster, Machine};
use capo_api::{OpenStackCluster, OpenStackMachine, OpenStackServer};
use kube::Resource;
use kube::runtime::reflector::{ObjectRef, Store};

use super::packed::{Packable, Packed, Stored};

/// The stores, one per kind, shared by every controller.
#[derive(Clone)]
pub struct Caches {
    /// CAPI Clusters, kept whole.
    pub clusters: Store<Cluster>,
    /// CAPI Machines, packed (with their decode error if they do not decode).
    pub machines: Store<Packed<Machine>>,
    /// OpenStackClusters, packed.
    pub infra_clusters: Store<Packed<OpenStackCluster>>,
    /// OpenStackMachines, packed.
    pub infra_machines: Store<Packed<OpenStackMachine>>,
    /// OpenStackServers, packed.
    pub servers: Store<Packed<OpenStackServer>>,
}

fn key<K: kube::Resource<DynamicType = ()>>(namespace: &str, name: &str) -> ObjectRef<K> {
    ObjectRef::new(name).within(namespace)
}

/// The object, if it is stored and decodes (one that does not is its own controller's to
/// report; here it reads as absent).
fn decoded<K: Clone, S: Stored<K>>(stored: Option<Arc<S>>) -> Option<K> {
    stored.and_then(|s| s.decoded().ok().map(std::borrow::Cow::into_owned))
}

impl Packable for OpenStackCluster {}
impl Packable for OpenStackMachine {}
impl Packable for OpenStackServer {}

/// A Machine as the store keeps it: of its conditions only `Deleting`, the one read here
/// (Cluster API sets a dozen, with messages).
impl Packable for Machine {
    fn trim(&mut self) {
        if let Some(status) = self.status.as_mut() {
            status
                .conditions
                .retain(|c| c.type_ == capi::deleting::CONDITION);
        }
    }
}

impl Caches {
    /// The CAPI Cluster `namespace/name`, if the store has it.
    pub fn cluster(&self, namespace: &str, name: &str) -> Option<Cluster> {
        self.clusters
            .get(&key(namespace, name))
            .map(|c| c.as_ref().clone())
    }

    /// The CAPI Machine `namespace/name`, if stored and it decodes.
    pub fn machine(&self, namespace: &str, name: &str) -> Option<Machine> {
        decoded(self.machines.get(&key(namespace, name)))
    }

    /// The OpenStackCluster `namespace/name`, if stored and it decodes.
    pub fn infra_cluster(&self, namespace: &str, name: &str) -> Option<OpenStackCluster> {
        decoded(self.infra_clusters.get(&key(namespace, name)))
    }

    /// The OpenStackServer `namespace/name`, if stored and it decodes.
    pub fn server(&self, namespace: &str, name: &str) -> Option<OpenStackServer> {
        decoded(self.servers.get(&key(namespace, name)))
    }

    /// The OpenStackMachines in `namespace` that `wanted` picks by their metadata. Only those
    /// are decoded: a scan of a large namespace decodes a cluster's machines, not all.
    pub fn infra_machines(
        &self,
        namespace: &str,
        wanted: impl Fn(&Packed<OpenStackMachine>) -> bool,
    ) -> Vec<OpenStackMachine> {
        self.infra_machines
            .state()
            .iter()
            .filter(|stored| {
                stored.meta().namespace.as_deref() == Some(namespace) && wanted(stored)
            })
            .filter_map(|stored| stored.unpack().ok())
            .collect()
    }

    /// Waits until every store has listed once; reconcilers read none before.
    pub async fn wait_until_ready(&self) {
        let _ = futures::join!(
            self.clusters.wait_until_ready(),
            self.machines.wait_until_ready(),
            self.infra_clusters.wait_until_ready(),
            self.infra_machines.wait_until_ready(),
            self.servers.wait_until_ready(),
        );
    }
}
