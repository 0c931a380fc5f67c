//! CAPO v0.14.7 itself, run beside capo-rs: its manager, ORC v2.4.0's CRDs and Cluster API
//! v1.12.10's core manager (the release CAPO 0.14 pairs with), built by `tests/capo/build.sh`
//! from the Go module proxy; their CRDs and webhook configurations read from Go's module cache
//! at test time, on a real API server of the test's own, with the webhooks served on a
//! certificate the test issues and the CA bundle injected as cert-manager's CA injector would.
//! CAPO reaches the real OpenStack tier, and nothing else, from a network namespace of its own
//! (`tests/capi/isolated.sh`). capo-rs, with Cluster API v1.14.2's core manager, is driven the
//! same way beside it (one driver, [`Arm`]), each arm in a project of its own.
//!
//! Without the peers (`CAPO_CAPO_BIN` and the sources: `tests/capo/build.sh`'s `env` file)
//! CAPO's scenario skips with a notice, unless `CAPO_REQUIRE_CAPO=1` (CI) makes that a failure;
//! capo-rs's needs Cluster API's peers (`CAPO_REQUIRE_CAPI`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use capo_provider::cloud::{CloudClient, Service};
use capo_sim::certs::WebhookCerts;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};

use crate::capi_peers::{CapiManager, CapiPeers, CapiRelease, capi_peers, webhook_configurations};
use crate::go_peer::{IsolatedPeer, PeerRun, api_port, free_port, start_with_retries, yaml_files};
use crate::kube_world::{KubeWorld, apply_crds};
use crate::real_cloud::{
    Census, RealCloud, census, delete_path, fault_in_scope, get_json, new_objects, real_cloud,
    try_get_json,
};
use crate::real_provider::{FLAVOR, IMAGE, KEY_PAIR};
use crate::server_controller::base64;
use crate::server_controller::spawn_manager;
use capo_provider::manager::{ManagerConfig, WatchScope};

/// CAPO v0.14.7's peers, when built.
pub(crate) struct CapoPeers {
    bin: PathBuf,
    capo_src: PathBuf,
    orc_src: PathBuf,
    capi_src: PathBuf,
}

pub(crate) fn capo_peers() -> Option<CapoPeers> {
    let var = |name: &str| std::env::var_os(name).map(PathBuf::from);
    let found = match (
        var("CAPO_CAPO_BIN"),
        var("CAPO_CAPO_SRC"),
        var("CAPO_ORC_SRC"),
        var("CAPO_CAPO_CAPI_SRC"),
    ) {
        (Some(bin), Some(capo_src), Some(orc_src), Some(capi_src)) => Some(CapoPeers {
            bin,
            capo_src,
            orc_src,
            capi_src,
        }),
        _ => None,
    };
    if found.is_none() {
        assert!(
            !std::env::var("CAPO_REQUIRE_CAPO").is_ok_and(|v| v == "1"),
            "CAPO_REQUIRE_CAPO=1 but CAPO v0.14.7's peers are not built: run tests/capo/build.sh \
             and export its env file"
        );
        eprintln!("skipped: CAPO v0.14.7 is not built (tests/capo/build.sh; export its env file)");
    }
    found
}

impl CapoPeers {
    /// CAPO v0.14.7's module in Go's cache.
    pub(crate) fn capo_src(&self) -> &Path {
        &self.capo_src
    }

    /// ORC v2.4.0's manager.
    pub(crate) fn orc_manager(&self) -> PathBuf {
        self.bin.join("orc-manager")
    }

    /// Cluster API v1.12.10, as CAPO 0.14 pairs with it.
    pub(crate) fn capi_release(&self) -> CapiRelease {
        CapiRelease {
            manager: self.bin.join("capi-manager"),
            config: self.capi_src.join("config"),
        }
    }
}

/// CAPO 0.14.7's CRDs as its release installs them: with the contract label its kustomize
/// configuration adds (Cluster API refuses a provider kind without it).
pub(crate) fn capo_crds(peers: &CapoPeers) -> Vec<Value> {
    yaml_files(&peers.capo_src.join("config/crd/bases"))
        .into_iter()
        .map(|mut crd| {
            crd["metadata"]["labels"]["cluster.x-k8s.io/v1beta1"] = json!("v1beta1");
            crd
        })
        .collect()
}

/// ORC's CRDs: CAPO's manager watches ORC's Images, and does not start without them.
pub(crate) fn orc_crds(peers: &CapoPeers) -> Vec<Value> {
    yaml_files(&peers.orc_src.join("config/crd/bases"))
}

/// CAPO's manager, running against the world's own real API server, reaching `reach` (the
/// API server's port is added).
pub(crate) struct CapoManager {
    peer: IsolatedPeer,
}

impl CapoManager {
    /// Started, with its CRDs (and ORC's) installed, and its webhooks answering.
    pub(crate) async fn start(kube: &KubeWorld, peers: &CapoPeers, reach: &[u16]) -> Self {
        start_with_retries(async || {
            let mut manager = Self::spawn(kube, peers, reach).await;
            manager.wait_serving(kube).await.map(|()| manager)
        })
        .await
    }

    async fn spawn(kube: &KubeWorld, peers: &CapoPeers, reach: &[u16]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let certs = WebhookCerts::issue(&["127.0.0.1".to_owned()]).unwrap();
        certs.write(&dir.path().join("certs")).unwrap();
        let outside = free_port();
        let base = format!("https://127.0.0.1:{outside}");
        let mut objects = orc_crds(peers);
        objects.extend(capo_crds(peers));
        // Named as CAPO's release names it (`capo-` is its kustomize prefix).
        objects.extend(webhook_configurations(
            &peers.capo_src.join("config"),
            "capo-",
            &base,
            &certs.ca_bundle(),
        ));
        apply_crds(&kube.client, &objects).await;
        let admin = kube
            .own_tier_dir()
            .expect("a tier of the world's own")
            .join("admin.kubeconfig");
        let mut reach = reach.to_vec();
        reach.push(api_port(&admin));
        let args = vec![
            "--webhook-port=9443".to_owned(),
            format!("--webhook-cert-dir={}", dir.path().join("certs").display()),
            "--leader-elect=false".to_owned(),
            "--health-addr=127.0.0.1:9440".to_owned(),
            "--diagnostics-address=127.0.0.1:8443".to_owned(),
            "--v=2".to_owned(),
        ];
        let peer = IsolatedPeer::spawn(
            PeerRun {
                name: "CAPO v0.14.7's manager",
                netns: "capo-capo",
                binary: peers.bin.join("capo-manager"),
                args,
                reach,
                serve: Some(outside),
                kubeconfig: admin,
            },
            dir,
        );
        CapoManager { peer }
    }

    /// Until CAPO's validating webhook answers a dry-run create of an OpenStackCluster.
    async fn wait_serving(&mut self, kube: &KubeWorld) -> Result<(), String> {
        let clusters = openstack_clusters(kube);
        let probe = json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "OpenStackCluster",
            "metadata": {"name": "probe", "namespace": kube.namespace},
            "spec": {"identityRef": {"name": "probe", "cloudName": "probe"}},
        });
        self.peer.wait_admitting(&clusters, probe).await
    }

    pub(crate) fn log_tail(&self) -> String {
        self.peer.log_tail()
    }

    /// The manager's process id.
    pub(crate) fn pid(&self) -> Option<u32> {
        self.peer.pid()
    }

    fn log_lines_with(&self, needles: &[&str]) -> Vec<String> {
        self.peer.log_lines_with(needles)
    }
}

pub(crate) fn api(
    kube: &KubeWorld,
    group: &str,
    version: &str,
    kind: &str,
    plural: &str,
) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk(group, version, kind);
    let resource = ApiResource::from_gvk_with_plural(&gvk, plural);
    Api::namespaced_with(kube.client.clone(), &kube.namespace, &resource)
}

/// Cluster API's Clusters (v1beta2).
pub(crate) fn capi_clusters(kube: &KubeWorld) -> Api<DynamicObject> {
    api(kube, "cluster.x-k8s.io", "v1beta2", "Cluster", "clusters")
}

/// Cluster API's Machines (v1beta2).
pub(crate) fn capi_machines(kube: &KubeWorld) -> Api<DynamicObject> {
    api(kube, "cluster.x-k8s.io", "v1beta2", "Machine", "machines")
}

/// OpenStackMachines in `version`.
pub(crate) fn openstack_machines(kube: &KubeWorld, version: &str) -> Api<DynamicObject> {
    let group = "infrastructure.cluster.x-k8s.io";
    api(
        kube,
        group,
        version,
        "OpenStackMachine",
        "openstackmachines",
    )
}

