//! clusterctl v1.14.2 (built by `tests/capi/build.sh`), as a user installs with it, on real
//! API servers: `clusterctl init` of Cluster API's core provider and capo-rs from a local
//! repository; `clusterctl generate cluster` of every flavor in `deploy/clusterctl/`, each
//! object admitted by a dry run; and `clusterctl move` of a provisioned cluster to a second
//! management cluster, where capo-rs takes it over without one cloud write.
//!
//! What the test tier stands in for (`docs/cluster-api-peers.md`):
//! - The core provider's components are composed from Cluster API's module in Go's cache (its
//!   CRDs and webhook configurations, Service references as kustomize leaves them); the release
//!   file is not in the module. Nothing runs the Deployments clusterctl applies (there is no
//!   kubelet): the managers run as processes, and their webhooks are pointed at them by URL
//!   once clusterctl has installed them, where cert-manager's CA injector and a Service would.
//! - cert-manager's CRDs are installed (the tier does that), not cert-manager itself:
//!   `clusterctl init` finds its API and installs nothing of it.
//! - The workload cluster is the first management cluster's API server: the machine's Node is
//!   made there, so that Cluster API sets the nodeRef `clusterctl move` requires.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use capo_api::OpenStackMachine;
use capo_api::common::Initialization;
use capo_sim::openstack::{OpenStackSim, Scenario};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};

use crate::capi_peers::{CapiManager, CapiPeers, Driven, capi_peers, create, wait_object};
use crate::cluster_controller::{settled, wait_cluster_within};
use crate::go_peer::{api_port, yaml_files};
use crate::kube_world::{KubeWorld, apply_crds, dynamic_api, real_kube};
use crate::server_controller::{World, base64};

/// The version capo-rs is published under in the local repository (the workspace's).
const VERSION: &str = concat!("v", env!("CARGO_PKG_VERSION"));
const CONTROL_PLANE: &str = "cluster.x-k8s.io/control-plane";
const MOVE: &str = "clusterctl.cluster.x-k8s.io/move";

/// A clusterctl configuration and local repository: Cluster API v1.14.2's core provider and
/// capo-rs (`deploy/clusterctl/`: components, metadata and the flavors' templates).
struct LocalRepository {
    dir: tempfile::TempDir,
    clusterctl: PathBuf,
}

impl LocalRepository {
    fn write(peers: &CapiPeers) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let core = dir.path().join("cluster-api/v1.14.2");
        let ours = dir.path().join(format!("infrastructure-capo-rs/{VERSION}"));
        std::fs::create_dir_all(&core).unwrap();
        std::fs::create_dir_all(&ours).unwrap();
        std::fs::write(
            core.join("core-components.yaml"),
            core_components(peers.src()),
        )
        .unwrap();
        std::fs::copy(
            peers.src().join("metadata.yaml"),
            core.join("metadata.yaml"),
        )
        .unwrap();
        for file in deploy_clusterctl_files() {
            std::fs::copy(&file, ours.join(file.file_name().unwrap())).unwrap();
        }
        let config = json!({"providers": [
            {"name": "cluster-api", "type": "CoreProvider",
             "url": core.join("core-components.yaml")},
            {"name": "capo-rs", "type": "InfrastructureProvider",
             "url": ours.join("infrastructure-components.yaml")},
        ]});
        std::fs::write(dir.path().join("clusterctl.yaml"), config.to_string()).unwrap();
        LocalRepository {
            dir,
            clusterctl: peers.clusterctl(),
        }
    }

    /// Runs clusterctl with this configuration (and `env`); its standard output, or a panic
    /// with what it said.
    async fn run(&self, args: &[&str], env: &BTreeMap<&str, String>) -> String {
        let config = self.dir.path().join("clusterctl.yaml");
        let output = tokio::process::Command::new(&self.clusterctl)
            .args(args)
            .arg("--config")
            .arg(&config)
            // Its overrides and cache directory; no call to GitHub for a newer version.
            .env("HOME", self.dir.path())
            .env("XDG_CONFIG_HOME", self.dir.path().join(".config"))
            .env("CLUSTERCTL_DISABLE_VERSIONCHECK", "true")
            .envs(env)
            .output()
            .await
            .expect("clusterctl runs");
        let said = String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.success(),
            "clusterctl {}: {}\n{said}\n{}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stdout)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// `clusterctl init` of the core provider and capo-rs (no kubeadm providers: their
    /// managers are not run here) on `kube`'s server; then capo-rs's CRDs and webhook are
    /// pointed at the test's webhook server, as the CA injector would leave them.
    async fn init(&self, kube: &KubeWorld) {
        let kubeconfig = admin_kubeconfig(kube);
        let infrastructure = format!("capo-rs:{VERSION}");
        self.run(
            &[
                "init",
                "--kubeconfig",
                &kubeconfig,
                "--core",
                "cluster-api:v1.14.2",
                "--bootstrap",
                "-",
                "--control-plane",
                "-",
                "--infrastructure",
                &infrastructure,
            ],
            &BTreeMap::new(),
        )
        .await;
        kube.install_ours().await;
    }
}

