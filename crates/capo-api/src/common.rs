//! Types shared by several kinds: resource references and filters, server and port
//! specifications, and the status shapes that report what exists in OpenStack.
//!
//! JSON names, types, required-ness, enums and defaults match CAPO's v1beta2 API so that
//! existing manifests are accepted unchanged.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::schema;

/// Tag filters shared by every Neutron filter. Each tag must be non-empty and comma-free,
/// because Neutron takes them as a comma-separated query parameter.
macro_rules! neutron_filter {
    (
        $(#[$meta:meta])*
        pub struct $name:ident { $($(#[$fmeta:meta])* pub $field:ident : $ty:ty,)* }
    ) => {
        #[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
        $(#[$meta])*
        #[serde(rename_all = "camelCase")]
        #[schemars(extend("minProperties" = 1))]
        pub struct $name {
            $($(#[$fmeta])* #[serde(default, skip_serializing_if = "Option::is_none")] pub $field: $ty,)*
            /// Resources carrying all of these tags.
            #[serde(default, skip_serializing_if = "Vec::is_empty")]
            #[schemars(inner(length(min = 1), regex(pattern = r"^[^,]+$")), extend("x-kubernetes-list-type" = "set"))]
            pub tags: Vec<String>,
            /// Resources carrying any of these tags.
            #[serde(default, skip_serializing_if = "Vec::is_empty")]
            #[schemars(inner(length(min = 1), regex(pattern = r"^[^,]+$")), extend("x-kubernetes-list-type" = "set"))]
            pub tags_any: Vec<String>,
            /// Excludes resources carrying all of these tags.
            #[serde(default, skip_serializing_if = "Vec::is_empty")]
            #[schemars(inner(length(min = 1), regex(pattern = r"^[^,]+$")), extend("x-kubernetes-list-type" = "set"))]
            pub not_tags: Vec<String>,
            /// Excludes resources carrying any of these tags.
            #[serde(default, skip_serializing_if = "Vec::is_empty")]
            #[schemars(inner(length(min = 1), regex(pattern = r"^[^,]+$")), extend("x-kubernetes-list-type" = "set"))]
            pub not_tags_any: Vec<String>,
        }
    };
}

neutron_filter! {
    /// Selects a Neutron network, security group or router by its attributes.
    pub struct NeutronFilter {
        /// Exact name.
        pub name: Option<String>,
        /// Exact description.
        pub description: Option<String>,
        /// Owning project.
        #[serde(rename = "projectID")]
        pub project_id: Option<String>,
    }
}

neutron_filter! {
    /// Selects a Neutron subnet by its attributes.
    pub struct SubnetFilter {
        /// Exact name.
        pub name: Option<String>,
        /// Exact description.
        pub description: Option<String>,
        /// Owning project.
        #[serde(rename = "projectID")]
        pub project_id: Option<String>,
        /// 4 or 6.
        #[serde(rename = "ipVersion")]
        pub ip_version: Option<i32>,
        /// Gateway address.
        #[serde(rename = "gatewayIP")]
        pub gateway_ip: Option<String>,
        /// Subnet CIDR.
        pub cidr: Option<String>,
        /// IPv6 address mode.
        #[serde(rename = "ipv6AddressMode")]
        pub ipv6_address_mode: Option<String>,
        /// IPv6 router advertisement mode.
        #[serde(rename = "ipv6RAMode")]
        pub ipv6_ra_mode: Option<String>,
    }
}

/// Selects a resource that has only a name to filter on (flavors, server groups).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(extend("minProperties" = 1))]
pub struct NameFilter {
    /// Exact name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// A reference to an OpenStack resource, either by UUID or by filter; exactly one is set.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(extend("minProperties" = 1, "maxProperties" = 1))]
pub struct IdOrFilter<F> {
    /// UUID of the resource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("format" = "uuid"))]
    pub id: Option<String>,
    /// Attributes the resource must match; exactly one resource must match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<F>,
}

/// A Neutron network by ID or filter.
pub type NetworkParam = IdOrFilter<NeutronFilter>;
/// A Neutron subnet by ID or filter.
pub type SubnetParam = IdOrFilter<SubnetFilter>;
/// A Neutron security group by ID or filter.
pub type SecurityGroupParam = IdOrFilter<NeutronFilter>;
/// A Neutron router by ID or filter.
pub type RouterParam = IdOrFilter<NeutronFilter>;
/// A Nova server group by ID or name.
pub type ServerGroupParam = IdOrFilter<NameFilter>;

/// A Nova flavor by ID or name; exactly one is set. Flavor IDs need not be UUIDs.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(extend("minProperties" = 1, "maxProperties" = 1))]
pub struct FlavorParam {
    /// Flavor ID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Flavor attributes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<NameFilter>,
}

/// Selects a Glance image by name and tags.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(extend("minProperties" = 1))]
pub struct ImageFilter {
    /// Exact name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Tags the image must carry.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    pub tags: Vec<String>,
}

/// A reference to an ORC Image object in the same namespace.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ResourceReference {
    /// Name of the referenced object.
    #[schemars(length(min = 1))]
    pub name: String,
}

/// An image by UUID, by filter, or by ORC Image reference; exactly one is set.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("minProperties" = 1, "maxProperties" = 1))]
pub struct ImageParam {
    /// Image UUID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("format" = "uuid"))]
    pub id: Option<String>,
    /// Image attributes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<ImageFilter>,
    /// An ORC Image object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_ref: Option<ResourceReference>,
}

/// Where the credentials for a cluster's cloud come from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum IdentityRefType {
    /// A Secret in the object's namespace.
    #[default]
    Secret,
    /// An OpenStackClusterIdentity naming a Secret elsewhere.
    ClusterIdentity,
}

/// Names the Secret (or OpenStackClusterIdentity) holding `clouds.yaml`, and the cloud in it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "has(self.region) == has(oldSelf.region) && (!has(self.region) || self.region == oldSelf.region)",
    "message": "identityRef.region cannot be changed"
}]))]
pub struct IdentityRef {
    /// `Secret` (default) or `ClusterIdentity`.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = "Secret"))]
    pub type_: Option<IdentityRefType>,
    /// Name of the Secret or OpenStackClusterIdentity.
    #[schemars(length(min = 1))]
    pub name: String,
    /// Entry in `clouds.yaml` to use.
    #[schemars(length(min = 1))]
    pub cloud_name: String,
    /// Region to use instead of the one in `clouds.yaml`. Cannot be changed once set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
}

impl IdentityRef {
    /// The identity kind, applying the CRD default.
    pub fn kind(&self) -> IdentityRefType {
        self.type_.unwrap_or_default()
    }
}

/// A typed reference to an object in the same namespace (used for floating IP pools).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TypedLocalObjectReference {
    /// API group of the referenced object; core group when empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_group: Option<String>,
    /// Kind of the referenced object.
    pub kind: String,
    /// Name of the referenced object.
    pub name: String,
}