/// Creates `object` through `api`; a refusal fails the test with the object's name.
pub(crate) async fn create(api: &Api<DynamicObject>, object: Value) {
    let object: DynamicObject = serde_json::from_value(object).unwrap();
    api.create(&PostParams::default(), &object)
        .await
        .unwrap_or_else(|e| panic!("creating {:?}: {e}", object.metadata.name));
}

/// OpenStackClusters as CAPO 0.14 serves them (v1beta1).
pub(crate) fn openstack_clusters(kube: &KubeWorld) -> Api<DynamicObject> {
    api(
        kube,
        "infrastructure.cluster.x-k8s.io",
        "v1beta1",
        "OpenStackCluster",
        "openstackclusters",
    )
}

/// The ports of the tenant's endpoints (Keystone's and every service capo-rs calls): what a
/// peer in a network namespace must reach.
pub(crate) async fn cloud_ports(tenant: &CloudClient, auth_url: &str) -> Vec<u16> {
    let mut ports = BTreeSet::new();
    if let Some(port) = url::Url::parse(auth_url).ok().and_then(|u| u.port()) {
        ports.insert(port);
    }
    for service in [
        Service::Compute,
        Service::Network,
        Service::Image,
        Service::LoadBalancer,
        Service::BlockStorage,
    ] {
        if let Ok(url) = tenant.path().session().service_url(service).await
            && let Some(port) = url.port()
        {
            ports.insert(port);
        }
    }
    ports.into_iter().collect()
}

/// Polls `probe` every second, within `limit`.
async fn until<T>(
    what: &str,
    limit: Duration,
    logs: &dyn Fn() -> String,
    probe: impl AsyncFnMut() -> Result<T, String>,
) -> T {
    crate::go_peer::until(what, limit, Duration::from_secs(1), logs, probe).await
}

/// CAPO's arm: its namespace and cluster, on an API server of its own.
const NAMESPACE: &str = "capo-v0147";
const CLUSTER: &str = "capo-made";
/// The real tier's project for CAPO's clusters (`tests/openstack/setup_cloud.py`): no other
/// test takes a census of it, so these scenarios need not run alone.
const PEERS_CLOUD: &str = "capo-peers";
/// capo-rs's arm: the same objects under names of their own, so that the fault patterns
/// (`%-6443-<machine>`) tell the arms apart, in a project of its own (`capo-rs-peers-rs`), so
/// that each arm's census is its own and both arms run at once.
const RS_NAMESPACE: &str = "capors-v0147";
const RS_CLUSTER: &str = "rs-made";
const RS_CLOUD: &str = "capo-peers-rs";

/// The one cloud `name` of the tier's clouds.yaml, as a Secret's clouds.yaml holds it.
pub(crate) fn only_cloud(full: &str, name: &str) -> String {
    let mut doc: Value = serde_saphyr::from_str(full).expect("clouds.yaml parses");
    if let Some(clouds) = doc.get_mut("clouds").and_then(|c| c.as_object_mut()) {
        clouds.retain(|cloud, _| cloud == name);
    }
    serde_saphyr::to_string(&doc).expect("clouds.yaml serialises")
}

/// The Secret `cloud-config` in the world's namespace, holding the tier's cloud `name` only.
async fn cloud_secret(kube: &KubeWorld, real: &RealCloud, name: &str) {
    let secret: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "cloud-config", "namespace": kube.namespace},
        "data": {"clouds.yaml": base64(&only_cloud(&real.clouds_yaml, name)), "cacert": ""},
    }))
    .unwrap();
    kube.api::<Secret>()
        .create(&PostParams::default(), &secret)
        .await
        .expect("the Secret");
}

/// The tier's external network `public`, by id (as CAPO's templates name it).
async fn external_network(tenant: &CloudClient) -> String {
    get_json(
        tenant,
        Service::Network,
        "networks?name=public&router:external=true",
    )
    .await["networks"][0]["id"]
        .as_str()
        .expect("the external network `public`")
        .to_owned()
}

/// CAPO's world: a real API server of its own, Cluster API v1.12.10's and CAPO's managers on
/// it, and the real cloud's project for CAPO.
struct CapoWorld {
    /// Before `kube`: the managers stop while their API server still answers. `None` once
    /// stopped (the takeover).
    capo: Option<CapoManager>,
    /// `None` while stopped (the rollback's change of CRDs).
    capi: Option<CapiManager>,
    kube: KubeWorld,
    tenant: CloudClient,
    external_network: String,
    /// The tier's cloud (project) its clusters are built in, and the cluster's name.
    cloud: &'static str,
    cluster: &'static str,
}

impl CapoWorld {
    async fn start(peers: &CapoPeers, real: &RealCloud) -> Self {
        Self::start_in(peers, real, PEERS_CLOUD, NAMESPACE, CLUSTER).await
    }

    /// CAPO's world in the tier's cloud `cloud`, its objects in `namespace`.
    async fn start_in(
        peers: &CapoPeers,
        real: &RealCloud,
        cloud: &'static str,
        namespace: &str,
        cluster: &'static str,
    ) -> Self {
        let (tenant, _clouds) = real.client(cloud).await;
        let kube = KubeWorld::own_real(&[], namespace).await;
        let capi = CapiManager::start(&kube, &peers.capi_release()).await;
        let auth_url = real
            .credentials(cloud)
            .resolve()
            .expect("the tier's clouds.yaml")
            .auth_url;
        let reach = cloud_ports(&tenant, &auth_url).await;
        let capo = CapoManager::start(&kube, peers, &reach).await;
        let external_network = external_network(&tenant).await;
        cloud_secret(&kube, real, cloud).await;
        CapoWorld {
            capo: Some(capo),
            capi: Some(capi),
            kube,
            tenant,
            external_network,
            cloud,
            cluster,
        }
    }

    fn logs(&self) -> String {
        format!(
            "CAPO's manager:\n{}\nCluster API's manager:\n{}",
            self.capo
                .as_ref()
                .map_or_else(|| "(stopped)".to_owned(), CapoManager::log_tail),
            self.capi
                .as_ref()
                .map_or_else(|| "(stopped)".to_owned(), CapiManager::log_tail),
        )
    }

    fn arm<'a>(&'a self, logs: &'a dyn Fn() -> String) -> Arm<'a> {
        Arm {
            provider: "CAPO v0.14.7",
            kube: &self.kube,
            tenant: &self.tenant,
            external_network: &self.external_network,
            cloud: self.cloud,
            cluster: self.cluster,
            fault_scope: "peers",
            native: "v1beta1",
            bastion: false,
            logs,
        }
    }

    /// The API load balancer's floating IPs CAPO lost track of, said and deleted (the rest of
    /// `left` is the caller's to judge); what was found, in words, or nothing.
    ///
    /// v0.14.7 finds that address through the load balancer's VIP port only, and forgets it once
    /// disassociated: `DeleteLoadBalancer` disassociates, then waits up to about three minutes
    /// for the address to read DOWN, then deletes it. A failed read in that wait (the main pass
    /// stops Neutron and Keystone meanwhile) returns an error, and the next pass finds no address
    /// on the port, so the address stays in the project, unattached. CAPO's own lines about
    /// floating IPs are printed beside it, to tell that path from a second creation.
    async fn remove_lost_api_floating_ips(
        &self,
        left: &mut BTreeMap<&'static str, Vec<String>>,
    ) -> String {
        let Some(addresses) = left.remove("floating IPs") else {
            return String::new();
        };
        let description = format!(
            "Created by cluster-api-provider-openstack cluster {}-{}",
            self.kube.namespace, self.cluster
        );
        let (mut lost, mut foreign) = (Vec::new(), Vec::new());
        for address in addresses {
            let id = address
                .rsplit_once(" (")
                .and_then(|(_, id)| id.strip_suffix(')'))
                .expect("census names `address (id)`");
            let path = format!("floatingips/{id}");
            let fip = get_json(&self.tenant, Service::Network, &path).await;
            let fip = &fip["floatingip"];
            if fip["description"] != description.as_str() || !fip["port_id"].is_null() {
                foreign.push(format!("{address}: {fip}"));
                continue;
            }
            let status = delete_path(&self.tenant, Service::Network, &path).await;
            assert_eq!(status, 204, "DELETE {path}");
            lost.push(address);
        }
        if !foreign.is_empty() {
            left.insert("floating IPs", foreign);
        }
        if lost.is_empty() {
            return String::new();
        }
        // Its messages and events say "floating IP"; a line is cut to its head.
        let capo = self.capo.as_ref().expect("CAPO's manager");
        let lines: Vec<String> = (capo.log_lines_with(&["floating IP"]).iter())
            .map(|line| line.chars().take(240).collect())
            .collect();
        format!(
            "but it lost its API floating IP {lost:?} (unattached, deleted by the test); \
             CAPO's log on floating IPs:\n{}",
            lines.join("\n")
        )
    }
}