/// `deploy/clusterctl/`'s files: what a release attaches for clusterctl.
fn deploy_clusterctl_files() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/clusterctl");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
}

/// The flavors `deploy/clusterctl/` ships: `""` for `cluster-template.yaml`, `F` for
/// `cluster-template-F.yaml`.
fn flavors() -> Vec<String> {
    deploy_clusterctl_files()
        .iter()
        .filter_map(|path| path.file_stem()?.to_str()?.strip_prefix("cluster-template"))
        .map(|rest| rest.trim_start_matches('-').to_owned())
        .collect()
}

fn admin_kubeconfig(kube: &KubeWorld) -> String {
    let run = kube.own_tier_dir().expect("a tier of the world's own");
    run.join("admin.kubeconfig").display().to_string()
}

/// Cluster API's core components as its release's `core-components.yaml` carries the parts
/// clusterctl installs and checks: the namespace, the CRDs converting through the webhook
/// Service with cert-manager's injection asked for, and the webhook configurations calling
/// that Service. Documents as JSON (YAML's subset), `---` between them.
fn core_components(src: &Path) -> String {
    let config = src.join("core/config");
    let service = json!({"name": "capi-webhook-service", "namespace": "capi-system"});
    let mut objects = vec![json!({
        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "capi-system"},
    })];
    for mut crd in yaml_files(&config.join("crd/bases")) {
        crd["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] =
            json!("capi-system/capi-serving-cert");
        let mut by_service = service.clone();
        by_service["path"] = json!("/convert");
        crd["spec"]["conversion"] = json!({
            "strategy": "Webhook",
            "webhook": {"conversionReviewVersions": ["v1"],
                        "clientConfig": {"service": by_service}},
        });
        objects.push(crd);
    }
    let text = std::fs::read_to_string(config.join("webhook/manifests.yaml")).unwrap();
    let hooks = serde_saphyr::from_str_multiple::<Value, Vec<Value>>(&text).expect("webhooks");
    for mut hooks in hooks.into_iter().filter(Value::is_object) {
        let name = hooks["metadata"]["name"].as_str().unwrap_or_default();
        hooks["metadata"]["name"] = json!(format!("capi-{name}"));
        for hook in hooks["webhooks"].as_array_mut().into_iter().flatten() {
            let path = hook["clientConfig"]["service"]["path"].clone();
            let mut by_service = service.clone();
            by_service["path"] = path;
            hook["clientConfig"] = json!({"service": by_service});
        }
        objects.push(hooks);
    }
    objects
        .iter()
        .map(Value::to_string)
        .collect::<Vec<_>>()
        .join("\n---\n")
}

/// What the test sets for every variable a flavor asks for: a new variable in a template
/// fails the test until it is given a value here (and a line in `docs/flavors.md`).
fn variables() -> BTreeMap<&'static str, String> {
    let clouds =
        "clouds:\n  openstack:\n    auth:\n      auth_url: https://keystone.example:5000/v3\n";
    BTreeMap::from([
        ("OPENSTACK_CLOUD", "openstack".to_owned()),
        ("OPENSTACK_CLOUD_YAML_B64", base64(clouds)),
        ("OPENSTACK_CLOUD_CACERT_B64", base64("")),
        (
            "OPENSTACK_EXTERNAL_NETWORK_ID",
            "8b2f5c3e-1d4a-4b6f-9e7d-2c1a0f3b5d6e".to_owned(),
        ),
        ("OPENSTACK_DNS_NAMESERVERS", "192.0.2.53".to_owned()),
        ("OPENSTACK_FAILURE_DOMAIN", "nova".to_owned()),
        (
            "OPENSTACK_IMAGE_NAME",
            "ubuntu-2404-kube-v1.35.0".to_owned(),
        ),
        (
            "OPENSTACK_CONTROL_PLANE_MACHINE_FLAVOR",
            "m1.medium".to_owned(),
        ),
        ("OPENSTACK_NODE_MACHINE_FLAVOR", "m1.medium".to_owned()),
        ("OPENSTACK_SSH_KEY_NAME", "capo-rs".to_owned()),
    ])
}

