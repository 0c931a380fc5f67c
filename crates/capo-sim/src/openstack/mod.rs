//! A simulated OpenStack cloud: Keystone, Nova, Neutron, Glance, Cinder and an Octavia that
//! behaves like the amphora (v2) provider, with timing and fault injection. One port serves every
//! service under a path prefix the Keystone catalog advertises (`/identity/v3`, `/compute/v2.1`,
//! `/network`, `/image`, `/load-balancer`, `/block-storage`); `/_sim/...` is the admin API.
//!
//! Transitions run on tokio's clock and are applied when a request arrives, so in-process use
//! on a paused clock is deterministic, and with a scenario seed so are the random delays.

mod cinder;
mod env;
mod faults;
mod filters;
mod glance;
mod keystone;
mod neutron;
mod nova;
mod octavia;
mod server;
mod world;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use env::{CloudSettings, Quotas};
pub use faults::{
    Delay, Effect, LatencyFault, ObjectKind, Outage, RateLimitFault, Rule, Scenario,
    ServerErrorFault, Timings,
};
pub use octavia::ApiServer;
pub use world::{RequestLog, WatchedLoadBalancer};

/// One member as the simulator holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberTruth {
    pub lb_id: String,
    pub pool_id: String,
    pub id: String,
    pub name: String,
    pub address: String,
    pub port: u16,
    pub provisioning_status: &'static str,
    /// What Octavia's API shows now (its monitor's view, under the simulated API server).
    pub operating_status: &'static str,
    pub weight: u32,
    /// When it last became ACTIVE or ERROR (tokio clock).
    pub settled_at: Option<tokio::time::Instant>,
}

#[derive(Debug, thiserror::Error)]
pub enum OpenStackSimError {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// How to start the simulator.
#[derive(Clone, Debug)]
pub struct OpenStackSimConfig {
    pub listen: SocketAddr,
    pub settings: CloudSettings,
    pub scenario: Scenario,
}

impl Default for OpenStackSimConfig {
    fn default() -> Self {
        OpenStackSimConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            settings: CloudSettings::default(),
            scenario: Scenario::default(),
        }
    }
}

/// A running simulator. Dropping it stops the server.
pub struct OpenStackSim {
    addr: SocketAddr,
    shared: Arc<server::Shared>,
    shutdown: CancellationToken,
    task: Option<JoinHandle<()>>,
}

