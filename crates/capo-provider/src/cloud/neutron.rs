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
    pub id: Option<String>,
    pub name: Option<String>,
    pub description: Option<String>,
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
    pub fn by_name(name: impl Into<String>) -> Self {
        Filter {
            name: Some(name.into()),
            ..Filter::default()
        }
    }

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

#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct Network {
    pub id: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub subnets: Vec<String>,
    #[serde(default, rename = "router:external")]
    pub external: bool,
    #[serde(default)]
    pub mtu: Option<u32>,
    #[serde(default)]
    pub tags: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct Subnet {
    pub id: String,
    #[serde(default)]
    pub name: String,
    pub network_id: String,
    pub cidr: String,
    #[serde(default)]
    pub ip_version: u8,
    #[serde(default)]
    pub gateway_ip: Option<String>,
    #[serde(default)]
    pub dns_nameservers: Vec<String>,
    #[serde(default)]
    pub tags: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct Router {
    pub id: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub external_gateway_info: Option<Value>,
    #[serde(default)]
    pub tags: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
pub struct FixedIp {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subnet_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip_address: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct Port {
    pub id: String,
    #[serde(default)]
    pub name: String,
    pub network_id: String,
    #[serde(default)]
    pub mac_address: String,
    #[serde(default)]
    pub fixed_ips: Vec<FixedIp>,
    #[serde(default)]
    pub device_id: String,
    #[serde(default)]
    pub device_owner: String,
    #[serde(default)]
    pub status: String,
    #[serde(default)]
    pub security_groups: Vec<String>,
    #[serde(default)]
    pub trunk_details: Option<Value>,
    #[serde(default)]
    pub tags: Vec<String>,
    /// `{ip_address, mac_address}` each; Neutron fills in the port's MAC when none was given.
    #[serde(default)]
    pub allowed_address_pairs: Vec<Value>,
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct SecurityGroup {
    pub id: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub security_group_rules: Vec<SecurityGroupRule>,
    #[serde(default)]
    pub tags: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
pub struct SecurityGroupRule {
    #[serde(default, skip_serializing)]
    pub id: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub security_group_id: String,
    pub direction: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ethertype: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port_range_min: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port_range_max: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_ip_prefix: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_group_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct FloatingIp {
    pub id: String,
    pub floating_ip_address: String,
    pub floating_network_id: String,
    #[serde(default)]
    pub port_id: Option<String>,
    #[serde(default)]
    pub fixed_ip_address: Option<String>,
    #[serde(default)]
    pub status: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub tags: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct Trunk {
    pub id: String,
    #[serde(default)]
    pub name: String,
    pub port_id: String,
    #[serde(default)]
    pub sub_ports: Vec<Value>,
    #[serde(default)]
    pub tags: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct PortSpec {
    pub name: String,
    pub network_id: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub description: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub fixed_ips: Vec<FixedIp>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub security_groups: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admin_state_up: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port_security_enabled: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none", rename = "binding:vnic_type")]
    pub vnic_type: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allowed_address_pairs: Option<Vec<Value>>,
    #[serde(skip_serializing_if = "Option::is_none", rename = "binding:host_id")]
    pub host_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", rename = "binding:profile")]
    pub profile: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mac_address: Option<String>,
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
    pub name: String,
    pub admin_state_up: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port_security_enabled: Option<bool>,
    #[serde(skip)]
    pub tags: Vec<String>,
}

/// A DHCP allocation range.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AllocationPool {
    pub start: String,
    pub end: String,
}

/// A subnet to create.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct SubnetSpec {
    pub name: String,
    pub network_id: String,
    pub cidr: String,
    pub ip_version: u8,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub description: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub dns_nameservers: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub allocation_pools: Vec<AllocationPool>,
    #[serde(skip)]
    pub tags: Vec<String>,
}

/// A router's external gateway.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct GatewayInfo {
    pub network_id: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub external_fixed_ips: Vec<FixedIp>,
}

/// A router to create.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct RouterSpec {
    pub name: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub description: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub external_gateway_info: Option<GatewayInfo>,
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

    pub async fn list_networks(&self, filter: &Filter) -> Result<Vec<Network>, CloudError> {
        self.list(op("network_list"), "networks", filter).await
    }

    pub async fn get_network(&self, id: &str) -> Result<Network, CloudError> {
        self.get(op("network_get"), "networks", "network", id).await
    }

    pub async fn create_network(&self, spec: &NetworkSpec) -> Result<Network, CloudError> {
        let op = op("network_create");
        let tag = self.can_tag(&spec.tags).await?;
        let body = serde_json::to_value(spec).map_err(|e| encode_error(op, &e))?;
        let network: Network = self.create(op, "networks", "network", body).await?;
        if tag {
            self.set_tags("networks", &network.id, &spec.tags).await?;
        }
        Ok(network)
    }

    pub async fn delete_network(&self, id: &str) -> Result<(), CloudError> {
        self.delete(op("network_delete"), "networks", id).await
    }

    pub async fn list_subnets(&self, filter: &Filter) -> Result<Vec<Subnet>, CloudError> {
        self.list(op("subnet_list"), "subnets", filter).await
    }

    pub async fn get_subnet(&self, id: &str) -> Result<Subnet, CloudError> {
        self.get(op("subnet_get"), "subnets", "subnet", id).await
    }

    pub async fn create_subnet(&self, spec: &SubnetSpec) -> Result<Subnet, CloudError> {
        let op = op("subnet_create");
        let tag = self.can_tag(&spec.tags).await?;
        let body = serde_json::to_value(spec).map_err(|e| encode_error(op, &e))?;
        let subnet: Subnet = self.create(op, "subnets", "subnet", body).await?;
        if tag {
            self.set_tags("subnets", &subnet.id, &spec.tags).await?;
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

    pub async fn delete_subnet(&self, id: &str) -> Result<(), CloudError> {
        self.delete(op("subnet_delete"), "subnets", id).await
    }

    pub async fn list_routers(&self, filter: &Filter) -> Result<Vec<Router>, CloudError> {
        self.list(op("router_list"), "routers", filter).await
    }

    pub async fn create_router(&self, spec: &RouterSpec) -> Result<Router, CloudError> {
        let op = op("router_create");
        let tag = self.can_tag(&spec.tags).await?;
        let body = serde_json::to_value(spec).map_err(|e| encode_error(op, &e))?;
        let router: Router = self.create(op, "routers", "router", body).await?;
        if tag {
            self.set_tags("routers", &router.id, &spec.tags).await?;
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

    pub async fn delete_router(&self, id: &str) -> Result<(), CloudError> {
        self.delete(op("router_delete"), "routers", id).await
    }

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

    pub async fn list_ports(&self, filter: &Filter) -> Result<Vec<Port>, CloudError> {
        self.list(op("port_list"), "ports", filter).await
    }

    pub async fn get_port(&self, id: &str) -> Result<Port, CloudError> {
        self.get(op("port_get"), "ports", "port", id).await
    }

    pub async fn create_port(&self, spec: &PortSpec) -> Result<Port, CloudError> {
        let tag = self.can_tag(&spec.tags).await?;
        let body = serde_json::to_value(spec).map_err(|e| encode_error(op("port_create"), &e))?;
        let port: Port = self
            .create(op("port_create"), "ports", "port", body)
            .await?;
        if tag {
            self.set_tags("ports", &port.id, &spec.tags).await?;
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

    pub async fn list_security_groups(
        &self,
        filter: &Filter,
    ) -> Result<Vec<SecurityGroup>, CloudError> {
        self.list(op("security_group_list"), "security-groups", filter)
            .await
    }

    pub async fn create_security_group(
        &self,
        name: &str,
        description: &str,
    ) -> Result<SecurityGroup, CloudError> {
        let body = json!({ "name": name, "description": description });
        self.create(
            op("security_group_create"),
            "security-groups",
            "security_group",
            body,
        )
        .await
    }

    pub async fn delete_security_group(&self, id: &str) -> Result<(), CloudError> {
        self.delete(op("security_group_delete"), "security-groups", id)
            .await
    }

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

    pub async fn delete_security_group_rule(&self, id: &str) -> Result<(), CloudError> {
        self.delete(op("security_group_rule_delete"), "security-group-rules", id)
            .await
    }

    pub async fn list_floating_ips(&self, filter: &Filter) -> Result<Vec<FloatingIp>, CloudError> {
        self.list(op("floating_ip_list"), "floatingips", filter)
            .await
    }

    pub async fn create_floating_ip(
        &self,
        network_id: &str,
        address: Option<&str>,
        description: &str,
    ) -> Result<FloatingIp, CloudError> {
        self.create_tagged_floating_ip(network_id, address, description, &[])
            .await
    }

    /// The floating IP at `address`, if the project has it.
    pub async fn find_floating_ip(&self, address: &str) -> Result<Option<FloatingIp>, CloudError> {
        let filter = Filter::default().with("floating_ip_address", address.to_owned());
        Ok(self.list_floating_ips(&filter).await?.into_iter().next())
    }

    /// A floating IP on `network_id` (at `address` when given), tagged.
    pub async fn create_tagged_floating_ip(
        &self,
        network_id: &str,
        address: Option<&str>,
        description: &str,
        tags: &[String],
    ) -> Result<FloatingIp, CloudError> {
        let tag = self.can_tag(tags).await?;
        let mut body = json!({ "floating_network_id": network_id, "description": description });
        if let Some(address) = address {
            body["floating_ip_address"] = json!(address);
        }
        let ip: FloatingIp = self
            .create(op("floating_ip_create"), "floatingips", "floatingip", body)
            .await?;
        if tag {
            self.set_tags("floatingips", &ip.id, tags).await?;
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

    pub async fn delete_floating_ip(&self, id: &str) -> Result<(), CloudError> {
        self.delete(op("floating_ip_delete"), "floatingips", id)
            .await
    }

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
        let trunk: Trunk = self
            .create(op("trunk_create"), "trunks", "trunk", body)
            .await?;
        if tag {
            self.set_tags("trunks", &trunk.id, tags).await?;
        }
        Ok(trunk)
    }

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
