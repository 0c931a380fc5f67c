//! Keystone v3: version discovery, token issue (password, application credential, token),
//! token validation, the catalog.

use std::collections::HashMap;

use axum::http::Method;
use serde_json::{Value, json};
use tokio::time::Instant;

use super::env::{Env, Reply};

/// Keystone's state and the environment, lent for one call.
pub struct Cx<'a> {
    pub keystone: &'a mut Keystone,
    pub env: &'a mut Env,
}

#[derive(Debug, Default)]
pub struct Keystone {
    tokens: HashMap<String, Issued>,
    pub issued: u64,
}

/// A token as issued: what a validation shows again.
#[derive(Debug)]
struct Issued {
    /// When it expires, on the simulator's clock.
    expires: Instant,
    methods: Vec<String>,
    issued_at: chrono::DateTime<chrono::Utc>,
    expires_at: chrono::DateTime<chrono::Utc>,
}

/// The service prefixes the catalog advertises; every service lives on the one port.
pub const SERVICES: &[(&str, &str, &str)] = &[
    ("identity", "keystone", "identity/v3"),
    ("compute", "nova", "compute/v2.1"),
    ("network", "neutron", "network"),
    ("image", "glance", "image"),
    ("load-balancer", "octavia", "load-balancer"),
    ("block-storage", "cinder", "block-storage"),
];

pub fn unauthorized() -> Reply {
    Reply::json(
        401,
        json!({"error": {"code": 401, "title": "Unauthorized",
                         "message": "The request you have made requires authentication."}}),
    )
}

impl Keystone {
    /// Whether `token` is known and unexpired.
    pub fn valid(&self, token: Option<&str>) -> bool {
        token
            .and_then(|t| self.tokens.get(t))
            .is_some_and(|issued| issued.expires > Instant::now())
    }

    /// Forgets every token (a test can force re-authentication).
    pub fn revoke_all(&mut self) {
        self.tokens.clear();
    }
}

/// `/identity/...` requests, made with `token` (X-Auth-Token). `base` is `http://host:port`.
pub fn handle(
    world: &mut Cx<'_>,
    method: &Method,
    rest: &[&str],
    body: &[u8],
    token: Option<&str>,
    base: &str,
) -> Reply {
    match (method.as_str(), rest) {
        ("GET", [] | ["v3"]) => Reply::ok(version_document(base)),
        ("POST", ["v3", "auth", "tokens"]) => issue(world, body, base),
        ("GET", ["v3", "auth", "tokens"]) => validate(world, token, base),
        ("HEAD", ["v3", "auth", "tokens"]) if world.keystone.valid(token) => Reply::empty(200),
        ("HEAD", ["v3", "auth", "tokens"]) => token_not_found(),
        _ => Reply::json(
            404,
            json!({"error": {"code": 404, "title": "Not Found",
                                                "message": "The resource could not be found."}}),
        ),
    }
}

fn version_document(base: &str) -> Value {
    json!({"version": {
        "id": "v3.14", "status": "stable", "updated": "2020-04-07T00:00:00Z",
        "links": [{"rel": "self", "href": format!("{base}/identity/v3/")}],
        "media-types": [{"base": "application/json",
                         "type": "application/vnd.openstack.identity-v3+json"}]}})
}

fn issue(world: &mut Cx<'_>, body: &[u8], base: &str) -> Reply {
    let Ok(request) = serde_json::from_slice::<Value>(body) else {
        return Reply::json(
            400,
            json!({"error": {"code": 400, "title": "Bad Request",
                                                  "message": "Malformed request body."}}),
        );
    };
    let identity = &request["auth"]["identity"];
    let methods: Vec<&str> = identity["methods"]
        .as_array()
        .map(|m| m.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let settings = &world.env.settings;
    let accepted = methods.iter().any(|method| match *method {
        "password" => {
            let user = &identity["password"]["user"];
            let name_ok = user["name"].as_str() == Some(settings.username.as_str())
                || user["id"].as_str() == Some(settings.username.as_str());
            name_ok && user["password"].as_str() == Some(settings.password.as_str())
        }
        "application_credential" => {
            let credential = &identity["application_credential"];
            credential["id"].as_str() == Some(settings.app_credential_id.as_str())
                && credential["secret"].as_str() == Some(settings.app_credential_secret.as_str())
        }
        "token" => world.keystone.valid(identity["token"]["id"].as_str()),
        _ => false,
    });
    if !accepted {
        return unauthorized();
    }
    let token = format!("gAAAAA{}", world.env.hex_id());
    let lifetime = world.env.settings.token_lifetime;
    let now = world.env.wall_now();
    let issued = Issued {
        expires: Instant::now() + lifetime,
        methods: methods.iter().map(|m| (*m).to_owned()).collect(),
        issued_at: now,
        expires_at: now + chrono::TimeDelta::from_std(lifetime).unwrap_or_default(),
    };
    let body = token_body(world.env, &issued, base);
    world.keystone.tokens.insert(token.clone(), issued);
    world.keystone.issued += 1;
    Reply::json(201, body).header("x-subject-token", token)
}

/// `GET /v3/auth/tokens`: the token shown again, as Keystone validates one. The subject is
/// the caller's own token (gophercloud validates its own: X-Subject-Token = X-Auth-Token).
fn validate(world: &mut Cx<'_>, token: Option<&str>, base: &str) -> Reply {
    let issued = token
        .filter(|_| world.keystone.valid(token))
        .and_then(|token| Some((token, world.keystone.tokens.get(token)?)));
    match issued {
        Some((token, issued)) => {
            Reply::ok(token_body(world.env, issued, base)).header("x-subject-token", token)
        }
        None => token_not_found(),
    }
}

fn token_not_found() -> Reply {
    Reply::json(
        404,
        json!({"error": {"code": 404, "title": "Not Found",
                         "message": "Failed to validate token"}}),
    )
}

fn token_body(env: &Env, issued: &Issued, base: &str) -> Value {
    let stamp = |t: chrono::DateTime<chrono::Utc>| t.format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string();
    let settings = &env.settings;
    let methods = &issued.methods;
    let mut body = json!({"token": {
        "methods": methods,
        "expires_at": stamp(issued.expires_at),
        "issued_at": stamp(issued.issued_at),
        "audit_ids": ["simulated"],
        "user": {"id": format!("{}-id", settings.username), "name": settings.username,
                 "domain": {"id": "default", "name": "Default"}, "password_expires_at": null},
        "project": {"id": settings.project_id, "name": settings.project_name,
                    "domain": {"id": "default", "name": "Default"}},
        "roles": [{"id": "member-role", "name": "member"}, {"id": "reader-role", "name": "reader"}],
        "is_domain": false,
        "catalog": catalog(base, &settings.region),
    }});
    if methods.iter().any(|m| m == "application_credential") {
        body["token"]["application_credential"] = json!({
            "id": settings.app_credential_id, "name": "capo-rs", "restricted": true});
    }
    body
}

fn catalog(base: &str, region: &str) -> Value {
    let services: Vec<Value> = SERVICES
        .iter()
        .map(|(kind, name, prefix)| {
            let endpoints: Vec<Value> = ["public", "internal"]
                .iter()
                .map(|interface| {
                    json!({"id": format!("{name}-{interface}"), "interface": interface,
                           "region": region, "region_id": region,
                           "url": format!("{base}/{prefix}")})
                })
                .collect();
            json!({"id": name, "name": name, "type": kind, "endpoints": endpoints})
        })
        .collect();
    Value::Array(services)
}
