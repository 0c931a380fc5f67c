//! The simulated cloud's state, its clock and the pieces every service shares: ids, timestamps,
//! replies, the timer queue that drives transitions, and the request log.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::http::StatusCode;
use serde::Serialize;
use serde_json::{Value, json};
use tokio::time::Instant;

use super::faults::Scenario;
use super::{cinder, glance, keystone, neutron, nova, octavia};

/// An answer: status, optional JSON body, extra headers.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub body: Option<Value>,
    pub headers: Vec<(&'static str, String)>,
}

impl Reply {
    pub fn json(status: u16, body: Value) -> Self {
        Reply {
            status: StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            body: Some(body),
            headers: Vec::new(),
        }
    }

    pub fn ok(body: Value) -> Self {
        Reply::json(200, body)
    }

    pub fn empty(status: u16) -> Self {
        Reply {
            body: None,
            ..Reply::json(status, Value::Null)
        }
    }

    pub fn header(mut self, name: &'static str, value: impl Into<String>) -> Self {
        self.headers.push((name, value.into()));
        self
    }

    /// Octavia's (WSME) error body.
    pub fn fault(status: u16, message: impl Into<String>) -> Self {
        Reply::json(
            status,
            json!({"faultcode": if status >= 500 { "Server" } else { "Client" },
                   "faultstring": message.into(), "debuginfo": null}),
        )
    }

    /// Octavia's other 404 shape (pecan), seen for unknown parents of a collection.
    pub fn pecan_not_found(message: impl Into<String>) -> Self {
        Reply::json(
            404,
            json!({"code": 404, "title": "Bad Request", "description": message.into()}),
        )
    }

    /// Neutron's error body.
    pub fn neutron(status: u16, kind: &str, message: impl Into<String>) -> Self {
        Reply::json(
            status,
            json!({"NeutronError": {"type": kind, "message": message.into(), "detail": ""}}),
        )
    }

    /// Nova's error body: `{"itemNotFound": {"code": 404, "message": ...}}`.
    pub fn nova(status: u16, message: impl Into<String>) -> Self {
        let kind = match status {
            400 => "badRequest",
            404 => "itemNotFound",
            403 => "forbidden",
            409 => "conflictingRequest",
            413 => "overLimit",
            _ => "computeFault",
        };
        Reply::json(
            status,
            json!({ kind: {"code": status, "message": message.into()} }),
        )
    }

    /// Cinder's error body: the same shape as Nova's.
    pub fn cinder(status: u16, message: impl Into<String>) -> Self {
        Reply::nova(status, message)
    }

    /// An HTML error page, as webob answers where no JSON fault is made.
    pub fn html(status: u16, page: String) -> Self {
        Reply::json(status, Value::String(page)).header("content-type", "text/html; charset=UTF-8")
    }

    pub fn bad_json() -> Self {
        Reply::fault(400, "Invalid input: the request body is not valid JSON")
    }
}

/// A request body as JSON: `Null` when empty, `None` when it is not JSON.
pub fn json_body(body: &[u8]) -> Option<Value> {
    if body.is_empty() {
        return Some(Value::Null);
    }
    serde_json::from_slice(body).ok()
}

