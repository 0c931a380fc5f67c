//! A simulated OpenStack cloud: Keystone, Nova, Neutron, Glance and an Octavia that behaves like
//! the amphora (v2) provider, with timing and fault injection. One port serves every service
//! under a path prefix the Keystone catalog advertises (`/identity/v3`, `/compute/v2.1`,
//! `/network`, `/image`, `/load-balancer`); `/_sim/...` is the admin API.
//!
//! Transitions run on tokio's clock and are applied when a request arrives, so in-process use
//! on a paused clock is deterministic, and with a scenario seed so are the random delays.

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

pub use faults::{
    Delay, Effect, LatencyFault, ObjectKind, Outage, RateLimitFault, Rule, Scenario,
    ServerErrorFault, Timings,
};
pub use world::{CloudSettings, RequestLog};

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
        let s = &world.settings;
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
            world.rng = fastrand::Rng::with_seed(seed);
        }
        world.scenario = scenario;
        world.release_stuck();
    }

    /// Adds one fault rule.
    pub fn add_rule(&self, rule: Rule) {
        self.shared.world().scenario.rules.push(rule);
    }

    /// Removes every rule; objects they held stuck move on.
    pub fn clear_rules(&self) {
        let mut world = self.shared.world();
        world.scenario.rules.clear();
        world.release_stuck();
    }

    /// Requests served so far, by operation, status and second.
    pub fn request_log(&self) -> serde_json::Value {
        serde_json::to_value(&self.shared.world().requests).unwrap_or_default()
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