/// An address pair that a port may also answer for.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AddressPair {
    /// IP address or CIDR.
    #[serde(rename = "ipAddress")]
    #[schemars(length(min = 1))]
    pub ip_address: String,
    /// MAC address; the port's own when empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac_address: Option<String>,
}

/// A fixed IP requested for a port.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FixedIp {
    /// Subnet to allocate from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subnet: Option<SubnetParam>,
    /// The address itself; allocated by Neutron when empty.
    #[serde(default, rename = "ipAddress", skip_serializing_if = "Option::is_none")]
    pub ip_address: Option<String>,
}

/// Port binding profile flags.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BindingProfile {
    /// Enable Open vSwitch hardware offload.
    #[serde(
        default,
        rename = "ovsHWOffload",
        skip_serializing_if = "Option::is_none"
    )]
    pub ovs_hw_offload: Option<bool>,
    /// Mark the SR-IOV virtual function as trusted.
    #[serde(default, rename = "trustedVF", skip_serializing_if = "Option::is_none")]
    pub trusted_vf: Option<bool>,
}

/// An extra key/value passed to Neutron when creating a port.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ValueSpec {
    /// Unique name of this entry.
    #[schemars(length(min = 1))]
    pub name: String,
    /// Key sent to Neutron.
    #[schemars(length(min = 1))]
    pub key: String,
    /// Value sent to Neutron, as given.
    #[schemars(length(min = 1))]
    pub value: String,
}

