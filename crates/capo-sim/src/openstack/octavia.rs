//! Octavia v2 as a real amphora (v2) cloud behaves: every change under a load
//! balancer locks it (and its listeners and the pool) in PENDING_UPDATE; changes while it is
//! PENDING_* get the real 409; the LB unlocks after its own delay while each member finishes
//! on its own clock, possibly later, possibly never (stuck), possibly in ERROR.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::time::Duration;

use axum::http::Method;
use serde_json::{Value, json};
use tokio::time::Instant;

use capo_provider::cloud::octavia::{OperatingStatus, ProvisioningStatus};

use super::env::{Env, Neighbours, Reply, Timer, json_body, string_list};
use super::faults::{Effect, ObjectKind};

/// Octavia's state and the environment, lent for one call, with Neutron behind
/// [`Neighbours`] for VIP ports.
pub struct Cx<'a> {
    pub octavia: &'a mut Octavia,
    pub env: &'a mut Env,
    pub others: &'a mut dyn Neighbours,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Prov {
    Active,
    Error,
    PendingCreate,
    PendingUpdate,
    PendingDelete,
}

impl Prov {
    pub fn as_str(self) -> &'static str {
        match self {
            Prov::Active => "ACTIVE",
            Prov::Error => "ERROR",
            Prov::PendingCreate => "PENDING_CREATE",
            Prov::PendingUpdate => "PENDING_UPDATE",
            Prov::PendingDelete => "PENDING_DELETE",
        }
    }

    pub fn is_pending(self) -> bool {
        matches!(
            self,
            Prov::PendingCreate | Prov::PendingUpdate | Prov::PendingDelete
        )
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Oper {
    Online,
    NoMonitor,
    Draining,
    Degraded,
    Offline,
    Error,
}

impl Oper {
    pub fn as_str(self) -> &'static str {
        match self {
            Oper::Online => "ONLINE",
            Oper::NoMonitor => "NO_MONITOR",
            Oper::Draining => "DRAINING",
            Oper::Degraded => "DEGRADED",
            Oper::Offline => "OFFLINE",
            Oper::Error => "ERROR",
        }
    }

    pub fn parse(text: &str) -> Option<Oper> {
        Some(match text {
            "ONLINE" => Oper::Online,
            "NO_MONITOR" => Oper::NoMonitor,
            "DRAINING" => Oper::Draining,
            "DEGRADED" => Oper::Degraded,
            "OFFLINE" => Oper::Offline,
            "ERROR" => Oper::Error,
            _ => return None,
        })
    }
}

// The simulator's words are the client's: joined here so the two cannot drift apart.
impl From<Prov> for ProvisioningStatus {
    fn from(status: Prov) -> Self {
        match status {
            Prov::Active => ProvisioningStatus::Active,
            Prov::Error => ProvisioningStatus::Error,
            Prov::PendingCreate => ProvisioningStatus::PendingCreate,
            Prov::PendingUpdate => ProvisioningStatus::PendingUpdate,
            Prov::PendingDelete => ProvisioningStatus::PendingDelete,
        }
    }
}

impl From<Oper> for OperatingStatus {
    fn from(status: Oper) -> Self {
        match status {
            Oper::Online => OperatingStatus::Online,
            Oper::NoMonitor => OperatingStatus::NoMonitor,
            Oper::Draining => OperatingStatus::Draining,
            Oper::Degraded => OperatingStatus::Degraded,
            Oper::Offline => OperatingStatus::Offline,
            Oper::Error => OperatingStatus::Error,
        }
    }
}

#[cfg(test)]
mod vocabulary_tests {
    use super::*;

    #[test]
    fn the_simulators_status_words_are_the_clients() {
        for status in [
            Prov::Active,
            Prov::Error,
            Prov::PendingCreate,
            Prov::PendingUpdate,
            Prov::PendingDelete,
        ] {
            assert_eq!(status.as_str(), ProvisioningStatus::from(status).as_str());
        }
        for status in [
            Oper::Online,
            Oper::NoMonitor,
            Oper::Draining,
            Oper::Degraded,
            Oper::Offline,
            Oper::Error,
        ] {
            assert_eq!(status.as_str(), OperatingStatus::from(status).as_str());
            assert_eq!(Oper::parse(status.as_str()), Some(status));
        }
    }
}

/// How a pending transition ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Active,
    Error,
    Gone,
}

/// A transition in flight. `due: None` means a `Stuck` rule holds it.
#[derive(Clone, Copy, Debug)]
pub struct Pending {
    pub outcome: Outcome,
    pub due: Option<Instant>,
}

/// Fields every Octavia object has.
#[derive(Clone, Debug)]
pub struct Meta {
    pub id: String,
    pub name: String,
    pub description: String,
    pub tags: Vec<String>,
    pub created_at: String,
    pub updated_at: Option<String>,
    pub status: Prov,
    pub operating_override: Option<Oper>,
    seq: u64,
}

#[derive(Clone, Debug)]
pub struct LoadBalancer {
    pub meta: Meta,
    pub provider: String,
    pub flavor_id: Option<String>,
    pub vip_address: String,
    pub vip_port_id: String,
    pub vip_subnet_id: Option<String>,
    pub vip_network_id: Option<String>,
    pub availability_zone: Option<String>,
    pub pending: Option<Pending>,
}

#[derive(Clone, Debug)]
pub struct Listener {
    pub meta: Meta,
    pub lb: String,
    pub protocol: String,
    pub protocol_port: u16,
    pub default_pool_id: Option<String>,
    pub allowed_cidrs: Option<Vec<String>>,
    pub connection_limit: i64,
}

#[derive(Clone, Debug)]
pub struct Pool {
    pub meta: Meta,
    pub lb: String,
    pub listener: Option<String>,
    pub protocol: String,
    pub lb_algorithm: String,
    pub healthmonitor: Option<String>,
}

#[derive(Clone, Debug)]
pub struct Member {
    pub meta: Meta,
    pub pool: String,
    pub address: String,
    pub protocol_port: u16,
    pub weight: u32,
    pub backup: bool,
    pub admin_state_up: bool,
    pub subnet_id: Option<String>,
    pub monitor_address: Option<String>,
    pub monitor_port: Option<u16>,
    pub pending: Option<Pending>,
    /// Its health monitor has checked it (after the scenario's `member_online` delay); from
    /// then on its operating status follows the API server at its address.
    pub online: bool,
    /// When the monitor first checked it: a flapping API server's phase counts from here.
    pub checked_at: Option<Instant>,
    /// What Octavia's API writes and keeps when no health manager runs (no heartbeats), as
    /// the real tier showed: OFFLINE for a member created under a monitor or admin down,
    /// NO_MONITOR otherwise; a monitor's deletion makes it NO_MONITOR, and neither a new
    /// monitor nor an admin-state update moves it.
    pub unreported: Oper,
    /// When it last settled (ACTIVE or ERROR), on the simulator's clock: ground truth for
    /// benchmarks measuring how late a poller noticed.
    pub settled_at: Option<Instant>,
}

#[derive(Clone, Debug)]
pub struct HealthMonitor {
    pub meta: Meta,
    pub pool: String,
    pub kind: String,
    pub delay: u32,
    pub timeout: u32,
    pub max_retries: u32,
    pub max_retries_down: u32,
    pub http_method: Option<String>,
    pub url_path: Option<String>,
    pub expected_codes: Option<String>,
}

/// A simulated kube-apiserver behind a member's address, as a health monitor sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ApiServer {
    /// Listens, and `/readyz` answers 200.
    #[default]
    Serving,
    /// Listens (a TCP connect succeeds) but `/readyz` never answers 200: a TCP monitor
    /// reads it ONLINE, an HTTPS one ERROR.
    NeverReady,
    /// Ready for `period`, then not (nothing listens) for `period`, and so on.
    Flapping { period: Duration },
    /// Nothing listens.
    Down,
}

impl ApiServer {
    /// Whether one check of a monitor of `kind` (`TCP`, `HTTPS`, ...) passes, made
    /// `checked_for` after the monitor's first check.
    fn check_passes(self, kind: &str, checked_for: Duration) -> bool {
        let checks_http = kind.eq_ignore_ascii_case("HTTPS") || kind.eq_ignore_ascii_case("HTTP");
        match self {
            ApiServer::Serving => true,
            ApiServer::NeverReady => !checks_http,
            ApiServer::Down => false,
            ApiServer::Flapping { period } => {
                let period = period.as_millis().max(1);
                (checked_for.as_millis() / period).is_multiple_of(2)
            }
        }
    }

    /// Whether a monitor of `kind` checking at `cadence` reads the member up `checked_for`
    /// after its first check. A steady server reads what its latest check says; a flapping
    /// one is sampled, so that a flap faster than the checks can read steady either way.
    pub fn passes(self, kind: &str, cadence: Cadence, checked_for: Duration) -> bool {
        if !matches!(self, ApiServer::Flapping { .. }) {
            return self.check_passes(kind, checked_for);
        }
        let checks = checked_for.as_millis() / cadence.delay.as_millis().max(1);
        let mut health = Health::starting();
        for k in 0..=checks {
            let at = cadence
                .delay
                .saturating_mul(u32::try_from(k).unwrap_or(u32::MAX));
            health.record(self.check_passes(kind, at), cadence.rise, cadence.fall);
        }
        health.up
    }
}

/// How a monitor checks: every `delay`; as haproxy does with the `rise`/`fall` Octavia
/// writes from `max_retries`/`max_retries_down` (and OVN's service monitor with its success
/// and failure counts), a member goes down after `fall` failed checks in a row and up after
/// `rise` passed ones.
#[derive(Clone, Copy, Debug)]
pub struct Cadence {
    pub delay: Duration,
    pub rise: u32,
    pub fall: u32,
}

impl Cadence {
    pub fn of(monitor: &HealthMonitor) -> Self {
        Cadence {
            delay: Duration::from_secs(u64::from(monitor.delay.max(1))),
            rise: monitor.max_retries.max(1),
            fall: monitor.max_retries_down.max(1),
        }
    }
}

/// haproxy's health counter for one server: `rise` passes in a row bring it up, `fall`
/// failures in a row bring it down.
struct Health {
    up: bool,
    /// Checks in a row that disagree with `up`.
    streak: u32,
    /// Up since the start with no check passed yet: haproxy starts a server at health
    /// `rise`, one failure from down.
    fresh: bool,
}

impl Health {
    fn starting() -> Self {
        Health {
            up: true,
            streak: 0,
            fresh: true,
        }
    }

    fn record(&mut self, passed: bool, rise: u32, fall: u32) {
        match (self.up, passed) {
            (true, true) => {
                self.streak = 0;
                self.fresh = false;
            }
            (false, false) => self.streak = 0,
            (true, false) => {
                self.streak += 1;
                if self.fresh || self.streak >= fall {
                    self.up = false;
                    self.streak = 0;
                }
            }
            (false, true) => {
                self.streak += 1;
                if self.streak >= rise {
                    self.up = true;
                    self.streak = 0;
                    self.fresh = false;
                }
            }
        }
    }
}

