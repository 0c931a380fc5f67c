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
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};

use crate::book::{book_block, book_command, book_yaml, paste};
use crate::capi_peers::{CapiManager, CapiPeers, Driven, capi_peers, create, wait_object};
use crate::capo_peers::{
    CapoManager, CapoPeers, capo_crds, capo_peers, openstack_cluster_object, openstack_clusters,
};
use crate::cluster_controller::{settled, wait_cluster_within};
use crate::go_peer::{api_port, yaml_files};
use crate::kube_world::{KubeWorld, apply_crds, dynamic_api, real_kube};
use crate::server_controller::{World, base64};

/// The version capo-rs is published under in the local repository (the workspace's).
pub(crate) const VERSION: &str = concat!("v", env!("CARGO_PKG_VERSION"));
const CONTROL_PLANE: &str = "cluster.x-k8s.io/control-plane";
const MOVE: &str = "clusterctl.cluster.x-k8s.io/move";

/// A clusterctl configuration and local repository: Cluster API v1.14.2's core provider and
/// capo-rs (`deploy/clusterctl/`: components, metadata and the flavors' templates).
pub(crate) struct LocalRepository {
    dir: tempfile::TempDir,
    clusterctl: PathBuf,
}

impl LocalRepository {
    pub(crate) fn write(peers: &CapiPeers) -> Self {
        Self::write_with(peers, None)
    }

    /// With CAPO v0.14.7 too, as provider `openstack`, when `capo` is given.
    fn write_with(peers: &CapiPeers, capo: Option<&CapoPeers>) -> Self {
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
        let mut providers = vec![
            json!({"name": "cluster-api", "type": "CoreProvider",
                   "url": core.join("core-components.yaml")}),
            json!({"name": "capo-rs", "type": "InfrastructureProvider",
                   "url": ours.join("infrastructure-components.yaml")}),
        ];
        if let Some(capo) = capo {
            let theirs = dir.path().join("infrastructure-openstack/v0.14.7");
            std::fs::create_dir_all(&theirs).unwrap();
            std::fs::write(
                theirs.join("infrastructure-components.yaml"),
                capo_components(capo),
            )
            .unwrap();
            std::fs::copy(
                capo.capo_src().join("metadata.yaml"),
                theirs.join("metadata.yaml"),
            )
            .unwrap();
            providers.push(
                json!({"name": "openstack", "type": "InfrastructureProvider",
                                  "url": theirs.join("infrastructure-components.yaml")}),
            );
        }
        let config = json!({ "providers": providers });
        std::fs::write(dir.path().join("clusterctl.yaml"), config.to_string()).unwrap();
        LocalRepository {
            dir,
            clusterctl: peers.clusterctl(),
        }
    }