/// `clusterctl generate cluster` renders every flavor; every object it renders is admitted
/// by a dry-run create on `kube`'s server: the OpenStack kinds by capo-rs's CRDs and webhook,
/// Cluster and MachineDeployment by Cluster API's webhooks too, the kubeadm kinds by their
/// CRDs' schemas (their manager's webhooks are not run here).
async fn generate_every_flavor(repo: &LocalRepository, kube: &KubeWorld, peers: &CapiPeers) {
    let kubeadm = kubeadm_crds(peers);
    apply_crds(&kube.client, &kubeadm).await;
    let kubeconfig = admin_kubeconfig(kube);
    let given = variables();
    let flavors = flavors();
    assert!(
        flavors.iter().any(String::is_empty),
        "deploy/clusterctl/ has the default flavor: {flavors:?}"
    );
    for flavor in &flavors {
        let name = format!(
            "generated-{}",
            if flavor.is_empty() { "default" } else { flavor }
        );
        let infrastructure = format!("capo-rs:{VERSION}");
        let mut args = vec![
            "generate",
            "cluster",
            &name,
            "--kubeconfig",
            &kubeconfig,
            "--infrastructure",
            &infrastructure,
            "--target-namespace",
            &kube.namespace,
            "--kubernetes-version",
            "v1.35.0",
            "--control-plane-machine-count",
            "3",
            "--worker-machine-count",
            "1",
        ];
        if !flavor.is_empty() {
            args.extend(["--flavor", flavor]);
        }
        let listed = repo
            .run(
                &[&args[..], &["--list-variables"]].concat(),
                &BTreeMap::new(),
            )
            .await;
        for variable in listed_variables(&listed) {
            assert!(
                given.contains_key(variable.as_str()) || filled_by_clusterctl(&variable),
                "flavor {flavor:?} asks for {variable}, which the test (and the flavors' page) \
                 does not know: {listed}"
            );
        }
        let rendered = repo.run(&args, &given).await;
        let objects: Vec<Value> = serde_saphyr::from_str_multiple(&rendered)
            .unwrap_or_else(|e| panic!("flavor {flavor:?} renders YAML: {e}\n{rendered}"));
        assert!(
            objects.iter().any(|o| o["kind"] == "OpenStackCluster"),
            "flavor {flavor:?} renders an OpenStackCluster"
        );
        for object in objects.iter().filter(|o| o.is_object()) {
            dry_run_create(kube, object)
                .await
                .unwrap_or_else(|e| panic!("flavor {flavor:?}: {e}"));
        }
    }
}

/// The kubeadm bootstrap and control-plane CRDs of Cluster API's module, schemas only.
fn kubeadm_crds(peers: &CapiPeers) -> Vec<Value> {
    [
        "bootstrap/kubeadm/config/crd/bases",
        "controlplane/kubeadm/config/crd/bases",
    ]
    .iter()
    .flat_map(|dir| yaml_files(&peers.src().join(dir)))
    .collect()
}

/// The required variables of `clusterctl generate cluster --list-variables`'s answer (the
/// optional ones have defaults in the template).
fn listed_variables(listed: &str) -> Vec<String> {
    listed
        .lines()
        .skip_while(|line| !line.starts_with("Required Variables:"))
        .skip(1)
        .map_while(|line| line.trim().strip_prefix("- "))
        .map(|name| name.trim().to_owned())
        .collect()
}

/// Variables clusterctl fills from its own flags.
fn filled_by_clusterctl(variable: &str) -> bool {
    matches!(
        variable,
        "CLUSTER_NAME"
            | "NAMESPACE"
            | "KUBERNETES_VERSION"
            | "CONTROL_PLANE_MACHINE_COUNT"
            | "WORKER_MACHINE_COUNT"
    )
}

async fn dry_run_create(kube: &KubeWorld, object: &Value) -> Result<(), String> {
    let api = dynamic_api(&kube.client, object);
    let typed: DynamicObject = serde_json::from_value(object.clone()).map_err(|e| e.to_string())?;
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    api.create(&dry_run, &typed).await.map(|_| ()).map_err(|e| {
        format!(
            "{} {}: {e}",
            object["kind"].as_str().unwrap_or_default(),
            object["metadata"]["name"].as_str().unwrap_or_default()
        )
    })
}

