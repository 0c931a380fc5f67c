//! CAPO v0.14.7 and capo-rs side by side (the bench `scripts/vs-capo.sh` runs; not in CI):
//! the same scenarios, driven the same way, on the same kind of cloud and API server, one
//! provider after the other so neither shares the two cores with the other.
//!
//! Each side gets a fresh simulated OpenStack (the same settings and seed; CAPO's gophercloud
//! reaches it from its network namespace) and a fresh real API server of its own
//! (`tests/kube/up.sh`, kube-apiserver 1.35.4, with an audit log of every write to
//! `infrastructure.cluster.x-k8s.io` objects), Cluster API's manager of the release the
//! provider pairs with (v1.12.10 for CAPO, v1.14.2 for capo-rs), and the provider as a process
//! of its own with its shipped defaults, serving its own webhooks: CAPO's `capo-manager`, and
//! capo-rs's `capo-rs run` (the binary `CAPO_VS_CAPO_RS` names: the script builds the release
//! profile; by default this test's own build; `CAPO_VS_CAPO_RS_ARGS` adds flags to its
//! command). Both are given the same objects, in CAPO 0.14's v1beta1 API. `CAPO_VS_SIDES`
//! (`CAPO v0.14.7` or `capo-rs`) measures one side alone.
//!
//! Measured: OpenStack requests (every request the simulator served, Keystone's included)
//! and time, for one cluster's creation, one control-plane machine, a rollout of 3 and the
//! cluster's deletion; Kubernetes writes per OpenStackCluster and per OpenStackMachine (its
//! OpenStackServer's included), counted in the audit log by the provider's identity; memory
//! and CPU idle and at `CAPO_VS_CLUSTERS` clusters (default 100) of one control-plane machine
//! each; and the time a restarted provider takes to look at every cluster's API load balancer
//! again.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use capo_sim::certs::WebhookCerts;
use capo_sim::openstack::{OpenStackSim, OpenStackSimConfig, Scenario, WatchedLoadBalancer};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, PostParams};
use serde_json::{Value, json};

use crate::capi_peers::{CapiManager, CapiRelease, capi_peers};
use crate::capo_peers::{
    CapoManager, CapoPeers, bootstrap_secret, capi_clusters, capi_machines, capo_peers,
    cluster_object, create, machine_objects, openstack_cluster_object, openstack_clusters,
    openstack_machines,
};
use crate::go_peer::free_port;
use crate::kube_world::{KubeWorld, admission_as_shipped, apply_crds, through_webhook};
use crate::server_controller::base64;