/// The strings of a JSON array (anything else: none).
pub fn string_list(value: &Value) -> Vec<String> {
    value
        .as_array()
        .map(|items| {
            items
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// Things that happen later, in time order.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Timer {
    LoadBalancer(String),
    Member(String),
    MemberOnline(String),
    Server(String),
    Volume(String),
}

/// One simulator request, for the admin request log.
#[derive(Clone, Debug, Serialize)]
pub struct LoggedRequest {
    /// Seconds since the simulator started (virtual time when the clock is paused).
    pub at: f64,
    pub service: String,
    pub operation: String,
    pub status: u16,
}

/// Counts of requests served, kept as aggregates so a long benchmark does not grow memory.
#[derive(Debug, Default, Serialize)]
pub struct RequestLog {
    pub total: u64,
    /// `"<service> <operation>"` -> count.
    pub by_operation: BTreeMap<String, u64>,
    /// Status code -> count.
    pub by_status: BTreeMap<u16, u64>,
    /// Whole seconds since start -> count.
    pub per_second: BTreeMap<u64, u64>,
    /// The same per service: a client's rate limit is per endpoint.
    pub per_service_second: BTreeMap<String, BTreeMap<u64, u64>>,
    /// The last requests, newest last.
    pub recent: std::collections::VecDeque<LoggedRequest>,
    /// Per service: the current second and how many requests arrived in it.
    #[serde(skip)]
    current: BTreeMap<String, (u64, u32)>,
}

const RECENT: usize = 200;

impl RequestLog {
    /// Counts an arrival for rate limiting; returns how many arrived this second, this one
    /// included.
    pub fn arrive(&mut self, service: &str, at: f64) -> u32 {
        let second = at as u64;
        let slot = self
            .current
            .entry(service.to_owned())
            .or_insert((second, 0));
        if slot.0 != second {
            *slot = (second, 0);
        }
        slot.1 += 1;
        slot.1
    }

    pub fn record(&mut self, request: LoggedRequest) {
        self.total += 1;
        *self
            .by_operation
            .entry(format!("{} {}", request.service, request.operation))
            .or_default() += 1;
        *self.by_status.entry(request.status).or_default() += 1;
        *self.per_second.entry(request.at as u64).or_default() += 1;
        *self
            .per_service_second
            .entry(request.service.clone())
            .or_default()
            .entry(request.at as u64)
            .or_default() += 1;
        if self.recent.len() == RECENT {
            self.recent.pop_front();
        }
        self.recent.push_back(request);
    }

    pub fn reset(&mut self) {
        *self = RequestLog::default();
    }
}

/// Settings fixed at start.
#[derive(Clone, Debug)]
pub struct CloudSettings {
    pub region: String,
    pub project_id: String,
    pub project_name: String,
    pub username: String,
    pub password: String,
    pub app_credential_id: String,
    pub app_credential_secret: String,
    pub token_lifetime: Duration,
    /// Check X-Auth-Token on every service request. Off: any request passes, as a `noauth`
    /// Octavia does (it still wants an `X-Project-Id` on creates).
    pub require_auth: bool,
    /// Amphorae send heartbeats: LBs, listeners and pools read ONLINE when healthy, and members
    /// with a monitor go OFFLINE -> ONLINE. Off: what Octavia's no-op drivers show (OFFLINE).
    pub heartbeats: bool,
    /// Also seed a project network, `private` with `private-subnet` (10.0.0.0/24), as DevStack
    /// does: what a walkthrough's servers attach to. Off by default, so seeded scenarios draw
    /// the same ids and delays as before.
    pub tenant_network: bool,
    /// Nova's availability zones, as `os-availability-zone` lists them and a server create
    /// accepts them.
    pub availability_zones: Vec<String>,
    /// Octavia's policy refuses listing load balancers (`loadbalancer:get_all`): 403, as a
    /// cloud that filters the list by policy answers.
    pub lb_list_refused: bool,
    /// Octavia's `[api_settings] pagination_max_limit`: its default page size and the most
    /// one list answers at once.
    pub octavia_page_max: usize,
    /// The project's quotas; `None` is unlimited.
    pub quotas: Quotas,
    /// Neutron's extensions that matter to a provider, by alias (`trunk`, `standard-attr-tag`);
    /// `GET /v2.0/extensions/{alias}` finds only these.
    pub neutron_extensions: Vec<String>,
    /// Octavia's current API version (the last of its version document), `(major, minor)`.
    pub octavia_version: (u32, u32),
}

/// A project's quotas, where the services check them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Quotas {
    /// Neutron ports (and so servers Nova would make ports for).
    pub ports: Option<usize>,
    /// Nova servers.
    pub instances: Option<usize>,
    /// Cinder volumes.
    pub volumes: Option<usize>,
}

impl Default for CloudSettings {
    fn default() -> Self {
        CloudSettings {
            region: "RegionOne".into(),
            project_id: "0123456789abcdef0123456789abcdef".into(),
            project_name: "demo".into(),
            username: "demo".into(),
            password: "secret".into(),
            app_credential_id: "capo-appcred".into(),
            app_credential_secret: "appcred-secret".into(),
            token_lifetime: Duration::from_secs(3600),
            require_auth: true,
            heartbeats: true,
            tenant_network: false,
            availability_zones: vec!["nova".into()],
            lb_list_refused: false,
            octavia_page_max: 1000,
            quotas: Quotas::default(),
            neutron_extensions: vec!["trunk".into(), "standard-attr-tag".into()],
            octavia_version: (2, 27),
        }
    }
}

pub struct World {
    pub settings: CloudSettings,
    pub scenario: Scenario,
    pub rng: fastrand::Rng,
    pub started: Instant,
    wall_start: chrono::DateTime<chrono::Utc>,
    timers: BTreeMap<(Instant, u64), Timer>,
    next_seq: u64,
    pub requests: RequestLog,
    pub keystone: keystone::Keystone,
    pub octavia: octavia::Octavia,
    pub neutron: neutron::Neutron,
    pub nova: nova::Nova,
    pub glance: glance::Glance,
    pub cinder: cinder::Cinder,
}

impl World {
    pub fn new(settings: CloudSettings, scenario: Scenario) -> Self {
        let rng = match scenario.seed {
            Some(seed) => fastrand::Rng::with_seed(seed),
            None => fastrand::Rng::new(),
        };
        let mut world = World {
            settings,
            scenario,
            rng,
            started: Instant::now(),
            wall_start: chrono::Utc::now(),
            timers: BTreeMap::new(),
            next_seq: 0,
            requests: RequestLog::default(),
            keystone: keystone::Keystone::default(),
            octavia: octavia::Octavia::default(),
            neutron: neutron::Neutron::default(),
            nova: nova::Nova::default(),
            glance: glance::Glance::default(),
            cinder: cinder::Cinder::default(),
        };
        neutron::seed(&mut world);
        if world.settings.tenant_network {
            neutron::seed_tenant_network(&mut world);
        }
        nova::seed(&mut world);
        glance::seed(&mut world);
        cinder::seed(&mut world);
        world
    }

    /// A random (seeded) version-4 UUID.
    pub fn uuid(&mut self) -> String {
        let mut bytes = [0u8; 16];
        for byte in &mut bytes {
            *byte = self.rng.u8(..);
        }
        uuid::Builder::from_random_bytes(bytes)
            .into_uuid()
            .to_string()
    }

    /// Hex id without dashes, as Keystone and Nova use for some ids.
    pub fn hex_id(&mut self) -> String {
        self.uuid().replace('-', "")
    }

    /// "2026-11-22T06:33:54": Octavia's timestamp format, on the simulator's (virtual) clock.
    pub fn timestamp(&self) -> String {
        self.wall_now().format("%Y-%m-%dT%H:%M:%S").to_string()
    }

    /// Wall time as the simulator sees it: start time plus elapsed (virtual) time.
    pub fn wall_now(&self) -> chrono::DateTime<chrono::Utc> {
        let elapsed = chrono::TimeDelta::from_std(self.started.elapsed()).unwrap_or_default();
        self.wall_start + elapsed
    }

    pub fn seconds_since_start(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    pub fn unit(&mut self) -> f64 {
        self.rng.f64()
    }

    /// Schedules `timer` after `delay`.
    pub fn schedule(&mut self, delay: Duration, timer: Timer) -> Instant {
        let at = Instant::now() + delay;
        self.next_seq += 1;
        self.timers.insert((at, self.next_seq), timer);
        at
    }

    /// Runs every timer that is due. Called before each request is served, so state is always
    /// current without a background task (and follows tokio's paused clock in tests).
    pub fn settle(&mut self) {
        let now = Instant::now();
        while let Some(entry) = self.timers.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let timer = entry.remove();
            match timer {
                Timer::LoadBalancer(id) => octavia::on_lb_timer(self, &id),
                Timer::Member(id) => octavia::on_member_timer(self, &id),
                Timer::MemberOnline(id) => octavia::on_member_online(self, &id),
                Timer::Server(id) => nova::on_server_timer(self, &id),
                Timer::Volume(id) => cinder::on_volume_timer(self, &id),
            }
        }
    }

    /// When the next transition is due, if any.
    pub fn next_due(&self) -> Option<Instant> {
        self.timers.keys().next().map(|(at, _)| *at)
    }

    /// Objects held by `Stuck` rules get going again once their rule is gone.
    pub fn release_stuck(&mut self) {
        octavia::release_stuck(self);
        nova::release_stuck(self);
        cinder::release_stuck(self);
    }
}
