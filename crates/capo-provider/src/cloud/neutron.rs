//! Neutron v2.0: networks, subnets, routers and their interfaces, ports, security groups and
//! rules, floating IPs, trunks. Lists take a [`Filter`] with Neutron's tag filters.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::capabilities::Answer;
use super::endpoint::Call;
use super::octavia::seg;
use super::{CloudError, Operation, RequestPath, Service};

/// Query filters of Neutron list calls, as CAPO's filters map to them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Filter {
    /// Only the resource with this UUID.
    pub id: Option<String>,
    /// Only resources with exactly this name.
    pub name: Option<String>,
    /// Only resources with exactly this description.
    pub description: Option<String>,
    /// Only resources owned by this project (Keystone project ID).
    pub project_id: Option<String>,
    /// All of these tags.
    pub tags: Vec<String>,
    /// Any of these tags.
    pub tags_any: Vec<String>,
    /// None of these tags together.
    pub not_tags: Vec<String>,
    /// None of these tags.
    pub not_tags_any: Vec<String>,
    /// Resource-specific filters, e.g. `network_id`, `device_id`, `router:external`.
    pub extra: Vec<(&'static str, String)>,
}

impl Filter {
    /// A filter on the name alone.
    pub fn by_name(name: impl Into<String>) -> Self {
        Filter {
            name: Some(name.into()),
            ..Filter::default()
        }
    }

    /// Adds a resource-specific query parameter, e.g. `("network_id", id)`.
    pub fn with(mut self, key: &'static str, value: impl Into<String>) -> Self {
        self.extra.push((key, value.into()));
        self
    }

    fn apply(&self, mut call: Call) -> Call {
        call = call
            .query_opt("id", self.id.clone())
            .query_opt("name", self.name.clone())
            .query_opt("description", self.description.clone())
            .query_opt("project_id", self.project_id.clone());
        for (key, tags) in [
            ("tags", &self.tags),
            ("tags-any", &self.tags_any),
            ("not-tags", &self.not_tags),
            ("not-tags-any", &self.not_tags_any),
        ] {
            if !tags.is_empty() {
                call = call.query(key, tags.join(","));
            }
        }
        for (key, value) in &self.extra {
            call = call.query(key, value.clone());
        }
        call
    }
}

/// A Neutron network, as `GET /v2.0/networks` returns it.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct Network {
    /// The network's UUID.
    pub id: String,
    /// The network's name; empty when it has none.
    #[serde(default)]
    pub name: String,
    /// UUIDs of the network's subnets.
    #[serde(default)]
    pub subnets: Vec<String>,
    /// Whether the network is external (`router:external`): routers can use it as their gateway and
    /// floating IPs are allocated from it.
    #[serde(default, rename = "router:external")]
    pub external: bool,
    /// The network's MTU in bytes; None when Neutron does not report one.
    #[serde(default)]
    pub mtu: Option<u32>,
    /// The network's free-text description.
    #[serde(default)]
    pub description: String,
    /// The network's Neutron tags.
    #[serde(default)]
    pub tags: Vec<String>,
}

/// A Neutron subnet, as `GET /v2.0/subnets` returns it.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct Subnet {
    /// The subnet's UUID.
    pub id: String,
    /// The subnet's name; empty when it has none.
    #[serde(default)]
    pub name: String,
    /// UUID of the network the subnet belongs to.
    pub network_id: String,
    /// The subnet's address range in CIDR notation (e.g. `10.6.0.0/24`).
    pub cidr: String,
    /// IP version of the subnet: 4 or 6.
    #[serde(default)]
    pub ip_version: u8,
    /// The subnet's gateway address; None when the subnet has no gateway.
    #[serde(default)]
    pub gateway_ip: Option<String>,
    /// DNS servers that DHCP hands to the subnet's ports.
    #[serde(default)]
    pub dns_nameservers: Vec<String>,
    /// The subnet's Neutron tags.
    #[serde(default)]
    pub tags: Vec<String>,
}

