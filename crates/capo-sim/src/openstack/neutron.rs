//! Neutron v2.0: networks, subnets, routers and interfaces, ports with fixed IPs allocated from
//! their subnet, security groups and rules, floating IPs, trunks (a port parents at most one and
//! cannot be deleted while it does), tags, filters. Objects are
//! kept as JSON, the way the API shows them; per-collection hooks add what Neutron computes.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use axum::http::Method;
use serde_json::{Map, Value, json};

use super::filters;
use super::world::{Reply, World, json_body, string_list};

/// Collection path -> (singular key, error name).
const COLLECTIONS: &[(&str, &str, &str)] = &[
    ("networks", "network", "Network"),
    ("subnets", "subnet", "Subnet"),
    ("routers", "router", "Router"),
    ("ports", "port", "Port"),
    ("security-groups", "security_group", "SecurityGroup"),
    (
        "security-group-rules",
        "security_group_rule",
        "SecurityGroupRule",
    ),
    ("floatingips", "floatingip", "FloatingIP"),
    ("trunks", "trunk", "Trunk"),
];

#[derive(Debug, Default)]
pub struct Neutron {
    /// Collection path -> objects in creation order.
    objects: BTreeMap<&'static str, Vec<Value>>,
}

impl Neutron {
    pub fn all(&self, collection: &str) -> &[Value] {
        self.objects
            .get(collection)
            .map(Vec::as_slice)
            .unwrap_or(&[])
    }

    pub fn find(&self, collection: &str, id: &str) -> Option<&Value> {
        self.all(collection).iter().find(|o| o["id"] == id)
    }

    fn find_mut(&mut self, collection: &str, id: &str) -> Option<&mut Value> {
        self.objects
            .iter_mut()
            .find(|(name, _)| **name == collection)
            .and_then(|(_, objects)| objects.iter_mut().find(|o| o["id"] == id))
    }

    fn insert(&mut self, collection: &'static str, object: Value) {
        self.objects.entry(collection).or_default().push(object);
    }

    fn remove(&mut self, collection: &str, id: &str) -> Option<Value> {
        let objects = self
            .objects
            .iter_mut()
            .find(|(name, _)| **name == collection)
            .map(|(_, objects)| objects)?;
        let index = objects.iter().position(|o| o["id"] == id)?;
        Some(objects.remove(index))
    }
}

fn collection(path: &str) -> Option<(&'static str, &'static str, &'static str)> {
    COLLECTIONS.iter().copied().find(|(p, _, _)| *p == path)
}

fn not_found(kind: &str, id: &str) -> Reply {
    Reply::neutron(
        404,
        &format!("{kind}NotFound"),
        format!("{kind} {id} could not be found."),
    )
}

/// The external network, its subnet and the project's default security group.
pub fn seed(world: &mut World) {
    let network = create_object(
        world,
        "networks",
        json!({"name": "public", "router:external": true}),
    );
    let network_id = network["id"].as_str().unwrap_or_default().to_owned();
    create_object(
        world,
        "subnets",
        json!({"name": "public-subnet", "network_id": network_id, "cidr": "172.24.4.0/24", "ip_version": 4}),
    );
    create_object(
        world,
        "security-groups",
        json!({"name": "default", "description": "Default security group"}),
    );
}

/// DevStack's project network: `private` and its subnet.
pub fn seed_tenant_network(world: &mut World) {
    let network = create_object(world, "networks", json!({"name": "private"}));
    let network_id = network["id"].as_str().unwrap_or_default().to_owned();
    create_object(
        world,
        "subnets",
        json!({"name": "private-subnet", "network_id": network_id, "cidr": "10.0.0.0/24", "ip_version": 4}),
    );
}

