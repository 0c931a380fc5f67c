//! Cluster API's topology controller builds, scales and rolls a cluster of capo-rs's
//! ClusterClass (`deploy/clusterctl/clusterclass-capo-rs-default.yaml`): the `topology`
//! flavor as `clusterctl generate cluster` renders it, applied to a real API server where
//! Cluster API v1.14.2's core manager runs with `ClusterTopology` on, and capo-rs on the
//! simulated cloud.
//!
//! What stands in (`docs/cluster-api-peers.md`): kubeadm's control-plane and bootstrap
//! managers need a workload cluster with etcd and kubelets (DESIGN §11), so [`Kubeadm`] plays
//! them on their real objects, as narrowly as it can:
//! - a KubeadmConfig gets a bootstrap Secret of its own name and the status that names it;
//! - a KubeadmControlPlane keeps `spec.replicas` control-plane Machines, each with an
//!   OpenStackMachine cloned from `spec.machineTemplate.spec.infrastructureRef`; it rolls
//!   Machines cloned from an older template out one at a time, max surge 1, and deletes an
//!   old Machine only once every Machine has its providerID (KCP's rule, DESIGN §3); its
//!   status reports the replicas, the version and the initialization as KCP's does; on
//!   deletion it deletes its Machines and then lets go.
//!
//! Everything else is Cluster API's own: the ClusterClass and topology controllers (the
//! OpenStackCluster, the KubeadmControlPlane, the MachineDeployment and the templates they
//! copy and rotate), the MachineDeployment, MachineSet and Machine controllers.

use std::collections::BTreeMap;
use std::time::Duration;

use capo_api::OpenStackMachine;
use capo_api::conditions::reasons;
use capo_provider::cloud::Service;
use capo_sim::openstack::{Effect, ObjectKind, Rule, Scenario};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::capi_peers::{CapiManager, Driven, capi_api, capi_peers, until, wait_gone};
use crate::capo_peers::{CapoPeers, capo_peers, orc_crds};
use crate::clusterctl::{LocalRepository, VERSION, admin_kubeconfig, variables};
use crate::first_cluster::kubeadm_crds_as_released;
use crate::go_peer::{IsolatedPeer, PeerRun, api_port};
use crate::kube_world::{Kube, KubeWorld, apply_crds, dynamic_api, real_kube};
use crate::real_cloud::{PASSWORD_CLOUD, REAL, census, fault, get_json, real_cloud};
use crate::real_provider::{
    E2e, IMAGE, KEY_PAIR, SECRET, WAIT, assert_nothing_left, unique_cluster_name,
};
use crate::rollout::member_condition;
use crate::server_controller::{World, base64};

const CLUSTER: &str = "c1";
const CLUSTER_NAME: &str = "cluster.x-k8s.io/cluster-name";
const CONTROL_PLANE: &str = "cluster.x-k8s.io/control-plane";
const CLONED_FROM: &str = "cluster.x-k8s.io/cloned-from-name";
const KCP_FINALIZER: &str = "kubeadm.controlplane.cluster.x-k8s.io";
const INFRA_GROUP: &str = "infrastructure.cluster.x-k8s.io";

fn namespaced_api(client: &Client, namespace: &str, group: &str, kind: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk(group, "v1beta2", kind);
    let plural = format!("{}s", kind.to_ascii_lowercase());
    let resource = ApiResource::from_gvk_with_plural(&gvk, &plural);
    Api::namespaced_with(client.clone(), namespace, &resource)
}

/// kubeadm's control-plane and bootstrap managers, played on their objects in one namespace.
struct Kubeadm {
    /// The one cluster it plays for.
    cluster: String,
    client: Client,
    namespace: String,
    control_planes: Api<DynamicObject>,
    configs: Api<DynamicObject>,
    machines: Api<DynamicObject>,
    templates: Api<DynamicObject>,
    secrets: Api<Secret>,
    /// The next control-plane Machine's number: Machines are named `<cluster>-control-plane-NN`,
    /// so the oldest sorts first and a test can name the next one.
    next: std::sync::atomic::AtomicU32,
}

