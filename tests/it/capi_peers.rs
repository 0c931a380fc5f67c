//! Cluster API's own controllers drive capo-rs: Cluster API v1.14.2's core manager (built by
//! `tests/capi/build.sh` from the Go module proxy), its CRDs and webhook configurations read
//! from Go's module cache, on a real API server of the test's own, with its webhooks served on
//! a certificate the test issues and the CA bundle injected as cert-manager's CA injector
//! would. capo-rs runs as its ServiceAccount on the simulated cloud.
//!
//! The manager's webhook server binds every address (controller-runtime has no host flag), so
//! it runs in a network namespace of its own behind relays on 127.0.0.1
//! (`tests/capi/isolated.sh`).
//!
//! Without the peers (`CAPO_CAPI_BIN`, `CAPO_CAPI_SRC`: `tests/capi/build.sh`'s `env` file)
//! the scenario skips with a notice, unless `CAPO_REQUIRE_CAPI=1` (CI) makes that a failure.

use std::path::{Path, PathBuf};
use std::time::Duration;

use capo_api::conditions::reasons;
use capo_api::{OpenStackCluster, OpenStackMachine, OpenStackMachineTemplate};
use capo_sim::certs::WebhookCerts;
use capo_sim::openstack::{Effect, ObjectKind, Rule, Scenario};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};

use crate::cluster_controller::{cluster_spec, settled, wait_cluster_within};
use crate::go_peer::{IsolatedPeer, PeerRun, api_port, free_port, start_with_retries, yaml_files};
use crate::kube_world::{KubeWorld, apply_crds};
use crate::rollout::member_condition;
use crate::server_controller::World;

/// Cluster API's peers, when built.
pub(crate) struct CapiPeers {
    bin: PathBuf,
    src: PathBuf,
}

pub(crate) fn capi_peers() -> Option<CapiPeers> {
    let found = match (
        std::env::var_os("CAPO_CAPI_BIN"),
        std::env::var_os("CAPO_CAPI_SRC"),
    ) {
        (Some(bin), Some(src)) => Some(CapiPeers {
            bin: bin.into(),
            src: src.into(),
        }),
        _ => None,
    };
    if found.is_none() {
        assert!(
            !std::env::var("CAPO_REQUIRE_CAPI").is_ok_and(|v| v == "1"),
            "CAPO_REQUIRE_CAPI=1 but Cluster API's peers are not built: run tests/capi/build.sh \
             and export its env file"
        );
        eprintln!(
            "skipped: Cluster API's peers are not built (tests/capi/build.sh; export its env file)"
        );
    }
    found
}

impl CapiPeers {
    /// clusterctl v1.14.2.
    pub(crate) fn clusterctl(&self) -> PathBuf {
        self.bin.join("clusterctl")
    }

    /// Cluster API v1.14.2's module in Go's cache.
    pub(crate) fn src(&self) -> &Path {
        &self.src
    }

    /// Cluster API v1.14.2: its manager, and its core's kustomize configuration.
    pub(crate) fn release(&self) -> CapiRelease {
        CapiRelease {
            manager: self.bin.join("capi-manager"),
            config: self.src.join("core/config"),
        }
    }
}

/// A Cluster API release's core manager, and the directory of its kustomize configuration
/// (`crd/bases`, `webhook/manifests.yaml`) in Go's module cache.
#[derive(Clone)]
pub(crate) struct CapiRelease {
    pub(crate) manager: PathBuf,
    pub(crate) config: PathBuf,
}

/// Cluster API's CRDs, each converting through the manager at `base`, trusted by `ca_bundle`.
pub(crate) fn capi_crds(config: &Path, base: &str, ca_bundle: &str) -> Vec<Value> {
    yaml_files(&config.join("crd/bases"))
        .into_iter()
        .map(|mut crd| {
            // What Cluster API's kustomization patches in: conversion through its webhook.
            crd["spec"]["conversion"] = json!({
                "strategy": "Webhook",
                "webhook": {
                    "conversionReviewVersions": ["v1"],
                    "clientConfig": {"url": format!("{base}/convert"), "caBundle": ca_bundle},
                },
            });
            crd
        })
        .collect()
}

