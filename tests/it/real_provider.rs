//! The whole provider on a real OpenStack (`tests/openstack/up.sh`, see [`crate::real_cloud`]):
//! the real manager against the simulated Kubernetes API and the real cloud, credentials in a
//! clouds.yaml Secret (a password or an application credential; no noauth anywhere), Cluster
//! API played by the actor. Each scenario runs on the simulator too, so the two can be compared
//! (the figures each prints) and the simulator is held to what the real cloud does.
//!
//! Every scenario ends with a census of the tenant, through the real APIs, compared with the
//! one taken before it: nothing may be left behind.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::kube_world::{Kube, KubeWorld, Server};
use capo_api::capi::{self, Cluster, Machine};
use capo_api::capo_conditions::capo_types;
use capo_api::conditions::{self, reasons, types};
use capo_api::{
    OpenStackCluster, OpenStackMachine, OpenStackMachineSpec, OpenStackMachineTemplate,
    OpenStackServer,
};
use capo_provider::cloud::neutron::{Filter, NetworkSpec, SubnetSpec};
use capo_provider::cloud::octavia::ProvisioningStatus;
use capo_provider::cloud::{CloudClient, CloudOptions, Clouds, Service};
use capo_provider::controllers::gate;
use capo_provider::controllers::machine::ADDRESS_PAIRS_ANNOTATION;
use capo_provider::manager::{ManagerConfig, ManagerError, WatchScope};
use capo_sim::capi::{CapiActor, CapiActorConfig, ControlPlane, RolloutStep};
use capo_sim::openstack::{OpenStackSim, OpenStackSimConfig, Outage, Scenario, ServerErrorFault};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::wait::await_condition;
use prometheus::Registry;
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::real_cloud::{
    APPCRED_CLOUD, Census, PASSWORD_CLOUD, REAL, RealCloud, census, duplicated_names, fault,
    get_json, new_objects, real_cloud,
};
use crate::server_controller::{base64, manager_config, metric_sum, spawn_manager, timings};
use crate::waits::waited;

pub(crate) const SECRET: &str = "cloud-config";
pub(crate) const FLAVOR: &str = "m1.small";
pub(crate) const IMAGE: &str = "ubuntu-2404-kube-v1.33.4";
/// The key pair up.sh makes for the tenant.
pub(crate) const KEY_PAIR: &str = "capo-rs-test";
/// The tenant's own network (up.sh makes it on the real tier).
pub(crate) const TENANT_NETWORK: &str = "capo-rs-lb-tests";
/// How long any one wait on the provider may take, on either cloud.
pub(crate) const WAIT: Duration = Duration::from_secs(300);

/// The provider, the simulated Kubernetes API, and a cloud: the real tier or the simulator.
pub(crate) struct E2e {
    pub(crate) label: &'static str,
    /// The API server (the real tier's when started, see [`KubeWorld`]) and the namespace.
    pub(crate) kube: KubeWorld,
    pub(crate) client: kube::Client,
    registry: Registry,
    shutdown: CancellationToken,
    manager: Option<JoinHandle<Result<(), ManagerError>>>,
    /// The tenant, as a client of our own: to look at the cloud and take its census.
    pub(crate) tenant: CloudClient,
    _clouds: Arc<Clouds>,
    /// The cloud's name in the Secret's clouds.yaml.
    pub(crate) cloud_name: &'static str,
    /// The external network `public`, as CAPO's template names it (by id).
    pub(crate) external_network: String,
    pub(crate) sim: Option<Arc<OpenStackSim>>,
}

/// Cluster API's IPAM kinds, as our minimal types generate them.
fn minimal_ipam_crds() -> Vec<Value> {
    capo_api::ipam::crds()
        .iter()
        .map(|crd| serde_json::to_value(crd).expect("CRD"))
        .collect()
}

/// The tenant's clouds of the real tier's clouds.yaml: the manager gets no admin credential.
fn tenant_clouds_yaml(full: &str) -> String {
    let mut doc: Value = serde_saphyr::from_str(full).expect("clouds.yaml parses");
    if let Some(clouds) = doc.get_mut("clouds").and_then(|c| c.as_object_mut()) {
        clouds.retain(|name, _| matches!(name.as_str(), PASSWORD_CLOUD | APPCRED_CLOUD));
    }
    serde_saphyr::to_string(&doc).expect("clouds.yaml serialises")
}

impl E2e {
    /// On the real cloud, with the API server `kube`.
    pub(crate) async fn real_on(real: &RealCloud, cloud_name: &'static str, kube: Kube) -> E2e {
        let (tenant, clouds) = real.client(PASSWORD_CLOUD).await;
        Self::start(
            "real",
            kube,
            tenant,
            clouds,
            None,
            &tenant_clouds_yaml(&real.clouds_yaml),
            cloud_name,
            minimal_ipam_crds(),
        )
        .await
    }

    /// On the simulated cloud and the API server `kube`.
    pub(crate) async fn simulated_on(appcred: bool, kube: Kube) -> E2e {
        Self::simulated_on_with_ipam(appcred, kube, minimal_ipam_crds()).await
    }

    /// [`E2e::simulated`], with these CRDs serving Cluster API's IPAM kinds.
    pub(crate) async fn simulated_with_ipam(appcred: bool, ipam_crds: Vec<Value>) -> E2e {
        Self::simulated_on_with_ipam(appcred, Kube::AsTheEnvironmentSays, ipam_crds).await
    }

    async fn simulated_on_with_ipam(appcred: bool, kube: Kube, ipam_crds: Vec<Value>) -> E2e {
        let sim = OpenStackSim::start(OpenStackSimConfig {
            scenario: Scenario {
                timings: timings(),
                ..Scenario::default()
            },
            ..OpenStackSimConfig::default()
        })
        .await
        .expect("simulator");
        let clouds = Clouds::new(
            CloudOptions::default(),
            &Registry::new(),
            CancellationToken::new(),
        )
        .expect("clouds");
        let tenant = clouds.client(sim.session());
        // As up.sh makes on the real tier: the tenant's own network.
        let network = tenant
            .neutron()
            .create_network(&NetworkSpec {
                name: TENANT_NETWORK.into(),
                admin_state_up: true,
                ..NetworkSpec::default()
            })
            .await
            .expect("network");
        tenant
            .neutron()
            .create_subnet(&SubnetSpec {
                name: TENANT_NETWORK.into(),
                network_id: network.id,
                cidr: "10.254.0.0/24".into(),
                ip_version: 4,
                ..SubnetSpec::default()
            })
            .await
            .expect("subnet");
        let yaml = sim.clouds_yaml();
        let name = if appcred { "sim-appcred" } else { "sim" };
        let sim = Some(Arc::new(sim));
        Self::start("sim", kube, tenant, clouds, sim, &yaml, name, ipam_crds).await
    }

    #[allow(clippy::too_many_arguments)]
    async fn start(
        label: &'static str,
        kube: Kube,
        tenant: CloudClient,
        clouds: Arc<Clouds>,
        sim: Option<Arc<OpenStackSim>>,
        clouds_yaml: &str,
        cloud_name: &'static str,
        ipam_crds: Vec<Value>,
    ) -> E2e {
        if let Ok(filter) = std::env::var("CAPO_TEST_LOG") {
            let _ = tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
                .with_test_writer()
                .try_init();
        }
        let crds: Vec<Value> = capo_api::crds::all()
            .iter()
            .chain(capo_api::capi::crds().iter())
            .map(|crd| serde_json::to_value(crd).expect("CRD"))
            .chain(ipam_crds)
            .collect();
        let kube = kube.start(&crds).await;
        let client = kube.client.clone();
        let secret: Secret = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": SECRET, "namespace": kube.namespace},
            "data": {"clouds.yaml": base64(clouds_yaml)},
        }))
        .expect("secret");
        kube.api::<Secret>()
            .create(&PostParams::default(), &secret)
            .await
            .expect("secret created");
        let externals = tenant
            .neutron()
            .list_networks(&Filter::by_name("public").with("router:external", "true"))
            .await
            .expect("external networks");
        let external_network = externals
            .first()
            .expect("the external network `public`")
            .id
            .clone();
        let mut e2e = E2e {
            label,
            kube,
            client,
            registry: Registry::new(),
            shutdown: CancellationToken::new(),
            manager: None,
            tenant,
            _clouds: clouds,
            cloud_name,
            external_network,
            sim,
        };
        e2e.start_manager();
        e2e
    }

    /// The manager, as capo-rs's ServiceAccount, watching this world's namespace on a shared
    /// real server.
    fn start_manager(&mut self) {
        self.start_manager_with(|_| {});
    }

    /// [`E2e::start_manager`], its configuration changed by `change`.
    fn start_manager_with(&mut self, change: impl FnOnce(&mut ManagerConfig)) {
        let mut config = manager_config(WatchScope::default());
        change(&mut config);
        if self.kube.is_real() {
            config.scope.namespace = Some(self.kube.namespace.clone());
        }
        let (registry, shutdown, manager) = spawn_manager(&self.kube.manager_client, config);
        (self.registry, self.shutdown) = (registry, shutdown);
        self.manager = Some(manager);
    }

    /// Stops the manager as a rolling update or a crash would: `graceful` lets reconciles in
    /// flight finish; otherwise the task is dropped where it stands.
    pub(crate) async fn stop_manager(&mut self, graceful: bool) {
        let Some(manager) = self.manager.take() else {
            return;
        };
        if graceful {
            self.shutdown.cancel();
            tokio::time::timeout(Duration::from_secs(60), manager)
                .await
                .expect("the manager stops within a minute")
                .expect("the manager's task")
                .expect("the manager");
        } else {
            manager.abort();
            let _ = manager.await;
            self.shutdown.cancel();
        }
    }

    /// Points the manager and the tests at another API server (the manager must be stopped).
    fn move_to(&mut self, kube: KubeWorld) {
        assert!(self.manager.is_none(), "stop the manager first");
        self.client = kube.client.clone();
        self.kube = kube;
    }

    /// This world's namespace.
    pub(crate) fn ns(&self) -> &str {
        &self.kube.namespace
    }

    /// capo-rs's webhook server behind the simulated API server, and the CRDs pointing at it:
    /// v1beta1 objects then convert, and admission runs, as in a real install. On the real
    /// server every world converts and admits through the shared webhook already: `None`.
    pub(crate) async fn serve_webhook(&self) -> Option<crate::conversion::ServedWebhook> {
        let Server::Sim(sim) = &self.kube.server else {
            return None;
        };
        let webhook = crate::conversion::ServedWebhook::start(sim).await;
        webhook.upgrade_crds(&self.client).await;
        Some(webhook)
    }

    pub(crate) fn clusters(&self) -> Api<OpenStackCluster> {
        self.kube.api()
    }

    pub(crate) fn machines(&self) -> Api<OpenStackMachine> {
        self.kube.api()
    }

    pub(crate) fn servers(&self) -> Api<OpenStackServer> {
        self.kube.api()
    }

    /// Every request the simulated API server answered, in order; `None` on the real server,
    /// which keeps no such log.
    pub(crate) fn kube_requests(&self) -> Option<Vec<capo_sim::kube::server::RequestRecord>> {
        self.kube.sim_requests()
    }

    /// OpenStack requests the manager made, by `request` label, since it started.
    pub(crate) fn request_counts(&self) -> BTreeMap<String, u64> {
        openstack_request_counts(&self.registry)
    }

    /// OpenStack requests the manager made, by service, since it started.
    pub(crate) fn requests(&self) -> BTreeMap<&'static str, u64> {
        let mut by_service = BTreeMap::new();
        for (request, count) in self.request_counts() {
            *by_service.entry(service_of(&request)).or_default() += count;
        }
        by_service
    }

    /// OpenStack requests the manager made that change something (not a GET or a list),
    /// by request, since it started.
    fn writes(&self) -> BTreeMap<String, u64> {
        self.request_counts()
            .into_iter()
            .filter(|(request, count)| !is_read(request) && *count > 0)
            .collect()
    }
}