/// Port attributes that may also be resolved (filled in) by the controller.
macro_rules! port_attributes {
    (
        $(#[$meta:meta])*
        pub struct $name:ident { $($(#[$fmeta:meta])* pub $field:ident : $ty:ty,)* }
    ) => {
        #[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
        $(#[$meta])*
        #[serde(rename_all = "camelCase")]
        pub struct $name {
            $($(#[$fmeta])* pub $field: $ty,)*
            /// Tags for the port.
            #[serde(default, skip_serializing_if = "Vec::is_empty")]
            #[schemars(extend("x-kubernetes-list-type" = "set"))]
            pub tags: Vec<String>,
            /// Create a trunk for this port.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub trunk: Option<bool>,
            /// Extra addresses the port may use.
            #[serde(default, skip_serializing_if = "Vec::is_empty")]
            #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
            pub allowed_address_pairs: Vec<AddressPair>,
            /// Binding host.
            #[serde(default, rename = "hostID", skip_serializing_if = "Option::is_none")]
            pub host_id: Option<String>,
            /// VNIC type (normal, direct, ...).
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub vnic_type: Option<String>,
            /// Binding profile.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub profile: Option<BindingProfile>,
            /// Administrative state.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub admin_state_up: Option<bool>,
            /// MAC address.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub mac_address: Option<String>,
            /// Propagate the uplink status.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub propagate_uplink_status: Option<bool>,
            /// Enable port security (security groups, address pairs).
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub enable_port_security: Option<bool>,
            /// Extra attributes sent to Neutron.
            #[serde(default, skip_serializing_if = "Vec::is_empty")]
            #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
            pub value_specs: Vec<ValueSpec>,
        }
    };
}

port_attributes! {
    // The rule is a conditional on purpose: the API server runs it once per port, and
    // ports (like CAPO's) have no `maxItems`, so one evaluation may cost at most 9 (see
    // `api::cel_cost`); the `a || b || c || d` form of the same test costs 10.
    /// A port to create for a server.
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "has(self.enablePortSecurity) && !self.enablePortSecurity && has(self.securityGroups) ? size(self.securityGroups) == 0 : true",
        "message": "securityGroups cannot be set when enablePortSecurity is false"
    }]))]
    pub struct PortOpts {
        /// Network to attach to; the cluster network when empty.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub network: Option<NetworkParam>,
        /// Description of the port.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub description: Option<String>,
        /// Suffix appended to the server name to name the port.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub name_suffix: Option<String>,
        /// Fixed IPs to request.
        #[serde(default, rename = "fixedIPs", skip_serializing_if = "Vec::is_empty")]
        #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
        pub fixed_ips: Vec<FixedIp>,
        /// Security groups for the port.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
        pub security_groups: Vec<SecurityGroupParam>,
    }
}

/// A fixed IP after resolution: subnet by UUID.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResolvedFixedIp {
    /// Subnet UUID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subnet: Option<String>,
    /// The address itself.
    #[serde(default, rename = "ipAddress", skip_serializing_if = "Option::is_none")]
    pub ip_address: Option<String>,
}

port_attributes! {
    /// A port specification with every reference resolved to a UUID.
    pub struct ResolvedPortSpec {
        /// Port name.
        #[schemars(length(min = 1))]
        pub name: String,
        /// Description of the port.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub description: Option<String>,
        /// Network UUID.
        #[serde(rename = "networkID")]
        #[schemars(length(min = 1))]
        pub network_id: String,
        /// Fixed IPs to request.
        #[serde(default, rename = "fixedIPs", skip_serializing_if = "Vec::is_empty")]
        #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
        pub fixed_ips: Vec<ResolvedFixedIp>,
        /// Security group UUIDs.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
        pub security_groups: Vec<String>,
    }
}

/// Availability zone of a volume: a given name, or the machine's own zone.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum VolumeAzSource {
    /// Use `name`.
    #[default]
    Name,
    /// Use the machine's failure domain.
    Machine,
}

