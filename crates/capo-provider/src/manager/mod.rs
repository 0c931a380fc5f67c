//! The manager (`capo-rs run`): connects to Kubernetes, waits until the CRDs the controllers
//! watch are served, builds the one [`Context`], runs every controller, and shuts down
//! gracefully: reconciles in flight finish (their OpenStack calls are not cancelled), then
//! the engine's loops stop.
//!
//! Leader election and the admin HTTP server (/metrics, /healthz, /readyz) join in
//! [`run`], at the places marked there.

pub mod controllers;
pub mod crds;
pub mod wakeups;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use kube::config::{KubeConfigOptions, Kubeconfig};
use prometheus::Registry;
use tokio_util::sync::CancellationToken;

use crate::cloud::{CloudError, CloudOptions, Clouds};
use crate::controllers::{Context, ControllerConfig, ReconcileMetrics};
use crate::membership::{Engine, EngineConfig, EngineError, Observer};

pub use controllers::WatchScope;
pub use crds::{CrdCheckError, check_crds};

/// Everything `capo-rs run` is told.
#[derive(Clone, Debug)]
pub struct ManagerConfig {
    pub scope: WatchScope,
    /// Reconciles of OpenStackServers at once (CAPO's default is 10).
    pub server_concurrency: u16,
    /// Reconciles of OpenStackClusters at once (CAPO's default is 10).
    pub cluster_concurrency: u16,
    /// Reconciles of OpenStackMachines at once (CAPO's default is 10).
    pub machine_concurrency: u16,
    pub controllers: ControllerConfig,
    pub engine: EngineConfig,
    pub cloud: CloudOptions,
    /// How often to look again for CRDs that are missing.
    pub crd_retry: Duration,
    /// How the engine observes members; status trees when `None` (production). Benchmarks
    /// and tests plug in the strategies they compare against.
    pub observer: Option<SharedObserver>,
}

/// An engine observer, shared.
#[derive(Clone)]
pub struct SharedObserver(pub Arc<dyn Observer>);

impl std::fmt::Debug for SharedObserver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0.name())
    }
}