    /// Runs clusterctl with this configuration (and `env`); its standard output, or a panic
    /// with what it said.
    pub(crate) async fn run(&self, args: &[&str], env: &BTreeMap<&str, String>) -> String {
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

    /// `clusterctl init` of the core provider and `infrastructure` (none: the core alone; no
    /// kubeadm providers: their managers are not run here) on `kube`'s server.
    async fn init_providers(&self, kube: &KubeWorld, infrastructure: Option<&str>) {
        let kubeconfig = admin_kubeconfig(kube);
        let mut args: Vec<&str> = vec![
            "init",
            "--kubeconfig",
            &kubeconfig,
            "--core",
            "cluster-api:v1.14.2",
            "--bootstrap",
            "-",
            "--control-plane",
            "-",
        ];
        args.extend(
            infrastructure
                .map(|i| ["--infrastructure", i])
                .into_iter()
                .flatten(),
        );
        self.run(&args, &BTreeMap::new()).await;
    }

    /// `clusterctl init` of the core provider and capo-rs; then capo-rs's CRDs and webhook
    /// are pointed at the test's webhook server, as the CA injector would leave them.
    async fn init(&self, kube: &KubeWorld) {
        let infrastructure = format!("capo-rs:{VERSION}");
        self.init_providers(kube, Some(&infrastructure)).await;
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

pub(crate) fn admin_kubeconfig(kube: &KubeWorld) -> String {
    let run = kube.own_tier_dir().expect("a tier of the world's own");
    run.join("admin.kubeconfig").display().to_string()
}

/// How a provider's release names what its components file holds (its kustomize
/// configuration under `config/` in Go's module cache).
struct Release<'a> {
    config: &'a Path,
    namespace: &'a str,
    /// kustomize's `namePrefix`.
    prefix: &'a str,
    /// The manager's image, as the release names it (clusterctl refuses a name that is not
    /// canonical, such as the source's `controller:latest`).
    image: &'a str,
}

impl Release<'_> {
    /// The release's webhook Service, at `path`.
    fn service(&self, path: Value) -> Value {
        json!({"name": format!("{}webhook-service", self.prefix),
               "namespace": self.namespace, "path": path})
    }

    /// `crd` converting through the webhook Service, cert-manager's injection asked for.
    fn converting(&self, mut crd: Value) -> Value {
        crd["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] =
            json!(format!("{}/{}serving-cert", self.namespace, self.prefix));
        crd["spec"]["conversion"] = json!({
            "strategy": "Webhook",
            "webhook": {"conversionReviewVersions": ["v1"],
                        "clientConfig": {"service": self.service(json!("/convert"))}},
        });
        crd
    }

    /// The manager's Deployment (`manager/manager.yaml`), named as the release names it. No
    /// pod of it runs here (the tier has no kubelet); `kubectl scale` and `rollout restart`
    /// act on it as on a running one.
    fn manager(&self) -> Value {
        let mut manager = yaml_files(&self.config.join("manager"))
            .into_iter()
            .find(|object| object["kind"] == "Deployment")
            .expect("the manager's Deployment");
        manager["metadata"]["name"] = json!(format!("{}controller-manager", self.prefix));
        manager["metadata"]["namespace"] = json!(self.namespace);
        manager["spec"]["template"]["spec"]["serviceAccountName"] =
            json!(format!("{}manager", self.prefix));
        manager["spec"]["template"]["spec"]["containers"][0]["image"] = json!(self.image);
        manager
    }

    /// The components file: the namespace, `objects`, and the webhook configurations calling
    /// the Service. Documents as JSON (YAML's subset), `---` between them.
    fn components(&self, objects: Vec<Value>) -> String {
        let mut all = vec![json!({
            "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.namespace},
        })];
        all.extend(objects);
        let text = std::fs::read_to_string(self.config.join("webhook/manifests.yaml")).unwrap();
        let hooks = serde_saphyr::from_str_multiple::<Value, Vec<Value>>(&text).expect("webhooks");
        for mut hooks in hooks.into_iter().filter(Value::is_object) {
            let name = hooks["metadata"]["name"].as_str().unwrap_or_default();
            hooks["metadata"]["name"] = json!(format!("{}{name}", self.prefix));
            for hook in hooks["webhooks"].as_array_mut().into_iter().flatten() {
                let path = hook["clientConfig"]["service"]["path"].clone();
                hook["clientConfig"] = json!({"service": self.service(path)});
            }
            all.push(hooks);
        }
        all.iter()
            .map(Value::to_string)
            .collect::<Vec<_>>()
            .join("\n---\n")
    }
}

/// Cluster API's core components as its release's `core-components.yaml` carries the parts
/// clusterctl installs and checks: the namespace, the CRDs converting through the webhook
/// Service, the manager's Deployment, and the webhook configurations calling that Service.
fn core_components(src: &Path) -> String {
    let release = Release {
        config: &src.join("core/config"),
        namespace: "capi-system",
        prefix: "capi-",
        image: "registry.k8s.io/cluster-api/cluster-api-controller:v1.14.2",
    };
    let crds = yaml_files(&release.config.join("crd/bases"));
    let mut objects: Vec<Value> = crds
        .into_iter()
        .map(|crd| release.converting(crd))
        .collect();
    objects.push(release.manager());
    release.components(objects)
}

/// CAPO v0.14.7's `infrastructure-components.yaml`, as its release composes `config/default`:
/// its CRDs (the four of kustomize's conversion patches converting through its webhook
/// Service), its manager's Deployment (`${EXP_...:=false}` variables and all), and its
/// validating webhook configuration.
fn capo_components(capo: &CapoPeers) -> String {
    let release = Release {
        config: &capo.capo_src().join("config"),
        namespace: "capo-system",
        prefix: "capo-",
        image: "registry.k8s.io/capi-openstack/capi-openstack-controller:v0.14.7",
    };
    let converted = [
        "openstackclusters.infrastructure.cluster.x-k8s.io",
        "openstackclustertemplates.infrastructure.cluster.x-k8s.io",
        "openstackmachines.infrastructure.cluster.x-k8s.io",
        "openstackmachinetemplates.infrastructure.cluster.x-k8s.io",
    ];
    let mut objects: Vec<Value> = capo_crds(capo)
        .into_iter()
        .map(|mut crd| {
            let name = crd["metadata"]["name"].as_str().unwrap_or_default();
            if converted.contains(&name) {
                crd = release.converting(crd);
            }
            crd
        })
        .collect();
    objects.push(release.manager());
    release.components(objects)
}

/// What the test sets for every variable a flavor asks for: a new variable in a template
/// fails the test until it is given a value here (and a line in `docs/flavors.md`).
pub(crate) fn variables() -> BTreeMap<&'static str, String> {
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
        (
            "OPENSTACK_FLATCAR_IMAGE_NAME",
            "flatcar-stable-kube-v1.35.0".to_owned(),
        ),
        ("FLATCAR_IMAGE_NAME", "flatcar-stable".to_owned()),
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
        // A topology flavor's OpenStackCluster is made by Cluster API from the class's
        // template, which clusterctl adds to what it renders.
        assert!(
            objects
                .iter()
                .any(|o| o["kind"] == "OpenStackCluster" || o["kind"] == "OpenStackClusterTemplate"),
            "flavor {flavor:?} renders an OpenStackCluster or its ClusterClass's template"
        );
        for object in objects.iter().filter(|o| o.is_object()) {
            dry_run_create(kube, object)
                .await
                .unwrap_or_else(|e| panic!("flavor {flavor:?}: {e}"));
        }
    }
}