/// `/network/v2.0/...` requests.
pub fn handle(
    world: &mut World,
    method: &Method,
    rest: &[&str],
    query: &[(String, String)],
    body: &[u8],
) -> Reply {
    let Some(body) = json_body(body) else {
        return Reply::neutron(400, "BadRequest", "Body contains invalid JSON.");
    };
    let rest = match rest {
        ["v2.0", rest @ ..] => rest,
        _ => return Reply::neutron(404, "HTTPNotFound", "The resource could not be found."),
    };
    let Some((path, key, kind)) = rest.first().and_then(|p| collection(p)) else {
        return Reply::neutron(404, "HTTPNotFound", "The resource could not be found.");
    };
    match (method.as_str(), &rest[1..]) {
        ("GET", []) => {
            let items: Vec<Value> = world
                .neutron
                .all(path)
                .iter()
                .filter(|o| filters::matches(o, query))
                .cloned()
                .collect();
            Reply::ok(json!({ path.replace('-', "_"): items }))
        }
        ("POST", []) => match body.get(key) {
            Some(object) if object.is_object() => match validate(world, path, object) {
                Ok(()) => Reply::json(
                    201,
                    json!({ key: create_object(world, path, object.clone()) }),
                ),
                Err(reply) => reply,
            },
            _ => Reply::neutron(400, "BadRequest", format!("Resource body required: {key}")),
        },
        ("GET", [id]) => match world.neutron.find(path, id) {
            Some(object) => Reply::ok(json!({ key: object })),
            None => not_found(kind, id),
        },
        ("PUT", [id]) => update(world, path, key, kind, id, &body[key]),
        ("DELETE", [id]) => delete(world, path, kind, id),
        ("PUT", [id, "tags"]) => set_tags(world, path, kind, id, Some(&body["tags"]), None),
        ("PUT", [id, "tags", tag]) => set_tags(world, path, kind, id, None, Some((tag, true))),
        ("DELETE", [id, "tags", tag]) => set_tags(world, path, kind, id, None, Some((tag, false))),
        ("PUT", [id, "add_router_interface"]) if path == "routers" => {
            add_interface(world, id, &body)
        }
        ("PUT", [id, "remove_router_interface"]) if path == "routers" => {
            remove_interface(world, id, &body)
        }
        _ => Reply::neutron(404, "HTTPNotFound", "The resource could not be found."),
    }
}

/// The trunk whose parent is `port`, if any.
fn trunk_of(world: &World, port: &str) -> Option<String> {
    world
        .neutron
        .all("trunks")
        .iter()
        .find(|t| t["port_id"] == port)
        .and_then(|t| t["id"].as_str())
        .map(str::to_owned)
}

fn validate(world: &World, path: &str, object: &Value) -> Result<(), Reply> {
    let network_exists = |field: &str| {
        let id = object[field].as_str().unwrap_or_default();
        match world.neutron.find("networks", id) {
            Some(_) => Ok(()),
            None => Err(not_found("Network", id)),
        }
    };
    match path {
        "subnets" => {
            network_exists("network_id")?;
            let cidr = object["cidr"].as_str().unwrap_or_default();
            parse_cidr(cidr).map(|_| ()).ok_or_else(|| {
                Reply::neutron(
                    400,
                    "InvalidInput",
                    format!("Invalid input for cidr. Reason: '{cidr}' is not a valid IP subnet."),
                )
            })
        }
        "ports" => {
            network_exists("network_id")?;
            let network = object["network_id"].as_str().unwrap_or_default();
            match object["mac_address"].as_str() {
                Some(mac)
                    if world
                        .neutron
                        .all("ports")
                        .iter()
                        .any(|p| p["network_id"] == network && p["mac_address"] == mac) =>
                {
                    Err(Reply::neutron(
                        409,
                        "MacAddressInUse",
                        format!(
                            "Unable to complete operation for network {network}. \
                             The mac address {mac} is in use."
                        ),
                    ))
                }
                _ => Ok(()),
            }
        }
        "trunks" => {
            let port = object["port_id"].as_str().unwrap_or_default();
            if world.neutron.find("ports", port).is_none() {
                Err(not_found("Port", port))
            } else if trunk_of(world, port).is_some() {
                Err(Reply::neutron(
                    409,
                    "TrunkPortInUse",
                    format!("Port {port} is in use by another trunk."),
                ))
            } else {
                Ok(())
            }
        }
        "floatingips" => {
            network_exists("floating_network_id")?;
            let id = object["floating_network_id"].as_str().unwrap_or_default();
            if world
                .neutron
                .find("networks", id)
                .is_some_and(|n| n["router:external"] == true)
            {
                Ok(())
            } else {
                Err(Reply::neutron(
                    400,
                    "BadRequest",
                    format!(
                        "Bad floatingip request: Network {id} is not a valid external network."
                    ),
                ))
            }
        }
        "security-group-rules" => {
            let id = object["security_group_id"].as_str().unwrap_or_default();
            match world.neutron.find("security-groups", id) {
                Some(_) => Ok(()),
                None => Err(not_found("SecurityGroup", id)),
            }
        }
        _ => Ok(()),
    }
}

