//! OpenStackCluster and OpenStackClusterTemplate (v1beta2).

#![allow(
    clippy::duplicated_attributes,
    reason = "each kube printcolumn(...) repeats the same keys"
)]

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::*;
use super::machine::OpenStackMachineSpec;
use super::schema;

/// The network, security groups, API load balancer and bastion of a workload cluster.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1beta2",
    kind = "OpenStackCluster",
    plural = "openstackclusters",
    namespaced,
    status = "OpenStackClusterStatus",
    shortname = "osc",
    category = "cluster-api",
    label("cluster.x-k8s.io/v1beta2", "v1beta2"),
    doc = "A Cluster API infrastructure cluster on OpenStack.",
    derive = "PartialEq",
    derive = "Default",
    printcolumn(
        name = "Cluster",
        type_ = "string",
        json_path = ".metadata.labels['cluster\\.x-k8s\\.io/cluster-name']",
        description = "Cluster this object belongs to"
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
        name = "LoadBalancer",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"APIServerLoadBalancerReady\")].reason",
        description = "API load balancer gate"
    ),
    printcolumn(
        name = "Endpoint",
        type_ = "string",
        json_path = ".spec.controlPlaneEndpoint.host",
        priority = 1,
        description = "API endpoint host"
    ),
    printcolumn(
        name = "Network",
        type_ = "string",
        json_path = ".status.network.id",
        priority = 1,
        description = "Cluster network"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "has(self.enableExternalNetwork) && !self.enableExternalNetwork ? !has(self.bastion) || !has(self.bastion.floatingIP) : true",
     "message": "bastion.floatingIP needs the external network (enableExternalNetwork is false)"},
    {"rule": "has(self.enableExternalNetwork) && !self.enableExternalNetwork ? has(self.apiServer) && has(self.apiServer.enableFloatingIP) && !self.apiServer.enableFloatingIP : true",
     "message": "apiServer.enableFloatingIP must be set to false when enableExternalNetwork is false"}
]))]
pub struct OpenStackClusterSpec {
    /// Credentials for the cloud.
    pub identity_ref: IdentityRef,
    /// Parameters of a network to create; mutually exclusive with `network`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub managed_network: Option<ManagedNetwork>,
    /// Subnets to create in the managed network (at most one).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 1), extend("x-kubernetes-list-type" = "atomic"))]
    pub managed_subnets: Vec<SubnetSpec>,
    /// An existing network to use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkParam>,
    /// Existing subnets to use.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub subnets: Vec<SubnetParam>,
    /// The subnet whose addresses machines and the load balancer use first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub primary_subnet: Option<SubnetParam>,
    /// Parameters of a router to create.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub managed_router: Option<ManagedRouter>,
    /// An existing router to use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub router: Option<RouterParam>,
    /// The external network for the router and floating IPs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external_network: Option<NetworkParam>,
    /// Set to false for clusters without external connectivity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable_external_network: Option<bool>,
    /// How the Kubernetes API is exposed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_server: Option<ApiServer>,
    /// The API endpoint, set by the controller when empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_endpoint: Option<ApiEndpoint>,
    /// Availability zones for control-plane machines; all zones when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    pub control_plane_availability_zones: Vec<String>,
    /// Let Nova choose control-plane zones instead of Cluster API.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_omit_availability_zone: Option<bool>,
    /// Security groups to create and manage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub managed_security_groups: Option<ManagedSecurityGroups>,
    /// A bastion host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bastion: Option<Bastion>,
    /// Tags for every resource the controller creates.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    pub tags: Vec<String>,
}

/// Parameters of the network the controller creates.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "self == null || has(self.mtu) || has(self.enablePortSecurity)",
    "message": "managedNetwork, when set, must set mtu or enablePortSecurity"
}]))]
pub struct ManagedNetwork {
    /// Network MTU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<i32>,
    /// Enable port security on the network.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable_port_security: Option<bool>,
}

/// A subnet the controller creates.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SubnetSpec {
    /// Subnet CIDR.
    #[schemars(length(min = 1))]
    pub cidr: String,
    /// DNS servers handed out by DHCP.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub dns_nameservers: Vec<String>,
    /// DHCP allocation ranges.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub allocation_pools: Vec<AllocationPool>,
}