/// A release's webhook configurations (`webhook/manifests.yaml` under `config`), calling the
/// manager at `base`, trusted by `ca_bundle`, named `prefix` + their name as the release's
/// kustomize prefix names them.
pub(crate) fn webhook_configurations(
    config: &Path,
    prefix: &str,
    base: &str,
    ca_bundle: &str,
) -> Vec<Value> {
    let path = config.join("webhook/manifests.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    serde_saphyr::from_str_multiple::<Value, Vec<Value>>(&text)
        .expect("webhook manifests")
        .into_iter()
        .filter(|object| object.is_object())
        .map(|mut object| {
            let name = object["metadata"]["name"].as_str().unwrap_or_default();
            object["metadata"]["name"] = json!(format!("{prefix}{name}"));
            for hook in object["webhooks"].as_array_mut().into_iter().flatten() {
                let path = hook["clientConfig"]["service"]["path"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                hook["clientConfig"] =
                    json!({"url": format!("{base}{path}"), "caBundle": ca_bundle});
            }
            object
        })
        .collect()
}

/// Cluster API's core manager, running against the world's own real API server.
pub(crate) struct CapiManager {
    peer: IsolatedPeer,
}

impl CapiManager {
    /// Started, and its webhooks answering.
    pub(crate) async fn start(kube: &KubeWorld, release: &CapiRelease) -> Self {
        Self::start_reaching(kube, release, &[]).await
    }

    /// [`CapiManager::start`], the manager also reaching these ports on 127.0.0.1 (a workload
    /// cluster's API server).
    pub(crate) async fn start_reaching(
        kube: &KubeWorld,
        release: &CapiRelease,
        also: &[u16],
    ) -> Self {
        start_with_retries(async || {
            let mut manager = Self::spawn(kube, release, also).await;
            manager.wait_serving(kube).await.map(|()| manager)
        })
        .await
    }

    /// Cluster API's CRDs and webhooks (calling a port chosen now), and the manager behind
    /// them.
    async fn spawn(kube: &KubeWorld, release: &CapiRelease, also: &[u16]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let certs = WebhookCerts::issue(&["127.0.0.1".to_owned()]).unwrap();
        certs.write(&dir.path().join("certs")).unwrap();
        let outside = free_port();
        let base = format!("https://127.0.0.1:{outside}");
        let mut objects = capi_crds(&release.config, &base, &certs.ca_bundle());
        objects.extend(webhook_configurations(
            &release.config,
            "capi-",
            &base,
            &certs.ca_bundle(),
        ));
        apply_crds(&kube.client, &objects).await;
        let run = kube.own_tier_dir().expect("a tier of the world's own");
        let admin = run.join("admin.kubeconfig");
        let args = vec![
            "--webhook-port=9443".to_owned(),
            "--leader-elect=false".to_owned(),
            "--v=2".to_owned(),
            // The topology controllers and the webhooks' checks of a Cluster's topology, as
            // `CLUSTER_TOPOLOGY=true clusterctl init` turns them on.
            "--feature-gates=ClusterTopology=true".to_owned(),
            format!("--webhook-cert-dir={}", dir.path().join("certs").display()),
        ];
        let peer = IsolatedPeer::spawn(
            PeerRun {
                name: "Cluster API's manager",
                netns: "capo-capi",
                binary: release.manager.clone(),
                args,
                reach: [api_port(&admin)]
                    .into_iter()
                    .chain(also.iter().copied())
                    .collect(),
                serve: Some(outside),
                kubeconfig: admin,
            },
            dir,
        );
        CapiManager { peer }
    }

    /// Until Cluster API's defaulting webhook answers a dry-run create of a Cluster; an error
    /// when the manager ended first.
    async fn wait_serving(&mut self, kube: &KubeWorld) -> Result<(), String> {
        let clusters = capi_api(kube, "Cluster", "clusters");
        let probe = json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
            "metadata": {"name": "probe", "namespace": kube.namespace},
            "spec": {"clusterNetwork": {"pods": {"cidrBlocks": ["192.168.0.0/16"]}},
                     "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io",
                                           "kind": "OpenStackCluster", "name": "probe"}},
        });
        self.peer.wait_admitting(&clusters, probe).await
    }

    pub(crate) fn log_tail(&self) -> String {
        self.peer.log_tail()
    }
}

