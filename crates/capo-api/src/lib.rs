//! The Kubernetes API of capo-rs: CRD types compatible with CAPO's v1beta2 API, the
//! condition vocabulary, and the generated CRDs.

#![warn(missing_docs)]

pub mod admission;
pub mod capi;
pub mod capo_conditions;
pub mod cel_cost;
pub mod cluster;
pub mod common;
pub mod conditions;
pub mod conversion;
pub mod crds;
pub mod floating_ip_pool;
pub mod identity;
pub mod ipam;
pub mod machine;
pub mod schema;
pub mod server;

pub use cluster::{
    OpenStackCluster, OpenStackClusterSpec, OpenStackClusterStatus, OpenStackClusterTemplate,
};
pub use floating_ip_pool::OpenStackFloatingIPPool;
pub use identity::OpenStackClusterIdentity;
pub use machine::{
    OpenStackMachine, OpenStackMachineSpec, OpenStackMachineStatus, OpenStackMachineTemplate,
};
pub use server::{OpenStackServer, OpenStackServerSpec, OpenStackServerStatus};

/// The API group of every kind.
pub const GROUP: &str = "infrastructure.cluster.x-k8s.io";
