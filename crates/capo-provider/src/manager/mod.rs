//! The manager (`capo-rs run`): connects to Kubernetes, waits until the CRDs the controllers
//! watch are served, builds the one [`Context`], runs every controller, and shuts down
//! gracefully: reconciles in flight finish (their OpenStack calls are not cancelled), then
//! the engine's loops stop.
//!
//! With leader election, the controllers run only while this replica holds the Lease, and
//! [`run`] returns [`ManagerError::LeadershipLost`] the moment it is lost: the caller exits.
//! [`Health`] tells the admin server (`/healthz`, `/readyz`) where the manager is.

pub mod admin;
pub mod allocator;
pub mod controllers;
pub mod crds;
pub mod features;
pub mod health;
mod https;
pub mod kube_client;
pub mod leader;
pub mod log_filter;
pub mod manifests;
pub mod metrics_auth;
pub mod metrics_server;
pub mod migration;
pub mod priority;
mod secret_readers;
pub mod shards;
pub mod shared;
pub mod sweep;
pub mod unreachable;
pub mod wakeups;
pub mod watch_backoff;
pub mod webhook;

use std::sync::Arc;
use std::time::Duration;

use prometheus::Registry;
use tokio_util::sync::CancellationToken;

use crate::cloud::{CloudError, CloudOptions, Clouds};
use crate::controllers::{Context, ControllerConfig, ReconcileMetrics};
use crate::membership::{Engine, EngineConfig, EngineError, Observer};

pub use controllers::WatchScope;
pub use crds::{CrdCheckError, check_crds};
pub use health::{Health, Phase};
pub use kube_client::{KubeClientOptions, connect};
pub use leader::LeaderElection;

/// Everything `capo-rs run` is told.
#[derive(Clone, Debug)]
pub struct ManagerConfig {
    /// Which objects the controllers reconcile: one namespace or all, and the watch filter.
    pub scope: WatchScope,
    /// Reconciles of OpenStackServers at once (CAPO's default is 10).
    pub server_concurrency: u16,
    /// Reconciles of OpenStackClusters at once (CAPO's default is 10).
    pub cluster_concurrency: u16,
    /// Reconciles of OpenStackMachines at once (CAPO's default is 10).
    pub machine_concurrency: u16,
    /// Reconciles of OpenStackMachineTemplates at once (CAPO's default is 10).
    pub template_concurrency: u16,
    /// CAPO's feature gates: templates get their scale-from-zero status only with
    /// `AutoScaleFromZero`.
    pub features: features::FeatureGates,
    /// Start-up migration phases not to run (`--skip-crd-migration-phases`).
    pub skip_migration: Vec<features::MigrationPhase>,
    /// Tunables shared by every controller: resync and poll periods, backoff, member repairs,
    /// drain period.
    pub controllers: ControllerConfig,
    /// Tunables of the membership engine that watches the API load balancers' members.
    pub engine: EngineConfig,
    /// Tunables of OpenStack access: rate limit, request path, token renewal, session expiry,
    /// default CA bundle.
    pub cloud: CloudOptions,
    /// How often to look again for CRDs that are missing.
    pub crd_retry: Duration,
    /// How long to wait for missing CRDs before failing with their names; `None` waits
    /// until shutdown.
    pub crd_wait: Option<Duration>,
    /// Run the controllers only while holding this Lease; `None` runs them at once.
    pub leader_election: Option<LeaderElection>,
    /// This shard's share of every cloud's OpenStack budget, written on its Lease and checked
    /// against the other shards' once it leads ([`shards`]); `None` checks nothing.
    pub budget_share: Option<f64>,
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
            template_concurrency: 10,
            features: features::FeatureGates::default(),
            skip_migration: Vec::new(),
            controllers: ControllerConfig::default(),
            engine: EngineConfig::default(),
            cloud: CloudOptions::default(),
            crd_retry: Duration::from_secs(10),
            crd_wait: None,
            leader_election: None,
            budget_share: None,
            observer: None,
        }
    }
}