/// A Neutron router, as `GET /v2.0/routers` returns it.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct Router {
    /// The router's UUID.
    pub id: String,
    /// The router's name; empty when it has none.
    #[serde(default)]
    pub name: String,
    /// The router's external gateway as Neutron returns it (`network_id`, `external_fixed_ips`,
    /// ...); None when the router has no gateway.
    #[serde(default)]
    pub external_gateway_info: Option<Value>,
    /// The router's free-text description.
    #[serde(default)]
    pub description: String,
    /// The router's Neutron tags.
    #[serde(default)]
    pub tags: Vec<String>,
}

/// An address on one subnet, of a port or of a router's gateway. In a request either part may be
/// left out: Neutron then picks the subnet of the given address, or an address on the subnet.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
pub struct FixedIp {
    /// UUID of the subnet the address is on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subnet_id: Option<String>,
    /// The IP address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip_address: Option<String>,
}

/// A Neutron port, as `GET /v2.0/ports` returns it.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct Port {
    /// The port's UUID.
    pub id: String,
    /// The port's name; empty when it has none.
    #[serde(default)]
    pub name: String,
    /// UUID of the network the port is on.
    pub network_id: String,
    /// The port's MAC address.
    #[serde(default)]
    pub mac_address: String,
    /// The port's IP addresses, each with its subnet.
    #[serde(default)]
    pub fixed_ips: Vec<FixedIp>,
    /// ID of the device using the port (a Nova server, a router, ...); empty when none does.
    #[serde(default)]
    pub device_id: String,
    /// What kind of device uses the port (e.g. `compute:nova`, `network:router_interface`); empty
    /// when none.
    #[serde(default)]
    pub device_owner: String,
    /// The port's status: `ACTIVE`, `DOWN`, `BUILD` or `ERROR`.
    #[serde(default)]
    pub status: String,
    /// UUIDs of the security groups applied to the port.
    #[serde(default)]
    pub security_groups: Vec<String>,
    /// The trunk this port is the parent of (`trunk_id`, `sub_ports`), when Neutron's
    /// `trunk-details` extension reports one; otherwise None.
    #[serde(default)]
    pub trunk_details: Option<Value>,
    /// The port's Neutron tags.
    #[serde(default)]
    pub tags: Vec<String>,
    /// `{ip_address, mac_address}` each; Neutron fills in the port's MAC when none was given.
    #[serde(default)]
    pub allowed_address_pairs: Vec<Value>,
}

/// A Neutron security group, with its rules.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct SecurityGroup {
    /// The group's UUID.
    pub id: String,
    /// The group's name.
    #[serde(default)]
    pub name: String,
    /// The group's free-text description.
    #[serde(default)]
    pub description: String,
    /// The group's rules, as listed with the group.
    #[serde(default)]
    pub security_group_rules: Vec<SecurityGroupRule>,
    /// The group's Neutron tags.
    #[serde(default)]
    pub tags: Vec<String>,
}

/// A security group rule: as Neutron returns it, and the body of a rule to create.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
pub struct SecurityGroupRule {
    /// The rule's UUID; never sent, as Neutron assigns it.
    #[serde(default, skip_serializing)]
    pub id: String,
    /// UUID of the group the rule belongs to; left out of a request when empty.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub security_group_id: String,
    /// Traffic the rule admits: `ingress` or `egress`.
    pub direction: String,
    /// `IPv4` or `IPv6`; None in a request leaves Neutron's default (IPv4).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ethertype: Option<String>,
    /// IP protocol by name (`tcp`, `udp`, `icmp`, ...) or number; None matches any protocol.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    /// Lowest port matched (for ICMP, the type); None with no maximum matches every port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port_range_min: Option<u16>,
    /// Highest port matched, inclusive (for ICMP, the code).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port_range_max: Option<u16>,
    /// CIDR the traffic may come from (ingress) or go to (egress); None for any address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_ip_prefix: Option<String>,
    /// Security group whose members' addresses the rule admits, instead of a CIDR.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_group_id: Option<String>,
    /// The rule's free-text description.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// A Neutron floating IP, as `GET /v2.0/floatingips` returns it.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct FloatingIp {
    /// The floating IP's UUID.
    pub id: String,
    /// The floating (public) address itself.
    pub floating_ip_address: String,
    /// UUID of the external network the address belongs to.
    pub floating_network_id: String,
    /// UUID of the port the address is associated with; None when it is not associated.
    #[serde(default)]
    pub port_id: Option<String>,
    /// The port's fixed address the floating IP maps to; None when it is not associated.
    #[serde(default)]
    pub fixed_ip_address: Option<String>,
    /// The floating IP's status: `ACTIVE`, `DOWN` or `ERROR`.
    #[serde(default)]
    pub status: String,
    /// The floating IP's free-text description.
    #[serde(default)]
    pub description: String,
    /// The floating IP's Neutron tags.
    #[serde(default)]
    pub tags: Vec<String>,
}