/// Creates an object with Neutron's computed fields, through the same hooks as the API.
pub fn create_object(world: &mut World, path: &str, request: Value) -> Value {
    let Some((path, _, _)) = collection(path) else {
        return Value::Null;
    };
    let mut object = match request {
        Value::Object(map) => map,
        _ => Map::new(),
    };
    let id = world.uuid();
    let now = world.wall_now().format("%Y-%m-%dT%H:%M:%SZ").to_string();
    let project = world.settings.project_id.clone();
    let defaults = json!({"id": id, "name": "", "description": "", "tags": [], "project_id": project,
                          "tenant_id": project, "created_at": now, "updated_at": now, "revision_number": 0});
    if let Value::Object(defaults) = defaults {
        for (key, value) in defaults {
            object.entry(key).or_insert(value);
        }
    }
    object.insert("id".into(), json!(id));
    match path {
        "networks" => {
            for (key, value) in [
                ("status", json!("ACTIVE")),
                ("admin_state_up", json!(true)),
                ("subnets", json!([])),
                ("router:external", json!(false)),
                ("shared", json!(false)),
                ("mtu", json!(1450)),
                ("port_security_enabled", json!(true)),
            ] {
                object.entry(key).or_insert(value);
            }
        }
        "subnets" => subnet_defaults(world, &mut object),
        "ports" => port_defaults(world, &mut object),
        "routers" => {
            object.entry("status").or_insert(json!("ACTIVE"));
            object.entry("admin_state_up").or_insert(json!(true));
            object.entry("external_gateway_info").or_insert(Value::Null);
        }
        "security-groups" => {
            object.insert("security_group_rules".into(), json!([]));
        }
        "security-group-rules" => {
            for (key, value) in [
                ("ethertype", json!("IPv4")),
                ("protocol", Value::Null),
                ("port_range_min", Value::Null),
                ("port_range_max", Value::Null),
                ("remote_ip_prefix", Value::Null),
                ("remote_group_id", Value::Null),
            ] {
                object.entry(key).or_insert(value);
            }
        }
        "floatingips" => floating_ip_defaults(world, &mut object),
        "trunks" => {
            object.entry("sub_ports").or_insert(json!([]));
            object.entry("status").or_insert(json!("ACTIVE"));
        }
        _ => {}
    }
    let object = Value::Object(object);
    world.neutron.insert(path, object.clone());
    if path == "subnets"
        && let Some(network) = object["network_id"].as_str().map(str::to_owned)
        && let Some(network) = world.neutron.find_mut("networks", &network)
        && let Some(subnets) = network["subnets"].as_array_mut()
    {
        subnets.push(object["id"].clone());
    }
    if path == "trunks"
        && let Some(port) = object["port_id"].as_str().map(str::to_owned)
        && let Some(port) = world.neutron.find_mut("ports", &port)
    {
        port["trunk_details"] = json!({"trunk_id": object["id"], "sub_ports": object["sub_ports"]});
    }
    if path == "security-group-rules" {
        sync_rules(
            world,
            object["security_group_id"].as_str().unwrap_or_default(),
        );
    }
    object
}

fn subnet_defaults(world: &mut World, object: &mut Map<String, Value>) {
    let cidr = object
        .get("cidr")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    if let Some((base, prefix)) = parse_cidr(&cidr) {
        let gateway = Ipv4Addr::from(base + 1).to_string();
        let last = base + (1u32 << (32 - prefix)).saturating_sub(2);
        object.entry("gateway_ip").or_insert(json!(gateway));
        object.entry("allocation_pools").or_insert(json!([{"start": Ipv4Addr::from(base + 2).to_string(), "end": Ipv4Addr::from(last).to_string()}]));
    }
    for (key, value) in [
        ("ip_version", json!(4)),
        ("enable_dhcp", json!(true)),
        ("dns_nameservers", json!([])),
        ("host_routes", json!([])),
    ] {
        object.entry(key).or_insert(value);
    }
    let _ = world;
}