const NAMESPACE: &str = "vs";
/// The identity capo-rs runs as on the tier (`deploy/`'s ServiceAccount).
const CAPO_RS_USER: &str = "system:serviceaccount:capo-rs-system:capo-rs-manager";
/// How CAPO's manager names itself to the API server (controller-runtime's user agent is the
/// binary's name).
const CAPO_AGENT: &str = "capo-manager/";
const POLL: Duration = Duration::from_millis(200);
const LIMIT: Duration = Duration::from_secs(900);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the side-by-side bench, run outside CI by scripts/vs-capo.sh"]
async fn capo_v0_14_7_and_capo_rs_side_by_side() {
    let capo = capo_peers().expect("CAPO's peers (tests/capo/build.sh's env)");
    let capi = capi_peers().expect("Cluster API's peers (tests/capi/build.sh's env)");
    let clusters: u32 = std::env::var("CAPO_VS_CLUSTERS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(100);
    let window = Duration::from_secs(
        (std::env::var("CAPO_VS_WINDOW").ok())
            .and_then(|s| s.parse().ok())
            .unwrap_or(60),
    );
    let capo_rs = std::env::var_os("CAPO_VS_CAPO_RS").map_or_else(
        || PathBuf::from(env!("CARGO_BIN_EXE_capo-rs")),
        PathBuf::from,
    );
    let args: Vec<String> = std::env::var("CAPO_VS_CAPO_RS_ARGS")
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    if !args.is_empty() {
        eprintln!("capo-rs runs with {}", args.join(" "));
    }
    let sides = [
        Side::Capo(&capo),
        Side::CapoRs {
            release: capi.release(),
            binary: capo_rs,
            args,
        },
    ];
    let only = std::env::var("CAPO_VS_SIDES").ok();
    let mut figures = Vec::new();
    for side in sides
        .iter()
        .filter(|side| only.as_deref().is_none_or(|o| o == side.name()))
    {
        figures.push(measure(side, clusters, window).await);
    }
    assert!(!figures.is_empty(), "CAPO_VS_SIDES names no side: {only:?}");
    print_table(&figures, clusters);
}

/// A provider under measure, and what it runs with.
enum Side<'a> {
    Capo(&'a CapoPeers),
    CapoRs {
        release: CapiRelease,
        binary: PathBuf,
        /// Flags added to `capo-rs run` (`CAPO_VS_CAPO_RS_ARGS`).
        args: Vec<String>,
    },
}

impl Side<'_> {
    fn name(&self) -> &'static str {
        match self {
            Side::Capo(_) => "CAPO v0.14.7",
            Side::CapoRs { .. } => "capo-rs",
        }
    }

    fn capi_release(&self) -> CapiRelease {
        match self {
            Side::Capo(peers) => peers.capi_release(),
            Side::CapoRs { release, .. } => release.clone(),
        }
    }

    async fn start(&self, kube: &KubeWorld, sim: &OpenStackSim) -> Provider {
        match self {
            Side::Capo(peers) => {
                Provider::Capo(CapoManager::start(kube, peers, &[sim.addr().port()]).await)
            }
            Side::CapoRs { binary, args, .. } => {
                Provider::CapoRs(CapoRsProcess::start(kube, binary, args).await)
            }
        }
    }

    /// Whether an audit event is a write this provider made.
    fn wrote(&self, event: &Value) -> bool {
        match self {
            Side::Capo(_) => event["userAgent"]
                .as_str()
                .is_some_and(|agent| agent.starts_with(CAPO_AGENT)),
            Side::CapoRs { .. } => event["user"]["username"] == CAPO_RS_USER,
        }
    }
}

/// A running provider.
enum Provider {
    Capo(CapoManager),
    CapoRs(CapoRsProcess),
}

impl Provider {
    fn pid(&self) -> u32 {
        match self {
            Provider::Capo(manager) => manager.pid().expect("CAPO's manager runs"),
            Provider::CapoRs(process) => process.child.id(),
        }
    }

    fn log_tail(&self) -> String {
        match self {
            Provider::Capo(manager) => manager.log_tail(),
            Provider::CapoRs(process) => process.log_tail(),
        }
    }
}

/// `capo-rs run` in a process of its own, as its ServiceAccount, serving its webhooks on a
/// certificate the test issues (the CRDs and the validating configuration call it by URL).
struct CapoRsProcess {
    child: std::process::Child,
    dir: tempfile::TempDir,
}

