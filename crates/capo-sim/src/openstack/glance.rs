//! Glance v2: images, listed by name and tags.

use axum::http::Method;
use serde_json::{Value, json};

use super::env::{Env, Reply};

/// Glance's state and the environment, lent for one call.
pub struct Cx<'a> {
    pub glance: &'a mut Glance,
    pub env: &'a mut Env,
}

#[derive(Debug, Default)]
pub struct Glance {
    images: Vec<Value>,
}

impl Glance {
    pub fn find(&self, id: &str) -> Option<&Value> {
        self.images.iter().find(|i| i["id"] == id)
    }
}

/// Images a CAPO cluster template usually names.
pub fn seed(world: &mut Cx<'_>) {
    for (name, tags) in [
        ("ubuntu-2404-kube-v1.33.4", vec!["capi"]),
        ("ubuntu-2204-kube-v1.32.8", vec!["capi"]),
        ("cirros-0.6.3-x86_64-disk", vec![]),
    ] {
        let id = add_image(world, name, &tags);
        // A property an image builder sets (Glance shows properties beside the fields).
        if name.starts_with("ubuntu")
            && let Some(image) = world.glance.images.iter_mut().find(|i| i["id"] == id)
        {
            image["os_type"] = serde_json::json!("linux");
        }
    }
}

pub fn add_image(world: &mut Cx<'_>, name: &str, tags: &[&str]) -> String {
    let id = world.env.uuid();
    let now = world.env.utc_timestamp();
    world.glance.images.push(json!({
        "id": id, "name": name, "status": "active", "tags": tags, "visibility": "public",
        "disk_format": "qcow2", "container_format": "bare", "min_disk": 0, "min_ram": 0,
        "size": 1_073_741_824u64, "virtual_size": 1_073_741_824u64, "protected": false, "os_hidden": false,
        "checksum": "b6d81b360a5672d80c27430f39153e2c", "os_hash_algo": "sha512",
        "os_hash_value": "d6292685b380e338e025b3415a90fe8f9d39a46e7bdba8cb78c50a338cefca741f69e4e46411c32de1afdedfb268e579a51f81ff85e56f55b0ee7c33fe8c25c9",
        "stores": "fs",
        "created_at": now, "updated_at": now, "self": format!("/v2/images/{id}"),
        "file": format!("/v2/images/{id}/file"), "schema": "/v2/schemas/image",
        "owner": world.env.settings.project_id,
    }));
    id
}

/// The image named `name` uploaded again, as an image pipeline publishes a rebuild: the old
/// ones of that name are deleted, and the new one (a new ID) takes the name and tags.
pub fn republish_image(world: &mut Cx<'_>, name: &str) -> String {
    let tags: Vec<String> = world
        .glance
        .images
        .iter()
        .find(|i| i["name"] == name)
        .and_then(|i| i["tags"].as_array())
        .map(|tags| {
            tags.iter()
                .filter_map(|t| t.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    world.glance.images.retain(|i| i["name"] != name);
    let tags: Vec<&str> = tags.iter().map(String::as_str).collect();
    add_image(world, name, &tags)
}

pub fn handle(
    world: &mut Cx<'_>,
    method: &Method,
    rest: &[&str],
    query: &[(String, String)],
    base: &str,
) -> Reply {
    let not_found = |id: &str| {
        Reply::json(
            404,
            json!({"code": 404, "title": "Not Found", "message": format!("No image found with ID {id}")}),
        )
    };
    match (method.as_str(), rest) {
        // Glance answers its versions with 300 Multiple Choices (the real tier's: v2.18
        // current, and the older ones supported).
        ("GET", []) => Reply::json(
            300,
            json!({"versions": [
            {"id": "v2.18", "status": "CURRENT",
             "links": [{"rel": "self", "href": format!("{base}/image/v2/")}]},
            {"id": "v2.17", "status": "SUPPORTED",
             "links": [{"rel": "self", "href": format!("{base}/image/v2/")}]}]}),
        ),
        ("GET", ["v2", "images"]) => {
            let param = |name: &'static str| {
                query
                    .iter()
                    .filter(move |(k, _)| k == name)
                    .map(|(_, v)| v.as_str())
            };
            let images: Vec<&Value> = world
                .glance
                .images
                .iter()
                .filter(|i| param("name").all(|n| i["name"] == n))
                .filter(|i| param("status").all(|s| i["status"] == s))
                .filter(|i| {
                    param("tag").all(|t| {
                        i["tags"]
                            .as_array()
                            .is_some_and(|tags| tags.iter().any(|x| x == t))
                    })
                })
                .collect();
            Reply::ok(
                json!({"images": images, "first": "/v2/images", "schema": "/v2/schemas/images"}),
            )
        }
        ("GET", ["v2", "images", id]) => {
            match world.glance.images.iter().find(|i| i["id"] == *id) {
                Some(image) => Reply::ok(image.clone()),
                None => not_found(id),
            }
        }
        _ => Reply::json(
            404,
            json!({"code": 404, "title": "Not Found", "message": "The resource could not be found."}),
        ),
    }
}