/// A Neutron trunk: a parent port that carries subports as VLANs.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct Trunk {
    /// The trunk's UUID.
    pub id: String,
    /// The trunk's name; empty when it has none.
    #[serde(default)]
    pub name: String,
    /// UUID of the trunk's parent port.
    pub port_id: String,
    /// The subports as Neutron returns them (`port_id`, `segmentation_type`, `segmentation_id`).
    #[serde(default)]
    pub sub_ports: Vec<Value>,
    /// The trunk's Neutron tags.
    #[serde(default)]
    pub tags: Vec<String>,
}

/// A port to create: the body of `POST /v2.0/ports`.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct PortSpec {
    /// The port's name.
    pub name: String,
    /// UUID of the network to create the port on.
    pub network_id: String,
    /// The port's free-text description; left out when empty.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub description: String,
    /// The addresses asked for; empty leaves the allocation to Neutron.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub fixed_ips: Vec<FixedIp>,
    /// UUIDs of the security groups to apply; None leaves Neutron's default (the project's
    /// `default` group).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub security_groups: Option<Vec<String>>,
    /// Administrative state; None leaves Neutron's default (up).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admin_state_up: Option<bool>,
    /// Whether port security (security groups, anti-spoofing) applies; None takes the network's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port_security_enabled: Option<bool>,
    /// `binding:vnic_type`: `normal`, `direct` (SR-IOV), `macvtap`, ...; None means `normal`.
    #[serde(skip_serializing_if = "Option::is_none", rename = "binding:vnic_type")]
    pub vnic_type: Option<String>,
    /// Further addresses the port may send from, each `{ip_address, mac_address}`; None sends none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allowed_address_pairs: Option<Vec<Value>>,
    /// `binding:host_id`: the compute host to bind the port to; None leaves it to Nova.
    #[serde(skip_serializing_if = "Option::is_none", rename = "binding:host_id")]
    pub host_id: Option<String>,
    /// `binding:profile`: details for the mechanism driver (capo-rs sends
    /// `capabilities: ["switchdev"]` for OVS hardware offload, and `trusted` for a trusted VF
    /// where Neutron lacks `port-trusted-vif`).
    #[serde(skip_serializing_if = "Option::is_none", rename = "binding:profile")]
    pub profile: Option<Value>,
    /// The port's own `trusted` attribute (Neutron's `port-trusted-vif` extension), which
    /// takes the place of `binding:profile`'s for a trusted VF; None leaves it unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trusted: Option<bool>,
    /// The MAC address to give the port; None lets Neutron generate one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mac_address: Option<String>,
    /// Whether the port's link state follows its uplink's (Neutron's `uplink-status-propagation`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub propagate_uplink_status: Option<bool>,
    /// Extra attributes sent as given (CAPO's `valueSpecs`).
    #[serde(flatten)]
    pub value_specs: serde_json::Map<String, Value>,
    /// Tags are not part of a create body in Neutron; [`Neutron::set_tags`] adds them after.
    #[serde(skip)]
    pub tags: Vec<String>,
}

/// A network to create.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct NetworkSpec {
    /// The network's name.
    pub name: String,
    /// Administrative state of the network (true: up).
    pub admin_state_up: bool,
    /// The MTU in bytes; None leaves Neutron's default.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    /// Default port security of the network's ports; None leaves Neutron's default.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port_security_enabled: Option<bool>,
    /// Free text for Neutron's `description`; left out of the request when empty.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub description: String,
    /// Tags set after the create (see [`Neutron::set_tags`]), not sent in its body.
    #[serde(skip)]
    pub tags: Vec<String>,
}

