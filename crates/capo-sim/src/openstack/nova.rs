//! Nova v2.1: servers (BUILD -> ACTIVE after a delay, ERROR by injection, delete -> gone after
//! a delay) with ports and block device mappings (Cinder volumes), flavors, server groups,
//! availability zones.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::http::Method;
use serde_json::{Value, json};
use tokio::time::Instant;

use super::env::{Env, Neighbours, Reply, Timer, json_body};
use super::faults::{Effect, ObjectKind};
use super::filters;

/// Nova's state and the environment, lent for one call, with the services a server uses
/// (ports, volumes, images) behind [`Neighbours`].
pub struct Cx<'a> {
    pub nova: &'a mut Nova,
    pub env: &'a mut Env,
    pub others: &'a mut dyn Neighbours,
}

/// The compute API microversion a request asks for (`OpenStack-API-Version: compute X.Y`, or
/// the older `X-OpenStack-Nova-API-Version: X.Y`); 2.1 when it asks for none, as Nova.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Microversion(u32, u32);

impl Microversion {
    /// The highest microversion this simulator answers for (the real tier's Nova's).
    const LATEST: Microversion = Microversion(2, 104);
    /// Multiattach volumes in a server's block device mappings.
    const MULTIATTACH: Microversion = Microversion(2, 60);