impl Kubeadm {
    fn new(kube: &KubeWorld, cluster: &str) -> Self {
        let client = kube.client.clone();
        let ns = kube.namespace.clone();
        Kubeadm {
            cluster: cluster.to_owned(),
            control_planes: namespaced_api(
                &client,
                &ns,
                "controlplane.cluster.x-k8s.io",
                "KubeadmControlPlane",
            ),
            configs: namespaced_api(&client, &ns, "bootstrap.cluster.x-k8s.io", "KubeadmConfig"),
            machines: capi_api(kube, "Machine", "machines"),
            templates: namespaced_api(&client, &ns, INFRA_GROUP, "OpenStackMachineTemplate"),
            secrets: Api::namespaced(client.clone(), &ns),
            client,
            namespace: ns,
            next: std::sync::atomic::AtomicU32::new(1),
        }
    }

    /// Plays both managers until `cancel`; an API error is logged and the next pass retries.
    async fn run(self, cancel: CancellationToken) {
        loop {
            if let Err(error) = self.pass().await {
                tracing::warn!(%error, "the kubeadm stand-in's pass failed");
            }
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(Duration::from_millis(200)) => {}
            }
        }
    }

    async fn pass(&self) -> Result<(), kube::Error> {
        for config in self.configs.list(&ListParams::default()).await? {
            self.bootstrap(&config).await?;
        }
        for plane in self.control_planes.list(&ListParams::default()).await? {
            self.control_plane(&plane).await?;
        }
        Ok(())
    }

    /// A KubeadmConfig's data: a Secret of its name, and the status that names it.
    async fn bootstrap(&self, config: &DynamicObject) -> Result<(), kube::Error> {
        if config.data["status"]["dataSecretName"].is_string() {
            return Ok(());
        }
        let name = config.name_any();
        self.put_bootstrap_secret(&name).await?;
        let status = json!({"status": {"dataSecretName": name,
                                       "initialization": {"dataSecretCreated": true}}});
        self.configs
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
            .await?;
        Ok(())
    }

    async fn put_bootstrap_secret(&self, name: &str) -> Result<(), kube::Error> {
        let secret: Secret = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": self.namespace},
            "type": "cluster.x-k8s.io/secret",
            "stringData": {"value": "#cloud-config\n", "format": "cloud-config"},
        }))
        .map_err(kube::Error::SerdeError)?;
        match self.secrets.create(&PostParams::default(), &secret).await {
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
            other => other.map(|_| ()),
        }
    }

    /// One pass of the control plane: deletion, then one scaling or rollout step, then status.
    async fn control_plane(&self, plane: &DynamicObject) -> Result<(), kube::Error> {
        let name = plane.name_any();
        let cluster = self.cluster.clone();
        if plane.labels().get(CLUSTER_NAME) != Some(&cluster) {
            return Ok(());
        }
        let machines = self.control_plane_machines(&cluster).await?;
        if plane.metadata.deletion_timestamp.is_some() {
            return self.let_go(&name, &machines).await;
        }
        if !plane.finalizers().iter().any(|f| f == KCP_FINALIZER) {
            let finalizers = json!({"metadata": {"finalizers": [KCP_FINALIZER]}});
            self.control_planes
                .patch(&name, &PatchParams::default(), &Patch::Merge(&finalizers))
                .await?;
        }
        let spec = &plane.data["spec"];
        let template = spec["machineTemplate"]["spec"]["infrastructureRef"]["name"]
            .as_str()
            .unwrap_or_default();
        let wanted = spec["replicas"].as_u64().unwrap_or(1) as usize;
        let version = spec["version"].as_str().unwrap_or_default();
        let outdated: Vec<&DynamicObject> = machines
            .iter()
            .filter(|m| self.cloned_from(m) != Some(template))
            .collect();
        let settled = machines
            .iter()
            .all(|m| m.metadata.deletion_timestamp.is_none() && has_provider_id(m));
        if settled {
            let surge = !outdated.is_empty() && machines.len() == wanted;
            if machines.len() < wanted || surge {
                self.create_machine(plane, &cluster, template, version)
                    .await?;
            } else if machines.len() > wanted {
                let oldest = outdated.first().copied().or(machines.first());
                if let Some(oldest) = oldest {
                    self.machines
                        .delete(&oldest.name_any(), &DeleteParams::default())
                        .await?;
                }
            }
        }
        self.report(plane, &machines, outdated.len()).await
    }

    /// The cluster's control-plane Machines, oldest first.
    async fn control_plane_machines(
        &self,
        cluster: &str,
    ) -> Result<Vec<DynamicObject>, kube::Error> {
        let selector = format!("{CLUSTER_NAME}={cluster},{CONTROL_PLANE}");
        let mut machines = self
            .machines
            .list(&ListParams::default().labels(&selector))
            .await?
            .items;
        machines.sort_by_key(ResourceExt::name_any);
        Ok(machines)
    }

    /// The template a Machine's OpenStackMachine was cloned from (the Machine's annotation,
    /// which this stand-in writes as KCP does).
    fn cloned_from<'m>(&self, machine: &'m DynamicObject) -> Option<&'m str> {
        machine.annotations().get(CLONED_FROM).map(String::as_str)
    }

    /// A control-plane Machine and its OpenStackMachine cloned from `template`.
    async fn create_machine(
        &self,
        plane: &DynamicObject,
        cluster: &str,
        template: &str,
        version: &str,
    ) -> Result<(), kube::Error> {
        let number = self.next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let name = format!("{cluster}-control-plane-{number:02}");
        let source = self.templates.get(template).await?;
        let labels = json!({CLUSTER_NAME: cluster, CONTROL_PLANE: ""});
        let annotations = json!({CLONED_FROM: template,
            "cluster.x-k8s.io/cloned-from-groupkind": "OpenStackMachineTemplate.infrastructure.cluster.x-k8s.io"});
        let owner = json!([{
            "apiVersion": "controlplane.cluster.x-k8s.io/v1beta2", "kind": "KubeadmControlPlane",
            "name": plane.name_any(), "uid": plane.uid().unwrap_or_default(),
            "controller": true, "blockOwnerDeletion": true,
        }]);
        let infra = json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "OpenStackMachine",
            "metadata": {"name": name, "namespace": self.namespace, "labels": labels,
                         "annotations": annotations, "ownerReferences": owner},
            "spec": source.data["spec"]["template"]["spec"],
        });
        create_or_keep(&dynamic_api(&self.client, &infra), infra).await?;
        let secret = format!("{name}-bootstrap");
        self.put_bootstrap_secret(&secret).await?;
        let machine = json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": {"name": name, "namespace": self.namespace, "labels": labels,
                         "annotations": annotations, "ownerReferences": owner},
            "spec": {
                "clusterName": cluster, "version": version,
                "bootstrap": {"dataSecretName": secret},
                "infrastructureRef": {"apiGroup": INFRA_GROUP, "kind": "OpenStackMachine",
                                      "name": name},
            },
        });
        create_or_keep(&self.machines, machine).await
    }

    /// KCP's status: replicas, readiness (a providerID), up-to-date, and once one Machine is
    /// ready, the version and the initialization.
    async fn report(
        &self,
        plane: &DynamicObject,
        machines: &[DynamicObject],
        outdated: usize,
    ) -> Result<(), kube::Error> {
        let ready = machines.iter().filter(|m| has_provider_id(m)).count();
        let mut status = json!({
            "observedGeneration": plane.metadata.generation,
            "replicas": machines.len(),
            "readyReplicas": ready,
            "availableReplicas": ready,
            "upToDateReplicas": machines.len() - outdated,
            "selector": format!("{CLUSTER_NAME}={},{CONTROL_PLANE}",
                                plane.labels().get(CLUSTER_NAME).cloned().unwrap_or_default()),
        });
        if ready > 0 {
            status["version"] = plane.data["spec"]["version"].clone();
            status["initialization"] = json!({"controlPlaneInitialized": true});
        }
        if plane.data["status"] == status {
            return Ok(());
        }
        self.control_planes
            .patch_status(
                &plane.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&json!({"status": status})),
            )
            .await?;
        Ok(())
    }

    /// A deleting control plane deletes its Machines, and lets go once they are gone.
    async fn let_go(&self, name: &str, machines: &[DynamicObject]) -> Result<(), kube::Error> {
        for machine in machines
            .iter()
            .filter(|m| m.metadata.deletion_timestamp.is_none())
        {
            self.machines
                .delete(&machine.name_any(), &DeleteParams::default())
                .await?;
        }
        if machines.is_empty() {
            let none = json!({"metadata": {"finalizers": null}});
            self.control_planes
                .patch(name, &PatchParams::default(), &Patch::Merge(&none))
                .await?;
        }
        Ok(())
    }
}