/// A DHCP allocation range.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AllocationPool {
    /// First address of the range.
    pub start: String,
    /// Last address of the range, inclusive.
    pub end: String,
}

/// A subnet to create.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct SubnetSpec {
    /// The subnet's name.
    pub name: String,
    /// UUID of the network to create the subnet on.
    pub network_id: String,
    /// The subnet's address range in CIDR notation.
    pub cidr: String,
    /// IP version of the subnet: 4 or 6.
    pub ip_version: u8,
    /// The subnet's free-text description; left out when empty.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub description: String,
    /// DNS servers for DHCP to hand out; left out when empty.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub dns_nameservers: Vec<String>,
    /// DHCP ranges; empty lets Neutron use the whole CIDR but the gateway address.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub allocation_pools: Vec<AllocationPool>,
    /// Tags set after the create (see [`Neutron::set_tags`]), not sent in its body.
    #[serde(skip)]
    pub tags: Vec<String>,
}

/// A router's external gateway.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct GatewayInfo {
    /// UUID of the external network.
    pub network_id: String,
    /// The router's addresses on that network; empty lets Neutron allocate one.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub external_fixed_ips: Vec<FixedIp>,
}

/// A router to create.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct RouterSpec {
    /// The router's name.
    pub name: String,
    /// The router's free-text description; left out when empty.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub description: String,
    /// The external gateway to set at creation; None creates the router without one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub external_gateway_info: Option<GatewayInfo>,
    /// Tags set after the create (see [`Neutron::set_tags`]), not sent in its body.
    #[serde(skip)]
    pub tags: Vec<String>,
}

impl Router {
    /// The router's addresses on the external network.
    pub fn external_ips(&self) -> Vec<String> {
        self.external_gateway_info
            .as_ref()
            .and_then(|g| g["external_fixed_ips"].as_array())
            .into_iter()
            .flatten()
            .filter_map(|ip| ip["ip_address"].as_str().map(str::to_owned))
            .collect()
    }
}

/// Neutron's tagging extension (every tag call needs it).
const TAG_EXTENSION: &str = "standard-attr-tag";
/// Neutron's trunk extension.
pub const TRUNK_EXTENSION: &str = "trunk";

const fn op(name: &'static str) -> Operation {
    Operation::new(Service::Network, name)
}

/// Typed Neutron calls.
pub struct Neutron<'a> {
    path: &'a RequestPath,
}

impl<'a> Neutron<'a> {
    pub(crate) fn new(path: &'a RequestPath) -> Self {
        Neutron { path }
    }

