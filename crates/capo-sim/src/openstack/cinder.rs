//! Cinder v3: volumes (creating -> available after a delay, error by injection, deleting -> gone
//! after a delay), the volume types and availability zone a create is checked against, and the
//! attach and detach Nova does for its block device mappings.

use std::collections::BTreeMap;

use axum::http::Method;
use serde_json::{Value, json};
use tokio::time::Instant;

use super::env::{Env, Images, Reply, Timer, json_body};
use super::faults::{Effect, ObjectKind};

/// Cinder's state and the environment, lent for one call, with Glance's images to check.
pub struct Cx<'a> {
    pub cinder: &'a mut Cinder,
    pub env: &'a mut Env,
    pub images: &'a dyn Images,
}

/// What follows `v3/`: anything else there is a project id (`v3/{project_id}/volumes`).
const COLLECTIONS: &[&str] = &["volumes", "types", "os-availability-zone"];

/// Statuses Cinder deletes from (without `force`).
const DELETABLE: &[&str] = &[
    "available",
    "error",
    "error_restoring",
    "error_extending",
    "error_managing",
];

/// Cinder's refusal to delete from any other status, or while attached, word for word.
const NOT_DELETABLE: &str = "Invalid volume: Volume status must be available or error or \
    error_restoring or error_extending or error_managing and must not be migrating, attached, \
    belong to a group, have snapshots, awaiting a transfer, or be disassociated from snapshots \
    after volume transfer.";

/// Types every deployment has (`__DEFAULT__` since Train) plus one a template may name, and a
/// multiattach one as the real tier makes it (`tests/openstack/setup_cloud.py`). Fixed ids, so
/// seeding them draws nothing from a scenario's random sequence.
const TYPES: &[(&str, &str, &str)] = &[
    (
        "5f7b0d32-6a54-4c1e-9b52-3c0b8d1e0a01",
        "__DEFAULT__",
        "Default Volume Type",
    ),
    (
        "5f7b0d32-6a54-4c1e-9b52-3c0b8d1e0a02",
        "ssd",
        "Solid-state backend",
    ),
    (
        "5f7b0d32-6a54-4c1e-9b52-3c0b8d1e0a03",
        MULTIATTACH_TYPE,
        "Volumes attachable to more than one server",
    ),
];

/// The type whose volumes are multiattach (its extra spec `multiattach: "<is> True"`).
pub const MULTIATTACH_TYPE: &str = "multiattach";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Next {
    Available,
    Error,
    Gone,
}

#[derive(Debug)]
struct Volume {
    seq: u64,
    body: Value,
    next: Option<(Next, Option<Instant>)>,
}

#[derive(Debug, Default)]
pub struct Cinder {
    volumes: BTreeMap<String, Volume>,
    types: Vec<Value>,
    seq: u64,
}

impl Cinder {
    /// Volumes that exist now.
    pub fn count(&self) -> usize {
        self.volumes.len()
    }

    pub fn get(&self, id: &str) -> Option<&Value> {
        self.volumes.get(id).map(|v| &v.body)
    }

    /// By id, else the oldest volume with this name.
    pub fn find(&self, id_or_name: &str) -> Option<&Value> {
        self.get(id_or_name).or_else(|| {
            self.volumes
                .values()
                .filter(|v| v.body["name"] == id_or_name)
                .min_by_key(|v| v.seq)
                .map(|v| &v.body)
        })
    }
}

pub fn seed(world: &mut Cx<'_>) {
    world.cinder.types = TYPES
        .iter()
        .map(|(id, name, description)| {
            let extra_specs = match *name == MULTIATTACH_TYPE {
                true => json!({"multiattach": "<is> True"}),
                false => json!({}),
            };
            json!({"id": id, "name": name, "description": description, "is_public": true,
                   "os-volume-type-access:is_public": true, "extra_specs": extra_specs,
                   "qos_specs_id": null})
        })
        .collect();
}

fn not_found(id: &str) -> Reply {
    Reply::cinder(404, format!("Volume {id} could not be found."))
}

fn no_resource() -> Reply {
    Reply::cinder(404, "The resource could not be found.")
}

/// The path without a project id after `v3/` (for naming the operation in the request log).
pub fn unscoped<'a>(rest: &[&'a str]) -> Vec<&'a str> {
    match rest {
        ["v3", project, tail @ ..] if !COLLECTIONS.contains(project) => {
            std::iter::once("v3").chain(tail.iter().copied()).collect()
        }
        _ => rest.to_vec(),
    }
}