/// Why the manager could not start, or why it stopped before shutdown was asked.
#[derive(Debug, thiserror::Error)]
pub enum ManagerError {
    /// The Kubernetes client could not be built, or the shards' Leases could not be read.
    #[error("connecting to Kubernetes: {0}")]
    Connect(String),
    /// The CRDs the controllers watch are missing or not Established, or could not be read.
    #[error(transparent)]
    Crds(#[from] CrdCheckError),
    /// OpenStack access (the shared [`Clouds`]) could not be set up.
    #[error("setting up OpenStack access: {0}")]
    Cloud(#[from] CloudError),
    /// The membership engine could not start.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// A metric could not be registered (the leader's, the migration's or the reconcilers').
    #[error("registering metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    /// This replica lost the leader Lease while leading; the caller must exit.
    #[error("lost the leader Lease: stopping at once so that the new leader works alone")]
    LeadershipLost,
    /// This shard's OpenStack budget share and the other shards' exceed a cloud's whole budget;
    /// the message gives the shares.
    #[error("{0}")]
    BudgetShares(String),
}

/// Why this shard may not run: its budget share and the other shards' come to more than a
/// cloud's whole budget, or their Leases cannot be read.
async fn budget_refusal(
    client: &kube::Client,
    election: &LeaderElection,
    share: f64,
) -> Option<ManagerError> {
    match shards::shares(client.clone(), &election.namespace, &election.name, share).await {
        Ok(shares) if shares.exceed_budget() => Some(ManagerError::BudgetShares(
            shards::over_budget_message(&shares),
        )),
        Ok(shares) => {
            tracing::info!(
                total = shares.total,
                shards = shares.by_lease.len(),
                "the shards' OpenStack budget shares fit the budget"
            );
            None
        }
        Err(error) => Some(ManagerError::Connect(format!(
            "reading the shards' Leases: {error}"
        ))),
    }
}

/// Our CRDs' names.
pub fn our_crds() -> Vec<String> {
    capo_api::crds::all()
        .iter()
        .filter_map(|crd| crd.metadata.name.clone())
        .collect()
}

/// Aborts a task when dropped (a task owned by the scope that spawned it).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The CRDs the controllers watch: ours, and Cluster API's Cluster (`spec.paused`,
/// ownership) and Machine (a machine's owner, its bootstrap data and deletion hooks).
pub fn required_crds() -> Vec<String> {
    let mut names = our_crds();
    names.push(format!("clusters.{}", capo_api::capi::GROUP));
    names.push(format!("machines.{}", capo_api::capi::GROUP));
    names
}

/// Waits until every required CRD is Established, saying what is missing each time; `false`
/// when `shutdown` came first. After `give_up` (if any) the last check's error is returned:
/// it names what is missing.
pub async fn wait_for_crds(
    client: &kube::Client,
    retry: Duration,
    give_up: Option<Duration>,
    shutdown: &CancellationToken,
) -> Result<bool, CrdCheckError> {
    let names = required_crds();
    let deadline = give_up.map(|wait| tokio::time::Instant::now() + wait);
    loop {
        let error = match check_crds(client, &names).await {
            Ok(()) => return Ok(true),
            Err(error) => error,
        };
        if deadline.is_some_and(|deadline| tokio::time::Instant::now() >= deadline) {
            return Err(error);
        }
        tracing::warn!(%error, "waiting for CustomResourceDefinitions");
        tokio::select! {
            () = shutdown.cancelled() => return Ok(false),
            () = tokio::time::sleep(retry) => {}
        }
    }
}

/// The controllers [`Health`] waits for.
pub const CONTROLLERS: [&str; 5] = [
    crate::controllers::server::CONTROLLER,
    crate::controllers::cluster::CONTROLLER,
    crate::controllers::machine::CONTROLLER,
    crate::controllers::machine_template::CONTROLLER,
    crate::controllers::floating_ip_pool::CONTROLLER,
];

/// A duration as Go writes the simple ones (`--sync-period`): `90`, `90s`, `500ms`, `15m`,
/// `1h`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    match parse_duration_or_zero(text)? {
        Duration::ZERO => Err(format!("{text:?} must be positive")),
        duration => Ok(duration),
    }
}