/// A manager's OpenStack requests so far, by `request` label
/// (`capo_openstack_api_requests_total` in its `registry`).
pub(crate) fn openstack_request_counts(registry: &Registry) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    for family in registry.gather() {
        if family.name() != "capo_openstack_api_requests_total" {
            continue;
        }
        for metric in family.get_metric() {
            let request = metric
                .get_label()
                .iter()
                .find(|l| l.name() == "request")
                .map(|l| l.value().to_owned())
                .unwrap_or_default();
            *counts.entry(request).or_default() += metric.get_counter().get_value() as u64;
        }
    }
    counts
}

/// A `<resource>_<verb>` that changes nothing in the tenant: a read, or Keystone issuing
/// the manager's token.
pub(crate) fn is_read(request: &str) -> bool {
    request.ends_with("_get") || request.ends_with("_list") || request == "token_create"
}

/// The service a request metric label belongs to (`<resource>_<verb>`).
fn service_of(request: &str) -> &'static str {
    let resource = request.rsplit_once('_').map_or(request, |(r, _)| r);
    match resource {
        "token" => "identity",
        "server" | "flavor" | "availability_zone" | "server_group" | "keypair" => "compute",
        "image" => "image",
        "volume" => "block-storage",
        "loadbalancer"
        | "listener"
        | "pool"
        | "member"
        | "healthmonitor"
        | "provider"
        | "loadbalancer_status"
        | "amphora"
        | "flavor_profile"
        | "lb_flavor" => "load-balancer",
        _ if request.starts_with("loadbalancer") || request.starts_with("lb_") => "load-balancer",
        _ => "network",
    }
}

/// `after - before`, per service, with the total.
pub(crate) fn spent(
    before: &BTreeMap<&'static str, u64>,
    after: &BTreeMap<&'static str, u64>,
) -> String {
    let mut parts = Vec::new();
    let mut total = 0;
    for (service, count) in after {
        let n = count - before.get(service).copied().unwrap_or(0);
        if n > 0 {
            parts.push(format!("{service} {n}"));
            total += n;
        }
    }
    format!("{total} ({})", parts.join(", "))
}

/// Waits until `name` satisfies `done`, for at most `within`; the last status on failure.
pub(crate) async fn wait_for<K>(
    api: &Api<K>,
    name: &str,
    what: &str,
    within: Duration,
    done: impl Fn(&K) -> bool,
) -> K
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
    K::DynamicType: Default,
{
    let condition = move |object: Option<&K>| object.is_some_and(&done);
    let waiting = tokio::time::timeout(within, await_condition(api.clone(), name, condition));
    match waited(format!("{name} {what}"), waiting).await {
        Ok(Ok(Some(object))) => object,
        other => {
            let now = api.get_opt(name).await.ok().flatten();
            panic!("{name}: never {what} within {within:?}: {other:?}\nlast seen: {now:#?}")
        }
    }
}

pub(crate) async fn wait_gone<K>(api: &Api<K>, name: &str, within: Duration)
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
    K::DynamicType: Default,
{
    let gone = await_condition(api.clone(), name, |object: Option<&K>| object.is_none());
    match waited(format!("{name} gone"), tokio::time::timeout(within, gone)).await {
        Ok(Ok(_)) => {}
        other => {
            let now = api.get_opt(name).await.ok().flatten();
            panic!("{name}: still there after {within:?}: {other:?}\nlast seen: {now:#?}")
        }
    }
}

fn status_of(conditions: &[Condition], type_: &str) -> (String, String, String) {
    conditions::find(conditions, type_)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
        .unwrap_or_default()
}

fn cluster_is(type_: &'static str) -> impl Fn(&OpenStackCluster) -> bool {
    move |cluster| {
        cluster
            .status
            .as_ref()
            .is_some_and(|s| status_of(&s.conditions, type_).0 == "True")
    }
}

fn provisioned(cluster: &OpenStackCluster) -> bool {
    cluster
        .status
        .as_ref()
        .and_then(|s| s.initialization.as_ref())
        .is_some_and(|i| i.provisioned == Some(true))
}

fn machine_template() -> OpenStackMachineSpec {
    serde_json::from_value(json!({
        "flavor": {"filter": {"name": FLAVOR}},
        "image": {"filter": {"name": IMAGE}},
        "sshKeyName": KEY_PAIR,
    }))
    .expect("machine template")
}

/// CAPO's default cluster template (cluster-template.yaml) as a user fills it in, with a
/// bastion.
pub(crate) fn cluster_spec(cloud_name: &str, external_network: &str) -> Value {
    json!({
        "apiServer": {"managedLoadBalancer": {"enabled": true}},
        "externalNetwork": {"id": external_network},
        "identityRef": {"name": SECRET, "cloudName": cloud_name},
        "managedSecurityGroups": {
            "allowAllInClusterTraffic": false,
            "clusterNodesSecurityGroupRules": [
                {"name": "BGP (Calico)", "description": "BGP between nodes, for Calico",
                 "direction": "ingress", "etherType": "IPv4", "portRangeMin": 179,
                 "portRangeMax": 179, "protocol": "tcp",
                 "remoteManagedGroups": ["controlplane", "worker"]},
                {"name": "IP-in-IP (Calico)", "description": "IP-in-IP between nodes, for Calico",
                 "direction": "ingress", "etherType": "IPv4", "protocol": "4",
                 "remoteManagedGroups": ["controlplane", "worker"]}
            ]
        },
        "managedSubnets": [{"cidr": "10.6.0.0/24", "dnsNameservers": ["192.0.2.53"]}],
        "bastion": {
            "enabled": true,
            "spec": {"flavor": {"filter": {"name": FLAVOR}}, "image": {"filter": {"name": IMAGE}},
                     "sshKeyName": KEY_PAIR}
        },
        "tags": ["capo-rs-e2e"],
    })
}

/// A Cluster API Cluster (with Cluster API's finalizer, so it stays while its parts go) and its
/// OpenStackCluster of the same name.
async fn create_cluster(e2e: &E2e, name: &str) {
    create_cluster_as(e2e, name, name).await;
}

/// [`create_cluster`] with the OpenStackCluster named `infra` (as ClusterClass names it,
/// `<cluster>-<suffix>`).
async fn create_cluster_as(e2e: &E2e, name: &str, infra: &str) {
    let spec = cluster_spec(e2e.cloud_name, &e2e.external_network);
    create_cluster_with(e2e, name, infra, spec).await;
}

/// A Cluster and its OpenStackCluster `infra` with the spec given.
pub(crate) async fn create_cluster_with(e2e: &E2e, name: &str, infra: &str, spec: Value) {
    create_capi_cluster(e2e, name, infra).await;
    let cluster: OpenStackCluster = serde_json::from_value(json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "OpenStackCluster",
        "metadata": {"name": infra, "namespace": e2e.ns(),
                     "labels": {"cluster.x-k8s.io/cluster-name": name}},
        "spec": spec,
    }))
    .expect("OpenStackCluster");
    e2e.clusters()
        .create(&PostParams::default(), &cluster)
        .await
        .expect("OpenStackCluster created");
}

/// The Cluster API Cluster `name` over the OpenStackCluster `infra`, with Cluster API's
/// finalizer so that it stays while its parts go.
pub(crate) async fn create_capi_cluster(e2e: &E2e, name: &str, infra: &str) {
    let capi: Api<Cluster> = e2e.kube.api();
    let owner: Cluster = serde_json::from_value(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
        "metadata": {"name": name, "namespace": e2e.ns(),
                     "finalizers": ["cluster.cluster.x-k8s.io"]},
        "spec": {"infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io",
                                        "kind": "OpenStackCluster", "name": infra}}
    }))
    .expect("cluster");
    create_ours(&capi, &owner)
        .await
        .unwrap_or_else(|error| panic!("Cluster {name} not created: {error}"));
}

/// Creates `object`, named uniquely by its test, as `kubectl apply` run again would: an API
/// server error (5xx) is tried again, a few times, and a 409 is the object a try stored. In CI
/// the real API server's handler timed out in the suite's first minute after storing a create
/// ("failed calling webhook ... context canceled"), and kube's client sends a create again
/// after such a 504 by default.
pub(crate) async fn create_ours<K>(api: &Api<K>, object: &K) -> Result<(), kube::Error>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::Serialize + serde::de::DeserializeOwned,
{
    let mut attempt = 1;
    loop {
        match api.create(&PostParams::default(), object).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(status)) if status.code == 409 => return Ok(()),
            Err(kube::Error::Api(status)) if status.code >= 500 && attempt < 5 => {
                eprintln!("tried a create again after: {}", status.message);
                attempt += 1;
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            Err(error) => return Err(error),
        }
    }
}