pub(crate) fn capi_api(kube: &KubeWorld, kind: &str, plural: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", kind);
    let resource = ApiResource::from_gvk_with_plural(&gvk, plural);
    Api::namespaced_with(kube.client.clone(), &kube.namespace, &resource)
}

pub(crate) async fn create(api: &Api<DynamicObject>, object: Value) {
    let object: DynamicObject = serde_json::from_value(object).unwrap();
    api.create(&PostParams::default(), &object)
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", object.metadata.name.unwrap_or_default()));
}

/// How long a scenario waits for any one step.
const STEP: Duration = Duration::from_secs(180);

/// Polls `probe` every 250 ms until it answers `Ok`, for at most [`STEP`].
pub(crate) async fn until<T, F>(manager: &CapiManager, what: &str, probe: impl Fn() -> F) -> T
where
    F: Future<Output = Result<T, String>>,
{
    let logs = || format!("Cluster API's manager:\n{}", manager.log_tail());
    crate::go_peer::until(what, STEP, Duration::from_millis(250), &logs, async || {
        probe().await
    })
    .await
}

/// Waits until the object `name` satisfies `done` (as Cluster API left it), saying `what`.
pub(crate) async fn wait_object(
    api: &Api<DynamicObject>,
    name: &str,
    what: &str,
    done: impl Fn(&Value) -> bool,
    manager: &CapiManager,
) -> Value {
    let done = &done;
    until(manager, &format!("{name} {what}"), move || async move {
        match api.get_opt(name).await {
            Ok(Some(object)) => {
                let object = serde_json::to_value(object).unwrap_or_default();
                if done(&object) {
                    Ok(object)
                } else {
                    Err(format!("{:#}", object["status"]))
                }
            }
            Ok(None) => Err(format!("no {name}")),
            Err(error) => Err(error.to_string()),
        }
    })
    .await
}

/// Cluster API's manager and capo-rs's on a real API server of their own, the simulated cloud
/// beside them; `None` (skipped) without the peers.
pub(crate) struct Driven {
    /// Before `world`: fields drop in order, and Cluster API's manager stops while its API
    /// server (the world's own tier) still answers.
    pub(crate) manager: CapiManager,
    pub(crate) world: World,
    pub(crate) clusters: Api<DynamicObject>,
    pub(crate) machines: Api<DynamicObject>,
    /// What the cloud held before any cluster.
    pub(crate) before: std::collections::BTreeMap<String, usize>,
}

async fn driven(namespace: &str) -> Option<Driven> {
    crate::rollout::init_test_log();
    let peers = capi_peers()?;
    // A tier of the test's own is started from the shared tier's binaries.
    crate::kube_world::real_kube()?;
    let kube = KubeWorld::own_real(&[], namespace).await;
    kube.install_ours().await;
    let manager = CapiManager::start(&kube, &peers.release()).await;
    let world = World::prepare_on(kube, Scenario::default()).await;
    Some(Driven::around(manager, world))
}

impl Driven {
    /// Cluster API's `manager` and capo-rs's, started now, on `world`.
    pub(crate) fn around(manager: CapiManager, mut world: World) -> Self {
        world.start_manager(Default::default());
        let clusters = capi_api(&world.kube, "Cluster", "clusters");
        let machines = capi_api(&world.kube, "Machine", "machines");
        let before = world.cloud.object_counts();
        Driven {
            manager,
            world,
            clusters,
            machines,
            before,
        }
    }

    pub(crate) fn ns(&self) -> String {
        self.world.ns().to_owned()
    }