/// [`parse_duration`], where `0` is allowed (`--crd-wait 0`: look once).
pub fn parse_duration_or_zero(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (digits, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => text.split_at(at),
        None => (text, "s"),
    };
    let count: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a duration such as 90s, 15m or 1h"))?;
    let millis = match unit {
        "ms" => 1,
        "s" => 1000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => return Err(format!("{text:?}: the unit must be ms, s, m or h")),
    };
    count
        .checked_mul(millis)
        .map(Duration::from_millis)
        .filter(|duration| *duration <= crate::clock::FAR)
        .ok_or_else(|| {
            let most = crate::clock::FAR.as_secs() / 3600;
            format!("{text:?} is too long: at most {most}h")
        })
}

/// Runs the controllers until `shutdown` is cancelled, then stops gracefully.
pub async fn run(
    client: kube::Client,
    config: ManagerConfig,
    registry: &Registry,
    shutdown: CancellationToken,
) -> Result<(), ManagerError> {
    let health = Arc::new(Health::new(&CONTROLLERS));
    run_with_health(client, config, registry, health, shutdown).await
}

/// [`run`], reporting its phases to `health` (what the admin server answers).
pub async fn run_with_health(
    client: kube::Client,
    config: ManagerConfig,
    registry: &Registry,
    health: Arc<Health>,
    shutdown: CancellationToken,
) -> Result<(), ManagerError> {
    let waited = wait_for_crds(&client, config.crd_retry, config.crd_wait, &shutdown).await?;
    if !waited {
        return Ok(());
    }
    let leadership = match &config.leader_election {
        None => None,
        Some(election) => {
            health.set_phase(Phase::Standby);
            let metrics = leader::LeaderMetrics::register(registry)?;
            match leader::acquire(client.clone(), election.clone(), metrics, &shutdown).await {
                Some(leadership) => Some(leadership),
                None => return Ok(()),
            }
        }
    };
    if let (Some(election), Some(share)) = (&config.leader_election, config.budget_share)
        && let Some(refusal) = budget_refusal(&client, election, share).await
    {
        if let Some(leadership) = leadership {
            leadership.release().await;
        }
        return Err(refusal);
    }
    health.set_phase(Phase::Leading);
    // The leader alone migrates; the controllers start beside it. The managed-fields
    // cleanup lists every namespace, which a namespaced install may not (and a migrated
    // storage needs no list).
    let phases: Vec<_> = features::MigrationPhase::ALL
        .into_iter()
        .filter(|phase| !config.skip_migration.contains(phase))
        .filter(|phase| {
            config.scope.namespace.is_none()
                || *phase != features::MigrationPhase::CleanupManagedFields
        })
        .collect();
    let migration = (!phases.is_empty()).then(|| {
        migration::MigrationMetrics::register(registry).map(|metrics| {
            AbortOnDrop(tokio::spawn(migration::migrate_until_done(
                client.clone(),
                our_crds(),
                phases,
                metrics,
                shutdown.child_token(),
            )))
        })
    });
    let _migration_ends_with_us = migration.transpose()?;
    let controllers = run_controllers(client, &config, registry, &health, shutdown.clone());
    let Some(leadership) = leadership else {
        return controllers.await;
    };
    tokio::pin!(controllers);
    tokio::select! {
        // Dropping the controllers stops every reconcile where it is: the Lease is gone, so
        // finishing them could overlap the new leader's work.
        () = leadership.lost() => Err(ManagerError::LeadershipLost),
        result = &mut controllers => {
            leadership.release().await;
            result
        }
    }
}