/// A DHCP allocation range.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct AllocationPool {
    /// First address.
    #[schemars(length(min = 1))]
    pub start: String,
    /// Last address.
    #[schemars(length(min = 1))]
    pub end: String,
}

/// Parameters of the router the controller creates.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "has(self.externalIPs)",
    "message": "managedRouter, when set, must set externalIPs"
}]))]
pub struct ManagedRouter {
    /// Fixed IPs of the router on the external network.
    #[serde(default, rename = "externalIPs", skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(min = 1), extend("x-kubernetes-list-type" = "atomic"))]
    pub external_ips: Vec<ExternalRouterIp>,
}

/// A router address on the external network.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExternalRouterIp {
    /// The address; allocated by Neutron when empty.
    #[serde(default, rename = "fixedIP", skip_serializing_if = "Option::is_none")]
    pub fixed_ip: Option<String>,
    /// Subnet of the external network.
    pub subnet: SubnetParam,
}

/// How the Kubernetes API server is exposed.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApiServer {
    /// The load balancer capo-rs manages in front of the control plane.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub managed_load_balancer: Option<ManagedLoadBalancer>,
    /// Attach a floating IP to the API endpoint.
    #[serde(
        default,
        rename = "enableFloatingIP",
        skip_serializing_if = "Option::is_none"
    )]
    pub enable_floating_ip: Option<bool>,
    /// A specific floating IP to use.
    #[serde(
        default,
        rename = "floatingIP",
        skip_serializing_if = "Option::is_none"
    )]
    pub floating_ip: Option<String>,
    /// A specific fixed IP for the load balancer VIP.
    #[serde(default, rename = "fixedIP", skip_serializing_if = "Option::is_none")]
    pub fixed_ip: Option<String>,
    /// API server port (default 6443).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::port_number")]
    pub port: Option<i32>,
}

/// The Octavia load balancer in front of the API servers.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ManagedLoadBalancer {
    /// Create the load balancer (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = true))]
    pub enabled: Option<bool>,
    /// Extra ports to forward to the control-plane machines.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    pub additional_ports: Vec<i32>,
    /// Source CIDRs allowed to reach the load balancer; everyone when empty.
    #[serde(
        default,
        rename = "allowedCIDRs",
        skip_serializing_if = "Vec::is_empty"
    )]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    pub allowed_cidrs: Vec<String>,
    /// Octavia provider (amphora, ovn, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// Network for the VIP; the cluster network when empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkParam>,
    /// Subnets for the VIP.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub subnets: Vec<SubnetParam>,
    /// Availability zone of the load balancer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub availability_zone: Option<String>,
    /// Octavia flavor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flavor: Option<String>,
    /// Health monitor settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub monitor: Option<LoadBalancerMonitor>,
}

impl ManagedLoadBalancer {
    /// Whether the load balancer is enabled, applying the CRD default.
    pub fn is_enabled(&self) -> bool {
        self.enabled.unwrap_or(true)
    }
}

/// Health monitor settings of the API load balancer.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LoadBalancerMonitor {
    /// Seconds between probes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub delay: Option<i32>,
    /// Seconds a probe may take.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub timeout: Option<i32>,
    /// Successful probes before a member is ONLINE.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 10))]
    pub max_retries: Option<i32>,
    /// Failed probes before a member is ERROR.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10))]
    pub max_retries_down: Option<i32>,
}

/// A host and port where the Kubernetes API is reached.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(extend("minProperties" = 1))]
pub struct ApiEndpoint {
    /// Hostname or IP address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    pub host: Option<String>,
    /// Port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: Option<i32>,
}

/// Security groups the controller creates: one for the control plane, one for workers and
/// one for the bastion.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ManagedSecurityGroups {
    /// Rules added to every node group.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub cluster_nodes_security_group_rules: Vec<SecurityGroupRuleSpec>,
    /// Rules added to the control-plane group.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub control_plane_nodes_security_group_rules: Vec<SecurityGroupRuleSpec>,
    /// Rules added to the worker group.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub worker_nodes_security_group_rules: Vec<SecurityGroupRuleSpec>,
    /// Allow all traffic between cluster nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = false))]
    pub allow_all_in_cluster_traffic: Option<bool>,
}

/// Traffic direction of a security group rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum RuleDirection {
    /// Incoming traffic.
    Ingress,
    /// Outgoing traffic.
    Egress,
}