/// Every member of the cluster's API pool on 6443, by address, with its provisioning status,
/// from the real status tree.
async fn api_members(
    tenant: &CloudClient,
    lb: &str,
) -> Option<BTreeMap<String, ProvisioningStatus>> {
    let tree = tenant.octavia().status_tree(lb).await.ok()?;
    let pools: Vec<String> = tree
        .listeners
        .iter()
        .flat_map(|l| l.pools.iter().map(|p| p.id.clone()))
        .collect();
    let mut members = BTreeMap::new();
    for pool in pools {
        for member in tenant.octavia().list_members(&pool).await.ok()? {
            if member.protocol_port == 6443 {
                members.insert(member.address, member.provisioning_status);
            }
        }
    }
    Some(members)
}

/// What the watcher saw during the machines' life.
#[derive(Debug, Default)]
struct Seen {
    samples: u64,
    /// The fewest ACTIVE members the API pool had, once it first had one.
    min_active: Option<usize>,
    /// Control-plane machines seen with a providerID while their member was not ACTIVE.
    released_early: Vec<String>,
}

/// Samples the machines, then the cloud's members, until `stop`: a machine seen released must
/// have its member ACTIVE in the cloud read after (members only move forward to ACTIVE).
fn watch_gate(
    e2e: &E2e,
    lb: String,
    stop: CancellationToken,
) -> (Arc<Mutex<Seen>>, JoinHandle<()>) {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let (machines, tenant, record) = (e2e.machines(), e2e.tenant.clone(), seen.clone());
    let task = tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            let Ok(list) = machines.list(&ListParams::default()).await else {
                continue;
            };
            // A cloud read that failed (a loaded Octavia timing out) is no sample.
            let Some(members) = api_members(&tenant, &lb).await else {
                continue;
            };
            let active = members
                .values()
                .filter(|s| **s == ProvisioningStatus::Active)
                .count();
            // A machine that looked joining with its providerID set, and whose member was not
            // ACTIVE: released early only if it is still joining when read again after the
            // cloud. A list read before a machine began to leave, while the cloud read after
            // shows its member going, is no early release (a loaded machine showed one).
            let suspects: Vec<String> = list
                .items
                .iter()
                .filter(|machine| {
                    crate::rollout::joining(machine)
                        && machine.spec.provider_id.is_some()
                        && gate::member_address(machine, &[]).is_some_and(|address| {
                            members.get(address) != Some(&ProvisioningStatus::Active)
                        })
                })
                .map(kube::ResourceExt::name_any)
                .collect();
            let mut confirmed = Vec::new();
            for name in suspects {
                if let Ok(Some(now)) = machines.get_opt(&name).await
                    && crate::rollout::joining(&now)
                {
                    confirmed.push(name);
                }
            }
            let mut seen = record.lock().unwrap_or_else(|e| e.into_inner());
            seen.samples += 1;
            if active > 0 || seen.min_active.is_some() {
                seen.min_active = Some(seen.min_active.map_or(active, |min| min.min(active)));
            }
            for name in confirmed {
                if !seen.released_early.contains(&name) {
                    seen.released_early.push(name);
                }
            }
        }
    });
    (seen, task)
}

/// Stops the gate watcher and checks what it saw: no machine released before its member was
/// ACTIVE, and always an ACTIVE member in the API pool.
async fn gate_held(
    stop: CancellationToken,
    watcher: JoinHandle<()>,
    seen: Arc<Mutex<Seen>>,
) -> Seen {
    stop.cancel();
    watcher.await.expect("watcher");
    let seen = std::mem::take(&mut *seen.lock().unwrap_or_else(|e| e.into_inner()));
    assert!(seen.samples > 5, "the watcher sampled throughout");
    assert_eq!(
        seen.released_early,
        Vec::<String>::new(),
        "no machine released before its member was ACTIVE"
    );
    assert!(
        seen.min_active.is_some_and(|min| min >= 1),
        "the API pool always had an ACTIVE member: {:?}",
        seen.min_active
    );
    seen
}

/// A cluster name of its own for each run: a run that failed leaves its objects behind, and a
/// cluster of the same name would adopt them.
pub(crate) fn unique_cluster_name(prefix: &str) -> String {
    format!("{prefix}-{:04x}", fastrand::u16(..))
}

pub(crate) fn actor(e2e: &E2e) -> CapiActor {
    CapiActor::start(
        e2e.client.clone(),
        CapiActorConfig {
            namespace: e2e.ns().into(),
            tick: Duration::from_millis(100),
            join_delay: Duration::from_millis(200),
            wait_timeout: WAIT,
        },
        CancellationToken::new(),
    )
}

pub(crate) fn plane(cluster: &str, replicas: usize) -> ControlPlane {
    ControlPlane {
        cluster: cluster.into(),
        replicas,
        template: machine_template(),
        version: "v1.33.4".into(),
        failure_domains: Vec::new(),
    }
}

/// Deletes the cluster as Cluster API does: the Cluster (it stays, deleting), its machines (the
/// actor's, if any), then the infrastructure cluster; then lets the Cluster go.
pub(crate) async fn delete_cluster(e2e: &E2e, actor: Option<&CapiActor>, name: &str) {
    delete_cluster_as(e2e, actor, name, name).await;
}

/// [`delete_cluster`] of a Cluster whose OpenStackCluster is named `infra`.
async fn delete_cluster_as(e2e: &E2e, actor: Option<&CapiActor>, name: &str, infra: &str) {
    let clusters: Api<Cluster> = e2e.kube.api();
    clusters
        .delete(name, &DeleteParams::default())
        .await
        .expect("Cluster delete");
    if let Some(actor) = actor {
        let all: Api<Machine> = e2e.kube.api();
        // Its own machines only: other clusters may be built beside it.
        let own = ListParams::default().labels(&format!("{}={name}", capi::labels::CLUSTER_NAME));
        let names: Vec<String> = all
            .list(&own)
            .await
            .expect("machines")
            .items
            .iter()
            .map(kube::ResourceExt::name_any)
            .collect();
        for machine in &names {
            actor.delete_machine(machine).await.expect("machine delete");
        }
        for machine in &names {
            waited(format!("{machine} gone"), actor.wait_gone(machine))
                .await
                .expect("machine gone");
        }
    }
    e2e.clusters()
        .delete(infra, &DeleteParams::default())
        .await
        .expect("OpenStackCluster delete");
    wait_gone(&e2e.clusters(), infra, WAIT).await;
    let release = json!({"metadata": {"finalizers": null}});
    clusters
        .patch(name, &PatchParams::default(), &Patch::Merge(&release))
        .await
        .expect("Cluster released");
}

/// The census after must equal the one before.
pub(crate) async fn assert_nothing_left(e2e: &E2e, before: &Census) {
    let after = census(&e2e.tenant).await;
    let left = new_objects(before, &after);
    assert!(
        left.is_empty(),
        "{}: left in the cloud: {left:#?}",
        e2e.label
    );
    let counts: BTreeMap<_, _> = after.iter().map(|(k, v)| (*k, v.len())).collect();
    let before: BTreeMap<_, _> = before.iter().map(|(k, v)| (*k, v.len())).collect();
    assert_eq!(counts, before, "{}: the census differs", e2e.label);
}

/// What CAPO's default template makes is there, in the cloud: the network and subnet on a
/// router with a gateway on the external network, the security groups with their rules, the
/// load balancer with its listener, pool and monitor, the API floating IP and the bastion.
async fn assert_cluster_built(e2e: &E2e, cluster: &OpenStackCluster) {
    let status = cluster.status.as_ref().expect("status");
    let network = status.network.as_ref().expect("a network");
    assert_eq!(network.subnets.len(), 1, "one subnet");
    let router = status.router.as_ref().expect("a router");
    let router_body = get_json(
        &e2e.tenant,
        Service::Network,
        &format!("routers/{}", router.id),
    )
    .await;
    let external = status
        .external_network
        .as_ref()
        .expect("the external network");
    assert_eq!(
        router_body["router"]["external_gateway_info"]["network_id"].as_str(),
        Some(external.id.as_str()),
        "the router's gateway is on the external network"
    );
    for group in [
        status.control_plane_security_group.as_ref(),
        status.worker_security_group.as_ref(),
        status.bastion_security_group.as_ref(),
    ] {
        let group = group.expect("a managed security group");
        let body = get_json(
            &e2e.tenant,
            Service::Network,
            &format!("security-groups/{}", group.id),
        )
        .await;
        let rules = body["security_group"]["security_group_rules"]
            .as_array()
            .map_or(0, Vec::len);
        assert!(
            rules > 2,
            "{}: its rules are in place ({rules})",
            group.name
        );
    }
    let lb = status
        .api_server_managed_load_balancer
        .as_ref()
        .expect("the API load balancer");
    let tree = e2e
        .tenant
        .octavia()
        .status_tree(&lb.id)
        .await
        .expect("status tree");
    let listener = tree.listeners.first().expect("a listener");
    let pool = listener.pools.first().expect("a pool");
    assert!(pool.health_monitor.is_some(), "the pool has a monitor");
    assert_ne!(lb.ip, lb.internal_ip, "the API address is a floating IP");
    let fips = get_json(&e2e.tenant, Service::Network, "floatingips").await;
    assert!(
        fips["floatingips"].as_array().is_some_and(|all| all
            .iter()
            .any(|f| f["floating_ip_address"] == lb.ip.as_str())),
        "the API floating IP {} exists",
        lb.ip
    );
    let bastion = status.bastion.as_ref().expect("a bastion");
    assert_eq!(
        bastion.state.as_deref(),
        Some("ACTIVE"),
        "the bastion is ACTIVE"
    );
    let server = e2e
        .tenant
        .nova()
        .get_server(bastion.id.as_deref().expect("bastion id"))
        .await
        .expect("the bastion's server");
    assert_eq!(server.status, "ACTIVE");
}