fn port_defaults(world: &mut World, object: &mut Map<String, Value>) {
    let network = object
        .get("network_id")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let requested = object
        .get("fixed_ips")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut fixed_ips = Vec::new();
    let subnets: Vec<String> = world
        .neutron
        .find("networks", &network)
        .map(|n| n["subnets"].as_array().cloned().unwrap_or_default())
        .unwrap_or_default()
        .iter()
        .filter_map(Value::as_str)
        .map(str::to_owned)
        .collect();
    if requested.is_empty() {
        if let Some(subnet) = subnets.first()
            && let Some(ip) = allocate_ip(world, subnet)
        {
            fixed_ips.push(json!({"subnet_id": subnet, "ip_address": ip}));
        }
    } else {
        for want in requested {
            let subnet = want["subnet_id"]
                .as_str()
                .map(str::to_owned)
                .or_else(|| subnets.first().cloned())
                .unwrap_or_default();
            let ip = want["ip_address"]
                .as_str()
                .map(str::to_owned)
                .or_else(|| allocate_ip(world, &subnet));
            fixed_ips.push(json!({"subnet_id": subnet, "ip_address": ip}));
        }
    }
    object.insert("fixed_ips".into(), Value::Array(fixed_ips));
    let mac = format!(
        "fa:16:3e:{:02x}:{:02x}:{:02x}",
        world.rng.u8(..),
        world.rng.u8(..),
        world.rng.u8(..)
    );
    for (key, value) in [
        ("mac_address", json!(mac)),
        ("status", json!("ACTIVE")),
        ("admin_state_up", json!(true)),
        ("device_id", json!("")),
        ("device_owner", json!("")),
        ("security_groups", json!([])),
        ("allowed_address_pairs", json!([])),
        ("binding:vnic_type", json!("normal")),
        ("binding:host_id", json!("")),
        ("binding:profile", json!({})),
        ("binding:vif_type", json!("unbound")),
        ("binding:vif_details", json!({})),
        ("propagate_uplink_status", json!(false)),
        ("port_security_enabled", json!(true)),
    ] {
        object.entry(key).or_insert(value);
    }
}

fn floating_ip_defaults(world: &mut World, object: &mut Map<String, Value>) {
    let network = object
        .get("floating_network_id")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let subnet = world
        .neutron
        .find("networks", &network)
        .and_then(|n| n["subnets"][0].as_str().map(str::to_owned));
    if !object.contains_key("floating_ip_address") {
        let address = subnet.and_then(|s| allocate_ip(world, &s));
        object.insert("floating_ip_address".into(), json!(address));
    }
    let port = object
        .get("port_id")
        .and_then(Value::as_str)
        .map(str::to_owned);
    let fixed = port.as_deref().and_then(|p| first_ip(world, p));
    object.insert("fixed_ip_address".into(), json!(fixed));
    object.entry("port_id").or_insert(Value::Null);
    object.insert(
        "status".into(),
        json!(if port.is_some() { "ACTIVE" } else { "DOWN" }),
    );
    object.entry("router_id").or_insert(Value::Null);
}

fn first_ip(world: &World, port: &str) -> Option<String> {
    world.neutron.find("ports", port)?["fixed_ips"][0]["ip_address"]
        .as_str()
        .map(str::to_owned)
}

fn parse_cidr(cidr: &str) -> Option<(u32, u32)> {
    let (address, prefix) = cidr.split_once('/')?;
    let address: Ipv4Addr = address.parse().ok()?;
    let prefix: u32 = prefix.parse().ok().filter(|p| (8..=30).contains(p))?;
    let mask = u32::MAX << (32 - prefix);
    Some((u32::from(address) & mask, prefix))
}

/// The lowest free address of the subnet's pool (ports and floating IPs count as used).
fn allocate_ip(world: &World, subnet_id: &str) -> Option<String> {
    let subnet = world.neutron.find("subnets", subnet_id)?;
    let (base, prefix) = parse_cidr(subnet["cidr"].as_str()?)?;
    let used: Vec<&str> = world
        .neutron
        .all("ports")
        .iter()
        .flat_map(|p| p["fixed_ips"].as_array().into_iter().flatten())
        .filter_map(|ip| ip["ip_address"].as_str())
        .chain(
            world
                .neutron
                .all("floatingips")
                .iter()
                .filter_map(|f| f["floating_ip_address"].as_str()),
        )
        .collect();
    let size = 1u32 << (32 - prefix);
    (2..size.saturating_sub(1))
        .map(|offset| Ipv4Addr::from(base + offset).to_string())
        .find(|candidate| !used.contains(&candidate.as_str()))
}