fn has_provider_id(machine: &DynamicObject) -> bool {
    machine.data["spec"]["providerID"].as_str().is_some()
}

async fn create_or_keep(api: &Api<DynamicObject>, object: Value) -> Result<(), kube::Error> {
    let object: DynamicObject = serde_json::from_value(object).map_err(kube::Error::SerdeError)?;
    match api.create(&PostParams::default(), &object).await {
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        other => other.map(|_| ()),
    }
}

/// What a scenario drives: the API server, Cluster API's manager, the cluster's name.
struct Stage<'a> {
    kube: &'a KubeWorld,
    manager: &'a CapiManager,
    cluster: String,
    clusters: Api<DynamicObject>,
    machines: Api<DynamicObject>,
}

impl<'a> Stage<'a> {
    fn new(kube: &'a KubeWorld, manager: &'a CapiManager, cluster: &str) -> Self {
        Stage {
            kube,
            manager,
            cluster: cluster.to_owned(),
            clusters: capi_api(kube, "Cluster", "clusters"),
            machines: capi_api(kube, "Machine", "machines"),
        }
    }

    /// The `topology` flavor as clusterctl renders it, `cloud` filling the cloud's variables
    /// and the image's, with one control-plane machine and one worker of flavor `m1.small`;
    /// then applied, the ClusterClass and its templates first.
    async fn create(&self, repo: &LocalRepository, cloud: BTreeMap<&'static str, String>) {
        let mut given = variables();
        given.remove("OPENSTACK_IMAGE_NAME");
        given.extend([
            (
                "OPENSTACK_CONTROL_PLANE_MACHINE_FLAVOR",
                "m1.small".to_owned(),
            ),
            ("OPENSTACK_NODE_MACHINE_FLAVOR", "m1.small".to_owned()),
            ("OPENSTACK_FAILURE_DOMAIN", "nova".to_owned()),
            // The real tier's key pair: Nova refuses a server with a key pair it does not hold
            // ("Invalid key_name provided."; the simulator does not model key pairs).
            ("OPENSTACK_SSH_KEY_NAME", KEY_PAIR.to_owned()),
        ]);
        given.extend(cloud);
        let kubeconfig = admin_kubeconfig(self.kube);
        let infrastructure = format!("capo-rs:{VERSION}");
        let args = [
            "generate",
            "cluster",
            &self.cluster,
            "--flavor",
            "topology",
            "--kubeconfig",
            &kubeconfig,
            "--infrastructure",
            &infrastructure,
            "--target-namespace",
            &self.kube.namespace,
            "--kubernetes-version",
            "v1.33.4",
            "--control-plane-machine-count",
            "1",
            "--worker-machine-count",
            "1",
        ];
        let rendered = repo.run(&args, &given).await;
        let objects: Vec<Value> = serde_saphyr::from_str_multiple(&rendered)
            .unwrap_or_else(|e| panic!("the topology flavor renders YAML: {e}\n{rendered}"));
        let kinds: Vec<&str> = objects.iter().filter_map(|o| o["kind"].as_str()).collect();
        assert!(
            kinds.contains(&"ClusterClass") && kinds.contains(&"OpenStackClusterTemplate"),
            "clusterctl adds the ClusterClass and its templates: {kinds:?}"
        );
        let (class, own): (Vec<Value>, Vec<Value>) =
            objects.into_iter().filter(Value::is_object).partition(|o| {
                o["kind"]
                    .as_str()
                    .is_some_and(|k| k.ends_with("Template") || k == "ClusterClass")
            });
        for object in class.into_iter().chain(own) {
            let what = format!("{} {}", object["kind"], object["metadata"]["name"]);
            create_or_keep(&dynamic_api(&self.kube.client, &object), object)
                .await
                .unwrap_or_else(|e| panic!("{what}: {e}"));
        }
    }

