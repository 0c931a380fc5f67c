//! Neutron v2.0: networks, subnets, routers with an external gateway (a `network:router_gateway`
//! port) and interfaces, ports with fixed IPs allocated from their subnet, security groups (with
//! Neutron's default rules) and rules, floating IPs, trunks (a port parents at most one and
//! cannot be deleted while it does), tags, filters. Deletes are refused while Neutron would
//! refuse them (`NetworkInUse`, `SubnetInUse`, `RouterInUse`, `SecurityGroupInUse`). Objects are
//! kept as JSON, the way the API shows them; per-collection hooks add what Neutron computes.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};

use axum::http::Method;
use serde_json::{Map, Value, json};

use super::env::{Env, Reply, json_body, string_list};
use super::filters;

/// Neutron's state and the environment, lent for one call.
pub struct Cx<'a> {
    pub neutron: &'a mut Neutron,
    pub env: &'a mut Env,
}

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

/// `device_owner` of a router's gateway port.
const ROUTER_GATEWAY: &str = "network:router_gateway";

/// A router's interface ports (`network:router_interface`, `..._distributed`).
fn is_router_interface(port: &Value) -> bool {
    port["device_owner"]
        .as_str()
        .is_some_and(|o| o.starts_with("network:router_interface"))
}

/// Ports that only their service may delete (a router's, a floating IP's): Neutron refuses a
/// DELETE of them through the port API.
fn is_service_owned(owner: &str) -> bool {
    owner.starts_with("network:router_interface")
        || owner == "network:router_gateway"
        || owner == "network:floatingip"
        || owner == "network:router_ha_interface"
}

/// Ports Neutron makes and removes itself (DHCP), which do not hold a network or subnet.
fn is_auto_deleted(port: &Value) -> bool {
    port["device_owner"]
        .as_str()
        .is_some_and(|o| o.starts_with("network:dhcp"))
}

