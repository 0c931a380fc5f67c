//! OpenStackMachine and OpenStackMachineTemplate (v1beta2).

#![allow(
    clippy::duplicated_attributes,
    reason = "each kube printcolumn(...) repeats the same keys"
)]

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::*;
use super::schema;

/// The server an OpenStackMachine (or the bastion) runs on.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1beta2",
    kind = "OpenStackMachine",
    plural = "openstackmachines",
    namespaced,
    status = "OpenStackMachineStatus",
    shortname = "osm",
    category = "cluster-api",
    label("cluster.x-k8s.io/v1beta2", "v1beta2"),
    doc = "A Cluster API infrastructure machine: one Nova server and its ports.",
    derive = "PartialEq",
    derive = "Default",
    printcolumn(
        name = "Cluster",
        type_ = "string",
        json_path = ".metadata.labels['cluster\\.x-k8s\\.io/cluster-name']",
        description = "Cluster this machine belongs to"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status",
        description = "Ready condition"
    ),
    printcolumn(
        name = "Provisioned",
        type_ = "boolean",
        json_path = ".status.initialization.provisioned",
        description = "Infrastructure provisioned"
    ),
    printcolumn(
        name = "InstanceState",
        type_ = "string",
        json_path = ".status.instanceState",
        description = "Nova server state"
    ),
    printcolumn(
        name = "LBMember",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"APIServerLoadBalancerMemberReady\")].reason",
        description = "API load balancer member state"
    ),
    printcolumn(
        name = "ProviderID",
        type_ = "string",
        json_path = ".spec.providerID",
        priority = 1,
        description = "Provider ID"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "!has(self.rootVolume) || !has(self.additionalBlockDevices) || self.additionalBlockDevices.all(d, d.name != 'root')",
    "message": "additionalBlockDevices cannot contain a device named root when rootVolume is set"
}]))]
pub struct OpenStackMachineSpec {
    /// `openstack:///<server UUID>`; set by the controller once the machine may join the
    /// cluster's API load balancer rotation.
    #[serde(
        default,
        rename = "providerID",
        skip_serializing_if = "Option::is_none"
    )]
    pub provider_id: Option<String>,
    /// Flavor of the server.
    pub flavor: FlavorParam,
    /// Image to boot from.
    pub image: ImageParam,
    /// Nova keypair to inject.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh_key_name: Option<String>,
    /// Ports to create; one port on the cluster network when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub ports: Vec<PortOpts>,
    /// Security groups for ports that do not name their own.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub security_groups: Vec<SecurityGroupParam>,
    /// Create trunks for the ports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trunk: Option<bool>,
    /// Tags for the server and its ports.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    pub tags: Vec<String>,
    /// Nova metadata for the server.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["key"]))]
    pub server_metadata: Vec<ServerMetadata>,
    /// Use a config drive for user data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_drive: Option<bool>,
    /// Boot from a volume of this size and type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_volume: Option<RootVolume>,
    /// Extra disks.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub additional_block_devices: Vec<AdditionalBlockDevice>,
    /// Nova server group to place the server in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_group: Option<ServerGroupParam>,
    /// Credentials; the cluster's when empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity_ref: Option<IdentityRef>,
    /// Pool to take a floating IP from.
    #[serde(
        default,
        rename = "floatingIPPoolRef",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(extend("x-kubernetes-map-type" = "atomic"))]
    pub floating_ip_pool_ref: Option<TypedLocalObjectReference>,
    /// Extra Nova scheduler hints.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub scheduler_hint_additional_properties: Vec<SchedulerHintAdditionalProperty>,
}

/// What exists in OpenStack for an OpenStackMachine, and its conditions.
pub type OpenStackMachineStatus = InstanceStatus;

/// A template for OpenStackMachines, used by MachineDeployments and KubeadmControlPlanes.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1beta2",
    kind = "OpenStackMachineTemplate",
    plural = "openstackmachinetemplates",
    shortname = "osmt",
    namespaced,
    status = "OpenStackMachineTemplateStatus",
    category = "cluster-api",
    label("cluster.x-k8s.io/v1beta2", "v1beta2"),
    doc = "A template of OpenStackMachines.",
    derive = "PartialEq",
    derive = "Default",
    printcolumn(
        name = "Cluster",
        type_ = "string",
        json_path = ".metadata.labels['cluster\\.x-k8s\\.io/cluster-name']",
        description = "Cluster this template belongs to"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
pub struct OpenStackMachineTemplateSpec {
    /// The machine template.
    pub template: OpenStackMachineTemplateResource,
}

/// The machine specification inside an OpenStackMachineTemplate.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct OpenStackMachineTemplateResource {
    /// Spec of the machines created from this template.
    pub spec: OpenStackMachineSpec,
}

/// Capacity hints for autoscaling from zero, and conditions.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OpenStackMachineTemplateStatus {
    /// Resources a machine from this template provides (cpu, memory, ...).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "schema::quantity_map")]
    pub capacity: BTreeMap<String, Quantity>,
    /// Facts about the nodes this template creates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_info: Option<NodeInfo>,
    /// Observations of the object's state, one per type.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "schema::conditions")]
    pub conditions: Conditions,
    /// The `metadata.generation` last reconciled; -1 before the first reconcile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// Facts about the nodes a template creates.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("minProperties" = 1))]
pub struct NodeInfo {
    /// `linux` or `windows`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operating_system: Option<String>,
}