/// `/block-storage/v3/...` and `/block-storage/v3/{project_id}/...` requests.
pub fn handle(
    world: &mut Cx<'_>,
    method: &Method,
    rest: &[&str],
    query: &[(String, String)],
    body: &[u8],
) -> Reply {
    let Some(body) = json_body(body) else {
        return Reply::cinder(400, "Malformed request body");
    };
    let rest = match rest {
        ["v3", project, tail @ ..] if !COLLECTIONS.contains(project) => {
            if *project != world.env.settings.project_id {
                return no_resource();
            }
            tail
        }
        ["v3", tail @ ..] => tail,
        _ => return no_resource(),
    };
    match (method.as_str(), rest) {
        ("POST", ["volumes"]) => create_volume(world, &body),
        ("GET", ["volumes"]) => list_volumes(world, query, false),
        ("GET", ["volumes", "detail"]) => list_volumes(world, query, true),
        ("GET", ["volumes", id]) => match world.cinder.get(id) {
            Some(volume) => Reply::ok(json!({"volume": volume})),
            None => not_found(id),
        },
        ("DELETE", ["volumes", id]) => delete_volume(world, id),
        ("GET", ["types"]) => Reply::ok(json!({"volume_types": world.cinder.types})),
        ("GET", ["types", id]) => match world.cinder.types.iter().find(|t| t["id"] == *id) {
            Some(found) => Reply::ok(json!({"volume_type": found})),
            None => Reply::cinder(404, format!("Volume type {id} could not be found.")),
        },
        ("GET", ["os-availability-zone"]) => Reply::ok(json!({"availabilityZoneInfo": [
            {"zoneName": "nova", "zoneState": {"available": true}}]})),
        _ => no_resource(),
    }
}

fn stamp(world: &Cx<'_>) -> String {
    world
        .env
        .wall_now()
        .format("%Y-%m-%dT%H:%M:%S%.6f")
        .to_string()
}