impl CapoRsProcess {
    async fn start(kube: &KubeWorld, binary: &Path, args: &[String]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let certs = WebhookCerts::issue(&["127.0.0.1".to_owned()]).unwrap();
        certs.write(&dir.path().join("certs")).unwrap();
        let (admin, webhook) = (free_port(), free_port());
        let base = format!("https://127.0.0.1:{webhook}");
        let objects: Vec<Value> = capo_api::crds::all()
            .iter()
            .map(|crd| serde_json::to_value(crd).expect("CRD"))
            .chain(admission_as_shipped())
            .map(|object| through_webhook(object, &base, &certs.ca_bundle()))
            .collect();
        let tier = kube.own_tier_dir().expect("a tier of the side's own");
        let log = std::fs::File::create(dir.path().join("capo-rs.log")).unwrap();
        let child = std::process::Command::new(binary)
            .args(["--log-level", "warn", "run"])
            .args(args)
            .arg("--kubeconfig")
            .arg(tier.join("capo-rs.kubeconfig"))
            .args(["--admin-address", &format!("127.0.0.1:{admin}")])
            .args(["--webhook-address", &format!("127.0.0.1:{webhook}")])
            .arg("--webhook-cert-dir")
            .arg(dir.path().join("certs"))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("{} starts: {e}", binary.display()));
        let process = CapoRsProcess { child, dir };
        apply_crds(&kube.client, &objects).await;
        let ready = format!("http://127.0.0.1:{admin}/readyz");
        let http = reqwest::Client::new();
        until(
            "capo-rs ready",
            &|| process.log_tail(),
            async || match http.get(&ready).send().await {
                Ok(answer) if answer.status().is_success() => Ok(()),
                Ok(answer) => Err(answer.status().to_string()),
                Err(e) => Err(e.to_string()),
            },
        )
        .await;
        process
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.path().join("capo-rs.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }
}

impl Drop for CapoRsProcess {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill")
            .arg(self.child.id().to_string())
            .status();
        let _ = self.child.wait();
    }
}

/// One side's figures.
#[derive(Default)]
struct Figures {
    name: &'static str,
    /// (OpenStack requests, seconds) per step of the one-cluster story.
    create_cluster: (u64, f64),
    /// Seconds of `create_cluster` from Cluster API's adoption of the OpenStackCluster (its
    /// owner reference stored): the provider's part, without Cluster API's own start.
    create_from_adoption: f64,
    machine: (u64, f64),
    rollout: (u64, f64),
    delete: (u64, f64),
    /// Kubernetes writes per OpenStackCluster and per OpenStackMachine, over the one-cluster
    /// story (1 OpenStackCluster, 6 OpenStackMachines: 3, then 3 replacing them).
    writes_per_cluster: f64,
    writes_per_machine: f64,
    /// Resident memory (MiB) and CPU (% of a core) over the idle minute.
    idle: Usage,
    /// Seconds from the first apply until every cluster was provisioned and every machine
    /// released, and the OpenStack requests meanwhile.
    scale_up: (u64, f64),
    /// At scale, over the steady minute; and requests per second then.
    steady: Usage,
    steady_requests_per_second: f64,
    /// Seconds from a restart until every cluster's API load balancer was read again, and the
    /// OpenStack requests meanwhile.
    restart: (u64, f64),
}

#[derive(Default, Clone, Copy)]
struct Usage {
    rss_mib: f64,
    peak_mib: f64,
    cpu_percent: f64,
}