/// Where a volume's availability zone comes from.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "!has(self.from) || self.from == 'Name' ? has(self.name) : !has(self.name)",
    "message": "name must be set when from is Name (the default) and only then"
}]))]
pub struct VolumeAvailabilityZone {
    /// `Name` (default) or `Machine`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = "Name"))]
    pub from: Option<VolumeAzSource>,
    /// Zone name, when `from` is `Name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1), regex(pattern = r"^[^ ]+$"))]
    pub name: Option<String>,
}

/// A Cinder volume's type and zone.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BlockDeviceVolume {
    /// Volume type; the cloud's default when empty.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_: Option<String>,
    /// Availability zone of the volume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub availability_zone: Option<VolumeAvailabilityZone>,
}

/// The root volume of a server booted from a volume.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RootVolume {
    /// Size in GiB.
    #[serde(rename = "sizeGiB")]
    #[schemars(range(min = 1))]
    pub size_gib: i32,
    /// Volume type; the cloud's default when empty.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_: Option<String>,
    /// Availability zone of the volume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub availability_zone: Option<VolumeAvailabilityZone>,
}

/// Kind of storage behind an additional block device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum BlockDeviceType {
    /// Ephemeral disk on the hypervisor.
    Local,
    /// A Cinder volume.
    Volume,
}

/// Storage for an additional block device.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct BlockDeviceStorage {
    /// `Local` or `Volume`.
    #[serde(rename = "type")]
    pub type_: BlockDeviceType,
    /// Volume options when `type` is `Volume`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume: Option<BlockDeviceVolume>,
}

/// An extra disk attached to a server.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AdditionalBlockDevice {
    /// Unique name; also the device tag seen by the guest.
    #[schemars(length(min = 1))]
    pub name: String,
    /// Size in GiB.
    #[serde(rename = "sizeGiB")]
    #[schemars(range(min = 1))]
    pub size_gib: i32,
    /// Where the storage comes from.
    pub storage: BlockDeviceStorage,
}

/// A metadata entry set on a Nova server.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ServerMetadata {
    /// Metadata key.
    #[schemars(length(min = 1, max = 255))]
    pub key: String,
    /// Metadata value.
    #[schemars(length(min = 1, max = 255))]
    pub value: String,
}

/// The type of a scheduler hint value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum SchedulerHintValueType {
    /// `bool` is set.
    Bool,
    /// `string` is set.
    String,
    /// `number` is set.
    Number,
}

/// A typed scheduler hint value; exactly the member named by `type` is set.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "has(self.type) && self.type == 'Bool' ? has(self.bool) : !has(self.bool)",
     "message": "bool must be set when type is Bool and only then"},
    {"rule": "has(self.type) && self.type == 'Number' ? has(self.number) : !has(self.number)",
     "message": "number must be set when type is Number and only then"},
    {"rule": "has(self.type) && self.type == 'String' ? has(self.string) : !has(self.string)",
     "message": "string must be set when type is String and only then"}
]))]
pub struct SchedulerHintValue {
    /// Which value is set.
    #[serde(rename = "type")]
    pub type_: SchedulerHintValueType,
    /// Boolean value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bool: Option<bool>,
    /// Integer value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub number: Option<i32>,
    /// String value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 255))]
    pub string: Option<String>,
}

/// An extra scheduler hint passed to Nova.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SchedulerHintAdditionalProperty {
    /// Hint name.
    #[schemars(length(min = 1))]
    pub name: String,
    /// Hint value.
    pub value: SchedulerHintValue,
}

/// A Neutron port created for a server.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PortStatus {
    /// Port UUID.
    #[schemars(length(min = 1))]
    pub id: String,
}

/// A Cinder volume created for a server.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct VolumeStatus {
    /// Volume name (`<server>-root`, `<server>-<device>`).
    #[schemars(length(min = 1))]
    pub name: String,
    /// Volume UUID.
    #[schemars(length(min = 1))]
    pub id: String,
}

/// OpenStack resources created for a server, so they can be cleaned up.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct MachineResources {
    /// Ports created for the server, in the order of the resolved ports.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub ports: Vec<PortStatus>,
    /// Volumes created for the server (root volume and additional block devices). Not in
    /// CAPO's status: capo-rs records them so it can delete them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub volumes: Vec<VolumeStatus>,
}