    /// A Cluster and its OpenStackCluster `c1`, as a user writes them: no owner, no label.
    /// Cluster API's Cluster controller adopts the OpenStackCluster, capo-rs provisions it,
    /// and Cluster API reads that back.
    pub(crate) async fn provisioned_cluster(&self) {
        create(
            &self.clusters,
            json!({
                "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
                "metadata": {"name": "c1", "namespace": self.ns()},
                "spec": {
                    "clusterNetwork": {"pods": {"cidrBlocks": ["192.168.0.0/16"]}},
                    "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io",
                                          "kind": "OpenStackCluster", "name": "c1"},
                },
            }),
        )
        .await;
        let infra: Api<OpenStackCluster> = self.world.kube.api();
        let cluster: OpenStackCluster = serde_json::from_value(json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "OpenStackCluster",
            "metadata": {"name": "c1", "namespace": self.ns()},
            "spec": cluster_spec(),
        }))
        .unwrap();
        infra
            .create(&PostParams::default(), &cluster)
            .await
            .unwrap();
        let provisioned = wait_cluster_within(
            &self.world,
            "c1",
            "provisioned",
            Duration::from_secs(180),
            settled,
        )
        .await;
        let owners = provisioned
            .metadata
            .owner_references
            .clone()
            .unwrap_or_default();
        assert!(
            owners.iter().any(|o| o.kind == "Cluster" && o.name == "c1"),
            "Cluster API's Cluster controller owns the OpenStackCluster: {owners:?}"
        );
        let endpoint = provisioned.spec.control_plane_endpoint.clone().unwrap();
        let capi_cluster = wait_object(
            &self.clusters,
            "c1",
            "saw its infrastructure provisioned",
            |c| c["status"]["initialization"]["infrastructureProvisioned"] == true,
            &self.manager,
        )
        .await;
        assert_eq!(
            capi_cluster["spec"]["controlPlaneEndpoint"]["host"],
            json!(endpoint.host),
            "Cluster API copied the endpoint capo-rs set"
        );
    }

    /// An OpenStackMachine and its Machine `name` in cluster `c1`, both with `labels`, the
    /// Machine with `annotations` and its bootstrap data ready (`<name>-bootstrap`).
    /// A Machine with `labels` and `annotations`, and its OpenStackMachine with
    /// `infra_labels`.
    pub(crate) async fn machine(
        &self,
        name: &str,
        labels: Value,
        infra_labels: Value,
        annotations: Value,
    ) {
        let secret = format!("{name}-bootstrap");
        self.world
            .put_secret(&secret, "value", "#cloud-config\n")
            .await;
        let infra_machines: Api<OpenStackMachine> = self.world.kube.api();
        let machine: OpenStackMachine = serde_json::from_value(json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "OpenStackMachine",
            "metadata": {"name": name, "namespace": self.ns(), "labels": infra_labels},
            "spec": machine_spec(),
        }))
        .unwrap();
        infra_machines
            .create(&PostParams::default(), &machine)
            .await
            .unwrap();
        create(
            &self.machines,
            json!({
                "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
                "metadata": {"name": name, "namespace": self.ns(), "labels": labels,
                             "annotations": annotations},
                "spec": {
                    "clusterName": "c1",
                    "bootstrap": {"dataSecretName": secret},
                    "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io",
                                          "kind": "OpenStackMachine", "name": name},
                },
            }),
        )
        .await;
    }

    pub(crate) fn servers(&self) -> usize {
        self.world
            .cloud
            .object_counts()
            .get("servers")
            .copied()
            .unwrap_or(0)
    }

    /// Deletes the Cluster: Cluster API deletes what it owns, capo-rs what it built, and the
    /// cloud holds what it held before.
    pub(crate) async fn delete_cluster(mut self) {
        self.clusters
            .delete("c1", &DeleteParams::default())
            .await
            .unwrap();
        wait_gone(&self.clusters, "c1", &self.manager).await;
        let infra: Api<OpenStackCluster> = self.world.kube.api();
        assert!(infra.get_opt("c1").await.unwrap().is_none());
        assert_eq!(
            self.world.cloud.object_counts(),
            self.before,
            "nothing leaked"
        );
        self.world.stop_manager().await;
    }
}