#[derive(Debug, Default)]
pub struct Neutron {
    /// Collection path -> objects in creation order.
    objects: BTreeMap<&'static str, Vec<Value>>,
    /// Addresses of floating IPs left pointing at nothing because their port was deleted
    /// under them (Neutron frees them silently): a test of an endpoint reads these.
    pub orphaned_floating_ips: Vec<String>,
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
pub fn seed(world: &mut Cx<'_>) {
    add_external_network(world, "public", "172.24.4.0/24");
    // Named `default`, it gets the default group's rules too (see `default_rules`).
    create_object(
        world,
        "security-groups",
        json!({"name": "default", "description": "Default security group"}),
    );
}

/// An external network and its subnet (`<name>-subnet`).
pub fn add_external_network(world: &mut Cx<'_>, name: &str, cidr: &str) {
    let network = create_object(
        world,
        "networks",
        json!({"name": name, "router:external": true}),
    );
    let network_id = network["id"].as_str().unwrap_or_default().to_owned();
    create_object(
        world,
        "subnets",
        json!({"name": format!("{name}-subnet"), "network_id": network_id, "cidr": cidr, "ip_version": 4}),
    );
}

/// DevStack's project network: `private` and its subnet.
pub fn seed_tenant_network(world: &mut Cx<'_>) {
    let network = create_object(world, "networks", json!({"name": "private"}));
    let network_id = network["id"].as_str().unwrap_or_default().to_owned();
    create_object(
        world,
        "subnets",
        json!({"name": "private-subnet", "network_id": network_id, "cidr": "10.0.0.0/24", "ip_version": 4}),
    );
}

/// `/network/v2.0/...` requests, and `/network/` (the versions, which gophercloud reads to
/// find v2.0 when the catalog's URL names none, as DevStack's does). `base` is
/// `http://host:port`.
pub fn handle(
    world: &mut Cx<'_>,
    method: &Method,
    rest: &[&str],
    query: &[(String, String)],
    body: &[u8],
    base: &str,
) -> Reply {
    if rest.is_empty() && method == Method::GET {
        return Reply::ok(json!({"versions": [{
            "id": "v2.0", "status": "CURRENT",
            "links": [{"href": format!("{base}/network/v2.0/"), "rel": "self"}]}]}));
    }
    let Some(body) = json_body(body) else {
        return Reply::neutron(400, "BadRequest", "Body contains invalid JSON.");
    };
    let rest = match rest {
        ["v2.0", rest @ ..] => rest,
        _ => return Reply::neutron(404, "HTTPNotFound", "The resource could not be found."),
    };
    if let ["extensions", alias] = rest {
        return extension(world, alias);
    }
    if rest == ["extensions"] {
        let extensions: Vec<Value> = (world.env.settings.neutron_extensions.iter())
            .map(|alias| extension_body(alias))
            .collect();
        return Reply::ok(json!({ "extensions": extensions }));
    }
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
                .map(|o| shown(world, path, o))
                .collect();
            Reply::ok(json!({ path.replace('-', "_"): items }))
        }
        ("POST", []) if path == "security-group-rules" && body.get(key).is_none() => {
            create_rules(world, &body["security_group_rules"])
        }
        ("POST", []) => match body.get(key) {
            Some(object) if object.is_object() => match validate(world, path, object) {
                Ok(()) => Reply::json(201, {
                    let created = create_object(world, path, object.clone());
                    json!({ key: shown(world, path, &created) })
                }),
                Err(reply) => reply,
            },
            _ => Reply::neutron(400, "BadRequest", format!("Resource body required: {key}")),
        },
        ("GET", [id]) => match world.neutron.find(path, id) {
            Some(object) => Reply::ok(json!({ key: shown(world, path, object) })),
            None => not_found(kind, id),
        },
        ("PUT", [id]) => update(world, path, key, kind, id, &body[key]),
        ("DELETE", [id]) => delete(world, path, kind, id),
        // Without `standard-attr-tag` there is no tags resource.
        ("PUT", [_, "tags"] | [_, "tags", _]) | ("DELETE", [_, "tags", _])
            if !world
                .env
                .settings
                .neutron_extensions
                .iter()
                .any(|e| e == "standard-attr-tag") =>
        {
            Reply::neutron(404, "HTTPNotFound", "The resource could not be found.")
        }
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

/// Neutron's native bulk create of rules: all of one group, none given twice, none the group
/// has; all are created or none (Neutron's `create_security_group_rule_bulk_native`).
fn create_rules(world: &mut Cx<'_>, rules: &Value) -> Reply {
    let Some(rules) = rules.as_array().filter(|r| !r.is_empty()) else {
        return Reply::neutron(400, "BadRequest", "Resources required");
    };
    let groups: std::collections::BTreeSet<&str> = rules
        .iter()
        .map(|r| r["security_group_id"].as_str().unwrap_or_default())
        .collect();
    if groups.len() > 1 {
        return Reply::neutron(
            400,
            "SecurityGroupNotSingleGroupRules",
            "Only allowed to update rules for one security profile at a time",
        );
    }
    let mut keys = Vec::with_capacity(rules.len());
    for rule in rules {
        if !rule.is_object() {
            return Reply::neutron(400, "BadRequest", "Resource body required");
        }
        if let Err(reply) = check_rule(world, rule) {
            return reply;
        }
        let key = rule_key(rule);
        if keys.contains(&key) {
            return Reply::neutron(
                409,
                "DuplicateSecurityGroupRuleInPost",
                "Duplicate Security Group Rule in POST.",
            );
        }
        keys.push(key);
    }
    let created: Vec<Value> = rules
        .iter()
        .map(|rule| {
            let made = create_object(world, "security-group-rules", rule.clone());
            shown(world, "security-group-rules", &made)
        })
        .collect();
    Reply::json(201, json!({ "security_group_rules": created }))
}

/// One extension, as `GET /v2.0/extensions/{alias}` shows it. Recorded on the real tier: 200
/// with the extension, else webob's 404 page (HTML, not a JSON fault).
fn extension_body(alias: &str) -> Value {
    json!({"name": alias, "alias": alias, "description": format!("The {alias} extension."),
           "updated": "2016-01-01T10:00:00-00:00", "links": []})
}

fn extension(world: &Cx<'_>, alias: &str) -> Reply {
    if world
        .env
        .settings
        .neutron_extensions
        .iter()
        .any(|e| e == alias)
    {
        return Reply::ok(json!({ "extension": extension_body(alias) }));
    }
    Reply::html(
        404,
        format!(
            "<html>\n <head>\n  <title>404 Not Found</title>\n </head>\n <body>\n  <h1>404 Not Found</h1>\n  The resource could not be found.<br /><br />\nExtension with alias {alias} does not exist\n\n\n </body>\n</html>"
        ),
    )
}

/// An object as a project member sees it: a port's binding details other than its VNIC type
/// and its `trusted` are for administrators (Neutron's policy hides them), and no
/// `propagate_uplink_status` (an extension ML2 loads only with the drivers that support it).
fn shown(world: &Cx<'_>, path: &str, object: &Value) -> Value {
    let mut object = object.clone();
    if path == "floatingips" {
        // The port a floating IP points at, as the `fip-port-details` extension shows it.
        let port = object["port_id"]
            .as_str()
            .and_then(|port| world.neutron.find("ports", port));
        object["port_details"] = port.map_or(Value::Null, |port| {
            json!({"name": port["name"], "network_id": port["network_id"],
                   "mac_address": port["mac_address"], "admin_state_up": port["admin_state_up"],
                   "status": port["status"], "device_id": port["device_id"],
                   "device_owner": port["device_owner"]})
        });
    }
    if path == "ports"
        && let Some(fields) = object.as_object_mut()
    {
        for hidden in [
            "binding:host_id",
            "binding:profile",
            "binding:vif_type",
            "binding:vif_details",
            "propagate_uplink_status",
            "trusted",
        ] {
            fields.remove(hidden);
        }
    }
    object
}

/// The trunk whose parent is `port`, if any.
fn trunk_of(world: &Cx<'_>, port: &str) -> Option<String> {
    world
        .neutron
        .all("trunks")
        .iter()
        .find(|t| t["port_id"] == port)
        .and_then(|t| t["id"].as_str())
        .map(str::to_owned)
}

fn validate(world: &Cx<'_>, path: &str, object: &Value) -> Result<(), Reply> {
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
            let range = parse_cidr(cidr).ok_or_else(|| {
                Reply::neutron(
                    400,
                    "InvalidInput",
                    format!("Invalid input for cidr. Reason: '{cidr}' is not a valid IP subnet."),
                )
            })?;
            let network = object["network_id"].as_str().unwrap_or_default();
            let overlaps = world
                .neutron
                .all("subnets")
                .iter()
                .filter(|s| s["network_id"] == network)
                .filter_map(|s| parse_cidr(s["cidr"].as_str()?))
                .any(|other| range.overlaps(other));
            if overlaps {
                return Err(Reply::neutron(
                    400,
                    "InvalidInput",
                    format!(
                        "Invalid input for operation: Requested subnet with cidr: {cidr} for \
                         network: {network} overlaps with another subnet."
                    ),
                ));
            }
            Ok(())
        }
        "ports" => {
            // A port's own `trusted` exists with the `port-trusted-vif` extension alone;
            // Neutron refuses an attribute it does not know (neutron_lib's
            // `verify_attributes`).
            let has_trusted_vif =
                (world.env.settings.neutron_extensions.iter()).any(|e| e == "port-trusted-vif");
            if object.get("trusted").is_some() && !has_trusted_vif {
                return Err(Reply::neutron(
                    400,
                    "HTTPBadRequest",
                    "Unrecognized attribute(s) 'trusted'",
                ));
            }
            network_exists("network_id")?;
            if world
                .env
                .settings
                .quotas
                .ports
                .is_some_and(|limit| world.neutron.all("ports").len() >= limit)
            {
                return Err(Reply::neutron(
                    409,
                    "OverQuota",
                    "Quota exceeded for resources: ['port'].",
                ));
            }
            let network = object["network_id"].as_str().unwrap_or_default();
            for want in object["fixed_ips"].as_array().into_iter().flatten() {
                if let Some(ip) = want["ip_address"].as_str() {
                    let subnet = want["subnet_id"]
                        .as_str()
                        .map(str::to_owned)
                        .or_else(|| subnet_for_ip(world, network, ip))
                        .unwrap_or_default();
                    free_ip(world, &subnet, ip, None)?;
                }
            }
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
            if !world
                .neutron
                .find("networks", id)
                .is_some_and(|n| n["router:external"] == true)
            {
                return Err(Reply::neutron(
                    400,
                    "BadRequest",
                    format!(
                        "Bad floatingip request: Network {id} is not a valid external network."
                    ),
                ));
            }
            if let Some(port) = object["port_id"].as_str() {
                // Neutron allocates the address (and the ID) before it checks the association,
                // and names both in its refusal; the ID here stands in for the one it would get.
                let address = match object["floating_ip_address"].as_str() {
                    Some(ip) => Some(ip.to_owned()),
                    None => world
                        .neutron
                        .find("networks", id)
                        .and_then(|n| n["subnets"][0].as_str())
                        .and_then(|subnet| allocate_ip(world, subnet)),
                };
                let fip = (PROVISIONAL_ID, address.as_deref().unwrap_or_default());
                let fixed = object["fixed_ip_address"].as_str();
                fip_association(world, Some(fip), id, port, fixed)?;
            }
            match object["floating_ip_address"].as_str() {
                Some(ip) => {
                    let Some(subnet) = subnet_for_ip(world, id, ip) else {
                        return Err(invalid_ip_for_network(ip));
                    };
                    free_ip(world, &subnet, ip, None)
                }
                // Neutron's answer when the external network has no address left.
                None => match world
                    .neutron
                    .find("networks", id)
                    .and_then(|n| n["subnets"][0].as_str())
                {
                    Some(subnet) if allocate_ip(world, subnet).is_none() => Err(Reply::neutron(
                        409,
                        "IpAddressGenerationFailure",
                        format!("No more IP addresses available on network {id}."),
                    )),
                    _ => Ok(()),
                },
            }
        }
        "routers" => match &object["external_gateway_info"] {
            info if has_gateway(info) => check_gateway(world, info, None),
            _ => Ok(()),
        },
        "security-groups" => check_group_name(object),
        "security-group-rules" => check_rule(world, object),
        _ => Ok(()),
    }
}