async fn measure(side: &Side<'_>, clusters: u32, window: Duration) -> Figures {
    let name = side.name();
    let sim = OpenStackSim::start(OpenStackSimConfig {
        scenario: Scenario {
            seed: Some(61),
            ..Scenario::default()
        },
        ..OpenStackSimConfig::default()
    })
    .await
    .expect("the simulated OpenStack");
    let kube = KubeWorld::own_real_with(&[], NAMESPACE, &[("CAPO_KUBE_AUDIT", "1")]).await;
    let capi = CapiManager::start(&kube, &side.capi_release()).await;
    cloud_secret(&kube, &sim).await;
    let mut provider = side.start(&kube, &sim).await;
    eprintln!("{name}: started");
    let mut figures = Figures {
        name,
        idle: usage_over(provider.pid(), window).await,
        ..Figures::default()
    };
    let logs = || format!("{}\n{}", provider.log_tail(), capi.log_tail());
    let story = Story {
        kube: &kube,
        sim: &sim,
        logs: &logs,
    };
    story.one_cluster(&mut figures).await;
    eprintln!("{name}: one cluster built, rolled and deleted");
    let audit = audit_events(&kube);
    figures.writes_per_cluster = writes(side, &audit, "openstackclusters") as f64;
    figures.writes_per_machine = (writes(side, &audit, "openstackmachines")
        + writes(side, &audit, "openstackservers")) as f64
        / 6.0;
    figures.scale_up = story.scale_up(clusters).await;
    eprintln!(
        "{name}: {clusters} clusters up in {:.1} s",
        figures.scale_up.1
    );
    let steady_from = requests(&sim);
    figures.steady = usage_over(provider.pid(), window).await;
    figures.steady_requests_per_second =
        (requests(&sim) - steady_from) as f64 / window.as_secs_f64();
    let balancers = story.load_balancers().await;
    drop(provider);
    sim.watch_load_balancers(balancers);
    let (restarted, from) = (Instant::now(), requests(&sim));
    let by_operation_before = sim.request_log()["by_operation"].clone();
    provider = side.start(&kube, &sim).await;
    let logs = || provider.log_tail();
    until(
        "every load balancer looked at again",
        &logs,
        async || match sim.unread_load_balancers() {
            unread if unread.is_empty() => Ok(()),
            unread => Err(format!(
                "{} not yet: {:?}",
                unread.len(),
                &unread[..unread.len().min(3)]
            )),
        },
    )
    .await;
    figures.restart = (requests(&sim) - from, restarted.elapsed().as_secs_f64());
    eprintln!(
        "{name}: the restart's requests by operation: {}",
        operations_since(&by_operation_before, &sim.request_log()["by_operation"])
    );
    eprintln!(
        "{name}: restarted, every load balancer read in {:.1} s",
        figures.restart.1
    );
    drop(provider);
    drop(capi);
    figures
}

/// The scenarios, on one side's API server and cloud.
struct Story<'a> {
    kube: &'a KubeWorld,
    sim: &'a OpenStackSim,
    logs: &'a dyn Fn() -> String,
}