#[tokio::test]
async fn cluster_apis_controllers_drive_a_cluster_and_a_machine_through_capo_rs() {
    let Some(driven) = driven("capi-driven").await else {
        return;
    };
    driven.provisioned_cluster().await;

    // A worker Machine with its bootstrap data ready and a pre-terminate hook: Cluster API's
    // Machine controller adopts the OpenStackMachine, capo-rs builds the server, Cluster API
    // takes its providerID.
    driven
        .machine("m1", json!({}), json!({}), json!({HOOK: ""}))
        .await;
    let infra_machines: Api<OpenStackMachine> = driven.world.kube.api();
    let capi_machine = wait_object(
        &driven.machines,
        "m1",
        "took its providerID",
        |m| {
            m["spec"]["providerID"]
                .as_str()
                .is_some_and(|p| p.starts_with("openstack:///"))
        },
        &driven.manager,
    )
    .await;
    let infra_machine = infra_machines.get("m1").await.unwrap();
    assert_eq!(
        capi_machine["spec"]["providerID"].as_str(),
        infra_machine.spec.provider_id.as_deref(),
        "Cluster API copied the providerID capo-rs set"
    );
    assert!(
        infra_machine
            .metadata
            .owner_references
            .unwrap_or_default()
            .iter()
            .any(|o| o.kind == "Machine" && o.name == "m1"),
        "Cluster API's Machine controller owns the OpenStackMachine"
    );
    assert_eq!(driven.servers(), 1);
    // The server's name is the machine's InternalDNS, as CAPO reports it, and Cluster API
    // copies it to the Machine, where a node's CSR approval looks for it.
    wait_object(
        &driven.machines,
        "m1",
        "reads its server's name as InternalDNS",
        |m| {
            m["status"]["addresses"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|a| a["type"] == "InternalDNS" && a["address"] == "m1")
        },
        &driven.manager,
    )
    .await;

    // Deleting the Machine: Cluster API skips the drain (no node) and holds the
    // OpenStackMachine while the pre-terminate hook is there; then capo-rs deletes the server.
    driven
        .machines
        .delete("m1", &DeleteParams::default())
        .await
        .unwrap();
    wait_object(
        &driven.machines,
        "m1",
        "waited for its pre-terminate hook",
        |m| has_reason(m, "WaitingForPreTerminateHook"),
        &driven.manager,
    )
    .await;
    let held = infra_machines.get("m1").await.unwrap();
    assert!(
        held.metadata.deletion_timestamp.is_none(),
        "the OpenStackMachine is not deleted while the hook holds"
    );
    assert_eq!(driven.servers(), 1, "nor is its server");
    let unhooked = json!({"metadata": {"annotations": {HOOK: null}}});
    driven
        .machines
        .patch("m1", &PatchParams::default(), &Patch::Merge(&unhooked))
        .await
        .unwrap();
    wait_gone(&driven.machines, "m1", &driven.manager).await;
    assert_eq!(driven.servers(), 0);
    driven.delete_cluster().await;
}