    /// Sets one of the Cluster's topology variables (the list is replaced whole, as
    /// `kubectl edit` does).
    async fn set_variable(&self, name: &str, value: Value) {
        let cluster = self.clusters.get(&self.cluster).await.unwrap();
        let mut variables = cluster.data["spec"]["topology"]["variables"].clone();
        for variable in variables.as_array_mut().into_iter().flatten() {
            if variable["name"] == name {
                variable["value"] = value.clone();
            }
        }
        let change = json!({"spec": {"topology": {"variables": variables}}});
        self.clusters
            .patch(
                &self.cluster,
                &PatchParams::default(),
                &Patch::Merge(&change),
            )
            .await
            .unwrap();
    }

    /// The control-plane Machines as Cluster API holds them: name → (template cloned from,
    /// providerID, deleting).
    async fn control_plane(&self) -> BTreeMap<String, (String, bool, bool)> {
        let selector = format!("{CLUSTER_NAME}={},{CONTROL_PLANE}", self.cluster);
        let machines = self
            .machines
            .list(&ListParams::default().labels(&selector))
            .await
            .unwrap();
        machines
            .iter()
            .map(|m| {
                let from = m
                    .annotations()
                    .get(CLONED_FROM)
                    .cloned()
                    .unwrap_or_default();
                let deleting = m.metadata.deletion_timestamp.is_some();
                (m.name_any(), (from, has_provider_id(m), deleting))
            })
            .collect()
    }

