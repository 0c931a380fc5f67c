//! HTTP: one port for every service (path prefix per service, as the catalog says), token
//! checks, injected faults, the request log, and the `/_sim` admin endpoints.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::Response;
use serde_json::{Value, json};

use super::env::Reply;
use super::faults::{self, Rule, Scenario};
use super::octavia::{self, Oper};
use super::world::{LoggedRequest, World};
use super::{cinder, glance, keystone, neutron, nova};

pub struct Shared {
    pub world: Mutex<World>,
    /// `http://127.0.0.1:PORT`, for links and the catalog.
    pub base: String,
    /// Real time spent serving (not counting injected latency), so a benchmark that runs the
    /// simulator in its own thread can tell its own cost from the simulator's.
    pub busy_nanos: std::sync::atomic::AtomicU64,
}

impl Shared {
    /// The world, with every due transition applied.
    pub fn world(&self) -> MutexGuard<'_, World> {
        let mut world = self.world.lock().unwrap_or_else(|e| e.into_inner());
        world.settle();
        world
    }
}

pub fn router(shared: Arc<Shared>) -> Router {
    Router::new().fallback(dispatch).with_state(shared)
}

async fn dispatch(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    respond(handle_request(&shared, &method, uri.path(), uri.query(), &headers, &body).await)
}

/// Serves one request, over HTTP or in-process.
pub async fn handle_request(
    shared: &Shared,
    method: &Method,
    path: &str,
    query: Option<&str>,
    headers: &HeaderMap,
    body: &[u8],
) -> Reply {
    let token = headers.get("x-auth-token").and_then(|v| v.to_str().ok());
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let query: Vec<(String, String)> = query
        .map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect())
        .unwrap_or_default();
    let Some((&first, rest)) = segments.split_first() else {
        return Reply::ok(json!({"simulator": "capo-rs sim openstack"}));
    };
    if first == "_sim" {
        return admin(shared, method, rest, body);
    }
    let Some(service) = service(first) else {
        return Reply::json(404, json!({"error": "unknown service"}));
    };
    let operation = if service == "block-storage" {
        operation(service, method, &cinder::unscoped(rest))
    } else {
        operation(service, method, rest)
    };
    let started = std::time::Instant::now();
    let (fault, latency) = {
        let mut world = shared.world();
        let fault = injected_fault(&mut world, service, token, method, rest);
        let latency = latency(&mut world, service);
        (fault, latency)
    };
    let mut busy = started.elapsed();
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    let started = std::time::Instant::now();
    let mut world = shared.world();
    let reply = match fault {
        Some(reply) => reply,
        None => serve(
            &mut world,
            Call {
                service,
                method,
                rest,
                query: &query,
                body,
                token,
                compute_microversion: nova::Microversion::asked(headers),
            },
            &shared.base,
        ),
    };
    let at = world.seconds_since_start();
    world.requests.note_read(path, &query);
    world.requests.record(LoggedRequest {
        at,
        service: service.to_owned(),
        operation,
        status: reply.status.as_u16(),
    });
    drop(world);
    busy += started.elapsed();
    let nanos = u64::try_from(busy.as_nanos()).unwrap_or(u64::MAX);
    shared
        .busy_nanos
        .fetch_add(nanos, std::sync::atomic::Ordering::Relaxed);
    reply
}

fn service(prefix: &str) -> Option<&'static str> {
    keystone::SERVICES
        .iter()
        .map(|(kind, _, _)| *kind)
        .find(|kind| *kind == prefix)
}

/// One request to a service, past the faults.
struct Call<'a> {
    service: &'a str,
    method: &'a Method,
    rest: &'a [&'a str],
    query: &'a [(String, String)],
    body: &'a [u8],
    /// X-Auth-Token.
    token: Option<&'a str>,
    /// The compute microversion the request asks for.
    compute_microversion: nova::Microversion,
}

fn serve(world: &mut World, call: Call<'_>, base: &str) -> Reply {
    let Call {
        service,
        method,
        rest,
        query,
        body,
        token,
        compute_microversion,
    } = call;
    match service {
        "identity" => {
            world.with_keystone(|cx| keystone::handle(cx, method, rest, body, token, base))
        }
        "load-balancer" => {
            world.with_octavia(|cx| octavia::handle(cx, method, rest, query, body, base))
        }
        "network" => world.with_neutron(|cx| neutron::handle(cx, method, rest, query, body, base)),
        "compute" => world.with_nova(|cx| {
            nova::handle(cx, method, rest, query, body, base, compute_microversion)
        }),
        "image" => world.with_glance(|cx| glance::handle(cx, method, rest, query, base)),
        "block-storage" => world.with_cinder(|cx| cinder::handle(cx, method, rest, query, body)),
        _ => Reply::json(404, json!({"error": "unknown service"})),
    }
}