/// A port for a load balancer's VIP: on the subnet (or network) when Neutron knows it, else an
/// address from TEST-NET-2 with a port that exists only for Octavia (the no-op driver's way).
pub fn vip_port(
    world: &mut World,
    network: Option<&str>,
    subnet: Option<&str>,
    address: Option<String>,
) -> (String, String, Option<String>) {
    let network = network.map(str::to_owned).or_else(|| {
        subnet
            .and_then(|s| world.neutron.find("subnets", s))
            .and_then(|s| s["network_id"].as_str().map(str::to_owned))
    });
    if let Some(network_id) = network
        .clone()
        .filter(|n| world.neutron.find("networks", n).is_some())
    {
        let mut request =
            json!({"network_id": network_id, "device_owner": "Octavia", "name": "octavia-lb-vip"});
        if subnet.is_some() || address.is_some() {
            request["fixed_ips"] = json!([{"subnet_id": subnet, "ip_address": address}]);
        }
        let port = create_object(world, "ports", request);
        let ip = port["fixed_ips"][0]["ip_address"]
            .as_str()
            .unwrap_or("198.51.100.1")
            .to_owned();
        return (
            port["id"].as_str().unwrap_or_default().to_owned(),
            ip,
            Some(network_id),
        );
    }
    let ip = address.unwrap_or_else(|| format!("198.51.100.{}", world.rng.u8(2..250)));
    (world.uuid(), ip, network)
}

/// Deletes a port if it exists (a VIP or a server's port going away with its owner).
pub fn release_port(world: &mut World, port_id: &str) {
    world.neutron.remove("ports", port_id);
}

/// Points a port at a server (or frees it with an empty device id).
pub fn bind_port(world: &mut World, port_id: &str, device_id: &str) {
    if let Some(port) = world.neutron.find_mut("ports", port_id) {
        port["device_id"] = json!(device_id);
        port["device_owner"] = json!(if device_id.is_empty() {
            ""
        } else {
            "compute:nova"
        });
    }
}

fn update(
    world: &mut World,
    path: &str,
    key: &str,
    kind: &str,
    id: &str,
    changes: &Value,
) -> Reply {
    let Some(changes) = changes.as_object().cloned() else {
        return Reply::neutron(400, "BadRequest", format!("Resource body required: {key}"));
    };
    let fixed = match (path, changes.get("port_id")) {
        ("floatingips", Some(Value::String(port))) => match first_ip(world, port) {
            Some(ip) => Some(json!(ip)),
            None => return not_found("Port", port),
        },
        ("floatingips", Some(Value::Null)) => Some(Value::Null),
        _ => None,
    };
    let now = world.wall_now().format("%Y-%m-%dT%H:%M:%SZ").to_string();
    let Some(object) = world.neutron.find_mut(path, id) else {
        return not_found(kind, id);
    };
    for (field, value) in changes {
        if field != "id" {
            object[field.as_str()] = value;
        }
    }
    if let Some(fixed) = fixed {
        object["status"] = json!(if fixed.is_null() { "DOWN" } else { "ACTIVE" });
        object["fixed_ip_address"] = fixed;
    }
    object["updated_at"] = json!(now);
    let revision = object["revision_number"].as_u64().unwrap_or(0) + 1;
    object["revision_number"] = json!(revision);
    Reply::ok(json!({ key: object.clone() }))
}