    /// The KubeadmControlPlane's machine template, once the topology controller points it
    /// somewhere other than `not`.
    async fn control_plane_template(&self, not: Option<&str>) -> String {
        let planes = namespaced_api(
            &self.kube.client,
            &self.kube.namespace,
            "controlplane.cluster.x-k8s.io",
            "KubeadmControlPlane",
        );
        let planes = &planes;
        until(
            self.manager,
            "the control plane's machine template",
            move || async move {
                let list = planes
                    .list(&ListParams::default())
                    .await
                    .map_err(|e| e.to_string())?;
                let template = list.items.first().and_then(|p| {
                    p.data["spec"]["machineTemplate"]["spec"]["infrastructureRef"]["name"].as_str()
                });
                match template {
                    Some(template) if Some(template) != not => Ok(template.to_owned()),
                    other => Err(format!("{other:?}")),
                }
            },
        )
        .await
    }

    async fn flavor_of(&self, template: &str) -> Value {
        let templates = namespaced_api(
            &self.kube.client,
            &self.kube.namespace,
            INFRA_GROUP,
            "OpenStackMachineTemplate",
        );
        let template = templates.get(template).await.unwrap();
        template.data["spec"]["template"]["spec"]["flavor"].clone()
    }

    /// Waits until the control plane is `count` Machines, all from `template`, all released.
    async fn wait_control_plane(&self, count: usize, template: &str) {
        let what = format!("{count} control-plane machines from {template}, released");
        until(self.manager, &what, || async {
            let now = self.control_plane().await;
            let done = now.len() == count
                && now
                    .values()
                    .all(|(from, released, deleting)| from == template && *released && !deleting);
            if done {
                Ok(())
            } else {
                Err(format!("{now:?}"))
            }
        })
        .await;
    }

    /// Waits until the MachineDeployment's one worker is released to Cluster API.
    async fn wait_worker(&self) {
        let selector = format!("{CLUSTER_NAME}={},!{CONTROL_PLANE}", self.cluster);
        let machines = &self.machines;
        let selector = &selector;
        until(self.manager, "the worker released", move || async move {
            let list = machines
                .list(&ListParams::default().labels(selector))
                .await
                .map_err(|e| e.to_string())?;
            let released: Vec<String> = list
                .iter()
                .filter(|m| has_provider_id(m))
                .map(ResourceExt::name_any)
                .collect();
            match released.as_slice() {
                [one] if list.items.len() == 1 => Ok(one.clone()),
                _ => Err(format!("{released:?} of {} workers", list.items.len())),
            }
        })
        .await;
    }

    /// Built from the class: the topology controller makes the OpenStackCluster, the control
    /// plane and the MachineDeployment; capo-rs provisions them; the control-plane machine
    /// and the worker are released to Cluster API. The control plane's template, first.
    async fn built(&self, repo: &LocalRepository, cloud: BTreeMap<&'static str, String>) -> String {
        self.create(repo, cloud).await;
        let first = self.control_plane_template(None).await;
        assert_eq!(
            self.flavor_of(&first).await,
            json!({"filter": {"name": "m1.small"}})
        );
        self.wait_control_plane(1, &first).await;
        self.wait_worker().await;
        first
    }

    /// A new control-plane flavor rotates the control plane's machine template away from
    /// `first`: the new one's name.
    async fn rotate_flavor(&self, first: &str) -> String {
        self.set_variable("controlPlaneFlavor", json!("m1.medium"))
            .await;
        let second = self.control_plane_template(Some(first)).await;
        assert_eq!(
            self.flavor_of(&second).await,
            json!({"filter": {"name": "m1.medium"}})
        );
        second
    }