/// Cloud requests that change something, by operation.
fn cloud_writes(cloud: &OpenStackSim) -> BTreeMap<String, u64> {
    let log = cloud.request_log();
    // Operations are `<service> <resource>_<verb>`.
    let write = |operation: &str| {
        !crate::real_provider::is_read(operation.rsplit(' ').next().unwrap_or(operation))
    };
    log["by_operation"]
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(operation, _)| write(operation))
        .filter_map(|(operation, count)| Some((operation.clone(), count.as_u64()?)))
        .collect()
}

#[tokio::test]
async fn clusterctl_installs_capo_rs_generates_every_flavor_and_moves_a_cluster_it_takes_over() {
    crate::rollout::init_test_log();
    let Some(peers) = capi_peers() else {
        return;
    };
    if real_kube().is_none() {
        return;
    }
    let repo = LocalRepository::write(&peers);
    let release = peers.release();
    let namespace = "clusterctl-move";

    // The first management cluster, installed by clusterctl.
    let from = KubeWorld::own_real(&[], namespace).await;
    repo.init(&from).await;
    assert_inventory(&from).await;
    let manager = CapiManager::start(&from, &release).await;
    generate_every_flavor(&repo, &from, &peers).await;
    let source = Driven::around(manager, World::prepare_on(from, Scenario::default()).await);

    // A provisioned cluster: its control-plane machine released, its Node found by Cluster
    // API in the workload cluster (this API server).
    source.provisioned_cluster().await;
    let control_plane = json!({CONTROL_PLANE: ""});
    source
        .machine("m1", control_plane.clone(), control_plane, json!({}))
        .await;
    let released = wait_object(
        &source.machines,
        "m1",
        "took its providerID",
        |m| m["spec"]["providerID"].as_str().is_some(),
        &source.manager,
    )
    .await;
    let provider_id = released["spec"]["providerID"].as_str().unwrap().to_owned();
    workload_node(&source, &provider_id).await;
    wait_movable(&source).await;
    for secret in ["cloud-config", "m1-bootstrap"] {
        label_for_move(&source.world.kube, secret).await;
    }

    // The second management cluster, installed the same way; capo-rs there shares the cloud.
    let to = KubeWorld::own_real(&[], namespace).await;
    repo.init(&to).await;
    let workload_port = api_port(Path::new(&admin_kubeconfig(&source.world.kube)));
    let target_manager = CapiManager::start_reaching(&to, &release, &[workload_port]).await;
    let target_world = source.world.over_the_same_cloud(to);
    let writes_before = cloud_writes(&source.world.cloud);
    assert!(
        writes_before.keys().any(|w| w.ends_with("server_create")),
        "the writes that built the cluster are counted: {writes_before:?}"
    );
    let held_before = source.world.cloud.object_counts();
    let mut target = Driven::around(target_manager, target_world);
    target.before = source.before.clone();

    repo.run(
        &[
            "move",
            "--kubeconfig",
            &admin_kubeconfig(&source.world.kube),
            "--to-kubeconfig",
            &admin_kubeconfig(&target.world.kube),
            "--namespace",
            namespace,
        ],
        &BTreeMap::new(),
    )
    .await;

    // Gone from the first; taken over on the second, status rebuilt from the cloud.
    assert!(
        source.clusters.get_opt("c1").await.unwrap().is_none(),
        "clusterctl move deleted the Cluster it moved"
    );
    wait_cluster_within(
        &target.world,
        "c1",
        "provisioned again on the second management cluster",
        std::time::Duration::from_secs(180),
        settled,
    )
    .await;
    let machines: Api<OpenStackMachine> = target.world.kube.api();
    let taken_over =
        crate::server_controller::eventually("m1 provisioned again after the move", || async {
            let machine = machines.get_opt("m1").await.ok().flatten()?;
            let status = machine.status.as_ref()?;
            let ready = Initialization::is_provisioned(status.initialization.as_ref())
                && status.instance_id.is_some();
            ready.then_some(machine)
        })
        .await;
    assert_eq!(
        taken_over.spec.provider_id.as_deref(),
        Some(provider_id.as_str()),
        "the same server"
    );
    wait_node_ref(&target, "found its Node again").await;
    assert_eq!(
        cloud_writes(&target.world.cloud),
        writes_before,
        "clusterctl move and the takeover wrote nothing to the cloud"
    );
    assert_eq!(target.world.cloud.object_counts(), held_before);

    // And the moved cluster deletes from its new home, the cloud left as it was.
    target.delete_cluster().await;
}