#[derive(Debug, Default)]
pub struct Octavia {
    pub lbs: HashMap<String, LoadBalancer>,
    pub listeners: HashMap<String, Listener>,
    pub pools: HashMap<String, Pool>,
    pub members: HashMap<String, Member>,
    pub monitors: HashMap<String, HealthMonitor>,
    /// The API server behind each member address (by address; `*` for every other address;
    /// absent: it serves).
    pub api_servers: HashMap<String, ApiServer>,
    /// The API server behind members whose name matches a glob (`*-cp-3`), for members whose
    /// address is not known in advance; an address set on its own comes first.
    pub api_servers_by_member: Vec<(String, ApiServer)>,
    /// Pool id -> member ids, in creation order.
    pool_members: HashMap<String, Vec<String>>,
    /// Load balancer id -> its listener ids and pool ids, in creation order: the read paths
    /// (status tree, rendering) never scan every object of the cloud.
    children: HashMap<String, (Vec<String>, Vec<String>)>,
    seq: u64,
}

const PROVIDERS: &[(&str, &str)] = &[
    ("amphora", "Amphora driver."),
    ("ovn", "Octavia OVN driver."),
];

impl Octavia {
    fn meta(&mut self, world_id: String, body: &Value, now: String) -> Meta {
        self.seq += 1;
        Meta {
            id: world_id,
            name: str_field(body, "name").unwrap_or_default(),
            description: str_field(body, "description").unwrap_or_default(),
            tags: string_list(&body["tags"]),
            created_at: now,
            updated_at: None,
            status: Prov::PendingCreate,
            operating_override: None,
            seq: self.seq,
        }
    }

    /// Member ids of a pool, in creation order.
    pub fn members_of(&self, pool: &str) -> &[String] {
        self.pool_members
            .get(pool)
            .map(Vec::as_slice)
            .unwrap_or(&[])
    }

    fn listeners_of(&self, lb: &str) -> Vec<&Listener> {
        let ids = self
            .children
            .get(lb)
            .map(|(l, _)| l.as_slice())
            .unwrap_or(&[]);
        ids.iter().filter_map(|id| self.listeners.get(id)).collect()
    }

    fn pools_of(&self, lb: &str) -> Vec<&Pool> {
        let ids = self
            .children
            .get(lb)
            .map(|(_, p)| p.as_slice())
            .unwrap_or(&[]);
        ids.iter().filter_map(|id| self.pools.get(id)).collect()
    }

    /// Forgets listeners and pools that no longer exist from the per-LB index.
    fn prune_children(&mut self, lb: &str) {
        let (listeners, pools) = (&self.listeners, &self.pools);
        if let Some((l, p)) = self.children.get_mut(lb) {
            l.retain(|id| listeners.contains_key(id));
            p.retain(|id| pools.contains_key(id));
        }
    }
}

fn str_field(body: &Value, key: &str) -> Option<String> {
    body.get(key).and_then(Value::as_str).map(str::to_owned)
}

fn immutable(kind: &str, id: &str) -> Reply {
    Reply::fault(
        409,
        format!("{kind} {id} is immutable and cannot be updated."),
    )
}

fn not_found(kind: &str, id: &str) -> Reply {
    Reply::fault(404, format!("{kind} {id} not found."))
}

fn invalid(field: &str, value: &Value, why: &str) -> Reply {
    let shown = value
        .as_str()
        .map(str::to_owned)
        .unwrap_or_else(|| value.to_string());
    Reply::fault(
        400,
        format!("Invalid input for field/attribute {field}. Value: '{shown}'. {why}"),
    )
}

// ---------------------------------------------------------------- routing

/// `/load-balancer/v2/...` requests.
/// Octavia's version document at the endpoint's root: every minor version from 2.0 to the
/// current one, oldest first, the last CURRENT.
fn versions(world: &Cx<'_>, base: &str) -> Reply {
    let (major, current) = world.env.settings.octavia_version;
    let versions: Vec<Value> = (0..=current)
        .map(|minor| {
            let status = if minor == current {
                "CURRENT"
            } else {
                "SUPPORTED"
            };
            json!({"id": format!("v{major}.{minor}"), "status": status,
                   "updated": "2016-01-01T00:00:00Z",
                   "links": [{"href": format!("{base}/load-balancer/v{major}"), "rel": "self"}]})
        })
        .collect();
    Reply::ok(json!({ "versions": versions }))
}

pub fn handle(
    world: &mut Cx<'_>,
    method: &Method,
    rest: &[&str],
    query: &[(String, String)],
    body: &[u8],
    base: &str,
) -> Reply {
    let Some(body) = json_body(body) else {
        return Reply::bad_json();
    };
    if rest.is_empty() || rest == [""] {
        return versions(world, base);
    }
    let path = match rest {
        ["v2", "lbaas", path @ ..] | ["v2.0", "lbaas", path @ ..] => path,
        ["v2", path @ ..] => path,
        _ => return Reply::fault(404, "The resource could not be found."),
    };
    let m = method.as_str();
    let links = |key: &str| format!("{base}/load-balancer/v2/lbaas/{key}");
    match (m, path) {
        ("GET", ["loadbalancers"]) if world.env.settings.lb_list_refused => {
            Reply::fault(403, "Policy does not allow this request to be performed.")
        }
        ("GET", ["loadbalancers"]) if only_row_fields(query) => list(
            world,
            query,
            "loadbalancers",
            &links("loadbalancers"),
            render_lb_rows,
        ),
        ("GET", ["loadbalancers"]) => list(
            world,
            query,
            "loadbalancers",
            &links("loadbalancers"),
            render_lbs,
        ),
        ("POST", ["loadbalancers"]) => create_lb(world, &body["loadbalancer"]),
        ("GET", ["loadbalancers", id]) => get(
            world.octavia.lbs.get(*id).map(|lb| render_lb(world, lb)),
            "loadbalancer",
            "Load Balancer",
            id,
        ),
        ("PUT", ["loadbalancers", id]) => update_lb(world, id, &body["loadbalancer"]),
        ("DELETE", ["loadbalancers", id]) => delete_lb(world, id, query),
        ("GET", ["loadbalancers", id, "status"]) => status_tree(world, id),
        ("GET", ["listeners"]) => list(
            world,
            query,
            "listeners",
            &links("listeners"),
            render_listeners,
        ),
        ("POST", ["listeners"]) => create_listener(world, &body["listener"]),
        ("GET", ["listeners", id]) => get(
            world
                .octavia
                .listeners
                .get(*id)
                .map(|l| render_listener(world, l)),
            "listener",
            "Listener",
            id,
        ),
        ("PUT", ["listeners", id]) => update_listener(world, id, &body["listener"]),
        ("DELETE", ["listeners", id]) => delete_child(world, Child::Listener, id),
        ("GET", ["pools"]) => list(world, query, "pools", &links("pools"), render_pools),
        ("POST", ["pools"]) => create_pool(world, &body["pool"]),
        ("GET", ["pools", id]) => get(
            world.octavia.pools.get(*id).map(|p| render_pool(world, p)),
            "pool",
            "Pool",
            id,
        ),
        ("DELETE", ["pools", id]) => delete_child(world, Child::Pool, id),
        ("GET", ["healthmonitors"]) => list(
            world,
            query,
            "healthmonitors",
            &links("healthmonitors"),
            render_monitors,
        ),
        ("POST", ["healthmonitors"]) => create_monitor(world, &body["healthmonitor"]),
        ("GET", ["healthmonitors", id]) => get(
            world
                .octavia
                .monitors
                .get(*id)
                .map(|h| render_monitor(world, h)),
            "healthmonitor",
            "Health Monitor",
            id,
        ),
        ("PUT", ["healthmonitors", id]) => update_monitor(world, id, &body["healthmonitor"]),
        ("DELETE", ["healthmonitors", id]) => delete_child(world, Child::Monitor, id),
        ("GET", ["pools", pool, "members"]) => list_members(world, pool, query, base),
        ("POST", ["pools", pool, "members"]) => create_member(world, pool, &body["member"]),
        ("PUT", ["pools", pool, "members"]) => batch_members(world, pool, &body["members"]),
        ("GET", ["pools", pool, "members", id]) => get_member(world, pool, id),
        ("PUT", ["pools", pool, "members", id]) => update_member(world, pool, id, &body["member"]),
        ("DELETE", ["pools", pool, "members", id]) => delete_member(world, pool, id),
        ("GET", ["providers"]) => {
            let providers: Vec<Value> = PROVIDERS
                .iter()
                .map(|(name, description)| json!({"name": name, "description": description}))
                .collect();
            Reply::ok(json!({"providers": providers}))
        }
        ("GET", ["flavors"]) => Reply::ok(json!({"flavors": [], "flavors_links": []})),
        ("GET", ["availabilityzones"]) => {
            Reply::ok(json!({"availability_zones": [], "availability_zones_links": []}))
        }
        _ => Reply::fault(404, "The resource could not be found."),
    }
}

fn get(rendered: Option<Value>, key: &str, kind: &str, id: &str) -> Reply {
    match rendered {
        Some(object) => Reply::ok(json!({ key: object })),
        None => not_found(kind, id),
    }
}