/// capo-rs's world: a real API server of its own with capo-rs's CRDs and webhooks, Cluster API
/// v1.14.2's manager on it, capo-rs's manager as its ServiceAccount with the shipped timings
/// (no test speed-ups), and the real cloud's project for capo-rs's arm.
struct CapoRsWorld {
    /// First: capo-rs's manager stops before the rest.
    _stop: tokio_util::sync::DropGuard,
    capi: CapiManager,
    kube: KubeWorld,
    tenant: CloudClient,
    _clouds: std::sync::Arc<capo_provider::cloud::Clouds>,
    external_network: String,
}

impl CapoRsWorld {
    async fn start(peers: &CapiPeers, real: &RealCloud) -> Self {
        let (tenant, clouds) = real.client(RS_CLOUD).await;
        let kube = KubeWorld::own_real(&[], RS_NAMESPACE).await;
        kube.install_ours().await;
        let capi = CapiManager::start(&kube, &peers.release()).await;
        let external_network = external_network(&tenant).await;
        cloud_secret(&kube, real, RS_CLOUD).await;
        let config = ManagerConfig {
            scope: WatchScope {
                namespace: Some(kube.namespace.clone()),
                ..WatchScope::default()
            },
            ..ManagerConfig::default()
        };
        let (_registry, shutdown, _manager) = spawn_manager(&kube.manager_client, config);
        CapoRsWorld {
            _stop: shutdown.drop_guard(),
            capi,
            kube,
            tenant,
            _clouds: clouds,
            external_network,
        }
    }

    fn logs(&self) -> String {
        format!("Cluster API's manager:\n{}", self.capi.log_tail())
    }

    fn arm<'a>(&'a self, logs: &'a dyn Fn() -> String) -> Arm<'a> {
        Arm {
            provider: "capo-rs",
            kube: &self.kube,
            tenant: &self.tenant,
            external_network: &self.external_network,
            cloud: RS_CLOUD,
            cluster: RS_CLUSTER,
            fault_scope: "peersrs",
            native: "v1beta2",
            bastion: false,
            logs,
        }
    }
}

/// One provider's side of a scenario, driven the same way for both: the API server its objects
/// live on, the project its cluster is built in, and its objects' names. Both arms are given
/// the same objects, in CAPO 0.14's v1beta1 API.
struct Arm<'a> {
    provider: &'static str,
    kube: &'a KubeWorld,
    tenant: &'a CloudClient,
    external_network: &'a str,
    /// The cloud's name in the Secret `cloud-config`.
    cloud: &'static str,
    cluster: &'static str,
    /// `fault.sh`'s scope for the arm's member faults (`CAPO_FAULT_SCOPE`): the main pass's
    /// scenarios, running meanwhile, clear theirs, and the other arm releases its own.
    fault_scope: &'static str,
    /// The version the provider stores OpenStackMachines in, whose conditions it writes.
    native: &'static str,
    /// Whether the cluster has a bastion.
    bastion: bool,
    logs: &'a dyn Fn() -> String,
}

/// CAPO's OpenStackCluster stuck on attaching a floating IP because the VIP's port holds
/// another (Neutron's `FloatingIPPortAlreadyAssociated`).
fn leaked_a_floating_ip(status: &Value) -> bool {
    status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| {
            c["message"]
                .as_str()
                .is_some_and(|m| m.contains("FloatingIPPortAlreadyAssociated"))
        })
}

/// A status that is not ready, in one line, its conditions first: CI keeps a few hundred
/// characters of a failure's message, and the reason is in the conditions.
fn status_in_a_line(status: &Value) -> String {
    let conditions: Vec<String> = status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["status"] != "True")
        .map(|c| {
            format!(
                "{}={} {}: {}",
                c["type"], c["status"], c["reason"], c["message"]
            )
        })
        .collect();
    let mut rest = status.clone();
    if let Some(rest) = rest.as_object_mut() {
        rest.remove("conditions");
    }
    format!("not True: [{}]; {rest}", conditions.join("; "))
}