/// A fault to answer with instead of serving: Keystone outage, missing or expired token,
/// injected 429 or 5xx.
fn injected_fault(
    world: &mut World,
    service: &str,
    token: Option<&str>,
    method: &Method,
    rest: &[&str],
) -> Option<Reply> {
    let at = world.seconds_since_start();
    if service == "identity" {
        let down = world
            .env
            .scenario
            .keystone_outages
            .iter()
            .any(|o| o.from <= at && at < o.until);
        if down {
            return Some(Reply::json(
                503,
                json!({"error": {"code": 503, "title": "Service Unavailable",
                                 "message": "Keystone is unavailable (simulated outage)."}}),
            ));
        }
    } else if world.env.settings.require_auth && !world.keystone.valid(token) {
        return Some(keystone::unauthorized());
    }
    let is_discovery = service == "identity" && method == Method::GET && rest.len() <= 1;
    if is_discovery {
        return None;
    }
    let arrived = world.requests.arrive(service, at);
    let scenario = &world.env.scenario;
    for limit in &scenario.rate_limits {
        if !faults::applies(&limit.service, service) {
            continue;
        }
        let over_rate = limit.above_per_second.is_some_and(|max| arrived > max);
        let retry_after = limit.retry_after;
        let by_chance = limit.probability.is_some_and(|p| world.env.rng.f64() < p);
        if over_rate || by_chance {
            return Some(
                Reply::json(
                    429,
                    json!({"message": "Rate limit exceeded (simulated)", "code": 429}),
                )
                .header("retry-after", retry_after.to_string()),
            );
        }
    }
    let errors: Vec<(f64, u16)> = world
        .env
        .scenario
        .server_errors
        .iter()
        .filter(|e| faults::applies(&e.service, service))
        .map(|e| (e.probability, e.status))
        .collect();
    for (probability, status) in errors {
        if world.env.rng.f64() < probability {
            return Some(Reply::json(
                status,
                json!({"faultcode": "Server", "faultstring": "Simulated server error", "debuginfo": null}),
            ));
        }
    }
    None
}

fn latency(world: &mut World, service: &str) -> Duration {
    let delays: Vec<faults::Delay> = world
        .env
        .scenario
        .latency
        .iter()
        .filter(|l| faults::applies(&l.service, service))
        .map(|l| l.delay.clone())
        .collect();
    delays
        .into_iter()
        .map(|delay| {
            let unit = world.env.unit();
            delay.sample(unit)
        })
        .sum()
}

/// `<resource>_<verb>` for the request log, in the client's naming (`loadbalancer_member_create`).
pub fn operation(service: &str, method: &Method, rest: &[&str]) -> String {
    let path: Vec<&str> = rest
        .iter()
        .copied()
        .filter(|s| !matches!(*s, "v2" | "v2.0" | "v2.1" | "v3" | "lbaas"))
        .collect();
    if service == "identity" {
        return match (method.as_str(), path.as_slice()) {
            ("POST", ["auth", "tokens"]) => "token_create".into(),
            _ => "version_get".into(),
        };
    }
    let mut resource = "";
    let mut on_item = false;
    let mut action = None;
    let path: Vec<&str> = path.into_iter().filter(|s| *s != "detail").collect();
    let detail = rest.contains(&"detail");
    for (index, segment) in path.iter().enumerate() {
        if index % 2 == 0 {
            match *segment {
                "status" => action = Some("status_get"),
                "tags" => action = Some("tags_update"),
                // Nova's `POST /servers/{id}/action`, as the client names it.
                "action" => action = Some("action"),
                "add_router_interface" => action = Some("interface_add"),
                "remove_router_interface" => action = Some("interface_remove"),
                collection => {
                    resource = collection;
                    on_item = false;
                }
            }
        } else {
            on_item = true;
        }
    }
    let action = action.or(detail.then_some("list"));
    let verb = action.unwrap_or(match (method.as_str(), on_item) {
        ("GET", false) => "list",
        ("GET", true) => "get",
        ("POST", _) => "create",
        ("PUT" | "PATCH", _) => "update",
        ("DELETE", _) => "delete",
        _ => "other",
    });
    let singular = match resource {
        "security-groups" => "security_group".to_owned(),
        "security-group-rules" => "security_group_rule".to_owned(),
        "floatingips" => "floating_ip".to_owned(),
        "os-server-groups" => "server_group".to_owned(),
        "os-availability-zone" => "availability_zone".to_owned(),
        other => other.strip_suffix('s').unwrap_or(other).to_owned(),
    };
    if service == "load-balancer" && singular != "loadbalancer" {
        format!("loadbalancer_{singular}_{verb}")
    } else {
        format!("{singular}_{verb}")
    }
}

pub fn respond(reply: Reply) -> Response {
    let mut builder = Response::builder().status(reply.status);
    for (name, value) in &reply.headers {
        builder = builder.header(*name, value.as_str());
    }
    let body = match &reply.body {
        // A page, not JSON (webob's default error pages).
        Some(serde_json::Value::String(page))
            if reply.headers.iter().any(|(n, _)| *n == "content-type") =>
        {
            Body::from(page.clone())
        }
        Some(body) => {
            builder = builder.header("content-type", "application/json");
            Body::from(serde_json::to_vec(body).unwrap_or_default())
        }
        None => Body::empty(),
    };
    builder.body(body).unwrap_or_else(|_| {
        let mut response = Response::new(Body::empty());
        *response.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
        response
    })
}