/// Both providers in clusterctl's inventory, and capo-rs's CRDs labelled as clusterctl
/// labels what it installs (`clusterctl move` finds the kinds to move by that label).
async fn assert_inventory(kube: &KubeWorld) {
    let gvk = GroupVersionKind::gvk("clusterctl.cluster.x-k8s.io", "v1alpha3", "Provider");
    let providers: Api<DynamicObject> =
        Api::all_with(kube.client.clone(), &ApiResource::from_gvk(&gvk));
    let listed = providers.list(&ListParams::default()).await.unwrap().items;
    let inventory: Vec<(String, String, String)> = listed
        .iter()
        .map(|p| {
            (
                p.metadata.namespace.clone().unwrap_or_default(),
                p.metadata.name.clone().unwrap_or_default(),
                p.data["version"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    for expected in [
        ("capi-system", "cluster-api", "v1.14.2"),
        ("capo-rs-system", "infrastructure-capo-rs", VERSION),
    ] {
        assert!(
            inventory
                .iter()
                .any(|(ns, name, v)| (ns.as_str(), name.as_str(), v.as_str()) == expected),
            "clusterctl's inventory holds {expected:?}: {inventory:?}"
        );
    }
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        Api::all(kube.client.clone());
    for crd in capo_api::crds::all() {
        let name = crd.metadata.name.unwrap_or_default();
        let labels = crds
            .get(&name)
            .await
            .unwrap()
            .metadata
            .labels
            .unwrap_or_default();
        assert!(
            labels.contains_key("clusterctl.cluster.x-k8s.io")
                && labels.get("cluster.x-k8s.io/provider").map(String::as_str)
                    == Some("infrastructure-capo-rs"),
            "{name} carries clusterctl's labels: {labels:?}"
        );
    }
}

/// The workload cluster's Node for the machine `m1` (on the first management cluster's
/// API server), and the `c1-kubeconfig` Secret Cluster API reaches it with.
async fn workload_node(source: &Driven, provider_id: &str) {
    let kube = &source.world.kube;
    let nodes = dynamic_api(
        &kube.client,
        &json!({"apiVersion": "v1", "kind": "Node", "metadata": {}}),
    );
    create(
        &nodes,
        json!({"apiVersion": "v1", "kind": "Node",
               "metadata": {"name": "m1"}, "spec": {"providerID": provider_id}}),
    )
    .await;
    let kubeconfig = std::fs::read_to_string(admin_kubeconfig(kube)).unwrap();
    let secrets: Api<Secret> = kube.api();
    let secret: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret", "type": "cluster.x-k8s.io/secret",
        "metadata": {"name": "c1-kubeconfig", "namespace": source.ns(),
                     "labels": {"cluster.x-k8s.io/cluster-name": "c1"}},
        "data": {"value": base64(&kubeconfig)},
    }))
    .unwrap();
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
}

/// Until Cluster API has set the machine `m1`'s nodeRef (its Node in the workload cluster).
async fn wait_node_ref(driven: &Driven, what: &str) {
    wait_object(
        &driven.machines,
        "m1",
        what,
        |m| m["status"]["nodeRef"]["name"] == "m1",
        &driven.manager,
    )
    .await;
}

/// Until `clusterctl move` would start: the machine has its nodeRef and the Cluster's
/// control plane reads initialized.
async fn wait_movable(source: &Driven) {
    wait_node_ref(source, "found its Node").await;
    wait_object(
        &source.clusters,
        "c1",
        "read its control plane initialized",
        |c| {
            c["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "ControlPlaneInitialized" && c["status"] == "True")
        },
        &source.manager,
    )
    .await;
}

/// A Secret no owner or name links to the Cluster moves with it by clusterctl's label.
async fn label_for_move(kube: &KubeWorld, name: &str) {
    let secrets: Api<Secret> = kube.api();
    let labelled = json!({"metadata": {"labels": {MOVE: "true"}}});
    secrets
        .patch(name, &PatchParams::default(), &Patch::Merge(&labelled))
        .await
        .unwrap();
}

#[test]
fn listed_variables_reads_clusterctls_answer() {
    let answer = "Required Variables:\n  - CLUSTER_NAME\n  - OPENSTACK_CLOUD\n\nOptional Variables:\n  - CLUSTER_NAME  (defaults to \"x\")\n\n";
    assert_eq!(
        listed_variables(answer),
        ["CLUSTER_NAME", "OPENSTACK_CLOUD"]
    );
    assert!(listed_variables("").is_empty());
}