impl Arm<'_> {
    fn namespace(&self) -> &str {
        &self.kube.namespace
    }

    fn old(&self) -> String {
        format!("{}-old", self.cluster)
    }

    fn held(&self) -> String {
        format!("{}-held", self.cluster)
    }

    fn failed(&self) -> String {
        format!("{}-error", self.cluster)
    }

    fn clusters(&self) -> Api<DynamicObject> {
        capi_clusters(self.kube)
    }

    fn machines(&self) -> Api<DynamicObject> {
        capi_machines(self.kube)
    }

    fn openstack_machines(&self, version: &str) -> Api<DynamicObject> {
        openstack_machines(self.kube, version)
    }

    async fn create(&self, api: &Api<DynamicObject>, object: Value) {
        create(api, object).await;
    }

    /// A Cluster and its OpenStackCluster (CAPO 0.14's v1beta1 API): a network, a router,
    /// security groups and an API load balancer; its status once ready.
    async fn create_cluster(&self) -> Value {
        let infra = openstack_clusters(self.kube);
        let (namespace, cluster) = (self.namespace(), self.cluster);
        let network = json!({"id": self.external_network});
        let mut object = openstack_cluster_object(namespace, cluster, self.cloud, network);
        if self.bastion {
            object["spec"]["bastion"] = json!({"enabled": true, "spec": {
                "flavor": FLAVOR, "image": {"filter": {"name": IMAGE}}, "sshKeyName": KEY_PAIR}});
        }
        self.create(&infra, object).await;
        self.create(&self.clusters(), cluster_object(namespace, cluster))
            .await;
        until(
            "OpenStackCluster ready",
            Duration::from_secs(420),
            self.logs,
            async || {
                let object = infra.get(cluster).await.map_err(|e| e.to_string())?;
                let status = serde_json::to_value(&object).unwrap_or_default()["status"].clone();
                if leaked_a_floating_ip(&status) {
                    self.repair_floating_ip_leak(&status).await;
                }
                let bastion_up = !self.bastion || status["bastion"]["state"] == "ACTIVE";
                match status["ready"].as_bool() {
                    Some(true) if bastion_up => Ok(status),
                    _ => Err(status_in_a_line(&status)),
                }
            },
        )
        .await
    }

    /// CAPO v0.14.7 leaks the API floating IP when a pass that attached one loses its status
    /// write (a slow cloud or API server, as in CI at `0d65464`; CAPO's issues 1159 and 1743):
    /// the next pass makes another and fails for good to attach it. The test does what those
    /// issues' operators did, deleting the unrecorded one on the VIP's port, and says so.
    async fn repair_floating_ip_leak(&self, status: &Value) {
        let (Some(lb), Some(recorded)) = (
            status["apiServerLoadBalancer"]["id"].as_str(),
            status["apiServerLoadBalancer"]["ip"].as_str(),
        ) else {
            return;
        };
        let Ok(answer) = try_get_json(
            self.tenant,
            Service::LoadBalancer,
            &format!("lbaas/loadbalancers/{lb}"),
        )
        .await
        else {
            return;
        };
        let Some(port) = answer["loadbalancer"]["vip_port_id"].as_str() else {
            return;
        };
        let Ok(on_port) = try_get_json(
            self.tenant,
            Service::Network,
            &format!("floatingips?port_id={port}"),
        )
        .await
        else {
            return;
        };
        let leaked = on_port["floatingips"].as_array().into_iter().flatten();
        for ip in leaked.filter(|ip| ip["floating_ip_address"] != recorded) {
            let (Some(id), Some(address)) = (ip["id"].as_str(), ip["floating_ip_address"].as_str())
            else {
                continue;
            };
            let answer =
                delete_path(self.tenant, Service::Network, &format!("floatingips/{id}")).await;
            eprintln!(
                "{}: CAPO v0.14.7 leaked floating IP {address} on the VIP's port (its status records {recorded}); deleted it for CAPO to attach its own: {answer}",
                self.cluster
            );
            // A change wakes CAPO now rather than after its backoff (minutes by then).
            let wake =
                json!({"metadata": {"annotations": {"test.capo-rs/leaked-floating-ip": address}}});
            let patched = openstack_clusters(self.kube)
                .patch(self.cluster, &PatchParams::default(), &Patch::Merge(&wake))
                .await;
            if let Err(e) = patched {
                eprintln!("{}: could not wake CAPO: {e}", self.cluster);
            }
        }
    }

    /// Builds the cluster and checks what the provider made; the API load balancer's id.
    async fn build(&self, before: &Census) -> String {
        let named = format!("{}-{}", self.namespace(), self.cluster);
        let stale: Vec<&String> = before
            .values()
            .flat_map(|objects| objects.values())
            .filter(|name| name.contains(&named))
            .collect();
        assert!(
            stale.is_empty(),
            "the project of cloud {} holds {stale:?}, left by an earlier run: delete them first",
            self.cloud
        );
        let started = Instant::now();
        let status = self.create_cluster().await;
        let built = started.elapsed();
        let lb = status["apiServerLoadBalancer"]["id"]
            .as_str()
            .expect("status.apiServerLoadBalancer.id")
            .to_owned();
        let answer = get_json(
            self.tenant,
            Service::LoadBalancer,
            &format!("lbaas/loadbalancers/{lb}"),
        )
        .await;
        assert_eq!(
            answer["loadbalancer"]["provisioning_status"], "ACTIVE",
            "{answer:#}"
        );
        let made = new_objects(before, &census(self.tenant).await);
        for kind in [
            "networks",
            "subnets",
            "routers",
            "security groups",
            "load balancers",
        ] {
            assert!(
                made.get(kind).is_some_and(|names| !names.is_empty()),
                "{} made no {kind}: {made:#?}",
                self.provider
            );
        }
        eprintln!(
            "{} built {} in {:.0} s",
            self.provider,
            self.cluster,
            built.as_secs_f64()
        );
        lb
    }

    /// A control-plane Machine of Cluster API's and its OpenStackMachine, with bootstrap data.
    async fn create_control_plane_machine(&self, name: &str) {
        self.create_machine(name, true).await;
    }

    /// A Machine of Cluster API's and its OpenStackMachine (v1beta1), with bootstrap data; in
    /// the control plane or not.
    async fn create_machine(&self, name: &str, control_plane: bool) {
        let (osm, machine) =
            machine_objects(self.namespace(), self.cluster, name, control_plane, true);
        self.create(&self.openstack_machines("v1beta1"), osm).await;
        self.create(&self.machines(), machine).await;
    }

    /// The API pool's members, as `(name, provisioning status)`; an error while the cloud
    /// does not answer (the main pass stops Keystone meanwhile).
    async fn pool_members(&self, lb: &str) -> Result<Vec<(String, String)>, String> {
        let path = format!("lbaas/pools?loadbalancer_id={lb}");
        let pools = try_get_json(self.tenant, Service::LoadBalancer, &path).await?;
        let Some(pool) = pools["pools"][0]["id"].as_str() else {
            return Ok(Vec::new());
        };
        let path = format!("lbaas/pools/{pool}/members");
        let members = try_get_json(self.tenant, Service::LoadBalancer, &path).await?;
        Ok(members["members"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|m| {
                let field = |key: &str| m[key].as_str().unwrap_or_default().to_owned();
                (field("name"), field("provisioning_status"))
            })
            .collect())
    }

    /// The provisioning status of `machine`'s member of the API pool, if it has one.
    async fn member_status(&self, lb: &str, machine: &str) -> String {
        let suffix = format!("-{machine}");
        match self.pool_members(lb).await {
            Ok(members) => members
                .into_iter()
                .find(|(name, _)| name.ends_with(&suffix))
                .map_or_else(|| "absent".to_owned(), |(_, status)| status),
            Err(e) => format!("unread ({e})"),
        }
    }

    /// The member fault `what` (`member-hold`, `member-error`, `member-release`) on
    /// `machine`'s member, with `extra` arguments, in the arm's scope.
    async fn fault(&self, what: &str, machine: &str, extra: &[&str]) {
        let pattern = format!("%-6443-{machine}");
        let mut args = vec![what, pattern.as_str()];
        args.extend_from_slice(extra);
        fault_in_scope(self.fault_scope, &args).await;
    }

    /// A control-plane rollout with the driver playing KubeadmControlPlane's scale-down: one
    /// machine serving first (released once its member is ACTIVE), then two new ones, one whose
    /// member Octavia holds PENDING_CREATE and one whose member goes ERROR; the old machine is
    /// deleted as soon as a new one is released, as the control plane does once a new machine
    /// is up. Every second from the new machines' creation: when each gets its providerID (and
    /// its member's status then), each change of their OpenStackMachines' conditions, and
    /// whether the API pool has an ACTIVE member. Until `horizon`, or, when both are released,
    /// `after_both` past the second release and half of it without an ACTIVE member.
    async fn rollout_onto_faulty_members(
        &self,
        lb: &str,
        horizon: Duration,
        after_both: Duration,
    ) -> Watch {
        let (old, held, failed) = (self.old(), self.held(), self.failed());
        self.bootstrap_secret().await;
        self.create_control_plane_machine(&old).await;
        let mut watch = Watch::new();
        // Serving: released, and its member ACTIVE (CAPO releases it after its member wait
        // whatever the member's status, and the main pass stops Octavia's worker meanwhile).
        until(
            "the first control-plane machine released, its member ACTIVE",
            Duration::from_secs(600),
            self.logs,
            async || {
                self.look(lb, &old, &mut watch).await;
                if watch.released.is_empty() {
                    return Err("not released".to_owned());
                }
                match self.member_status(lb, &old).await.as_str() {
                    "ACTIVE" => Ok(()),
                    other => Err(format!("released, its member {other}")),
                }
            },
        )
        .await;
        self.fault("member-hold", &held, &["900"]).await;
        self.fault("member-error", &failed, &[]).await;
        let mut watch = Watch::new();
        for machine in [&held, &failed] {
            self.create_control_plane_machine(machine).await;
        }
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tick.tick().await;
            for machine in [&held, &failed] {
                self.look(lb, machine, &mut watch).await;
            }
            watch.sample_pool(self.pool_members(lb).await);
            if !watch.released.is_empty() && watch.old_deleted.is_none() {
                self.machines()
                    .delete(&old, &DeleteParams::default())
                    .await
                    .expect("the old Machine's deletion");
                watch.old_deleted = Some(watch.created.elapsed());
            }
            // Both released, `after_both` since, and the pool's outage (if any) seen for half
            // of that: the old member's removal can lag behind its Machine's deletion.
            let now = watch.created.elapsed();
            let enough = watch.released.len() == 2
                && watch.released.iter().all(|r| r.after + after_both <= now)
                && watch.longest_without_active >= after_both / 2;
            if enough || watch.created.elapsed() >= horizon {
                break;
            }
        }
        watch
    }

    /// Once `machine` is released, deletes the old machine, as the control plane would, and
    /// watches the pool until the old Machine is gone; when `machine` was released.
    async fn finish_rollout(&self, lb: &str, machine: &str, watch: &mut Watch) -> Instant {
        let machines = self.machines();
        let old = self.old();
        let mut released = None;
        until(
            "the rollout finished: the new machine released, the old one gone",
            Duration::from_secs(420),
            self.logs,
            async || {
                self.look(lb, machine, watch).await;
                watch.sample_pool(self.pool_members(lb).await);
                if released.is_none() && watch.released.iter().any(|r| r.machine == machine) {
                    let at = Instant::now();
                    machines
                        .delete(&old, &DeleteParams::default())
                        .await
                        .map_err(|e| e.to_string())?;
                    released = Some(at);
                    watch.old_deleted = Some(watch.created.elapsed());
                }
                match (released, machines.get_opt(&old).await) {
                    (Some(at), Ok(None)) => Ok(at),
                    (None, _) => Err(format!("{machine} not released")),
                    (_, state) => Err(format!("{old} still there: {:?}", state.map(|_| ()))),
                }
            },
        )
        .await
    }

    async fn bootstrap_secret(&self) {
        bootstrap_secret(self.kube, self.cluster).await;
    }

    /// One look at `machine`: its release, and its conditions' changes.
    async fn look(&self, lb: &str, machine: &str, watch: &mut Watch) {
        let after = watch.created.elapsed();
        if !watch.released.iter().any(|r| r.machine == machine)
            && let Ok(object) = self.machines().get(machine).await
            && serde_json::to_value(object).unwrap_or_default()["spec"]["providerID"].is_string()
        {
            let member = self.member_status(lb, machine).await;
            watch.released.push(Released {
                machine: machine.to_owned(),
                after,
                member,
            });
        }
        let Ok(object) = self.openstack_machines(self.native).get(machine).await else {
            return;
        };
        let object = serde_json::to_value(object).unwrap_or_default();
        for condition in object["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let kind = condition["type"].as_str().unwrap_or_default().to_owned();
            let now = format!(
                "{} {}",
                condition["status"].as_str().unwrap_or_default(),
                condition["reason"].as_str().unwrap_or_default()
            );
            let key = (machine.to_owned(), kind.clone());
            if watch.last.get(&key) != Some(&now) {
                watch.timeline.push(format!(
                    "{:>5.0} s  {machine}: {kind} {now}",
                    after.as_secs_f64()
                ));
                watch.last.insert(key, now);
            }
        }
    }

    /// Deletes the Cluster (Cluster API deletes its machines first) and waits until it is gone.
    async fn delete_cluster(&self) {
        let clusters = self.clusters();
        clusters
            .delete(self.cluster, &DeleteParams::default())
            .await
            .expect("Cluster delete");
        until(
            "Cluster gone",
            Duration::from_secs(420),
            self.logs,
            async || match clusters.get_opt(self.cluster).await {
                Ok(None) => Ok(()),
                Ok(Some(_)) => Err("still there".into()),
                Err(e) => Err(e.to_string()),
            },
        )
        .await;
    }
}