    /// The Glance image of every server of the cluster, as Nova reports it.
    async fn server_images(&self, e2e: &E2e) -> Vec<String> {
        let listed = get_json(&e2e.tenant, Service::Compute, "servers/detail").await;
        let servers = listed["servers"].as_array().cloned().unwrap_or_default();
        servers
            .iter()
            .filter(|s| {
                s["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with(&self.cluster))
            })
            .filter_map(|s| s["image"]["id"].as_str().map(str::to_owned))
            .collect()
    }

    /// Deletes the Cluster and waits until it is gone: Cluster API deletes the topology's
    /// objects (the control plane lets go once its machines are gone), capo-rs what it built.
    async fn delete(&self) {
        self.clusters
            .delete(&self.cluster, &DeleteParams::default())
            .await
            .unwrap();
        wait_gone(&self.clusters, &self.cluster, self.manager).await;
        let left = self.control_plane().await;
        assert!(
            left.is_empty(),
            "no control-plane machine is left: {left:?}"
        );
    }
}

/// The kubeadm stand-in, running until the returned token is cancelled.
fn play_kubeadm(
    kube: &KubeWorld,
    cluster: &str,
) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let cancel = CancellationToken::new();
    let task = tokio::spawn(Kubeadm::new(kube, cluster).run(cancel.clone()));
    (cancel, task)
}

#[tokio::test]
async fn cluster_apis_topology_controller_builds_scales_and_rolls_a_cluster_class_cluster_through_capo_rs()
 {
    crate::rollout::init_test_log();
    let Some(peers) = capi_peers() else {
        return;
    };
    if real_kube().is_none() {
        return;
    }
    let kube = KubeWorld::own_real(&kubeadm_crds_as_released(&peers), "cluster-class").await;
    kube.install_ours().await;
    let manager = CapiManager::start(&kube, &peers.release()).await;
    let world = World::prepare_on(kube, Scenario::default()).await;
    let driven = Driven::around(manager, world);
    let (cancel, kubeadm) = play_kubeadm(&driven.world.kube, CLUSTER);
    let repo = LocalRepository::write(&peers);
    let stage = Stage::new(&driven.world.kube, &driven.manager, CLUSTER);
    let cloud = &driven.world.cloud;
    let external = cloud
        .network("public")
        .and_then(|n| n["id"].as_str().map(str::to_owned))
        .expect("the simulated cloud's external network");
    let first = stage
        .built(
            &repo,
            BTreeMap::from([
                ("OPENSTACK_CLOUD", "sim".to_owned()),
                ("OPENSTACK_CLOUD_YAML_B64", base64(&cloud.clouds_yaml())),
                ("OPENSTACK_EXTERNAL_NETWORK_ID", external),
                ("OPENSTACK_IMAGE_NAME", IMAGE.to_owned()),
            ]),
        )
        .await;

    // Scaled: the Cluster's topology asks for three control-plane machines.
    let three = json!({"spec": {"topology": {"controlPlane": {"replicas": 3}}}});
    stage
        .clusters
        .patch(CLUSTER, &PatchParams::default(), &Patch::Merge(&three))
        .await
        .unwrap();
    stage.wait_control_plane(3, &first).await;

    // Rolled, the gate holding: capo-rs holds the first new machine while its member is
    // PENDING_CREATE, so no old machine goes.
    cloud.add_rule(Rule {
        kind: ObjectKind::Member,
        name: "*-control-plane-04".into(),
        effect: Effect::Stuck,
        times: None,
    });
    let second = stage.rotate_flavor(&first).await;
    let infra: Api<OpenStackMachine> = driven.world.kube.api();
    let infra = &infra;
    let held = until(
        &driven.manager,
        "the new machine's member reported pending",
        || async {
            let now = infra
                .get_opt("c1-control-plane-04")
                .await
                .map_err(|e| e.to_string())?
                .ok_or("not made yet")?;
            match member_condition(&now) {
                (status, reason)
                    if status == "False"
                        && [reasons::MEMBERS_PENDING, reasons::MEMBER_STUCK]
                            .contains(&reason.as_str()) =>
                {
                    Ok(now)
                }
                (status, reason) => Err(format!("{status} {reason}")),
            }
        },
    )
    .await;
    assert!(
        held.spec.provider_id.is_none(),
        "no providerID while its member is pending"
    );
    let during = stage.control_plane().await;
    let old = during.values().filter(|(from, ..)| *from == first).count();
    assert_eq!(
        old, 3,
        "every old control-plane machine still serves: {during:?}"
    );
    assert!(
        during.values().all(|(_, _, deleting)| !deleting),
        "none is deleting while the new member is pending: {during:?}"
    );
    cloud.clear_rules();
    stage.wait_control_plane(3, &second).await;

    // Deleted: Cluster API deletes the topology's objects, capo-rs what it built, and the
    // cloud holds what it held before.
    driven.delete_cluster().await;
    cancel.cancel();
    let _ = kubeadm.await;
}

