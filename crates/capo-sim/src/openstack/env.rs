//! What every simulated service shares and nothing else: the clock, the seeded random source,
//! the timer queue, the settings and the scenario ([`Env`]); replies and request bodies; and
//! the one way a service reaches another ([`Neighbours`], over [`Images`]). Services import
//! this module, never each other nor the world that owns them.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::http::StatusCode;
use serde_json::{Value, json};
use tokio::time::Instant;

use super::faults::Scenario;

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
    /// Octavia providers whose driver implements no health monitors (ovn-octavia-provider
    /// before 2021 did not, nor do some vendors' drivers): creating one on their load
    /// balancers answers 501, as Octavia's API does when a driver raises NotImplementedError.
    pub providers_without_monitors: Vec<String>,
    /// Nova's `reclaim_instance_interval` is set: deleting a server that has run makes it
    /// SOFT_DELETED (its ports and volumes kept), where it stays until a `forceDelete` (or a
    /// reclaim this simulator never makes); deleting it again leaves it so.
    pub deferred_delete: bool,
    /// Nova's policy refuses `forceDelete` (`os_compute_api:os-deferred-delete:force`, which an
    /// operator may restrict to administrators): 403, as Nova answers.
    pub force_delete_refused: bool,
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
            providers_without_monitors: Vec::new(),
            deferred_delete: false,
            force_delete_refused: false,
        }
    }
}

/// The clock, the seeded random source, the timer queue, the settings and the scenario: what
/// every service reads or draws from, owned by the world beside the services.
pub struct Env {
    pub settings: CloudSettings,
    pub scenario: Scenario,
    pub rng: fastrand::Rng,
    pub started: Instant,
    wall_start: chrono::DateTime<chrono::Utc>,
    timers: BTreeMap<(Instant, u64), Timer>,
    next_seq: u64,
}

impl Env {
    /// A fresh environment; the random source seeded from the scenario, if it has a seed.
    pub fn new(settings: CloudSettings, scenario: Scenario) -> Self {
        let rng = match scenario.seed {
            Some(seed) => fastrand::Rng::with_seed(seed),
            None => fastrand::Rng::new(),
        };
        Env {
            settings,
            scenario,
            rng,
            started: Instant::now(),
            wall_start: chrono::Utc::now(),
            timers: BTreeMap::new(),
            next_seq: 0,
        }
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

    /// "2026-11-22T06:33:54Z": Neutron's, Nova's and Glance's timestamp format.
    pub fn utc_timestamp(&self) -> String {
        self.wall_now().format("%Y-%m-%dT%H:%M:%SZ").to_string()
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

    /// The first timer due by now, taken off the queue.
    pub fn pop_due(&mut self) -> Option<Timer> {
        let entry = self.timers.first_entry()?;
        if entry.key().0 > Instant::now() {
            return None;
        }
        Some(entry.remove())
    }

    /// When the next transition is due, if any.
    pub fn next_due(&self) -> Option<Instant> {
        self.timers.keys().next().map(|(at, _)| *at)
    }
}

/// What a service may read of Glance's images: Cinder and Nova check the images they are given.
pub trait Images {
    /// The image with this id, if Glance has it.
    fn image(&self, id: &str) -> Option<&Value>;
}

/// The one way a service reaches another: a server's ports and volumes (Nova), a load
/// balancer's VIP port (Octavia). The world implements it over the services it owns.
pub trait Neighbours: Images {
    /// How many ports Neutron holds (its port quota counts them).
    fn ports_in_use(&self) -> usize;
    /// Neutron's port with this id.
    fn port(&self, id: &str) -> Option<&Value>;
    /// Neutron's network with this id.
    fn network(&self, id: &str) -> Option<&Value>;
    /// A new port, made as Neutron's API makes one.
    fn create_port(&mut self, env: &mut Env, request: Value) -> Value;
    /// Points a port at a device (a server), or frees it with an empty device id.
    fn bind_port(&mut self, env: &mut Env, port: &str, device: &str);
    /// Deletes a port if it exists, freeing the floating IPs that pointed at it.
    fn release_port(&mut self, env: &mut Env, port: &str);
    /// A load balancer's VIP port: its id, its address and its network.
    fn vip_port(
        &mut self,
        env: &mut Env,
        network: Option<&str>,
        subnet: Option<&str>,
        address: Option<String>,
    ) -> (String, String, Option<String>);
    /// Cinder's volume with this id.
    fn volume(&self, id: &str) -> Option<&Value>;
    /// A volume made for a server's block device (from an image, or blank); its id.
    fn create_volume_for_server(
        &mut self,
        env: &mut Env,
        name: &str,
        size: u64,
        image: Option<&str>,
    ) -> String;
    /// Attaches a volume to a server at `device`.
    fn attach_volume(&mut self, env: &mut Env, volume: &str, server: &str, device: &str);
    /// Detaches a volume from a server.
    fn detach_volume(&mut self, env: &mut Env, volume: &str, server: &str);
    /// Deletes a volume made for a server, once detached from it.
    fn delete_volume_for_server(&mut self, env: &mut Env, volume: &str, server: &str);
}