/// Renders a collection's objects; `query` lets it pass over those a `loadbalancer_id` filter
/// rules out before rendering them (a listener or pool list per load balancer would render
/// every one in the cloud otherwise: at thousands of clusters, most of the simulator's time).
type Renderer = fn(&Cx<'_>, &[(String, String)]) -> Vec<(u64, Value)>;

/// A filtered, paginated list (`limit` + `marker`, `<key>_links` with a `next`).
fn list(
    world: &Cx<'_>,
    query: &[(String, String)],
    key: &str,
    href: &str,
    render: Renderer,
) -> Reply {
    let mut items = render(world, query);
    items.sort_by_key(|(seq, _)| *seq);
    let items: Vec<Value> = items
        .into_iter()
        .map(|(_, item)| item)
        .filter(|item| super::filters::matches(item, query))
        .collect();
    paginate(items, query, key, href, world.env.settings.octavia_page_max)
}

/// Whether a listener or pool of load balancer `lb` passes the query's `loadbalancer_id`
/// filters. Octavia takes `loadbalancer_id` as the filter on its `load_balancer_id` column
/// (`api/common/pagination.py`), which listeners and pools have though they show their load
/// balancer only in `loadbalancers`: filtered there, not ignored as an absent field is.
fn under_load_balancers(lb: &str, query: &[(String, String)]) -> bool {
    query
        .iter()
        .filter(|(key, _)| key == "loadbalancer_id")
        .all(|(_, id)| id == lb)
}

/// One page as Octavia 19 cuts it (`octavia/api/common/pagination.py`): `limit` defaults to
/// and is capped at `page_max` (`[api_settings] pagination_max_limit`, 1,000 unless a cloud
/// sets it; `infinite` or below 1: everything); a `next` link whenever
/// the page is full (so an exactly full last page is followed by an empty one), a `previous`
/// link when a marker was given; the links keep `limit` and the marker only, not the filters
/// or `fields`. Each repeated `fields` value names one attribute to keep; a comma-separated
/// value names none, so its objects come back empty, as the real API answers.
fn paginate(
    items: Vec<Value>,
    query: &[(String, String)],
    key: &str,
    href: &str,
    page_max: usize,
) -> Reply {
    let param = |name: &str| {
        query
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    let start = match param("marker") {
        Some(marker) => match items.iter().position(|i| i["id"] == marker) {
            Some(index) => index + 1,
            None => {
                return Reply::fault(
                    400,
                    format!("Supplied pagination marker '{marker}' is not valid."),
                );
            }
        },
        None => 0,
    };
    let limit = match param("limit") {
        None => Some(page_max),
        Some("infinite") => None,
        Some(limit) => match limit.parse::<i64>() {
            Ok(n) if n < 1 => None,
            Ok(n) => Some(usize::try_from(n).unwrap_or(usize::MAX).min(page_max)),
            Err(_) => {
                return Reply::fault(
                    400,
                    format!("Supplied pagination limit '{limit}' is not valid."),
                );
            }
        },
    };
    let page: Vec<Value> = items
        .iter()
        .skip(start)
        .take(limit.unwrap_or(usize::MAX))
        .map(|item| keep_fields(item, query))
        .collect();
    let page_size = limit.map_or_else(|| "None".to_owned(), |l| l.to_string());
    let id_at = |index: usize| items[index]["id"].as_str().unwrap_or_default().to_owned();
    let mut links = Vec::new();
    if !page.is_empty() {
        if param("marker").is_some() {
            let previous = format!(
                "{href}?limit={page_size}&marker={}&page_reverse=True",
                id_at(start)
            );
            links.push(json!({"rel": "previous", "href": previous}));
        }
        if limit.is_none_or(|limit| page.len() >= limit) {
            let next = format!(
                "{href}?limit={page_size}&marker={}",
                id_at(start + page.len() - 1)
            );
            links.push(json!({"rel": "next", "href": next}));
        }
    }
    Reply::ok(json!({ key: page, format!("{key}_links"): links }))
}

/// `item` with only the attributes the query's `fields` name (all of them without `fields`).
fn keep_fields(item: &Value, query: &[(String, String)]) -> Value {
    let fields: Vec<&str> = query
        .iter()
        .filter(|(k, _)| k == "fields")
        .map(|(_, v)| v.as_str())
        .collect();
    match item.as_object() {
        Some(object) if !fields.is_empty() => Value::Object(
            object
                .iter()
                .filter(|(k, _)| fields.contains(&k.as_str()))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        ),
        _ => item.clone(),
    }
}

// ---------------------------------------------------------------- transitions

/// Draws how the next transition of `kind` named `name` ends and when.
fn plan(
    world: &mut Cx<'_>,
    kind: ObjectKind,
    name: &str,
    default: super::faults::Delay,
    outcome: Outcome,
) -> Pending {
    let effect = world.env.scenario.take_effect(kind, name);
    let unit = world.env.unit();
    let (outcome, delay) = match effect {
        Some(Effect::Stuck) => return Pending { outcome, due: None },
        Some(Effect::Error) if outcome != Outcome::Gone => (Outcome::Error, default.sample(unit)),
        Some(Effect::Delay(delay)) => (outcome, delay.sample(unit)),
        _ => (outcome, default.sample(unit)),
    };
    Pending {
        outcome,
        due: Some(Instant::now() + delay),
    }
}

/// Locks the load balancer for a change: LB, its listeners and `pool` go PENDING_UPDATE, and
/// the LB's own transition (with the listener/pool/monitor being created) is planned.
fn lock_lb(world: &mut Cx<'_>, lb_id: &str, pool: Option<&str>, delay: super::faults::Delay) {
    let name = world
        .octavia
        .lbs
        .get(lb_id)
        .map(|lb| lb.meta.name.clone())
        .unwrap_or_default();
    let pending = plan(
        world,
        ObjectKind::Loadbalancer,
        &name,
        delay,
        Outcome::Active,
    );
    let now = world.env.timestamp();
    let octavia = &mut world.octavia;
    if let Some(lb) = octavia.lbs.get_mut(lb_id) {
        lb.meta.status = Prov::PendingUpdate;
        lb.meta.updated_at = Some(now.clone());
        lb.pending = Some(pending);
    }
    for listener in octavia.listeners.values_mut().filter(|l| l.lb == lb_id) {
        if listener.meta.status == Prov::Active {
            listener.meta.status = Prov::PendingUpdate;
        }
    }
    if let Some(pool) = pool.and_then(|p| octavia.pools.get_mut(p))
        && pool.meta.status == Prov::Active
    {
        pool.meta.status = Prov::PendingUpdate;
    }
    if let Some(due) = pending.due {
        world
            .env
            .schedule(due - Instant::now(), Timer::LoadBalancer(lb_id.to_owned()));
    }
}

/// With `lb_waits_for_members`: the latest time a member of the LB settles (a little after,
/// so the member goes first), if one is still on a timed transition.
fn member_still_settling(world: &Cx<'_>, lb_id: &str) -> Option<Instant> {
    if !world.env.scenario.timings.lb_waits_for_members {
        return None;
    }
    let now = Instant::now();
    world
        .octavia
        .members
        .values()
        .filter(|m| {
            world
                .octavia
                .pools
                .get(&m.pool)
                .is_some_and(|p| p.lb == lb_id)
        })
        .filter_map(|m| m.pending.and_then(|p| p.due))
        .max()
        .map(|due| due.max(now) + Duration::from_millis(1))
}

/// The LB's transition is due: it and its children settle together.
pub fn on_lb_timer(world: &mut Cx<'_>, lb_id: &str) {
    let Some(pending) = world.octavia.lbs.get(lb_id).and_then(|lb| lb.pending) else {
        return;
    };
    if pending.due.is_none_or(|due| due > Instant::now()) {
        return;
    }
    if let Some(member_due) = member_still_settling(world, lb_id) {
        if let Some(lb) = world.octavia.lbs.get_mut(lb_id) {
            lb.pending = Some(Pending {
                due: Some(member_due),
                ..pending
            });
        }
        world.env.schedule(
            member_due.saturating_duration_since(Instant::now()),
            Timer::LoadBalancer(lb_id.to_owned()),
        );
        return;
    }
    if pending.outcome == Outcome::Gone {
        remove_lb(world, lb_id);
        return;
    }
    let now = world.env.timestamp();
    let octavia = &mut world.octavia;
    let settled = match pending.outcome {
        Outcome::Error => Prov::Error,
        _ => Prov::Active,
    };
    if let Some(lb) = octavia.lbs.get_mut(lb_id) {
        lb.meta.status = settled;
        lb.meta.updated_at = Some(now);
        lb.pending = None;
    }
    let gone_listeners: Vec<String> = octavia
        .listeners
        .values()
        .filter(|l| l.lb == lb_id && l.meta.status == Prov::PendingDelete)
        .map(|l| l.meta.id.clone())
        .collect();
    let gone_pools: Vec<String> = octavia
        .pools
        .values()
        .filter(|p| p.lb == lb_id && p.meta.status == Prov::PendingDelete)
        .map(|p| p.meta.id.clone())
        .collect();
    let pool_ids: Vec<String> = octavia
        .pools
        .values()
        .filter(|p| p.lb == lb_id)
        .map(|p| p.meta.id.clone())
        .collect();
    let gone_monitors: Vec<String> = octavia
        .monitors
        .values()
        .filter(|h| pool_ids.contains(&h.pool) && h.meta.status == Prov::PendingDelete)
        .map(|h| h.meta.id.clone())
        .collect();
    for id in gone_listeners {
        octavia.listeners.remove(&id);
        for pool in octavia
            .pools
            .values_mut()
            .filter(|p| p.listener.as_deref() == Some(id.as_str()))
        {
            pool.listener = None;
        }
    }
    for id in gone_monitors {
        if let Some(monitor) = octavia.monitors.remove(&id)
            && let Some(pool) = octavia.pools.get_mut(&monitor.pool)
        {
            pool.healthmonitor = None;
            for member in octavia
                .pool_members
                .get(&monitor.pool)
                .into_iter()
                .flatten()
            {
                if let Some(member) = octavia.members.get_mut(member) {
                    member.unreported = Oper::NoMonitor;
                }
            }
        }
    }
    for id in gone_pools {
        octavia.pools.remove(&id);
        for member in octavia.pool_members.remove(&id).unwrap_or_default() {
            octavia.members.remove(&member);
        }
        for listener in octavia
            .listeners
            .values_mut()
            .filter(|l| l.default_pool_id.as_deref() == Some(id.as_str()))
        {
            listener.default_pool_id = None;
        }
    }
    octavia.prune_children(lb_id);
    let settle = |status: &mut Prov| {
        if matches!(*status, Prov::PendingCreate | Prov::PendingUpdate) {
            *status = settled;
        }
    };
    for listener in octavia.listeners.values_mut().filter(|l| l.lb == lb_id) {
        settle(&mut listener.meta.status);
    }
    for pool in octavia.pools.values_mut().filter(|p| p.lb == lb_id) {
        settle(&mut pool.meta.status);
    }
    for monitor in octavia
        .monitors
        .values_mut()
        .filter(|h| pool_ids.contains(&h.pool))
    {
        settle(&mut monitor.meta.status);
    }
}

fn remove_lb(world: &mut Cx<'_>, lb_id: &str) {
    let octavia = &mut world.octavia;
    let Some(lb) = octavia.lbs.remove(lb_id) else {
        return;
    };
    octavia.listeners.retain(|_, l| l.lb != lb_id);
    let pools: Vec<String> = octavia
        .pools
        .values()
        .filter(|p| p.lb == lb_id)
        .map(|p| p.meta.id.clone())
        .collect();
    for pool in &pools {
        octavia.pools.remove(pool);
        for member in octavia.pool_members.remove(pool).unwrap_or_default() {
            octavia.members.remove(&member);
        }
    }
    octavia.monitors.retain(|_, h| !pools.contains(&h.pool));
    octavia.children.remove(lb_id);
    world.others.release_port(&mut *world.env, &lb.vip_port_id);
}

/// A member's own transition is due.
pub fn on_member_timer(world: &mut Cx<'_>, id: &str) {
    let Some(member) = world.octavia.members.get(id) else {
        return;
    };
    let Some(pending) = member.pending else {
        return;
    };
    if pending.due.is_none_or(|due| due > Instant::now()) {
        return;
    }
    let pool = member.pool.clone();
    let has_monitor = world
        .octavia
        .pools
        .get(&pool)
        .is_some_and(|p| p.healthmonitor.is_some());
    let now = world.env.timestamp();
    match pending.outcome {
        Outcome::Gone => {
            world.octavia.members.remove(id);
            if let Some(ids) = world.octavia.pool_members.get_mut(&pool) {
                ids.retain(|m| m != id);
            }
        }
        outcome => {
            if let Some(member) = world.octavia.members.get_mut(id) {
                member.meta.status = if outcome == Outcome::Error {
                    Prov::Error
                } else {
                    Prov::Active
                };
                member.meta.updated_at = Some(now);
                member.pending = None;
                member.settled_at = pending.due;
            }
            if outcome == Outcome::Active && has_monitor && world.env.settings.heartbeats {
                let unit = world.env.unit();
                let delay = world.env.scenario.timings.member_online.sample(unit);
                world
                    .env
                    .schedule(delay, Timer::MemberOnline(id.to_owned()));
            }
        }
    }
}

pub fn on_member_online(world: &mut Cx<'_>, id: &str) {
    if let Some(member) = world.octavia.members.get_mut(id)
        && member.meta.status == Prov::Active
    {
        member.online = true;
        member.checked_at.get_or_insert_with(Instant::now);
    }
}

/// Objects whose `Stuck` rule is gone get a normal transition from now.
pub fn release_stuck(world: &mut Cx<'_>) {
    let held = |meta: &Meta, pending: Option<Pending>, kind| {
        pending
            .filter(|p| p.due.is_none())
            .map(|p| (kind, meta.id.clone(), meta.name.clone(), p.outcome))
    };
    let octavia = &world.octavia;
    let stuck: Vec<(ObjectKind, String, String, Outcome)> = octavia
        .members
        .values()
        .filter_map(|m| held(&m.meta, m.pending, ObjectKind::Member))
        .chain(
            octavia
                .lbs
                .values()
                .filter_map(|lb| held(&lb.meta, lb.pending, ObjectKind::Loadbalancer)),
        )
        .collect();
    for (kind, id, name, outcome) in stuck {
        if world.env.scenario.is_stuck(kind, &name) {
            continue;
        }
        let unit = world.env.unit();
        let timings = &world.env.scenario.timings;
        let (delay, timer) = match kind {
            ObjectKind::Member => (
                timings.member_update.sample(unit),
                Timer::Member(id.clone()),
            ),
            _ => (
                timings.lb_update.sample(unit),
                Timer::LoadBalancer(id.clone()),
            ),
        };
        let pending = Some(Pending {
            outcome,
            due: Some(Instant::now() + delay),
        });
        match kind {
            ObjectKind::Member => world
                .octavia
                .members
                .get_mut(&id)
                .map(|m| m.pending = pending),
            _ => world
                .octavia
                .lbs
                .get_mut(&id)
                .map(|lb| lb.pending = pending),
        };
        world.env.schedule(delay, timer);
    }
}

// ---------------------------------------------------------------- load balancers

fn create_lb(world: &mut Cx<'_>, body: &Value) -> Reply {
    if !body.is_object() {
        return Reply::fault(400, "Invalid input: missing loadbalancer object");
    }
    let provider = str_field(body, "provider").unwrap_or_else(|| "amphora".into());
    if !PROVIDERS.iter().any(|(name, _)| *name == provider) {
        return Reply::fault(400, format!("Provider '{provider}' is not enabled."));
    }
    if let Some(refused) = graph_refused(world, &provider, &body["listeners"]) {
        return refused;
    }
    let subnet = str_field(body, "vip_subnet_id");
    let network = str_field(body, "vip_network_id");
    if subnet.is_none() && network.is_none() && body.get("vip_port_id").is_none() {
        return Reply::fault(
            400,
            "Validation failure: VIP must contain one of: vip_port_id, vip_network_id, vip_subnet_id.",
        );
    }
    let (vip_port_id, vip_address, vip_network_id) = world.others.vip_port(
        &mut *world.env,
        network.as_deref(),
        subnet.as_deref(),
        str_field(body, "vip_address"),
    );
    let id = world.env.uuid();
    let now = world.env.timestamp();
    let meta = world.octavia.meta(id.clone(), body, now);
    let delay = world.env.scenario.timings.lb_create.clone();
    let pending = plan(
        world,
        ObjectKind::Loadbalancer,
        &meta.name,
        delay,
        Outcome::Active,
    );
    let lb = LoadBalancer {
        meta,
        provider,
        flavor_id: str_field(body, "flavor_id"),
        vip_address,
        vip_port_id,
        vip_subnet_id: subnet,
        vip_network_id,
        availability_zone: str_field(body, "availability_zone"),
        pending: Some(pending),
    };
    world.octavia.lbs.insert(id.clone(), lb);
    make_graph(world, &id, &body["listeners"]);
    let rendered = world.octavia.lbs.get(&id).map(|lb| render_lb(world, lb));
    if let Some(due) = pending.due {
        world
            .env
            .schedule(due - Instant::now(), Timer::LoadBalancer(id));
    }
    Reply::json(201, json!({"loadbalancer": rendered}))
}

/// Why Octavia would refuse a fully populated create's listeners (each with a
/// `default_pool`, and that pool's `healthmonitor`), before anything is made.
fn graph_refused(world: &Cx<'_>, provider: &str, listeners: &Value) -> Option<Reply> {
    let listeners = match listeners {
        Value::Null => return None,
        Value::Array(listeners) => listeners,
        other => return Some(invalid("listeners", other, "Value should be a list.")),
    };
    let mut ports = std::collections::BTreeSet::new();
    for listener in listeners {
        if let Some(refused) = cidrs_unknown(world, listener) {
            return Some(refused);
        }
        let port = listener["protocol_port"]
            .as_u64()
            .and_then(|p| u16::try_from(p).ok());
        let Some(port) = port.filter(|p| *p > 0) else {
            return Some(invalid(
                "protocol_port",
                &listener["protocol_port"],
                "Value should be between 1 and 65535.",
            ));
        };
        if !ports.insert(port) {
            return Some(Reply::fault(
                409,
                format!(
                    "Another Listener on this Load Balancer is already using protocol_port {port}"
                ),
            ));
        }
        let monitor = &listener["default_pool"]["healthmonitor"];
        if monitor.is_null() {
            continue;
        }
        if world
            .env
            .settings
            .providers_without_monitors
            .iter()
            .any(|p| p == provider)
        {
            // Octavia 19's call_provider: the driver's NotImplementedError is a 501, and the
            // records made for the request are rolled back.
            return Some(Reply::fault(
                501,
                format!(
                    "Provider '{provider}' does not support a requested action: This feature is not implemented by the provider."
                ),
            ));
        }
        if provider == "ovn" {
            // ovn-octavia-provider passes over the monitors of such a request (they would stay
            // PENDING_CREATE); capo-rs never sends one there, and this is not modelled.
            return Some(Reply::fault(
                400,
                "simulator: a health monitor in an ovn load balancer's create is not modelled",
            ));
        }
    }
    None
}

/// A fully populated create's listeners, their pools and monitors, under the new load
/// balancer `lb_id`: PENDING_CREATE until it settles, as the ones made one by one.
fn make_graph(world: &mut Cx<'_>, lb_id: &str, listeners: &Value) {
    for body in listeners.as_array().into_iter().flatten() {
        let port = body["protocol_port"]
            .as_u64()
            .and_then(|p| u16::try_from(p).ok());
        let listener_id = insert_listener(world, lb_id, port.unwrap_or_default(), body);
        let pool = &body["default_pool"];
        if pool.is_object() {
            let pool_id = make_graph_pool(world, lb_id, &listener_id, pool);
            if let Some(listener) = world.octavia.listeners.get_mut(&listener_id) {
                listener.default_pool_id = Some(pool_id);
            }
        }
    }
}

/// A new listener of `body`, PENDING_CREATE, under `lb_id`: its id.
fn insert_listener(world: &mut Cx<'_>, lb_id: &str, port: u16, body: &Value) -> String {
    let id = world.env.uuid();
    let now = world.env.timestamp();
    let listener = Listener {
        meta: world.octavia.meta(id.clone(), body, now),
        lb: lb_id.to_owned(),
        protocol: str_field(body, "protocol").unwrap_or_else(|| "TCP".into()),
        protocol_port: port,
        default_pool_id: str_field(body, "default_pool_id"),
        allowed_cidrs: body
            .get("allowed_cidrs")
            .filter(|v| v.is_array())
            .map(string_list),
        connection_limit: body["connection_limit"].as_i64().unwrap_or(-1),
    };
    world.octavia.listeners.insert(id.clone(), listener);
    world
        .octavia
        .children
        .entry(lb_id.to_owned())
        .or_default()
        .0
        .push(id.clone());
    id
}

/// A new pool of `body`, PENDING_CREATE, under `lb_id` (and `listener`): its id.
fn insert_pool(world: &mut Cx<'_>, lb_id: &str, listener: Option<String>, body: &Value) -> String {
    let id = world.env.uuid();
    let now = world.env.timestamp();
    let pool = Pool {
        meta: world.octavia.meta(id.clone(), body, now),
        lb: lb_id.to_owned(),
        listener,
        protocol: str_field(body, "protocol").unwrap_or_else(|| "TCP".into()),
        lb_algorithm: str_field(body, "lb_algorithm").unwrap_or_else(|| "ROUND_ROBIN".into()),
        healthmonitor: None,
    };
    world.octavia.pools.insert(id.clone(), pool);
    world
        .octavia
        .children
        .entry(lb_id.to_owned())
        .or_default()
        .1
        .push(id.clone());
    id
}

fn make_graph_pool(world: &mut Cx<'_>, lb_id: &str, listener_id: &str, body: &Value) -> String {
    let pool_id = insert_pool(world, lb_id, Some(listener_id.to_owned()), body);
    let monitor = &body["healthmonitor"];
    if monitor.is_object() {
        let monitor_id = world.env.uuid();
        let now = world.env.timestamp();
        let meta = world.octavia.meta(monitor_id.clone(), monitor, now);
        let made = monitor_of(monitor, meta, &pool_id);
        world.octavia.monitors.insert(monitor_id.clone(), made);
        if let Some(pool) = world.octavia.pools.get_mut(&pool_id) {
            pool.healthmonitor = Some(monitor_id);
        }
    }
    pool_id
}

/// The monitor `body` asks for, on `pool`, with Octavia's defaults.
fn monitor_of(body: &Value, meta: Meta, pool: &str) -> HealthMonitor {
    let number = |key: &str, default: u32| {
        body[key]
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .unwrap_or(default)
    };
    HealthMonitor {
        meta,
        pool: pool.to_owned(),
        kind: str_field(body, "type").unwrap_or_else(|| "TCP".into()),
        delay: number("delay", 5),
        timeout: number("timeout", 5),
        max_retries: number("max_retries", 3),
        max_retries_down: number("max_retries_down", 3),
        http_method: str_field(body, "http_method"),
        url_path: str_field(body, "url_path"),
        expected_codes: str_field(body, "expected_codes"),
    }
}

fn update_lb(world: &mut Cx<'_>, id: &str, body: &Value) -> Reply {
    let Some(lb) = world.octavia.lbs.get(id) else {
        return not_found("Load Balancer", id);
    };
    if lb.meta.status != Prov::Active {
        return immutable("Load Balancer", id);
    }
    let delay = world.env.scenario.timings.lb_update.clone();
    lock_lb(world, id, None, delay);
    if let Some(lb) = world.octavia.lbs.get_mut(id) {
        if let Some(name) = str_field(body, "name") {
            lb.meta.name = name;
        }
        if let Some(description) = str_field(body, "description") {
            lb.meta.description = description;
        }
        if body.get("tags").is_some() {
            lb.meta.tags = string_list(&body["tags"]);
        }
    }
    let rendered = world.octavia.lbs.get(id).map(|lb| render_lb(world, lb));
    Reply::ok(json!({"loadbalancer": rendered}))
}

fn delete_lb(world: &mut Cx<'_>, id: &str, query: &[(String, String)]) -> Reply {
    let Some(lb) = world.octavia.lbs.get(id) else {
        return not_found("Load Balancer", id);
    };
    if lb.meta.status.is_pending() {
        return immutable("Load Balancer", id);
    }
    let cascade = query.iter().any(|(k, v)| k == "cascade" && v == "true");
    let has_children = world.octavia.listeners.values().any(|l| l.lb == id)
        || world.octavia.pools.values().any(|p| p.lb == id);
    if has_children && !cascade {
        return Reply::fault(
            400,
            format!("Cannot delete Load Balancer {id} - it has children"),
        );
    }
    let name = lb.meta.name.clone();
    let delay = world.env.scenario.timings.lb_delete.clone();
    let mut pending = plan(world, ObjectKind::Loadbalancer, &name, delay, Outcome::Gone);
    pending.outcome = Outcome::Gone;
    let octavia = &mut world.octavia;
    if let Some(lb) = octavia.lbs.get_mut(id) {
        lb.meta.status = Prov::PendingDelete;
        lb.pending = Some(pending);
    }
    let pools: Vec<String> = octavia
        .pools
        .values()
        .filter(|p| p.lb == id)
        .map(|p| p.meta.id.clone())
        .collect();
    for listener in octavia.listeners.values_mut().filter(|l| l.lb == id) {
        listener.meta.status = Prov::PendingDelete;
    }
    for pool in &pools {
        if let Some(pool) = octavia.pools.get_mut(pool) {
            pool.meta.status = Prov::PendingDelete;
        }
        for member in octavia.pool_members.get(pool).cloned().unwrap_or_default() {
            if let Some(member) = octavia.members.get_mut(&member) {
                member.meta.status = Prov::PendingDelete;
                member.pending = None;
            }
        }
    }
    for monitor in octavia
        .monitors
        .values_mut()
        .filter(|h| pools.contains(&h.pool))
    {
        monitor.meta.status = Prov::PendingDelete;
    }
    if let Some(due) = pending.due {
        world
            .env
            .schedule(due - Instant::now(), Timer::LoadBalancer(id.to_owned()));
    }
    Reply::empty(204)
}

// ---------------------------------------------------------------- listeners, pools, monitors

/// Checks the LB accepts a change: it exists and is ACTIVE.
fn mutable_lb(world: &Cx<'_>, lb_id: &str) -> Result<(), Reply> {
    match world.octavia.lbs.get(lb_id) {
        None => Err(not_found("Load Balancer", lb_id)),
        Some(lb) if lb.meta.status != Prov::Active => Err(immutable("Load Balancer", lb_id)),
        Some(_) => Ok(()),
    }
}

/// An Octavia before API 2.12 has no `allowed_cidrs`: WSME refuses the attribute.
fn cidrs_unknown(world: &Cx<'_>, body: &Value) -> Option<Reply> {
    let known = world.env.settings.octavia_version >= (2, 12);
    (!known && body.get("allowed_cidrs").is_some()).then(|| {
        Reply::fault(
            400,
            "Invalid input for field/attribute listener. Value: 'allowed_cidrs'. Unknown attribute for argument listener: allowed_cidrs",
        )
    })
}

fn create_listener(world: &mut Cx<'_>, body: &Value) -> Reply {
    if let Some(refused) = cidrs_unknown(world, body) {
        return refused;
    }
    let Some(lb_id) = str_field(body, "loadbalancer_id") else {
        return Reply::fault(
            400,
            "Invalid input for field/attribute loadbalancer_id. Value: 'None'. Mandatory field missing.",
        );
    };
    let Some(port) = body["protocol_port"]
        .as_u64()
        .and_then(|p| u16::try_from(p).ok())
        .filter(|p| *p > 0)
    else {
        return invalid(
            "protocol_port",
            &body["protocol_port"],
            "Value should be between 1 and 65535.",
        );
    };
    if let Err(reply) = mutable_lb(world, &lb_id) {
        return reply;
    }
    if world
        .octavia
        .listeners
        .values()
        .any(|l| l.lb == lb_id && l.protocol_port == port)
    {
        return Reply::fault(
            409,
            format!("Another Listener on this Load Balancer is already using protocol_port {port}"),
        );
    }
    let id = insert_listener(world, &lb_id, port, body);
    let delay = world.env.scenario.timings.child_create.clone();
    lock_lb(world, &lb_id, None, delay);
    let rendered = world
        .octavia
        .listeners
        .get(&id)
        .map(|l| render_listener(world, l));
    Reply::json(201, json!({"listener": rendered}))
}

fn update_listener(world: &mut Cx<'_>, id: &str, body: &Value) -> Reply {
    if let Some(refused) = cidrs_unknown(world, body) {
        return refused;
    }
    let Some(lb_id) = world.octavia.listeners.get(id).map(|l| l.lb.clone()) else {
        return not_found("Listener", id);
    };
    if let Err(reply) = mutable_lb(world, &lb_id) {
        return reply;
    }
    let delay = world.env.scenario.timings.lb_update.clone();
    lock_lb(world, &lb_id, None, delay);
    let now = world.env.timestamp();
    if let Some(listener) = world.octavia.listeners.get_mut(id) {
        if body.get("allowed_cidrs").is_some() {
            listener.allowed_cidrs = body
                .get("allowed_cidrs")
                .filter(|v| v.is_array())
                .map(string_list);
        }
        if let Some(name) = str_field(body, "name") {
            listener.meta.name = name;
        }
        if let Some(pool) = str_field(body, "default_pool_id") {
            listener.default_pool_id = Some(pool);
        }
        listener.meta.updated_at = Some(now);
    }
    let rendered = world
        .octavia
        .listeners
        .get(id)
        .map(|l| render_listener(world, l));
    Reply::ok(json!({"listener": rendered}))
}

/// Timings of a health monitor change in place; the LB is locked while it applies.
fn update_monitor(world: &mut Cx<'_>, id: &str, body: &Value) -> Reply {
    let Some(pool) = world.octavia.monitors.get(id).map(|m| m.pool.clone()) else {
        return not_found("HealthMonitor", id);
    };
    // The real tier: a type cannot change in place (HealthMonitorPUT has no `type`).
    if body.get("type").is_some() {
        return Reply::fault(
            400,
            "Unknown attribute for argument health_monitor_.healthmonitor: type",
        );
    }
    let lb_id = match mutable_pool(world, &pool) {
        Ok(lb_id) => lb_id,
        Err(reply) => return reply,
    };
    let delay = world.env.scenario.timings.lb_update.clone();
    lock_lb(world, &lb_id, Some(&pool), delay);
    let now = world.env.timestamp();
    let number = |key: &str| {
        body.get(key)
            .and_then(Value::as_u64)
            .and_then(|v| u32::try_from(v).ok())
    };
    if let Some(monitor) = world.octavia.monitors.get_mut(id) {
        if let Some(v) = number("delay") {
            monitor.delay = v;
        }
        if let Some(v) = number("timeout") {
            monitor.timeout = v;
        }
        if let Some(v) = number("max_retries") {
            monitor.max_retries = v;
        }
        if let Some(v) = number("max_retries_down") {
            monitor.max_retries_down = v;
        }
        for (key, field) in [
            ("http_method", &mut monitor.http_method),
            ("url_path", &mut monitor.url_path),
            ("expected_codes", &mut monitor.expected_codes),
        ] {
            if let Some(v) = str_field(body, key) {
                *field = Some(v);
            }
        }
        monitor.meta.updated_at = Some(now);
    }
    let rendered = world
        .octavia
        .monitors
        .get(id)
        .map(|m| render_monitor(world, m));
    Reply::ok(json!({"healthmonitor": rendered}))
}

fn create_pool(world: &mut Cx<'_>, body: &Value) -> Reply {
    let listener_id = str_field(body, "listener_id");
    let lb_id = match (&listener_id, str_field(body, "loadbalancer_id")) {
        (Some(listener), _) => match world.octavia.listeners.get(listener) {
            Some(l) => l.lb.clone(),
            None => return not_found("Listener", listener),
        },
        (None, Some(lb)) => lb,
        (None, None) => {
            return Reply::fault(
                400,
                "Validation failure: Either listener_id or loadbalancer_id must be specified.",
            );
        }
    };
    if let Err(reply) = mutable_lb(world, &lb_id) {
        return reply;
    }
    let id = insert_pool(world, &lb_id, listener_id.clone(), body);
    if let Some(listener) = listener_id.and_then(|l| world.octavia.listeners.get_mut(&l))
        && listener.default_pool_id.is_none()
    {
        listener.default_pool_id = Some(id.clone());
    }
    let delay = world.env.scenario.timings.child_create.clone();
    lock_lb(world, &lb_id, None, delay);
    let rendered = world.octavia.pools.get(&id).map(|p| render_pool(world, p));
    Reply::json(201, json!({"pool": rendered}))
}

fn create_monitor(world: &mut Cx<'_>, body: &Value) -> Reply {
    let Some(pool_id) = str_field(body, "pool_id") else {
        return Reply::fault(
            400,
            "Invalid input for field/attribute pool_id. Value: 'None'. Mandatory field missing.",
        );
    };
    let Some(pool) = world.octavia.pools.get(&pool_id) else {
        return not_found("Pool", &pool_id);
    };
    if pool.healthmonitor.is_some() {
        return Reply::fault(409, "This pool already has a health monitor");
    }
    let lb_id = pool.lb.clone();
    let kind = str_field(body, "type").unwrap_or_else(|| "TCP".into());
    let provider = world
        .octavia
        .lbs
        .get(&lb_id)
        .map(|lb| lb.provider.clone())
        .unwrap_or_default();
    if world
        .env
        .settings
        .providers_without_monitors
        .contains(&provider)
    {
        // Octavia 19's octavia/api/drivers/utils.py (call_provider): a driver's
        // NotImplementedError without a user message becomes ProviderNotImplementedError, 501.
        return Reply::fault(
            501,
            format!(
                "Provider '{provider}' does not support a requested action: This feature is not implemented by the provider."
            ),
        );
    }
    let ovn = provider == "ovn";
    if ovn && !matches!(kind.as_str(), "TCP" | "UDP-CONNECT") {
        // ovn-octavia-provider's driver.py (_validate_hm_support), as Octavia returns it.
        return Reply::fault(
            501,
            format!(
                "Provider 'ovn' does not support a requested option: OVN provider does not support {kind} health monitor type. Supported types: UDP-CONNECT, TCP"
            ),
        );
    }
    if let Err(reply) = mutable_lb(world, &lb_id) {
        return reply;
    }
    let id = world.env.uuid();
    let now = world.env.timestamp();
    let meta = world.octavia.meta(id.clone(), body, now);
    let monitor = HealthMonitor {
        kind,
        ..monitor_of(body, meta, &pool_id)
    };
    world.octavia.monitors.insert(id.clone(), monitor);
    if let Some(pool) = world.octavia.pools.get_mut(&pool_id) {
        pool.healthmonitor = Some(id.clone());
    }
    // Members already ACTIVE start answering the new monitor after a while.
    if world.env.settings.heartbeats {
        for member in world.octavia.members_of(&pool_id).to_vec() {
            let unit = world.env.unit();
            let delay = world.env.scenario.timings.member_online.sample(unit);
            world.env.schedule(delay, Timer::MemberOnline(member));
        }
    }
    let delay = world.env.scenario.timings.child_create.clone();
    lock_lb(world, &lb_id, Some(&pool_id), delay);
    let rendered = world
        .octavia
        .monitors
        .get(&id)
        .map(|h| render_monitor(world, h));
    Reply::json(201, json!({"healthmonitor": rendered}))
}

#[derive(Clone, Copy)]
enum Child {
    Listener,
    Pool,
    Monitor,
}

fn delete_child(world: &mut Cx<'_>, child: Child, id: &str) -> Reply {
    let octavia = &world.octavia;
    let (lb_id, pool, kind) = match child {
        Child::Listener => (
            octavia.listeners.get(id).map(|l| l.lb.clone()),
            None,
            "Listener",
        ),
        Child::Pool => (
            octavia.pools.get(id).map(|p| p.lb.clone()),
            Some(id.to_owned()),
            "Pool",
        ),
        Child::Monitor => {
            let pool = octavia.monitors.get(id).map(|h| h.pool.clone());
            (
                pool.as_ref()
                    .and_then(|p| octavia.pools.get(p))
                    .map(|p| p.lb.clone()),
                pool,
                "Health Monitor",
            )
        }
    };
    let Some(lb_id) = lb_id else {
        return not_found(kind, id);
    };
    if let Err(reply) = mutable_lb(world, &lb_id) {
        return reply;
    }
    let delay = world.env.scenario.timings.lb_update.clone();
    lock_lb(world, &lb_id, pool.as_deref(), delay);
    let octavia = &mut world.octavia;
    let status = match child {
        Child::Listener => octavia.listeners.get_mut(id).map(|l| &mut l.meta.status),
        Child::Pool => octavia.pools.get_mut(id).map(|p| &mut p.meta.status),
        Child::Monitor => octavia.monitors.get_mut(id).map(|h| &mut h.meta.status),
    };
    if let Some(status) = status {
        *status = Prov::PendingDelete;
    }
    if let Child::Pool = child {
        for member in octavia.pool_members.get(id).cloned().unwrap_or_default() {
            if let Some(member) = octavia.members.get_mut(&member) {
                member.meta.status = Prov::PendingDelete;
                member.pending = None;
            }
        }
    }
    Reply::empty(204)
}

// ---------------------------------------------------------------- members

/// Member changes need the pool, then its load balancer, out of PENDING_*.
fn mutable_pool(world: &Cx<'_>, pool_id: &str) -> Result<String, Reply> {
    let Some(pool) = world.octavia.pools.get(pool_id) else {
        return Err(Reply::pecan_not_found(format!("Pool {pool_id} not found.")));
    };
    if pool.meta.status.is_pending() {
        return Err(immutable("Pool", pool_id));
    }
    mutable_lb(world, &pool.lb)?;
    Ok(pool.lb.clone())
}

fn list_members(world: &Cx<'_>, pool_id: &str, query: &[(String, String)], base: &str) -> Reply {
    if !world.octavia.pools.contains_key(pool_id) {
        return Reply::pecan_not_found(format!("Pool {pool_id} not found."));
    }
    let items: Vec<Value> = world
        .octavia
        .members_of(pool_id)
        .iter()
        .filter_map(|id| world.octavia.members.get(id))
        .map(|m| render_member(world, m))
        .filter(|m| super::filters::matches(m, query))
        .collect();
    let href = format!("{base}/load-balancer/v2/lbaas/pools/{pool_id}/members");
    paginate(
        items,
        query,
        "members",
        &href,
        world.env.settings.octavia_page_max,
    )
}

fn get_member(world: &Cx<'_>, pool_id: &str, id: &str) -> Reply {
    match world.octavia.members.get(id).filter(|m| m.pool == pool_id) {
        Some(member) => Reply::ok(json!({"member": render_member(world, member)})),
        None => not_found("Member", id),
    }
}

fn parse_member(body: &Value) -> Result<(String, u16), Reply> {
    let address = &body["address"];
    let Some(text) = address.as_str().filter(|a| a.parse::<IpAddr>().is_ok()) else {
        return Err(invalid(
            "address",
            address,
            "Value should be IPv4 or IPv6 format",
        ));
    };
    let port = &body["protocol_port"];
    let Some(port) = port
        .as_u64()
        .and_then(|p| u16::try_from(p).ok())
        .filter(|p| *p > 0)
    else {
        return Err(invalid(
            "protocol_port",
            port,
            "Value should be between 1 and 65535.",
        ));
    };
    Ok((text.to_owned(), port))
}

fn new_member(
    world: &mut Cx<'_>,
    pool_id: &str,
    body: &Value,
    address: String,
    port: u16,
) -> Member {
    let id = world.env.uuid();
    let now = world.env.timestamp();
    let meta = world.octavia.meta(id, body, now);
    let monitored = world
        .octavia
        .pools
        .get(pool_id)
        .is_some_and(|p| p.healthmonitor.is_some());
    let admin_state_up = body["admin_state_up"].as_bool().unwrap_or(true);
    Member {
        meta,
        pool: pool_id.to_owned(),
        address,
        protocol_port: port,
        weight: body["weight"]
            .as_u64()
            .and_then(|w| u32::try_from(w).ok())
            .unwrap_or(1),
        backup: body["backup"].as_bool().unwrap_or(false),
        admin_state_up,
        subnet_id: str_field(body, "subnet_id"),
        monitor_address: str_field(body, "monitor_address"),
        monitor_port: body["monitor_port"]
            .as_u64()
            .and_then(|p| u16::try_from(p).ok()),
        pending: None,
        online: false,
        checked_at: None,
        unreported: if monitored || !admin_state_up {
            Oper::Offline
        } else {
            Oper::NoMonitor
        },
        settled_at: None,
    }
}

fn start_member(world: &mut Cx<'_>, id: &str, default: super::faults::Delay, outcome: Outcome) {
    let Some(name) = world.octavia.members.get(id).map(|m| m.meta.name.clone()) else {
        return;
    };
    let pending = plan(world, ObjectKind::Member, &name, default, outcome);
    if let Some(member) = world.octavia.members.get_mut(id) {
        member.pending = Some(pending);
    }
    if let Some(due) = pending.due {
        world
            .env
            .schedule(due - Instant::now(), Timer::Member(id.to_owned()));
    }
}

fn create_member(world: &mut Cx<'_>, pool_id: &str, body: &Value) -> Reply {
    let lb_id = match mutable_pool(world, pool_id) {
        Ok(lb) => lb,
        Err(reply) => return reply,
    };
    let (address, port) = match parse_member(body) {
        Ok(parsed) => parsed,
        Err(reply) => return reply,
    };
    let duplicate = world
        .octavia
        .members_of(pool_id)
        .iter()
        .filter_map(|m| world.octavia.members.get(m))
        .any(|m| m.address == address && m.protocol_port == port);
    if duplicate {
        return Reply::fault(
            409,
            format!(
                "Another member on this pool is already using ip {address} on protocol_port {port}"
            ),
        );
    }
    let member = new_member(world, pool_id, body, address, port);
    let id = member.meta.id.clone();
    world.octavia.members.insert(id.clone(), member);
    world
        .octavia
        .pool_members
        .entry(pool_id.to_owned())
        .or_default()
        .push(id.clone());
    let delay = world.env.scenario.timings.lb_update.clone();
    lock_lb(world, &lb_id, Some(pool_id), delay);
    let delay = world.env.scenario.timings.member_create.clone();
    start_member(world, &id, delay, Outcome::Active);
    let rendered = world
        .octavia
        .members
        .get(&id)
        .map(|m| render_member(world, m));
    Reply::json(201, json!({"member": rendered}))
}

fn update_member(world: &mut Cx<'_>, pool_id: &str, id: &str, body: &Value) -> Reply {
    if world
        .octavia
        .members
        .get(id)
        .is_none_or(|m| m.pool != pool_id)
    {
        return not_found("Member", id);
    }
    let lb_id = match mutable_pool(world, pool_id) {
        Ok(lb) => lb,
        Err(reply) => return reply,
    };
    let now = world.env.timestamp();
    if let Some(member) = world.octavia.members.get_mut(id) {
        if let Some(weight) = body["weight"].as_u64().and_then(|w| u32::try_from(w).ok()) {
            member.weight = weight;
        }
        if let Some(up) = body["admin_state_up"].as_bool() {
            member.admin_state_up = up;
        }
        if let Some(name) = str_field(body, "name") {
            member.meta.name = name;
        }
        member.meta.status = Prov::PendingUpdate;
        member.meta.updated_at = Some(now);
    }
    let delay = world.env.scenario.timings.lb_update.clone();
    lock_lb(world, &lb_id, Some(pool_id), delay);
    let delay = world.env.scenario.timings.member_update.clone();
    start_member(world, id, delay, Outcome::Active);
    let rendered = world
        .octavia
        .members
        .get(id)
        .map(|m| render_member(world, m));
    Reply::ok(json!({"member": rendered}))
}

fn delete_member(world: &mut Cx<'_>, pool_id: &str, id: &str) -> Reply {
    if world
        .octavia
        .members
        .get(id)
        .is_none_or(|m| m.pool != pool_id)
    {
        return not_found("Member", id);
    }
    let lb_id = match mutable_pool(world, pool_id) {
        Ok(lb) => lb,
        Err(reply) => return reply,
    };
    if let Some(member) = world.octavia.members.get_mut(id) {
        member.meta.status = Prov::PendingDelete;
    }
    let delay = world.env.scenario.timings.lb_update.clone();
    lock_lb(world, &lb_id, Some(pool_id), delay);
    let delay = world.env.scenario.timings.member_delete.clone();
    start_member(world, id, delay, Outcome::Gone);
    Reply::empty(204)
}

/// `PUT /pools/{id}/members`: the listed members become the pool's members. Every listed member
/// goes PENDING_*; one failure sends the whole batch to ERROR, as Octavia does.
fn batch_members(world: &mut Cx<'_>, pool_id: &str, members: &Value) -> Reply {
    let lb_id = match mutable_pool(world, pool_id) {
        Ok(lb) => lb,
        Err(reply) => return reply,
    };
    let Some(listed) = members.as_array() else {
        return Reply::fault(
            400,
            "Invalid input for field/attribute members. Value: 'None'. Mandatory field missing.",
        );
    };
    let mut wanted = Vec::new();
    for body in listed {
        match parse_member(body) {
            Ok(parsed) => wanted.push((body, parsed)),
            Err(reply) => return reply,
        }
    }
    let existing: BTreeMap<(String, u16), String> = world
        .octavia
        .members_of(pool_id)
        .iter()
        .filter_map(|id| world.octavia.members.get(id))
        .map(|m| ((m.address.clone(), m.protocol_port), m.meta.id.clone()))
        .collect();
    let mut touched: Vec<(String, Outcome)> = Vec::new();
    let now = world.env.timestamp();
    for (body, (address, port)) in wanted.iter().cloned() {
        match existing.get(&(address.clone(), port)) {
            Some(id) => {
                if let Some(member) = world.octavia.members.get_mut(id) {
                    member.meta.status = Prov::PendingUpdate;
                    member.meta.updated_at = Some(now.clone());
                    if let Some(weight) =
                        body["weight"].as_u64().and_then(|w| u32::try_from(w).ok())
                    {
                        member.weight = weight;
                    }
                }
                touched.push((id.clone(), Outcome::Active));
            }
            None => {
                let member = new_member(world, pool_id, body, address, port);
                let id = member.meta.id.clone();
                world.octavia.members.insert(id.clone(), member);
                world
                    .octavia
                    .pool_members
                    .entry(pool_id.to_owned())
                    .or_default()
                    .push(id.clone());
                touched.push((id, Outcome::Active));
            }
        }
    }
    let kept: Vec<(String, u16)> = wanted.iter().map(|(_, key)| key.clone()).collect();
    for (key, id) in &existing {
        if !kept.contains(key) {
            if let Some(member) = world.octavia.members.get_mut(id) {
                member.meta.status = Prov::PendingDelete;
            }
            touched.push((id.clone(), Outcome::Gone));
        }
    }
    let names: Vec<String> = touched
        .iter()
        .filter_map(|(id, _)| world.octavia.members.get(id))
        .map(|m| m.meta.name.clone())
        .collect();
    let failed = names.iter().any(|name| {
        matches!(
            world.env.scenario.take_effect(ObjectKind::Member, name),
            Some(Effect::Error)
        )
    });
    let unit = world.env.unit();
    let delay = world.env.scenario.timings.member_update.sample(unit);
    let due = Some(Instant::now() + delay);
    for (id, outcome) in &touched {
        let outcome = if failed { Outcome::Error } else { *outcome };
        if let Some(member) = world.octavia.members.get_mut(id) {
            member.pending = Some(Pending { outcome, due });
        }
        world.env.schedule(delay, Timer::Member(id.clone()));
    }
    let lb_delay = world.env.scenario.timings.lb_update.clone();
    lock_lb(world, &lb_id, Some(pool_id), lb_delay);
    Reply::empty(202)
}

// ---------------------------------------------------------------- operating status

/// What Octavia's API shows as a member's operating status now.
pub(crate) fn member_operating(world: &Cx<'_>, member: &Member) -> Oper {
    if let Some(status) = member.meta.operating_override {
        return status;
    }
    let pool = world.octavia.pools.get(&member.pool);
    let monitor = pool
        .and_then(|p| p.healthmonitor.as_ref())
        .and_then(|id| world.octavia.monitors.get(id));
    let ovn = pool.is_some_and(|p| on_ovn(world, p));
    if !world.env.settings.heartbeats {
        return member.unreported;
    }
    match (monitor, member.admin_state_up) {
        (_, false) => Oper::Offline,
        (None, true) => Oper::NoMonitor,
        // ovn reports a new member ONLINE at once, before any check (helper.py,
        // member_create); an amphora's API row says OFFLINE until a heartbeat.
        (Some(_), true) if !member.online => {
            if ovn {
                Oper::Online
            } else {
                Oper::Offline
            }
        }
        (Some(monitor), true) => {
            let server = world
                .octavia
                .api_servers
                .get(&member.address)
                .or_else(|| {
                    world
                        .octavia
                        .api_servers_by_member
                        .iter()
                        .rev()
                        .find(|(glob, _)| super::faults::glob_match(glob, &member.meta.name))
                        .map(|(_, server)| server)
                })
                .or_else(|| world.octavia.api_servers.get("*"))
                .copied()
                .unwrap_or_default();
            let checked_for = member.checked_at.map(|at| at.elapsed()).unwrap_or_default();
            match (
                server.passes(&monitor.kind, Cadence::of(monitor), checked_for),
                ovn,
            ) {
                // haproxy shows an UP server at weight 0 as DRAIN; ovn ignores weights.
                (true, false) if member.weight == 0 => Oper::Draining,
                (true, _) => Oper::Online,
                // haproxy DOWN and ovn's "offline" both read ERROR.
                (false, _) => Oper::Error,
            }
        }
    }
}

/// The worst of the parts, as an amphora's health manager reports it.
fn aggregate(parts: impl Iterator<Item = Oper>) -> Oper {
    let parts: Vec<Oper> = parts.collect();
    if parts.is_empty() {
        return Oper::Online;
    }
    let healthy = |o: &Oper| matches!(o, Oper::Online | Oper::NoMonitor);
    if parts.iter().all(healthy) {
        Oper::Online
    } else if parts.iter().all(|o| *o == Oper::Error) {
        Oper::Error
    } else {
        Oper::Degraded
    }
}

fn pool_operating(world: &Cx<'_>, pool: &Pool) -> Oper {
    if let Some(status) = pool.meta.operating_override {
        return status;
    }
    if !world.env.settings.heartbeats || pool.meta.status == Prov::PendingCreate {
        return Oper::Offline;
    }
    let members = world
        .octavia
        .members_of(&pool.meta.id)
        .iter()
        .filter_map(|id| world.octavia.members.get(id))
        .filter(|m| !m.meta.status.is_pending())
        .map(|m| match m.meta.status {
            Prov::Error => (Oper::Error, m.weight),
            _ => (member_operating(world, m), m.weight),
        });
    if on_ovn(world, pool) {
        aggregate(members.map(|(status, _)| status))
    } else {
        haproxy_pool(members)
    }
}

/// Whether the pool's load balancer runs on the ovn provider (else an amphora's haproxy).
fn on_ovn(world: &Cx<'_>, pool: &Pool) -> bool {
    world
        .octavia
        .lbs
        .get(&pool.lb)
        .is_some_and(|lb| lb.provider == "ovn")
}

/// A pool's operating status as an amphora's health manager writes it (update_db.py,
/// `_process_pool_status`): haproxy calls a backend DOWN when it has servers but no weight
/// among the UP ones (a DRAIN server, at weight 0, takes nothing), and the pool is ERROR
/// then; an UP backend is ONLINE, DEGRADED if a member is DOWN. DRAINING and OFFLINE members
/// degrade nothing.
fn haproxy_pool(members: impl Iterator<Item = (Oper, u32)>) -> Oper {
    let (mut any, mut serving_weight, mut any_down) = (false, 0u64, false);
    for (status, weight) in members {
        any = true;
        match status {
            Oper::Online | Oper::NoMonitor => serving_weight += u64::from(weight),
            Oper::Error => any_down = true,
            _ => {}
        }
    }
    match (any, serving_weight > 0, any_down) {
        (false, _, _) => Oper::Online,
        (true, false, _) => Oper::Error,
        (true, true, true) => Oper::Degraded,
        (true, true, false) => Oper::Online,
    }
}

fn listener_operating(world: &Cx<'_>, listener: &Listener) -> Oper {
    if let Some(status) = listener.meta.operating_override {
        return status;
    }
    if !world.env.settings.heartbeats || listener.meta.status == Prov::PendingCreate {
        return Oper::Offline;
    }
    aggregate(
        world
            .octavia
            .pools_of(&listener.lb)
            .into_iter()
            .filter(|p| {
                p.listener.as_deref() == Some(listener.meta.id.as_str())
                    || listener.default_pool_id.as_deref() == Some(p.meta.id.as_str())
            })
            .map(|p| pool_operating(world, p)),
    )
}

fn lb_operating(world: &Cx<'_>, lb: &LoadBalancer) -> Oper {
    if let Some(status) = lb.meta.operating_override {
        return status;
    }
    if !world.env.settings.heartbeats || lb.meta.status == Prov::PendingCreate {
        return Oper::Offline;
    }
    aggregate(
        world
            .octavia
            .listeners_of(&lb.meta.id)
            .into_iter()
            .map(|l| listener_operating(world, l)),
    )
}

/// `/_sim/operating-status`: pins an object's operating status (or unpins it with `None`).
pub fn set_operating(world: &mut Cx<'_>, id_or_name: &str, status: Option<Oper>) -> bool {
    let octavia = &mut world.octavia;
    let matches = |meta: &Meta| meta.id == id_or_name || meta.name == id_or_name;
    let mut found = false;
    let metas = octavia
        .lbs
        .values_mut()
        .map(|o| &mut o.meta)
        .chain(octavia.listeners.values_mut().map(|o| &mut o.meta))
        .chain(octavia.pools.values_mut().map(|o| &mut o.meta))
        .chain(octavia.members.values_mut().map(|o| &mut o.meta));
    for meta in metas {
        if matches(meta) {
            meta.operating_override = status;
            found = true;
        }
    }
    found
}

// ---------------------------------------------------------------- rendering

fn ids(ids: impl Iterator<Item = String>) -> Value {
    Value::Array(ids.map(|id| json!({"id": id})).collect())
}

fn render_lb(world: &Cx<'_>, lb: &LoadBalancer) -> Value {
    let project = &world.env.settings.project_id;
    json!({
        "id": lb.meta.id, "name": lb.meta.name, "description": lb.meta.description,
        "provisioning_status": lb.meta.status.as_str(),
        "operating_status": lb_operating(world, lb).as_str(),
        "admin_state_up": true, "project_id": project,
        "created_at": lb.meta.created_at, "updated_at": lb.meta.updated_at,
        "vip_address": lb.vip_address, "vip_port_id": lb.vip_port_id,
        "vip_subnet_id": lb.vip_subnet_id, "vip_network_id": lb.vip_network_id,
        "vip_sg_ids": [], "additional_vips": [],
        "listeners": ids(world.octavia.listeners_of(&lb.meta.id).into_iter().map(|l| l.meta.id.clone())),
        "pools": ids(world.octavia.pools_of(&lb.meta.id).into_iter().map(|p| p.meta.id.clone())),
        "provider": lb.provider, "flavor_id": lb.flavor_id, "vip_qos_policy_id": null,
        "tags": lb.meta.tags, "availability_zone": lb.availability_zone,
        "vip_vnic_type": "normal", "tenant_id": project,
    })
}

/// The attributes [`render_lb_rows`] renders.
const ROW_FIELDS: [&str; 5] = [
    "id",
    "name",
    "provisioning_status",
    "operating_status",
    "updated_at",
];

/// A list that names `fields`, all among [`ROW_FIELDS`], and filters on nothing: what it
/// answers needs only those (a sweep of 1,000 LBs in-process would otherwise render every
/// attribute of each, and the benchmarks share a thread with the simulator).
fn only_row_fields(query: &[(String, String)]) -> bool {
    let mut fields = query.iter().filter(|(k, _)| k == "fields").peekable();
    fields.peek().is_some()
        && fields.all(|(_, v)| ROW_FIELDS.contains(&v.as_str()))
        && query
            .iter()
            .all(|(k, _)| matches!(k.as_str(), "fields" | "limit" | "marker"))
}

/// Load balancers with only the attributes [`ROW_FIELDS`] names.
fn render_lb_rows(world: &Cx<'_>, _query: &[(String, String)]) -> Vec<(u64, Value)> {
    world
        .octavia
        .lbs
        .values()
        .map(|lb| {
            let row = json!({
                "id": lb.meta.id, "name": lb.meta.name,
                "provisioning_status": lb.meta.status.as_str(),
                "operating_status": lb_operating(world, lb).as_str(),
                "updated_at": lb.meta.updated_at,
            });
            (lb.meta.seq, row)
        })
        .collect()
}

fn render_lbs(world: &Cx<'_>, _query: &[(String, String)]) -> Vec<(u64, Value)> {
    world
        .octavia
        .lbs
        .values()
        .map(|lb| (lb.meta.seq, render_lb(world, lb)))
        .collect()
}

fn render_listener(world: &Cx<'_>, listener: &Listener) -> Value {
    let project = &world.env.settings.project_id;
    json!({
        "id": listener.meta.id, "name": listener.meta.name, "description": listener.meta.description,
        "provisioning_status": listener.meta.status.as_str(),
        "operating_status": listener_operating(world, listener).as_str(),
        "admin_state_up": true, "protocol": listener.protocol, "protocol_port": listener.protocol_port,
        "connection_limit": listener.connection_limit, "default_tls_container_ref": null,
        "sni_container_refs": [], "project_id": project, "default_pool_id": listener.default_pool_id,
        "l7policies": [], "insert_headers": {}, "created_at": listener.meta.created_at,
        "updated_at": listener.meta.updated_at, "loadbalancers": [{"id": listener.lb}],
        "timeout_client_data": 50000, "timeout_member_connect": 5000, "timeout_member_data": 50000,
        "timeout_tcp_inspect": 0, "tags": listener.meta.tags, "client_ca_tls_container_ref": null,
        "client_authentication": "NONE", "client_crl_container_ref": null,
        "allowed_cidrs": listener.allowed_cidrs, "tls_ciphers": null, "tls_versions": null,
        "alpn_protocols": null, "hsts_max_age": null, "hsts_include_subdomains": null,
        "hsts_preload": null, "tenant_id": project,
    })
}

fn render_listeners(world: &Cx<'_>, query: &[(String, String)]) -> Vec<(u64, Value)> {
    world
        .octavia
        .listeners
        .values()
        .filter(|l| under_load_balancers(&l.lb, query))
        .map(|l| (l.meta.seq, render_listener(world, l)))
        .collect()
}

fn render_pool(world: &Cx<'_>, pool: &Pool) -> Value {
    let project = &world.env.settings.project_id;
    let listeners = ids(world
        .octavia
        .listeners_of(&pool.lb)
        .into_iter()
        .filter(|l| {
            pool.listener.as_deref() == Some(l.meta.id.as_str())
                || l.default_pool_id.as_deref() == Some(pool.meta.id.as_str())
        })
        .map(|l| l.meta.id.clone()));
    let mut rendered = json!({
        "id": pool.meta.id, "name": pool.meta.name, "description": pool.meta.description,
        "provisioning_status": pool.meta.status.as_str(),
        "operating_status": pool_operating(world, pool).as_str(),
        "admin_state_up": true, "protocol": pool.protocol, "lb_algorithm": pool.lb_algorithm,
        "session_persistence": null, "project_id": project,
        "loadbalancers": [{"id": pool.lb}], "listeners": listeners,
        "created_at": pool.meta.created_at, "updated_at": pool.meta.updated_at,
        "members": ids(world.octavia.members_of(&pool.meta.id).iter().cloned()),
        "tags": pool.meta.tags, "tls_container_ref": null, "ca_tls_container_ref": null,
        "crl_container_ref": null, "tls_enabled": false, "tls_ciphers": null, "tls_versions": null,
        "alpn_protocols": null, "tenant_id": project,
    });
    if let Some(monitor) = &pool.healthmonitor {
        rendered["healthmonitor_id"] = json!(monitor);
    }
    rendered
}

fn render_pools(world: &Cx<'_>, query: &[(String, String)]) -> Vec<(u64, Value)> {
    world
        .octavia
        .pools
        .values()
        .filter(|p| under_load_balancers(&p.lb, query))
        .map(|p| (p.meta.seq, render_pool(world, p)))
        .collect()
}

fn render_monitor(world: &Cx<'_>, monitor: &HealthMonitor) -> Value {
    let project = &world.env.settings.project_id;
    let operating = if world.env.settings.heartbeats && monitor.meta.status == Prov::Active {
        Oper::Online
    } else {
        Oper::Offline
    };
    json!({
        "id": monitor.meta.id, "name": monitor.meta.name, "type": monitor.kind,
        "delay": monitor.delay, "timeout": monitor.timeout, "max_retries": monitor.max_retries,
        "max_retries_down": monitor.max_retries_down, "http_method": monitor.http_method,
        "url_path": monitor.url_path, "expected_codes": monitor.expected_codes,
        "admin_state_up": true, "project_id": project, "pools": [{"id": monitor.pool}],
        "provisioning_status": monitor.meta.status.as_str(), "operating_status": operating.as_str(),
        "created_at": monitor.meta.created_at, "updated_at": monitor.meta.updated_at,
        "tags": monitor.meta.tags, "http_version": null, "domain_name": null, "tenant_id": project,
    })
}

fn render_monitors(world: &Cx<'_>, _query: &[(String, String)]) -> Vec<(u64, Value)> {
    world
        .octavia
        .monitors
        .values()
        .map(|h| (h.meta.seq, render_monitor(world, h)))
        .collect()
}

fn render_member(world: &Cx<'_>, member: &Member) -> Value {
    let project = &world.env.settings.project_id;
    json!({
        "id": member.meta.id, "name": member.meta.name,
        "operating_status": member_operating(world, member).as_str(),
        "provisioning_status": member.meta.status.as_str(),
        "admin_state_up": member.admin_state_up, "address": member.address,
        "protocol_port": member.protocol_port, "weight": member.weight, "backup": member.backup,
        "subnet_id": member.subnet_id, "project_id": project,
        "created_at": member.meta.created_at, "updated_at": member.meta.updated_at,
        "monitor_address": member.monitor_address, "monitor_port": member.monitor_port,
        "tags": member.meta.tags, "vnic_type": "normal", "tenant_id": project,
    })
}

/// `GET /loadbalancers/{id}/status`.
fn status_tree(world: &Cx<'_>, id: &str) -> Reply {
    let Some(lb) = world.octavia.lbs.get(id) else {
        return not_found("Load Balancer", id);
    };
    let octavia = &world.octavia;
    let listeners: Vec<Value> = octavia
        .listeners_of(id)
        .into_iter()
        .map(|listener| {
            let pools: Vec<Value> = octavia
                .pools_of(id)
                .into_iter()
                .filter(|p| {
                    p.listener.as_deref() == Some(listener.meta.id.as_str())
                        || listener.default_pool_id.as_deref() == Some(p.meta.id.as_str())
                })
                .map(|pool| {
                    let monitor = pool
                        .healthmonitor
                        .as_ref()
                        .and_then(|h| octavia.monitors.get(h))
                        .map(|h| {
                            let rendered = render_monitor(world, h);
                            json!({"id": h.meta.id, "name": h.meta.name, "type": h.kind,
                               "provisioning_status": rendered["provisioning_status"],
                               "operating_status": rendered["operating_status"]})
                        });
                    let members: Vec<Value> = octavia
                        .members_of(&pool.meta.id)
                        .iter()
                        .filter_map(|m| octavia.members.get(m))
                        .map(|m| {
                            json!({"id": m.meta.id, "name": m.meta.name,
                                        "operating_status": member_operating(world, m).as_str(),
                                        "provisioning_status": m.meta.status.as_str(),
                                        "address": m.address, "protocol_port": m.protocol_port})
                        })
                        .collect();
                    json!({"id": pool.meta.id, "name": pool.meta.name,
                           "provisioning_status": pool.meta.status.as_str(),
                           "operating_status": pool_operating(world, pool).as_str(),
                           "health_monitor": monitor, "members": members})
                })
                .collect();
            json!({"id": listener.meta.id, "name": listener.meta.name,
                   "operating_status": listener_operating(world, listener).as_str(),
                   "provisioning_status": listener.meta.status.as_str(), "pools": pools})
        })
        .collect();
    Reply::ok(json!({"statuses": {"loadbalancer": {
        "id": lb.meta.id, "name": lb.meta.name,
        "operating_status": lb_operating(world, lb).as_str(),
        "provisioning_status": lb.meta.status.as_str(),
        "listeners": listeners}}}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_amphora_pool_whose_only_weighted_member_is_down_reads_error_not_degraded() {
        use Oper::*;
        // The old member drained (UP at weight 0), the new one DOWN: haproxy's backend has
        // no weight left, so the pool (and its LB) read ERROR, and the LB's row changes.
        assert_eq!(haproxy_pool([(Draining, 0), (Error, 1)].into_iter()), Error);
        assert_eq!(
            haproxy_pool([(Draining, 0), (Online, 1)].into_iter()),
            Online
        );
        assert_eq!(
            haproxy_pool([(Online, 1), (Error, 1)].into_iter()),
            Degraded
        );
        assert_eq!(
            haproxy_pool([(Offline, 1), (Online, 1)].into_iter()),
            Online
        );
        assert_eq!(haproxy_pool([(NoMonitor, 1)].into_iter()), Online);
        assert_eq!(haproxy_pool(std::iter::empty()), Online);
    }

    /// What a monitor reads at each of its first `n` checks.
    fn readings(server: ApiServer, cadence: Cadence, n: u32) -> Vec<bool> {
        (0..n)
            .map(|k| server.passes("HTTPS", cadence, cadence.delay * k))
            .collect()
    }

    #[test]
    fn a_monitor_reads_a_flapping_server_through_its_rise_and_fall() {
        let cadence = Cadence {
            delay: Duration::from_secs(10),
            rise: 5,
            fall: 3,
        };
        // Up for 10 s, down for 10 s: the checks alternate, never 3 failures in a row, so
        // the member, up from its first check, never reads down.
        let fast = ApiServer::Flapping {
            period: Duration::from_secs(10),
        };
        assert!(readings(fast, cadence, 30).iter().all(|up| *up));
        // Up for 60 s, down for 60 s: down at the third failed check (80 s), up again at
        // the fifth passed one (160 s), down at 200 s.
        let slow = ApiServer::Flapping {
            period: Duration::from_secs(60),
        };
        let expected = [[true; 8], [false; 8]].concat();
        let expected = [expected, vec![true; 4], vec![false; 4]].concat();
        assert_eq!(readings(slow, cadence, 24), expected);
        // A server down from the start reads down at the first check.
        assert!(!ApiServer::Down.passes("TCP", cadence, Duration::ZERO));
        // Steady servers read their state from the first check.
        assert!(
            readings(ApiServer::Serving, cadence, 3)
                .iter()
                .all(|up| *up)
        );
        assert!(!ApiServer::NeverReady.passes("HTTPS", cadence, Duration::ZERO));
        assert!(ApiServer::NeverReady.passes("TCP", cadence, Duration::ZERO));
    }

    fn q(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn paginate_1000(
        items: Vec<Value>,
        query: &[(String, String)],
        key: &str,
        href: &str,
    ) -> Reply {
        paginate(items, query, key, href, 1000)
    }

    fn lbs(n: usize) -> Vec<Value> {
        (0..n)
            .map(|i| json!({"id": format!("lb-{i:04}"), "name": "x", "provisioning_status": "ACTIVE"}))
            .collect()
    }

    fn page(n: usize, query: &[(&str, &str)]) -> Value {
        let reply = paginate_1000(
            lbs(n),
            &q(query),
            "loadbalancers",
            "http://o/lbaas/loadbalancers",
        );
        assert_eq!(reply.status, 200);
        reply.body.unwrap_or_default()
    }

    #[test]
    fn pages_are_cut_as_octavia_cuts_them() {
        // Without a limit: at most 1,000, and a full page links on, even when it was the last.
        let first = page(1000, &[]);
        assert_eq!(first["loadbalancers"].as_array().map(Vec::len), Some(1000));
        assert_eq!(
            first["loadbalancers_links"][0]["href"],
            "http://o/lbaas/loadbalancers?limit=1000&marker=lb-0999"
        );
        let after = page(1000, &[("limit", "1000"), ("marker", "lb-0999")]);
        assert_eq!(after["loadbalancers"], json!([]));
        assert_eq!(after["loadbalancers_links"], json!([]));
        // A larger limit is capped; a short page has no next link.
        let capped = page(1500, &[("limit", "5000")]);
        assert_eq!(capped["loadbalancers"].as_array().map(Vec::len), Some(1000));
        let short = page(3, &[("limit", "5")]);
        assert_eq!(short["loadbalancers_links"], json!([]));
        // The links keep the limit and marker, not the fields or filters.
        let trimmed = page(
            3,
            &[
                ("limit", "2"),
                ("fields", "id"),
                ("name", "x"),
                ("marker", "lb-0000"),
            ],
        );
        assert_eq!(
            trimmed["loadbalancers"],
            json!([{"id": "lb-0001"}, {"id": "lb-0002"}])
        );
        let links: Vec<&str> = trimmed["loadbalancers_links"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|l| l["href"].as_str())
            .collect();
        assert_eq!(
            links,
            [
                "http://o/lbaas/loadbalancers?limit=2&marker=lb-0001&page_reverse=True",
                "http://o/lbaas/loadbalancers?limit=2&marker=lb-0002"
            ]
        );
    }

    #[test]
    fn fields_keep_what_each_names_and_a_comma_list_names_nothing() {
        let rows = page(1, &[("fields", "id"), ("fields", "provisioning_status")]);
        assert_eq!(
            rows["loadbalancers"],
            json!([{"id": "lb-0000", "provisioning_status": "ACTIVE"}])
        );
        let comma = page(1, &[("fields", "id,provisioning_status")]);
        assert_eq!(comma["loadbalancers"], json!([{}]));
    }

    #[test]
    fn bad_limits_and_markers_are_refused() {
        let bad = |query: &[(&str, &str)]| {
            paginate_1000(lbs(2), &q(query), "loadbalancers", "http://o").status
        };
        assert_eq!(bad(&[("limit", "ten")]), 400);
        assert_eq!(bad(&[("marker", "nope")]), 400);
        assert_eq!(
            page(2, &[("limit", "infinite")])["loadbalancers"]
                .as_array()
                .map(Vec::len),
            Some(2)
        );
    }
}