impl Default for ManagerConfig {
    fn default() -> Self {
        ManagerConfig {
            scope: WatchScope::default(),
            server_concurrency: 10,
            cluster_concurrency: 10,
            machine_concurrency: 10,
            controllers: ControllerConfig::default(),
            engine: EngineConfig::default(),
            cloud: CloudOptions::default(),
            crd_retry: Duration::from_secs(10),
            observer: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ManagerError {
    #[error("connecting to Kubernetes: {0}")]
    Connect(String),
    #[error(transparent)]
    Crds(#[from] CrdCheckError),
    #[error("setting up OpenStack access: {0}")]
    Cloud(#[from] CloudError),
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error("registering metrics: {0}")]
    Metrics(#[from] prometheus::Error),
}

/// A Kubernetes client from `kubeconfig`, or as kubectl finds one: `$KUBECONFIG`,
/// `~/.kube/config`, then the in-cluster service account.
pub async fn connect(kubeconfig: Option<&Path>) -> Result<kube::Client, ManagerError> {
    let config = match kubeconfig {
        Some(path) => {
            let file = Kubeconfig::read_from(path)
                .map_err(|e| ManagerError::Connect(format!("{}: {e}", path.display())))?;
            kube::Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
                .await
                .map_err(|e| ManagerError::Connect(format!("{}: {e}", path.display())))?
        }
        None => kube::Config::infer()
            .await
            .map_err(|e| ManagerError::Connect(e.to_string()))?,
    };
    kube::Client::try_from(config).map_err(|e| ManagerError::Connect(e.to_string()))
}

/// The CRDs the controllers watch: ours, and Cluster API's Cluster (`spec.paused`,
/// ownership) and Machine (a machine's owner, its bootstrap data and deletion hooks).
pub fn required_crds() -> Vec<String> {
    let mut names: Vec<String> = capo_api::crds::all()
        .iter()
        .filter_map(|crd| crd.metadata.name.clone())
        .collect();
    names.push(format!("clusters.{}", capo_api::capi::GROUP));
    names.push(format!("machines.{}", capo_api::capi::GROUP));
    names
}

/// Waits until every required CRD is Established, saying what is missing each time; `false`
/// when `shutdown` came first.
pub async fn wait_for_crds(
    client: &kube::Client,
    retry: Duration,
    shutdown: &CancellationToken,
) -> bool {
    let names = required_crds();
    loop {
        match check_crds(client, &names).await {
            Ok(()) => return true,
            Err(error) => tracing::warn!(%error, "waiting for CustomResourceDefinitions"),
        }
        tokio::select! {
            () = shutdown.cancelled() => return false,
            () = tokio::time::sleep(retry) => {}
        }
    }
}

/// A duration as Go writes the simple ones (`--sync-period`): `90`, `90s`, `15m`, `1h`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (digits, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => text.split_at(at),
        None => (text, "s"),
    };
    let count: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a duration such as 90s, 15m or 1h"))?;
    let unit = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        _ => return Err(format!("{text:?}: the unit must be s, m or h")),
    };
    match count.checked_mul(unit) {
        Some(0) | None => Err(format!("{text:?} must be positive and reasonable")),
        Some(seconds) => Ok(Duration::from_secs(seconds)),
    }
}

/// Runs the controllers until `shutdown` is cancelled, then stops gracefully.
pub async fn run(
    client: kube::Client,
    config: ManagerConfig,
    registry: &Registry,
    shutdown: CancellationToken,
) -> Result<(), ManagerError> {
    if !wait_for_crds(&client, config.crd_retry, &shutdown).await {
        return Ok(());
    }
    // Leader election (a later issue) goes here: the controllers below start only on the
    // replica that holds the Lease, and stop when it is lost.

    // Not the shutdown token: reconciles still running when shutdown begins finish their
    // OpenStack calls, so nothing is left half-written.
    let cloud_stop = CancellationToken::new();
    let clouds: Arc<Clouds> = Clouds::new(config.cloud.clone(), registry, cloud_stop.clone())?;
    let engine = match &config.observer {
        Some(observer) => Engine::with_observer(
            config.engine.clone(),
            observer.0.clone(),
            registry,
            cloud_stop.child_token(),
        )?,
        None => Engine::new(config.engine.clone(), registry, cloud_stop.child_token())?,
    };
    let metrics = ReconcileMetrics::register(registry)?;
    let ctx = Context::new(
        client,
        engine.clone(),
        clouds,
        metrics,
        config.controllers.clone(),
    );
    // The admin HTTP server (/metrics on `registry`, /healthz, /readyz) starts here.
    tracing::info!(
        namespace = config.scope.namespace.as_deref().unwrap_or("(all)"),
        watch_filter = config.scope.watch_filter.as_deref().unwrap_or("(none)"),
        "controllers starting"
    );
    let (senders, cluster_wakeups, machine_wakeups) = wakeups::channels();
    let bridge = tokio::spawn(wakeups::forward(
        engine.subscribe(),
        senders,
        ctx.clone(),
        shutdown.clone(),
    ));
    tokio::join!(
        controllers::run_servers(
            ctx.clone(),
            &config.scope,
            config.server_concurrency,
            shutdown.clone()
        ),
        controllers::run_clusters(
            ctx.clone(),
            &config.scope,
            config.cluster_concurrency,
            cluster_wakeups,
            shutdown.clone()
        ),
        controllers::run_machines(
            ctx,
            &config.scope,
            config.machine_concurrency,
            machine_wakeups,
            shutdown.clone()
        ),
    );
    engine.shutdown().await;
    if let Err(error) = bridge.await {
        tracing::warn!(%error, "the engine wake-up bridge ended abnormally");
    }
    cloud_stop.cancel();
    tracing::info!("controllers stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_go_writes_them() {
        assert_eq!(parse_duration("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("1d").is_err());
        assert!(parse_duration("m").is_err());
    }

    #[test]
    fn the_required_crds_are_ours_and_cluster_apis_cluster() {
        let names = required_crds();
        assert!(names.contains(&"openstackservers.infrastructure.cluster.x-k8s.io".to_owned()));
        assert!(names.contains(&"clusters.cluster.x-k8s.io".to_owned()));
    }
}