/// An OpenStackCluster in CAPO 0.14's v1beta1 API: a network, a router, security groups and an
/// API load balancer, on the external network `network` (`{"id": ..}` or `{"filter": ..}`),
/// with the credentials of `cloud` in the Secret `cloud-config`.
pub(crate) fn openstack_cluster_object(
    namespace: &str,
    cluster: &str,
    cloud: &str,
    network: Value,
) -> Value {
    json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "OpenStackCluster",
        "metadata": {"name": cluster, "namespace": namespace},
        "spec": {
            "identityRef": {"name": "cloud-config", "cloudName": cloud},
            "externalNetwork": network,
            "managedSubnets": [{"cidr": "10.6.0.0/24", "dnsNameservers": ["192.0.2.53"]}],
            "managedSecurityGroups": {"allowAllInClusterTraffic": true},
            "apiServerLoadBalancer": {"enabled": true},
        },
    })
}

/// Cluster API's Cluster over the OpenStackCluster of the same name.
pub(crate) fn cluster_object(namespace: &str, cluster: &str) -> Value {
    json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
        "metadata": {"name": cluster, "namespace": namespace},
        "spec": {"clusterNetwork": {"pods": {"cidrBlocks": ["192.168.0.0/16"]}},
                 "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io",
                                       "kind": "OpenStackCluster", "name": cluster}},
    })
}

/// An OpenStackMachine (v1beta1) and Cluster API's Machine over it, in the control plane or
/// not, with the bootstrap data of [`bootstrap_secret`]; with the tier's key pair or none.
pub(crate) fn machine_objects(
    namespace: &str,
    cluster: &str,
    name: &str,
    control_plane: bool,
    key_pair: bool,
) -> (Value, Value) {
    let mut labels = json!({"cluster.x-k8s.io/cluster-name": cluster});
    if control_plane {
        labels["cluster.x-k8s.io/control-plane"] = json!("");
    }
    let mut spec = json!({"flavor": FLAVOR, "image": {"filter": {"name": IMAGE}}});
    if key_pair {
        spec["sshKeyName"] = json!(KEY_PAIR);
    }
    let osm = json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "OpenStackMachine",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {"cluster.x-k8s.io/cluster-name": cluster}},
        "spec": spec,
    });
    let machine = json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"clusterName": cluster, "version": "v1.33.4",
                 "bootstrap": {"dataSecretName": format!("{cluster}-bootstrap")},
                 "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io",
                                       "kind": "OpenStackMachine", "name": name}},
    });
    (osm, machine)
}

/// The Secret `<cluster>-bootstrap` of bootstrap data [`machine_objects`] name.
pub(crate) async fn bootstrap_secret(kube: &KubeWorld, cluster: &str) {
    let bootstrap: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": format!("{cluster}-bootstrap"), "namespace": kube.namespace,
                     "labels": {"cluster.x-k8s.io/cluster-name": cluster}},
        "data": {"value": base64("#cloud-config\n"), "format": base64("cloud-config")},
    }))
    .unwrap();
    kube.api::<Secret>()
        .create(&PostParams::default(), &bootstrap)
        .await
        .expect("the bootstrap Secret");
}

/// When a provider released a machine (Cluster API's Machine got its providerID), and its
/// member's provisioning status then.
struct Released {
    machine: String,
    after: Duration,
    member: String,
}

/// What a watch of an arm's machines saw.
struct Watch {
    created: Instant,
    released: Vec<Released>,
    /// Each change of an OpenStackMachine condition, with its offset from the machines'
    /// creation.
    timeline: Vec<String>,
    last: BTreeMap<(String, String), String>,
    /// When the old machine was deleted (its replacement released).
    old_deleted: Option<Duration>,
    /// Since when the API pool has had no ACTIVE member, and the longest such stretch.
    without_active_since: Option<Duration>,
    longest_without_active: Duration,
    /// Seconds the pool could not be read (the main pass stops Keystone meanwhile): counted
    /// as neither.
    unread: u32,
}

impl Watch {
    fn new() -> Self {
        Watch {
            created: Instant::now(),
            released: Vec::new(),
            timeline: Vec::new(),
            last: BTreeMap::new(),
            old_deleted: None,
            without_active_since: None,
            longest_without_active: Duration::ZERO,
            unread: 0,
        }
    }

    /// One reading of the API pool: whether any member is ACTIVE.
    fn sample_pool(&mut self, members: Result<Vec<(String, String)>, String>) {
        let Ok(members) = members else {
            self.unread += 1;
            return;
        };
        let now = self.created.elapsed();
        if members.iter().any(|(_, status)| status == "ACTIVE") {
            self.without_active_since = None;
            return;
        }
        let since = *self.without_active_since.get_or_insert(now);
        self.longest_without_active = self.longest_without_active.max(now - since);
    }

    /// Says the releases and the conditions' timeline.
    fn say(&self, provider: &str) {
        for release in &self.released {
            eprintln!(
                "{provider} released {} {:.0} s after its Machine was created, its member {}",
                release.machine,
                release.after.as_secs_f64(),
                release.member
            );
        }
        if let Some(at) = self.old_deleted {
            eprintln!(
                "{provider}: the old machine deleted {:.0} s after the new ones were created",
                at.as_secs_f64()
            );
        }
        eprintln!(
            "{provider}: the API pool's longest time without an ACTIVE member: {:.0} s{} \
             ({} readings failed)",
            self.longest_without_active.as_secs_f64(),
            if self.without_active_since.is_some() {
                ", still so at the end"
            } else {
                ""
            },
            self.unread
        );
        eprintln!(
            "{provider}'s OpenStackMachine conditions, from the machines' creation:\n{}",
            self.timeline.join("\n")
        );
    }

    fn released_while_not_active(&self) -> Vec<&Released> {
        self.released
            .iter()
            .filter(|r| r.member != "ACTIVE")
            .collect()
    }
}

/// CAPO v0.14.7 and Cluster API v1.12.10's controllers, both real, on the real OpenStack tier:
/// they build a cluster's network, router, security groups and API load balancer from CAPO
/// 0.14's v1beta1 API. Then a control-plane machine that serves, and a rollout onto two new
/// ones: one whose member Octavia holds PENDING_CREATE (`fault.sh member-hold`), one whose
/// member goes ERROR (`member-error`). CAPO waits for each member once, at creation (about
/// 274 s), then releases the machine anyway; the driver, as the control plane would, deletes
/// the old machine, and the API pool is left with no ACTIVE member: the failure capo-rs's gate
/// prevents, measured on CAPO itself. Then everything is deleted, and the project is left as it
/// was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_capo_v0_14_7_releases_machines_whose_members_never_served() {
    let Some(peers) = capo_peers() else {
        return;
    };
    let Some(real) = real_cloud() else {
        return;
    };
    let world = CapoWorld::start(&peers, &real).await;
    let logs = || world.logs();
    let arm = world.arm(&logs);
    let before = census(arm.tenant).await;
    let lb = arm.build(&before).await;

    // Generous: the main pass stops Keystone, Nova, Neutron and Octavia's worker meanwhile.
    let watch = arm
        .rollout_onto_faulty_members(&lb, Duration::from_secs(780), Duration::from_secs(60))
        .await;
    watch.say(arm.provider);
    arm.fault("member-release", &arm.held(), &[]).await;
    assert_eq!(
        watch.released.len(),
        2,
        "CAPO released {} of 2 machines within 780 s\n{}",
        watch.released.len(),
        world.logs()
    );
    assert_eq!(
        watch.released_while_not_active().len(),
        2,
        "machines released while their member was not ACTIVE"
    );
    assert!(
        watch.longest_without_active > Duration::ZERO,
        "the API pool always had an ACTIVE member"
    );

    let deleting = Instant::now();
    arm.delete_cluster().await;
    let deleted = deleting.elapsed();
    let mut left = new_objects(&before, &census(arm.tenant).await);
    let lost = world.remove_lost_api_floating_ips(&mut left).await;
    assert!(left.is_empty(), "CAPO left in the cloud: {left:#?}");
    eprintln!(
        "CAPO v0.14.7 deleted {CLUSTER} and its machines in {:.0} s, {}",
        deleted.as_secs_f64(),
        if lost.is_empty() {
            "nothing left".to_owned()
        } else {
            lost
        }
    );
}