/// Each machine has an ACTIVE server with its port; control-plane ones an ACTIVE member.
async fn assert_machines_built(e2e: &E2e, lb: &str) {
    let members = api_members(&e2e.tenant, lb)
        .await
        .expect("the API pool's members read");
    for machine in e2e
        .machines()
        .list(&ListParams::default())
        .await
        .expect("machines")
        .items
    {
        let name = kube::ResourceExt::name_any(&machine);
        let id = machine
            .status
            .as_ref()
            .and_then(|s| s.instance_id.clone())
            .unwrap_or_else(|| panic!("{name}: no server id"));
        let server = e2e.tenant.nova().get_server(&id).await.expect("server");
        assert_eq!(server.status, "ACTIVE", "{name}'s server");
        let ports = get_json(
            &e2e.tenant,
            Service::Network,
            &format!("ports?device_id={id}"),
        )
        .await;
        assert_eq!(
            ports["ports"].as_array().map_or(0, Vec::len),
            1,
            "{name}: one port"
        );
        let capo_says = |type_: &str| {
            machine
                .status
                .as_ref()
                .map(|s| status_of(&s.conditions, type_))
                .map(|(status, reason, _)| (status, reason))
        };
        assert_eq!(
            capo_says(capo_types::OPENSTACK_AUTHENTICATION_SUCCEEDED),
            Some(("True".into(), "Ready".into())),
            "{name}: CAPO's authentication condition"
        );
        if capi::is_control_plane(kube::ResourceExt::labels(&machine)) {
            let address = gate::member_address(&machine, &[]).expect("an address");
            assert_eq!(
                members.get(address),
                Some(&ProvisioningStatus::Active),
                "{name}'s member"
            );
            assert_eq!(
                capo_says(capo_types::API_SERVER_INGRESS_READY),
                Some(("True".into(), "Ready".into())),
                "{name}: CAPO's ingress condition, once its member is ACTIVE"
            );
        }
    }
}

/// CAPO's default template end to end: the cluster, 3 control-plane machines and a worker, a
/// rollout of the whole control plane under the gate, deletion, and the census.
async fn cluster_lifecycle(e2e: &mut E2e) {
    let name = unique_cluster_name("c1");
    let before = census(&e2e.tenant).await;
    let started = Instant::now();
    create_cluster(e2e, &name).await;
    wait_provisioned(e2e, &name).await;
    let to_provisioned = started.elapsed();
    let cluster = wait_bastion(e2e, &name).await;
    let cluster_requests = e2e.requests();
    assert_cluster_built(e2e, &cluster).await;
    let lb = cluster
        .status
        .as_ref()
        .and_then(|s| s.api_server_managed_load_balancer.as_ref())
        .map(|lb| lb.id.clone())
        .expect("the LB's id");

    let actor = actor(e2e);
    let stop = CancellationToken::new();
    let (seen, watcher) = watch_gate(e2e, lb.clone(), stop.clone());
    let plane = plane(&name, 3);
    let machines_started = Instant::now();
    actor
        .scale_control_plane(&plane)
        .await
        .expect("3 control-plane machines");
    let workers = actor
        .create_workers(&name, 1, machine_template())
        .await
        .expect("a worker");
    for worker in &workers {
        actor.wait_joined(worker).await.expect("the worker joins");
    }
    let machines_took = machines_started.elapsed();
    let machine_requests = e2e.requests();
    assert_machines_built(e2e, &lb).await;
    operating_pages_read(e2e, &name, &lb, &plane).await;

    let rollout = actor
        .rollout(&plane, |_: RolloutStep| {})
        .await
        .expect("the rollout");
    let rollout_requests = e2e.requests();
    assert_eq!(
        rollout.replaced.len(),
        3,
        "every control-plane machine replaced"
    );
    assert_machines_built(e2e, &lb).await;
    let seen = gate_held(stop, watcher, seen).await;

    let deleting = Instant::now();
    delete_cluster(e2e, Some(&actor), &name).await;
    let delete_took = deleting.elapsed();
    actor.stop().await;
    assert_nothing_left(e2e, &before).await;
    let deleted_requests = e2e.requests();
    eprintln!(
        "FIGURES e2e {}: apply to provisioned {:.1} s; cluster requests {}; 4 machines in {:.1} s, requests {}; rollout of 3 in {:.1} s, requests {}; delete in {:.1} s, requests {}; min ACTIVE members {:?}",
        e2e.label,
        to_provisioned.as_secs_f64(),
        spent(&BTreeMap::new(), &cluster_requests),
        machines_took.as_secs_f64(),
        spent(&cluster_requests, &machine_requests),
        rollout.elapsed.as_secs_f64(),
        spent(&machine_requests, &rollout_requests),
        delete_took.as_secs_f64(),
        spent(&rollout_requests, &deleted_requests),
        seen.min_active,
    );
}

/// The operating pages' reads, pasted against this cluster, once its machines are built: on
/// the real tiers alone (the `openstack` client and kubectl need a real cloud and API server).
async fn operating_pages_read(e2e: &E2e, cluster: &str, lb: &str, plane: &ControlPlane) {
    // The real cloud's, not the simulator's: the second pass runs the simulated cloud on a
    // real API server, where the tier's clouds.yaml names another cloud than the cluster's.
    let (Some(kubeconfig), Ok(clouds_yaml), "real") = (
        e2e.kube.admin_kubeconfig(),
        std::env::var("CAPO_REAL_OPENSTACK_CLOUDS"),
        e2e.label,
    ) else {
        eprintln!(
            "{}: the operating pages' reads need the real tiers; not run",
            e2e.label
        );
        return;
    };
    let status = e2e
        .clusters()
        .get(cluster)
        .await
        .expect("the OpenStackCluster")
        .status
        .and_then(|s| s.api_server_managed_load_balancer)
        .expect("its load balancer");
    let member = (status.members.iter())
        .find(|m| m.name.starts_with(&plane.cluster) && m.id.is_some())
        .expect("a member capo-rs saw");
    crate::operating_pages::the_operating_pages_reads(&crate::operating_pages::Reads {
        kubeconfig: &kubeconfig,
        clouds_yaml: std::path::Path::new(&clouds_yaml),
        cloud: PASSWORD_CLOUD,
        namespace: e2e.ns(),
        cluster,
        machine: &member.name,
        member: member.id.as_deref().unwrap_or_default(),
        pool: &member.pool,
        lb,
    })
    .await;
}

/// An OpenStackServer with a root volume, an extra volume and a trunk reaches Ready with each
/// in the cloud, and deletes cleanly. The extra volume is of a multiattach type (made by
/// `tests/openstack/setup_cloud.py`, seeded in the simulator): Nova attaches it only to a server
/// created at microversion 2.60 or later, as CAPO asks for it (`NovaMultiAttachVolume`).
async fn server_with_volumes(e2e: &mut E2e) {
    let before = census(&e2e.tenant).await;
    let name = unique_cluster_name("vols");
    let server: OpenStackServer = serde_json::from_value(json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1", "kind": "OpenStackServer",
        "metadata": {"name": name, "namespace": e2e.ns()},
        "spec": {
            "flavor": FLAVOR,
            "image": {"filter": {"name": IMAGE}},
            "sshKeyName": KEY_PAIR,
            "identityRef": {"name": SECRET, "cloudName": e2e.cloud_name},
            "ports": [{"network": {"filter": {"name": TENANT_NETWORK}}}],
            "trunk": true,
            "rootVolume": {"sizeGiB": 5},
            "additionalBlockDevices": [
                {"name": "etcd", "sizeGiB": 1, "storage": {"type": "Volume",
                    "volume": {"type": MULTIATTACH_VOLUME_TYPE}}}
            ],
            "tags": ["capo-rs-e2e"],
        }
    }))
    .expect("OpenStackServer");
    let started = Instant::now();
    e2e.servers()
        .create(&PostParams::default(), &server)
        .await
        .expect("OpenStackServer created");
    let ready = wait_for(&e2e.servers(), &name, "Ready", WAIT, |s| {
        s.status
            .as_ref()
            .is_some_and(|st| status_of(&st.conditions, types::READY).0 == "True")
    })
    .await;
    let to_ready = started.elapsed();
    let status = ready.status.expect("status");
    let id = status.instance_id.expect("a server id");
    let server = e2e.tenant.nova().get_server(&id).await.expect("server");
    assert_eq!(server.status, "ACTIVE");
    let volumes = status.resources.expect("resources").volumes;
    let names: Vec<String> = volumes.iter().map(|v| v.name.clone()).collect();
    assert_eq!(names, [format!("{name}-root"), format!("{name}-etcd")]);
    for volume in &volumes {
        let body = get_json(
            &e2e.tenant,
            Service::BlockStorage,
            &format!("volumes/{}", volume.id),
        )
        .await;
        assert_eq!(
            body["volume"]["status"], "in-use",
            "{} is attached",
            volume.name
        );
        assert_eq!(
            body["volume"]["attachments"][0]["server_id"].as_str(),
            Some(id.as_str()),
            "{} is attached to the server",
            volume.name
        );
        assert_eq!(
            body["volume"]["multiattach"],
            volume.name.ends_with("-etcd"),
            "{}: multiattach as its type says",
            volume.name
        );
    }
    let ports = get_json(
        &e2e.tenant,
        Service::Network,
        &format!("ports?device_id={id}"),
    )
    .await;
    let port = ports["ports"][0]["id"]
        .as_str()
        .expect("the server's port")
        .to_owned();
    let trunks = get_json(
        &e2e.tenant,
        Service::Network,
        &format!("trunks?port_id={port}"),
    )
    .await;
    assert_eq!(
        trunks["trunks"].as_array().map_or(0, Vec::len),
        1,
        "a trunk on its port"
    );
    let requests = e2e.requests();
    e2e.servers()
        .delete(&name, &DeleteParams::default())
        .await
        .expect("delete");
    wait_gone(&e2e.servers(), &name, WAIT).await;
    assert_nothing_left(e2e, &before).await;
    eprintln!(
        "FIGURES e2e {} server with volumes ({}): Ready in {:.1} s, requests {}; delete, requests {}",
        e2e.label,
        e2e.cloud_name,
        to_ready.as_secs_f64(),
        spent(&BTreeMap::new(), &requests),
        spent(&requests, &e2e.requests()),
    );
}

/// A volume type whose volumes are multiattach, on the real tier and in the simulator.
const MULTIATTACH_VOLUME_TYPE: &str = "multiattach";

/// The cluster without a bastion: what the fault and restart scenarios build.
async fn create_plain_cluster(e2e: &E2e, name: &str) {
    create_cluster(e2e, name).await;
    // Disabled first: as CAPO's webhook, the CRD refuses removing an enabled bastion.
    for patch in [
        json!({"spec": {"bastion": {"enabled": false}}}),
        json!({"spec": {"bastion": null}}),
    ] {
        e2e.clusters()
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("no bastion");
    }
}

/// The bastion comes once the rest is in place, as in CAPO: running, with its floating IP.
async fn wait_bastion(e2e: &E2e, name: &str) -> OpenStackCluster {
    wait_for(
        &e2e.clusters(),
        name,
        "with its bastion ACTIVE",
        WAIT,
        |c| {
            c.status
                .as_ref()
                .and_then(|s| s.bastion.as_ref())
                .is_some_and(|b| b.state.as_deref() == Some("ACTIVE") && b.floating_ip.is_some())
        },
    )
    .await
}

