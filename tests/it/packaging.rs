//! capo-rs as a user installs and runs it: the manifests (current, rendered by kustomize,
//! applied to the simulated API server), and `capo-rs run` as a process: the admin server,
//! missing CRDs, two replicas under leader election, SIGTERM in a burst of reconciles.
//! Every wait is for something the process logs or writes, bounded by a timeout.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use capo_api::OpenStackServer;
use capo_provider::manager::manifests::{self, LEASE_RULES};
use capo_sim::kube::server::RequestRecord;
use capo_sim::openstack::Scenario;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::server_controller::{
    NAMESPACE, World, eventually, is_ready, minimal_capi_crds, server_manifest,
};

const CAPO_RS: &str = env!("CARGO_BIN_EXE_capo-rs");
const LONG: Duration = Duration::from_secs(60);

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn kubectl() -> Option<PathBuf> {
    let path = std::env::var_os("KUBECTL")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/kubectl"));
    if path.exists() {
        return Some(path);
    }
    eprintln!(
        "NOTICE: {} not found; skipping what needs kubectl",
        path.display()
    );
    None
}

fn crds_yaml() -> String {
    capo_api::crds::to_multi_yaml(&capo_api::crds::all()).unwrap()
}

#[test]
fn the_checked_in_manifests_are_what_capo_rs_manifests_writes() {
    for (path, text) in manifests::files(&crds_yaml()) {
        let on_disk = std::fs::read_to_string(repo().join("deploy").join(&path))
            .unwrap_or_else(|e| panic!("deploy/{path}: {e}"));
        assert!(
            on_disk == text,
            "deploy/{path} is stale: run `cargo run -- manifests --out deploy`"
        );
    }
}

/// The allocator settings the Dockerfile's runtime stage sets (`ENV GLIBC_TUNABLES=...`).
fn tunables_in(text: &str, prefix: &str) -> Option<String> {
    text.lines()
        .filter_map(|line| line.trim().strip_prefix(prefix))
        .map(|rest| {
            rest.split_whitespace()
                .next()
                .unwrap_or_default()
                .to_owned()
        })
        .next()
}

/// The `RUSTFLAGS="..."` a build script line sets.
fn rustflags_in(text: &str) -> Option<&str> {
    let (_, rest) = text.split_once("RUSTFLAGS=\"")?;
    rest.split_once('"').map(|(flags, _)| flags)
}

#[test]
fn the_binary_ci_checks_is_built_as_the_dockerfile_builds_it() {
    let read = |path: &str| std::fs::read_to_string(repo().join(path)).unwrap();
    let dockerfile = read("Dockerfile");
    let ci = read(".ci/image");
    let flags = rustflags_in(&dockerfile).expect("the Dockerfile sets RUSTFLAGS");
    assert_eq!(Some(flags), rustflags_in(&ci), ".ci/image's RUSTFLAGS");
    // Static, and not position-independent: a static PIE keeps its relocated tables resident.
    assert!(flags.contains("+crt-static"), "{flags}");
    assert!(flags.contains("relocation-model=static"), "{flags}");
    let build = "cargo build --profile image --locked --no-default-features -p capo-rs";
    assert!(dockerfile.contains(build));
    assert!(ci.contains(&build.replace("cargo build", "cargo build --quiet")));
}

#[test]
fn the_image_ci_assembles_has_the_dockerfiles_allocator_settings() {
    let read = |path: &str| std::fs::read_to_string(repo().join(path)).unwrap();
    let dockerfile = tunables_in(&read("Dockerfile"), "ENV GLIBC_TUNABLES=")
        .expect("the Dockerfile sets GLIBC_TUNABLES");
    let ci = tunables_in(&read(".ci/image"), "--env GLIBC_TUNABLES=")
        .expect(".ci/image sets GLIBC_TUNABLES");
    assert_eq!(dockerfile, ci);
    assert!(
        dockerfile.contains("glibc.malloc.arena_max=2"),
        "{dockerfile}"
    );
    let book = read("docs/installation.md");
    assert!(
        book.contains(&dockerfile),
        "docs/installation.md names the settings"
    );
    // The binary sets the same itself where the environment does not.
    assert_eq!(
        dockerfile,
        capo_provider::manager::allocator::TUNABLES,
        "the binary's own allocator settings"
    );
}

/// clusterctl's `${VAR:=default}` replaced by its default, as `clusterctl init` does with
/// nothing set.
fn with_defaults(text: &str) -> String {
    let variable = regex::Regex::new(r"\$\{[A-Z0-9_]+:=([^}]*)\}").unwrap();
    variable.replace_all(text, "$1").into_owned()
}