/// A server specification with every reference resolved to a UUID.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResolvedServerSpec {
    /// Server group UUID.
    #[serde(
        default,
        rename = "serverGroupID",
        skip_serializing_if = "Option::is_none"
    )]
    pub server_group_id: Option<String>,
    /// Image UUID.
    #[serde(default, rename = "imageID", skip_serializing_if = "Option::is_none")]
    pub image_id: Option<String>,
    /// Flavor ID.
    #[serde(default, rename = "flavorID", skip_serializing_if = "Option::is_none")]
    pub flavor_id: Option<String>,
    /// Ports with their references resolved.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub ports: Vec<ResolvedPortSpec>,
}

/// A machine address as Cluster API reports it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct MachineAddress {
    /// Address type: Hostname, ExternalIP, InternalIP, ExternalDNS or InternalDNS.
    #[serde(rename = "type")]
    pub type_: String,
    /// The address.
    pub address: String,
}

/// A Neutron subnet as reported in status.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Subnet {
    /// Subnet name.
    #[schemars(length(min = 1))]
    pub name: String,
    /// Subnet UUID.
    #[schemars(length(min = 1))]
    pub id: String,
    /// Subnet CIDR.
    #[schemars(length(min = 1))]
    pub cidr: String,
    /// Subnet tags.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    pub tags: Vec<String>,
}

/// A Neutron network as reported in status.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct NetworkStatus {
    /// Network name.
    #[schemars(length(min = 1))]
    pub name: String,
    /// Network UUID.
    #[schemars(length(min = 1))]
    pub id: String,
    /// Network tags.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    pub tags: Vec<String>,
}

/// A Neutron network and its subnets as reported in status.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct NetworkStatusWithSubnets {
    /// Network name.
    #[schemars(length(min = 1))]
    pub name: String,
    /// Network UUID.
    #[schemars(length(min = 1))]
    pub id: String,
    /// Network tags.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    pub tags: Vec<String>,
    /// The network's subnets that the cluster uses.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub subnets: Vec<Subnet>,
}

/// A security group as reported in status.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SecurityGroupStatus {
    /// Security group name.
    #[schemars(length(min = 1))]
    pub name: String,
    /// Security group UUID.
    #[schemars(length(min = 1))]
    pub id: String,
}

/// Labels and annotations copied onto objects created from a template.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(extend("minProperties" = 1))]
pub struct TemplateObjectMeta {
    /// Labels to set.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Annotations to set.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// A kind's status conditions (`metav1.Condition`, one per `type`).
pub type Conditions = Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>;

/// The `status.initialization` block of the Cluster API v1beta2 contract.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Initialization {
    /// True once the infrastructure is provisioned; never reset to false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisioned: Option<bool>,
}

impl Initialization {
    /// Whether the object reports itself provisioned.
    pub fn is_provisioned(init: Option<&Self>) -> bool {
        init.and_then(|i| i.provisioned).unwrap_or(false)
    }
}

/// The status of a kind that owns one Nova server (OpenStackMachine, OpenStackServer).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InstanceStatus {
    /// Cluster API v1beta2 initialization status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initialization: Option<Initialization>,
    /// Nova server UUID.
    #[serde(
        default,
        rename = "instanceID",
        skip_serializing_if = "Option::is_none"
    )]
    pub instance_id: Option<String>,
    /// Nova server state (BUILD, ACTIVE, ERROR, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_state: Option<String>,
    /// The failure domain (availability zone) the machine was placed in (Cluster API's
    /// InfraMachine contract; machines only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_domain: Option<String>,
    /// Addresses of the server.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub addresses: Vec<MachineAddress>,
    /// The spec with references resolved to UUIDs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolved: Option<ResolvedServerSpec>,
    /// Resources created in OpenStack.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<MachineResources>,
    /// Observations of the object's state, one per type; `Ready` summarises the others.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "schema::conditions")]
    pub conditions: Conditions,
    /// The `metadata.generation` last reconciled; -1 before the first reconcile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}
