//! `capo-rs bench servers`: the OpenStackServer controller's cost per server, end to end.
//! The manager runs against the simulated Kubernetes API and the simulated OpenStack (over
//! loopback, real time, the simulator's default timings: a server builds in 1-2 s); N
//! OpenStackServers are created, waited for until Ready, deleted, and waited for until gone.
//! Reported: reconciles and OpenStack requests per server for each half, by operation, and
//! how long each server took to be Ready.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use capo_api::OpenStackServer;
use capo_api::conditions::{self, types};
use capo_provider::manager::{self, ManagerConfig};
use capo_sim::kube::{KubeSim, KubeSimConfig};
use capo_sim::openstack::{CloudSettings, OpenStackSim, OpenStackSimConfig};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use prometheus::Registry;
use serde::Serialize;
use serde_json::json;
use tokio_util::sync::CancellationToken;

/// What to create.
#[derive(Clone, Debug, Serialize)]
pub struct ServersConfig {
    pub servers: u32,
    /// Ports per server.
    pub ports: u32,
    /// Boot from a Cinder root volume.
    pub root_volume: bool,
    /// Give up after this long.
    pub timeout: Duration,
    /// The OpenStack rate limit and timeouts.
    #[serde(skip)]
    pub cloud: capo_provider::cloud::CloudOptions,
}

/// One half (create or delete) of the run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Half {
    pub seconds: f64,
    pub reconciles: f64,
    pub requests: u64,
    /// `"<service> <operation>"` -> requests.
    pub by_operation: BTreeMap<String, u64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ServersReport {
    pub config: ServersConfig,
    pub create: Half,
    pub delete: Half,
    /// Seconds from create to Ready: p50, p99, max.
    pub ready_after: [f64; 3],
}

const NAMESPACE: &str = "default";

fn manifest(name: &str, config: &ServersConfig) -> serde_json::Value {
    let ports: Vec<serde_json::Value> = (0..config.ports)
        .map(|_| json!({"network": {"filter": {"name": "private"}}}))
        .collect();
    let mut spec = json!({
        "flavor": "m1.small",
        "image": {"filter": {"name": "ubuntu-2404-kube-v1.33.4"}},
        "sshKeyName": "bench",
        "identityRef": {"name": "cloud-config", "cloudName": "sim"},
        "ports": ports,
    });
    if config.root_volume {
        spec["rootVolume"] = json!({"sizeGiB": 20});
    }
    json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
        "kind": "OpenStackServer",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": spec,
    })
}

fn reconciles(registry: &Registry) -> f64 {
    capo_provider::controllers::metrics::value(registry, "controller_runtime_reconcile_total", &[])
}

fn operations(cloud: &OpenStackSim) -> BTreeMap<String, u64> {
    serde_json::from_value(cloud.request_log()["by_operation"].clone()).unwrap_or_default()
}

fn difference(
    after: &BTreeMap<String, u64>,
    before: &BTreeMap<String, u64>,
) -> BTreeMap<String, u64> {
    after
        .iter()
        .map(|(op, n)| (op.clone(), n - before.get(op).copied().unwrap_or(0)))
        .filter(|(_, n)| *n > 0)
        .collect()
}

fn is_ready(server: &OpenStackServer) -> bool {
    server
        .status
        .as_ref()
        .and_then(|s| conditions::find(&s.conditions, types::READY))
        .is_some_and(|c| c.status == "True")
}