/// Whole floats as integers: kustomize writes our CRDs' `minimum: 0.0` as `0` (the same
/// number to the API server).
fn whole_numbers(value: &mut Value) {
    match value {
        Value::Number(n) if n.is_f64() => {
            if let Some(f) = n.as_f64().filter(|f| f.fract() == 0.0 && f.abs() < 9.0e15) {
                *value = json!(f as i64);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(whole_numbers),
        Value::Object(map) => map.values_mut().for_each(whole_numbers),
        _ => {}
    }
}

fn documents(text: &str) -> BTreeMap<String, Value> {
    crate::common::yaml_documents(text)
        .into_iter()
        .map(|mut object| {
            whole_numbers(&mut object);
            let key = format!(
                "{}/{}",
                object["kind"].as_str().unwrap_or_default(),
                object["metadata"]["name"].as_str().unwrap_or_default()
            );
            (key, object)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_manifests_render_with_kustomize_and_apply_to_the_api_server() {
    let components =
        std::fs::read_to_string(repo().join("deploy/clusterctl/infrastructure-components.yaml"))
            .unwrap();
    let components = with_defaults(&components);
    assert!(!components.contains("${"), "every variable has a default");
    let wanted = documents(&components);
    // 7 CRDs; Namespace, 6 RBAC objects (the metrics reader's ClusterRole among them),
    // Issuer, Certificate, Deployment, 2 Services, ValidatingWebhookConfiguration, PDB,
    // NetworkPolicy.
    assert_eq!(wanted.len(), 22, "{:?}", wanted.keys());
    for crd in wanted
        .values()
        .filter(|o| o["kind"] == "CustomResourceDefinition")
    {
        let label = &crd["metadata"]["labels"][capo_api::crds::CONTRACT_LABEL];
        // CAPO's v1beta1, served beside v1beta2 for conversion, is not a v1beta2-contract
        // version.
        let versions: Vec<&str> = crd["spec"]["versions"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|v| v["name"].as_str())
            .filter(|name| *name != capo_api::conversion::SPOKE)
            .collect();
        assert_eq!(
            label,
            &json!(versions.join("_")),
            "{}",
            crd["metadata"]["name"]
        );
    }
    let server =
        &wanted["CustomResourceDefinition/openstackservers.infrastructure.cluster.x-k8s.io"];
    assert_eq!(
        server["metadata"]["labels"]["cluster.x-k8s.io/v1beta2"],
        "v1alpha1"
    );

    let kube = capo_sim::kube::KubeSim::start(Default::default())
        .await
        .unwrap();
    // cert-manager installed first, as for every Cluster API provider.
    kube.install(&cert_manager_crds()).unwrap();
    let Some(kubectl) = kubectl() else {
        // Without kubectl: the same objects, created as a client would.
        let objects: Vec<Value> = wanted.into_values().collect();
        let (crds, rest): (Vec<Value>, Vec<Value>) = objects
            .into_iter()
            .partition(|o| o["kind"] == "CustomResourceDefinition");
        kube.install(&crds).unwrap();
        kube.install(&rest).unwrap();
        return;
    };
    let rendered = std::process::Command::new(&kubectl)
        .args(["kustomize"])
        .arg(repo().join("deploy"))
        .output()
        .unwrap();
    assert!(
        rendered.status.success(),
        "{}",
        String::from_utf8_lossy(&rendered.stderr)
    );
    let rendered_text = String::from_utf8(rendered.stdout).unwrap();
    let rendered = documents(&rendered_text);
    assert_eq!(
        rendered.keys().collect::<Vec<_>>(),
        wanted.keys().collect::<Vec<_>>()
    );
    for (key, object) in &rendered {
        assert!(
            object == &wanted[key],
            "kustomize's render and clusterctl's components (at their defaults) differ in \
             {key}:\n{object:#}\n{:#}",
            wanted[key]
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, kube.kubeconfig()).unwrap();
    let manifest = dir.path().join("rendered.yaml");
    std::fs::write(&manifest, &rendered_text).unwrap();
    // kubectl blocks; the simulated API server answers on the runtime meanwhile.
    let applied = tokio::task::spawn_blocking(move || {
        std::process::Command::new(&kubectl)
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(["apply", "--server-side", "-f"])
            .arg(&manifest)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        applied.status.success(),
        "{}{}",
        String::from_utf8_lossy(&applied.stdout),
        String::from_utf8_lossy(&applied.stderr)
    );
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(kube.client().unwrap(), manifests::NAMESPACE);
    assert!(
        deployments
            .get_opt(manifests::DEPLOYMENT)
            .await
            .unwrap()
            .is_some()
    );
}

/// (verb, group, resource) a set of rules grants.
fn granted() -> BTreeSet<(String, String, String)> {
    manifests::cluster_wide_rules()
        .chain(LEASE_RULES)
        .flat_map(|rule| {
            rule.resources.iter().flat_map(move |resource| {
                rule.verbs.iter().map(move |verb| {
                    (
                        (*verb).to_owned(),
                        rule.group.to_owned(),
                        (*resource).to_owned(),
                    )
                })
            })
        })
        .collect()
}

/// (verb, group, resource) capo-rs's own client sent (its User-Agent), whatever the answer.
fn used_by_capo_rs(log: &[RequestRecord]) -> BTreeSet<(String, String, String)> {
    log.iter()
        .filter(|r| r.user_agent.starts_with("capo-rs/"))
        .map(|r| (r.verb.clone(), r.group.clone(), r.resource.clone()))
        .collect()
}

/// Grants only the storage migration uses (a CRD that still lists v1beta1 in
/// storedVersions, after CAPO 0.14): the takeover scenario shows each used.
pub(crate) fn used_by_the_storage_migration() -> BTreeSet<(String, String, String)> {
    [
        ("list", "openstackclustertemplates"),
        ("list", "openstackmachinetemplates"),
        ("patch", "openstackclustertemplates"),
        ("patch", "openstackmachinetemplates"),
    ]
    .into_iter()
    .map(|(v, r)| {
        (
            v.to_owned(),
            "infrastructure.cluster.x-k8s.io".to_owned(),
            r.to_owned(),
        )
    })
    .chain(
        [
            "customresourcedefinitions/status",
            "customresourcedefinitions",
        ]
        .map(|resource| {
            (
                "patch".to_owned(),
                "apiextensions.k8s.io".to_owned(),
                resource.to_owned(),
            )
        }),
    )
    .collect()
}

/// Grants the demo's story does not reach, and the test that shows capo-rs using each (a
/// ClusterIdentity and its namespace selector).
fn used_elsewhere() -> BTreeSet<(String, String, String)> {
    [
        (
            "get",
            "infrastructure.cluster.x-k8s.io",
            "openstackclusteridentities",
        ),
        ("get", "", "namespaces"),
    ]
    .into_iter()
    .map(|(v, g, r)| (v.to_owned(), g.to_owned(), r.to_owned()))
    .collect()
}

/// A shard adds up the budget shares on the Leases beside its own (shown used by
/// `shards_hold_their_own_leases_and_their_shares_cannot_exceed_the_budget`; the demo runs no
/// shards).
pub(crate) fn used_by_shards() -> BTreeSet<(String, String, String)> {
    BTreeSet::from([("list".into(), "coordination.k8s.io".into(), "leases".into())])
}

/// Grants for what the demo has none of: an ORC Image a server names (shown used by the ORC
/// scenario) and a machine template's status (by the scale-from-zero scenario).
pub(crate) fn used_by_orc_and_templates() -> BTreeSet<(String, String, String)> {
    [
        ("get", "openstack.k-orc.cloud", "images"),
        ("watch", "openstack.k-orc.cloud", "images"),
        (
            "patch",
            "infrastructure.cluster.x-k8s.io",
            "openstackmachinetemplates/status",
        ),
    ]
    .into_iter()
    .map(|(v, g, r)| (v.to_owned(), g.to_owned(), r.to_owned()))
    .collect()
}

/// Who may read `/metrics`, asked of the API server only when something scrapes it (shown
/// used, with the RBAC `deploy/` ships, by `real_kube_metrics_are_served_over_https_to_a_reader_only`).
fn used_by_the_metrics_server() -> BTreeSet<(String, String, String)> {
    [
        ("authentication.k8s.io", "tokenreviews"),
        ("authorization.k8s.io", "subjectaccessreviews"),
    ]
    .into_iter()
    .map(|(g, r)| ("create".to_owned(), g.to_owned(), r.to_owned()))
    .collect()
}

/// Grants for floating IP pools and Cluster API's IPAM kinds, which the demo has none of:
/// the pool scenarios show each used (`floating_ip_pools`).
pub(crate) fn used_by_floating_ip_pools() -> BTreeSet<(String, String, String)> {
    granted()
        .into_iter()
        .filter(|(_, group, resource)| {
            group == "ipam.cluster.x-k8s.io" || resource.starts_with("openstackfloatingippools")
        })
        .collect()
}

/// The RBAC check: everything capo-rs did is granted; everything granted was done (here, or
/// in the test [`used_elsewhere`] names).
pub(crate) fn assert_least_privilege(log: &[RequestRecord]) {
    let used = used_by_capo_rs(log);
    let granted = granted();
    let refused: Vec<_> = used.difference(&granted).collect();
    assert!(
        refused.is_empty(),
        "capo-rs needs, and the ClusterRole lacks: {refused:?}"
    );
    let mut elsewhere = used_elsewhere();
    elsewhere.extend(used_by_the_storage_migration());
    elsewhere.extend(used_by_orc_and_templates());
    elsewhere.extend(used_by_floating_ip_pools());
    elsewhere.extend(used_by_shards());
    elsewhere.extend(used_by_the_metrics_server());
    let idle: Vec<_> = granted
        .difference(&used)
        .filter(|grant| !elsewhere.contains(*grant))
        .collect();
    assert!(idle.is_empty(), "granted but never used: {idle:?}");
}

/// A `capo-rs run` process and its JSON log lines.
pub(crate) struct Replica {
    child: Child,
    lines: Arc<Mutex<Vec<Value>>>,
    /// Reads the replica's log lines until its stderr closes.
    reader: Option<tokio::task::JoinHandle<()>>,
    identity_base: String,
}

impl Replica {
    pub(crate) fn spawn(kubeconfig: &Path, instance: &str, extra: &[&str]) -> Replica {
        let mut child = Command::new(CAPO_RS)
            .args(["run", "--kubeconfig"])
            .arg(kubeconfig)
            .args(["--instance", instance, "--admin-address", "127.0.0.1:0"])
            .args(["--log-format", "json", "--log-level", "info"])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        let stderr = child.stderr.take().unwrap();
        let reader = tokio::spawn(async move {
            let mut reader = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                let value =
                    serde_json::from_str(&line).unwrap_or_else(|_| json!({"message": line}));
                sink.lock().unwrap().push(value);
            }
        });
        Replica {
            child,
            lines,
            reader: Some(reader),
            identity_base: instance.to_owned(),
        }
    }

    fn logged(&self, message: &str) -> Option<Value> {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .find(|line| {
                line["message"]
                    .as_str()
                    .is_some_and(|m| m.contains(message))
            })
            .cloned()
    }

    async fn wait_log(&self, message: &str) -> Value {
        let found = tokio::time::timeout(LONG, async {
            loop {
                if let Some(line) = self.logged(message) {
                    return line;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        found.unwrap_or_else(|_| {
            panic!(
                "{} never logged {message:?}: {}",
                self.identity_base,
                self.log_text()
            )
        })
    }

    pub(crate) fn log_text(&self) -> String {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .map(Value::to_string)
            .collect::<Vec<_>>()
            .join("\n")
    }

    async fn admin(&self) -> SocketAddr {
        let line = self.wait_log("admin server listening").await;
        line["address"].as_str().unwrap().parse().unwrap()
    }

    fn signal(&self, signal: &str) {
        let pid = self.child.id().unwrap().to_string();
        let sent = std::process::Command::new("kill")
            .args([&format!("-{signal}"), &pid])
            .status()
            .unwrap();
        assert!(sent.success());
    }

    pub(crate) async fn exit_code(&mut self, within: Duration) -> Option<i32> {
        let code = tokio::time::timeout(within, self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("{} did not exit within {within:?}", self.identity_base))
            .unwrap()
            .code();
        // Its last lines may still be on their way from the pipe: read them to the end.
        if let Some(reader) = self.reader.take() {
            let _ = tokio::time::timeout(within, reader).await;
        }
        code
    }

    /// Whether this replica's requests are `record`'s (its User-Agent names its identity).
    fn sent(&self, record: &RequestRecord) -> bool {
        record
            .user_agent
            .contains(&format!("({}_", self.identity_base))
    }
}

async fn get(address: SocketAddr, path: &str) -> (u16, String) {
    let response = reqwest::get(format!("http://{address}{path}"))
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.text().await.unwrap())
}

fn kubeconfig_file(world: &World) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    std::fs::write(&path, world.kube.simulator().kubeconfig()).unwrap();
    (dir, path)
}

/// cert-manager's Issuer and Certificate kinds, schema-less: the part cert-manager plays
/// here is to accept them.
fn cert_manager_crds() -> Vec<Value> {
    ["Issuer", "Certificate"]
        .iter()
        .map(|kind| {
            let plural = format!("{}s", kind.to_lowercase());
            json!({
                "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                "metadata": {"name": format!("{plural}.cert-manager.io")},
                "spec": {"group": "cert-manager.io", "scope": "Namespaced",
                    "names": {"kind": kind, "plural": plural, "singular": kind.to_lowercase()},
                    "versions": [{"name": "v1", "served": true, "storage": true,
                        "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]},
            })
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_crds_run_names_them_and_exits_non_zero() {
    let kube = capo_sim::kube::KubeSim::start(Default::default())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, kube.kubeconfig()).unwrap();
    let mut replica = Replica::spawn(&kubeconfig, "lonely", &["--crd-wait", "0"]);
    assert_eq!(replica.exit_code(LONG).await, Some(1));
    let log = replica.log_text();
    for missing in [
        "openstackclusters.infrastructure.cluster.x-k8s.io",
        "clusters.cluster.x-k8s.io",
        "machines.cluster.x-k8s.io",
    ] {
        assert!(log.contains(missing), "{missing} not named: {log}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_server_answers_health_readiness_and_metrics() {
    // Cluster API's CRDs come later: until then the process is live but not ready.
    let world = World::prepare_sim(Scenario::default(), Vec::new()).await;
    let (_dir, kubeconfig) = kubeconfig_file(&world);
    let flags = ["--leader-elect", "--insecure-metrics"];
    let mut replica = Replica::spawn(&kubeconfig, "admin", &flags);
    let admin = replica.admin().await;
    replica
        .wait_log("waiting for CustomResourceDefinitions")
        .await;
    assert_eq!(get(admin, "/healthz").await, (200, "ok\n".to_owned()));
    let (status, body) = get(admin, "/readyz").await;
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains("waiting for the CustomResourceDefinitions"),
        "{body}"
    );
    world.kube.install(&minimal_capi_crds()).await;
    // Standing by is ready too (briefly, before it takes the free Lease).
    eventually("/readyz to say the caches synced", || async {
        let (status, body) = get(admin, "/readyz").await;
        (status == 200 && body == "ok: leading; caches synced\n").then_some(())
    })
    .await;
    // One registry: the controllers', the cloud layer's and the leader's series together.
    world.create(server_manifest("metered")).await;
    world.wait_for("metered", "Ready", is_ready).await;
    let (status, metrics) = get(admin, "/metrics").await;
    assert_eq!(status, 200);
    for family in [
        "leader_election_master_status{name=\"capo-rs-leader-election\"} 1",
        "controller_runtime_reconcile_total",
        "capo_openstack_api_requests_total",
        "workqueue_depth",
    ] {
        assert!(metrics.contains(family), "{family} missing from /metrics");
    }
    let (status, _) = get(admin, "/nothing").await;
    assert_eq!(status, 404);
    replica.signal("TERM");
    assert_eq!(replica.exit_code(LONG).await, Some(0));
}

const LEASE_FLAGS: [&str; 7] = [
    "--leader-elect",
    "--leader-elect-lease-duration",
    "4s",
    "--leader-elect-renew-deadline",
    "3s",
    "--leader-elect-retry-period",
    "1s",
];

async fn create_servers(world: &World, names: impl IntoIterator<Item = String>) {
    for name in names {
        world.create(server_manifest(&name)).await;
    }
}

async fn all_ready(world: &World, count: usize) {
    eventually("every OpenStackServer Ready", || async {
        let listed = world.servers().list(&ListParams::default()).await.ok()?;
        (listed.items.iter().filter(|s| is_ready(s)).count() == count).then_some(())
    })
    .await;
}

fn lease_request(record: &RequestRecord) -> bool {
    record.group == "coordination.k8s.io"
}

fn writes(record: &RequestRecord) -> bool {
    !matches!(record.verb.as_str(), "get" | "list" | "watch") && !lease_request(record)
}

/// Kills `first` (the leader) without a word, no release; makes three more servers; waits until
/// `second` leads and all six are Ready. Returns how long the takeover took.
async fn kill_the_leader(world: &World, first: &mut Replica, second: &Replica) -> Duration {
    first.child.start_kill().unwrap();
    let killed = Instant::now();
    assert_eq!(first.exit_code(LONG).await, None, "killed by a signal");
    create_servers(world, (0..3).map(|i| format!("after-{i}"))).await;
    second.wait_log("became the leader").await;
    let failover = killed.elapsed();
    all_ready(world, 6).await;
    failover
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_one_leads_and_the_other_takes_over_when_it_dies() {
    let world = World::prepare_sim(Scenario::default(), minimal_capi_crds()).await;
    let (_dir, kubeconfig) = kubeconfig_file(&world);
    let mut first = Replica::spawn(&kubeconfig, "first", &LEASE_FLAGS);
    first.wait_log("became the leader").await;
    let second = Replica::spawn(&kubeconfig, "second", &LEASE_FLAGS);
    second.wait_log("standing by").await;
    create_servers(&world, (0..3).map(|i| format!("before-{i}"))).await;
    all_ready(&world, 3).await;
    let standby_work: Vec<RequestRecord> = world
        .kube
        .simulator()
        .requests()
        .into_iter()
        .filter(|r| second.sent(r) && !lease_request(r))
        // Its start-up check that the CRDs are installed is all it may do.
        .filter(|r| r.resource != "customresourcedefinitions")
        .collect();
    assert!(
        standby_work.is_empty(),
        "the standby touched: {standby_work:?}"
    );

    // The leader dies without a word (no release): the standby waits out the lease.
    let failover = kill_the_leader(&world, &mut first, &second).await;
    // Lease 4 s, retried every 1 s (+20% jitter): at most about 5.2 s after the last renewal.
    assert!(
        failover < Duration::from_secs(8),
        "failover took {failover:?}"
    );
    println!(
        "failover after the leader was killed: {:.2} s",
        failover.as_secs_f64()
    );

    let log = world.kube.simulator().requests();
    let first_writes: Vec<&RequestRecord> =
        log.iter().filter(|r| first.sent(r) && writes(r)).collect();
    let second_writes: Vec<&RequestRecord> =
        log.iter().filter(|r| second.sent(r) && writes(r)).collect();
    assert!(!first_writes.is_empty() && !second_writes.is_empty());
    let last_first = first_writes.iter().map(|r| r.at).max().unwrap();
    let first_second = second_writes.iter().map(|r| r.at).min().unwrap();
    assert!(
        last_first < first_second,
        "the two replicas' writes overlap"
    );
    let leases: Api<Lease> = Api::namespaced(world.client.clone(), NAMESPACE);
    let lease = leases.get("capo-rs-leader-election").await.unwrap();
    let spec = lease.spec.unwrap();
    assert!(spec.holder_identity.unwrap().starts_with("second_"));
    assert_eq!(spec.lease_transitions, Some(1));
}

/// A shard's flags: its filter and its share of the budget, under leader election.
fn shard_flags<'a>(filter: &'a str, share: &'a str) -> Vec<&'a str> {
    let mut flags = LEASE_FLAGS.to_vec();
    flags.extend(["--watch-filter", filter, "--openstack-budget-share", share]);
    flags
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shards_hold_their_own_leases_and_their_shares_cannot_exceed_the_budget() {
    let world = World::prepare_sim(Scenario::default(), minimal_capi_crds()).await;
    let (_dir, kubeconfig) = kubeconfig_file(&world);
    shards_share_the_budget(&world, &kubeconfig, &[], NAMESPACE).await;
}

/// The same on real Leases, on a server of the test's own (the shards' Leases are named by
/// their filters alone): the shards hold capo-rs's ServiceAccount token, the Leases in the
/// namespace its Role grants them in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_kube_shards_hold_their_own_leases_and_their_shares_cannot_exceed_the_budget() {
    if crate::kube_world::real_kube().is_none() {
        return;
    }
    let crds = crate::server_controller::our_crds_and(minimal_capi_crds());
    let kube = crate::kube_world::KubeWorld::own_real(&crds, "shards").await;
    let kubeconfig = kube
        .own_tier_dir()
        .expect("a tier of its own")
        .join("capo-rs.kubeconfig");
    let world = World::prepare_on(kube, Scenario::default()).await;
    let scope = [
        "--namespace",
        world.ns(),
        "--leader-election-namespace",
        manifests::NAMESPACE,
    ];
    shards_share_the_budget(&world, &kubeconfig, &scope, manifests::NAMESPACE).await;
}

async fn shards_share_the_budget(
    world: &World,
    kubeconfig: &std::path::Path,
    scope: &[&str],
    lease_namespace: &str,
) {
    let flags = |filter, share| {
        let mut flags = shard_flags(filter, share);
        flags.extend_from_slice(scope);
        flags
    };
    let leases: Api<Lease> = Api::namespaced(world.client.clone(), lease_namespace);
    let a = Replica::spawn(kubeconfig, "shard-a", &flags("a", "0.6"));
    a.wait_log("became the leader").await;

    // A second shard asking for half: 0.6 + 0.5 is more than the cloud allows.
    let mut greedy = Replica::spawn(kubeconfig, "shard-b", &flags("b", "0.5"));
    assert_eq!(
        greedy.exit_code(LONG).await,
        Some(1),
        "{}",
        greedy.log_text()
    );
    let said = greedy.log_text();
    assert!(
        said.contains("add up to 1.100") && said.contains("capo-rs-leader-election-a 0.6"),
        "{said}"
    );
    let let_go = leases.get("capo-rs-leader-election-b").await.unwrap();
    assert_eq!(
        let_go.spec.and_then(|s| s.holder_identity),
        None,
        "the refused shard let its Lease go"
    );

    // With 0.4 it fits, and each shard holds its own Lease, its share written on it.
    let b = Replica::spawn(kubeconfig, "shard-b", &flags("b", "0.4"));
    b.wait_log("became the leader").await;
    for (lease, holder, share) in [("a", "shard-a", "0.6"), ("b", "shard-b", "0.4")] {
        let lease = leases
            .get(&format!("capo-rs-leader-election-{lease}"))
            .await
            .unwrap();
        let annotations = lease.metadata.annotations.unwrap_or_default();
        assert_eq!(
            annotations
                .get(capo_provider::manager::shards::SHARE_ANNOTATION)
                .map(String::as_str),
            Some(share)
        );
        let held_by = lease
            .spec
            .and_then(|s| s.holder_identity)
            .unwrap_or_default();
        assert!(held_by.starts_with(holder), "{held_by}");
    }
    // On the simulator, the grants only shards use show in its log; on the real server the
    // shards hold the ServiceAccount's token, and a grant deploy/ lacks refuses them above.
    if let crate::kube_world::Server::Sim(sim) = &world.kube.server {
        let sent: BTreeSet<(String, String, String)> = sim
            .requests()
            .into_iter()
            .filter(|r| b.sent(r))
            .map(|r| (r.verb, r.group, r.resource))
            .collect();
        for grant in used_by_shards() {
            assert!(sent.contains(&grant), "a shard uses {grant:?}");
        }
    }
    drop((a, b));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_in_a_burst_of_reconciles_exits_in_time_and_loses_nothing() {
    let world = World::prepare_sim(Scenario::default(), minimal_capi_crds()).await;
    let (_dir, kubeconfig) = kubeconfig_file(&world);
    // Half the servers reach the cloud through a ClusterIdentity that selects the
    // namespace by label (the grants the demo does not use: see `used_elsewhere`).
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(world.client.clone());
    let label = json!({"metadata": {"labels": {"team": "a"}}});
    namespaces
        .patch(NAMESPACE, &PatchParams::default(), &Patch::Merge(&label))
        .await
        .unwrap();
    let identities: Api<capo_api::OpenStackClusterIdentity> = Api::all(world.client.clone());
    let identity = serde_json::from_value(json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
        "kind": "OpenStackClusterIdentity",
        "metadata": {"name": "shared"},
        "spec": {
            "secretRef": {"name": "cloud-config", "namespace": NAMESPACE},
            "namespaceSelector": {"matchLabels": {"team": "a"}},
        },
    }))
    .unwrap();
    identities
        .create(&PostParams::default(), &identity)
        .await
        .unwrap();
    const BURST: usize = 30;
    for i in 0..BURST {
        let mut manifest = server_manifest(&format!("burst-{i}"));
        if i % 2 == 1 {
            manifest["spec"]["identityRef"] =
                json!({"type": "ClusterIdentity", "name": "shared", "cloudName": "sim"});
        }
        let object: OpenStackServer = serde_json::from_value(manifest).unwrap();
        world
            .servers()
            .create(&PostParams::default(), &object)
            .await
            .unwrap();
    }
    let mut replica = Replica::spawn(&kubeconfig, "burst", &[]);
    // In the middle of the burst: some servers exist in the cloud, not all are Ready.
    eventually("servers building in the cloud", || async {
        let built = world
            .cloud
            .object_counts()
            .get("servers")
            .copied()
            .unwrap_or(0);
        (built >= 3).then_some(())
    })
    .await;
    let asked = Instant::now();
    replica.signal("TERM");
    let code = replica.exit_code(Duration::from_secs(45)).await;
    let stopped_in = asked.elapsed();
    assert_eq!(code, Some(0), "{}", replica.log_text());
    println!(
        "SIGTERM to exit in a burst of {BURST}: {:.2} s",
        stopped_in.as_secs_f64()
    );

    // Whatever was written is whole: a server named in a status exists in the cloud.
    let listed = world.servers().list(&ListParams::default()).await.unwrap();
    for object in &listed.items {
        let id = object.status.as_ref().and_then(|s| s.instance_id.clone());
        if let Some(id) = id {
            assert!(
                world.cloud.server(&id).is_some(),
                "status names a missing server {id}"
            );
        }
    }
    // A new replica finishes the work: every object Ready, one server each, none lost.
    let mut again = Replica::spawn(&kubeconfig, "again", &[]);
    all_ready(&world, BURST).await;
    assert_eq!(
        world.cloud.object_counts().get("servers").copied(),
        Some(BURST)
    );
    let log = world.kube.simulator().requests();
    let used = used_by_capo_rs(&log);
    for grant in used_elsewhere() {
        assert!(used.contains(&grant), "{grant:?} not used");
    }
    again.signal("TERM");
    assert_eq!(again.exit_code(LONG).await, Some(0));
}

/// Leader election on the real tier's Leases, by `capo-rs run` processes holding capo-rs's
/// ServiceAccount token (the Role `deploy/` ships for Leases, the ClusterRole for the rest):
/// one leads and makes the servers Ready; killed without a word, the other takes over once
/// the Lease runs out and finishes the servers made meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_kube_two_replicas_one_leads_and_the_other_takes_over_when_it_is_killed() {
    let Some(real) = crate::kube_world::real_kube() else {
        return;
    };
    let crds = crate::server_controller::our_crds_and(minimal_capi_crds());
    let kube = crate::kube_world::KubeWorld::real(real.clone(), &crds).await;
    let world = World::prepare_on(kube, Scenario::default()).await;
    // A Lease of this world's own, in the namespace the Role grants.
    let lease = format!("capo-rs-{}", world.ns());
    let mut flags = LEASE_FLAGS.to_vec();
    flags.extend([
        "--namespace",
        world.ns(),
        "--leader-election-namespace",
        manifests::NAMESPACE,
        "--leader-election-id",
        &lease,
    ]);
    let mut first = Replica::spawn(&real.manager, "first", &flags);
    first.wait_log("became the leader").await;
    let second = Replica::spawn(&real.manager, "second", &flags);
    second.wait_log("standing by").await;
    create_servers(&world, (0..3).map(|i| format!("before-{i}"))).await;
    all_ready(&world, 3).await;

    let failover = kill_the_leader(&world, &mut first, &second).await;
    let leases: Api<Lease> = Api::namespaced(world.client.clone(), manifests::NAMESPACE);
    let holder = leases
        .get(&lease)
        .await
        .unwrap()
        .spec
        .unwrap_or_default()
        .holder_identity;
    assert!(
        holder.as_deref().is_some_and(|h| h.starts_with("second")),
        "the Lease names the second replica: {holder:?}"
    );
    println!(
        "FIGURES real-kube leader election: failover {:.2} s after the leader was killed",
        failover.as_secs_f64()
    );
}

/// On the real API server, with the RBAC `deploy/` ships: `/metrics` over HTTPS answers a
/// ServiceAccount bound to `capo-rs-metrics-reader`, refuses one that is not (403) and a
/// caller without a token (401), and is not on the plain admin port at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_kube_metrics_are_served_over_https_to_a_reader_only() {
    use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
    use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
    let Some(real) = crate::kube_world::real_kube() else {
        return;
    };
    let admin = crate::kube_world::client_from(&real.admin).await;
    let rbac = std::fs::read_to_string(format!("{}/deploy/rbac.yaml", env!("CARGO_MANIFEST_DIR")))
        .expect("deploy/rbac.yaml");
    crate::kube_world::apply_crds(&admin, &crate::common::yaml_documents(&rbac)).await;
    let namespace = format!("metrics-{}", fastrand::u32(..));
    let namespaces: Api<Namespace> = Api::all(admin.clone());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": namespace}})).unwrap();
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), &namespace);
    for name in ["reader", "stranger"] {
        let account: ServiceAccount =
            serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
        accounts
            .create(&PostParams::default(), &account)
            .await
            .unwrap();
    }
    let binding = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": format!("{namespace}-reader")},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": manifests::METRICS_READER},
        "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}],
    });
    crate::kube_world::apply_crds(&admin, std::slice::from_ref(&binding)).await;
    let token = async |name: &str| -> String {
        let request = TokenRequest {
            spec: TokenRequestSpec::default(),
            ..TokenRequest::default()
        };
        let made = accounts
            .create_token_request(name, &PostParams::default(), &request)
            .await
            .unwrap();
        made.status.expect("a token").token
    };
    let (reader, stranger) = (token("reader").await, token("stranger").await);

    let flags = [
        "--namespace",
        &namespace,
        "--metrics-address",
        "127.0.0.1:0",
    ];
    let mut replica = Replica::spawn(&real.manager, "metrics", &flags);
    let line = replica.wait_log("metrics server listening").await;
    let address: SocketAddr = line["address"].as_str().unwrap().parse().unwrap();
    let https = reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .build()
        .unwrap();
    let url = format!("https://{address}/metrics");
    let scrape = async |token: Option<&str>| -> (u16, String) {
        let mut request = https.get(&url);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.expect("an answer");
        let status = response.status().as_u16();
        (status, response.text().await.unwrap_or_default())
    };
    let (status, body) = scrape(Some(&reader)).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("capo_kube_requests_total"), "{body}");
    let (status, body) = scrape(Some(&stranger)).await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("stranger"), "{body}");
    assert_eq!(scrape(None).await.0, 401);
    assert_eq!(scrape(Some("not-a-token")).await.0, 401);
    let (status, _) = get(replica.admin().await, "/metrics").await;
    assert_eq!(status, 404, "no plain /metrics without --insecure-metrics");

    replica.signal("TERM");
    replica.exit_code(LONG).await;
    let bindings: Api<k8s_openapi::api::rbac::v1::ClusterRoleBinding> = Api::all(admin.clone());
    let _ = bindings
        .delete(&format!("{namespace}-reader"), &Default::default())
        .await;
    let _ = namespaces.delete(&namespace, &Default::default()).await;
}

/// The ```sh blocks of a book page that write `capo-rs-overlay/kustomization.yaml`.
fn overlay_blocks(page: &str) -> Vec<String> {
    let text = std::fs::read_to_string(repo().join("docs").join(page)).unwrap();
    text.split("```sh\n")
        .skip(1)
        .filter_map(|rest| rest.split("\n```").next())
        .filter(|block| block.contains("capo-rs-overlay/kustomization.yaml"))
        .map(str::to_owned)
        .collect()
}

/// The kustomize install as the installation page writes it (the first-cluster guide points at
/// it), run as a user types it in a directory beside a checkout: the overlay renders all of `deploy/` with
/// the user's image in place of `localhost/capo-rs`. Its last command, `kubectl apply -k`, is
/// run as `kubectl kustomize` (applying `deploy/` to a real API server is
/// `real_kube::real_kube_accepts_every_object_of_deploy_applied_server_side`).
#[test]
fn the_books_kustomize_overlay_installs_deploy_with_your_image() {
    let Some(kubectl) = kubectl() else {
        return;
    };
    let page = "installation.md";
    let blocks = overlay_blocks(page);
    assert_eq!(blocks.len(), 1, "{page} has one overlay block");
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(repo().join("deploy"), dir.path().join("deploy")).unwrap();
    let rendered = dir.path().join("rendered.yaml");
    // `kubectl apply --server-side -k DIR` becomes a render of DIR; the rest runs as written.
    let shim = format!(
        "kubectl() {{ [ \"$1 $2 $3\" = 'apply --server-side -k' ] || exit 9; {} kustomize \"$4\" > {}; }}\n",
        kubectl.display(),
        rendered.display()
    );
    let run = std::process::Command::new("bash")
        .args(["-euo", "pipefail", "-c"])
        .arg(shim + &blocks[0])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{page}'s overlay block: {}{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    let objects = documents(&std::fs::read_to_string(&rendered).unwrap());
    assert_eq!(objects.len(), 22, "{page}: every object of deploy/");
    let deployment = &objects["Deployment/capo-rs-controller-manager"];
    assert_eq!(
        deployment["spec"]["template"]["spec"]["containers"][0]["image"],
        "registry.example.com/capo-rs:0.1.0",
        "{page}: the overlay names the user's image"
    );
}
