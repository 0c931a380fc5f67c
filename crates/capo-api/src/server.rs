//! OpenStackServer (v1alpha1): a Nova server managed on its own, e.g. the bastion.

#![allow(
    clippy::duplicated_attributes,
    reason = "each kube printcolumn(...) repeats the same keys"
)]

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::*;

/// A Nova server and its ports.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1alpha1",
    kind = "OpenStackServer",
    plural = "openstackservers",
    namespaced,
    status = "OpenStackServerStatus",
    shortname = "oss",
    category = "cluster-api",
    label("cluster.x-k8s.io/v1beta2", "v1alpha1"),
    doc = "A Nova server with its ports, managed on its own.",
    derive = "PartialEq",
    derive = "Default",
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
        description = "Server provisioned"
    ),
    printcolumn(
        name = "InstanceState",
        type_ = "string",
        json_path = ".status.instanceState",
        description = "Nova server state"
    ),
    printcolumn(
        name = "InstanceID",
        type_ = "string",
        json_path = ".status.instanceID",
        priority = 1,
        description = "Nova server UUID"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "has(self.flavor) || has(self.flavorID)",
    "message": "flavor or flavorID must be set"
}]))]
pub struct OpenStackServerSpec {
    /// Flavor name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub flavor: Option<String>,
    /// Flavor ID; takes precedence over `flavor`.
    #[serde(default, rename = "flavorID", skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub flavor_id: Option<String>,
    /// Image to boot from.
    pub image: ImageParam,
    /// Nova keypair to inject.
    pub ssh_key_name: String,
    /// Ports to create.
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
    /// Credentials for the cloud.
    pub identity_ref: IdentityRef,
    /// Pool to take a floating IP from.
    #[serde(
        default,
        rename = "floatingIPPoolRef",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(extend("x-kubernetes-map-type" = "atomic"))]
    pub floating_ip_pool_ref: Option<TypedLocalObjectReference>,
    /// Availability zone of the server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub availability_zone: Option<String>,
    /// Extra Nova scheduler hints.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub scheduler_hint_additional_properties: Vec<SchedulerHintAdditionalProperty>,
    /// Secret holding the user data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-map-type" = "atomic"))]
    pub user_data_ref: Option<LocalObjectReference>,
}

/// A reference to an object in the same namespace by name.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct LocalObjectReference {
    /// Name of the object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = ""))]
    pub name: Option<String>,
}

/// What exists in OpenStack for an OpenStackServer, and its conditions.
pub type OpenStackServerStatus = InstanceStatus;