    pub fn asked(headers: &axum::http::HeaderMap) -> Microversion {
        let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        let text = header("openstack-api-version")
            .and_then(|v| v.trim().strip_prefix("compute"))
            .or_else(|| header("x-openstack-nova-api-version"));
        match text.map(str::trim) {
            Some("latest") => Self::LATEST,
            Some(version) => version
                .split_once('.')
                .and_then(|(major, minor)| {
                    Some(Microversion(major.parse().ok()?, minor.parse().ok()?))
                })
                .unwrap_or(Microversion(2, 1)),
            None => Microversion(2, 1),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Next {
    Active,
    Error,
    Gone,
}

/// How long a deleted server still reads DELETED before Nova answers 404.
const DELETED_FOR: Duration = Duration::from_millis(100);

#[derive(Debug)]
struct Server {
    seq: u64,
    body: Value,
    next: Option<(Next, Option<Instant>)>,
    /// Ports Nova created for `networks: [{uuid}]`, deleted with the server.
    own_ports: Vec<String>,
    /// Ports the caller passed, unbound when the server goes.
    given_ports: Vec<String>,
    /// Attached volumes and whether each goes with the server (`delete_on_termination`).
    volumes: Vec<(String, bool)>,
}

#[derive(Debug, Default)]
pub struct Nova {
    servers: BTreeMap<String, Server>,
    flavors: Vec<Value>,
    groups: Vec<Value>,
    seq: u64,
}

impl Nova {
    /// Servers that exist now (deleting ones included until they are gone).
    /// The names of the servers that exist now (deleting ones included).
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.servers
            .values()
            .map(|server| server.body["name"].as_str().unwrap_or_default())
    }

    /// Servers not yet deleted (a DELETED one is on its way out).
    pub fn count(&self) -> usize {
        self.servers
            .values()
            .filter(|s| s.body["status"] != "DELETED")
            .count()
    }

    /// By id, else the oldest server with this name.
    pub fn find(&self, id_or_name: &str) -> Option<&Value> {
        self.servers.get(id_or_name).map(|s| &s.body).or_else(|| {
            self.servers
                .values()
                .filter(|s| s.body["name"] == id_or_name)
                .min_by_key(|s| s.seq)
                .map(|s| &s.body)
        })
    }
}

/// Where one `block_device_mapping_v2` entry's disk comes from.
#[derive(Debug)]
enum Source {
    Volume(String),
    Image(String),
    Blank,
}

/// One checked `block_device_mapping_v2` entry.
#[derive(Debug)]
struct Device {
    /// `None` for -1 or absent: not bootable.
    boot_index: Option<u64>,
    source: Source,
    /// Lands in Cinder (destination `volume`) rather than on the hypervisor (`local`).
    to_volume: bool,
    size: Option<u64>,
    delete_on_termination: bool,
}

pub fn seed(world: &mut Cx<'_>) {
    let flavors = [
        ("m1.tiny", 1, 512, 1, 0),
        ("m1.small", 1, 2048, 20, 0),
        ("m1.medium", 2, 4096, 40, 0),
        ("m1.large", 4, 8192, 80, 0),
        // With an ephemeral disk, as tests/openstack makes it on the real tier.
        ("m1.ephemeral", 1, 1024, 10, 5),
    ];
    world.nova.flavors = flavors
        .iter()
        .enumerate()
        .map(|(i, (name, vcpus, ram, disk, ephemeral))| {
            // As Nova shows a flavor at microversion 2.53 (no description or extra specs
            // before 2.55 and 2.61; `swap` is "" when there is none).
            let id = format!("{}", i + 1);
            json!({"id": id, "name": name, "vcpus": vcpus, "ram": ram, "disk": disk,
                   "OS-FLV-EXT-DATA:ephemeral": ephemeral, "swap": "", "os-flavor-access:is_public": true,
                   "OS-FLV-DISABLED:disabled": false, "rxtx_factor": 1.0,
                   "links": links("flavors", &id)})
        })
        .collect();
}

pub fn handle(
    world: &mut Cx<'_>,
    method: &Method,
    rest: &[&str],
    query: &[(String, String)],
    body: &[u8],
    base: &str,
    microversion: Microversion,
) -> Reply {
    let Some(body) = json_body(body) else {
        return Reply::nova(400, "Malformed request body");
    };
    let rest = match rest {
        ["v2.1", rest @ ..] => rest,
        _ => return Reply::nova(404, "The resource could not be found."),
    };
    match (method.as_str(), rest) {
        // The version gophercloud checks microversions against, as the real tier's Nova
        // answers it (its microversion; the simulator answers every one alike).
        ("GET", []) => Reply::ok(json!({"version": {
            "id": "v2.1", "status": "CURRENT", "version": "2.104", "min_version": "2.1",
            "updated": "2013-07-23T11:33:21Z",
            "links": [{"rel": "self", "href": format!("{base}/compute/v2.1/")}],
            "media-types": [{"base": "application/json",
                             "type": "application/vnd.openstack.compute+json;version=2.1"}]}})),
        ("POST", ["servers"]) => create_server(world, &body, microversion),
        ("GET", ["servers"]) => list_servers(world, query, false),
        ("GET", ["servers", "detail"]) => list_servers(world, query, true),
        ("GET", ["servers", id]) => match world.nova.servers.get(*id) {
            Some(server) => Reply::ok(json!({"server": server.body})),
            None => Reply::nova(404, format!("Instance {id} could not be found.")),
        },
        ("DELETE", ["servers", id]) if world.env.settings.deferred_delete => {
            soft_delete_server(world, id)
        }
        ("DELETE", ["servers", id]) => delete_server(world, id),
        ("PUT", ["servers", id, "tags"]) => replace_tags(world, id, &body),
        // `nova/api/openstack/compute/deferred_delete.py` checks the policy first.
        ("POST", ["servers", _, "action"])
            if body.get("forceDelete").is_some() && world.env.settings.force_delete_refused =>
        {
            Reply::nova(
                403,
                "Policy doesn't allow os_compute_api:os-deferred-delete:force to be performed.",
            )
        }
        // As Nova's force_delete: a delete now, in any state (answered 202).
        ("POST", ["servers", id, "action"]) if body.get("forceDelete").is_some() => {
            match delete_server(world, id) {
                reply if reply.status.is_success() => Reply::empty(202),
                refused => refused,
            }
        }
        ("GET", ["flavors"]) => {
            let flavors: Vec<Value> = world
                .nova
                .flavors
                .iter()
                .map(|f| json!({"id": f["id"], "name": f["name"]}))
                .collect();
            Reply::ok(json!({"flavors": flavors}))
        }
        ("GET", ["flavors", "detail"]) => Reply::ok(json!({"flavors": world.nova.flavors})),
        ("GET", ["flavors", id]) => match world.nova.flavors.iter().find(|f| f["id"] == *id) {
            Some(flavor) => Reply::ok(json!({"flavor": flavor})),
            None => Reply::nova(404, format!("Flavor {id} could not be found.")),
        },
        ("GET", ["os-server-groups"]) => Reply::ok(json!({"server_groups": world.nova.groups})),
        ("POST", ["os-server-groups"]) => {
            let group = &body["server_group"];
            let id = world.env.uuid();
            let policy = group["policy"]
                .as_str()
                .or_else(|| group["policies"][0].as_str())
                .unwrap_or("anti-affinity")
                .to_owned();
            let created = json!({"id": id, "name": group["name"], "policy": policy, "policies": [policy],
                                 "members": [], "rules": {}, "project_id": world.env.settings.project_id});
            world.nova.groups.push(created.clone());
            Reply::ok(json!({"server_group": created}))
        }
        ("GET", ["os-availability-zone"]) => {
            let zones: Vec<Value> = world
                .env
                .settings
                .availability_zones
                .iter()
                .map(|z| json!({"zoneName": z, "zoneState": {"available": true}, "hosts": null}))
                .collect();
            Reply::ok(json!({"availabilityZoneInfo": zones}))
        }
        _ => Reply::nova(404, "The resource could not be found."),
    }
}

/// Nova's quota checks, in its order: the ports the server's networks need must fit Neutron's
/// port quota, then the server must fit the instance quota.
fn over_quota(world: &Cx<'_>, request: &Value) -> Option<Reply> {
    let quotas = &world.env.settings.quotas;
    let ports_needed = request["networks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|n| n.get("port").is_none())
        .count();
    let ports_used = world.others.ports_in_use();
    if ports_needed > 0
        && quotas
            .ports
            .is_some_and(|limit| ports_used + ports_needed > limit)
    {
        return Some(Reply::nova(403, "Maximum number of ports exceeded"));
    }
    let used = world.nova.count();
    let limit = quotas.instances.filter(|limit| used >= *limit)?;
    Some(Reply::nova(
        403,
        format!(
            "Quota exceeded for instances: Requested 1, but already used {used} of {limit} instances"
        ),
    ))
}

/// Nova's tag schema (2.26+), on create (2.52+) and on replace: at most 50, each 1-60
/// characters without `/` or `,`.
fn invalid_tags(tags: &Value) -> Option<Reply> {
    let Some(tags) = tags.as_array() else {
        return (!tags.is_null())
            .then(|| Reply::nova(400, "Invalid input for field/attribute tags."));
    };
    let bad = |t: &Value| {
        t.as_str()
            .is_none_or(|t| t.is_empty() || t.chars().count() > 60 || t.contains(['/', ',']))
    };
    (tags.len() > 50 || tags.iter().any(bad))
        .then(|| Reply::nova(400, "Invalid input for field/attribute tags."))
}

/// `PUT /servers/{id}/tags`: the server's tags replaced, answered with them.
fn replace_tags(world: &mut Cx<'_>, id: &str, body: &Value) -> Reply {
    if let Some(refused) = invalid_tags(&body["tags"]) {
        return refused;
    }
    let Some(server) = world.nova.servers.get_mut(id) else {
        return Reply::nova(404, format!("Instance {id} could not be found."));
    };
    server.body["tags"] = body["tags"].clone();
    Reply::ok(json!({"tags": body["tags"]}))
}

fn create_server(world: &mut Cx<'_>, body: &Value, microversion: Microversion) -> Reply {
    let request = &body["server"];
    let name = request["name"].as_str().unwrap_or_default().to_owned();
    if name.is_empty() {
        return Reply::nova(400, "Invalid input for field/attribute name.");
    }
    if let Some(refused) = invalid_tags(&request["tags"]) {
        return refused;
    }
    let flavor_ref = request["flavorRef"].as_str().unwrap_or_default();
    let Some(flavor) = world
        .nova
        .flavors
        .iter()
        .find(|f| f["id"] == flavor_ref || f["name"] == flavor_ref)
        .cloned()
    else {
        return Reply::nova(400, format!("Flavor {flavor_ref} could not be found."));
    };
    let image_ref = request["imageRef"].as_str().unwrap_or_default();
    let has_mappings = request["block_device_mapping_v2"]
        .as_array()
        .is_some_and(|m| !m.is_empty());
    if image_ref.is_empty() && !has_mappings {
        return Reply::nova(400, "Missing imageRef attribute");
    }
    if !image_ref.is_empty() && world.others.image(image_ref).is_none() {
        // Nova's create API turns ImageNotFound into this (servers.py, `create`).
        return Reply::nova(400, "Can not find requested image");
    }
    if let Some(refused) = over_quota(world, request) {
        return refused;
    }
    // `zone:host` forces a host; the zone part is what Nova checks.
    let zone = request["availability_zone"]
        .as_str()
        .map(|z| z.split(':').next().unwrap_or_default())
        .filter(|z| !z.is_empty());
    if let Some(zone) = zone
        && !world
            .env
            .settings
            .availability_zones
            .iter()
            .any(|z| z == zone)
    {
        return Reply::nova(400, "The requested availability zone is not available");
    }
    let devices = match block_devices(world, request, image_ref, microversion) {
        Ok(devices) => devices,
        Err(reply) => return reply,
    };
    let boot = devices.iter().find(|d| d.boot_index == Some(0));
    let image = match boot {
        Some(device) if device.to_volume => String::new(),
        Some(Device {
            source: Source::Image(image),
            ..
        }) => image.clone(),
        _ => image_ref.to_owned(),
    };
    let id = world.env.uuid();
    let mut own_ports = Vec::new();
    let mut given_ports = Vec::new();
    for network in request["networks"].as_array().cloned().unwrap_or_default() {
        if let Some(port) = network["port"].as_str() {
            if world.others.port(port).is_none() {
                cleanup(world, &own_ports, &[]);
                return Reply::nova(400, format!("Port id {port} could not be found."));
            }
            given_ports.push(port.to_owned());
        } else if let Some(uuid) = network["uuid"].as_str() {
            if world.others.network(uuid).is_none() {
                cleanup(world, &own_ports, &[]);
                return Reply::nova(400, format!("Network {uuid} could not be found."));
            }
            let port = world.others.create_port(
                &mut *world.env,
                json!({"network_id": uuid, "name": format!("{name}-port")}),
            );
            own_ports.push(port["id"].as_str().unwrap_or_default().to_owned());
        }
    }
    for port in own_ports.iter().chain(&given_ports) {
        world.others.bind_port(&mut *world.env, port, &id);
    }
    let volumes = attach_volumes(world, &id, devices);
    let hints = body
        .get("os:scheduler_hints")
        .or_else(|| body.get("OS-SCH-HNT:scheduler_hints"));
    if let Some(group) = hints.and_then(|h| h["group"].as_str())
        && let Some(group) = world.nova.groups.iter_mut().find(|g| g["id"] == group)
        && let Some(members) = group["members"].as_array_mut()
    {
        members.push(json!(id));
    }
    let now = world.env.utc_timestamp();
    let addresses = addresses(world, own_ports.iter().chain(&given_ports));
    let self_links = links("servers", &id);
    let server = json!({
        "id": id, "name": name, "status": "BUILD", "OS-EXT-STS:vm_state": "building",
        "OS-EXT-STS:task_state": "scheduling", "OS-EXT-STS:power_state": 0,
        "flavor": {"original_name": flavor["name"], "vcpus": flavor["vcpus"], "ram": flavor["ram"], "disk": flavor["disk"],
                   "ephemeral": 0, "swap": 0, "extra_specs": {}},
        "image": if image.is_empty() { json!("") } else { json!({"id": image, "links": links("images", &image)}) },
        "links": self_links, "locked": false, "description": null, "accessIPv4": "", "accessIPv6": "",
        "OS-DCF:diskConfig": "MANUAL", "OS-SRV-USG:launched_at": null, "OS-SRV-USG:terminated_at": null,
        "addresses": addresses, "key_name": request["key_name"], "metadata": request.get("metadata").cloned().unwrap_or(json!({})),
        "tags": request.get("tags").cloned().unwrap_or(json!([])),
        "OS-EXT-AZ:availability_zone": zone.map(str::to_owned).or_else(|| world.env.settings.availability_zones.first().cloned())
            .unwrap_or_else(|| "nova".into()),
        "user_id": format!("{}-id", world.env.settings.username), "tenant_id": world.env.settings.project_id,
        "created": now, "updated": now, "hostId": "", "progress": 0, "config_drive": "",
        "security_groups": [{"name": "default"}],
        "os-extended-volumes:volumes_attached": volumes.iter()
            .map(|(volume, delete)| json!({"id": volume, "delete_on_termination": delete}))
            .collect::<Vec<_>>(),
    });
    let pending = plan(world, &name, Next::Active);
    world.nova.seq += 1;
    let seq = world.nova.seq;
    world.nova.servers.insert(
        id.clone(),
        Server {
            seq,
            body: server.clone(),
            next: Some(pending),
            own_ports,
            given_ports,
            volumes,
        },
    );
    if let (_, Some(due)) = pending {
        world
            .env
            .schedule(due - Instant::now(), Timer::Server(id.clone()));
    }
    let _ = world;
    Reply::json(
        202,
        json!({"server": {"id": id, "links": links("servers", &id), "OS-DCF:diskConfig": "MANUAL",
                                       "security_groups": [{"name": "default"}], "adminPass": "simulated"}}),
    )
}

/// An object's `links` as Nova lists them: itself, and its bookmark (paths; nothing follows
/// them).
fn links(collection: &str, id: &str) -> Value {
    let base = "/compute";
    json!([
        {"rel": "self", "href": format!("{base}/v2.1/{collection}/{id}")},
        {"rel": "bookmark", "href": format!("{base}/{collection}/{id}")},
    ])
}

/// Reads and checks `block_device_mapping_v2` as Nova's API does, changing nothing.
fn block_devices(
    world: &Cx<'_>,
    request: &Value,
    image_ref: &str,
    microversion: Microversion,
) -> Result<Vec<Device>, Reply> {
    let invalid = |message: String| Err(Reply::nova(400, message));
    let mut devices = Vec::new();
    for entry in request["block_device_mapping_v2"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let boot_index = match &entry["boot_index"] {
            Value::Number(n) => n.as_u64(),
            Value::String(s) => s.parse().ok(),
            _ => None,
        };
        let uuid = entry["uuid"].as_str().unwrap_or_default();
        let source_type = entry["source_type"].as_str().unwrap_or_default();
        let default_destination = if source_type == "volume" {
            "volume"
        } else {
            "local"
        };
        let to_volume = match entry["destination_type"]
            .as_str()
            .unwrap_or(default_destination)
        {
            "volume" => true,
            "local" => false,
            other => {
                return invalid(format!(
                    "Invalid input for field/attribute destination_type. Value: {other}. \
                     '{other}' is not one of ['local', 'volume']"
                ));
            }
        };
        let size = entry["volume_size"].as_u64().filter(|s| *s > 0);
        let delete_on_termination = match &entry["delete_on_termination"] {
            Value::Bool(b) => *b,
            Value::String(s) => s.eq_ignore_ascii_case("true"),
            _ => false,
        };
        let source = match source_type {
            "volume" if !to_volume => {
                return invalid(
                    "Block Device Mapping is Invalid: Mapping volume to local is not supported."
                        .into(),
                );
            }
            "volume" => {
                let Some(volume) = world.others.volume(uuid) else {
                    return invalid(format!(
                        "Block Device Mapping is Invalid: failed to get volume {uuid}."
                    ));
                };
                let status = volume["status"].as_str().unwrap_or_default();
                if status != "available" {
                    return invalid(format!(
                        "Invalid volume: volume '{uuid}' status must be 'available'. Currently in '{status}'"
                    ));
                }
                if boot_index == Some(0) && volume["bootable"] != "true" {
                    return invalid(format!("Block Device {uuid} is not bootable."));
                }
                // `nova/compute/utils.py` `check_and_reserve_volume...`: the request must be
                // made at 2.60 or later to attach a multiattach volume.
                if volume["multiattach"] == true && microversion < Microversion::MULTIATTACH {
                    return invalid(
                        "Multiattach volumes are only supported starting with compute API version 2.60."
                            .into(),
                    );
                }
                Source::Volume(uuid.to_owned())
            }
            "image" => {
                if world.others.image(uuid).is_none() {
                    return invalid(format!(
                        "Block Device Mapping is Invalid: failed to get image {uuid}."
                    ));
                }
                if to_volume && size.is_none() {
                    return invalid(
                        "Images with destination_type 'volume' need to have a non-zero size specified"
                            .into(),
                    );
                }
                if !to_volume && boot_index != Some(0) {
                    return invalid(
                        "Block Device Mapping is Invalid: Mapping image to local is not supported."
                            .into(),
                    );
                }
                Source::Image(uuid.to_owned())
            }
            "blank" if to_volume && size.is_none() => {
                return invalid(
                    "Blank volumes (source: 'blank', dest: 'volume') need to have non-zero size"
                        .into(),
                );
            }
            "blank" => Source::Blank,
            "snapshot" => {
                return invalid(format!(
                    "Block Device Mapping is Invalid: failed to get snapshot {uuid}."
                ));
            }
            other => {
                return invalid(format!(
                    "Invalid input for field/attribute source_type. Value: {other}. \
                     '{other}' is not one of ['volume', 'image', 'snapshot', 'blank']"
                ));
            }
        };
        devices.push(Device {
            boot_index,
            source,
            to_volume,
            size,
            delete_on_termination,
        });
    }
    // With an imageRef, Nova adds the image as boot device 0 unless a mapping is one.
    let mut order: Vec<u64> = devices.iter().filter_map(|d| d.boot_index).collect();
    if !image_ref.is_empty() && !order.contains(&0) {
        order.push(0);
    }
    order.sort_unstable();
    let contiguous = order.iter().zip(0u64..).all(|(index, want)| *index == want);
    if order.is_empty() || !contiguous {
        return invalid(
            "Block Device Mapping is Invalid: Boot sequence for the instance and image/block \
             device mapping combination is not valid."
                .into(),
        );
    }
    Ok(devices)
}

/// Creates the volumes Nova makes (image or blank to volume) and attaches every volume, boot
/// disk first as `/dev/vda`; returns (volume, delete_on_termination) per attached volume.
fn attach_volumes(
    world: &mut Cx<'_>,
    server: &str,
    mut devices: Vec<Device>,
) -> Vec<(String, bool)> {
    devices.sort_by_key(|d| d.boot_index != Some(0));
    let mut attached = Vec::new();
    for (index, device) in devices.into_iter().enumerate() {
        if !device.to_volume {
            continue;
        }
        let size = device.size.unwrap_or(1);
        let volume = match device.source {
            Source::Volume(volume) => volume,
            Source::Image(image) => {
                world
                    .others
                    .create_volume_for_server(&mut *world.env, "", size, Some(&image))
            }
            Source::Blank => world.others.create_volume_for_server(
                &mut *world.env,
                &format!("{server}-blank-vol"),
                size,
                None,
            ),
        };
        let letter = u8::try_from(index)
            .ok()
            .filter(|i| *i < 26)
            .map_or('z', |i| char::from(b'a' + i));
        world.others.attach_volume(
            &mut *world.env,
            &volume,
            server,
            &format!("/dev/vd{letter}"),
        );
        attached.push((volume, device.delete_on_termination));
    }
    attached
}

fn addresses<'a>(world: &Cx<'_>, ports: impl Iterator<Item = &'a String>) -> Value {
    let mut by_network = serde_json::Map::new();
    for port in ports {
        let Some(port) = world.others.port(port) else {
            continue;
        };
        let network = port["network_id"]
            .as_str()
            .and_then(|n| world.others.network(n))
            .and_then(|n| n["name"].as_str())
            .unwrap_or("network")
            .to_owned();
        let entries = by_network.entry(network).or_insert_with(|| json!([]));
        for ip in port["fixed_ips"].as_array().into_iter().flatten() {
            if let Some(list) = entries.as_array_mut() {
                list.push(
                    json!({"addr": ip["ip_address"], "version": 4, "OS-EXT-IPS:type": "fixed",
                                 "OS-EXT-IPS-MAC:mac_addr": port["mac_address"]}),
                );
            }
        }
    }
    Value::Object(by_network)
}

fn cleanup(world: &mut Cx<'_>, own: &[String], given: &[String]) {
    for port in own {
        world.others.release_port(&mut *world.env, port);
    }
    for port in given {
        world.others.bind_port(&mut *world.env, port, "");
    }
}

fn plan(world: &mut Cx<'_>, name: &str, next: Next) -> (Next, Option<Instant>) {
    let effect = world.env.scenario.take_effect(ObjectKind::Server, name);
    let unit = world.env.unit();
    let default = match next {
        Next::Gone => world.env.scenario.timings.server_delete.clone(),
        _ => world.env.scenario.timings.server_build.clone(),
    };
    match effect {
        Some(Effect::Stuck) => (next, None),
        Some(Effect::Error) if next != Next::Gone => {
            (Next::Error, Some(Instant::now() + default.sample(unit)))
        }
        Some(Effect::Delay(delay)) => (next, Some(Instant::now() + delay.sample(unit))),
        _ => (next, Some(Instant::now() + default.sample(unit))),
    }
}

fn list_servers(world: &Cx<'_>, query: &[(String, String)], detail: bool) -> Reply {
    let name_pattern = query
        .iter()
        .find(|(k, _)| k == "name")
        .and_then(|(_, v)| regex::Regex::new(v).ok());
    let others: Vec<(String, String)> =
        query.iter().filter(|(k, _)| k != "name").cloned().collect();
    let mut servers: Vec<&Server> = world.nova.servers.values().collect();
    servers.sort_by_key(|s| s.seq);
    let items: Vec<Value> = servers
        .into_iter()
        .map(|s| &s.body)
        // Nova lists deleted servers only when asked (`deleted=true`).
        .filter(|s| s["status"] != "DELETED")
        .filter(|s| {
            name_pattern
                .as_ref()
                .is_none_or(|re| re.is_match(s["name"].as_str().unwrap_or_default()))
        })
        .filter(|s| filters::matches(s, &others))
        .map(|s| {
            if detail {
                s.clone()
            } else {
                json!({"id": s["id"], "name": s["name"],
                       "links": links("servers", s["id"].as_str().unwrap_or_default())})
            }
        })
        .collect();
    Reply::ok(json!({"servers": items}))
}

/// Nova's delete with `reclaim_instance_interval` set (nova/api/openstack/compute/servers.py,
/// `_delete`): a server that has run goes SOFT_DELETED and keeps its ports and volumes; one
/// that never ran is deleted. Deleting a SOFT_DELETED server soft-deletes it again: it stays.
fn soft_delete_server(world: &mut Cx<'_>, id: &str) -> Reply {
    let Some(server) = world.nova.servers.get_mut(id) else {
        return Reply::nova(404, format!("Instance {id} could not be found."));
    };
    if !matches!(
        server.body["status"].as_str(),
        Some("ACTIVE" | "SHUTOFF" | "SOFT_DELETED")
    ) {
        return delete_server(world, id);
    }
    server.next = None;
    let body = &mut server.body;
    body["status"] = json!("SOFT_DELETED");
    body["OS-EXT-STS:vm_state"] = json!("soft-delete");
    body["OS-EXT-STS:task_state"] = Value::Null;
    Reply::empty(204)
}

fn delete_server(world: &mut Cx<'_>, id: &str) -> Reply {
    let Some(name) = world
        .nova
        .servers
        .get(id)
        .map(|s| s.body["name"].as_str().unwrap_or_default().to_owned())
    else {
        return Reply::nova(404, format!("Instance {id} could not be found."));
    };
    let pending = plan(world, &name, Next::Gone);
    if let Some(server) = world.nova.servers.get_mut(id) {
        server.next = Some(pending);
        server.body["OS-EXT-STS:task_state"] = json!("deleting");
    }
    if let (_, Some(due)) = pending {
        world
            .env
            .schedule(due - Instant::now(), Timer::Server(id.to_owned()));
    }
    Reply::empty(204)
}

pub fn on_server_timer(world: &mut Cx<'_>, id: &str) {
    let Some(server) = world.nova.servers.get(id) else {
        return;
    };
    let Some((next, Some(due))) = server.next else {
        return;
    };
    if due > Instant::now() {
        return;
    }
    let now = world.env.utc_timestamp();
    match next {
        Next::Gone => {
            // As Nova: the server reads DELETED (its ports and volumes already let go) for a
            // moment before it is gone.
            let deleted = world
                .nova
                .servers
                .get(id)
                .is_some_and(|s| s.body["status"] == "DELETED");
            // A clock that jumped past the DELETED moment too (tests on a paused clock) finds
            // the server gone, as a poll that came late would.
            if deleted || Instant::now() >= due + DELETED_FOR {
                release(world, id);
                world.nova.servers.remove(id);
                return;
            }
            let Some(server) = world.nova.servers.get_mut(id) else {
                return;
            };
            let body = &mut server.body;
            body["status"] = json!("DELETED");
            body["OS-EXT-STS:vm_state"] = json!("deleted");
            body["OS-EXT-STS:task_state"] = Value::Null;
            body["OS-SRV-USG:terminated_at"] = json!(now);
            body["updated"] = json!(now);
            server.next = Some((Next::Gone, Some(due + DELETED_FOR)));
            world.env.schedule(
                (due + DELETED_FOR).saturating_duration_since(Instant::now()),
                Timer::Server(id.to_owned()),
            );
            release(world, id);
        }
        Next::Active | Next::Error => {
            if next == Next::Error {
                // A build that fails gives its volumes back (the mappings stay listed).
                let volumes: Vec<String> = world
                    .nova
                    .servers
                    .get(id)
                    .map(|s| s.volumes.iter().map(|(volume, _)| volume.clone()).collect())
                    .unwrap_or_default();
                for volume in volumes {
                    world.others.detach_volume(&mut *world.env, &volume, id);
                }
            }
            if let Some(server) = world.nova.servers.get_mut(id) {
                let body = &mut server.body;
                body["updated"] = json!(now);
                body["OS-EXT-STS:task_state"] = Value::Null;
                if next == Next::Active {
                    body["status"] = json!("ACTIVE");
                    body["OS-SRV-USG:launched_at"] = json!(now.trim_end_matches('Z'));
                    body["OS-EXT-STS:vm_state"] = json!("active");
                    body["OS-EXT-STS:power_state"] = json!(1);
                    body["progress"] = json!(100);
                } else {
                    body["status"] = json!("ERROR");
                    body["OS-EXT-STS:vm_state"] = json!("error");
                    body["fault"] = json!({"code": 500, "created": now, "message": "No valid host was found. There are not enough hosts available."});
                }
                server.next = None;
            }
        }
    }
}

/// What a deleted server lets go: the ports Nova made for it (its given ports unbound), its
/// volumes (deleted or detached, as each mapping says) and its server-group places. Once.
fn release(world: &mut Cx<'_>, id: &str) {
    let Some(server) = world.nova.servers.get_mut(id) else {
        return;
    };
    let own_ports = std::mem::take(&mut server.own_ports);
    let given_ports = std::mem::take(&mut server.given_ports);
    let volumes = std::mem::take(&mut server.volumes);
    cleanup(world, &own_ports, &given_ports);
    for (volume, delete) in &volumes {
        if *delete {
            world
                .others
                .delete_volume_for_server(&mut *world.env, volume, id);
        } else {
            world.others.detach_volume(&mut *world.env, volume, id);
        }
    }
    for group in &mut world.nova.groups {
        if let Some(members) = group["members"].as_array_mut() {
            members.retain(|m| m != id);
        }
    }
}

pub fn release_stuck(world: &mut Cx<'_>) {
    let stuck: Vec<(String, String, Next)> = world
        .nova
        .servers
        .iter()
        .filter_map(|(id, s)| match s.next {
            Some((next, None)) => Some((
                id.clone(),
                s.body["name"].as_str().unwrap_or_default().to_owned(),
                next,
            )),
            _ => None,
        })
        .collect();
    for (id, name, next) in stuck {
        if world.env.scenario.is_stuck(ObjectKind::Server, &name) {
            continue;
        }
        let unit = world.env.unit();
        let delay = world.env.scenario.timings.server_build.sample(unit);
        if let Some(server) = world.nova.servers.get_mut(&id) {
            server.next = Some((next, Some(Instant::now() + delay)));
        }
        world.env.schedule(delay, Timer::Server(id));
    }
}