/// Neutron reserves `default` for the group it makes itself.
fn check_group_name(object: &Value) -> Result<(), Reply> {
    if object["name"]
        .as_str()
        .is_some_and(|n| n.eq_ignore_ascii_case("default"))
    {
        Err(Reply::neutron(
            409,
            "SecurityGroupDefaultAlreadyExists",
            "Default security group already exists.",
        ))
    } else {
        Ok(())
    }
}

/// A rule's group and remote group exist, it names one remote at most, and its group has no
/// rule like it yet.
fn check_rule(world: &Cx<'_>, object: &Value) -> Result<(), Reply> {
    let id = object["security_group_id"].as_str().unwrap_or_default();
    let Some(group) = world.neutron.find("security-groups", id) else {
        return Err(not_found("SecurityGroup", id));
    };
    if let Some(remote) = object["remote_group_id"].as_str() {
        if world.neutron.find("security-groups", remote).is_none() {
            return Err(not_found("SecurityGroup", remote));
        }
        if !object["remote_ip_prefix"].is_null() {
            return Err(Reply::neutron(
                400,
                "SecurityGroupRemoteGroupAndRemoteIpPrefix",
                "Only remote_ip_prefix or remote_group_id may be provided.",
            ));
        }
    }
    let key = rule_key(object);
    // The group's rules as it shows them inline (kept in step by `sync_rules` and
    // `show_new_rule`): a scan of every rule in the cloud per rule made was the simulator's
    // bottleneck at thousands of clusters.
    let rules = group["security_group_rules"].as_array().map(Vec::as_slice);
    match rules
        .unwrap_or_default()
        .iter()
        .find(|r| rule_key(r) == key)
    {
        Some(existing) => Err(Reply::neutron(
            409,
            "SecurityGroupRuleExists",
            format!(
                "Security group rule already exists. Rule id is {}.",
                existing["id"].as_str().unwrap_or_default()
            ),
        )),
        None => Ok(()),
    }
}

/// What Neutron compares to find a duplicate rule: direction, ethertype, protocol (names and
/// numbers alike), port range, remote CIDR (normalised; "everything" is no prefix) and remote
/// groups; `None` where unset.
fn rule_key(rule: &Value) -> Vec<Option<String>> {
    let text = |value: &Value| match value {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    };
    let ethertype = text(&rule["ethertype"]).unwrap_or_else(|| "IPv4".into());
    let protocol = text(&rule["protocol"]).and_then(|p| protocol_number(&p, ethertype == "IPv6"));
    let cidr = rule["remote_ip_prefix"].as_str().and_then(normalized_cidr);
    vec![
        text(&rule["direction"]),
        Some(ethertype),
        protocol,
        text(&rule["port_range_min"]),
        text(&rule["port_range_max"]),
        cidr,
        text(&rule["remote_group_id"]),
        text(&rule["remote_address_group_id"]),
    ]
}

/// A protocol as its IANA number (`any`: none); unknown names stay as they are.
fn protocol_number(protocol: &str, ipv6: bool) -> Option<String> {
    let protocol = protocol.to_ascii_lowercase();
    let number = match protocol.as_str() {
        "any" => return None,
        "icmp" | "1" if ipv6 => "58",
        "icmp" => "1",
        "igmp" => "2",
        "ipip" => "4",
        "tcp" => "6",
        "egp" => "8",
        "udp" => "17",
        "ipv6-encap" => "41",
        "gre" => "47",
        "esp" => "50",
        "ah" => "51",
        "icmpv6" | "ipv6-icmp" => "58",
        "ospf" => "89",
        "pgm" => "113",
        "vrrp" => "112",
        "sctp" => "132",
        "udplite" => "136",
        other => other,
    };
    Some(number.to_owned())
}

/// `10.0.0.5/24` -> `10.0.0.0/24`; a bare address is a host route; `0.0.0.0/0` and `::/0`
/// (everything) are none, as Neutron compares them.
fn normalized_cidr(prefix: &str) -> Option<String> {
    let (address, length) = match prefix.split_once('/') {
        Some((address, length)) => (address, Some(length)),
        None => (prefix, None),
    };
    let address: IpAddr = address.parse().ok()?;
    let normalized = match address {
        IpAddr::V4(v4) => {
            let length: u32 = length.map_or(Some(32), |l| l.parse().ok())?.min(32);
            let mask = u32::MAX.checked_shl(32 - length).unwrap_or(0);
            format!("{}/{length}", Ipv4Addr::from(u32::from(v4) & mask))
        }
        IpAddr::V6(v6) => {
            let length: u32 = length.map_or(Some(128), |l| l.parse().ok())?.min(128);
            let mask = u128::MAX.checked_shl(128 - length).unwrap_or(0);
            format!(
                "{}/{length}",
                std::net::Ipv6Addr::from(u128::from(v6) & mask)
            )
        }
    };
    (normalized != "0.0.0.0/0" && normalized != "::/0").then_some(normalized)
}

/// A gateway request names a network (`{}` or null clears the gateway).
fn has_gateway(info: &Value) -> bool {
    info.get("network_id").is_some_and(|n| !n.is_null())
}