impl Story<'_> {
    /// One cluster: created; one control-plane machine; two more, then a rollout of the three
    /// (each replaced by a new one, the old deleted once the new one is released); deleted.
    async fn one_cluster(&self, figures: &mut Figures) {
        let cluster = "c0";
        bootstrap_secret(self.kube, cluster).await;
        figures.create_cluster = self
            .step(async || {
                self.create_cluster(cluster).await;
                self.wait_clusters_ready(&[cluster]).await;
            })
            .await;
        figures.create_from_adoption = seconds_since_adopted(self.kube, cluster);
        figures.machine = self
            .step(async || {
                self.create_machine(cluster, "c0-m0").await;
                self.wait_released(&["c0-m0"]).await;
            })
            .await;
        for machine in ["c0-m1", "c0-m2"] {
            self.create_machine(cluster, machine).await;
        }
        self.wait_released(&["c0-m1", "c0-m2"]).await;
        figures.rollout = self
            .step(async || {
                for (old, new) in [("c0-m0", "c0-n0"), ("c0-m1", "c0-n1"), ("c0-m2", "c0-n2")] {
                    self.create_machine(cluster, new).await;
                    self.wait_released(&[new]).await;
                    self.delete_and_wait(&self.machines(), old).await;
                }
            })
            .await;
        figures.delete = self
            .step(async || self.delete_and_wait(&self.clusters(), cluster).await)
            .await;
    }

    /// `clusters` clusters of one control-plane machine each, applied at once; the requests
    /// and seconds until every one is provisioned and every machine released.
    async fn scale_up(&self, clusters: u32) -> (u64, f64) {
        let names: Vec<String> = (0..clusters).map(|i| format!("s{i:04}")).collect();
        self.step(async || {
            for cluster in &names {
                bootstrap_secret(self.kube, cluster).await;
                self.create_cluster(cluster).await;
                self.create_machine(cluster, &format!("{cluster}-cp")).await;
            }
            let machines: Vec<String> = names.iter().map(|c| format!("{c}-cp")).collect();
            until("every machine released", self.logs, async || {
                let released = self.released_count().await?;
                match released >= machines.len() {
                    true => Ok(()),
                    false => Err(format!("{released} of {} released", machines.len())),
                }
            })
            .await;
        })
        .await
    }

    /// Every cluster's API load balancer, by id and by the name CAPO 0.14 gives it (CAPO
    /// looks one up by name; capo-rs lists every load balancer's statuses in one request).
    async fn load_balancers(&self) -> Vec<WatchedLoadBalancer> {
        let listed = openstack_clusters(self.kube)
            .list(&ListParams::default())
            .await
            .expect("OpenStackClusters");
        listed
            .items
            .iter()
            .filter_map(|cluster| {
                let status = &serde_json::to_value(cluster).ok()?["status"];
                let id = status["apiServerLoadBalancer"]["id"].as_str()?.to_owned();
                let name = cluster.metadata.name.as_deref()?;
                let name = format!("k8s-clusterapi-cluster-{NAMESPACE}-{name}-kubeapi");
                Some(WatchedLoadBalancer { id, name })
            })
            .collect()
    }

    /// OpenStack requests served and seconds taken by `step`.
    async fn step(&self, step: impl AsyncFnOnce()) -> (u64, f64) {
        let (from, started) = (requests(self.sim), Instant::now());
        step().await;
        (requests(self.sim) - from, started.elapsed().as_secs_f64())
    }

    async fn create_cluster(&self, cluster: &str) {
        let network = json!({"filter": {"name": "public"}});
        let infra = openstack_cluster_object(NAMESPACE, cluster, "sim", network);
        create(&openstack_clusters(self.kube), infra).await;
        create(&self.clusters(), cluster_object(NAMESPACE, cluster)).await;
    }

    async fn create_machine(&self, cluster: &str, name: &str) {
        let (osm, machine) = machine_objects(NAMESPACE, cluster, name, true, false);
        create(&self.openstack_machines(), osm).await;
        create(&self.machines(), machine).await;
    }

    async fn wait_clusters_ready(&self, names: &[&str]) {
        let infra = openstack_clusters(self.kube);
        until("OpenStackClusters ready", self.logs, async || {
            for name in names {
                let object = infra.get(name).await.map_err(|e| e.to_string())?;
                let status = serde_json::to_value(&object).unwrap_or_default()["status"].clone();
                if status["ready"] != true {
                    return Err(format!("{name}: {status}"));
                }
            }
            Ok(())
        })
        .await;
    }

    /// Until each Machine has its providerID (the provider released it).
    async fn wait_released(&self, names: &[&str]) {
        let machines = self.machines();
        until("machines released", self.logs, async || {
            for name in names {
                let object = machines.get(name).await.map_err(|e| e.to_string())?;
                let object = serde_json::to_value(&object).unwrap_or_default();
                if !object["spec"]["providerID"].is_string() {
                    return Err(format!("{name} not released"));
                }
            }
            Ok(())
        })
        .await;
    }

    async fn released_count(&self) -> Result<usize, String> {
        let listed =
            (self.machines().list(&ListParams::default()).await).map_err(|e| e.to_string())?;
        Ok(listed
            .items
            .iter()
            .filter(|m| {
                serde_json::to_value(m).unwrap_or_default()["spec"]["providerID"].is_string()
            })
            .count())
    }

    async fn delete_and_wait(&self, api: &Api<DynamicObject>, name: &str) {
        api.delete(name, &DeleteParams::default())
            .await
            .unwrap_or_else(|e| panic!("deleting {name}: {e}"));
        until(&format!("{name} gone"), self.logs, async || {
            match api.get_opt(name).await {
                Ok(None) => Ok(()),
                Ok(Some(_)) => Err("still there".to_owned()),
                Err(e) => Err(e.to_string()),
            }
        })
        .await;
    }

    fn clusters(&self) -> Api<DynamicObject> {
        capi_clusters(self.kube)
    }

    fn machines(&self) -> Api<DynamicObject> {
        capi_machines(self.kube)
    }

    fn openstack_machines(&self) -> Api<DynamicObject> {
        openstack_machines(self.kube, "v1beta1")
    }
}