/// IP version of a security group rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum EtherType {
    /// IPv4.
    IPv4,
    /// IPv6.
    IPv6,
}

/// A managed security group a rule may name as its remote.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ManagedGroupName {
    /// The bastion's group.
    Bastion,
    /// The control-plane group.
    Controlplane,
    /// The worker group.
    Worker,
}

/// A security group rule.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecurityGroupRuleSpec {
    /// Unique name of the rule in its list.
    #[schemars(length(min = 1))]
    pub name: String,
    /// Description of the rule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// `ingress` or `egress`.
    pub direction: RuleDirection,
    /// `IPv4` or `IPv6`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ether_type: Option<EtherType>,
    /// Lowest port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port_range_min: Option<i32>,
    /// Highest port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port_range_max: Option<i32>,
    /// IP protocol name or number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    /// Remote security group UUID.
    #[serde(
        default,
        rename = "remoteGroupID",
        skip_serializing_if = "Option::is_none"
    )]
    pub remote_group_id: Option<String>,
    /// Remote CIDR.
    #[serde(
        default,
        rename = "remoteIPPrefix",
        skip_serializing_if = "Option::is_none"
    )]
    pub remote_ip_prefix: Option<String>,
    /// Managed groups to allow traffic from.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    pub remote_managed_groups: Vec<ManagedGroupName>,
}

/// A bastion host for SSH access to the cluster.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "(has(self.enabled) && !self.enabled) || has(self.spec)",
    "message": "spec must be set while the bastion is enabled"
}]))]
pub struct Bastion {
    /// Create the bastion (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = true))]
    pub enabled: Option<bool>,
    /// The bastion server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<OpenStackMachineSpec>,
    /// Availability zone of the bastion.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub availability_zone: Option<String>,
    /// A specific floating IP for the bastion.
    #[serde(
        default,
        rename = "floatingIP",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(extend("format" = "ipv4"))]
    pub floating_ip: Option<String>,
}

/// What exists in OpenStack for an OpenStackCluster, and its conditions.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OpenStackClusterStatus {
    /// Cluster API v1beta2 initialization status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initialization: Option<Initialization>,
    /// The cluster network and its subnets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkStatusWithSubnets>,
    /// The external network.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external_network: Option<NetworkStatus>,
    /// The cluster router.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub router: Option<RouterStatus>,
    /// The API load balancer and the state of every pool member.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_server_managed_load_balancer: Option<LoadBalancerStatus>,
    /// Failure domains (availability zones) machines may be placed in.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub failure_domains: Vec<FailureDomain>,
    /// The control-plane security group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_security_group: Option<SecurityGroupStatus>,
    /// The worker security group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker_security_group: Option<SecurityGroupStatus>,
    /// The bastion security group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bastion_security_group: Option<SecurityGroupStatus>,
    /// The bastion host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bastion: Option<BastionStatus>,
    /// Observations of the object's state, one per type; `Ready` summarises the others.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "schema::conditions")]
    pub conditions: Conditions,
    /// The `metadata.generation` last reconciled; -1 before the first reconcile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// A Neutron router as reported in status.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RouterStatus {
    /// Router name.
    #[schemars(length(min = 1))]
    pub name: String,
    /// Router UUID.
    #[schemars(length(min = 1))]
    pub id: String,
    /// Router tags.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    pub tags: Vec<String>,
    /// External addresses of the router.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    pub ips: Vec<String>,
}

/// The API load balancer as reported in status.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LoadBalancerStatus {
    /// Load balancer name.
    #[schemars(length(min = 1))]
    pub name: String,
    /// Load balancer UUID.
    #[schemars(length(min = 1))]
    pub id: String,
    /// Public address (floating IP or VIP).
    #[schemars(length(min = 1))]
    pub ip: String,
    /// VIP address on the cluster network.
    #[serde(rename = "internalIP")]
    #[schemars(length(min = 1))]
    pub internal_ip: String,
    /// Source CIDRs currently allowed.
    #[serde(
        default,
        rename = "allowedCIDRs",
        skip_serializing_if = "Vec::is_empty"
    )]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    pub allowed_cidrs: Vec<String>,
    /// Load balancer tags.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    pub tags: Vec<String>,
    /// The VIP network.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_balancer_network: Option<NetworkStatusWithSubnets>,
    /// A listener and pool per forwarded port (capo-rs records them; CAPO does not).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["port"]))]
    pub pools: Vec<LoadBalancerPoolStatus>,
    /// Every pool member, desired or observed, with its Octavia state.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["pool", "name"]))]
    pub members: Vec<LoadBalancerMemberStatus>,
    /// The load balancer's `updated_at` in Octavia while its pools held exactly `members`,
    /// each as recorded, with nothing on its way (capo-rs). Octavia moves `updated_at` on every
    /// member change, so a restarted controller that finds it unchanged trusts `members`
    /// without reading each load balancer again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64))]
    pub members_as_of: Option<String>,
}