/// Checks `external_gateway_info` as Neutron does before it makes the gateway port: an
/// external network, and fixed IPs on its subnets that are free (`router`'s own gateway port
/// aside).
fn check_gateway(world: &Cx<'_>, info: &Value, router: Option<&str>) -> Result<(), Reply> {
    let network = info["network_id"].as_str().unwrap_or_default();
    let Some(found) = world.neutron.find("networks", network) else {
        return Err(not_found("Network", network));
    };
    if found["router:external"] != true {
        return Err(Reply::neutron(
            400,
            "BadRequest",
            format!("Bad router request: Network {network} is not an external network."),
        ));
    }
    for want in info["external_fixed_ips"].as_array().into_iter().flatten() {
        let ip = want["ip_address"].as_str();
        let subnet = match want["subnet_id"].as_str() {
            Some(subnet) => {
                let Some(found) = world.neutron.find("subnets", subnet) else {
                    return Err(not_found("Subnet", subnet));
                };
                if found["network_id"] != network {
                    return Err(Reply::neutron(
                        400,
                        "InvalidInput",
                        format!(
                            "Invalid input for operation: Failed to create port on network \
                             {network}, because fixed_ips included invalid subnet {subnet}."
                        ),
                    ));
                }
                if let Some(ip) = ip
                    && !subnet_contains(world, subnet, ip)
                {
                    return Err(Reply::neutron(
                        400,
                        "InvalidIpForSubnet",
                        format!("IP address {ip} is not a valid IP for the specified subnet."),
                    ));
                }
                subnet.to_owned()
            }
            None => match ip.and_then(|ip| subnet_for_ip(world, network, ip)) {
                Some(subnet) => subnet,
                None if ip.is_some() => {
                    return Err(invalid_ip_for_network(ip.unwrap_or_default()));
                }
                None => continue,
            },
        };
        if let Some(ip) = ip {
            free_ip(world, &subnet, ip, router)?;
        }
    }
    Ok(())
}

fn invalid_ip_for_network(ip: &str) -> Reply {
    Reply::neutron(
        400,
        "InvalidIpForNetwork",
        format!(
            "IP address {ip} is not a valid IP for any of the subnets on the specified network."
        ),
    )
}

/// `ip` on `subnet` is no port's and no floating IP's (the gateway port of `except`, a
/// router, aside): else Neutron's 409.
fn free_ip(world: &Cx<'_>, subnet: &str, ip: &str, except: Option<&str>) -> Result<(), Reply> {
    let network = world
        .neutron
        .find("subnets", subnet)
        .map(|s| s["network_id"].clone())
        .unwrap_or_default();
    let by_port = world.neutron.all("ports").iter().any(|p| {
        !(except.is_some_and(|r| p["device_id"] == r) && p["device_owner"] == ROUTER_GATEWAY)
            && p["fixed_ips"].as_array().is_some_and(|ips| {
                ips.iter()
                    .any(|f| f["subnet_id"] == subnet && f["ip_address"] == ip)
            })
    });
    let by_floating_ip = world
        .neutron
        .all("floatingips")
        .iter()
        .any(|f| f["floating_network_id"] == network && f["floating_ip_address"] == ip);
    if by_port || by_floating_ip {
        Err(Reply::neutron(
            409,
            "IpAddressAlreadyAllocated",
            format!("IP address {ip} already allocated in subnet {subnet}"),
        ))
    } else {
        Ok(())
    }
}

fn subnet_contains(world: &Cx<'_>, subnet: &str, ip: &str) -> bool {
    let Ok(ip) = ip.parse::<IpAddr>() else {
        return false;
    };
    world
        .neutron
        .find("subnets", subnet)
        .and_then(|s| parse_cidr(s["cidr"].as_str()?))
        .is_some_and(|range| range.contains(ip))
}

/// The subnet of `network` whose range holds `ip`.
fn subnet_for_ip(world: &Cx<'_>, network: &str, ip: &str) -> Option<String> {
    world.neutron.find("networks", network)?["subnets"]
        .as_array()?
        .iter()
        .filter_map(Value::as_str)
        .find(|s| subnet_contains(world, s, ip))
        .map(str::to_owned)
}

/// Creates an object with Neutron's computed fields, through the same hooks as the API.
pub fn create_object(world: &mut Cx<'_>, path: &str, request: Value) -> Value {
    let Some((path, _, _)) = collection(path) else {
        return Value::Null;
    };
    let mut object = match request {
        Value::Object(map) => map,
        _ => Map::new(),
    };
    let id = world.env.uuid();
    let now = world.env.utc_timestamp();
    let project = world.env.settings.project_id.clone();
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
                ("availability_zone_hints", json!([])),
                ("availability_zones", json!([])),
                ("ipv4_address_scope", Value::Null),
                ("ipv6_address_scope", Value::Null),
                ("is_default", json!(false)),
                ("qinq", json!(false)),
                ("vlan_transparent", json!(false)),
            ] {
                object.entry(key).or_insert(value);
            }
        }
        "subnets" => subnet_defaults(world, &mut object),
        "ports" => port_defaults(world, &mut object),
        "routers" => {
            for (key, value) in [
                ("status", json!("ACTIVE")),
                ("admin_state_up", json!(true)),
                ("availability_zone_hints", json!([])),
                ("availability_zones", json!([])),
                ("flavor_id", Value::Null),
                ("routes", json!([])),
            ] {
                object.entry(key).or_insert(value);
            }
            let info = object
                .remove("external_gateway_info")
                .unwrap_or(Value::Null);
            let gateway = attach_gateway(world, &id, &info);
            object.insert("external_gateway_info".into(), gateway);
        }
        "security-groups" => {
            object.insert("security_group_rules".into(), json!([]));
            object.entry("shared").or_insert(json!(false));
            object.entry("stateful").or_insert(json!(true));
        }
        "security-group-rules" => {
            // Rules have no name and take no tags; a rule made without a description has none.
            object.remove("name");
            object.remove("tags");
            if object.get("description").is_some_and(|d| d == "") {
                object.insert("description".into(), Value::Null);
            }
            let default_group = world
                .neutron
                .find(
                    "security-groups",
                    object["security_group_id"].as_str().unwrap_or_default(),
                )
                .is_some_and(|g| g["name"] == "default");
            object.insert("belongs_to_default_sg".into(), json!(default_group));
            for (key, value) in [
                ("ethertype", json!("IPv4")),
                ("protocol", Value::Null),
                ("port_range_min", Value::Null),
                ("port_range_max", Value::Null),
                ("remote_ip_prefix", Value::Null),
                ("remote_group_id", Value::Null),
                ("remote_address_group_id", Value::Null),
            ] {
                object.entry(key).or_insert(value);
            }
            let normalized = object
                .get("remote_ip_prefix")
                .and_then(Value::as_str)
                .and_then(|p| normalized_cidr(p).or_else(|| Some(p.to_owned())));
            object.insert("normalized_cidr".into(), json!(normalized));
        }
        "floatingips" => floating_ip_defaults(world, &mut object),
        "trunks" => {
            object.entry("sub_ports").or_insert(json!([]));
            object.entry("status").or_insert(json!("ACTIVE"));
            object.entry("admin_state_up").or_insert(json!(true));
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
        show_new_rule(world, &object);
    }
    if path == "security-groups" {
        return default_rules(world, &id, object["name"] == "default");
    }
    object
}