/// Polls `probe` every [`POLL`], within [`LIMIT`].
async fn until<T>(
    what: &str,
    logs: &dyn Fn() -> String,
    probe: impl AsyncFnMut() -> Result<T, String>,
) -> T {
    crate::go_peer::until(what, LIMIT, POLL, logs, probe).await
}

/// The Secret `cloud-config` with the simulator's cloud `sim`.
async fn cloud_secret(kube: &KubeWorld, sim: &OpenStackSim) {
    let secret: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "cloud-config", "namespace": NAMESPACE},
        "data": {"clouds.yaml": base64(&sim.clouds_yaml())},
    }))
    .unwrap();
    kube.api::<Secret>()
        .create(&PostParams::default(), &secret)
        .await
        .expect("the Secret");
}

/// `"<operation> <count>"` for each operation counted more in `after` than in `before`.
fn operations_since(before: &Value, after: &Value) -> String {
    let count = |log: &Value, operation: &str| log[operation].as_u64().unwrap_or(0);
    let Some(after_map) = after.as_object() else {
        return String::new();
    };
    after_map
        .keys()
        .filter_map(|operation| {
            let n = count(after, operation).saturating_sub(count(before, operation));
            (n > 0).then(|| format!("{operation} {n}"))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn requests(sim: &OpenStackSim) -> u64 {
    sim.request_log()["total"].as_u64().unwrap_or(0)
}

/// The tier's audit events so far.
fn audit_events(kube: &KubeWorld) -> Vec<Value> {
    let path = kube
        .own_tier_dir()
        .expect("a tier of the side's own")
        .join("audit.log");
    let text = std::fs::read_to_string(&path).expect("the tier's audit log");
    text.lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect()
}

/// Seconds from Cluster API's adoption of the OpenStackCluster `name` (its first write to
/// it, the owner reference, stored: in the audit log) until now. Cluster API v1.14.2 starts
/// its watch of the infrastructure kind at its first Cluster, and that takes seconds longer
/// than v1.12.10's: this is the part of a create the provider answers for.
fn seconds_since_adopted(kube: &KubeWorld, name: &str) -> f64 {
    use k8s_openapi::jiff::Timestamp;
    let now = Timestamp::now();
    let adopted = audit_events(kube)
        .into_iter()
        .find(|event| {
            event["objectRef"]["resource"] == "openstackclusters"
                && event["objectRef"]["name"] == name
                && event["userAgent"]
                    .as_str()
                    .is_some_and(|agent| agent.starts_with("capi-manager/"))
        })
        .and_then(|event| event["stageTimestamp"].as_str()?.parse::<Timestamp>().ok())
        .expect("Cluster API's adoption of the OpenStackCluster in the audit log");
    now.duration_since(adopted).as_secs_f64()
}

/// The side's writes to `resource` (any subresource).
fn writes(side: &Side<'_>, audit: &[Value], resource: &str) -> usize {
    audit
        .iter()
        .filter(|event| event["objectRef"]["resource"] == resource && side.wrote(event))
        .count()
}

/// The process's resident memory at the end of `window` and its peak, and its CPU over it.
async fn usage_over(pid: u32, window: Duration) -> Usage {
    let cpu = |pid: u32| -> f64 {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // After the command's closing parenthesis: state is field 3, utime 14 and stime 15.
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .map_or(Vec::new(), |(_, rest)| rest.split_whitespace().collect());
        let ticks = |i: usize| {
            fields
                .get(i)
                .and_then(|f| f.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        (ticks(11) + ticks(12)) / 100.0
    };
    let (from, started) = (cpu(pid), Instant::now());
    tokio::time::sleep(window).await;
    let used = cpu(pid) - from;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib = |key: &str| -> f64 {
        status
            .lines()
            .find_map(|line| line.strip_prefix(key))
            .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
            .unwrap_or(0.0)
    };
    Usage {
        rss_mib: kib("VmRSS:") / 1024.0,
        peak_mib: kib("VmHWM:") / 1024.0,
        cpu_percent: 100.0 * used / started.elapsed().as_secs_f64(),
    }
}

/// A side's figures as the table's rows: what, the figure, its unit.
fn rows(f: &Figures, clusters: u32) -> Vec<(String, f64, &'static str)> {
    let mut rows = Vec::new();
    for (what, (requests, seconds)) in [
        ("create a cluster", f.create_cluster),
        ("one control-plane machine", f.machine),
        ("rollout of 3 control-plane machines", f.rollout),
        ("delete the cluster (3 machines)", f.delete),
    ] {
        rows.push((format!("OpenStack requests: {what}"), requests as f64, ""));
        rows.push((format!("seconds: {what}"), seconds, "s"));
    }
    let (requests_up, seconds_up) = f.scale_up;
    let (requests_restart, seconds_restart) = f.restart;
    rows.extend([
        (
            "seconds: create a cluster, from Cluster API's adoption".to_owned(),
            f.create_from_adoption,
            "s",
        ),
        (
            "Kubernetes writes per OpenStackCluster".to_owned(),
            f.writes_per_cluster,
            "",
        ),
        (
            "Kubernetes writes per OpenStackMachine (its OpenStackServer's included)".to_owned(),
            f.writes_per_machine,
            "",
        ),
        ("RSS idle".to_owned(), f.idle.rss_mib, "MiB"),
        ("CPU idle".to_owned(), f.idle.cpu_percent, "%"),
        (
            format!("seconds to {clusters} clusters provisioned, machines released"),
            seconds_up,
            "s",
        ),
        (
            format!("OpenStack requests to {clusters} clusters"),
            requests_up as f64,
            "",
        ),
        (
            format!("RSS at {clusters} clusters, steady"),
            f.steady.rss_mib,
            "MiB",
        ),
        (
            format!("RSS at {clusters} clusters, peak"),
            f.steady.peak_mib,
            "MiB",
        ),
        (
            format!("CPU at {clusters} clusters, steady"),
            f.steady.cpu_percent,
            "%",
        ),
        (
            format!("OpenStack requests per second at {clusters} clusters, steady"),
            f.steady_requests_per_second,
            "",
        ),
        (
            format!("seconds from a restart to every load balancer read ({clusters} clusters)"),
            seconds_restart,
            "s",
        ),
        (
            "OpenStack requests from a restart to every load balancer read".to_owned(),
            requests_restart as f64,
            "",
        ),
    ]);
    rows
}

/// The table: a column per side measured, and capo-rs / CAPO when both were.
fn print_table(sides: &[Figures], clusters: u32) {
    let names: Vec<&str> = sides.iter().map(|f| f.name).collect();
    let both = sides.len() == 2;
    let ratio_head = if both { " capo-rs / CAPO |" } else { "" };
    println!("\n| figure | {} |{ratio_head}", names.join(" | "));
    println!(
        "|---|{}{}",
        "---|".repeat(sides.len()),
        if both { "---|" } else { "" }
    );
    let columns: Vec<_> = sides.iter().map(|f| rows(f, clusters)).collect();
    for (i, (what, _, unit)) in columns[0].iter().enumerate() {
        let values: Vec<f64> = columns.iter().map(|rows| rows[i].1).collect();
        let cells: Vec<String> = values.iter().map(|v| format!("{v:.2} {unit}")).collect();
        let ratio = match values.as_slice() {
            [a, b] if *a > 0.0 => format!(" {:.2} |", b / a),
            [_, _] => " - |".to_owned(),
            _ => String::new(),
        };
        println!("| {what} | {} |{ratio}", cells.join(" | "));
    }
}