pub(crate) async fn wait_provisioned(e2e: &E2e, name: &str) -> OpenStackCluster {
    wait_for(&e2e.clusters(), name, "provisioned and Ready", WAIT, |c| {
        provisioned(c) && cluster_is(types::READY)(c)
    })
    .await
}

/// Polls the census until `kind` has a new object (bounded).
async fn until_new(e2e: &E2e, before: &Census, kind: &str) {
    let deadline = Instant::now() + WAIT;
    loop {
        let now = census(&e2e.tenant).await;
        if new_objects(before, &now).contains_key(kind) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{}: no new {kind} appeared",
            e2e.label
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn assert_no_duplicates(e2e: &E2e, before: &Census, after: &Census) {
    let duplicated = duplicated_names(before, after);
    assert!(
        duplicated.is_empty(),
        "{}: made twice: {duplicated:?}\nnew: {:#?}",
        e2e.label,
        new_objects(before, after)
    );
}

/// A controller killed in the middle of bring-up (while its load balancer is being built,
/// and again while the bastion's server builds) and started again duplicates nothing.
async fn restart_during_bring_up(e2e: &mut E2e) {
    let name = unique_cluster_name("c2");
    let before = census(&e2e.tenant).await;
    create_cluster(e2e, &name).await;
    until_new(e2e, &before, "load balancers").await;
    e2e.stop_manager(false).await;
    e2e.start_manager();
    until_new(e2e, &before, "servers").await;
    e2e.stop_manager(false).await;
    e2e.start_manager();
    wait_provisioned(e2e, &name).await;
    wait_bastion(e2e, &name).await;
    let during = census(&e2e.tenant).await;
    assert_no_duplicates(e2e, &before, &during);
    let new = new_objects(&before, &during);
    for (kind, count) in [
        ("networks", 1),
        ("routers", 1),
        ("load balancers", 1),
        ("servers", 1),
    ] {
        assert_eq!(
            new.get(kind).map_or(0, Vec::len),
            count,
            "{}: {kind} after two restarts: {new:#?}",
            e2e.label
        );
    }
    delete_cluster(e2e, None, &name).await;
    assert_nothing_left(e2e, &before).await;
}

/// A service taken away during a scenario.
#[derive(Clone, Copy, Debug)]
enum Down {
    Keystone,
    NovaApi,
    NeutronApi,
}

impl Down {
    /// The service's name in tests/openstack (fault.sh).
    fn process(self) -> &'static str {
        match self {
            Down::Keystone => "keystone",
            Down::NovaApi => "nova-api",
            Down::NeutronApi => "neutron-api",
        }
    }

    /// How the provider names it in its errors (the catalog type).
    fn catalog(self) -> &'static str {
        match self {
            Down::Keystone => "identity",
            Down::NovaApi => "compute",
            Down::NeutronApi => "network",
        }
    }
}

impl E2e {
    /// The real tier stops the service (its port refuses connections); the simulator answers
    /// its requests 503.
    async fn take_down(&self, down: Down) {
        match &self.sim {
            None => fault(&["stop", down.process()]).await,
            Some(sim) => {
                let mut scenario = Scenario {
                    timings: timings(),
                    ..Scenario::default()
                };
                match down {
                    Down::Keystone => scenario.keystone_outages.push(Outage {
                        from: 0.0,
                        until: f64::MAX,
                    }),
                    Down::NovaApi | Down::NeutronApi => {
                        scenario.server_errors.push(ServerErrorFault {
                            service: Some(down.catalog().into()),
                            probability: 1.0,
                            status: 503,
                        })
                    }
                }
                sim.set_scenario(scenario);
            }
        }
    }

    async fn bring_back(&self, down: Down) {
        match &self.sim {
            None => fault(&["start", down.process()]).await,
            Some(sim) => sim.set_scenario(Scenario {
                timings: timings(),
                ..Scenario::default()
            }),
        }
    }

    fn terminal_errors(&self) -> f64 {
        metric_sum(
            &self.registry,
            "controller_runtime_terminal_reconcile_errors_total",
        )
    }
}

/// Whether any condition of these says the cloud is unavailable and names `service`.
fn says_unavailable(conditions: &[Condition], service: &str) -> bool {
    conditions
        .iter()
        .any(|c| c.reason == reasons::OPENSTACK_UNAVAILABLE && c.message.contains(service))
}

fn cluster_says_unavailable(service: &'static str) -> impl Fn(&OpenStackCluster) -> bool {
    move |c| {
        c.status
            .as_ref()
            .is_some_and(|s| says_unavailable(&s.conditions, service))
    }
}

/// Keystone stopped for 30 s while a fresh controller brings a cluster up: the cluster says
/// so, nothing turns terminal, and it converges once Keystone is back.
async fn keystone_outage(e2e: &mut E2e) {
    let name = unique_cluster_name("c3");
    let before = census(&e2e.tenant).await;
    let down = Down::Keystone;
    e2e.take_down(down).await;
    let stopped = Instant::now();
    create_plain_cluster(e2e, &name).await;
    let seen = wait_for(
        &e2e.clusters(),
        &name,
        "saying Keystone is unavailable",
        WAIT,
        cluster_says_unavailable(down.catalog()),
    )
    .await;
    eprintln!(
        "{}: while Keystone is down: {:?}",
        e2e.label,
        seen.status.map(|s| s.conditions)
    );
    let outage = Duration::from_secs(30);
    tokio::time::sleep(outage.saturating_sub(stopped.elapsed())).await;
    e2e.bring_back(down).await;
    let back = Instant::now();
    wait_provisioned(e2e, &name).await;
    eprintln!(
        "FIGURES e2e {}: provisioned {:.1} s after Keystone came back",
        e2e.label,
        back.elapsed().as_secs_f64()
    );
    assert_eq!(e2e.terminal_errors(), 0.0, "nothing turned terminal");
    assert_no_duplicates(e2e, &before, &census(&e2e.tenant).await);
    delete_cluster(e2e, None, &name).await;
    assert_nothing_left(e2e, &before).await;
}

/// The Nova API stopped while the machines' servers build (a worker's server in BUILD, and a
/// control-plane machine asked for while Nova is away): the machines say so, nothing turns
/// terminal, and both join once it is back; nothing is made twice.
async fn nova_outage_while_servers_build(e2e: &mut E2e) {
    let name = unique_cluster_name("c4");
    let before = census(&e2e.tenant).await;
    create_plain_cluster(e2e, &name).await;
    wait_provisioned(e2e, &name).await;
    let actor = actor(e2e);
    let plane = plane(&name, 1);
    let workers = actor
        .create_workers(&name, 1, machine_template())
        .await
        .expect("a worker");
    until_new(e2e, &before, "servers").await;
    let down = Down::NovaApi;
    e2e.take_down(down).await;
    let stopped = Instant::now();
    let outage = async {
        until_a_machine(e2e, "says Nova is unavailable", |m| {
            m.status
                .as_ref()
                .is_some_and(|s| says_unavailable(&s.conditions, down.catalog()))
        })
        .await;
        tokio::time::sleep(Duration::from_secs(20).saturating_sub(stopped.elapsed())).await;
        e2e.bring_back(down).await;
    };
    let (scaled, ()) = tokio::join!(actor.scale_control_plane(&plane), outage);
    scaled.expect("the control-plane machine");
    for worker in &workers {
        actor.wait_joined(worker).await.expect("the worker joins");
    }
    assert_eq!(e2e.terminal_errors(), 0.0, "nothing turned terminal");
    assert_no_duplicates(e2e, &before, &census(&e2e.tenant).await);
    delete_cluster(e2e, Some(&actor), &name).await;
    actor.stop().await;
    assert_nothing_left(e2e, &before).await;
}