/// How long capo-rs's arm is watched: past CAPO's releases in the same scenario (304-375 s
/// after the machines' creation), so that a release capo-rs would make there is seen.
const RS_HORIZON: Duration = Duration::from_secs(420);

/// The same scenario, driven the same way, on capo-rs, with Cluster API v1.14.2's real
/// controllers and capo-rs's shipped timings: neither new machine is released while its member
/// is not ACTIVE, the OpenStackMachines say why, so the old machine stays and the API pool
/// never lacks an ACTIVE member. Then the held member is let go: that machine is released once
/// its member is ACTIVE, and the old one deleted with the pool serving throughout; the failed
/// one is never released. Then everything is deleted, and the project is left as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_capo_rs_holds_the_machines_capo_v0_14_7_releases() {
    let Some(peers) = capi_peers() else {
        return;
    };
    let Some(real) = real_cloud() else {
        return;
    };
    let world = CapoRsWorld::start(&peers, &real).await;
    let logs = || world.logs();
    let arm = world.arm(&logs);
    let before = census(arm.tenant).await;
    let lb = arm.build(&before).await;

    let mut watch = arm
        .rollout_onto_faulty_members(&lb, RS_HORIZON, Duration::ZERO)
        .await;
    watch.say(arm.provider);
    let early = watch.released_while_not_active().len();
    assert_eq!(
        early, 0,
        "capo-rs released {early} machine(s) whose member was not ACTIVE"
    );
    assert_eq!(
        watch.longest_without_active,
        Duration::ZERO,
        "the API pool had no ACTIVE member"
    );
    let (held, failed) = (arm.held(), arm.failed());
    for machine in [&held, &failed] {
        let said = format!("{machine}: APIServerLoadBalancerMemberReady False");
        assert!(
            watch.timeline.iter().any(|line| line.contains(&said)),
            "capo-rs never said {said}:\n{}",
            watch.timeline.join("\n")
        );
    }

    let letting_go = Instant::now();
    arm.fault("member-release", &held, &[]).await;
    let let_go = arm.finish_rollout(&lb, &held, &mut watch).await - letting_go;
    assert_eq!(
        watch.longest_without_active,
        Duration::ZERO,
        "the API pool had no ACTIVE member while the old machine left"
    );
    arm.look(&lb, &failed, &mut watch).await;
    watch.say(arm.provider);
    let released: Vec<&str> = watch.released.iter().map(|r| r.machine.as_str()).collect();
    assert_eq!(
        released,
        [held.as_str()],
        "released after the held member's release"
    );
    assert_eq!(
        watch.released_while_not_active().len(),
        0,
        "a machine released while its member was not ACTIVE"
    );
    eprintln!(
        "capo-rs released {held} {:.0} s after its member was let go; {failed} is still held, \
         its member in ERROR",
        let_go.as_secs_f64()
    );

    let deleting = Instant::now();
    arm.delete_cluster().await;
    let left = new_objects(&before, &census(arm.tenant).await);
    assert!(left.is_empty(), "capo-rs left in the cloud: {left:#?}");
    eprintln!(
        "capo-rs deleted {RS_CLUSTER} and its machines in {:.0} s, nothing left",
        deleting.elapsed().as_secs_f64()
    );
}

/// The takeover's namespace, cluster and project (`capo-rs-takeover`, a census of its own, so
/// that it runs beside the scenarios above).
const TAKEOVER_NAMESPACE: &str = "capo-takeover";
const TAKEOVER_CLUSTER: &str = "capo-built";
const TAKEOVER_CLOUD: &str = "capo-takeover";

