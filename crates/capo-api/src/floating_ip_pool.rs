//! OpenStackFloatingIPPool (v1alpha1): a pool of floating IPs that answers Cluster API's
//! IPAddressClaims. Served with CAPO main's schema, so that the pools of a CAPO cluster stay
//! readable and writable after a takeover; capo-rs does not reconcile them yet (a machine
//! naming one in `floatingIPPoolRef` is told so in its conditions).

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::*;

/// Floating IPs allocated from an external network (or a preallocated list) to IP address
/// claims.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1alpha1",
    kind = "OpenStackFloatingIPPool",
    plural = "openstackfloatingippools",
    namespaced,
    status = "OpenStackFloatingIPPoolStatus",
    category = "cluster-api",
    label("cluster.x-k8s.io/v1beta2", "v1alpha1"),
    doc = "A pool of floating IPs for Cluster API's IP address claims.",
    derive = "PartialEq",
    derive = "Default",
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct OpenStackFloatingIPPoolSpec {
    /// Floating IPs to hand out before allocating new ones.
    #[serde(
        default,
        rename = "preAllocatedFloatingIPs",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub pre_allocated_floating_ips: Vec<String>,
    /// The most floating IPs the pool holds; unlimited when unset.
    #[serde(default, rename = "maxIPs", skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::plain_integer")]
    pub max_ips: Option<i64>,
    /// Credentials for the cloud.
    pub identity_ref: IdentityRef,
    /// The external network to allocate from (the cluster's external network when unset).
    #[serde(
        default,
        rename = "floatingIPNetwork",
        skip_serializing_if = "Option::is_none"
    )]
    pub floating_ip_network: Option<NetworkParam>,
    /// What happens to an allocated floating IP when its claim goes: `Retain` or `Delete`.
    pub reclaim_policy: ReclaimPolicy,
}

/// What happens to a floating IP the pool allocated once its claim is deleted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ReclaimPolicy {
    /// The floating IP goes back into the pool.
    #[default]
    Retain,
    /// The floating IP is deleted.
    Delete,
}

/// What the pool holds.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OpenStackFloatingIPPoolStatus {
    /// Floating IPs handed to claims.
    #[serde(default, rename = "claimedIPs", skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    pub claimed_ips: Vec<String>,
    /// Floating IPs free to hand out.
    #[serde(
        default,
        rename = "availableIPs",
        skip_serializing_if = "Vec::is_empty"
    )]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    pub available_ips: Vec<String>,
    /// Floating IPs that could not be released or checked.
    #[serde(default, rename = "failedIPs", skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    pub failed_ips: Vec<String>,
    /// The network the pool allocates from, once resolved.
    #[serde(
        default,
        rename = "floatingIPNetwork",
        skip_serializing_if = "Option::is_none"
    )]
    pub floating_ip_network: Option<NetworkStatus>,
    /// Observations of the pool's state.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::schema::conditions")]
    pub conditions: Conditions,
    /// The `metadata.generation` last reconciled; -1 before the first reconcile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}