/// Polls the OpenStackMachines until one satisfies `done` (bounded).
pub(crate) async fn until_a_machine(
    e2e: &E2e,
    what: &str,
    done: impl Fn(&OpenStackMachine) -> bool,
) {
    let deadline = Instant::now() + WAIT;
    loop {
        let list = e2e.machines().list(&ListParams::default()).await;
        if list.as_ref().is_ok_and(|l| l.items.iter().any(&done)) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{}: no machine {what}: {list:#?}",
            e2e.label
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A worker's `allowedAddressPairs` edit (the one machine spec edit CAPO admits, #3056)
/// reaches its existing port, once; Neutron gives each pair the port's MAC.
async fn address_pairs_follow_the_machine(e2e: &mut E2e) {
    let name = unique_cluster_name("pairs");
    let before = census(&e2e.tenant).await;
    create_plain_cluster(e2e, &name).await;
    wait_provisioned(e2e, &name).await;
    let actor = actor(e2e);
    let pairs = |ips: &[&str]| -> Value { ips.iter().map(|ip| json!({"ipAddress": ip})).collect() };
    let mut template = serde_json::to_value(machine_template()).expect("spec");
    template["ports"] = json!([{"allowedAddressPairs": pairs(&["10.6.0.250"])}]);
    let template = serde_json::from_value(template).expect("a machine spec");
    let workers = actor
        .create_workers(&name, 1, template)
        .await
        .expect("a worker");
    let worker = workers.first().expect("one worker");
    actor.wait_joined(worker).await.expect("the worker joins");
    let port_of = async |e2e: &E2e| {
        let machine = e2e.machines().get(worker).await.expect("the machine");
        let port = machine
            .status
            .and_then(|s| s.resources)
            .and_then(|r| r.ports.first().map(|p| p.id.clone()))
            .expect("the machine's port");
        e2e.tenant
            .neutron()
            .get_port(&port)
            .await
            .expect("the port")
    };
    let ips = |port: &capo_provider::cloud::neutron::Port| -> Vec<String> {
        port.allowed_address_pairs
            .iter()
            .filter_map(|p| p["ip_address"].as_str().map(str::to_owned))
            .collect()
    };
    assert_eq!(
        ips(&port_of(e2e).await),
        ["10.6.0.250"],
        "{}: made with the pair",
        e2e.label
    );

    // JSON patches, not a read and a replace: capo-rs may write the machine in between, and
    // the replace would then meet a 409 that says nothing about admission.
    e2e.machines()
        .patch(
            worker,
            &PatchParams::default(),
            &spec_edit(
                "/spec/ports/0/allowedAddressPairs",
                pairs(&["10.6.0.250", "10.6.0.251/32"]),
            ),
        )
        .await
        .expect("an allowedAddressPairs edit is admitted");
    until_a_machine(e2e, "with its new address pairs pushed", |m| {
        m.metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(ADDRESS_PAIRS_ANNOTATION))
    })
    .await;
    let port = port_of(e2e).await;
    assert_eq!(ips(&port), ["10.6.0.250", "10.6.0.251/32"], "{}", e2e.label);
    for pair in &port.allowed_address_pairs {
        assert_eq!(
            pair["mac_address"],
            port.mac_address.as_str(),
            "{}: the port's MAC",
            e2e.label
        );
    }
    // The template's edit: Cluster API marks what it cloned; capo-rs gives the machines the
    // template's pairs, and their ports follow.
    let templates: Api<OpenStackMachineTemplate> = e2e.kube.api();
    let mut machine = e2e.machines().get(worker).await.expect("the machine");
    machine.spec.provider_id = None;
    let template: OpenStackMachineTemplate = serde_json::from_value(json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2",
        "kind": "OpenStackMachineTemplate",
        "metadata": {"name": format!("{name}-md"), "namespace": e2e.ns(),
                     "labels": {"cluster.x-k8s.io/cluster-name": name}},
        "spec": {"template": {"spec": machine.spec.clone()}},
    }))
    .expect("a template");
    templates
        .create(&PostParams::default(), &template)
        .await
        .expect("the template");
    let cloned = json!({"metadata": {"annotations": {
        "cluster.x-k8s.io/cloned-from-name": format!("{name}-md"),
        "cluster.x-k8s.io/cloned-from-groupkind": "OpenStackMachineTemplate.infrastructure.cluster.x-k8s.io"}}});
    e2e.machines()
        .patch(worker, &PatchParams::default(), &Patch::Merge(&cloned))
        .await
        .expect("marked as cloned");
    templates
        .patch(
            &format!("{name}-md"),
            &PatchParams::default(),
            &spec_edit(
                "/spec/template/spec/ports/0/allowedAddressPairs",
                pairs(&["10.6.0.252"]),
            ),
        )
        .await
        .expect("a template's allowedAddressPairs edit is admitted");
    let deadline = Instant::now() + WAIT;
    while ips(&port_of(e2e).await) != ["10.6.0.252"] {
        assert!(
            Instant::now() < deadline,
            "{}: the template's pairs never reached the port",
            e2e.label
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    templates
        .delete(&format!("{name}-md"), &Default::default())
        .await
        .expect("deleted");
    let refused = e2e
        .machines()
        .patch(
            worker,
            &PatchParams::default(),
            &spec_edit("/spec/sshKeyName", json!("another")),
        )
        .await;
    assert!(
        matches!(&refused, Err(kube::Error::Api(status)) if status.code == 422),
        "{}: any other spec edit is refused as invalid: {refused:?}",
        e2e.label
    );
    delete_cluster(e2e, Some(&actor), &name).await;
    actor.stop().await;
    assert_nothing_left(e2e, &before).await;
}

/// A JSON patch that sets `path` to `value`.
fn spec_edit(path: &str, value: Value) -> Patch<()> {
    let edit = serde_json::from_value(json!([{"op": "add", "path": path, "value": value}]));
    Patch::Json(edit.expect("a JSON patch"))
}

/// Reconciles of `controller` that ended well, from the manager's metrics.
fn reconciled(e2e: &E2e, controller: &str) -> f64 {
    e2e.registry
        .gather()
        .iter()
        .filter(|family| family.name() == "controller_runtime_reconcile_total")
        .flat_map(|family| family.get_metric())
        .filter(|m| {
            let label = |name: &str, value: &str| {
                m.get_label()
                    .iter()
                    .any(|l| l.name() == name && l.value() == value)
            };
            label("controller", controller) && label("result", "success")
        })
        .map(|m| m.get_counter().get_value())
        .sum()
}

/// Scale from zero: with CAPO's AutoScaleFromZero gate (off by default, as CAPO's: the
/// template is then reconciled and left without status), a machine template's status says
/// what a machine of it would be (its flavor's cpu, memory, disks; its image's OS), from the
/// cloud, for the autoscaler, in two reads; a resync reads nothing more.
async fn template_describes_its_machines(e2e: &mut E2e) {
    use capo_provider::controllers::machine_template;
    let name = unique_cluster_name("tmpl");
    let templates: Api<OpenStackMachineTemplate> = e2e.kube.api();
    let template: OpenStackMachineTemplate = serde_json::from_value(json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2",
        "kind": "OpenStackMachineTemplate",
        "metadata": {"name": name, "namespace": e2e.ns()},
        "spec": {"template": {"spec": {
            "flavor": {"filter": {"name": "m1.ephemeral"}},
            "image": {"filter": {"name": IMAGE}},
            "identityRef": {"name": SECRET, "cloudName": e2e.cloud_name},
        }}},
    }))
    .expect("a template");
    let done_before = reconciled(e2e, machine_template::CONTROLLER);
    templates
        .create(&PostParams::default(), &template)
        .await
        .expect("the template");
    crate::server_controller::eventually("the template reconciled", || async {
        (reconciled(e2e, machine_template::CONTROLLER) > done_before).then_some(())
    })
    .await;
    let undescribed = templates.get(&name).await.expect("the template");
    assert!(
        undescribed.status.is_none_or(|s| s.capacity.is_empty()),
        "{}: without the gate, no capacity",
        e2e.label
    );
    e2e.stop_manager(true).await;
    let before = e2e.requests();
    e2e.start_manager_with(|config| config.features.auto_scale_from_zero = true);
    let described = wait_for(&templates, &name, "with its capacity", WAIT, |t| {
        t.status.as_ref().is_some_and(|s| !s.capacity.is_empty())
    })
    .await;
    let status = described.status.expect("a status");
    let capacity: BTreeMap<&str, &str> = status
        .capacity
        .iter()
        .map(|(k, v)| (k.as_str(), v.0.as_str()))
        .collect();
    assert_eq!(
        capacity,
        BTreeMap::from([
            ("cpu", "1"),
            ("ephemeral-storage", "5Gi"),
            ("memory", "1Gi"),
            ("storage", "10Gi"),
        ]),
        "{}",
        e2e.label
    );
    assert_eq!(
        status.node_info.and_then(|n| n.operating_system).as_deref(),
        Some("linux"),
        "{}: the image's os_type",
        e2e.label
    );
    assert_sent(e2e, "patch", "openstackmachinetemplates/status").await;
    let spent_on_it = spent(&before, &e2e.requests());
    eprintln!(
        "FIGURES scale from zero {}: requests {spent_on_it}",
        e2e.label
    );
    templates
        .delete(&name, &Default::default())
        .await
        .expect("deleted");
}

/// Asserts the manager sent `grant` (verb, group, resource): the test sends none of those
/// [`crate::packaging::used_by_orc_and_templates`] names.
async fn assert_sent(e2e: &E2e, verb: &str, resource: &str) {
    let grants = crate::packaging::used_by_orc_and_templates();
    assert!(
        grants.iter().any(|(v, _, r)| v == verb && r == resource),
        "{verb} {resource} is one of the grants shown used here"
    );
    // The simulator logs a request once it has answered it, which may be just after its
    // effect is seen.
    let deadline = Instant::now() + Duration::from_secs(10);
    // On the real server RBAC is what refuses a missing grant; the request log is the
    // simulator's.
    let Server::Sim(sim) = &e2e.kube.server else {
        return;
    };
    let sent = || {
        sim.requests()
            .into_iter()
            .any(|r| r.verb == verb && r.resource == resource)
    };
    while !sent() {
        assert!(
            Instant::now() < deadline,
            "{}: the manager sent {verb} {resource}",
            e2e.label
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A server whose image is an ORC Image (`imageRef`): it waits, saying so, while the Image
/// is not available, is woken by the Image's change, and boots the Glance image whose ID the
/// Image reports. The test writes the status ORC would write.
async fn orc_image_is_waited_for_and_used(e2e: &mut E2e) {
    let before = census(&e2e.tenant).await;
    let name = unique_cluster_name("orc");
    let images: Api<kube::api::DynamicObject> = Api::namespaced_with(
        e2e.client.clone(),
        e2e.ns(),
        &capo_provider::controllers::server::orc::image_resource(),
    );
    let server: OpenStackServer = serde_json::from_value(json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1", "kind": "OpenStackServer",
        "metadata": {"name": name, "namespace": e2e.ns()},
        "spec": {
            "flavor": FLAVOR,
            "image": {"imageRef": {"name": format!("{name}-image")}},
            "sshKeyName": KEY_PAIR,
            "identityRef": {"name": SECRET, "cloudName": e2e.cloud_name},
            "ports": [{"network": {"filter": {"name": TENANT_NETWORK}}}],
        }
    }))
    .expect("OpenStackServer");
    e2e.servers()
        .create(&PostParams::default(), &server)
        .await
        .expect("OpenStackServer created");
    let says = |s: &OpenStackServer, what: &str| {
        s.status.as_ref().is_some_and(|st| {
            let (_, reason, message) = status_of(&st.conditions, types::INSTANCE_READY);
            reason == reasons::DEPENDENCY_MISSING && message.contains(what)
        })
    };
    wait_for(
        &e2e.servers(),
        &name,
        "waiting for the ORC CRD",
        WAIT,
        |s| says(s, "is ORC"),
    )
    .await;
    let crd: Value = serde_saphyr::from_str(
        &std::fs::read_to_string("tests/fixtures/orc-image-crd.yaml").expect("ORC's CRD"),
    )
    .expect("YAML");
    e2e.kube.install(&[crd]).await;
    let image: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "openstack.k-orc.cloud/v1alpha1", "kind": "Image",
        "metadata": {"name": format!("{name}-image"), "namespace": e2e.ns()},
        "spec": {"cloudCredentialsRef": {"secretName": SECRET, "cloudName": e2e.cloud_name},
                 "managementPolicy": "unmanaged", "import": {"filter": {"name": IMAGE}}},
    }))
    .expect("an ORC Image");
    let created = images
        .create(&PostParams::default(), &image)
        .await
        .expect("the Image");
    wait_for(&e2e.servers(), &name, "waiting for the Image", WAIT, |s| {
        says(s, "is not available yet")
    })
    .await;
    let glance = e2e
        .tenant
        .glance()
        .list_images(Some(IMAGE), &[])
        .await
        .expect("images");
    let glance_id = glance.first().expect("the test image").id.clone();
    let generation = created.metadata.generation.unwrap_or(1);
    let available = json!({"status": {"id": glance_id, "conditions": [
        {"type": "Available", "status": "True", "reason": "Success", "message": "OpenStack resource is available",
         "lastTransitionTime": "2026-11-24T00:00:00Z", "observedGeneration": generation},
        {"type": "Progressing", "status": "False", "reason": "Success", "message": "OpenStack resource is up to date",
         "lastTransitionTime": "2026-11-24T00:00:00Z", "observedGeneration": generation}]}});
    images
        .patch_status(
            &format!("{name}-image"),
            &PatchParams::default(),
            &Patch::Merge(&available),
        )
        .await
        .expect("the status ORC writes");
    // The sync period is ten minutes: only the Image's watch can bring this about now.
    let ready = wait_for(&e2e.servers(), &name, "Ready", WAIT, |s| {
        s.status
            .as_ref()
            .is_some_and(|st| status_of(&st.conditions, types::READY).0 == "True")
    })
    .await;
    let status = ready.status.expect("status");
    assert_eq!(
        status.resolved.and_then(|r| r.image_id).as_deref(),
        Some(glance_id.as_str()),
        "{}: the Image's ID",
        e2e.label
    );
    let id = status.instance_id.expect("a server id");
    let booted = e2e.tenant.nova().get_server(&id).await.expect("server");
    assert_eq!(booted.status, "ACTIVE", "{}", e2e.label);
    assert_sent(e2e, "get", "images").await;
    assert_sent(e2e, "watch", "images").await;
    e2e.servers()
        .delete(&name, &Default::default())
        .await
        .expect("deleted");
    wait_gone(&e2e.servers(), &name, WAIT).await;
    assert_nothing_left(e2e, &before).await;
}