/// CAPO v0.14.7 builds a cluster on the real tier (an API load balancer, a bastion, three
/// control-plane machines and a worker; its objects stored as v1beta1 in real etcd, Cluster API
/// v1.12.10 beside it). Then capo-rs replaces it as `docs/migrating-from-capo.md` says: CAPO
/// stopped and its webhook configurations deleted, capo-rs's CRDs and webhook installed over
/// CAPO's, Cluster API restarted, capo-rs started. capo-rs writes nothing to the cloud; the
/// members keep their IDs and the machines their providerIDs; storage is migrated to v1beta2
/// and every object reads in both versions. Then a control-plane machine is replaced under the
/// gate. Then the guide's way back to CAPO, step by step: CAPO writes its status again and
/// changes no cloud object, and deletes the cluster, leaving the project as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_capo_rs_takes_over_a_cluster_capo_v0_14_7_built() {
    let Some(peers) = capo_peers() else {
        return;
    };
    let Some(real) = real_cloud() else {
        return;
    };
    let mut world = CapoWorld::start_in(
        &peers,
        &real,
        TAKEOVER_CLOUD,
        TAKEOVER_NAMESPACE,
        TAKEOVER_CLUSTER,
    )
    .await;
    let control_plane: Vec<String> = (0..3)
        .map(|i| format!("{TAKEOVER_CLUSTER}-cp-{i}"))
        .collect();
    let worker = format!("{TAKEOVER_CLUSTER}-md-0");
    let (before, lb, released) = {
        let logs = || world.logs();
        let mut arm = world.arm(&logs);
        arm.bastion = true;
        let before = census(arm.tenant).await;
        let built = Instant::now();
        let lb = arm.build(&before).await;
        arm.bootstrap_secret().await;
        for machine in &control_plane {
            arm.create_machine(machine, true).await;
        }
        arm.create_machine(&worker, false).await;
        let everyone: Vec<String> = control_plane.iter().chain([&worker]).cloned().collect();
        let released = wait_released(&arm, &everyone).await;
        eprintln!(
            "FIGURES takeover: CAPO v0.14.7 built {TAKEOVER_CLUSTER} (LB, bastion, 3 control-plane machines, a worker) in {:.0} s",
            built.elapsed().as_secs_f64()
        );
        (before, lb, released)
    };
    let members_before = crate::real_provider::member_ids(&world.tenant, &lb).await;
    assert_eq!(
        members_before.len(),
        3,
        "CAPO's three API members: {members_before:?}"
    );
    let cloud_before = census(&world.tenant).await;

    // The takeover, as the guide says: CAPO stopped, its webhooks gone, capo-rs installed over
    // its CRDs and started (Cluster API stays as it is).
    let started = Instant::now();
    drop(world.capo.take());
    delete_capo_webhooks(&world.kube).await;
    world.kube.install_ours().await;
    // Cluster API restarted: capo-rs's CRDs name the v1beta2 contract, so Cluster API now
    // reads v1beta2 while its watches stay on v1beta1, and a machine whose providerID came
    // just after a read waited for its sync period, 10 minutes (this scenario's third run).
    drop(world.capi.take());
    world.capi = Some(CapiManager::start(&world.kube, &peers.capi_release()).await);
    let config = ManagerConfig {
        scope: WatchScope {
            namespace: Some(world.kube.namespace.clone()),
            ..WatchScope::default()
        },
        ..ManagerConfig::default()
    };
    let (registry, shutdown, manager) = spawn_manager(&world.kube.manager_client, config.clone());
    let running = shutdown.clone().drop_guard();
    wait_stored(&world.kube, "v1beta2").await;
    let migrated_in = started.elapsed();
    let logs = || world.logs();
    let arm = Arm {
        provider: "capo-rs",
        native: "v1beta2",
        ..world.arm(&logs)
    };
    wait_capo_rs_ready(&arm).await;
    let settled_in = started.elapsed();
    let requests = crate::real_provider::openstack_request_counts(&registry);
    let writes: BTreeMap<&String, &u64> = requests
        .iter()
        .filter(|(request, _)| !crate::real_provider::is_read(request))
        .collect();
    assert!(
        writes.is_empty(),
        "capo-rs wrote to the cloud taking over: {writes:?}"
    );
    assert_eq!(
        crate::real_provider::member_ids(&world.tenant, &lb).await,
        members_before,
        "the members keep their IDs"
    );
    assert_eq!(
        census(&world.tenant).await,
        cloud_before,
        "the cloud as CAPO left it"
    );
    for (machine, provider_id) in &released {
        let now = arm.machines().get(machine).await.expect("the Machine");
        assert_eq!(
            now.data["spec"]["providerID"].as_str(),
            Some(provider_id.as_str()),
            "{machine}: its providerID unchanged"
        );
        for version in ["v1beta1", "v1beta2"] {
            arm.openstack_machines(version)
                .get(machine)
                .await
                .unwrap_or_else(|e| panic!("{machine} read as {version}: {e}"));
        }
    }
    eprintln!(
        "FIGURES takeover of CAPO v0.14.7's cluster (real OpenStack, real API server): storage migrated in {:.1} s, settled in {:.1} s; OpenStack requests {}, of which writes 0",
        migrated_in.as_secs_f64(),
        settled_in.as_secs_f64(),
        requests.values().sum::<u64>(),
    );

    // Under capo-rs: a control-plane machine replaced, the new one released only once its
    // member is ACTIVE; then the old one deleted, and the cluster.
    let fresh = format!("{TAKEOVER_CLUSTER}-cp-3");
    arm.create_machine(&fresh, true).await;
    let mut watch = Watch::new();
    until(
        "the new control-plane machine released",
        Duration::from_secs(600),
        &logs,
        async || {
            arm.look(&lb, &fresh, &mut watch).await;
            match watch.released.first() {
                Some(_) => Ok(()),
                None => Err("not released".to_owned()),
            }
        },
    )
    .await;
    assert_eq!(
        watch.released[0].member, "ACTIVE",
        "released only once its member is ACTIVE"
    );
    let old = &control_plane[0];
    arm.machines()
        .delete(old, &DeleteParams::default())
        .await
        .expect("the old Machine's deletion");
    until(
        "the old machine gone",
        Duration::from_secs(420),
        &logs,
        async || match arm.machines().get_opt(old).await {
            Ok(None) => Ok(()),
            Ok(Some(_)) => Err("still there".to_owned()),
            Err(e) => Err(e.to_string()),
        },
    )
    .await;
    let members: Vec<(String, String)> = arm.pool_members(&lb).await.expect("the members");
    assert_eq!(
        members.len(),
        3,
        "three members after the rollout: {members:?}"
    );
    assert!(
        members.iter().all(|(_, status)| status == "ACTIVE")
            && !members
                .iter()
                .any(|(name, _)| name.ends_with(&format!("-{old}"))),
        "{members:?}"
    );

    // The way back to CAPO v0.14.7, as the guide's "Rolling back" says.
    let rolling_back = Instant::now();
    store_as(&world.kube, "v1beta1").await;
    stop_manager(shutdown, manager).await;
    drop(running);
    let (_registry, shutdown, manager) = spawn_manager(&world.kube.manager_client, config);
    wait_stored(&world.kube, "v1beta1").await;
    stop_manager(shutdown, manager).await;
    // Only now: while capo-rs runs it puts its hook back (the scenario's fourth run removed it
    // first, and CAPO's deletion of the cluster then waited on it for ever).
    remove_capo_rs_hooks(&arm).await;
    delete_capo_rs_webhook(&world.kube).await;
    // Cluster API stopped while the CRDs change: a manager left running keeps watching the
    // version they stop serving, reads every OpenStack object as gone, and deleting the
    // cluster then left all of them behind (found by this scenario's first run).
    drop(world.capi.take());
    replace_crds(&world.kube, &capo_crds(&peers)).await;
    world.capi = Some(CapiManager::start(&world.kube, &peers.capi_release()).await);
    let stored_back_in = rolling_back.elapsed();
    let census_back = census(&world.tenant).await;
    let members_back = crate::real_provider::member_ids(&world.tenant, &lb).await;
    let auth_url = real
        .credentials(TAKEOVER_CLOUD)
        .resolve()
        .expect("the tier's clouds.yaml")
        .auth_url;
    let reach = cloud_ports(&world.tenant, &auth_url).await;
    world.capo = Some(CapoManager::start(&world.kube, &peers, &reach).await);
    let logs = || world.logs();
    let arm = Arm {
        provider: "CAPO v0.14.7, back",
        ..world.arm(&logs)
    };
    let capo = world.capo.as_ref().expect("CAPO v0.14.7 back");
    wait_reconciled_by_capo(&arm, capo).await;
    let census_after = census(&world.tenant).await;
    let made = new_objects(&census_back, &census_after);
    let gone = new_objects(&census_after, &census_back);
    let events = capo_events(&arm, rolling_back).await;
    eprintln!(
        "FIGURES rollback to CAPO v0.14.7: storage back to v1beta1 and CAPO's CRDs in {:.1} s, CAPO reconciled every object in {:.1} s; cloud objects CAPO made {made:?}, removed {gone:?}; members re-created: {}; CAPO's events:\n{}",
        stored_back_in.as_secs_f64(),
        rolling_back.elapsed().as_secs_f64(),
        crate::real_provider::member_ids(&world.tenant, &lb).await != members_back,
        events.join("\n")
    );
    assert!(
        made.is_empty() && gone.is_empty(),
        "CAPO changed the cloud's objects back: made {made:#?}, removed {gone:#?}"
    );
    assert_eq!(
        crate::real_provider::member_ids(&world.tenant, &lb).await,
        members_back,
        "CAPO keeps the members"
    );

    // And CAPO deletes the cluster.
    arm.delete_cluster().await;
    let mut left = new_objects(&before, &census(&world.tenant).await);
    let lost = world.remove_lost_api_floating_ips(&mut left).await;
    assert!(left.is_empty(), "left in the cloud: {left:#?}");
    if !lost.is_empty() {
        eprintln!("CAPO v0.14.7 deleted {TAKEOVER_CLUSTER}, {lost}");
    }
}

/// Graceful: returns once the manager's reconciles in flight have finished.
async fn stop_manager(
    shutdown: tokio_util::sync::CancellationToken,
    manager: tokio::task::JoinHandle<Result<(), capo_provider::manager::ManagerError>>,
) {
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(60), manager)
        .await
        .expect("capo-rs stops within 60 s")
        .expect("the manager's task")
        .expect("the manager");
}

/// capo-rs's pre-terminate hook off every Machine: CAPO does not know it, and a Machine
/// holding it would wait for ever when deleted (the guide's rollback, step 4).
async fn remove_capo_rs_hooks(arm: &Arm<'_>) {
    let hook = capo_api::capi::labels::LB_MEMBER_HOOK;
    let unhooked = json!({"metadata": {"annotations": {hook: null}}});
    for machine in arm
        .machines()
        .list(&Default::default())
        .await
        .expect("machines")
        .items
    {
        let name = kube::ResourceExt::name_any(&machine);
        arm.machines()
            .patch(&name, &PatchParams::default(), &Patch::Merge(&unhooked))
            .await
            .expect("the hook removed");
    }
}

/// Marks `version` the storage version of each convertible kind's CRD (both still served).
async fn store_as(kube: &KubeWorld, version: &str) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let crds: Api<CustomResourceDefinition> = Api::all(kube.client.clone());
    for name in convertible_crds() {
        let mut crd = crds.get(&name).await.expect("the CRD");
        for served in &mut crd.spec.versions {
            served.storage = served.name == version;
        }
        crds.replace(&name, &PostParams::default(), &crd)
            .await
            .unwrap_or_else(|e| panic!("{name}: {version} as the storage version: {e}"));
    }
}

/// `objects` (CRDs) in place of what is installed, as `kubectl replace` does.
async fn replace_crds(kube: &KubeWorld, objects: &[Value]) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let crds: Api<CustomResourceDefinition> = Api::all(kube.client.clone());
    for object in objects {
        let name = object["metadata"]["name"].as_str().unwrap_or_default();
        let mut crd: CustomResourceDefinition =
            serde_json::from_value(object.clone()).expect("a CRD");
        let Some(installed) = crds.get_opt(name).await.expect("the CRD") else {
            continue;
        };
        crd.metadata.resource_version = installed.metadata.resource_version;
        crds.replace(name, &PostParams::default(), &crd)
            .await
            .unwrap_or_else(|e| panic!("{name} replaced by CAPO's: {e}"));
    }
}