/// Neutron's rules for a new group, per ethertype: egress to anywhere, and for the project's
/// `default` group also ingress from its own members. Returns the group with them inline.
fn default_rules(world: &mut Cx<'_>, group: &str, default: bool) -> Value {
    for ethertype in ["IPv4", "IPv6"] {
        if default {
            create_object(
                world,
                "security-group-rules",
                json!({"security_group_id": group, "direction": "ingress", "ethertype": ethertype,
                       "remote_group_id": group}),
            );
        }
        create_object(
            world,
            "security-group-rules",
            json!({"security_group_id": group, "direction": "egress", "ethertype": ethertype}),
        );
    }
    world
        .neutron
        .find("security-groups", group)
        .cloned()
        .unwrap_or_default()
}

/// Makes the gateway port `info` asks for (none when it names no network) and returns the
/// router's `external_gateway_info`.
fn attach_gateway(world: &mut Cx<'_>, router: &str, info: &Value) -> Value {
    if !has_gateway(info) {
        return Value::Null;
    }
    let network = info["network_id"].clone();
    let mut request = json!({"network_id": network, "device_id": router, "device_owner": ROUTER_GATEWAY,
                             "name": "", "project_id": "", "tenant_id": ""});
    if let Some(ips) = info["external_fixed_ips"]
        .as_array()
        .filter(|ips| !ips.is_empty())
    {
        request["fixed_ips"] = json!(ips);
    }
    let port = create_object(world, "ports", request);
    let ips: Vec<Value> = port["fixed_ips"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|ip| json!({"subnet_id": ip["subnet_id"], "ip_address": ip["ip_address"]}))
        .collect();
    json!({"network_id": network, "enable_snat": info["enable_snat"].as_bool().unwrap_or(true),
           "external_fixed_ips": ips})
}

/// Removes `router`'s gateway port.
fn detach_gateway(world: &mut Cx<'_>, router: &str) {
    if let Some(ports) = world.neutron.objects.get_mut("ports") {
        ports.retain(|p| !(p["device_id"] == router && p["device_owner"] == ROUTER_GATEWAY));
    }
}

fn subnet_defaults(world: &mut Cx<'_>, object: &mut Map<String, Value>) {
    let cidr = object
        .get("cidr")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let range = parse_cidr(&cidr);
    if let Some(range) = range {
        // As recorded on the real tier: IPv4's gateway is .1, its pool .2 to the address
        // before broadcast; IPv6's gateway is the range's first address (`fd00:88::`), its
        // pool `::1` to the last.
        let host_bits = range.bits() - range.prefix;
        let span = 1u128.checked_shl(host_bits).unwrap_or(0).wrapping_sub(1);
        let (gateway, first, last) = if range.v6 {
            (0, 1, span)
        } else {
            (1, 2, span - 1)
        };
        object
            .entry("gateway_ip")
            .or_insert(json!(range.nth(gateway)));
        object
            .entry("allocation_pools")
            .or_insert(json!([{"start": range.nth(first), "end": range.nth(last)}]));
    }
    let version = if range.is_some_and(|r| r.v6) { 6 } else { 4 };
    let external = object
        .get("network_id")
        .and_then(Value::as_str)
        .and_then(|network| world.neutron.find("networks", network))
        .is_some_and(|network| network["router:external"] == true);
    for (key, value) in [
        ("ip_version", json!(version)),
        ("enable_dhcp", json!(true)),
        ("dns_nameservers", json!([])),
        ("host_routes", json!([])),
        ("ipv6_address_mode", Value::Null),
        ("ipv6_ra_mode", Value::Null),
        ("router:external", json!(external)),
        ("service_types", json!([])),
        ("subnetpool_id", Value::Null),
    ] {
        object.entry(key).or_insert(value);
    }
}

fn port_defaults(world: &mut Cx<'_>, object: &mut Map<String, Value>) {
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
        // As Neutron: one address of each IP version the network has a subnet for.
        let mut versions_done = Vec::new();
        for subnet in &subnets {
            let version = world
                .neutron
                .find("subnets", subnet)
                .map(|s| s["ip_version"].clone());
            if versions_done.contains(&version) {
                continue;
            }
            if let Some(ip) = allocate_ip(world, subnet) {
                fixed_ips.push(json!({"subnet_id": subnet, "ip_address": ip}));
                versions_done.push(version);
            }
        }
    } else {
        for want in requested {
            let subnet = want["subnet_id"]
                .as_str()
                .map(str::to_owned)
                .or_else(|| {
                    want["ip_address"]
                        .as_str()
                        .and_then(|ip| subnet_for_ip(world, &network, ip))
                })
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
        world.env.rng.u8(..),
        world.env.rng.u8(..),
        world.env.rng.u8(..)
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
        ("extra_dhcp_opts", json!([])),
    ] {
        object.entry(key).or_insert(value);
    }
    // The port_trusted extension driver writes the port's own `trusted` into its
    // `binding:profile` too (neutron's `PortTrustedDbMixin`, checked on the real tier).
    if let Some(trusted) = object.get("trusted").cloned().filter(Value::is_boolean)
        && let Some(profile) = object
            .get_mut("binding:profile")
            .and_then(Value::as_object_mut)
    {
        profile.insert("trusted".into(), trusted);
    }
    fill_pair_macs(object);
}

/// Neutron stores each allowed address pair with a MAC: the port's own when none is given.
fn fill_pair_macs(port: &mut Map<String, Value>) {
    let mac = port.get("mac_address").cloned().unwrap_or_default();
    if let Some(Value::Array(pairs)) = port.get_mut("allowed_address_pairs") {
        for pair in pairs.iter_mut().filter_map(Value::as_object_mut) {
            let given = pair.get("mac_address").is_some_and(|m| !m.is_null());
            if !given {
                pair.insert("mac_address".into(), mac.clone());
            }
        }
    }
}

fn floating_ip_defaults(world: &mut Cx<'_>, object: &mut Map<String, Value>) {
    // Floating IPs have no name.
    object.remove("name");
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
    // `validate` has checked the association already: this is where it lands.
    let asked = object.get("fixed_ip_address").and_then(Value::as_str);
    let (fixed, router) = port
        .as_deref()
        .and_then(|p| fip_association(world, None, &network, p, asked).ok())
        .unzip();
    object.insert("fixed_ip_address".into(), json!(fixed));
    object.entry("port_id").or_insert(Value::Null);
    object.insert(
        "status".into(),
        json!(if port.is_some() { "ACTIVE" } else { "DOWN" }),
    );
    object.insert("router_id".into(), json!(router));
}

/// The port's first IPv4 fixed IP, as Neutron picks one for a floating IP.
fn first_ip(world: &Cx<'_>, port: &str) -> Option<String> {
    first_v4(world, port).and_then(|ip| ip["ip_address"].as_str().map(str::to_owned))
}