/// Runs the measurement on the current (real-time) runtime.
pub async fn run(config: ServersConfig) -> anyhow::Result<ServersReport> {
    let kube = KubeSim::start(KubeSimConfig::default()).await?;
    let crds: Vec<serde_json::Value> = capo_api::crds::all()
        .into_iter()
        .chain(capo_api::capi::crds())
        .map(serde_json::to_value)
        .collect::<Result<_, _>>()?;
    kube.install(&crds)?;
    let cloud = OpenStackSim::start(OpenStackSimConfig {
        settings: CloudSettings {
            tenant_network: true,
            ..CloudSettings::default()
        },
        ..OpenStackSimConfig::default()
    })
    .await?;
    let client = kube.client()?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NAMESPACE);
    let secret: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "cloud-config", "namespace": NAMESPACE},
        "stringData": {"clouds.yaml": cloud.clouds_yaml()},
    }))?;
    secrets.create(&PostParams::default(), &secret).await?;

    let registry = Registry::new();
    let shutdown = CancellationToken::new();
    let running = tokio::spawn({
        let (client, registry, shutdown) = (client.clone(), registry.clone(), shutdown.clone());
        let config = ManagerConfig {
            cloud: config.cloud.clone(),
            ..ManagerConfig::default()
        };
        async move { manager::run(client, config, &registry, shutdown).await }
    });
    let servers: Api<OpenStackServer> = Api::namespaced(client, NAMESPACE);

    let started = Instant::now();
    let mut created_at = BTreeMap::new();
    for index in 0..config.servers {
        let name = format!("bench-{index:05}");
        let object: OpenStackServer = serde_json::from_value(manifest(&name, &config))?;
        servers.create(&PostParams::default(), &object).await?;
        created_at.insert(name, started.elapsed());
    }
    let mut ready_after = Vec::new();
    while !created_at.is_empty() {
        anyhow::ensure!(
            started.elapsed() < config.timeout,
            "servers not Ready in time"
        );
        for server in servers
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter(is_ready)
        {
            if let Some(created) = server
                .metadata
                .name
                .as_ref()
                .and_then(|n| created_at.remove(n))
            {
                ready_after.push((started.elapsed() - created).as_secs_f64());
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let create = Half {
        seconds: started.elapsed().as_secs_f64(),
        reconciles: reconciles(&registry),
        requests: cloud.request_log()["total"].as_u64().unwrap_or(0),
        by_operation: operations(&cloud),
    };

    let deleting = Instant::now();
    servers
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await?;
    while !servers.list(&ListParams::default()).await?.items.is_empty() {
        anyhow::ensure!(
            deleting.elapsed() < config.timeout,
            "servers not gone in time"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let by_operation = operations(&cloud);
    let delete = Half {
        seconds: deleting.elapsed().as_secs_f64(),
        reconciles: reconciles(&registry) - create.reconciles,
        requests: cloud.request_log()["total"].as_u64().unwrap_or(0) - create.requests,
        by_operation: difference(&by_operation, &create.by_operation),
    };
    let left = cloud.object_counts();
    anyhow::ensure!(
        left.get("servers") == Some(&0),
        "servers left behind: {left:?}"
    );
    shutdown.cancel();
    running.await.context("the manager task")??;

    ready_after.sort_by(f64::total_cmp);
    let at = |q: f64| ready_after[((ready_after.len() - 1) as f64 * q).round() as usize];
    Ok(ServersReport {
        ready_after: [at(0.5), at(0.99), at(1.0)],
        config,
        create,
        delete,
    })
}

impl ServersReport {
    pub fn print(&self) {
        let n = f64::from(self.config.servers);
        println!(
            "{} OpenStackServers ({} port(s) each{}), simulated cloud, real time, {} requests/s per endpoint (burst {})",
            self.config.servers,
            self.config.ports,
            if self.config.root_volume {
                ", root volume"
            } else {
                ""
            },
            self.config.cloud.rate_limit.qps,
            self.config.cloud.rate_limit.burst,
        );
        println!("| | create (to Ready) | delete (to gone) |");
        println!("|---|---|---|");
        println!(
            "| wall time (s) | {:.1} | {:.1} |",
            self.create.seconds, self.delete.seconds
        );
        println!(
            "| reconciles per server | {:.2} | {:.2} |",
            self.create.reconciles / n,
            self.delete.reconciles / n
        );
        println!(
            "| OpenStack requests per server | {:.2} | {:.2} |",
            self.create.requests as f64 / n,
            self.delete.requests as f64 / n
        );
        println!(
            "Ready after create: p50 {:.2} s, p99 {:.2} s, max {:.2} s",
            self.ready_after[0], self.ready_after[1], self.ready_after[2]
        );
        for (label, half) in [("create", &self.create), ("delete", &self.delete)] {
            let per_server: Vec<String> = half
                .by_operation
                .iter()
                .map(|(op, count)| format!("{op} {:.2}", *count as f64 / n))
                .collect();
            println!("{label} requests per server: {}", per_server.join(", "));
        }
    }
}