/// Cluster API's MachineDeployment and MachineSet controllers: two workers cloned from an
/// OpenStackMachineTemplate, scaled down to one, then the deployment deleted.
#[tokio::test]
async fn cluster_apis_machine_deployment_scales_workers_through_capo_rs() {
    let Some(driven) = driven("capi-deployment").await else {
        return;
    };
    driven.provisioned_cluster().await;
    let ns = driven.ns();
    driven
        .world
        .put_secret("workers-bootstrap", "value", "#cloud-config\n")
        .await;
    let templates: Api<OpenStackMachineTemplate> = driven.world.kube.api();
    let template: OpenStackMachineTemplate = serde_json::from_value(json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2",
        "kind": "OpenStackMachineTemplate",
        "metadata": {"name": "workers", "namespace": ns},
        "spec": {"template": {"spec": machine_spec()}},
    }))
    .unwrap();
    templates
        .create(&PostParams::default(), &template)
        .await
        .unwrap();
    let deployments = capi_api(
        &driven.world.kube,
        "MachineDeployment",
        "machinedeployments",
    );
    create(
        &deployments,
        json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineDeployment",
            "metadata": {"name": "workers", "namespace": ns},
            "spec": {
                "clusterName": "c1",
                "replicas": 2,
                "template": {"spec": {
                    "clusterName": "c1",
                    "bootstrap": {"dataSecretName": "workers-bootstrap"},
                    "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io",
                                          "kind": "OpenStackMachineTemplate", "name": "workers"},
                }},
            },
        }),
    )
    .await;
    let released = wait_machines_released(&driven, 2).await;
    assert_eq!(driven.servers(), 2);
    wait_object(
        &deployments,
        "workers",
        "counted two replicas",
        |d| d["status"]["replicas"] == json!(2),
        &driven.manager,
    )
    .await;

    let one = json!({"spec": {"replicas": 1}});
    deployments
        .patch("workers", &PatchParams::default(), &Patch::Merge(&one))
        .await
        .unwrap();
    let left = wait_machines_released(&driven, 1).await;
    assert!(
        released.contains(&left[0]),
        "one of the two stays: {left:?}"
    );
    wait_servers(&driven, 1).await;

    deployments
        .delete("workers", &DeleteParams::default())
        .await
        .unwrap();
    wait_gone(&deployments, "workers", &driven.manager).await;
    wait_machines_released(&driven, 0).await;
    wait_servers(&driven, 0).await;
    driven.delete_cluster().await;
}

/// The gate under Cluster API's Machine controller: a control-plane machine whose member
/// is held PENDING_CREATE keeps its providerID from capo-rs, so Cluster API's Machine reads
/// its infrastructure as not provisioned; once the member is ACTIVE, Cluster API takes it.
#[tokio::test]
async fn cluster_apis_machine_controller_waits_while_capo_rs_holds_a_pending_member() {
    let Some(driven) = driven("capi-gate").await else {
        return;
    };
    driven.provisioned_cluster().await;
    driven.world.cloud.add_rule(Rule {
        kind: ObjectKind::Member,
        name: "*-cp1".into(),
        effect: Effect::Stuck,
        times: None,
    });
    // The control-plane label on the Machine only, as a control plane other than kubeadm's
    // (or a person) may write it: Cluster API copies only the cluster's name to the
    // OpenStackMachine. CAPO tells a control-plane machine by its Machine; so does capo-rs,
    // which copies the label.
    let labels = json!({"cluster.x-k8s.io/cluster-name": "c1",
                        "cluster.x-k8s.io/control-plane": ""});
    driven
        .machine(
            "cp1",
            labels,
            json!({"cluster.x-k8s.io/cluster-name": "c1"}),
            json!({}),
        )
        .await;
    let infra_machines: Api<OpenStackMachine> = driven.world.kube.api();
    // The server is up and its member made, but PENDING_CREATE: capo-rs says so.
    let infra = &infra_machines;
    let held = until(
        &driven.manager,
        "cp1's member reported pending",
        move || async move {
            let now = infra.get("cp1").await.map_err(|e| e.to_string())?;
            let (status, reason) = member_condition(&now);
            let pending =
                [reasons::MEMBERS_PENDING, reasons::MEMBER_STUCK].contains(&reason.as_str());
            if status == "False" && pending {
                Ok(now)
            } else {
                Err(format!("{status} {reason}"))
            }
        },
    )
    .await;
    assert!(
        held.spec.provider_id.is_none(),
        "no providerID from capo-rs"
    );
    assert_eq!(
        held.labels().get("cluster.x-k8s.io/control-plane"),
        Some(&String::new()),
        "the Machine's control-plane label copied"
    );
    let member = driven
        .world
        .cloud
        .member_truth()
        .into_iter()
        .find(|m| m.name.ends_with("-cp1"))
        .expect("cp1's member");
    assert_eq!(member.provisioning_status, "PENDING_CREATE");
    let capi_machine = serde_json::to_value(driven.machines.get("cp1").await.unwrap()).unwrap();
    assert!(
        capi_machine["spec"]["providerID"].is_null(),
        "Cluster API's Machine has no providerID: {capi_machine:#}"
    );
    assert_ne!(
        capi_machine["status"]["initialization"]["infrastructureProvisioned"],
        json!(true),
        "Cluster API reads cp1's infrastructure as not provisioned"
    );
    // The member goes ACTIVE: capo-rs releases the machine, Cluster API takes its providerID.
    driven.world.cloud.clear_rules();
    wait_object(
        &driven.machines,
        "cp1",
        "took its providerID",
        |m| {
            m["spec"]["providerID"].as_str().is_some()
                && m["status"]["initialization"]["infrastructureProvisioned"] == true
        },
        &driven.manager,
    )
    .await;
    // Deleting the only control-plane machine: Cluster API waits on capo-rs's pre-terminate
    // hook, and capo-rs holds it, saying why: its member is the last ACTIVE one.
    driven
        .machines
        .delete("cp1", &DeleteParams::default())
        .await
        .unwrap();
    wait_object(
        &driven.machines,
        "cp1",
        "waited for capo-rs's hook",
        |m| has_reason(m, "WaitingForPreTerminateHook"),
        &driven.manager,
    )
    .await;
    until(
        &driven.manager,
        "cp1 said why it holds",
        move || async move {
            let now = infra.get("cp1").await.map_err(|e| e.to_string())?;
            match member_condition(&now) {
                (_, reason) if reason == reasons::LAST_ACTIVE_MEMBER => Ok(()),
                (status, reason) => Err(format!("{status} {reason}")),
            }
        },
    )
    .await;
    assert!(
        driven
            .world
            .cloud
            .member_truth()
            .iter()
            .any(|m| m.name.ends_with("-cp1") && m.provisioning_status == "ACTIVE"),
        "the API pool keeps its one ACTIVE member"
    );
    // Deleting the cluster lets it go with everything else.
    driven.delete_cluster().await;
}