// ---------------------------------------------------------------- admin

fn admin(shared: &Shared, method: &Method, rest: &[&str], body: &[u8]) -> Reply {
    let mut world = shared.world();
    let text = String::from_utf8_lossy(body);
    match (method.as_str(), rest) {
        ("GET", ["scenario"]) => Reply::ok(json!(world.env.scenario)),
        ("PUT", ["scenario"]) => match Scenario::parse(&text) {
            Ok(scenario) => {
                if let Some(seed) = scenario.seed {
                    world.env.rng = fastrand::Rng::with_seed(seed);
                }
                world.env.scenario = scenario;
                world.release_stuck();
                Reply::ok(json!(world.env.scenario))
            }
            Err(message) => Reply::json(400, json!({"error": message})),
        },
        ("POST", ["rules"]) => match faults::from_yaml::<Rule>(&text) {
            Ok(rule) => {
                world.env.scenario.rules.push(rule);
                Reply::ok(json!(world.env.scenario.rules))
            }
            Err(e) => Reply::json(400, json!({"error": format!("invalid rule: {e}")})),
        },
        ("DELETE", ["rules"]) => {
            world.env.scenario.rules.clear();
            world.release_stuck();
            Reply::ok(json!([]))
        }
        ("POST", ["operating-status"]) => {
            let Ok(request) = serde_json::from_slice::<Value>(body) else {
                return Reply::json(
                    400,
                    json!({"error": "expected {\"object\": id-or-name, \"status\": \"ONLINE\"|...|null}"}),
                );
            };
            let object = request["object"].as_str().unwrap_or_default();
            let status = match request["status"].as_str() {
                Some(text) => match Oper::parse(text) {
                    Some(status) => Some(status),
                    None => {
                        return Reply::json(
                            400,
                            json!({"error": format!("unknown operating status {text:?}")}),
                        );
                    }
                },
                None => None,
            };
            if world.with_octavia(|cx| octavia::set_operating(cx, object, status)) {
                Reply::ok(json!({"object": object, "status": request["status"]}))
            } else {
                Reply::json(
                    404,
                    json!({"error": format!("no Octavia object has id or name {object:?}")}),
                )
            }
        }
        ("GET", ["requests"]) => Reply::ok(json!(world.requests)),
        ("DELETE", ["requests"]) => {
            world.requests.reset();
            Reply::empty(204)
        }
        ("POST", ["keystone", "revoke"]) => {
            world.keystone.revoke_all();
            Reply::empty(204)
        }
        ("GET", ["state"]) => Reply::ok(json!({
            "seconds": world.seconds_since_start(),
            "tokens_issued": world.keystone.issued,
            "loadbalancers": world.octavia.lbs.len(),
            "members": world.octavia.members.len(),
            "ports": world.neutron.all("ports").len(),
            "servers": world.nova.count(),
            "volumes": world.cinder.count(),
        })),
        _ => Reply::json(
            404,
            json!({"error": "unknown admin endpoint",
            "endpoints": ["GET|PUT /_sim/scenario", "POST|DELETE /_sim/rules",
                          "POST /_sim/operating-status", "GET|DELETE /_sim/requests",
                          "POST /_sim/keystone/revoke", "GET /_sim/state"]}),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operation_names_follow_the_client() {
        let op = |service, method: Method, path: &str| {
            let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
            operation(service, &method, &segments)
        };
        assert_eq!(
            op("load-balancer", Method::POST, "v2/lbaas/pools/p/members"),
            "loadbalancer_member_create"
        );
        assert_eq!(
            op(
                "load-balancer",
                Method::GET,
                "v2/lbaas/loadbalancers/x/status"
            ),
            "loadbalancer_status_get"
        );
        assert_eq!(
            op("load-balancer", Method::GET, "v2/lbaas/loadbalancers"),
            "loadbalancer_list"
        );
        assert_eq!(
            op("compute", Method::POST, "v2.1/servers/s/action"),
            "server_action"
        );
        assert_eq!(
            op(
                "load-balancer",
                Method::DELETE,
                "v2/lbaas/pools/p/members/m"
            ),
            "loadbalancer_member_delete"
        );
        assert_eq!(
            op("network", Method::GET, "v2.0/security-groups"),
            "security_group_list"
        );
        assert_eq!(
            op(
                "network",
                Method::PUT,
                "v2.0/routers/r/add_router_interface"
            ),
            "router_interface_add"
        );
        assert_eq!(
            op("compute", Method::GET, "v2.1/servers/detail"),
            "server_list"
        );
        assert_eq!(op("compute", Method::GET, "v2.1/servers/s"), "server_get");
        let unscoped = |path: &str| {
            let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
            operation(
                "block-storage",
                &Method::DELETE,
                &super::cinder::unscoped(&segments),
            )
        };
        assert_eq!(unscoped("v3/volumes/v"), "volume_delete");
        assert_eq!(unscoped("v3/0123abcd/volumes/v"), "volume_delete");
        assert_eq!(
            op("identity", Method::POST, "v3/auth/tokens"),
            "token_create"
        );
    }
}
