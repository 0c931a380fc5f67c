//! Cluster API's IPAM contract (`ipam.cluster.x-k8s.io/v1beta2`), as minimal types: an
//! IPAddressClaim asks a pool for an address, and the pool answers with an IPAddress named
//! after the claim. A management cluster has Cluster API's own CRDs for both; [`crds`]
//! generates minimal ones from these types for the demo and the simulated world.
//!
//! Also the names CAPO gives the objects of its OpenStackFloatingIPPool, which capo-rs keeps
//! so that a takeover finds them.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, CustomResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The IPAM group.
pub const GROUP: &str = "ipam.cluster.x-k8s.io";

/// The pool kind capo-rs serves.
pub const FLOATING_IP_POOL_KIND: &str = "OpenStackFloatingIPPool";

/// On an OpenStackFloatingIPPool: its floating IPs are released before it goes.
pub const POOL_FINALIZER: &str = "openstackfloatingippool.infrastructure.cluster.x-k8s.io";
/// On an IPAddress the pool made: its floating IP is released (deleted or returned to the
/// pool) before it goes.
pub const ADDRESS_FINALIZER: &str =
    "openstackfloatingippool.infrastructure.cluster.x-k8s.io/delete-floating-ip";
/// On the IPAddressClaim a server makes: the server lets its address go before it does.
pub const CLAIM_FINALIZER: &str = "openstackmachine.infrastructure.cluster.x-k8s.io/ip-claim";

/// The Neutron tag on every floating IP a pool allocates, by which a restart finds them.
pub fn pool_tag(pool: &str) -> String {
    format!("cluster-api-provider-openstack-fip-pool-{pool}")
}

/// The name of the IPAddressClaim a server with `floatingIPPoolRef` makes.
pub fn server_claim_name(server: &str) -> String {
    format!("{server}-floating-ip-address")
}

/// The pool a claim asks, or an address came from.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolReference {
    /// The pool kind's API group (e.g. `infrastructure.cluster.x-k8s.io`).
    pub api_group: String,
    /// The pool's kind; `OpenStackFloatingIPPool` for the pools capo-rs serves.
    pub kind: String,
    /// The pool's name, in the same namespace.
    pub name: String,
}

impl PoolReference {
    /// The name of the OpenStackFloatingIPPool this names, if it names one (CAPO matches by
    /// kind alone).
    pub fn floating_ip_pool(&self) -> Option<&str> {
        (self.kind == FLOATING_IP_POOL_KIND).then_some(self.name.as_str())
    }
}

/// A reference by name, in the same namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct LocalName {
    /// The referenced object's name.
    #[serde(default)]
    pub name: String,
}

/// A request for an IP address from a pool.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "ipam.cluster.x-k8s.io",
    version = "v1beta2",
    kind = "IPAddressClaim",
    plural = "ipaddressclaims",
    namespaced,
    status = "IPAddressClaimStatus",
    derive = "PartialEq",
    derive = "Default"
)]
#[serde(rename_all = "camelCase")]
pub struct IPAddressClaimSpec {
    /// The pool to allocate the address from.
    pub pool_ref: PoolReference,
    /// The Cluster the claim is for, if any: capo-rs copies the claiming object's cluster-name
    /// label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_name: Option<String>,
}

/// What the pool answered.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IPAddressClaimStatus {
    /// The IPAddress allocated for the claim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address_ref: Option<LocalName>,
    /// The claim's conditions, as the IPAM provider reports them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

impl IPAddressClaim {
    /// The IPAddress the pool answered with, once it has.
    pub fn address_name(&self) -> Option<&str> {
        self.status
            .as_ref()?
            .address_ref
            .as_ref()
            .map(|r| r.name.as_str())
            .filter(|n| !n.is_empty())
    }
}

/// An IP address allocated from a pool to a claim.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "ipam.cluster.x-k8s.io",
    version = "v1beta2",
    kind = "IPAddress",
    plural = "ipaddresses",
    namespaced,
    derive = "PartialEq",
    derive = "Default"
)]
#[serde(rename_all = "camelCase")]
pub struct IPAddressSpec {
    /// The IPAddressClaim this address answers (capo-rs's pool names the address after it).
    pub claim_ref: LocalName,
    /// The pool the address was allocated from.
    pub pool_ref: PoolReference,
    /// The allocated IP address, as text (e.g. `203.0.113.7`).
    pub address: String,
    /// The address's prefix length in bits; 32 for a floating IP from capo-rs's pool.
    pub prefix: i32,
    /// The gateway of the address's network, if the pool gives one; None for floating IPs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<String>,
}

/// Minimal CRDs for both kinds, unknown fields preserved (see the module's note).
pub fn crds() -> Vec<CustomResourceDefinition> {
    [IPAddressClaim::crd(), IPAddress::crd()]
        .into_iter()
        .map(crate::capi::preserve_unknown_fields)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_floating_ip_pool_reference_is_ours_whatever_its_group_says() {
        let pool = |kind: &str| PoolReference {
            api_group: "anything.example".into(),
            kind: kind.into(),
            name: "p".into(),
        };
        assert_eq!(
            pool("OpenStackFloatingIPPool").floating_ip_pool(),
            Some("p")
        );
        assert_eq!(pool("InClusterIPPool").floating_ip_pool(), None);
    }

    #[test]
    fn names_and_tags_are_capos() {
        assert_eq!(pool_tag("p"), "cluster-api-provider-openstack-fip-pool-p");
        assert_eq!(server_claim_name("s"), "s-floating-ip-address");
    }

    #[test]
    fn the_generated_crds_serve_v1beta2_with_a_status_for_claims_only() {
        let crds = crds();
        let claim = &crds[0].spec.versions[0];
        assert_eq!(claim.name, "v1beta2");
        assert!(
            claim
                .subresources
                .as_ref()
                .is_some_and(|s| s.status.is_some())
        );
        let address = &crds[1].spec.versions[0];
        assert!(
            address
                .subresources
                .as_ref()
                .is_none_or(|s| s.status.is_none())
        );
    }
}