/// Neutron stopped while the cluster's network is being built: the cluster says so, nothing
/// turns terminal, and it converges once Neutron is back; nothing is made twice.
async fn neutron_outage_during_bring_up(e2e: &mut E2e) {
    let name = unique_cluster_name("c5");
    let before = census(&e2e.tenant).await;
    create_plain_cluster(e2e, &name).await;
    until_new(e2e, &before, "networks").await;
    let down = Down::NeutronApi;
    e2e.take_down(down).await;
    wait_for(
        &e2e.clusters(),
        &name,
        "saying Neutron is unavailable",
        WAIT,
        cluster_says_unavailable(down.catalog()),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(20)).await;
    e2e.bring_back(down).await;
    wait_provisioned(e2e, &name).await;
    assert_eq!(e2e.terminal_errors(), 0.0, "nothing turned terminal");
    assert_no_duplicates(e2e, &before, &census(&e2e.tenant).await);
    delete_cluster(e2e, None, &name).await;
    assert_nothing_left(e2e, &before).await;
}

/// Runs a scenario on the real tier, alone, with faults cleared before and after.
/// The templates CAPO's cluster templates make (a ClusterClass's cluster template, the
/// machines' template), named after the cluster.
fn templates(e2e: &E2e, name: &str) -> [(&'static str, Value); 2] {
    let machine = serde_json::to_value(machine_template()).expect("spec");
    let cluster = cluster_spec(e2e.cloud_name, &e2e.external_network);
    [
        (
            "OpenStackClusterTemplate",
            json!({"template": {"spec": cluster}}),
        ),
        (
            "OpenStackMachineTemplate",
            json!({"template": {"spec": machine}}),
        ),
    ]
    .map(|(kind, spec)| {
        (
            kind,
            json!({"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": kind,
                      "metadata": {"name": name, "namespace": e2e.ns()}, "spec": spec}),
        )
    })
}

async fn create_templates(e2e: &E2e, name: &str) {
    for (kind, template) in templates(e2e, name) {
        let api: Api<kube::api::DynamicObject> = Api::namespaced_with(
            e2e.client.clone(),
            e2e.ns(),
            &crate::conversion::resource(kind, "v1beta2"),
        );
        api.create(
            &PostParams::default(),
            &serde_json::from_value(template).expect("template"),
        )
        .await
        .expect("template created");
    }
}

/// The cloud's resources carry CAPO's names, built on the Cluster API Cluster's name
/// (`pkg/utils/names` and the services of CAPO 0.14, restated here from its formats).
async fn assert_capo_names(e2e: &E2e, capi: &str, cluster: &OpenStackCluster) {
    let resource = format!("{}-{capi}", e2e.ns());
    let status = cluster.status.as_ref().expect("status");
    let network = status.network.as_ref().expect("network");
    assert_eq!(network.name, format!("k8s-clusterapi-cluster-{resource}"));
    let lb = status
        .api_server_managed_load_balancer
        .as_ref()
        .expect("LB");
    assert_eq!(
        lb.name,
        format!("k8s-clusterapi-cluster-{resource}-kubeapi")
    );
    for (group, role) in [
        (&status.control_plane_security_group, "controlplane"),
        (&status.worker_security_group, "worker"),
        (&status.bastion_security_group, "bastion"),
    ] {
        assert_eq!(
            group.as_ref().expect("group").name,
            format!("k8s-cluster-{resource}-secgroup-{role}")
        );
    }
    let bastion = status.bastion.as_ref().expect("bastion");
    assert_eq!(
        bastion.name.as_deref(),
        Some(format!("{capi}-bastion").as_str())
    );
    let listeners = e2e
        .tenant
        .octavia()
        .list_listeners(&lb.id, None)
        .await
        .expect("listeners");
    let names: Vec<&str> = listeners.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(
        names,
        vec![format!("k8s-clusterapi-cluster-{resource}-kubeapi-6443").as_str()]
    );
}

/// Every API member's (address, id), from the status tree.
pub(crate) async fn member_ids(tenant: &CloudClient, lb: &str) -> BTreeMap<String, String> {
    let tree = tenant.octavia().status_tree(lb).await.expect("status tree");
    let mut members = BTreeMap::new();
    for pool in tree.listeners.iter().flat_map(|l| l.pools.iter()) {
        for member in tenant
            .octavia()
            .list_members(&pool.id)
            .await
            .expect("members")
        {
            members.insert(
                format!("{}:{}", member.address, member.protocol_port),
                member.id,
            );
        }
    }
    members
}

/// What a takeover must leave as it was: every machine's providerID and provisioned flag,
/// and the cluster's.
async fn released_state(e2e: &E2e) -> BTreeMap<String, (Option<String>, bool)> {
    let mut state = BTreeMap::new();
    for machine in e2e
        .machines()
        .list(&ListParams::default())
        .await
        .expect("machines")
        .items
    {
        let provisioned = machine
            .status
            .as_ref()
            .and_then(|s| s.initialization.as_ref())
            .is_some_and(|i| i.provisioned == Some(true));
        state.insert(
            kube::ResourceExt::name_any(&machine),
            (machine.spec.provider_id.clone(), provisioned),
        );
    }
    state
}

/// CAPO 0.14 ran the cluster (3 control-plane machines, a worker, a bastion); capo-rs
/// replaces it: CRDs upgraded, storage migrated, controllers started, with no OpenStack
/// write; then a rollout under the gate, and a deletion that leaves nothing.
async fn takeover_from_capo(e2e: &mut E2e) {
    // As ClusterClass names them: the OpenStackCluster is not named as the Cluster. CAPO
    // names the cloud's resources after the Cluster.
    let name = unique_cluster_name("capo");
    let infra = format!("{name}-x7k2p");
    let before = census(&e2e.tenant).await;
    // The cloud as CAPO builds it (capo-rs gives every resource CAPO's name and tags).
    create_cluster_as(e2e, &name, &infra).await;
    wait_provisioned(e2e, &infra).await;
    let cluster = wait_bastion(e2e, &infra).await;
    assert_capo_names(e2e, &name, &cluster).await;
    let lb = cluster
        .status
        .as_ref()
        .and_then(|s| s.api_server_managed_load_balancer.as_ref())
        .map(|lb| lb.id.clone())
        .expect("the LB's id");
    let builder = actor(e2e);
    let plane = plane(&name, 3);
    builder
        .scale_control_plane(&plane)
        .await
        .expect("3 control-plane machines");
    for worker in builder
        .create_workers(&name, 1, machine_template())
        .await
        .expect("a worker")
    {
        builder
            .wait_joined(&worker)
            .await
            .expect("the worker joins");
    }
    create_templates(e2e, &name).await;
    builder.stop().await;
    e2e.stop_manager(true).await;
    // CAPO marks nothing: taken over, the cloud is reached through the recorded IDs alone.
    crate::takeover::strip_owner_marks(&e2e.tenant, &name).await;

    // The management cluster as CAPO 0.14 leaves it: its CRDs, v1beta1 objects stored.
    let objects = crate::takeover::snapshot(&e2e.client, e2e.ns()).await;
    let capo_objects: Vec<Value> = objects
        .iter()
        .map(crate::takeover::as_capo_left_it)
        .collect();
    let mut crds: Vec<Value> = capo_api::capi::crds()
        .iter()
        .map(|c| serde_json::to_value(c).expect("CRD"))
        .collect();
    crds.extend(crate::takeover::capo_crds());
    // CAPO 0.14's CRDs replace ours: on a server of its own (a second real tier beside the
    // real one, so the v1beta1 objects are stored in real etcd; a simulator beside the
    // simulated one).
    let kube = e2e.kube.own_server_like(&crds).await;
    crate::takeover::recreate(&kube.client, &kube.namespace, &capo_objects).await;
    let webhook = match &kube.server {
        Server::Sim(sim) => Some(crate::conversion::ServedWebhook::start(sim).await),
        Server::Real => None,
    };
    e2e.move_to(kube);
    let members_before = member_ids(&e2e.tenant, &lb).await;
    assert_eq!(
        members_before.len(),
        3,
        "three API members: {members_before:?}"
    );
    let cloud_before = census(&e2e.tenant).await;
    let sim_log = |e2e: &E2e| {
        e2e.sim
            .as_ref()
            .map(|sim| sim.request_log()["by_operation"].clone())
    };
    let sim_before = sim_log(e2e);

    // The takeover.
    let started = Instant::now();
    match &webhook {
        Some(webhook) => webhook.upgrade_crds(&e2e.client).await,
        None => e2e.kube.install_ours().await,
    }
    e2e.start_manager();
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> = Api::all(e2e.client.clone());
    for kind in capo_api::conversion::CONVERTIBLE_KINDS {
        let crd = format!("{}s.{}", kind.to_lowercase(), capo_api::GROUP);
        let migrated = await_condition(crds.clone(), &crd, |c: Option<&k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>| {
            c.and_then(|c| c.status.as_ref()).and_then(|s| s.stored_versions.as_ref()).is_some_and(|v| v == &vec!["v1beta2".to_owned()])
        });
        tokio::time::timeout(WAIT, migrated)
            .await
            .expect("storage migrated in time")
            .expect("watch");
    }
    let migrated_in = started.elapsed();
    // Settled: every object's Ready written by capo-rs (CAPO's had no reason).
    let ours = |conditions: &[Condition]| {
        conditions.iter().any(|c| {
            c.type_ == types::READY
                && c.reason != capo_api::conversion::NO_REASON
                && c.observed_generation.is_some()
        })
    };
    wait_for(
        &e2e.clusters(),
        &infra,
        "capo-rs's Ready",
        WAIT,
        |c: &OpenStackCluster| c.status.as_ref().is_some_and(|s| ours(&s.conditions)),
    )
    .await;
    for machine in e2e
        .machines()
        .list(&ListParams::default())
        .await
        .expect("machines")
        .items
    {
        let machine_name = kube::ResourceExt::name_any(&machine);
        wait_for(
            &e2e.machines(),
            &machine_name,
            "capo-rs's Ready",
            WAIT,
            |m: &OpenStackMachine| m.status.as_ref().is_some_and(|s| ours(&s.conditions)),
        )
        .await;
    }
    let settled_in = started.elapsed();
    let writes = e2e.writes();
    let takeover_requests = e2e.requests();
    assert_eq!(
        writes,
        BTreeMap::new(),
        "{}: OpenStack writes during the takeover",
        e2e.label
    );
    if let (Some(before), Some(after)) = (sim_before, sim_log(e2e)) {
        let changed: Vec<String> = after
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(op, n)| {
                !is_read(op) && !op.starts_with("identity ") && before.get(op.as_str()) != Some(n)
            })
            .map(|(op, n)| format!("{op}: {n}"))
            .collect();
        assert!(changed.is_empty(), "the cloud saw writes: {changed:?}");
    }
    assert_eq!(
        member_ids(&e2e.tenant, &lb).await,
        members_before,
        "no member removed or re-created"
    );
    assert!(
        new_objects(&cloud_before, &census(&e2e.tenant).await).is_empty(),
        "nothing new in the cloud"
    );
    for (machine, (provider_id, provisioned)) in released_state(e2e).await {
        let was = capo_objects
            .iter()
            .find(|o| o["kind"] == "OpenStackMachine" && o["metadata"]["name"] == machine.as_str())
            .expect("CAPO's machine");
        assert_eq!(
            provider_id.as_deref(),
            was["spec"]["providerID"].as_str(),
            "{machine}: providerID unchanged"
        );
        assert!(provisioned, "{machine}: still provisioned");
    }
    for cluster in e2e
        .clusters()
        .list(&ListParams::default())
        .await
        .expect("clusters")
        .items
    {
        let status = cluster.status.expect("status");
        assert_eq!(
            status.initialization.as_ref().and_then(|i| i.provisioned),
            Some(true),
            "the cluster stays provisioned"
        );
        for condition in &status.conditions {
            assert!(
                !condition.reason.is_empty() && condition.observed_generation.is_some(),
                "v1beta2 shape: {condition:?}"
            );
        }
    }
    // On the simulator the manager shares the test's client: the grants only the migration
    // needs show in the log (the test itself sends none of them). On the real server the
    // manager holds its ServiceAccount's token: a grant missing from deploy/ fails the
    // migration above.
    if let Server::Sim(sim) = &e2e.kube.server {
        let sent: std::collections::BTreeSet<(String, String, String)> = sim
            .requests()
            .into_iter()
            .map(|r| (r.verb, r.group, r.resource))
            .collect();
        for grant in crate::packaging::used_by_the_storage_migration() {
            assert!(sent.contains(&grant), "the migration uses {grant:?}");
        }
    }

    // Afterwards, under capo-rs: a rollout under the gate, and a deletion.
    let actor = actor(e2e);
    let stop = CancellationToken::new();
    let (seen, watcher) = watch_gate(e2e, lb.clone(), stop.clone());
    let rollout = actor
        .rollout(&plane, |_: RolloutStep| {})
        .await
        .expect("the rollout");
    assert_eq!(
        rollout.replaced.len(),
        3,
        "every control-plane machine replaced"
    );
    gate_held(stop, watcher, seen).await;
    delete_cluster_as(e2e, Some(&actor), &name, &infra).await;
    actor.stop().await;
    for (kind, _) in templates(e2e, &name) {
        let api: Api<kube::api::DynamicObject> = Api::namespaced_with(
            e2e.client.clone(),
            e2e.ns(),
            &crate::conversion::resource(kind, "v1beta2"),
        );
        api.delete(&name, &DeleteParams::default())
            .await
            .expect("template deleted");
    }
    assert_nothing_left(e2e, &before).await;
    let conversions = match &e2e.kube.server {
        Server::Sim(sim) => sim.converter().calls().to_string(),
        Server::Real => "(shared webhook)".to_owned(),
    };
    eprintln!(
        "FIGURES takeover {} ({} API server): storage migrated in {:.1} s, settled in {:.1} s; OpenStack requests {}, of which writes {}; webhook conversions {conversions}",
        e2e.label,
        if e2e.kube.is_real() {
            "real"
        } else {
            "simulated"
        },
        migrated_in.as_secs_f64(),
        settled_in.as_secs_f64(),
        spent(&BTreeMap::new(), &takeover_requests),
        writes.values().sum::<u64>(),
    );
    drop(webhook);
}