/// The controllers, the engine and their bridge, until `shutdown`.
async fn run_controllers(
    client: kube::Client,
    config: &ManagerConfig,
    registry: &Registry,
    health: &Arc<Health>,
    shutdown: CancellationToken,
) -> Result<(), ManagerError> {
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
    let (watches, drivers) = controllers::Watches::new(&config.scope, &client);
    let ctx = Context::new(
        client,
        engine.clone(),
        clouds,
        metrics,
        ControllerConfig {
            scale_from_zero: config.features.auto_scale_from_zero,
            priority_queue: config.features.priority_queue,
            ..config.controllers.clone()
        },
        watches.caches(),
    );
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
    let watch = |name: &'static str| Watchdog {
        name,
        health: health.clone(),
        shutdown: shutdown.clone(),
    };
    // Built here, not inside an async block: each subscribes to the watches as it is built,
    // before the watches start below, so none misses the first list.
    let servers = watch(crate::controllers::server::CONTROLLER).over(controllers::run_servers(
        ctx.clone(),
        &watches,
        &config.scope,
        config.server_concurrency,
        health.clone(),
        shutdown.clone(),
    ));
    let clusters = watch(crate::controllers::cluster::CONTROLLER).over(controllers::run_clusters(
        ctx.clone(),
        &watches,
        &config.scope,
        config.cluster_concurrency,
        cluster_wakeups,
        health.clone(),
        shutdown.clone(),
    ));
    let machines = watch(crate::controllers::machine::CONTROLLER).over(controllers::run_machines(
        ctx.clone(),
        &watches,
        config.machine_concurrency,
        machine_wakeups,
        health.clone(),
        shutdown.clone(),
    ));
    let templates = watch(crate::controllers::machine_template::CONTROLLER).over(
        controllers::run_machine_templates(
            ctx.clone(),
            &watches,
            config.template_concurrency,
            health.clone(),
            shutdown.clone(),
        ),
    );
    let pools = watch(crate::controllers::floating_ip_pool::CONTROLLER).over(
        controllers::run_pools(ctx.clone(), &config.scope, health.clone(), shutdown.clone()),
    );
    let controllers = async { tokio::join!(servers, clusters, machines, templates, pools) };
    // Every controller has subscribed (above, before its first poll): now the watches run.
    // A reconciler reads the stores, so none starts before all of them have listed once.
    let mut watching = tokio::task::JoinSet::new();
    for driver in drivers {
        watching.spawn(driver);
    }
    let caches = ctx.caches.clone();
    tokio::select! {
        () = caches.wait_until_ready() => {
            tokio::pin!(controllers);
            controllers.await;
        }
        () = shutdown.cancelled() => tracing::debug!("stopped before the caches listed"),
    }
    watching.abort_all();
    engine.shutdown().await;
    if let Err(error) = bridge.await {
        tracing::warn!(%error, "the engine wake-up bridge ended abnormally");
    }
    cloud_stop.cancel();
    tracing::info!("controllers stopped");
    Ok(())
}

/// Marks a loop dead in [`Health`] when it ends before shutdown.
struct Watchdog {
    name: &'static str,
    health: Arc<Health>,
    shutdown: CancellationToken,
}

impl Watchdog {
    async fn over(self, task: impl std::future::Future<Output = ()>) {
        task.await;
        if !self.shutdown.is_cancelled() {
            tracing::error!(
                controller = self.name,
                "controller ended on its own; /healthz now fails"
            );
            self.health.died(self.name);
        }
    }
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
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert!(parse_duration("0s").is_err());
        assert_eq!(parse_duration_or_zero("0"), Ok(Duration::ZERO));
        assert!(parse_duration("1d").is_err());
        // Held to what the clock can add to now: a flag never makes a deadline overflow.
        assert_eq!(parse_duration("8784h"), Ok(crate::clock::FAR));
        assert!(parse_duration("8785h").is_err());
        assert!(parse_duration("18446744073709551615ms").is_err());
        assert!(parse_duration("m").is_err());
    }

    #[test]
    fn the_required_crds_are_ours_and_cluster_apis_cluster() {
        let names = required_crds();
        assert!(names.contains(&"openstackservers.infrastructure.cluster.x-k8s.io".to_owned()));
        assert!(names.contains(&"clusters.cluster.x-k8s.io".to_owned()));
    }
}