fn first_v4(world: &Cx<'_>, port: &str) -> Option<Value> {
    world.neutron.find("ports", port)?["fixed_ips"]
        .as_array()?
        .iter()
        .find(|ip| {
            ip["ip_address"]
                .as_str()
                .is_some_and(|a| a.parse::<Ipv4Addr>().is_ok())
        })
        .cloned()
}

/// The ID a floating IP refused at its create is named by (Neutron names the one it had
/// drawn before the refusal rolled it back).
const PROVISIONAL_ID: &str = "00000000-0000-4000-8000-000000000000";

/// Where a floating IP on `network` pointing at `port` lands: the fixed IP (`fixed`, else the
/// port's first IPv4 one) and the router it goes through. As Neutron's
/// `_check_and_get_fip_assoc` (l3_db.py), which both a create naming `port_id` and an update
/// run: the port must exist and hold the fixed IP, no other floating IP on the network may
/// point at that fixed IP, and a router must join the port's subnet to the network.
/// `fip` is the floating IP's own (id, address), once it has them.
fn fip_association(
    world: &Cx<'_>,
    fip: Option<(&str, &str)>,
    network: &str,
    port: &str,
    fixed: Option<&str>,
) -> Result<(String, String), Reply> {
    let Some(port_object) = world.neutron.find("ports", port) else {
        return Err(not_found("Port", port));
    };
    let fixed = match fixed {
        Some(ip)
            if port_object["fixed_ips"]
                .as_array()
                .is_some_and(|ips| ips.iter().any(|f| f["ip_address"] == ip)) =>
        {
            ip.to_owned()
        }
        Some(ip) => {
            return Err(Reply::neutron(
                400,
                "BadRequest",
                format!("Bad floatingip request: Port {port} does not have fixed ip {ip}."),
            ));
        }
        None => match first_ip(world, port) {
            Some(ip) => ip,
            None => {
                return Err(Reply::neutron(
                    400,
                    "BadRequest",
                    format!("Bad floatingip request: Port {port} does not have any IPv4 address."),
                ));
            }
        },
    };
    let (id, address) = fip.unwrap_or_default();
    let taken = world.neutron.all("floatingips").iter().any(|f| {
        f["id"] != id
            && f["port_id"] == port
            && f["fixed_ip_address"] == fixed.as_str()
            && f["floating_network_id"] == network
    });
    if taken {
        return Err(Reply::neutron(
            409,
            "FloatingIPPortAlreadyAssociated",
            format!(
                "Cannot associate floating IP {address} ({id}) with port {port} using \
                 fixed IP {fixed}, as that fixed IP already has a floating IP on external \
                 network {network}."
            ),
        ));
    }
    // As Neutron: only through a router with a gateway on the floating network.
    let Some(router) = router_for(world, network, port) else {
        let subnet = port_object["fixed_ips"][0]["subnet_id"]
            .as_str()
            .unwrap_or_default();
        return Err(Reply::neutron(
            404,
            "ExternalGatewayForFloatingIPNotFound",
            format!(
                "External network {network} is not reachable from subnet {subnet}.  \
                 Therefore, cannot associate Port {port} with a Floating IP."
            ),
        ));
    };
    Ok((fixed, router))
}

/// The router that joins `port`'s subnet to the external `network`: a gateway there and an
/// interface on the subnet. A floating IP pointing at the port goes through it.
fn router_for(world: &Cx<'_>, network: &str, port: &str) -> Option<String> {
    let subnet = first_v4(world, port)?["subnet_id"].clone();
    world
        .neutron
        .all("routers")
        .iter()
        .filter(|r| r["external_gateway_info"]["network_id"] == network)
        .find(|r| {
            world.neutron.all("ports").iter().any(|p| {
                is_router_interface(p)
                    && p["device_id"] == r["id"]
                    && p["fixed_ips"]
                        .as_array()
                        .is_some_and(|ips| ips.iter().any(|ip| ip["subnet_id"] == subnet))
            })
        })
        .and_then(|r| r["id"].as_str())
        .map(str::to_owned)
}

/// A subnet's range, IPv4 or IPv6, as one number space.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Cidr {
    base: u128,
    prefix: u32,
    v6: bool,
}

impl Cidr {
    fn bits(self) -> u32 {
        if self.v6 { 128 } else { 32 }
    }

    fn mask(self, prefix: u32) -> u128 {
        let host_bits = self.bits() - prefix;
        let all = if self.v6 {
            u128::MAX
        } else {
            u128::from(u32::MAX)
        };
        all.checked_shl(host_bits).unwrap_or(0) & all
    }

    /// The address `offset` into the range.
    fn nth(self, offset: u128) -> String {
        let value = self.base + offset;
        if self.v6 {
            std::net::Ipv6Addr::from(value).to_string()
        } else {
            Ipv4Addr::from(u32::try_from(value).unwrap_or_default()).to_string()
        }
    }

    /// Addresses in the range (capped: nobody allocates past the first 2^16 here).
    fn size(self) -> u128 {
        1u128 << (self.bits() - self.prefix).min(16)
    }

    fn contains(self, ip: IpAddr) -> bool {
        let value = match (ip, self.v6) {
            (IpAddr::V4(v4), false) => u128::from(u32::from(v4)),
            (IpAddr::V6(v6), true) => u128::from(v6),
            _ => return false,
        };
        value & self.mask(self.prefix) == self.base
    }

    /// Whether two ranges of the same family share an address.
    fn overlaps(self, other: Cidr) -> bool {
        let prefix = self.prefix.min(other.prefix);
        self.v6 == other.v6 && self.base & self.mask(prefix) == other.base & self.mask(prefix)
    }
}

fn parse_cidr(cidr: &str) -> Option<Cidr> {
    let (address, prefix) = cidr.split_once('/')?;
    let prefix: u32 = prefix.parse().ok()?;
    let (value, v6) = match address.parse::<IpAddr>().ok()? {
        IpAddr::V4(v4) if (8..=30).contains(&prefix) => (u128::from(u32::from(v4)), false),
        IpAddr::V6(v6) if (8..=126).contains(&prefix) => (u128::from(v6), true),
        _ => return None,
    };
    let mut range = Cidr {
        base: value,
        prefix,
        v6,
    };
    range.base = value & range.mask(prefix);
    Some(range)
}