/// ORC v2.4.0's manager, reaching the API server and the real tier's Keystone and Glance (and
/// `also`), in a network namespace of its own.
fn start_orc(kube: &KubeWorld, peers: &CapoPeers, also: u16) -> IsolatedPeer {
    let dir = tempfile::tempdir().unwrap();
    let admin = std::path::PathBuf::from(admin_kubeconfig(kube));
    let port = |var: &str, default: u16| {
        std::env::var(var)
            .ok()
            .and_then(|p| p.parse().ok())
            .unwrap_or(default)
    };
    // The tier's ports, as tests/openstack/lib.sh sets them.
    let keystone = port("CAPO_OPENSTACK_KEYSTONE_PORT", 19500);
    let glance = port("CAPO_OPENSTACK_GLANCE_PORT", 19292);
    let run = PeerRun {
        name: "ORC's manager",
        netns: "capo-orc",
        binary: peers.orc_manager(),
        args: vec![
            "--leader-elect=false".to_owned(),
            "--health-probe-bind-address=0".to_owned(),
            format!("--namespace={}", kube.namespace),
        ],
        reach: vec![api_port(&admin), keystone, glance, also],
        serve: None,
        kubeconfig: admin,
    };
    IsolatedPeer::spawn(run, dir)
}

/// Serves `bytes` to any GET on 127.0.0.1 (a node image's download URL), until aborted.
async fn serve_image(bytes: Vec<u8>) -> (u16, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let bytes = std::sync::Arc::new(bytes);
    let task = tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let bytes = bytes.clone();
            tokio::spawn(async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let mut request = [0u8; 4096];
                let _ = socket.read(&mut request).await;
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    bytes.len()
                );
                let _ = socket.write_all(head.as_bytes()).await;
                let _ = socket.write_all(&bytes).await;
            });
        }
    });
    (port, task)
}

/// `deploy/clusterctl/image-template-node.yaml` as `clusterctl generate yaml` renders it,
/// applied; waits until ORC reports it Available and returns its Glance ID.
async fn orc_image(
    repo: &LocalRepository,
    kube: &KubeWorld,
    orc: &IsolatedPeer,
    given: BTreeMap<&'static str, String>,
    sha256: &str,
) -> String {
    let template = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/deploy/clusterctl/image-template-node.yaml"
    );
    let rendered = repo
        .run(&["generate", "yaml", "--from", template], &given)
        .await;
    let mut image: Value = serde_saphyr::from_str(&rendered)
        .unwrap_or_else(|e| panic!("the image template renders YAML: {e}\n{rendered}"));
    image["metadata"]["namespace"] = json!(kube.namespace);
    // With a hash ORC downloads the bytes itself and uploads them: Glance's own web-download
    // fetches only from ports 80 and 443 (its import filtering's default).
    image["spec"]["resource"]["content"]["download"]["hash"] =
        json!({"algorithm": "sha256", "value": sha256});
    let name = image["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let api = dynamic_api(&kube.client, &image);
    create_or_keep(&api, image).await.unwrap();
    let (api, name) = (&api, &name);
    let logs = || format!("ORC's manager:\n{}", orc.log_tail());
    let every = Duration::from_millis(500);
    crate::go_peer::until("ORC's image Available", WAIT, every, &logs, async || {
        let image = api.get(name).await.map_err(|e| e.to_string())?;
        let available = image.data["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Available" && c["status"] == "True");
        match image.data["status"]["id"].as_str() {
            Some(id) if available => Ok(id.to_owned()),
            _ => Err(format!("{:#}", image.data["status"])),
        }
    })
    .await
}