    async fn list<T: DeserializeOwned + Send + 'static>(
        &self,
        op: Operation,
        collection: &'static str,
        filter: &Filter,
    ) -> Result<Vec<T>, CloudError> {
        // Paths have dashes; the body's keys underscores (`security_groups`).
        let key = match collection {
            "security-groups" => "security_groups",
            "security-group-rules" => "security_group_rules",
            other => other,
        };
        let call = filter.apply(Call::get(op, collection)).key(key);
        self.path.fetch_all(call).await
    }

    async fn get<T: DeserializeOwned + Send + 'static>(
        &self,
        op: Operation,
        collection: &'static str,
        key: &'static str,
        id: &str,
    ) -> Result<T, CloudError> {
        let call = Call::get(op, format!("{collection}/{}", seg(id))).key(key);
        self.path.fetch(call).await
    }

    async fn create<T: DeserializeOwned + Send + 'static>(
        &self,
        op: Operation,
        collection: &'static str,
        key: &'static str,
        body: Value,
    ) -> Result<T, CloudError> {
        let mut wrapped = serde_json::Map::new();
        wrapped.insert(key.to_owned(), body);
        let call = Call::post(op, collection, Value::Object(wrapped)).key(key);
        self.path.fetch(call).await
    }

    async fn delete(
        &self,
        op: Operation,
        collection: &'static str,
        id: &str,
    ) -> Result<(), CloudError> {
        self.path
            .run(Call::delete(op, format!("{collection}/{}", seg(id))))
            .await
    }

    /// The networks that match `filter`, following pagination to the end.
    pub async fn list_networks(&self, filter: &Filter) -> Result<Vec<Network>, CloudError> {
        self.list(op("network_list"), "networks", filter).await
    }

    /// The network with this UUID.
    pub async fn get_network(&self, id: &str) -> Result<Network, CloudError> {
        self.get(op("network_get"), "networks", "network", id).await
    }

    /// Creates a network, then tags it when `spec` has tags and Neutron can tag.
    pub async fn create_network(&self, spec: &NetworkSpec) -> Result<Network, CloudError> {
        let create = op("network_create");
        let tag = self.can_tag(&spec.tags).await?;
        let body = serde_json::to_value(spec).map_err(|e| encode_error(create, &e))?;
        let mut network: Network = self.create(create, "networks", "network", body).await?;
        if tag {
            network.tags = self.tag_or_warn("networks", &network.id, &spec.tags).await;
        }
        Ok(network)
    }

    /// Deletes a network.
    pub async fn delete_network(&self, id: &str) -> Result<(), CloudError> {
        self.delete(op("network_delete"), "networks", id).await
    }

    /// The subnets that match `filter`, following pagination to the end.
    pub async fn list_subnets(&self, filter: &Filter) -> Result<Vec<Subnet>, CloudError> {
        self.list(op("subnet_list"), "subnets", filter).await
    }

    /// The subnet with this UUID.
    pub async fn get_subnet(&self, id: &str) -> Result<Subnet, CloudError> {
        self.get(op("subnet_get"), "subnets", "subnet", id).await
    }

    /// Creates a subnet, then tags it when `spec` has tags and Neutron can tag.
    pub async fn create_subnet(&self, spec: &SubnetSpec) -> Result<Subnet, CloudError> {
        let create = op("subnet_create");
        let tag = self.can_tag(&spec.tags).await?;
        let body = serde_json::to_value(spec).map_err(|e| encode_error(create, &e))?;
        let mut subnet: Subnet = self.create(create, "subnets", "subnet", body).await?;
        if tag {
            subnet.tags = self.tag_or_warn("subnets", &subnet.id, &spec.tags).await;
        }
        Ok(subnet)
    }

    /// Replaces a subnet's DNS nameservers.
    pub async fn update_subnet_dns(
        &self,
        id: &str,
        dns_nameservers: &[String],
    ) -> Result<Subnet, CloudError> {
        let body = json!({ "subnet": { "dns_nameservers": dns_nameservers } });
        let call = Call::put(op("subnet_update"), format!("subnets/{}", seg(id)), body);
        self.path.fetch(call.key("subnet")).await
    }

    /// Deletes a subnet.
    pub async fn delete_subnet(&self, id: &str) -> Result<(), CloudError> {
        self.delete(op("subnet_delete"), "subnets", id).await
    }

    /// The routers that match `filter`, following pagination to the end.
    pub async fn list_routers(&self, filter: &Filter) -> Result<Vec<Router>, CloudError> {
        self.list(op("router_list"), "routers", filter).await
    }

    /// Creates a router, then tags it when `spec` has tags and Neutron can tag.
    pub async fn create_router(&self, spec: &RouterSpec) -> Result<Router, CloudError> {
        let create = op("router_create");
        let tag = self.can_tag(&spec.tags).await?;
        let body = serde_json::to_value(spec).map_err(|e| encode_error(create, &e))?;
        let mut router: Router = self.create(create, "routers", "router", body).await?;
        if tag {
            router.tags = self.tag_or_warn("routers", &router.id, &spec.tags).await;
        }
        Ok(router)
    }

    /// Sets a router's external gateway.
    pub async fn set_router_gateway(
        &self,
        id: &str,
        gateway: &GatewayInfo,
    ) -> Result<Router, CloudError> {
        let body = json!({ "router": { "external_gateway_info": gateway } });
        let call = Call::put(op("router_update"), format!("routers/{}", seg(id)), body);
        self.path.fetch(call.key("router")).await
    }

    /// Deletes a router.
    pub async fn delete_router(&self, id: &str) -> Result<(), CloudError> {
        self.delete(op("router_delete"), "routers", id).await
    }

    /// Attaches a subnet to a router: Neutron gives the router an interface on it (at the subnet's
    /// gateway address).
    pub async fn add_router_interface(
        &self,
        router_id: &str,
        subnet_id: &str,
    ) -> Result<(), CloudError> {
        let path = format!("routers/{}/add_router_interface", seg(router_id));
        let call = Call::put(
            op("router_interface_add"),
            path,
            json!({ "subnet_id": subnet_id }),
        );
        self.path.run(call).await
    }

    /// Detaches a subnet from a router, removing the router's interface on it.
    pub async fn remove_router_interface(
        &self,
        router_id: &str,
        subnet_id: &str,
    ) -> Result<(), CloudError> {
        let path = format!("routers/{}/remove_router_interface", seg(router_id));
        let call = Call::put(
            op("router_interface_remove"),
            path,
            json!({ "subnet_id": subnet_id }),
        );
        self.path.run(call).await
    }

    /// The ports that match `filter`, following pagination to the end.
    pub async fn list_ports(&self, filter: &Filter) -> Result<Vec<Port>, CloudError> {
        self.list(op("port_list"), "ports", filter).await
    }

    /// The port with this UUID.
    pub async fn get_port(&self, id: &str) -> Result<Port, CloudError> {
        self.get(op("port_get"), "ports", "port", id).await
    }

    /// Creates a port, then tags it when `spec` has tags and Neutron can tag.
    pub async fn create_port(&self, spec: &PortSpec) -> Result<Port, CloudError> {
        let tag = self.can_tag(&spec.tags).await?;
        let body = serde_json::to_value(spec).map_err(|e| encode_error(op("port_create"), &e))?;
        let mut port: Port = self
            .create(op("port_create"), "ports", "port", body)
            .await?;
        if tag {
            port.tags = self.tag_or_warn("ports", &port.id, &spec.tags).await;
        }
        Ok(port)
    }

    /// Replaces a port's allowed address pairs.
    pub async fn update_port_address_pairs(
        &self,
        id: &str,
        pairs: &[Value],
    ) -> Result<Port, CloudError> {
        let body = json!({ "port": { "allowed_address_pairs": pairs } });
        let call = Call::put(op("port_update"), format!("ports/{}", seg(id)), body);
        self.path.fetch(call.key("port")).await
    }

    /// Deletes a port.
    pub async fn delete_port(&self, id: &str) -> Result<(), CloudError> {
        self.delete(op("port_delete"), "ports", id).await
    }

    /// Whether Neutron offers the extension `alias` (`GET /v2.0/extensions/{alias}`: 404
    /// when it does not), remembered for a while per cloud.
    pub async fn has_extension(&self, alias: &str) -> Result<bool, CloudError> {
        let question = format!("neutron extension {alias}");
        if let Some(Answer::Present(known)) = self.path.capabilities().known(&question) {
            return Ok(known);
        }
        let call = Call::get(op("extension_get"), format!("extensions/{}", seg(alias)));
        let present = match self.path.fetch::<Value>(call.key("extension")).await {
            Ok(_) => true,
            Err(CloudError::NotFound(_)) => false,
            Err(error) => return Err(error),
        };
        if !present {
            tracing::info!(extension = alias, "Neutron does not offer this extension");
        }
        self.path
            .capabilities()
            .remember(&question, Answer::Present(present));
        Ok(present)
    }

    /// Whether `tags` will be set: there are some, and Neutron can tag (`standard-attr-tag`,
    /// CAPO #3319). Asked before a create, so that a failed lookup never leaves behind an
    /// object nobody tagged or recorded; skipped tags are what CAPO does too.
    async fn can_tag(&self, tags: &[String]) -> Result<bool, CloudError> {
        if tags.is_empty() {
            return Ok(false);
        }
        self.has_extension(TAG_EXTENSION).await
    }

    /// Tags what was just created, and says which tags it now has: `tags`, or none. If the
    /// tag write fails, what was made is kept and handed back untagged (a warning says so):
    /// the caller records its ID, by which it is found from then on. Deleting it instead
    /// could fail as well (Neutron gone between the two requests), and leave it where no
    /// lookup by mark finds it. The create's own answer has no tags: handed back as it is,
    /// its status would be written once without them and again at the next read.
    async fn tag_or_warn(
        &self,
        collection: &'static str,
        id: &str,
        tags: &[String],
    ) -> Vec<String> {
        match self.set_tags(collection, id, tags).await {
            Ok(()) => tags.to_vec(),
            Err(error) => {
                tracing::warn!(%collection, %id, %error, "created but not tagged; found by its ID from now on");
                Vec::new()
            }
        }
    }

    /// Replaces the tags of any taggable resource (`ports`, `networks`, `floatingips`, ...);
    /// nothing where Neutron cannot tag.
    pub async fn set_tags(
        &self,
        collection: &'static str,
        id: &str,
        tags: &[String],
    ) -> Result<(), CloudError> {
        if !self.has_extension(TAG_EXTENSION).await? {
            return Ok(());
        }
        let path = format!("{collection}/{}/tags", seg(id));
        let call = Call::put(op("tags_replace"), path, json!({ "tags": tags }));
        self.path.run(call).await
    }

    /// The security groups that match `filter`, following pagination to the end.
    pub async fn list_security_groups(
        &self,
        filter: &Filter,
    ) -> Result<Vec<SecurityGroup>, CloudError> {
        self.list(op("security_group_list"), "security-groups", filter)
            .await
    }

    /// Creates a security group, untagged; Neutron gives a new group its default egress rules.
    /// Creates a security group, then tags it when there are `tags` and Neutron can tag.
    pub async fn create_security_group(
        &self,
        name: &str,
        description: &str,
        tags: &[String],
    ) -> Result<SecurityGroup, CloudError> {
        let tag = self.can_tag(tags).await?;
        let body = json!({ "name": name, "description": description });
        let mut group: SecurityGroup = self
            .create(
                op("security_group_create"),
                "security-groups",
                "security_group",
                body,
            )
            .await?;
        if tag {
            group.tags = self.tag_or_warn("security-groups", &group.id, tags).await;
        }
        Ok(group)
    }

    /// Deletes a security group.
    pub async fn delete_security_group(&self, id: &str) -> Result<(), CloudError> {
        self.delete(op("security_group_delete"), "security-groups", id)
            .await
    }

    /// The security group rules that match `filter`, following pagination to the end.
    pub async fn list_security_group_rules(
        &self,
        filter: &Filter,
    ) -> Result<Vec<SecurityGroupRule>, CloudError> {
        self.list(
            op("security_group_rule_list"),
            "security-group-rules",
            filter,
        )
        .await
    }

    /// Creates one rule; Neutron refuses a rule the group already has with a 409.
    pub async fn create_security_group_rule(
        &self,
        rule: &SecurityGroupRule,
    ) -> Result<SecurityGroupRule, CloudError> {
        let op = op("security_group_rule_create");
        let body = serde_json::to_value(rule).map_err(|e| encode_error(op, &e))?;
        self.create(op, "security-group-rules", "security_group_rule", body)
            .await
    }

    /// Several rules of one group in one request (Neutron's native bulk create). Neutron
    /// creates all of them or none: a rule the group already has (or one given twice) refuses
    /// the whole request with a 409, and rules of two groups with a 400.
    pub async fn create_security_group_rules(
        &self,
        rules: &[SecurityGroupRule],
    ) -> Result<Vec<SecurityGroupRule>, CloudError> {
        let op = op("security_group_rule_bulk_create");
        let body = serde_json::to_value(rules).map_err(|e| encode_error(op, &e))?;
        self.create(op, "security-group-rules", "security_group_rules", body)
            .await
    }

    /// Deletes a security group rule.
    pub async fn delete_security_group_rule(&self, id: &str) -> Result<(), CloudError> {
        self.delete(op("security_group_rule_delete"), "security-group-rules", id)
            .await
    }

    /// The floating IPs that match `filter`, following pagination to the end.
    pub async fn list_floating_ips(&self, filter: &Filter) -> Result<Vec<FloatingIp>, CloudError> {
        self.list(op("floating_ip_list"), "floatingips", filter)
            .await
    }

    /// A floating IP on external network `network_id` (at `address` when given), untagged.
    pub async fn create_floating_ip(
        &self,
        network_id: &str,
        address: Option<&str>,
        description: &str,
    ) -> Result<FloatingIp, CloudError> {
        self.create_tagged_floating_ip(network_id, address, None, description, &[])
            .await
    }

    /// The floating IP at `address`, if the project has it.
    pub async fn find_floating_ip(&self, address: &str) -> Result<Option<FloatingIp>, CloudError> {
        let filter = Filter::default().with("floating_ip_address", address.to_owned());
        Ok(self.list_floating_ips(&filter).await?.into_iter().next())
    }

    /// A floating IP on `network_id` (at `address` when given), tagged; pointing at `port`
    /// when given. Neutron attaches it in the create's own transaction and allocates nothing
    /// when the attach is refused (`_create_floatingip` in l3_db.py), so no attach request
    /// follows and no unattached address is left behind by a refusal.
    pub async fn create_tagged_floating_ip(
        &self,
        network_id: &str,
        address: Option<&str>,
        port: Option<&str>,
        description: &str,
        tags: &[String],
    ) -> Result<FloatingIp, CloudError> {
        let tag = self.can_tag(tags).await?;
        let mut body = json!({ "floating_network_id": network_id, "description": description });
        if let Some(address) = address {
            body["floating_ip_address"] = json!(address);
        }
        if let Some(port) = port {
            body["port_id"] = json!(port);
        }
        let mut ip: FloatingIp = self
            .create(op("floating_ip_create"), "floatingips", "floatingip", body)
            .await?;
        if tag {
            self.set_tags("floatingips", &ip.id, tags).await?;
            ip.tags = tags.to_vec();
        }
        Ok(ip)
    }

    /// Points a floating IP at a port, or detaches it with `None`.
    pub async fn associate_floating_ip(
        &self,
        id: &str,
        port_id: Option<&str>,
    ) -> Result<FloatingIp, CloudError> {
        let path = format!("floatingips/{}", seg(id));
        let call = Call::put(
            op("floating_ip_update"),
            path,
            json!({ "floatingip": { "port_id": port_id } }),
        );
        self.path.fetch(call.key("floatingip")).await
    }

    /// Deletes (releases) a floating IP.
    pub async fn delete_floating_ip(&self, id: &str) -> Result<(), CloudError> {
        self.delete(op("floating_ip_delete"), "floatingips", id)
            .await
    }

    /// The trunks that match `filter`, following pagination to the end.
    pub async fn list_trunks(&self, filter: &Filter) -> Result<Vec<Trunk>, CloudError> {
        self.list(op("trunk_list"), "trunks", filter).await
    }

    /// A trunk whose parent is `port_id`; tagged like the port.
    pub async fn create_trunk(
        &self,
        name: &str,
        port_id: &str,
        description: &str,
        tags: &[String],
    ) -> Result<Trunk, CloudError> {
        let tag = self.can_tag(tags).await?;
        let body = json!({ "name": name, "port_id": port_id, "description": description });
        let mut trunk: Trunk = self
            .create(op("trunk_create"), "trunks", "trunk", body)
            .await?;
        if tag {
            self.set_tags("trunks", &trunk.id, tags).await?;
            trunk.tags = tags.to_vec();
        }
        Ok(trunk)
    }

    /// Deletes a trunk; its parent port is left in place.
    pub async fn delete_trunk(&self, id: &str) -> Result<(), CloudError> {
        self.delete(op("trunk_delete"), "trunks", id).await
    }
}

fn encode_error(op: Operation, error: &serde_json::Error) -> CloudError {
    CloudError::BadRequest(super::ErrorContext {
        service: op.service,
        operation: op.name.to_owned(),
        message: format!("cannot encode the request: {error}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn security_group_rule_body_leaves_out_what_is_unset() {
        let rule = SecurityGroupRule {
            id: "ignored".into(),
            security_group_id: "sg".into(),
            direction: "ingress".into(),
            ethertype: Some("IPv4".into()),
            protocol: Some("tcp".into()),
            port_range_min: Some(6443),
            port_range_max: Some(6443),
            remote_ip_prefix: None,
            remote_group_id: None,
            description: None,
        };
        assert_eq!(
            serde_json::to_value(&rule).unwrap(),
            json!({"security_group_id": "sg", "direction": "ingress", "ethertype": "IPv4",
                   "protocol": "tcp", "port_range_min": 6443, "port_range_max": 6443})
        );
    }
}