/// The lowest free address of the subnet's pool (ports and floating IPs count as used).
fn allocate_ip(world: &Cx<'_>, subnet_id: &str) -> Option<String> {
    let subnet = world.neutron.find("subnets", subnet_id)?;
    let range = parse_cidr(subnet["cidr"].as_str()?)?;
    // Addresses are unique within a subnet; other networks may reuse the same range.
    let network = &subnet["network_id"];
    let used: std::collections::HashSet<&str> = world
        .neutron
        .all("ports")
        .iter()
        .flat_map(|p| p["fixed_ips"].as_array().into_iter().flatten())
        .filter(|ip| ip["subnet_id"] == subnet_id)
        .filter_map(|ip| ip["ip_address"].as_str())
        .chain(
            world
                .neutron
                .all("floatingips")
                .iter()
                .filter(|f| &f["floating_network_id"] == network)
                .filter_map(|f| f["floating_ip_address"].as_str()),
        )
        .collect();
    let first = if range.v6 { 1 } else { 2 };
    (first..range.size().saturating_sub(1))
        .map(|offset| range.nth(offset))
        .find(|candidate| !used.contains(candidate.as_str()))
}

/// A port for a load balancer's VIP: on the subnet (or network) when Neutron knows it, else an
/// address from TEST-NET-2 with a port that exists only for Octavia (the no-op driver's way).
pub fn vip_port(
    world: &mut Cx<'_>,
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
    let ip = address.unwrap_or_else(|| format!("198.51.100.{}", world.env.rng.u8(2..250)));
    (world.env.uuid(), ip, network)
}

/// Deletes a port if it exists (a VIP or a server's port going away with its owner).
pub fn release_port(world: &mut Cx<'_>, port_id: &str) {
    if world.neutron.remove("ports", port_id).is_some() {
        forget_port(world, port_id);
    }
}

/// A port is gone: floating IPs that pointed at it are free again (DOWN).
fn forget_port(world: &mut Cx<'_>, port_id: &str) {
    let mut orphaned = Vec::new();
    for fip in world
        .neutron
        .objects
        .get_mut("floatingips")
        .into_iter()
        .flatten()
        .filter(|f| f["port_id"] == port_id)
    {
        if let Some(address) = fip["floating_ip_address"].as_str() {
            orphaned.push(address.to_owned());
        }
        fip["port_id"] = Value::Null;
        fip["fixed_ip_address"] = Value::Null;
        fip["router_id"] = Value::Null;
        fip["status"] = json!("DOWN");
    }
    world.neutron.orphaned_floating_ips.extend(orphaned);
}

/// Points a port at a server (or frees it with an empty device id).
pub fn bind_port(world: &mut Cx<'_>, port_id: &str, device_id: &str) {
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
    world: &mut Cx<'_>,
    path: &str,
    key: &str,
    kind: &str,
    id: &str,
    changes: &Value,
) -> Reply {
    let Some(mut changes) = changes.as_object().cloned() else {
        return Reply::neutron(400, "BadRequest", format!("Resource body required: {key}"));
    };
    let Some(current) = world.neutron.find(path, id).cloned() else {
        return not_found(kind, id);
    };
    if path == "security-groups"
        && let Err(refused) = check_group_name(&Value::Object(changes.clone()))
    {
        return refused;
    }
    let pairs_given = changes
        .get("allowed_address_pairs")
        .and_then(Value::as_array)
        .is_some_and(|pairs| !pairs.is_empty());
    if path == "ports" && pairs_given && current["port_security_enabled"] == false {
        return Reply::neutron(
            409,
            "AddressPairAndPortSecurityRequired",
            "Port Security must be enabled in order to have allowed address pairs on a port.",
        );
    }
    // A floating IP's (fixed IP, router) once it points at `port_id`, or (null, null). As
    // Neutron (`_check_and_get_fip_assoc` in l3_db.py): an update without a port_id
    // disassociates, whatever else it changes (CAPO 0.14 disassociates with `{}`).
    if path == "floatingips" && !changes.contains_key("port_id") {
        if changes.contains_key("fixed_ip_address") {
            return Reply::neutron(
                400,
                "BadRequest",
                "Bad floatingip request: fixed_ip_address cannot be specified without a port_id.",
            );
        }
        changes.insert("port_id".into(), Value::Null);
    }
    let association = match (path, changes.get("port_id")) {
        ("floatingips", Some(Value::String(port))) => {
            let network = current["floating_network_id"].as_str().unwrap_or_default();
            let fip = (
                id,
                current["floating_ip_address"].as_str().unwrap_or_default(),
            );
            let fixed = changes.get("fixed_ip_address").and_then(Value::as_str);
            match fip_association(world, Some(fip), network, port, fixed) {
                Ok((fixed, router)) => Some((json!(fixed), json!(router))),
                Err(refused) => return refused,
            }
        }
        ("floatingips", Some(Value::Null)) => Some((Value::Null, Value::Null)),
        _ => None,
    };
    let gateway = match changes.remove("external_gateway_info") {
        Some(info) if path == "routers" => match change_gateway(world, id, &current, &info) {
            Ok(gateway) => Some(gateway),
            Err(refused) => return refused,
        },
        Some(info) => {
            changes.insert("external_gateway_info".into(), info);
            None
        }
        None => None,
    };
    let now = world.env.utc_timestamp();
    let Some(object) = world.neutron.find_mut(path, id) else {
        return not_found(kind, id);
    };
    for (field, value) in changes {
        if field != "id" {
            object[field.as_str()] = value;
        }
    }
    if let Some((fixed, router)) = association {
        object["status"] = json!(if fixed.is_null() { "DOWN" } else { "ACTIVE" });
        object["fixed_ip_address"] = fixed;
        object["router_id"] = router;
    }
    if let Some(gateway) = gateway {
        object["external_gateway_info"] = gateway;
    }
    if path == "ports"
        && let Some(port) = object.as_object_mut()
    {
        fill_pair_macs(port);
    }
    object["updated_at"] = json!(now);
    let revision = object["revision_number"].as_u64().unwrap_or(0) + 1;
    object["revision_number"] = json!(revision);
    let object = object.clone();
    Reply::ok(json!({ key: shown(world, path, &object) }))
}

/// A router's `external_gateway_info` after a PUT: set, moved or cleared, as Neutron does it
/// (the same network without new fixed IPs keeps the port; floating IPs through the router
/// pin its gateway).
fn change_gateway(
    world: &mut Cx<'_>,
    router: &str,
    current: &Value,
    info: &Value,
) -> Result<Value, Reply> {
    let old = &current["external_gateway_info"];
    let same_network = has_gateway(info) && old["network_id"] == info["network_id"];
    if has_gateway(old)
        && !same_network
        && world
            .neutron
            .all("floatingips")
            .iter()
            .any(|f| f["router_id"] == router)
    {
        return Err(Reply::neutron(
            409,
            "RouterExternalGatewayInUseByFloatingIp",
            format!(
                "Gateway cannot be updated for router {router}, since a gateway to external \
                 network {} is required by one or more floating IPs.",
                old["network_id"].as_str().unwrap_or_default()
            ),
        ));
    }
    if has_gateway(info) {
        check_gateway(world, info, Some(router))?;
    }
    let new_ips = info["external_fixed_ips"]
        .as_array()
        .is_some_and(|ips| !ips.is_empty());
    if same_network && !new_ips {
        let mut kept = old.clone();
        kept["enable_snat"] = json!(info["enable_snat"].as_bool().unwrap_or(true));
        return Ok(kept);
    }
    detach_gateway(world, router);
    Ok(attach_gateway(world, router, info))
}