/// The kubeadm bootstrap and control-plane CRDs of Cluster API's module, schemas only.
pub(crate) fn kubeadm_crds(peers: &CapiPeers) -> Vec<Value> {
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
    let listed = inventory(kube).await;
    for expected in [
        ("capi-system", "cluster-api", "v1.14.2"),
        ("capo-rs-system", "infrastructure-capo-rs", VERSION),
    ] {
        assert!(
            listed
                .iter()
                .any(|(ns, name, v)| (ns.as_str(), name.as_str(), v.as_str()) == expected),
            "clusterctl's inventory holds {expected:?}: {listed:?}"
        );
    }
    let crds: Api<CustomResourceDefinition> = Api::all(kube.client.clone());
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

/// clusterctl's inventory: each Provider record's namespace, name and version, sorted.
async fn inventory(kube: &KubeWorld) -> Vec<(String, String, String)> {
    let gvk = GroupVersionKind::gvk("clusterctl.cluster.x-k8s.io", "v1alpha3", "Provider");
    let providers: Api<DynamicObject> =
        Api::all_with(kube.client.clone(), &ApiResource::from_gvk(&gvk));
    let mut listed: Vec<(String, String, String)> = providers
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|p| {
            (
                p.metadata.namespace.clone().unwrap_or_default(),
                p.metadata.name.clone().unwrap_or_default(),
                p.data["version"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    listed.sort();
    listed
}

fn owned(rows: &[(&str, &str, &str)]) -> Vec<(String, String, String)> {
    rows.iter()
        .map(|(a, b, c)| ((*a).to_owned(), (*b).to_owned(), (*c).to_owned()))
        .collect()
}

/// A clusterctl command of the book, run with the repository's configuration on `kube`.
async fn run_on(repo: &LocalRepository, kube: &KubeWorld, words: Vec<String>) -> String {
    assert_eq!(
        words.first().map(String::as_str),
        Some("clusterctl"),
        "{words:?}"
    );
    let kubeconfig = admin_kubeconfig(kube);
    let mut args: Vec<&str> = words[1..].iter().map(String::as_str).collect();
    args.extend(["--kubeconfig", &kubeconfig]);
    repo.run(&args, &BTreeMap::new()).await
}

/// The PATH a pasted block runs with: clusterctl and the tier's kubectl first.
pub(crate) fn pasting_path(peers: &CapiPeers) -> String {
    format!(
        "{}:{}:{}",
        peers.clusterctl().parent().unwrap().display(),
        kubectl_dir().display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

/// A CAPO v0.14.7 install that clusterctl made (on Cluster API v1.14.2: the guide has the core
/// on the v1beta2 contract first), moved to capo-rs as `docs/migrating-from-capo.md` says, by
/// clusterctl, each command taken from the page and run as typed: CAPO scaled to zero, its
/// webhook configuration deleted, `clusterctl delete` (its Deployment and Provider record
/// gone, its CRDs and objects kept), `clusterctl init` of capo-rs over those CRDs, Cluster
/// API restarted, the certificate read, and storedVersions read until capo-rs has migrated
/// storage. clusterctl's inventory then names capo-rs and not CAPO, so `clusterctl upgrade`
/// cannot bring CAPO back, and the object CAPO admitted reads in both versions.
#[tokio::test]
async fn clusterctl_moves_a_capo_install_to_capo_rs_and_its_inventory_names_capo_rs_alone() {
    crate::rollout::init_test_log();
    let (Some(peers), Some(capo)) = (capi_peers(), capo_peers()) else {
        return;
    };
    if real_kube().is_none() {
        return;
    }
    let repo = LocalRepository::write_with(&peers, Some(&capo));
    let kube = KubeWorld::own_real(&[], "capo-migrated").await;
    let kubeconfig = admin_kubeconfig(&kube);
    repo.init_providers(&kube, Some("openstack:v0.14.7")).await;
    assert_eq!(
        inventory(&kube).await,
        owned(&[
            ("capi-system", "cluster-api", "v1.14.2"),
            ("capo-system", "infrastructure-openstack", "v0.14.7"),
        ])
    );
    // CAPO's manager serves the webhooks clusterctl configured (by URL here, where a Service
    // would route to its pod), and admits an OpenStackCluster, stored as v1beta1.
    let manager = CapoManager::start(&kube, &capo, &[]).await;
    let cluster = openstack_cluster_object(
        &kube.namespace,
        "c1",
        "openstack",
        json!({"filter": {"name": "public"}}),
    );
    create(&openstack_clusters(&kube), cluster).await;
    drop(manager);

    let checkout = Path::new(env!("CARGO_MANIFEST_DIR"));
    let env = [
        ("KUBECONFIG", kubeconfig.clone()),
        ("PATH", pasting_path(&peers)),
    ];
    // Step 2: CAPO stopped, its fail-closed webhook configuration deleted, then clusterctl
    // forgets it.
    let scale = book_block(
        "migrating-from-capo.md",
        "kubectl -n capo-system scale deployment capo-controller-manager --replicas=0",
    );
    paste(&scale, checkout, &env).await;
    let hooks: Api<k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration> =
        Api::all(kube.client.clone());
    let theirs = hooks
        .get("capo-validating-webhook-configuration")
        .await
        .unwrap();
    assert_eq!(
        kube::ResourceExt::labels(&theirs)
            .get("cluster.x-k8s.io/provider")
            .map(String::as_str),
        Some("infrastructure-openstack"),
        "CAPO's webhook configuration is clusterctl's to delete with the provider"
    );
    let listed = paste(
        &book_block(
            "migrating-from-capo.md",
            "kubectl delete validatingwebhookconfiguration capo-validating-webhook-configuration",
        ),
        checkout,
        &env,
    )
    .await;
    assert!(
        listed.contains("capo-validating-webhook-configuration"),
        "{listed}"
    );
    run_on(
        &repo,
        &kube,
        book_command(
            "migrating-from-capo.md",
            "clusterctl delete --infrastructure openstack",
        ),
    )
    .await;
    assert_eq!(
        inventory(&kube).await,
        owned(&[("capi-system", "cluster-api", "v1.14.2")]),
        "clusterctl forgot CAPO"
    );
    assert!(
        hooks
            .get_opt("capo-validating-webhook-configuration")
            .await
            .unwrap()
            .is_none()
    );
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(kube.client.clone(), "capo-system");
    assert!(
        deployments
            .get_opt("capo-controller-manager")
            .await
            .unwrap()
            .is_none(),
        "CAPO's Deployment went"
    );
    assert!(
        openstack_clusters(&kube)
            .get_opt("c1")
            .await
            .unwrap()
            .is_some(),
        "the CRDs and the object CAPO admitted stay"
    );

    // Step 3: capo-rs installed over CAPO's CRDs, with the command both pages give; the CA
    // injector's part done by the test; 3b: Cluster API restarted.
    cert_manager_check_done(&kube).await;
    let words = book_command(
        "migrating-from-capo.md",
        "clusterctl init --infrastructure capo-rs",
    );
    assert_eq!(
        words,
        book_command(
            "installation.md",
            "clusterctl init --infrastructure capo-rs"
        )
    );
    run_on(&repo, &kube, words).await;
    the_crds_are_ours_as_clusterctl_left_them(&kube).await;
    kube.install_ours().await;
    let restart = book_block(
        "migrating-from-capo.md",
        "kubectl -n capi-system rollout restart deployment capi-controller-manager",
    );
    paste(&restart, checkout, &env).await;
    let capi: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(kube.client.clone(), "capi-system");
    let restarted = capi.get("capi-controller-manager").await.unwrap();
    assert!(
        restarted
            .spec
            .and_then(|s| s.template.metadata)
            .and_then(|m| m.annotations)
            .is_some_and(|a| a.contains_key("kubectl.kubernetes.io/restartedAt")),
        "Cluster API's Deployment restarted"
    );
    assert_eq!(
        inventory(&kube).await,
        owned(&[
            ("capi-system", "cluster-api", "v1.14.2"),
            ("capo-rs-system", "infrastructure-capo-rs", VERSION),
        ]),
        "clusterctl's inventory names capo-rs, and not CAPO"
    );
    assert_inventory(&kube).await;
    the_crds_keep_capos_contract_label_beside_ours(&kube).await;

    // Step 4: the certificate (cert-manager would issue it); steps 5-6: capo-rs migrates
    // storage, which storedVersions shows.
    let certificate = book_block(
        "migrating-from-capo.md",
        "kubectl -n capo-rs-system get certificate capo-rs-serving-cert",
    );
    paste(&certificate, checkout, &env).await;
    let mut world = World::prepare_on(kube, Scenario::default()).await;
    world.start_manager(capo_provider::manager::WatchScope::default());
    let stored = book_block(
        "migrating-from-capo.md",
        "for kind in openstackclusters openstackclustertemplates openstackmachines openstackmachinetemplates; do",
    );
    crate::server_controller::eventually(
        "storedVersions [\"v1beta2\"] for the four kinds",
        || async {
            let printed = paste(&stored, checkout, &env).await;
            (printed.lines().filter(|l| *l == r#"["v1beta2"]"#).count() == 4).then_some(())
        },
    )
    .await;
    for (version, enabled) in [
        ("v1beta1", "/spec/apiServerLoadBalancer/enabled"),
        ("v1beta2", "/spec/apiServer/managedLoadBalancer/enabled"),
    ] {
        let api = crate::capo_peers::api(
            &world.kube,
            "infrastructure.cluster.x-k8s.io",
            version,
            "OpenStackCluster",
            "openstackclusters",
        );
        let read = api.get("c1").await.unwrap();
        assert_eq!(
            read.data.pointer(enabled),
            Some(&json!(true)),
            "c1 read as {version}: {:#}",
            read.data
        );
    }
    let plan = run_on(
        &repo,
        &world.kube,
        book_command("migrating-from-capo.md", "clusterctl upgrade plan"),
    )
    .await;
    assert!(
        plan.contains("capo-rs") && !plan.contains("openstack"),
        "clusterctl upgrade plan sees capo-rs alone:\n{plan}"
    );
    world.stop_manager().await;
}

/// What `clusterctl init` made of CAPO's CRDs, before the test points them at its webhook:
/// capo-rs's versions, v1beta2 stored and v1beta1 still served.
async fn the_crds_are_ours_as_clusterctl_left_them(kube: &KubeWorld) {
    let crds: Api<CustomResourceDefinition> = Api::all(kube.client.clone());
    let crd = crds
        .get("openstackclusters.infrastructure.cluster.x-k8s.io")
        .await
        .unwrap();
    let versions: Vec<(String, bool, bool)> = crd
        .spec
        .versions
        .iter()
        .map(|v| (v.name.clone(), v.served, v.storage))
        .collect();
    assert_eq!(
        versions,
        [
            ("v1beta1".to_owned(), true, false),
            ("v1beta2".to_owned(), true, true)
        ],
        "clusterctl replaced CAPO's CRD in place"
    );
}

/// clusterctl merges labels: CAPO's contract label stays on the CRDs beside ours (the guide
/// says so, and why Cluster API reads ours).
async fn the_crds_keep_capos_contract_label_beside_ours(kube: &KubeWorld) {
    let crds: Api<CustomResourceDefinition> = Api::all(kube.client.clone());
    let labels = crds
        .get("openstackclusters.infrastructure.cluster.x-k8s.io")
        .await
        .unwrap()
        .metadata
        .labels
        .unwrap_or_default();
    assert_eq!(
        (
            labels.get("cluster.x-k8s.io/v1beta1").map(String::as_str),
            labels.get("cluster.x-k8s.io/v1beta2").map(String::as_str)
        ),
        (Some("v1beta1"), Some("v1beta2")),
    );
}

/// `docs/installation.md`'s clusterctl steps, pasted as a user pastes them (bash, in the
/// checkout, a home directory of their own), on a management cluster where Cluster API
/// v1.14.2 is installed: the local repository, the configuration, `clusterctl init
/// --infrastructure capo-rs` with the variables set. clusterctl's inventory names capo-rs, and
/// its Deployment runs the image and the setting the page exported.
///
/// Without the internet, the home's clusterctl.yaml exists before the block runs: it names a
/// local repository for Cluster API (a user's clusterctl reads GitHub's releases), and the
/// page's capo-rs entry is merged into it, as the page says to do with an existing file.
#[tokio::test]
async fn the_installation_pages_clusterctl_steps_install_capo_rs_as_pasted() {
    crate::rollout::init_test_log();
    let Some(peers) = capi_peers() else {
        return;
    };
    if real_kube().is_none() {
        return;
    }
    let repo = LocalRepository::write(&peers);
    let kube = KubeWorld::own_real(&[], "pasted").await;
    let kubeconfig = admin_kubeconfig(&kube);
    repo.init_providers(&kube, None).await;
    cert_manager_check_done(&kube).await;

    // The user's clusterctl.yaml exists: without the internet, it names a local repository
    // for Cluster API's core provider (clusterctl asks GitHub for its releases otherwise). So
    // the page's entry is merged into its providers list by hand, as the page says.
    let home = tempfile::tempdir().unwrap();
    let config = home.path().join(".config/cluster-api");
    std::fs::create_dir_all(&config).unwrap();
    let core = repo
        .dir
        .path()
        .join("cluster-api/v1.14.2/core-components.yaml");
    let entry = book_yaml("installation.md", "- name: capo-rs");
    let entry = entry[entry.find("- name:").expect("the entry")..]
        .replace("/home/you", &home.path().display().to_string());
    std::fs::write(
        config.join("clusterctl.yaml"),
        format!(
            "providers:\n- name: cluster-api\n  type: CoreProvider\n  url: {}\n{entry}",
            core.display()
        ),
    )
    .unwrap();
    let block = book_block(
        "installation.md",
        "clusterctl init --infrastructure capo-rs",
    );
    let env = [
        ("HOME", home.path().display().to_string()),
        // Where clusterctl looks when it is unset, as on a user's machine.
        (
            "XDG_CONFIG_HOME",
            home.path().join(".config").display().to_string(),
        ),
        ("CLUSTERCTL_DISABLE_VERSIONCHECK", "true".to_owned()),
        ("KUBECONFIG", kubeconfig.clone()),
        ("PATH", pasting_path(&peers)),
    ];
    paste(&block, Path::new(env!("CARGO_MANIFEST_DIR")), &env).await;
    assert_eq!(
        inventory(&kube).await,
        owned(&[
            ("capi-system", "cluster-api", "v1.14.2"),
            ("capo-rs-system", "infrastructure-capo-rs", VERSION),
        ])
    );
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(kube.client.clone(), "capo-rs-system");
    let manager = deployments.get("capo-rs-controller-manager").await.unwrap();
    let container = manager
        .spec
        .and_then(|s| s.template.spec)
        .and_then(|s| s.containers.into_iter().next())
        .expect("the manager's container");
    assert_eq!(
        container.image.as_deref(),
        Some("registry.example.com/capo-rs:0.1.0"),
        "CAPO_RS_IMAGE as the page exported it"
    );
    assert!(
        container
            .args
            .unwrap_or_default()
            .contains(&"--member-stuck-after=300".to_owned()),
        "CAPO_RS_MEMBER_STUCK_AFTER as the page exported it"
    );

    // The flavors page next: its templates published beside the components (from the
    // repository's root, as its paths say), then its `generate` with the page's variables, in
    // the user's own directory.
    let publish = book_block(
        "flavors.md",
        "cp deploy/clusterctl/cluster-template*.yaml deploy/clusterctl/clusterclass-*.yaml ~/capo-rs-repo/infrastructure-capo-rs/v0.1.0/",
    );
    paste(&publish, Path::new(env!("CARGO_MANIFEST_DIR")), &env).await;
    let generate = book_block(
        "flavors.md",
        "clusterctl generate cluster capo-rs-first --infrastructure capo-rs --flavor without-lb --kubernetes-version v1.33.4 --worker-machine-count 1 --target-namespace capo-rs-first > capo-rs-first.yaml",
    );
    let exported: Vec<(&str, String)> = variables().into_iter().collect();
    paste(&generate, home.path(), &[&env[..], &exported[..]].concat()).await;
    let manifest = std::fs::read_to_string(home.path().join("capo-rs-first.yaml"))
        .expect("the flavors page's generate wrote capo-rs-first.yaml");
    let objects: Vec<Value> = serde_saphyr::from_str_multiple(&manifest)
        .unwrap_or_else(|e| panic!("the without-lb flavor renders YAML: {e}\n{manifest}"));
    let cluster = objects
        .iter()
        .find(|o| o["kind"] == "OpenStackCluster")
        .expect("an OpenStackCluster");
    assert_eq!(
        (
            cluster["metadata"]["namespace"].as_str(),
            &cluster["spec"]["apiServer"]["managedLoadBalancer"]["enabled"]
        ),
        (Some("capo-rs-first"), &json!(false)),
        "the without-lb flavor, in the page's namespace: {cluster:#}"
    );
}

/// Until the namespace clusterctl's cert-manager check made (and deleted) is gone: the next
/// `clusterctl init` creates its test objects there again, which a namespace still
/// terminating refuses, and clusterctl then takes cert-manager for absent and downloads it.
async fn cert_manager_check_done(kube: &KubeWorld) {
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(kube.client.clone());
    crate::server_controller::eventually("cert-manager-test gone", || async {
        namespaces
            .get_opt("cert-manager-test")
            .await
            .ok()
            .and_then(|found| found.is_none().then_some(()))
    })
    .await;
}

/// The directory of the real tier's kubectl.
fn kubectl_dir() -> PathBuf {
    std::env::var_os("CAPO_REAL_KUBE_BIN")
        .map(PathBuf::from)
        .expect("CAPO_REAL_KUBE_BIN (tests/kube/up.sh prints it)")
}