/// The same on the real OpenStack tier, the machines booting an image ORC uploads (the ORC
/// variant: `image-template-node.yaml` and the class's `imageRef`): built from the class, the
/// control plane rolled to a new flavor, deleted with nothing left in the cloud.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_cluster_apis_topology_controller_builds_and_rolls_a_cluster_class_cluster_through_capo_rs()
 {
    crate::rollout::init_test_log();
    let Some(peers) = capi_peers() else {
        return;
    };
    if real_kube().is_none() {
        return;
    }
    let Some(real) = real_cloud() else {
        return;
    };
    let Some(capo) = capo_peers() else {
        return;
    };
    let _alone = REAL.lock().await;
    fault(&["clear"]).await;
    let mut e2e = E2e::real_on(&real, PASSWORD_CLOUD, Kube::Own("cluster-class-real")).await;
    let crds = [kubeadm_crds_as_released(&peers), orc_crds(&capo)].concat();
    apply_crds(&e2e.kube.client, &crds).await;
    let manager = CapiManager::start(&e2e.kube, &peers.release()).await;
    // A node image of 1 MiB, served to ORC over HTTP on 127.0.0.1.
    let bytes: Vec<u8> = (0..1_048_576u32).map(|i| (i % 251) as u8).collect();
    let sha256 = {
        use sha2::Digest;
        let digest = sha2::Sha256::digest(&bytes);
        digest
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    };
    let (image_port, image_server) = serve_image(bytes).await;
    let orc = start_orc(&e2e.kube, &capo, image_port);
    let before = census(&e2e.tenant).await;
    let cluster = unique_cluster_name("cc");
    let (cancel, kubeadm) = play_kubeadm(&e2e.kube, &cluster);
    let repo = LocalRepository::write(&peers);
    let stage = Stage::new(&e2e.kube, &manager, &cluster);
    let secrets: Api<Secret> = e2e.kube.api();
    let clouds_yaml = secrets.get(SECRET).await.unwrap().data.unwrap_or_default();
    let clouds_yaml = clouds_yaml
        .get("clouds.yaml")
        .expect("the tier's clouds.yaml");
    let images = {
        let image = json!({"apiVersion": "openstack.k-orc.cloud/v1alpha1", "kind": "Image",
                           "metadata": {"namespace": e2e.kube.namespace}});
        dynamic_api(&e2e.kube.client, &image)
    };
    let scenario = async {
        let image_id = orc_image(
            &repo,
            &e2e.kube,
            &orc,
            BTreeMap::from([
                ("ORC_IMAGE_NAME", "node-image".to_owned()),
                ("NODE_IMAGE_NAME", format!("{cluster}-node")),
                ("NODE_IMAGE_DISK_FORMAT", "raw".to_owned()),
                (
                    "NODE_IMAGE_URL",
                    format!("http://127.0.0.1:{image_port}/node.img"),
                ),
                ("OPENSTACK_CLOUD_CONFIG_SECRET", SECRET.to_owned()),
                ("OPENSTACK_CLOUD", e2e.cloud_name.to_owned()),
            ]),
            &sha256,
        )
        .await;
        let first = stage
            .built(
                &repo,
                BTreeMap::from([
                    ("OPENSTACK_CLOUD", e2e.cloud_name.to_owned()),
                    (
                        "OPENSTACK_CLOUD_YAML_B64",
                        base64(&String::from_utf8_lossy(&clouds_yaml.0)),
                    ),
                    (
                        "OPENSTACK_EXTERNAL_NETWORK_ID",
                        e2e.external_network.clone(),
                    ),
                    ("OPENSTACK_IMAGE_REF", "node-image".to_owned()),
                ]),
            )
            .await;
        let booted = stage.server_images(&e2e).await;
        assert!(
            !booted.is_empty() && booted.iter().all(|id| *id == image_id),
            "every server boots ORC's image {image_id}: {booted:?}"
        );
        let second = stage.rotate_flavor(&first).await;
        stage.wait_control_plane(1, &second).await;
        stage.delete().await;
        // ORC deletes the Glance image it made, then lets its Image go.
        images
            .delete("node-image", &DeleteParams::default())
            .await
            .unwrap();
        wait_gone(&images, "node-image", &manager).await;
    };
    tokio::time::timeout(Duration::from_secs(900), scenario)
        .await
        .expect("the scenario finished within 15 minutes");
    cancel.cancel();
    let _ = kubeadm.await;
    image_server.abort();
    drop(orc);
    assert_nothing_left(&e2e, &before).await;
    e2e.stop_manager(true).await;
}