fn delete(world: &mut Cx<'_>, path: &str, kind: &str, id: &str) -> Reply {
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
    if path == "ports"
        && let Some(owner) = world.neutron.find(path, id).and_then(|p| {
            let owner = p["device_owner"].as_str()?;
            is_service_owned(owner).then(|| owner.to_owned())
        })
    {
        return Reply::neutron(
            409,
            "ServicePortInUse",
            format!(
                "Port {id} cannot be deleted directly via the port API: has device owner {owner}."
            ),
        );
    }
    if let Some(refused) = in_use(world, path, id) {
        return refused;
    }
    let removed = world.neutron.remove(path, id);
    let ports = world.neutron.objects.entry("ports").or_default();
    match path {
        "ports" => forget_port(world, id),
        "networks" => {
            // Neutron's own ports go, and so do the subnets.
            ports.retain(|p| !(p["network_id"] == id && is_auto_deleted(p)));
            let subnets: Vec<String> = world
                .neutron
                .all("subnets")
                .iter()
                .filter(|s| s["network_id"] == id)
                .filter_map(|s| s["id"].as_str().map(str::to_owned))
                .collect();
            for subnet in subnets {
                world.neutron.remove("subnets", &subnet);
            }
        }
        "routers" => detach_gateway(world, id),
        "subnets" => {
            for port in ports.iter_mut().filter(|p| is_auto_deleted(p)) {
                if let Some(ips) = port["fixed_ips"].as_array_mut() {
                    ips.retain(|ip| ip["subnet_id"] != id);
                }
            }
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
            // Rules of other groups naming this one as their remote go too.
            let mut touched = Vec::new();
            if let Some(rules) = world.neutron.objects.get_mut("security-group-rules") {
                rules.retain(|r| {
                    let remote = r["remote_group_id"] == id;
                    if remote && let Some(group) = r["security_group_id"].as_str() {
                        touched.push(group.to_owned());
                    }
                    r["security_group_id"] != id && !remote
                });
            }
            for group in touched {
                sync_rules(world, &group);
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

/// Neutron's 409 for deleting what is still used: a network with ports (its DHCP ports
/// aside), a subnet with IPs on it, a router with interfaces, a security group on a port.
fn in_use(world: &Cx<'_>, path: &str, id: &str) -> Option<Reply> {
    let holders = |holds: &dyn Fn(&Value) -> bool| -> Vec<String> {
        world
            .neutron
            .all("ports")
            .iter()
            .filter(|p| !is_auto_deleted(p) && holds(p))
            .filter_map(|p| p["id"].as_str().map(str::to_owned))
            .collect()
    };
    let held_by = |holds: &dyn Fn(&Value) -> bool| !holders(holds).is_empty();
    let on_network = |p: &Value| p["network_id"] == id;
    let on_subnet = |p: &Value| {
        p["fixed_ips"]
            .as_array()
            .is_some_and(|ips| ips.iter().any(|ip| ip["subnet_id"] == id))
    };
    let (kind, message) = match path {
        "networks" if held_by(&on_network) => (
            "NetworkInUse",
            format!(
                "Unable to complete operation on network {id}. \
                 There are one or more ports still in use on the network, id for these ports \
                 is: {}.",
                holders(&on_network).join(", ")
            ),
        ),
        "subnets" if held_by(&on_subnet) => (
            "SubnetInUse",
            format!(
                "Unable to complete operation on subnet {id}: \
                 One or more ports have an IP allocation from this subnet."
            ),
        ),
        "routers" if held_by(&|p| p["device_id"] == id && is_router_interface(p)) => {
            ("RouterInUse", format!("Router {id} still has ports"))
        }
        "security-groups"
            if held_by(&|p| {
                p["security_groups"]
                    .as_array()
                    .is_some_and(|groups| groups.iter().any(|g| g == id))
            }) =>
        {
            ("SecurityGroupInUse", format!("Security Group {id} in use."))
        }
        _ => return None,
    };
    Some(Reply::neutron(409, kind, message))
}

/// A new rule joins its group's inline rules, as `sync_rules` would show it.
fn show_new_rule(world: &mut Cx<'_>, rule: &Value) {
    let group = rule["security_group_id"].as_str().unwrap_or_default();
    let Some(group) = world.neutron.find_mut("security-groups", group) else {
        return;
    };
    let Some(rules) = group["security_group_rules"].as_array_mut() else {
        return;
    };
    let mut shown = rule.clone();
    shown["tags"] = json!([]);
    shown["standard_attr_id"] = json!(rules.len() + 1);
    rules.push(shown);
}

/// A security group shows its rules inline, as Neutron's database holds them (with their tags
/// and standard attribute id, which the rule API does not show).
fn sync_rules(world: &mut Cx<'_>, group: &str) {
    let rules: Vec<Value> = world
        .neutron
        .all("security-group-rules")
        .iter()
        .filter(|r| r["security_group_id"] == group)
        .enumerate()
        .map(|(n, rule)| {
            let mut rule = rule.clone();
            rule["tags"] = json!([]);
            rule["standard_attr_id"] = json!(n + 1);
            rule
        })
        .collect();
    if let Some(group) = world.neutron.find_mut("security-groups", group) {
        group["security_group_rules"] = Value::Array(rules);
    }
}

fn set_tags(
    world: &mut Cx<'_>,
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

fn add_interface(world: &mut Cx<'_>, router: &str, body: &Value) -> Reply {
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
    let project = world.env.settings.project_id.clone();
    Reply::ok(
        json!({"id": router, "subnet_id": subnet_id, "subnet_ids": [subnet_id], "port_id": port["id"],
                     "network_id": subnet["network_id"], "project_id": project}),
    )
}

fn remove_interface(world: &mut Cx<'_>, router: &str, body: &Value) -> Reply {
    let subnet_id = body["subnet_id"].as_str().unwrap_or_default();
    let port = world.neutron.all("ports").iter().find(|p| {
        p["device_id"] == router
            && is_router_interface(p)
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
    let project = world.env.settings.project_id.clone();
    Reply::ok(
        json!({"id": router, "subnet_id": subnet_id, "subnet_ids": [subnet_id], "port_id": port_id,
                     "network_id": port["network_id"], "project_id": project}),
    )
}