/// The listener, pool and health monitor that forward one port of the API load balancer.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LoadBalancerPoolStatus {
    /// The forwarded port (listener and member port).
    #[schemars(schema_with = "schema::port_number")]
    pub port: i32,
    /// Listener UUID.
    #[serde(rename = "listenerID")]
    #[schemars(length(min = 1))]
    pub listener_id: String,
    /// Pool UUID.
    #[serde(rename = "poolID")]
    #[schemars(length(min = 1))]
    pub pool_id: String,
    /// Health monitor UUID.
    #[serde(default, rename = "monitorID", skip_serializing_if = "Option::is_none")]
    pub monitor_id: Option<String>,
}

/// Octavia provisioning status of a load balancer object.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ProvisioningStatus {
    /// Provisioned.
    Active,
    /// Being created.
    PendingCreate,
    /// Being changed.
    PendingUpdate,
    /// Being deleted.
    PendingDelete,
    /// Deleted.
    Deleted,
    /// Provisioning failed.
    Error,
}

/// Octavia operating status (health) of a load balancer object.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum OperatingStatus {
    /// Healthy.
    Online,
    /// Not accepting new connections.
    Draining,
    /// Administratively down or failing health checks.
    Offline,
    /// Some children are unhealthy.
    Degraded,
    /// Failed.
    Error,
    /// No health monitor: health unknown.
    NoMonitor,
}

/// One pool member of the API load balancer.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LoadBalancerMemberStatus {
    /// Member name (the machine name).
    #[schemars(length(min = 1))]
    pub name: String,
    /// Pool UUID.
    #[schemars(length(min = 1))]
    pub pool: String,
    /// Member address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// Member protocol port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::port_number")]
    pub port: Option<i32>,
    /// Octavia member UUID, once observed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64))]
    pub id: Option<String>,
    /// Octavia provisioning status; absent while the member is not observed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisioning_status: Option<ProvisioningStatus>,
    /// Octavia operating status; absent while the member is not observed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operating_status: Option<OperatingStatus>,
    /// When the member entered its current provisioning status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::date_time")]
    pub since: Option<Time>,
}

/// A failure domain (availability zone).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailureDomain {
    /// Zone name.
    #[schemars(length(min = 1, max = 256))]
    pub name: String,
    /// Whether control-plane machines may be placed here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane: Option<bool>,
    /// Free-form attributes.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub attributes: BTreeMap<String, String>,
}

/// The bastion as reported in status.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BastionStatus {
    /// Server UUID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Server name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Nova keypair.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh_key_name: Option<String>,
    /// Nova server state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// Fixed IP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip: Option<String>,
    /// Floating IP.
    #[serde(
        default,
        rename = "floatingIP",
        skip_serializing_if = "Option::is_none"
    )]
    pub floating_ip: Option<String>,
    /// The bastion spec with references resolved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolved: Option<ResolvedServerSpec>,
    /// Resources created for the bastion.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<MachineResources>,
}

/// A template for OpenStackClusters, used by ClusterClasses.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1beta2",
    kind = "OpenStackClusterTemplate",
    plural = "openstackclustertemplates",
    shortname = "osct",
    namespaced,
    category = "cluster-api",
    label("cluster.x-k8s.io/v1beta2", "v1beta2"),
    doc = "A template of OpenStackClusters.",
    derive = "PartialEq",
    derive = "Default",
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
pub struct OpenStackClusterTemplateSpec {
    /// The cluster template.
    pub template: OpenStackClusterTemplateResource,
}

/// The cluster specification inside an OpenStackClusterTemplate.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct OpenStackClusterTemplateResource {
    /// Labels and annotations for clusters created from this template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<TemplateObjectMeta>,
    /// Spec of the clusters created from this template.
    pub spec: OpenStackClusterSpec,
}