fn delete(world: &mut World, path: &str, kind: &str, id: &str) -> Reply {
    if world.neutron.find(path, id).is_none() {
        return not_found(kind, id);
    }
    if path == "ports"
        && let Some(trunk) = trunk_of(world, id)
    {
        return Reply::neutron(
            409,
            "PortInUseAsTrunkParent",
            format!("Port {id} is currently a parent port for trunk {trunk}."),
        );
    }
    let in_use = match path {
        "networks" => world
            .neutron
            .all("ports")
            .iter()
            .any(|p| p["network_id"] == id),
        "subnets" => world.neutron.all("ports").iter().any(|p| {
            p["fixed_ips"]
                .as_array()
                .is_some_and(|ips| ips.iter().any(|ip| ip["subnet_id"] == id))
        }),
        "routers" => world
            .neutron
            .all("ports")
            .iter()
            .any(|p| p["device_id"] == id),
        _ => false,
    };
    if in_use {
        let message = format!(
            "Unable to complete operation on {} {id}. There are one or more ports still in use.",
            kind.to_lowercase()
        );
        return Reply::neutron(409, &format!("{kind}InUse"), message);
    }
    let removed = world.neutron.remove(path, id);
    match path {
        "subnets" => {
            if let Some(network) = removed
                .as_ref()
                .and_then(|s| s["network_id"].as_str())
                .map(str::to_owned)
                && let Some(network) = world.neutron.find_mut("networks", &network)
                && let Some(subnets) = network["subnets"].as_array_mut()
            {
                subnets.retain(|s| s != id);
            }
        }
        "trunks" => {
            if let Some(port) = removed
                .as_ref()
                .and_then(|t| t["port_id"].as_str())
                .map(str::to_owned)
                && let Some(Value::Object(port)) = world.neutron.find_mut("ports", &port)
            {
                port.remove("trunk_details");
            }
        }
        "security-groups" => {
            if let Some(rules) = world.neutron.objects.get_mut("security-group-rules") {
                rules.retain(|r| r["security_group_id"] != id);
            }
        }
        "security-group-rules" => {
            if let Some(group) = removed
                .as_ref()
                .and_then(|r| r["security_group_id"].as_str())
                .map(str::to_owned)
            {
                sync_rules(world, &group);
            }
        }
        _ => {}
    }
    Reply::empty(204)
}

/// A security group shows its rules inline.
fn sync_rules(world: &mut World, group: &str) {
    let rules: Vec<Value> = world
        .neutron
        .all("security-group-rules")
        .iter()
        .filter(|r| r["security_group_id"] == group)
        .cloned()
        .collect();
    if let Some(group) = world.neutron.find_mut("security-groups", group) {
        group["security_group_rules"] = Value::Array(rules);
    }
}

fn set_tags(
    world: &mut World,
    path: &str,
    kind: &str,
    id: &str,
    all: Option<&Value>,
    one: Option<(&str, bool)>,
) -> Reply {
    let Some(object) = world.neutron.find_mut(path, id) else {
        return not_found(kind, id);
    };
    let mut tags = match all {
        Some(all) => string_list(all),
        None => string_list(&object["tags"]),
    };
    match one {
        Some((tag, true)) if !tags.iter().any(|t| t == tag) => tags.push(tag.to_owned()),
        Some((tag, false)) => tags.retain(|t| t != tag),
        _ => {}
    }
    object["tags"] = json!(tags);
    if one.is_some() {
        Reply::empty(201)
    } else {
        Reply::ok(json!({"tags": tags}))
    }
}

fn add_interface(world: &mut World, router: &str, body: &Value) -> Reply {
    if world.neutron.find("routers", router).is_none() {
        return not_found("Router", router);
    }
    let subnet_id = body["subnet_id"].as_str().unwrap_or_default().to_owned();
    let Some(subnet) = world.neutron.find("subnets", &subnet_id).cloned() else {
        return not_found("Subnet", &subnet_id);
    };
    let request = json!({"network_id": subnet["network_id"], "device_id": router, "device_owner": "network:router_interface",
                         "fixed_ips": [{"subnet_id": subnet_id, "ip_address": subnet["gateway_ip"]}]});
    let port = create_object(world, "ports", request);
    let project = world.settings.project_id.clone();
    Reply::ok(
        json!({"id": router, "subnet_id": subnet_id, "subnet_ids": [subnet_id], "port_id": port["id"],
                     "network_id": subnet["network_id"], "project_id": project, "tenant_id": project}),
    )
}

fn remove_interface(world: &mut World, router: &str, body: &Value) -> Reply {
    let subnet_id = body["subnet_id"].as_str().unwrap_or_default();
    let port = world.neutron.all("ports").iter().find(|p| {
        p["device_id"] == router
            && p["fixed_ips"]
                .as_array()
                .is_some_and(|ips| ips.iter().any(|ip| ip["subnet_id"] == subnet_id))
    });
    let Some(port) = port.cloned() else {
        return Reply::neutron(
            404,
            "RouterInterfaceNotFoundForSubnet",
            format!("Router {router} has no interface on subnet {subnet_id}"),
        );
    };
    let port_id = port["id"].as_str().unwrap_or_default().to_owned();
    world.neutron.remove("ports", &port_id);
    let project = world.settings.project_id.clone();
    Reply::ok(
        json!({"id": router, "subnet_id": subnet_id, "subnet_ids": [subnet_id], "port_id": port_id,
                     "network_id": port["network_id"], "project_id": project, "tenant_id": project}),
    )
}