const HOOK: &str = "pre-terminate.delete.hook.machine.cluster.x-k8s.io/capo-rs-test";

fn machine_spec() -> Value {
    json!({"flavor": {"filter": {"name": "m1.small"}},
           "image": {"filter": {"name": "ubuntu-2404-kube-v1.33.4"}}})
}

fn has_reason(object: &Value, reason: &str) -> bool {
    object["status"]["conditions"]
        .as_array()
        .is_some_and(|conditions| conditions.iter().any(|c| c["reason"] == reason))
}

/// Waits until exactly `count` Machines exist, each with the providerID Cluster API copied
/// from its OpenStackMachine; returns their names.
async fn wait_machines_released(driven: &Driven, count: usize) -> Vec<String> {
    let machines = &driven.machines;
    let what = format!("{count} released machines");
    until(&driven.manager, &what, move || async move {
        let list = machines
            .list(&Default::default())
            .await
            .map_err(|e| e.to_string())?
            .items;
        let released: Vec<String> = list
            .iter()
            .filter(|m| {
                m.metadata.deletion_timestamp.is_none()
                    && m.data["spec"]["providerID"].as_str().is_some()
            })
            .filter_map(|m| m.metadata.name.clone())
            .collect();
        if list.len() == count && released.len() == count {
            Ok(released)
        } else {
            Err(format!("{released:?} of {} machines", list.len()))
        }
    })
    .await
}

/// Waits until the cloud holds `count` servers.
async fn wait_servers(driven: &Driven, count: usize) {
    let what = format!("{count} servers in the cloud");
    until(&driven.manager, &what, || async {
        match driven.servers() {
            held if held == count => Ok(()),
            held => Err(format!("{held} servers")),
        }
    })
    .await;
}

pub(crate) async fn wait_gone(api: &Api<DynamicObject>, name: &str, manager: &CapiManager) {
    until(manager, &format!("{name} deleted"), move || async move {
        match api.get_opt(name).await {
            Ok(None) => Ok(()),
            Ok(Some(object)) => Err(format!("{:#}", object.data["status"])),
            Err(error) => Err(error.to_string()),
        }
    })
    .await;
}