/// capo-rs's ValidatingWebhookConfiguration, which fails closed once capo-rs is gone.
async fn delete_capo_rs_webhook(kube: &KubeWorld) {
    use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(kube.client.clone());
    delete_named(&validating, |name| name.starts_with("capo-rs-")).await;
}

/// Until CAPO's manager, started anew for the way back, has reconciled the OpenStackCluster
/// and every OpenStackMachine to the end: its log says so of each. Its status writes are no
/// proof: with nothing to change it writes none, and CI's runs at `06c7703` and `0e74c30`
/// waited 420 s for writes on machines that needed none.
async fn wait_reconciled_by_capo(arm: &Arm<'_>, capo: &CapoManager) {
    let reconciled = |o: &DynamicObject| {
        let is_cluster = match &o.types {
            Some(types) => types.kind == "OpenStackCluster",
            None => kube::ResourceExt::name_any(o) == arm.cluster,
        };
        let (kind, done) = match is_cluster {
            true => (
                "OpenStackCluster",
                "Reconciled Cluster created successfully",
            ),
            false => ("OpenStackMachine", "Reconciled Machine create successfully"),
        };
        let object = format!(
            "{kind}=\"{}/{}\"",
            o.metadata.namespace.as_deref().unwrap_or_default(),
            kube::ResourceExt::name_any(o)
        );
        let lines = capo.log_lines_with(&[object.as_str()]);
        match lines.iter().find(|line| line.contains(done)) {
            Some(_) => Ok(()),
            None => Err(lines.last().map_or("nothing", |l| l.as_str()).to_owned()),
        }
    };
    let says = |o: &DynamicObject| {
        let said = reconciled(o).err().unwrap_or_default();
        let said: String = said.chars().take(300).collect();
        format!(
            "{}: CAPO's last word on it: {said}",
            kube::ResourceExt::name_any(o)
        )
    };
    until_every_object(
        arm,
        "v1beta1",
        "CAPO's reconcile of every object to the end",
        |o| reconciled(o).is_ok(),
        says,
    )
    .await;
}

/// The wall-clock time `ago` before now, in RFC 3339 (managed fields' times have seconds).
fn wall_clock_before(ago: Duration) -> k8s_openapi::jiff::Timestamp {
    let now = k8s_openapi::jiff::Timestamp::now();
    now.checked_sub(k8s_openapi::jiff::SignedDuration::try_from(ago).unwrap_or_default())
        .unwrap_or(now)
}

/// The events about OpenStack kinds last seen since `since`, as `reporter reason: message
/// (object)`.
async fn capo_events(arm: &Arm<'_>, since: Instant) -> Vec<String> {
    let after = wall_clock_before(since.elapsed());
    let events: Api<k8s_openapi::api::core::v1::Event> = arm.kube.api();
    events
        .list(&Default::default())
        .await
        .map(|list| list.items)
        .unwrap_or_default()
        .iter()
        .filter(|e| {
            e.involved_object
                .kind
                .as_deref()
                .is_some_and(|k| k.starts_with("OpenStack"))
        })
        .filter(|e| {
            let seen =
                (e.last_timestamp.as_ref().map(|t| t.0)).or(e.event_time.as_ref().map(|t| t.0));
            seen.is_some_and(|t| t.as_second() + 1 >= after.as_second())
        })
        .map(|e| {
            format!(
                "{} {}: {} ({} {})",
                e.reporting_component
                    .as_deref()
                    .or(e.source.as_ref().and_then(|s| s.component.as_deref()))
                    .unwrap_or("?"),
                e.reason.as_deref().unwrap_or_default(),
                e.message
                    .as_deref()
                    .unwrap_or_default()
                    .chars()
                    .take(160)
                    .collect::<String>(),
                e.involved_object.kind.as_deref().unwrap_or_default(),
                e.involved_object.name.as_deref().unwrap_or_default(),
            )
        })
        .collect()
}

/// Until every Machine of `names` has its providerID; their providerIDs.
async fn wait_released(arm: &Arm<'_>, names: &[String]) -> BTreeMap<String, String> {
    until(
        "every machine released",
        Duration::from_secs(900),
        arm.logs,
        async || {
            let mut released = BTreeMap::new();
            for name in names {
                let machine = arm.machines().get(name).await.map_err(|e| e.to_string())?;
                match machine.data["spec"]["providerID"].as_str() {
                    Some(id) => released.insert(name.clone(), id.to_owned()),
                    None => return Err(format!("{name} not released; {released:?}")),
                };
            }
            Ok(released)
        },
    )
    .await
}

/// CAPO's webhook configurations (named with its `capo-` prefix), which fail closed once its
/// manager is gone: the guide's step 2.
async fn delete_capo_webhooks(kube: &KubeWorld) {
    use k8s_openapi::api::admissionregistration::v1::{
        MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
    };
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(kube.client.clone());
    let mutating: Api<MutatingWebhookConfiguration> = Api::all(kube.client.clone());
    let capos = |name: &str| name.starts_with("capo-") && !name.starts_with("capo-rs-");
    delete_named(&validating, capos).await;
    delete_named(&mutating, capos).await;
}

/// Deletes every object of `api` whose name `chosen` picks.
async fn delete_named<K>(api: &Api<K>, chosen: impl Fn(&str) -> bool)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    for object in api.list(&Default::default()).await.expect("list").items {
        let name = kube::ResourceExt::name_any(&object);
        if chosen(&name) {
            api.delete(&name, &DeleteParams::default())
                .await
                .expect("delete");
        }
    }
}

/// The CRDs of the kinds served in two versions (OpenStackCluster, OpenStackMachine and their
/// templates).
fn convertible_crds() -> Vec<String> {
    capo_api::conversion::CONVERTIBLE_KINDS
        .iter()
        .map(|kind| format!("{}s.{}", kind.to_lowercase(), capo_api::GROUP))
        .collect()
}

/// Until each convertible kind's CRD stores `version` alone.
async fn wait_stored(kube: &KubeWorld, version: &str) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let crds: Api<CustomResourceDefinition> = Api::all(kube.client.clone());
    for name in convertible_crds() {
        let stored = |crd: Option<&CustomResourceDefinition>| {
            crd.and_then(|c| c.status.as_ref())
                .and_then(|s| s.stored_versions.as_ref())
                .is_some_and(|v| v == &[version.to_owned()])
        };
        let migrated = kube::runtime::wait::await_condition(crds.clone(), &name, stored);
        tokio::time::timeout(Duration::from_secs(180), migrated)
            .await
            .unwrap_or_else(|_| panic!("{name}: storage not migrated to {version} within 180 s"))
            .expect("the CRD watch");
    }
}

/// Until the OpenStackCluster and every OpenStackMachine carry a Ready condition capo-rs
/// wrote (a reason, and the generation it saw: CAPO's had neither).
async fn wait_capo_rs_ready(arm: &Arm<'_>) {
    let ours = |object: &DynamicObject| {
        object.data["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| {
                c["type"] == "Ready"
                    && c["reason"]
                        .as_str()
                        .is_some_and(|r| !r.is_empty() && r != capo_api::conversion::NO_REASON)
                    && c["observedGeneration"].is_u64()
            })
    };
    let name = |o: &DynamicObject| kube::ResourceExt::name_any(o);
    until_every_object(arm, "v1beta2", "capo-rs's Ready everywhere", ours, name).await;
}

/// Until the OpenStackCluster and every OpenStackMachine, read as `version`, are `done`;
/// those that are not, as `describe` says them, in the failure.
async fn until_every_object(
    arm: &Arm<'_>,
    version: &str,
    what: &str,
    done: impl Fn(&DynamicObject) -> bool,
    describe: impl Fn(&DynamicObject) -> String,
) {
    let clusters = api(
        arm.kube,
        "infrastructure.cluster.x-k8s.io",
        version,
        "OpenStackCluster",
        "openstackclusters",
    );
    let machines = arm.openstack_machines(version);
    until(what, Duration::from_secs(420), arm.logs, async || {
        let mut objects = (clusters.list(&Default::default()).await)
            .map_err(|e| e.to_string())?
            .items;
        objects.extend(
            (machines.list(&Default::default()).await)
                .map_err(|e| e.to_string())?
                .items,
        );
        let waiting: Vec<String> = objects.iter().filter(|o| !done(o)).map(&describe).collect();
        if waiting.is_empty() {
            Ok(())
        } else {
            Err(format!("waiting: {waiting:?}"))
        }
    })
    .await;
}