impl OpenStackSim {
    /// Binds and starts serving in the background.
    pub async fn start(config: OpenStackSimConfig) -> Result<Self, OpenStackSimError> {
        let bind_error = |source| OpenStackSimError::Bind {
            addr: config.listen,
            source,
        };
        let listener = TcpListener::bind(config.listen).await.map_err(bind_error)?;
        let addr = listener.local_addr().map_err(bind_error)?;
        let shared = Arc::new(server::Shared {
            world: Mutex::new(world::World::new(config.settings, config.scenario)),
            base: format!("http://{addr}"),
            busy_nanos: std::sync::atomic::AtomicU64::new(0),
        });
        let shutdown = CancellationToken::new();
        let app = server::router(shared.clone());
        let stop = shutdown.clone();
        let task = tokio::spawn(async move {
            let serving = axum::serve(listener, app).with_graceful_shutdown(stop.cancelled_owned());
            if let Err(error) = serving.await {
                tracing::error!(%error, "simulated OpenStack stopped");
            }
        });
        tracing::info!(%addr, "simulated OpenStack listening");
        Ok(OpenStackSim {
            addr,
            shared,
            shutdown,
            task: Some(task),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        self.shared.base.clone()
    }

    /// Keystone's URL, as `auth_url` in clouds.yaml.
    pub fn auth_url(&self) -> String {
        format!("{}/identity/v3", self.shared.base)
    }

    /// A clouds.yaml with one cloud, `sim`, using the password credential.
    pub fn clouds_yaml(&self) -> String {
        let world = self.shared.world();
        let s = &world.env.settings;
        format!(
            "clouds:\n  sim:\n    auth:\n      auth_url: {}\n      username: {}\n      password: {}\n      \
             project_name: {}\n      user_domain_name: Default\n      project_domain_name: Default\n    \
             region_name: {}\n    interface: public\n    identity_api_version: 3\n  \
             sim-appcred:\n    auth_type: v3applicationcredential\n    auth:\n      auth_url: {}\n      \
             application_credential_id: {}\n      application_credential_secret: {}\n    region_name: {}\n",
            self.auth_url(),
            s.username,
            s.password,
            s.project_name,
            s.region,
            self.auth_url(),
            s.app_credential_id,
            s.app_credential_secret,
            s.region,
        )
    }

    /// Replaces the scenario (as `PUT /_sim/scenario` does).
    pub fn set_scenario(&self, scenario: Scenario) {
        let mut world = self.shared.world();
        if let Some(seed) = scenario.seed {
            world.env.rng = fastrand::Rng::with_seed(seed);
        }
        world.env.scenario = scenario;
        world.release_stuck();
    }

    /// Changes the scenario in place (timings, rules, faults); objects no rule holds stuck any
    /// more move on.
    pub fn update_scenario(&self, change: impl FnOnce(&mut Scenario)) {
        let mut world = self.shared.world();
        change(&mut world.env.scenario);
        world.release_stuck();
    }

    /// Adds an external network with one subnet of `cidr` (as an admin would): where floating
    /// IPs come from; a small one runs out of addresses.
    pub fn add_external_network(&self, name: &str, cidr: &str) {
        self.shared
            .world()
            .with_neutron(|cx| neutron::add_external_network(cx, name, cidr));
    }

    /// Deletes the images named `name` and uploads a new one under it (a new ID), as an
    /// image pipeline republishes a rebuild.
    pub fn republish_image(&self, name: &str) -> String {
        self.shared
            .world()
            .with_glance(|cx| glance::republish_image(cx, name))
    }

    /// Adds one fault rule.
    pub fn add_rule(&self, rule: Rule) {
        self.shared.world().env.scenario.rules.push(rule);
    }

    /// Removes every rule; objects they held stuck move on.
    pub fn clear_rules(&self) {
        let mut world = self.shared.world();
        world.env.scenario.rules.clear();
        world.release_stuck();
    }

    /// Requests served so far, by operation, status and second.
    pub fn request_log(&self) -> serde_json::Value {
        serde_json::to_value(&self.shared.world().requests).unwrap_or_default()
    }

    /// Forgets the request log (as `DELETE /_sim/requests` does).
    pub fn reset_request_log(&self) {
        self.shared.world().requests.reset();
    }

    /// Watches for requests that read each of `balancers` (by id, by name, or in a listing
    /// of every one); [`OpenStackSim::unread_load_balancers`] says which none has read since.
    pub fn watch_load_balancers(&self, balancers: Vec<WatchedLoadBalancer>) {
        self.shared.world().requests.watch_load_balancers(balancers);
    }

    pub fn unread_load_balancers(&self) -> Vec<String> {
        self.shared.world().requests.unread()
    }

    /// Real time the simulator spent serving requests so far.
    pub fn busy(&self) -> std::time::Duration {
        std::time::Duration::from_nanos(
            self.shared
                .busy_nanos
                .load(std::sync::atomic::Ordering::Relaxed),
        )
    }

    /// How many requests `"<service> <operation>"` received.
    pub fn request_count(&self, service_operation: &str) -> u64 {
        self.shared
            .world()
            .requests
            .by_operation
            .get(service_operation)
            .copied()
            .unwrap_or(0)
    }

    /// Pins the operating status of the Octavia objects with this id or name (`None` unpins);
    /// false when there is none. The same as `POST /_sim/operating-status`.
    pub fn set_operating_status(&self, id_or_name: &str, status: Option<&str>) -> bool {
        let status = status.and_then(octavia::Oper::parse);
        self.shared
            .world()
            .with_octavia(|cx| octavia::set_operating(cx, id_or_name, status))
    }

    /// How the API server at `address` (`*`: every address not set on its own) answers health
    /// monitors from now on.
    pub fn set_api_server(&self, address: &str, server: octavia::ApiServer) {
        self.shared
            .world()
            .octavia
            .api_servers
            .insert(address.to_owned(), server);
    }

    /// How the API servers behind members named like `glob` answer health monitors from now
    /// on (the last matching glob wins; an address set on its own comes first).
    pub fn set_api_server_for_members(&self, glob: &str, server: octavia::ApiServer) {
        self.shared
            .world()
            .octavia
            .api_servers_by_member
            .push((glob.to_owned(), server));
    }

    /// Octavia's policy refuses (`true`) or allows listing load balancers from now on.
    pub fn refuse_lb_list(&self, refused: bool) {
        self.shared.world().env.settings.lb_list_refused = refused;
    }

    /// The cloud's Neutron extensions and Octavia API version from now on.
    pub fn set_capabilities(&self, neutron_extensions: &[&str], octavia_version: (u32, u32)) {
        let mut world = self.shared.world();
        world.env.settings.neutron_extensions =
            neutron_extensions.iter().map(|e| (*e).to_owned()).collect();
        world.env.settings.octavia_version = octavia_version;
    }

    /// Octavia providers that implement no health monitors, from now on.
    pub fn set_providers_without_monitors(&self, providers: &[&str]) {
        self.shared.world().env.settings.providers_without_monitors =
            providers.iter().map(|p| (*p).to_owned()).collect();
    }

    /// Nova defers deletes (`reclaim_instance_interval`) from now on, or no longer does.
    pub fn set_deferred_delete(&self, deferred: bool) {
        self.shared.world().env.settings.deferred_delete = deferred;
    }

    /// Nova's policy refuses `forceDelete` from now on, or no longer does.
    pub fn set_force_delete_refused(&self, refused: bool) {
        self.shared.world().env.settings.force_delete_refused = refused;
    }

    /// Load balancers and members that exist now.
    pub fn octavia_counts(&self) -> (usize, usize) {
        let world = self.shared.world();
        (world.octavia.lbs.len(), world.octavia.members.len())
    }

    /// How many objects of each kind exist now (`servers`, `volumes`, `ports`, `trunks`,
    /// `networks`, `subnets`, `routers`, `security-groups`, `floatingips`, `loadbalancers`,
    /// `members`), seeded ones included: a test compares the census before and after a create
    /// and delete cycle to find leaks.
    pub fn object_counts(&self) -> std::collections::BTreeMap<String, usize> {
        let world = self.shared.world();
        let mut counts = std::collections::BTreeMap::new();
        counts.insert("servers".to_owned(), world.nova.count());
        counts.insert("volumes".to_owned(), world.cinder.count());
        for collection in [
            "ports",
            "trunks",
            "networks",
            "subnets",
            "routers",
            "security-groups",
            "floatingips",
        ] {
            counts.insert(collection.to_owned(), world.neutron.all(collection).len());
        }
        counts.insert("loadbalancers".to_owned(), world.octavia.lbs.len());
        counts.insert("members".to_owned(), world.octavia.members.len());
        counts
    }

    /// Every server, port and load balancer by name, and every member by pool and address,
    /// as `(kind, key)`: Cluster API providers name what they create after its owner, so one
    /// key seen twice is a duplicate made for one owner.
    pub fn inventory(&self) -> Vec<(&'static str, String)> {
        let world = self.shared.world();
        let named =
            |object: &serde_json::Value| object["name"].as_str().unwrap_or_default().to_owned();
        let servers = world.nova.names().map(|name| ("server", name.to_owned()));
        let ports = world
            .neutron
            .all("ports")
            .iter()
            .map(|p| ("port", named(p)));
        let lbs = world
            .octavia
            .lbs
            .values()
            .map(|lb| ("loadbalancer", lb.meta.name.clone()));
        let members = world.octavia.members.values().map(|m| {
            (
                "member",
                format!("{}/{}:{}", m.pool, m.address, m.protocol_port),
            )
        });
        // Unnamed objects (a router's interface ports) belong to no owner by name.
        servers
            .chain(ports)
            .chain(lbs)
            .chain(members)
            .filter(|(_, key)| !key.is_empty())
            .collect()
    }

    /// A Cinder volume as the API shows it, by id or (oldest first) name.
    pub fn volume(&self, id_or_name: &str) -> Option<serde_json::Value> {
        self.shared.world().cinder.find(id_or_name).cloned()
    }

    /// A Neutron port as the simulator holds it (every attribute, as an administrator sees
    /// it), by id.
    pub fn port(&self, id: &str) -> Option<serde_json::Value> {
        self.shared.world().neutron.find("ports", id).cloned()
    }

    /// A Neutron network as the simulator holds it, by name (the first of that name).
    pub fn network(&self, name: &str) -> Option<serde_json::Value> {
        let world = self.shared.world();
        let networks = world.neutron.all("networks");
        networks.iter().find(|n| n["name"] == name).cloned()
    }

    /// A Nova server as the API shows it, by id or (oldest first) name.
    pub fn server(&self, id_or_name: &str) -> Option<serde_json::Value> {
        self.shared.world().nova.find(id_or_name).cloned()
    }

    /// Every member as the simulated Octavia holds it right now (no request is logged): the
    /// ground truth benchmarks and tests compare a poller's view with.
    pub fn member_truth(&self) -> Vec<MemberTruth> {
        self.shared.world().with_octavia(|cx| {
            let world: &octavia::Cx<'_> = cx;
            world
                .octavia
                .members
                .values()
                .map(|m| MemberTruth {
                    lb_id: world
                        .octavia
                        .pools
                        .get(&m.pool)
                        .map(|p| p.lb.clone())
                        .unwrap_or_default(),
                    pool_id: m.pool.clone(),
                    id: m.meta.id.clone(),
                    name: m.meta.name.clone(),
                    address: m.address.clone(),
                    port: m.protocol_port,
                    provisioning_status: m.meta.status.as_str(),
                    operating_status: octavia::member_operating(world, m).as_str(),
                    weight: m.weight,
                    settled_at: m.settled_at,
                })
                .collect()
        })
    }

    /// Floating IPs (by address) that a port deletion left pointing at nothing, oldest first:
    /// each is a moment an endpoint on it answered nothing.
    pub fn orphaned_floating_ips(&self) -> Vec<String> {
        self.shared.world().neutron.orphaned_floating_ips.clone()
    }

    /// When the next pending transition is due (for tests that advance a paused clock).
    pub fn next_transition(&self) -> Option<tokio::time::Instant> {
        self.shared.world().next_due()
    }

    /// Stops serving.
    pub async fn shutdown(mut self) {
        self.shutdown.cancel();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for OpenStackSim {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// A `cloud::Session` that calls the simulator in-process, without TCP: on tokio's paused
/// clock, a test or benchmark runs the cloud layer against the simulator in virtual time.
/// It authenticates with the simulator's Keystone (password) and re-authenticates once on 401.
pub struct InProcessSession {
    shared: Arc<server::Shared>,
    scope: capo_provider::cloud::SessionScope,
    token: Mutex<Option<String>>,
}

impl OpenStackSim {
    /// An in-process session on this simulator.
    pub fn session(&self) -> Arc<InProcessSession> {
        Arc::new(InProcessSession {
            shared: self.shared.clone(),
            scope: capo_provider::cloud::SessionScope {
                auth_url: self.auth_url(),
                region: self.shared.world().env.settings.region.clone(),
                // One project: every session sees every object.
                identity: "simulator".to_owned(),
            },
            token: Mutex::new(None),
        })
    }
}

impl InProcessSession {
    async fn authenticate(&self) -> Option<String> {
        let body = {
            let world = self.shared.world();
            let s = &world.env.settings;
            serde_json::json!({"auth": {"identity": {"methods": ["password"], "password": {"user": {
                "name": s.username, "password": s.password, "domain": {"name": "Default"}}}}}})
        };
        let body = serde_json::to_vec(&body).unwrap_or_default();
        let reply = server::handle_request(
            &self.shared,
            &axum::http::Method::POST,
            "/identity/v3/auth/tokens",
            None,
            &axum::http::HeaderMap::new(),
            &body,
        )
        .await;
        let token = reply
            .headers
            .iter()
            .find(|(name, _)| *name == "x-subject-token")
            .map(|(_, value)| value.clone());
        *self.token.lock().unwrap_or_else(|e| e.into_inner()) = token.clone();
        token
    }

    async fn send_once(
        &self,
        parts: &axum::http::request::Parts,
        body: &[u8],
        token: Option<&str>,
    ) -> env::Reply {
        let mut headers = parts.headers.clone();
        if let Some(value) = token.and_then(|t| axum::http::HeaderValue::from_str(t).ok()) {
            headers.insert("x-auth-token", value);
        }
        server::handle_request(
            &self.shared,
            &parts.method,
            parts.uri.path(),
            parts.uri.query(),
            &headers,
            body,
        )
        .await
    }
}

#[async_trait::async_trait]
impl capo_provider::cloud::Session for InProcessSession {
    fn scope(&self) -> &capo_provider::cloud::SessionScope {
        &self.scope
    }

    async fn service_url(
        &self,
        service: capo_provider::cloud::Service,
    ) -> Result<url::Url, capo_provider::cloud::SendError> {
        let prefix = keystone::SERVICES
            .iter()
            .find(|(kind, _, _)| *kind == service.as_str())
            .map(|(_, _, prefix)| *prefix)
            .unwrap_or_default();
        url::Url::parse(&format!("{}/{prefix}", self.shared.base))
            .map(|url| capo_provider::cloud::versioned_base(url, service))
            .map_err(|e| capo_provider::cloud::SendError::Other(e.to_string()))
    }

    async fn send(
        &self,
        request: http::Request<Vec<u8>>,
    ) -> Result<http::Response<bytes::Bytes>, capo_provider::cloud::SendError> {
        let (parts, body) = request.into_parts();
        let current = self.token.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let token = match current {
            Some(token) => Some(token),
            None => self.authenticate().await,
        };
        let mut reply = self.send_once(&parts, &body, token.as_deref()).await;
        if reply.status == axum::http::StatusCode::UNAUTHORIZED {
            let token = self.authenticate().await;
            reply = self.send_once(&parts, &body, token.as_deref()).await;
        }
        let mut response = http::Response::builder().status(reply.status.as_u16());
        for (name, value) in &reply.headers {
            response = response.header(*name, value.as_str());
        }
        let body = reply
            .body
            .map(|b| serde_json::to_vec(&b).unwrap_or_default())
            .unwrap_or_default();
        response
            .body(bytes::Bytes::from(body))
            .map_err(|e| capo_provider::cloud::SendError::Other(e.to_string()))
    }
}