/// Checks a create in Cinder's order (size, type, image, zone); the type's name on success.
fn validate(world: &Cx<'_>, request: &Value) -> Result<String, Reply> {
    let size = &request["size"];
    let valid_size = match size {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    };
    if valid_size.is_none_or(|s| s < 1) {
        let shown = match size {
            Value::Null => "None".to_owned(),
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        return Err(Reply::cinder(
            400,
            format!(
                "Invalid input received: Volume size '{shown}' must be an integer and greater than 0"
            ),
        ));
    }
    let volume_type = match request["volume_type"].as_str() {
        None => "__DEFAULT__".to_owned(),
        Some(wanted) => match world
            .cinder
            .types
            .iter()
            .find(|t| t["name"] == wanted || t["id"] == wanted)
        {
            Some(found) => found["name"].as_str().unwrap_or(wanted).to_owned(),
            None => {
                return Err(Reply::cinder(
                    404,
                    format!("Volume type with name {wanted} could not be found."),
                ));
            }
        },
    };
    if let Some(image) = request.get("imageRef").filter(|i| !i.is_null())
        && image
            .as_str()
            .is_none_or(|i| world.images.image(i).is_none())
    {
        return Err(Reply::cinder(
            400,
            "Invalid image identifier or unable to access requested image.",
        ));
    }
    if let Some(zone) = request["availability_zone"].as_str()
        && zone != "nova"
    {
        return Err(Reply::cinder(
            400,
            format!("Invalid input received: Availability zone '{zone}' is invalid."),
        ));
    }
    Ok(volume_type)
}

/// Stores a volume built from a validated request, in `status`; returns its id.
fn insert(world: &mut Cx<'_>, request: &Value, volume_type: &str, status: &str) -> String {
    let id = world.env.uuid();
    let now = stamp(world);
    let size = match &request["size"] {
        Value::String(s) => s.parse().unwrap_or(1),
        other => other.as_u64().unwrap_or(1),
    };
    let image = request["imageRef"]
        .as_str()
        .and_then(|i| world.images.image(i));
    let project = world.env.settings.project_id.clone();
    // Cinder sets it from the type's extra spec (`cinder/volume/api.py`, `create`).
    let multiattach = world
        .cinder
        .types
        .iter()
        .any(|t| t["name"] == volume_type && t["extra_specs"]["multiattach"] == "<is> True");
    let mut body = json!({
        "id": id, "name": request["name"].as_str(), "description": request["description"].as_str(),
        "status": status, "size": size,
        "availability_zone": request["availability_zone"].as_str().unwrap_or("nova"),
        "volume_type": volume_type, "bootable": if image.is_some() { "true" } else { "false" },
        "encrypted": false, "multiattach": multiattach, "attachments": [],
        "metadata": request.get("metadata").filter(|m| m.is_object()).cloned().unwrap_or(json!({})),
        "links": [{"rel": "self", "href": format!("/volume/v3/{project}/volumes/{id}")},
                  {"rel": "bookmark", "href": format!("/volume/{project}/volumes/{id}")}],
        "created_at": now, "updated_at": null, "snapshot_id": null,
        "source_volid": null, "consistencygroup_id": null, "replication_status": null,
        "user_id": format!("{}-id", world.env.settings.username),
        "os-vol-tenant-attr:tenant_id": world.env.settings.project_id,
    });
    if let Some(image) = image {
        body["volume_image_metadata"] = json!({
            "image_id": image["id"], "image_name": image["name"],
            "container_format": image["container_format"], "disk_format": image["disk_format"],
            "min_disk": image["min_disk"].to_string(), "min_ram": image["min_ram"].to_string(),
            "size": image["size"].to_string()});
    }
    world.cinder.seq += 1;
    let seq = world.cinder.seq;
    world.cinder.volumes.insert(
        id.clone(),
        Volume {
            seq,
            body,
            next: None,
        },
    );
    id
}

fn create_volume(world: &mut Cx<'_>, body: &Value) -> Reply {
    let Some(request) = body.get("volume").filter(|v| v.is_object()) else {
        return Reply::cinder(400, "Missing required element 'volume' in request body.");
    };
    let volume_type = match validate(world, request) {
        Ok(volume_type) => volume_type,
        Err(reply) => return reply,
    };
    if let Some(limit) = world
        .env
        .settings
        .quotas
        .volumes
        .filter(|limit| world.cinder.volumes.len() >= *limit)
    {
        return Reply::json(
            413,
            json!({"overLimit": {"code": 413, "retryAfter": "0", "message": format!(
                "VolumeLimitExceeded: Maximum number of volumes allowed ({limit}) exceeded for quota 'volumes'."
            )}}),
        );
    }
    let id = insert(world, request, &volume_type, "creating");
    let name = request["name"].as_str().unwrap_or_default();
    let pending = plan(world, name, Next::Available);
    if let Some(volume) = world.cinder.volumes.get_mut(&id) {
        volume.next = Some(pending);
    }
    if let (_, Some(due)) = pending {
        world
            .env
            .schedule(due - Instant::now(), Timer::Volume(id.clone()));
    }
    match world.cinder.get(&id) {
        // The create answer leaves the owner out (a GET shows it).
        Some(volume) => {
            let mut volume = volume.clone();
            if let Some(fields) = volume.as_object_mut() {
                fields.remove("os-vol-tenant-attr:tenant_id");
            }
            Reply::json(202, json!({"volume": volume}))
        }
        None => not_found(&id),
    }
}

/// A volume Nova creates for an `image` or `blank` mapping with destination `volume`: ready at
/// once (Nova waits for it before it boots), returned for [`attach`].
pub fn create_for_server(world: &mut Cx<'_>, name: &str, size: u64, image: Option<&str>) -> String {
    let request = json!({"name": name, "size": size, "imageRef": image});
    insert(world, &request, "__DEFAULT__", "available")
}

/// Filters `name` and `status` (exact), newest first as Cinder sorts by default.
fn list_volumes(world: &Cx<'_>, query: &[(String, String)], detail: bool) -> Reply {
    let mut volumes: Vec<&Volume> = world
        .cinder
        .volumes
        .values()
        .filter(|v| {
            query.iter().all(|(key, value)| match key.as_str() {
                "name" | "status" => v.body[key.as_str()] == value.as_str(),
                _ => true,
            })
        })
        .collect();
    volumes.sort_by_key(|v| std::cmp::Reverse(v.seq));
    let items: Vec<Value> = volumes
        .into_iter()
        .map(|v| {
            if detail {
                v.body.clone()
            } else {
                json!({"id": v.body["id"], "name": v.body["name"], "links": v.body["links"]})
            }
        })
        .collect();
    Reply::ok(json!({"volumes": items}))
}

fn delete_volume(world: &mut Cx<'_>, id: &str) -> Reply {
    let Some(volume) = world.cinder.get(id) else {
        return not_found(id);
    };
    let status = volume["status"].as_str().unwrap_or_default();
    let attached = volume["attachments"]
        .as_array()
        .is_some_and(|a| !a.is_empty());
    if !DELETABLE.contains(&status) || attached {
        return Reply::cinder(400, NOT_DELETABLE);
    }
    let name = volume["name"].as_str().unwrap_or_default().to_owned();
    let pending = plan(world, &name, Next::Gone);
    let now = stamp(world);
    if let Some(volume) = world.cinder.volumes.get_mut(id) {
        volume.body["status"] = json!("deleting");
        volume.body["updated_at"] = json!(now);
        volume.next = Some(pending);
    }
    if let (_, Some(due)) = pending {
        world
            .env
            .schedule(due - Instant::now(), Timer::Volume(id.to_owned()));
    }
    Reply::empty(202)
}

/// Attaches an available volume to a server: `in-use`, with Cinder's attachment record.
pub fn attach(world: &mut Cx<'_>, volume: &str, server: &str, device: &str) {
    let attachment = world.env.uuid();
    let now = stamp(world);
    if let Some(found) = world.cinder.volumes.get_mut(volume) {
        found.body["status"] = json!("in-use");
        found.body["updated_at"] = json!(now);
        found.body["attachments"] = json!([{
            "id": volume, "attachment_id": attachment, "volume_id": volume, "server_id": server,
            "host_name": null, "device": device, "attached_at": now}]);
    }
}

/// Drops the server's attachment; a volume with none left is `available` again.
pub fn detach(world: &mut Cx<'_>, volume: &str, server: &str) {
    let now = stamp(world);
    let Some(found) = world.cinder.volumes.get_mut(volume) else {
        return;
    };
    let Some(attachments) = found.body["attachments"].as_array_mut() else {
        return;
    };
    let before = attachments.len();
    attachments.retain(|a| a["server_id"] != server);
    if attachments.len() != before && attachments.is_empty() {
        found.body["status"] = json!("available");
        found.body["updated_at"] = json!(now);
    }
}

/// What Nova does with a `delete_on_termination` volume of a server that is gone: detach, then
/// delete unless Cinder would refuse (the volume went to another server meanwhile).
pub fn delete_for_server(world: &mut Cx<'_>, volume: &str, server: &str) {
    detach(world, volume, server);
    let deletable = world.cinder.get(volume).is_some_and(|v| {
        DELETABLE.contains(&v["status"].as_str().unwrap_or_default())
            && v["attachments"].as_array().is_none_or(Vec::is_empty)
    });
    if deletable {
        world.cinder.volumes.remove(volume);
    }
}

fn plan(world: &mut Cx<'_>, name: &str, next: Next) -> (Next, Option<Instant>) {
    let effect = world.env.scenario.take_effect(ObjectKind::Volume, name);
    let unit = world.env.unit();
    let default = match next {
        Next::Gone => world.env.scenario.timings.volume_delete.clone(),
        _ => world.env.scenario.timings.volume_create.clone(),
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

pub fn on_volume_timer(world: &mut Cx<'_>, id: &str) {
    let Some((next, Some(due))) = world.cinder.volumes.get(id).and_then(|v| v.next) else {
        return;
    };
    if due > Instant::now() {
        return;
    }
    if next == Next::Gone {
        world.cinder.volumes.remove(id);
        return;
    }
    let now = stamp(world);
    if let Some(volume) = world.cinder.volumes.get_mut(id) {
        let status = if next == Next::Available {
            "available"
        } else {
            "error"
        };
        volume.body["status"] = json!(status);
        volume.body["updated_at"] = json!(now);
        volume.next = None;
    }
}

pub fn release_stuck(world: &mut Cx<'_>) {
    let stuck: Vec<(String, String, Next)> = world
        .cinder
        .volumes
        .iter()
        .filter_map(|(id, v)| match v.next {
            Some((next, None)) => Some((
                id.clone(),
                v.body["name"].as_str().unwrap_or_default().to_owned(),
                next,
            )),
            _ => None,
        })
        .collect();
    for (id, name, next) in stuck {
        if world.env.scenario.is_stuck(ObjectKind::Volume, &name) {
            continue;
        }
        let unit = world.env.unit();
        let timings = &world.env.scenario.timings;
        let delay = match next {
            Next::Gone => timings.volume_delete.sample(unit),
            _ => timings.volume_create.sample(unit),
        };
        if let Some(volume) = world.cinder.volumes.get_mut(&id) {
            volume.next = Some((next, Some(Instant::now() + delay)));
        }
        world.env.schedule(delay, Timer::Volume(id));
    }
}
