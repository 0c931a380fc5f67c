//! Where the story plays: a Kubernetes API (the embedded simulator, or a real cluster's with
//! `--kubeconfig`), the simulated OpenStack, and the manager: the same `manager::run` that
//! `capo-rs run` starts, so the demo shows the production controllers.

use std::num::NonZeroU32;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::Strategy;
use anyhow::Context as _;
use capo_provider::controllers::gate::MonitorKind;
use capo_provider::controllers::{BackoffPolicy, ControllerConfig};
use capo_provider::manager::{
    self, Health, KubeClientOptions, LeaderElection, ManagerConfig, ManagerError, SharedObserver,
    WatchScope,
};
use capo_provider::membership::ServingRules;
use capo_sim::kube::{KubeSim, KubeSimConfig};
use capo_sim::openstack::{OpenStackSim, OpenStackSimConfig, Scenario};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use prometheus::Registry;
use serde_json::json;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::{DemoConfig, NAMESPACE};

pub struct DemoWorld {
    pub client: kube::Client,
    pub cloud: Arc<OpenStackSim>,
    /// The manager's metrics, which the story reads to time its faults.
    pub registry: Registry,
    /// Which Kubernetes API, in words.
    pub kubernetes: String,
    _kube: Option<KubeSim>,
    shutdown: CancellationToken,
    manager: JoinHandle<Result<(), ManagerError>>,
}

impl DemoWorld {
    pub async fn start(
        config: &DemoConfig,
        registry: &Registry,
        health: Arc<Health>,
        shutdown: CancellationToken,
    ) -> anyhow::Result<Self> {
        let (kube, kube_config, kubernetes) = match &config.kubeconfig {
            Some(path) => {
                let kube_config = real_cluster(path).await?;
                (
                    None,
                    kube_config,
                    format!("the cluster of {}", path.display()),
                )
            }
            None => {
                let kube = KubeSim::start(KubeSimConfig::default())
                    .await
                    .context("starting the simulated Kubernetes API")?;
                let uri = kube.url().parse().context("the simulated API's address")?;
                let words = format!("embedded simulator at {}", kube.url());
                (Some(kube), kube::Config::new(uri), words)
            }
        };
        let client = kube::Client::try_from(kube_config.clone()).context("a Kubernetes client")?;
        // The manager's own client, named as `capo-rs run` names it (the API server's request
        // log tells its requests from the story's).
        let manager_client = manager::kube_client::client(
            kube_config,
            &KubeClientOptions {
                qps: 200.0,
                burst: NonZeroU32::new(400).unwrap_or(NonZeroU32::MIN),
                ..KubeClientOptions::default()
            },
        )?;
        install_missing_crds(&client).await?;
        ensure_namespace(&client).await?;
        let cloud = OpenStackSim::start(OpenStackSimConfig {
            scenario: Scenario {
                seed: Some(42),
                timings: config.pace.timings(),
                ..Scenario::default()
            },
            ..OpenStackSimConfig::default()
        })
        .await
        .context("starting the simulated OpenStack")?;
        let manager_config = manager_config(config);
        let (manager_registry, manager_shutdown) = (registry.clone(), shutdown.clone());
        let manager = tokio::spawn(async move {
            manager::run_with_health(
                manager_client,
                manager_config,
                &manager_registry,
                health,
                manager_shutdown,
            )
            .await
        });
        Ok(DemoWorld {
            client,
            cloud: Arc::new(cloud),
            registry: registry.clone(),
            kubernetes,
            _kube: kube,
            shutdown,
            manager,
        })
    }

    /// Stops the manager (reconciles in flight finish first).
    pub async fn stop(self) {
        self.shutdown.cancel();
        match self.manager.await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => tracing::error!(%error, "the manager failed"),
            Err(error) => tracing::error!(%error, "the manager's task failed"),
        }
    }

    /// Requests the simulated cloud has served.
    pub fn requests(&self) -> u64 {
        self.cloud.request_log()["total"].as_u64().unwrap_or(0)
    }
}

/// The manager as `capo-rs run` would start it, told the story's pace, watching the demo's
/// namespace only (on a real cluster, nothing else is touched).
fn manager_config(config: &DemoConfig) -> ManagerConfig {
    let mut manager = ManagerConfig {
        scope: WatchScope {
            namespace: Some(NAMESPACE.to_owned()),
            watch_filter: None,
        },
        controllers: ControllerConfig {
            poll_min: config.pace.of(0.25),
            poll_max: config.pace.of(2.0),
            backoff: BackoffPolicy {
                initial: config.pace.of(0.25),
                cap: config.pace.of(4.0),
                ..BackoffPolicy::default()
            },
            instance: Some("capo-rs-demo".to_owned()),
            ..ControllerConfig::default()
        },
        crd_retry: Duration::from_millis(500),
        // As in a management cluster: the controllers run while this process holds the Lease.
        leader_election: Some(LeaderElection {
            namespace: NAMESPACE.to_owned(),
            name: "capo-rs-demo".to_owned(),
            identity: manager::leader::identity("capo-rs-demo"),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
            annotations: Default::default(),
        }),
        ..ManagerConfig::default()
    };
    manager.engine.stuck_after = config.pace.stuck_after();
    manager.engine.schedule = config.strategy.schedule(manager.engine.schedule.clone());
    // As `capo-rs run --api-health-monitor=https`: the demo's API servers answer /readyz.
    manager.controllers.api_monitor = MonitorKind::Https;
    manager.controllers.drain_period = config.pace.drain_period();
    if config.strategy.serving_gate() {
        manager.engine.serving = Some(ServingRules {
            settle: config.pace.serving_settle(),
            recovery: config.pace.not_serving_after(),
            not_serving_after: config.pace.not_serving_after(),
        });
    }
    if !matches!(
        config.strategy,
        Strategy::StatusTree | Strategy::Provisioning
    ) {
        manager.observer = Some(SharedObserver(config.strategy.observer()));
    }
    manager
}

async fn real_cluster(path: &Path) -> anyhow::Result<kube::Config> {
    let kubeconfig =
        Kubeconfig::read_from(path).with_context(|| format!("reading {}", path.display()))?;
    kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .with_context(|| format!("using {}", path.display()))
}

/// Our CRDs, and minimal Cluster API Cluster and Machine CRDs, where the API has none
/// (a cluster's own, Cluster API's real ones included, are left as they are).
async fn install_missing_crds(client: &kube::Client) -> anyhow::Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let wanted = capo_api::crds::all()
        .into_iter()
        .chain(capo_api::capi::crds());
    for crd in wanted {
        let name = kube::ResourceExt::name_any(&crd);
        if api.get_opt(&name).await.context("reading CRDs")?.is_some() {
            continue;
        }
        match api.create(&PostParams::default(), &crd).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(error) => return Err(error).with_context(|| format!("installing CRD {name}")),
        }
    }
    Ok(())
}

async fn ensure_namespace(client: &kube::Client) -> anyhow::Result<()> {
    let api: Api<Namespace> = Api::all(client.clone());
    let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": NAMESPACE}}))?;
    match api.create(&PostParams::default(), &namespace).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        Err(error) => Err(error).context("creating the demo's namespace"),
    }
}