macro_rules! on_real {
    ($scenario:ident, $cloud:expr) => {
        on_real!($scenario, $cloud, $crate::kube_world::Kube::PreferReal)
    };
    ($scenario:ident, $cloud:expr, $kube:expr) => {{
        let Some(real) = real_cloud() else { return };
        let _alone = REAL.lock().await;
        fault(&["clear"]).await;
        let mut e2e = E2e::real_on(&real, $cloud, $kube).await;
        let waits = $crate::waits::Waits::default();
        // On the heap: a scenario's future is large in a debug build, for a test thread's stack.
        let scenario = waits.record(Box::pin($scenario(&mut e2e)));
        let outcome = tokio::time::timeout(std::time::Duration::from_secs(900), scenario).await;
        e2e.stop_manager(true).await;
        if outcome.is_err() {
            panic!("the scenario did not finish within 15 minutes; {waits}");
        }
    }};
}

macro_rules! on_sim {
    ($scenario:ident, $appcred:expr) => {
        on_sim!(
            $scenario,
            $appcred,
            $crate::kube_world::Kube::AsTheEnvironmentSays
        )
    };
    ($scenario:ident, $appcred:expr, $kube:expr) => {{
        let mut e2e = E2e::simulated_on($appcred, $kube).await;
        let waits = $crate::waits::Waits::default();
        // On the heap: a scenario's future is large in a debug build, for a test thread's stack.
        let scenario = waits.record(Box::pin($scenario(&mut e2e)));
        let outcome = tokio::time::timeout(std::time::Duration::from_secs(600), scenario).await;
        e2e.stop_manager(true).await;
        if outcome.is_err() {
            panic!("the scenario did not finish within 10 minutes; {waits}");
        }
    }};
}

macro_rules! both {
    ($scenario:ident, $cloud:expr, $appcred:expr, $real:ident, $sim:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $real() {
            on_real!($scenario, $cloud);
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $sim() {
            on_sim!($scenario, $appcred);
        }
    };
}

pub(crate) use {both, on_real, on_sim};

both!(
    server_with_volumes,
    APPCRED_CLOUD,
    true,
    real_server_with_root_and_extra_volumes_and_a_trunk_by_application_credential,
    sim_server_with_root_and_extra_volumes_and_a_trunk_by_application_credential
);
both!(
    restart_during_bring_up,
    PASSWORD_CLOUD,
    false,
    real_restarts_in_the_middle_of_bring_up_duplicate_nothing,
    sim_restarts_in_the_middle_of_bring_up_duplicate_nothing
);
both!(
    keystone_outage,
    PASSWORD_CLOUD,
    false,
    real_keystone_stopped_for_30_s_is_said_and_the_cluster_converges,
    sim_keystone_stopped_for_30_s_is_said_and_the_cluster_converges
);
both!(
    nova_outage_while_servers_build,
    PASSWORD_CLOUD,
    false,
    real_nova_api_stopped_while_servers_build_is_said_and_machines_converge,
    sim_nova_api_stopped_while_servers_build_is_said_and_machines_converge
);
both!(
    neutron_outage_during_bring_up,
    PASSWORD_CLOUD,
    false,
    real_neutron_stopped_during_bring_up_is_said_and_the_cluster_converges,
    sim_neutron_stopped_during_bring_up_is_said_and_the_cluster_converges
);

// It begins without ORC's CRD and installs it: on a simulated API server of its own, since
// on the shared real one the CRD stays once any run installed it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_an_orc_image_is_waited_for_then_booted() {
    on_real!(orc_image_is_waited_for_and_used, PASSWORD_CLOUD, Kube::Sim);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sim_an_orc_image_is_waited_for_then_booted() {
    on_sim!(orc_image_is_waited_for_and_used, false, Kube::Sim);
}

both!(
    template_describes_its_machines,
    PASSWORD_CLOUD,
    false,
    real_a_machine_template_says_what_its_machines_would_be_for_scale_from_zero,
    sim_a_machine_template_says_what_its_machines_would_be_for_scale_from_zero
);

both!(
    address_pairs_follow_the_machine,
    PASSWORD_CLOUD,
    false,
    real_an_address_pairs_edit_reaches_the_machines_port,
    sim_an_address_pairs_edit_reaches_the_machines_port
);

// The takeover installs CAPO 0.14's CRDs in place of ours: on an API server of its own (a
// second real tier when the real one runs), never the shared one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_a_cluster_capo_built_is_taken_over_without_a_cloud_write_then_rolls_and_deletes() {
    on_real!(takeover_from_capo, PASSWORD_CLOUD);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sim_a_cluster_capo_built_is_taken_over_without_a_cloud_write_then_rolls_and_deletes() {
    on_sim!(takeover_from_capo, false);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_cluster_from_capo_template_rolls_under_the_gate_and_deletes_without_a_leak() {
    on_real!(cluster_lifecycle, PASSWORD_CLOUD);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sim_cluster_from_capo_template_rolls_under_the_gate_and_deletes_without_a_leak() {
    on_sim!(cluster_lifecycle, false);
}
