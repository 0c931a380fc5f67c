//! `capo-rs bench scale`: `capo-rs run` as users run it, in its own process, against both
//! simulators in processes of their own (their memory is not the controller's), driven by
//! the Cluster API actor from this process. Brings up N clusters of control-plane and
//! worker machines, rolls a share of the control planes, restarts the controller, and
//! measures the controller's memory and CPU from /proc, its reconcile times from its own
//! /metrics, and the requests both simulators served.
//!
//! With `--kube-tier DIR` the Kubernetes half is a real API server instead: the run
//! directory of `tests/kube/up.sh` (its admin kubeconfig sets up, the controller runs with
//! capo-rs's ServiceAccount token), and the controller's Kubernetes requests are read from
//! its own `capo_kube_requests_total`. Give it a tier of its own: the objects stay.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use capo_api::capi::Cluster;
use capo_api::{OpenStackCluster, OpenStackMachineSpec, OpenStackServer};
use capo_sim::capi::{CapiActor, CapiActorConfig, ControlPlane};
use futures::StreamExt as _;
use kube::ResourceExt as _;
use kube::api::{Api, PostParams};
use serde::Serialize;
use serde_json::{Value, json};
use tokio::process::{Child, Command};
use tokio_util::sync::CancellationToken;

use crate::safety::run::put_cloud_secret;

pub(crate) const NAMESPACE: &str = "default";

#[derive(Clone, Debug, Serialize)]
pub struct ScaleConfig {
    /// The `capo-rs` binary that runs the simulators (a build with the dev tools).
    pub binary: PathBuf,
    /// The binary run as the controller: `capo-rs` or a wrapper that execs it with the
    /// arguments given (the production build, or a profiler around it).
    pub controller: PathBuf,
    pub clusters: u32,
    pub control_plane: u32,
    pub workers: u32,
    /// Share of the clusters whose control plane is rolled.
    pub rollout_share: f64,
    /// The controller's OpenStack budget (`--openstack-qps`, `--openstack-burst`).
    pub openstack_qps: u32,
    pub openstack_burst: u32,
    /// Reconciles at once, per kind.
    pub concurrency: u16,
    /// How long steady state is measured.
    pub steady: Duration,
    /// A real Kubernetes tier's run directory (`tests/kube/up.sh`) in place of the simulated
    /// API server.
    pub kube_tier: Option<PathBuf>,
    /// Restarts per `PriorityQueue` setting, alternating on and off from the default restart
    /// (on), so neither setting always comes first.
    pub priority_restarts: u32,
}

/// Quantiles of one controller's reconcile time.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ReconcileTimes {
    pub reconciles: f64,
    pub p50_seconds: f64,
    pub p99_seconds: f64,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct ScaleReport {
    pub config: Option<ScaleConfig>,
    pub machines: u64,
    /// Objects the controller watches (Clusters, OpenStackClusters, Machines,
    /// OpenStackMachines, OpenStackServers, the Secret).
    pub watched_objects: u64,
    pub bring_up_seconds: f64,
    pub rollout_seconds: f64,
    pub clusters_rolled: u64,
    pub idle_rss_bytes: u64,
    pub peak_rss_bytes: u64,
    pub steady_rss_bytes: u64,
    /// (steady RSS - idle RSS) / watched objects.
    pub bytes_per_watched_object: f64,
    /// Share of one core at steady state.
    pub steady_cpu_share: f64,
    pub reconcile_times: BTreeMap<String, ReconcileTimes>,
    /// The controller's Kubernetes requests per second, by phase.
    pub kube_requests_per_second: BTreeMap<String, f64>,
    /// The controller's OpenStack requests per second, by phase.
    pub openstack_requests_per_second: BTreeMap<String, f64>,
    /// OpenStack requests from the first cluster's creation until every cluster is
    /// provisioned (before any machine), per cluster.
    pub openstack_requests_per_cluster_created: f64,
    /// OpenStack requests by operation, over the whole run.
    pub openstack_requests_by_operation: BTreeMap<String, u64>,
    /// OpenStack requests by operation from the first restart until every verdict was known.
    pub openstack_requests_in_restart: BTreeMap<String, u64>,
    /// The controller's Kubernetes requests by verb and resource, over the whole run.
    pub kube_requests_by_resource: BTreeMap<String, u64>,
    /// The most OpenStack requests to one service in any one second, and what the budget
    /// allows one service in one (qps + burst: the limit is per endpoint, as a cloud's is).
    pub openstack_peak_per_second: u64,
    pub openstack_budget_per_second: u64,
    /// The most requests to any service in one second, by service.
    pub openstack_peak_per_second_by_service: BTreeMap<String, u64>,
    /// Windows (1-60 s) in which more requests arrived at one service than its token bucket
    /// allows, summed over services.
    pub openstack_windows_over_budget: u64,
    /// From SIGTERM to every cluster reconciled and every gate verdict known again.
    pub restart_to_verdicts_seconds: f64,
    /// A user's change while the restarted controller works through its first lists: from a
    /// new OpenStackServer's creation (once the controller is ready) until capo-rs has made
    /// its server (`status.instanceID`). With `PriorityQueue` on, the default.
    pub change_during_restart_seconds: f64,
    /// The same restart and change with `--feature-gates PriorityQueue=false`: the median of
    /// those restarts.
    pub restart_without_priority_seconds: f64,
    pub change_during_restart_without_priority_seconds: f64,
    /// Every restart, in order: on, off, on, off...
    pub priority_restarts: Vec<PriorityRestart>,
}

/// One restart for the `PriorityQueue` comparison.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PriorityRestart {
    pub priority_queue: bool,
    pub restart_seconds: f64,
    pub change_seconds: f64,
}

impl ScaleReport {
    /// The median restart and change with the gate `on`, over [`Self::priority_restarts`].
    pub fn priority_medians(&self, on: bool) -> (f64, f64) {
        let of = |figure: fn(&PriorityRestart) -> f64| {
            let mut values: Vec<f64> = self
                .priority_restarts
                .iter()
                .filter(|r| r.priority_queue == on)
                .map(figure)
                .collect();
            values.sort_by(f64::total_cmp);
            match values.len() {
                0 => f64::NAN,
                n if n % 2 == 1 => values[n / 2],
                n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
            }
        };
        (of(|r| r.restart_seconds), of(|r| r.change_seconds))
    }
}

/// One child process; killed when dropped.
pub(crate) struct Process {
    child: Child,
    name: String,
}

impl Process {
    fn spawn(binary: &Path, name: &str, args: &[String], dir: &Path) -> anyhow::Result<Self> {
        let log = std::fs::File::create(dir.join(format!("{name}.log")))?;
        let child = Command::new(binary)
            .args(args)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {name}"))?;
        Ok(Process {
            child,
            name: name.to_owned(),
        })
    }

    pub(crate) fn pid(&self) -> anyhow::Result<u32> {
        self.child
            .id()
            .with_context(|| format!("{} has exited", self.name))
    }

    /// SIGTERM, then waits for the exit.
    pub(crate) async fn terminate(mut self) -> anyhow::Result<()> {
        let pid = self.pid()?;
        std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()?;
        tokio::time::timeout(Duration::from_secs(60), self.child.wait())
            .await
            .with_context(|| format!("{} did not exit within 60 s of SIGTERM", self.name))??;
        Ok(())
    }
}

/// Memory and CPU of a process, from /proc.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ProcSample {
    pub(crate) rss: u64,
    pub(crate) peak_rss: u64,
    cpu_ticks: u64,
}

pub(crate) fn proc_sample(pid: u32) -> ProcSample {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib = |key: &str| -> u64 {
        status
            .lines()
            .find_map(|line| line.strip_prefix(key))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0)
            * 1024
    };
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or("");
    let fields: Vec<&str> = after.split_whitespace().collect();
    let cpu_ticks = [11, 12]
        .iter()
        .filter_map(|i| fields.get(*i)?.parse::<u64>().ok())
        .sum();
    ProcSample {
        rss: kib("VmRSS:"),
        peak_rss: kib("VmHWM:"),
        cpu_ticks,
    }
}

/// Clock ticks per second of /proc/<pid>/stat (USER_HZ, 100 on Linux).
const TICKS_PER_SECOND: f64 = 100.0;

/// Waits for a file a child writes at start.
async fn wait_for_file(path: &Path) -> anyhow::Result<String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(text) = std::fs::read_to_string(path)
            && !text.is_empty()
        {
            return Ok(text);
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub(crate) fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// The controller: `capo-rs run` as users run it, on this budget.
pub(crate) fn start_controller(
    config: &ScaleConfig,
    kubeconfig: &Path,
    admin: u16,
    dir: &Path,
    name: &str,
    extra: &[String],
) -> anyhow::Result<Process> {
    let concurrency = config.concurrency.to_string();
    let args: Vec<String> = [
        "--log-level",
        "warn",
        "run",
        "--kubeconfig",
        &kubeconfig.display().to_string(),
        "--admin-address",
        &format!("127.0.0.1:{admin}"),
        "--insecure-metrics",
        "--openstack-qps",
        &config.openstack_qps.to_string(),
        "--openstack-burst",
        &config.openstack_burst.to_string(),
        "--kube-api-qps",
        "200",
        "--kube-api-burst",
        "400",
        "--openstackserver-concurrency",
        &concurrency,
        "--openstackcluster-concurrency",
        &concurrency,
        "--openstackmachine-concurrency",
        &concurrency,
    ]
    .iter()
    .map(|s| s.to_string())
    .chain(extra.iter().cloned())
    .collect();
    Process::spawn(&config.controller, name, &args, dir)
}

pub(crate) async fn wait_ready(http: &reqwest::Client, admin: u16) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let ready = http
            .get(format!("http://127.0.0.1:{admin}/readyz"))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success());
        if ready {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the controller never became ready"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `name{labels} value` lines of a Prometheus text exposition.
fn samples(text: &str) -> Vec<(String, BTreeMap<String, String>, f64)> {
    text.lines()
        .filter(|line| !line.starts_with('#') && !line.is_empty())
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let value: f64 = value.parse().ok()?;
            let (name, labels) = match series.split_once('{') {
                Some((name, rest)) => (name, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            let labels = labels
                .split("\",")
                .filter_map(|pair| {
                    let (key, value) = pair.split_once('=')?;
                    Some((key.trim().to_owned(), value.trim_matches('"').to_owned()))
                })
                .collect();
            Some((name.to_owned(), labels, value))
        })
        .collect()
}

fn sum(
    samples: &[(String, BTreeMap<String, String>, f64)],
    name: &str,
    label: Option<(&str, &str)>,
) -> f64 {
    samples
        .iter()
        .filter(|(n, labels, _)| {
            n == name && label.is_none_or(|(k, v)| labels.get(k).is_some_and(|x| x == v))
        })
        .map(|(_, _, value)| value)
        .sum()
}

/// p50 and p99 of each controller's reconcile time, from the histogram's buckets.
fn reconcile_times(
    samples: &[(String, BTreeMap<String, String>, f64)],
) -> BTreeMap<String, ReconcileTimes> {
    let mut buckets: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for (name, labels, value) in samples {
        if name != "controller_runtime_reconcile_time_seconds_bucket" {
            continue;
        }
        let (Some(controller), Some(le)) = (labels.get("controller"), labels.get("le")) else {
            continue;
        };
        let le = if le == "+Inf" {
            f64::INFINITY
        } else {
            le.parse().unwrap_or(f64::INFINITY)
        };
        buckets
            .entry(controller.clone())
            .or_default()
            .push((le, *value));
    }
    buckets
        .into_iter()
        .map(|(controller, mut buckets)| {
            buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
            let total = buckets.last().map_or(0.0, |b| b.1);
            let times = ReconcileTimes {
                reconciles: total,
                p50_seconds: quantile(&buckets, total, 0.5),
                p99_seconds: quantile(&buckets, total, 0.99),
            };
            (controller, times)
        })
        .collect()
}

/// The quantile by linear interpolation inside the bucket that holds it.
fn quantile(buckets: &[(f64, f64)], total: f64, q: f64) -> f64 {
    let rank = q * total;
    let mut previous = (0.0, 0.0);
    for &(le, count) in buckets {
        if count >= rank {
            if le.is_infinite() {
                return previous.0;
            }
            let within = if count > previous.1 {
                (rank - previous.1) / (count - previous.1)
            } else {
                1.0
            };
            return previous.0 + (le - previous.0) * within;
        }
        previous = (le, count);
    }
    previous.0
}

/// Windows of 1 to 60 s in which more requests arrived than a token bucket of `qps` and
/// `burst` lets through. The simulator counts arrivals, not sends: on a loaded machine a
/// request sent at the end of one second may be counted in the next, so each window is
/// allowed one second of `qps` for that jitter.
/// Windows over the budget `config` gives each service, summed over the services.
pub(crate) fn windows_over_the_budget(
    per_service: &BTreeMap<String, BTreeMap<u64, u64>>,
    config: &ScaleConfig,
) -> u64 {
    per_service
        .values()
        .map(|seconds| {
            windows_over_budget(
                seconds,
                u64::from(config.openstack_qps),
                u64::from(config.openstack_burst),
            )
        })
        .sum()
}

pub fn windows_over_budget(per_second: &BTreeMap<u64, u64>, qps: u64, burst: u64) -> u64 {
    let (Some(first), Some(last)) = (per_second.keys().next(), per_second.keys().last()) else {
        return 0;
    };
    let counts: Vec<u64> = (*first..=*last)
        .map(|s| per_second.get(&s).copied().unwrap_or(0))
        .collect();
    let mut over = 0;
    for width in 1..=60usize.min(counts.len()) {
        let allowed = burst + qps * (width as u64 + 1);
        let mut window: u64 = counts[..width].iter().sum();
        if window > allowed {
            over += 1;
        }
        for end in width..counts.len() {
            window = window + counts[end] - counts[end - width];
            if window > allowed {
                over += 1;
            }
        }
    }
    over
}

/// The simulated cloud's arrivals per second, by service.
pub(crate) fn per_service_seconds(log: &serde_json::Value) -> BTreeMap<String, BTreeMap<u64, u64>> {
    let Some(services) = log.as_object() else {
        return BTreeMap::new();
    };
    services
        .iter()
        .map(|(service, seconds)| {
            let counts = seconds
                .as_object()
                .into_iter()
                .flatten()
                .filter_map(|(s, n)| Some((s.parse().ok()?, n.as_u64()?)))
                .collect();
            (service.clone(), counts)
        })
        .collect()
}

/// When each part of "every verdict known" was first seen after a restart, in seconds from
/// the old controller's stop: what binds the restart.
#[derive(Clone, Copy, Debug, Default)]
struct Milestones {
    /// The old controller exited (SIGTERM, reconciles in flight finished, held writes made).
    stopped: Option<f64>,
    /// `/readyz` answered: leading, its caches listed.
    ready: Option<f64>,
    /// As many OpenStackCluster reconciles as clusters (the count, not each cluster's own).
    reconciled: Option<f64>,
    gates_open: Option<f64>,
    members_active: Option<f64>,
}

impl std::fmt::Display for Milestones {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let at = |mark: Option<f64>| mark.map_or("-".to_owned(), |s| format!("{s:.1} s"));
        write!(
            f,
            "the old one exited {}, ready {}, as many cluster passes as clusters {}, every gate open {}, every member ACTIVE {}",
            at(self.stopped),
            at(self.ready),
            at(self.reconciled),
            at(self.gates_open),
            at(self.members_active)
        )
    }
}

/// Both simulators' request counts at one moment.
#[derive(Clone, Debug, Default)]
pub(crate) struct Requests {
    pub(crate) kube: f64,
    pub(crate) openstack: f64,
    at: Option<Instant>,
}

pub(crate) struct Sims {
    http: reqwest::Client,
    /// The simulated API server (its request log), or `None` on a real one.
    pub(crate) kube_url: Option<String>,
    pub(crate) openstack_url: String,
    /// On a real API server: the controller's admin port, whose `capo_kube_requests_total`
    /// counts its requests, and what the controllers before a restart had counted.
    pub(crate) controller_admin: std::sync::Mutex<Option<u16>>,
    counted_before: std::sync::Mutex<f64>,
}

impl Sims {
    pub(crate) async fn get(&self, url: String) -> anyhow::Result<Value> {
        let text = self
            .http
            .get(url)
            .send()
            .await?
            .error_for_status()?
            .text()
            .await?;
        Ok(serde_json::from_str(&text)?)
    }

    /// The controller's requests (by its User-Agent) to Kubernetes, and every request to
    /// OpenStack (only the controller talks to it).
    pub(crate) async fn requests(&self) -> anyhow::Result<Requests> {
        let controller = match &self.kube_url {
            Some(url) => {
                let kube = self.get(format!("{url}/_sim/requests")).await?;
                kube["by_client_verb"]
                    .as_object()
                    .map(|counts| {
                        counts
                            .iter()
                            .filter(|(key, _)| key.starts_with("capo-rs "))
                            .filter_map(|(_, n)| n.as_f64())
                            .sum()
                    })
                    .unwrap_or(0.0)
            }
            None => self.counted_before() + self.controller_counts().await?.values().sum::<f64>(),
        };
        let openstack = self
            .get(format!("{}/_sim/requests", self.openstack_url))
            .await?;
        Ok(Requests {
            kube: controller,
            openstack: openstack["total"].as_f64().unwrap_or(0.0),
            at: Some(Instant::now()),
        })
    }
}

impl Sims {
    fn counted_before(&self) -> f64 {
        self.counted_before.lock().map(|n| *n).unwrap_or_default()
    }

    /// The running controller's `capo_kube_requests_total`, by verb.
    pub(crate) async fn controller_counts(&self) -> anyhow::Result<BTreeMap<String, f64>> {
        let port = self
            .controller_admin
            .lock()
            .ok()
            .and_then(|p| *p)
            .context("no controller to ask")?;
        let text = self
            .http
            .get(format!("http://127.0.0.1:{port}/metrics"))
            .send()
            .await?
            .text()
            .await?;
        Ok(samples(&text)
            .into_iter()
            .filter(|(name, _, _)| name == "capo_kube_requests_total")
            .map(|(_, labels, n)| (labels.get("verb").cloned().unwrap_or_default(), n))
            .collect())
    }

    /// The simulated cloud's requests so far, by operation.
    async fn by_operation(&self) -> anyhow::Result<BTreeMap<String, u64>> {
        let log = self
            .get(format!("{}/_sim/requests", self.openstack_url))
            .await?;
        Ok(by_operation(&log))
    }

    /// Before a controller stops: what it counted carries over to its successor's count.
    pub(crate) async fn carry_over(&self) -> anyhow::Result<()> {
        if self.kube_url.is_none() {
            let counted: f64 = self.controller_counts().await?.values().sum();
            if let Ok(mut before) = self.counted_before.lock() {
                *before += counted;
            }
        }
        Ok(())
    }
}

fn by_operation(log: &Value) -> BTreeMap<String, u64> {
    serde_json::from_value(log["by_operation"].clone()).unwrap_or_default()
}

/// What each count gained from `before` to `after` (those that did not are left out).
fn growth(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    after
        .iter()
        .map(|(key, n)| {
            (
                key.clone(),
                n.saturating_sub(before.get(key).copied().unwrap_or(0)),
            )
        })
        .filter(|(_, n)| *n > 0)
        .collect()
}

fn rates(from: &Requests, to: &Requests) -> (f64, f64) {
    let seconds = match (from.at, to.at) {
        (Some(a), Some(b)) => b.duration_since(a).as_secs_f64().max(1e-3),
        _ => 1.0,
    };
    (
        (to.kube - from.kube) / seconds,
        (to.openstack - from.openstack) / seconds,
    )
}

pub(crate) fn machine_template() -> OpenStackMachineSpec {
    serde_json::from_value(json!({
        "flavor": {"filter": {"name": "m1.small"}},
        "image": {"filter": {"name": "ubuntu-2404-kube-v1.33.4"}},
    }))
    .unwrap_or_default()
}

pub(crate) fn cluster_name(index: u32) -> String {
    format!("scale-{index:04}")
}

/// The benchmark's Cluster API: KCP and MachineDeployments played by the actor.
pub(crate) fn start_actor(client: &kube::Client) -> CapiActor {
    CapiActor::start(
        client.clone(),
        CapiActorConfig {
            namespace: NAMESPACE.into(),
            tick: Duration::from_secs(5),
            join_delay: Duration::from_secs(1),
            wait_timeout: Duration::from_secs(3600),
        },
        CancellationToken::new(),
    )
}

/// Every cluster's workers and control plane (one machine at a time, as KCP), until each
/// worker has joined.
pub(crate) async fn bring_up(
    actor: &CapiActor,
    clusters: &[String],
    config: &ScaleConfig,
) -> anyhow::Result<()> {
    let brought_up = futures::stream::iter(clusters.iter())
        .map(|name| async move {
            let workers = actor
                .create_workers(name, config.workers as usize, machine_template())
                .await?;
            actor
                .scale_control_plane(&plane(name.clone(), config.control_plane))
                .await?;
            for worker in &workers {
                actor.wait_joined(worker).await?;
            }
            Ok::<_, capo_sim::capi::ActorError>(())
        })
        .buffer_unordered(clusters.len().max(1))
        .collect::<Vec<_>>()
        .await;
    let failed = brought_up.iter().filter(|r| r.is_err()).count();
    anyhow::ensure!(
        failed == 0,
        "{failed} clusters never came up: {:?}",
        brought_up.iter().find(|r| r.is_err())
    );
    Ok(())
}

/// A Cluster and its OpenStackCluster, labelled for `shard` (`--watch-filter`) when given.
pub(crate) async fn create_cluster(
    client: &kube::Client,
    name: &str,
    shard: Option<&str>,
) -> anyhow::Result<()> {
    let clusters: Api<Cluster> = Api::namespaced(client.clone(), NAMESPACE);
    let mut labels = json!({capo_api::capi::labels::CLUSTER_NAME: name});
    if let Some(shard) = shard {
        labels[capo_api::capi::labels::WATCH_FILTER] = json!(shard);
    }
    let cluster: Cluster = serde_json::from_value(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels},
        "spec": {"infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io",
                                        "kind": "OpenStackCluster", "name": name}}
    }))?;
    clusters.create(&PostParams::default(), &cluster).await?;
    // No router and no floating IP: a thousand of either would not fit the simulated
    // external network's /24.
    let infrastructure: OpenStackCluster = serde_json::from_value(json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "OpenStackCluster",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels},
        "spec": {
            "apiServer": {"managedLoadBalancer": {"enabled": true}, "enableFloatingIP": false},
            "enableExternalNetwork": false,
            "identityRef": {"name": "cloud-config", "cloudName": "sim"},
            "managedSecurityGroups": {"allowAllInClusterTraffic": true},
            "managedSubnets": [{"cidr": "10.6.0.0/24"}],
        },
    }))?;
    let api: Api<OpenStackCluster> = Api::namespaced(client.clone(), NAMESPACE);
    api.create(&PostParams::default(), &infrastructure).await?;
    Ok(())
}

/// Until every OpenStackCluster reports provisioned: the machines come after, so the requests
/// until then are the clusters' own.
pub(crate) async fn wait_clusters_provisioned(
    client: &kube::Client,
    clusters: u32,
) -> anyhow::Result<()> {
    let api: Api<OpenStackCluster> = Api::namespaced(client.clone(), NAMESPACE);
    let started = Instant::now();
    loop {
        let listed = api.list(&kube::api::ListParams::default()).await?;
        let provisioned = listed
            .items
            .iter()
            .filter(|c| {
                capo_api::common::Initialization::is_provisioned(
                    c.status.as_ref().and_then(|s| s.initialization.as_ref()),
                )
            })
            .count();
        if provisioned >= clusters as usize {
            return Ok(());
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(1800),
            "{provisioned} of {clusters} clusters provisioned after 1800 s"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

pub(crate) fn plane(cluster: String, replicas: u32) -> ControlPlane {
    ControlPlane {
        cluster,
        replicas: replicas as usize,
        template: machine_template(),
        version: "v1.33.4".into(),
        failure_domains: Vec::new(),
    }
}

/// Samples the controller's memory every second, keeping the peak.
fn watch_memory(
    pid: Arc<AtomicU64>,
    peak: Arc<AtomicU64>,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            let sample = proc_sample(pid.load(Ordering::Relaxed) as u32);
            peak.fetch_max(sample.peak_rss.max(sample.rss), Ordering::Relaxed);
        }
    })
}

/// Plays the whole benchmark; `say` reports progress.
/// Both simulators in processes of their own, and a client of the simulated API server with
/// the cloud's Secret in place.
pub(crate) struct Stage {
    _kube: Option<Process>,
    _openstack: Process,
    pub(crate) dir: PathBuf,
    pub(crate) kubeconfig: PathBuf,
    pub(crate) http: reqwest::Client,
    pub(crate) sims: Sims,
    pub(crate) client: kube::Client,
}

impl Stage {
    pub(crate) async fn start(config: &ScaleConfig) -> anyhow::Result<Stage> {
        // One directory per stage: two benches in one process (the tests) must not share
        // the simulator's clouds.yaml, nor remove each other's.
        static STAGES: AtomicU64 = AtomicU64::new(0);
        let stage = STAGES.fetch_add(1, Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("capo-rs-scale-{}-{stage}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let clouds = dir.join("clouds.yaml");
        if let Some(tier) = &config.kube_tier {
            let openstack = spawn_openstack(config, &clouds, &dir)?;
            let clouds_yaml = wait_for_file(&clouds).await?;
            let client = client_from(&tier.join("admin.kubeconfig")).await?;
            install_crds(&client).await?;
            return Stage::staged(
                None,
                openstack,
                dir,
                tier.join("capo-rs.kubeconfig"),
                None,
                &clouds_yaml,
                client,
            )
            .await;
        }
        let kubeconfig = dir.join("kubeconfig");
        let kube = Process::spawn(
            &config.binary,
            "sim-kube",
            &[
                "--log-level".into(),
                "error".into(),
                "sim".into(),
                "kube".into(),
                "--listen".into(),
                "127.0.0.1:0".into(),
                "--kubeconfig-out".into(),
                kubeconfig.display().to_string(),
                "--with-crds".into(),
            ],
            &dir,
        )?;
        let openstack = spawn_openstack(config, &clouds, &dir)?;
        let kubeconfig_text = wait_for_file(&kubeconfig).await?;
        let clouds_yaml = wait_for_file(&clouds).await?;
        let kube_url = kubeconfig_text
            .lines()
            .find_map(|line| line.trim().strip_prefix("server: "))
            .context("no server in the kubeconfig")?
            .trim()
            .to_owned();
        let client = client_from(&kubeconfig).await?;
        Stage::staged(
            Some(kube),
            openstack,
            dir,
            kubeconfig,
            Some(kube_url),
            &clouds_yaml,
            client,
        )
        .await
    }

    async fn staged(
        kube: Option<Process>,
        openstack: Process,
        dir: PathBuf,
        kubeconfig: PathBuf,
        kube_url: Option<String>,
        clouds_yaml: &str,
        client: kube::Client,
    ) -> anyhow::Result<Stage> {
        let openstack_url = clouds_yaml
            .lines()
            .find_map(|line| line.trim().strip_prefix("auth_url: "))
            .and_then(|url| url.trim().strip_suffix("/identity/v3"))
            .context("no auth_url in clouds.yaml")?
            .to_owned();
        let http = reqwest::Client::new();
        let sims = Sims {
            http: http.clone(),
            kube_url,
            openstack_url,
            controller_admin: std::sync::Mutex::new(None),
            counted_before: std::sync::Mutex::new(0.0),
        };
        put_cloud_secret(&client, clouds_yaml).await?;
        Ok(Stage {
            _kube: kube,
            _openstack: openstack,
            dir,
            kubeconfig,
            http,
            sims,
            client,
        })
    }
}

fn spawn_openstack(config: &ScaleConfig, clouds: &Path, dir: &Path) -> anyhow::Result<Process> {
    Process::spawn(
        &config.binary,
        "sim-openstack",
        &[
            "--log-level".into(),
            "error".into(),
            "sim".into(),
            "openstack".into(),
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--clouds-yaml-out".into(),
            clouds.display().to_string(),
        ],
        dir,
    )
}

async fn client_from(kubeconfig: &Path) -> anyhow::Result<kube::Client> {
    let file = kube::config::Kubeconfig::read_from(kubeconfig)
        .with_context(|| kubeconfig.display().to_string())?;
    let options = kube::config::KubeConfigOptions::default();
    Ok(kube::Client::try_from(
        kube::Config::from_custom_kubeconfig(file, &options).await?,
    )?)
}

/// Our CRDs and Cluster API's on a real API server (server-side, taking them over), each
/// established before the run starts.
async fn install_crds(client: &kube::Client) -> anyhow::Result<()> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let apply = kube::api::PatchParams::apply("capo-rs-bench").force();
    for crd in capo_api::crds::all()
        .into_iter()
        .chain(capo_api::capi::crds())
    {
        let name = crd.metadata.name.clone().unwrap_or_default();
        crds.patch(&name, &apply, &kube::api::Patch::Apply(&crd))
            .await
            .with_context(|| format!("CRD {name}"))?;
        let established = kube::runtime::wait::await_condition(
            crds.clone(),
            &name,
            kube::runtime::wait::conditions::is_crd_established(),
        );
        tokio::time::timeout(Duration::from_secs(60), established)
            .await
            .with_context(|| format!("CRD {name} not established in 60 s"))??;
    }
    Ok(())
}

pub async fn run(config: ScaleConfig, say: &(dyn Fn(&str) + Sync)) -> anyhow::Result<ScaleReport> {
    let stage = Stage::start(&config).await?;
    let (dir, kubeconfig, http, sims, client) = (
        stage.dir.clone(),
        stage.kubeconfig.clone(),
        stage.http.clone(),
        &stage.sims,
        stage.client.clone(),
    );
    let admin = free_port()?;
    let controller = start_controller(&config, &kubeconfig, admin, &dir, "controller", &[])?;
    wait_ready(&http, admin).await?;
    if let Ok(mut port) = sims.controller_admin.lock() {
        *port = Some(admin);
    }
    let pid = Arc::new(AtomicU64::new(u64::from(controller.pid()?)));
    let mut report = ScaleReport {
        config: Some(config.clone()),
        idle_rss_bytes: proc_sample(controller.pid()?).rss,
        ..ScaleReport::default()
    };
    let peak = Arc::new(AtomicU64::new(0));
    let stop_memory = CancellationToken::new();
    let memory = watch_memory(pid.clone(), peak.clone(), stop_memory.clone());

    // Bring-up: every cluster, then its machines, the control plane one at a time as KCP.
    let started = Instant::now();
    let before = sims.requests().await?;
    let names: Vec<String> = (0..config.clusters).map(cluster_name).collect();
    futures::stream::iter(names.iter())
        .map(|name| create_cluster(&client, name, None))
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<anyhow::Result<Vec<()>>>()?;
    wait_clusters_provisioned(&client, config.clusters).await?;
    let clusters_up = sims.requests().await?;
    report.openstack_requests_per_cluster_created =
        (clusters_up.openstack - before.openstack) / f64::from(config.clusters.max(1));
    say(&format!(
        "{} clusters provisioned, {:.1} OpenStack requests each",
        config.clusters, report.openstack_requests_per_cluster_created
    ));
    let actor = start_actor(&client);
    bring_up(&actor, &names, &config).await?;
    report.bring_up_seconds = started.elapsed().as_secs_f64();
    let up = sims.requests().await?;
    let (kube_rate, openstack_rate) = rates(&before, &up);
    report
        .kube_requests_per_second
        .insert("bring-up".into(), kube_rate);
    report
        .openstack_requests_per_second
        .insert("bring-up".into(), openstack_rate);
    say(&format!(
        "{} machines up in {:.0} s",
        config.clusters * (config.control_plane + config.workers),
        report.bring_up_seconds
    ));

    // Steady state: settle, then measure.
    tokio::time::sleep(Duration::from_secs(30)).await;
    let cpu_before = proc_sample(controller.pid()?);
    let steady_start = sims.requests().await?;
    let measured = Instant::now();
    tokio::time::sleep(config.steady).await;
    let cpu_after = proc_sample(controller.pid()?);
    let steady_end = sims.requests().await?;
    let cpu_seconds =
        cpu_after.cpu_ticks.saturating_sub(cpu_before.cpu_ticks) as f64 / TICKS_PER_SECOND;
    report.steady_cpu_share = cpu_seconds / measured.elapsed().as_secs_f64();
    report.steady_rss_bytes = cpu_after.rss;
    let (kube_rate, openstack_rate) = rates(&steady_start, &steady_end);
    report
        .kube_requests_per_second
        .insert("steady".into(), kube_rate);
    report
        .openstack_requests_per_second
        .insert("steady".into(), openstack_rate);
    let machines = u64::from(config.clusters) * u64::from(config.control_plane + config.workers);
    report.machines = machines;
    report.watched_objects = 2 * u64::from(config.clusters) + 3 * machines + 1;
    report.bytes_per_watched_object = report
        .steady_rss_bytes
        .saturating_sub(report.idle_rss_bytes) as f64
        / report.watched_objects as f64;
    say(&format!(
        "steady: RSS {} MiB, CPU {:.1}% of a core",
        report.steady_rss_bytes >> 20,
        report.steady_cpu_share * 100.0
    ));

    // Rolling replacements on a share of the clusters.
    let rolled =
        ((f64::from(config.clusters) * config.rollout_share).ceil() as usize).min(names.len());
    let rollout_start = Instant::now();
    let rolling = futures::stream::iter(names.iter().take(rolled))
        .map(|name| {
            let actor = &actor;
            async move {
                actor
                    .rollout(&plane(name.clone(), config.control_plane), |_| {})
                    .await
            }
        })
        .buffer_unordered(rolled.max(1))
        .collect::<Vec<_>>()
        .await;
    let failed = rolling.iter().filter(|r| r.is_err()).count();
    anyhow::ensure!(
        failed == 0,
        "{failed} rollouts failed: {:?}",
        rolling.iter().find(|r| r.is_err())
    );
    report.rollout_seconds = rollout_start.elapsed().as_secs_f64();
    report.clusters_rolled = rolled as u64;
    let rolled_requests = sims.requests().await?;
    let (kube_rate, openstack_rate) = rates(&steady_end, &rolled_requests);
    report
        .kube_requests_per_second
        .insert("rollouts".into(), kube_rate);
    report
        .openstack_requests_per_second
        .insert("rollouts".into(), openstack_rate);
    say(&format!(
        "{rolled} control planes rolled in {:.0} s",
        report.rollout_seconds
    ));

    // The first controller's own figures, then the restart.
    let metrics = http
        .get(format!("http://127.0.0.1:{admin}/metrics"))
        .send()
        .await?
        .text()
        .await?;
    report.reconcile_times = reconcile_times(&samples(&metrics));
    let restarts = Restarts {
        config: &config,
        kubeconfig: &kubeconfig,
        admin,
        dir: &dir,
        sims,
        http: &http,
        client: &client,
        pid: &pid,
    };
    let before_restart = sims.by_operation().await?;
    let (controller, restarted) = restarts
        .restart(controller, "controller-restarted", &[])
        .await?;
    report.openstack_requests_in_restart = growth(&before_restart, &sims.by_operation().await?);
    report.restart_to_verdicts_seconds = restarted.to_verdicts;
    report.change_during_restart_seconds = restarted.change;
    say(&format!(
        "restart to every verdict known: {:.1} s; a change made meanwhile reconciled in {:.1} s ({})",
        restarted.to_verdicts, restarted.change, restarted.milestones
    ));
    let after_restart = sims.requests().await?;
    let (kube_rate, openstack_rate) = rates(&rolled_requests, &after_restart);
    report
        .kube_requests_per_second
        .insert("restart".into(), kube_rate);
    report
        .openstack_requests_per_second
        .insert("restart".into(), openstack_rate);

    stop_memory.cancel();
    memory.await?;
    report.peak_rss_bytes = peak.load(Ordering::Relaxed);
    let log = sims
        .get(format!("{}/_sim/requests", sims.openstack_url))
        .await?;
    report.openstack_requests_by_operation = by_operation(&log);
    report.kube_requests_by_resource = match &sims.kube_url {
        Some(url) => {
            let kube_log = sims.get(format!("{url}/_sim/requests")).await?;
            kube_log["by_client_verb_resource"]
                .as_object()
                .map(|counts| {
                    counts
                        .iter()
                        .filter_map(|(key, n)| {
                            Some((key.strip_prefix("capo-rs ")?.to_owned(), n.as_u64()?))
                        })
                        .collect()
                })
                .unwrap_or_default()
        }
        // The restarted controller's own count, by verb (a real server keeps no log by client).
        None => sims
            .controller_counts()
            .await?
            .into_iter()
            .map(|(verb, n)| (format!("{verb} (after the restart)"), n as u64))
            .collect(),
    };
    let per_service = per_service_seconds(&log["per_service_second"]);
    report.openstack_peak_per_second_by_service = per_service
        .iter()
        .map(|(service, seconds)| {
            let peak = seconds.values().copied().max().unwrap_or(0);
            (service.clone(), peak)
        })
        .collect();
    report.openstack_peak_per_second = report
        .openstack_peak_per_second_by_service
        .values()
        .copied()
        .max()
        .unwrap_or(0);
    report.openstack_budget_per_second = u64::from(config.openstack_qps + config.openstack_burst);
    report.openstack_windows_over_budget = windows_over_the_budget(&per_service, &config);
    // Last, so the figures above are of the default: the same restart with the gate off and
    // on in turn.
    report.priority_restarts.push(PriorityRestart {
        priority_queue: true,
        restart_seconds: restarted.to_verdicts,
        change_seconds: restarted.change,
    });
    let mut controller = controller;
    for turn in 1..config.priority_restarts.max(1) * 2 {
        let on = turn % 2 == 0;
        let gates = if on {
            Vec::new()
        } else {
            vec![
                "--feature-gates".to_owned(),
                "PriorityQueue=false".to_owned(),
            ]
        };
        let name = format!("controller-restart-{turn}");
        let (next, restarted) = restarts.restart(controller, &name, &gates).await?;
        controller = next;
        say(&format!(
            "PriorityQueue={on}: restart {:.1} s; the change reconciled in {:.1} s ({})",
            restarted.to_verdicts, restarted.change, restarted.milestones
        ));
        report.priority_restarts.push(PriorityRestart {
            priority_queue: on,
            restart_seconds: restarted.to_verdicts,
            change_seconds: restarted.change,
        });
    }
    (
        report.restart_without_priority_seconds,
        report.change_during_restart_without_priority_seconds,
    ) = report.priority_medians(false);
    actor.stop().await;
    controller.terminate().await?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(report)
}

/// What a restart of the controller is measured with.
struct Restarts<'a> {
    config: &'a ScaleConfig,
    kubeconfig: &'a Path,
    admin: u16,
    dir: &'a Path,
    sims: &'a Sims,
    http: &'a reqwest::Client,
    client: &'a kube::Client,
    pid: &'a AtomicU64,
}

/// One restart's figures.
struct Restarted {
    /// What the restart waited on.
    milestones: Milestones,
    to_verdicts: f64,
    change: f64,
}

impl Restarts<'_> {
    /// Stops `controller`, starts another with `extra` arguments, and times it to every
    /// verdict known and a change made as soon as it is ready (see
    /// [`ScaleReport::change_during_restart_seconds`]).
    async fn restart(
        &self,
        controller: Process,
        name: &str,
        extra: &[String],
    ) -> anyhow::Result<(Process, Restarted)> {
        let restart = Instant::now();
        self.sims.carry_over().await?;
        controller.terminate().await?;
        let stopped = restart.elapsed().as_secs_f64();
        let controller = start_controller(
            self.config,
            self.kubeconfig,
            self.admin,
            self.dir,
            name,
            extra,
        )?;
        self.pid
            .store(u64::from(controller.pid()?), Ordering::Relaxed);
        let (verdicts, change) = tokio::join!(
            self.every_verdict_known(restart),
            self.change_reconciled(name)
        );
        let milestones = Milestones {
            stopped: Some(stopped),
            ..verdicts?
        };
        let restarted = Restarted {
            milestones,
            to_verdicts: restart.elapsed().as_secs_f64(),
            change: change?,
        };
        Ok((controller, restarted))
    }

    /// Waits until every verdict is known again after the restart that began at `restart`;
    /// when each part of that was first seen.
    async fn every_verdict_known(&self, restart: Instant) -> anyhow::Result<Milestones> {
        let (config, http, admin) = (self.config, self.http, self.admin);
        let members = f64::from(config.clusters * config.control_plane);
        let mut seen = Milestones::default();
        loop {
            let ready = http
                .get(format!("http://127.0.0.1:{admin}/readyz"))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
            let text = http
                .get(format!("http://127.0.0.1:{admin}/metrics"))
                .send()
                .await
                .ok();
            let text = match text {
                Some(response) => response.text().await.unwrap_or_default(),
                None => String::new(),
            };
            let now = samples(&text);
            let gates_open = sum(&now, "capo_lb_gate_ready", None);
            let active = sum(&now, "capo_lb_members", Some(("verdict", "Active")));
            let reconciled = sum(
                &now,
                "controller_runtime_reconcile_total",
                Some(("controller", "openstackcluster")),
            );
            let clusters = f64::from(config.clusters);
            let at = restart.elapsed().as_secs_f64();
            let first = |mark: &mut Option<f64>, reached: bool| {
                if reached && mark.is_none() {
                    *mark = Some(at);
                }
            };
            first(&mut seen.ready, ready);
            first(&mut seen.reconciled, reconciled >= clusters);
            first(&mut seen.gates_open, gates_open >= clusters);
            first(&mut seen.members_active, active >= members);
            if seen.reconciled.is_some()
                && seen.gates_open.is_some()
                && seen.members_active.is_some()
            {
                return Ok(seen);
            }
            anyhow::ensure!(
                restart.elapsed() < Duration::from_secs(900),
                "after the restart, verdicts were still unknown after 900 s: {gates_open} gates open, {active} members ACTIVE"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Once the controller is ready (its first lists done, all of it queued), a new
    /// OpenStackServer on the first cluster's network: seconds until capo-rs made its server.
    async fn change_reconciled(&self, name: &str) -> anyhow::Result<f64> {
        wait_ready(self.http, self.admin).await?;
        let clusters: Api<OpenStackCluster> = Api::namespaced(self.client.clone(), NAMESPACE);
        let first = clusters.get(&cluster_name(0)).await?;
        let network = first
            .status
            .and_then(|s| s.network)
            .map(|n| n.id)
            .context("the first cluster has no network")?;
        let servers: Api<OpenStackServer> = Api::namespaced(self.client.clone(), NAMESPACE);
        let probe: OpenStackServer = serde_json::from_value(json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
            "kind": "OpenStackServer",
            "metadata": {"name": format!("probe-{name}"), "namespace": NAMESPACE},
            "spec": {
                "flavor": "m1.small",
                "image": {"filter": {"name": "ubuntu-2404-kube-v1.33.4"}},
                "identityRef": {"name": "cloud-config", "cloudName": "sim"},
                "sshKeyName": "capo",
                "ports": [{"network": {"id": network}}],
            }
        }))?;
        servers.create(&PostParams::default(), &probe).await?;
        let created = Instant::now();
        loop {
            let made = servers
                .get(&probe.name_any())
                .await?
                .status
                .and_then(|s| s.instance_id)
                .is_some_and(|id| !id.is_empty());
            if made {
                return Ok(created.elapsed().as_secs_f64());
            }
            anyhow::ensure!(
                created.elapsed() < Duration::from_secs(900),
                "the server made during the restart was not made within 900 s"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl ScaleReport {
    pub fn print(&self) {
        let mib = |bytes: u64| bytes as f64 / (1024.0 * 1024.0);
        println!(
            "scale: {} machines ({} watched objects)",
            self.machines, self.watched_objects
        );
        println!(
            "bring-up {:.0} s; {} control planes rolled in {:.0} s",
            self.bring_up_seconds, self.clusters_rolled, self.rollout_seconds
        );
        println!("\n{:<44} {:>12} {:>12}", "figure", "measured", "target");
        println!(
            "{:<44} {:>10.1} MiB {:>12}",
            "controller peak RSS",
            mib(self.peak_rss_bytes),
            "<= 100 MiB"
        );
        println!(
            "{:<44} {:>10.1} MiB {:>12}",
            "controller steady RSS",
            mib(self.steady_rss_bytes),
            "<= 100 MiB"
        );
        println!(
            "{:<44} {:>10.1} MiB",
            "controller idle RSS (before any cluster)",
            mib(self.idle_rss_bytes)
        );
        println!(
            "{:<44} {:>12.0}",
            "bytes per watched object", self.bytes_per_watched_object
        );
        println!(
            "{:<44} {:>11.2}% {:>12}",
            "steady CPU (share of one core)",
            self.steady_cpu_share * 100.0,
            "< 5%"
        );
        println!(
            "{:<44} {:>12} {:>12}",
            "OpenStack peak requests to one service in 1 s",
            self.openstack_peak_per_second,
            format!("<= {}", self.openstack_budget_per_second)
        );
        println!(
            "{:<44} {:>12} {:>12}",
            "windows over a service's OpenStack budget", self.openstack_windows_over_budget, "0"
        );
        println!(
            "{:<44} {:>12.1} {:>12}",
            "OpenStack requests per cluster created",
            self.openstack_requests_per_cluster_created,
            "<= 35"
        );
        for (service, peak) in &self.openstack_peak_per_second_by_service {
            println!("  {:<42} {peak:>12}", format!("peak in 1 s: {service}"));
        }
        println!(
            "{:<44} {:>10.1} s {:>12}",
            "restart to every verdict known", self.restart_to_verdicts_seconds, "<= 120 s"
        );
        println!(
            "{:<44} {:>10.1} s {:>12}",
            "a change during the restart reconciled in",
            self.change_during_restart_seconds,
            format!(
                "{:.1} s off",
                self.change_during_restart_without_priority_seconds
            )
        );
        println!(
            "{:<44} {:>10.1} s",
            "restart with PriorityQueue=false", self.restart_without_priority_seconds
        );
        for on in [true, false] {
            let (restart, change) = self.priority_medians(on);
            let samples: Vec<String> = self
                .priority_restarts
                .iter()
                .filter(|r| r.priority_queue == on)
                .map(|r| format!("{:.1}/{:.1}", r.restart_seconds, r.change_seconds))
                .collect();
            println!(
                "  {:<42} {restart:>6.1} s / {change:.1} s (restart/change: {})",
                format!("PriorityQueue={on}, medians"),
                samples.join(", ")
            );
        }
        println!(
            "\n{:<20} {:>12} {:>12} {:>12}",
            "reconciles", "count", "p50 ms", "p99 ms"
        );
        for (controller, times) in &self.reconcile_times {
            println!(
                "{controller:<20} {:>12.0} {:>12.1} {:>12.1}",
                times.reconciles,
                times.p50_seconds * 1e3,
                times.p99_seconds * 1e3
            );
        }
        println!(
            "\n{:<12} {:>16} {:>20}",
            "phase", "Kubernetes req/s", "OpenStack req/s"
        );
        for phase in ["bring-up", "steady", "rollouts", "restart"] {
            println!(
                "{phase:<12} {:>16.1} {:>20.1}",
                self.kube_requests_per_second
                    .get(phase)
                    .copied()
                    .unwrap_or(0.0),
                self.openstack_requests_per_second
                    .get(phase)
                    .copied()
                    .unwrap_or(0.0)
            );
        }
        println!("\nOpenStack requests by operation:");
        let mut operations: Vec<_> = self.openstack_requests_by_operation.iter().collect();
        operations.sort_by(|a, b| b.1.cmp(a.1));
        for (operation, count) in operations.iter().take(15) {
            println!("  {operation:<48} {count:>10}");
        }
        println!("\nOpenStack requests by operation, in the first restart:");
        let mut operations: Vec<_> = self.openstack_requests_in_restart.iter().collect();
        operations.sort_by(|a, b| b.1.cmp(a.1));
        for (operation, count) in operations {
            println!("  {operation:<48} {count:>10}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_phase_counts_only_what_grew_in_it() {
        let counts = |pairs: &[(&str, u64)]| {
            pairs
                .iter()
                .map(|(k, n)| (k.to_string(), *n))
                .collect::<BTreeMap<_, _>>()
        };
        let before = counts(&[("a", 5), ("b", 2)]);
        let after = counts(&[("a", 9), ("b", 2), ("c", 1)]);
        assert_eq!(growth(&before, &after), counts(&[("a", 4), ("c", 1)]));
    }

    #[test]
    fn priority_medians_are_taken_per_gate_setting() {
        let restart = |priority_queue, restart_seconds, change_seconds| PriorityRestart {
            priority_queue,
            restart_seconds,
            change_seconds,
        };
        let report = ScaleReport {
            priority_restarts: vec![
                restart(true, 3.0, 0.3),
                restart(false, 10.0, 8.0),
                restart(true, 5.0, 0.5),
                restart(false, 12.0, 6.0),
                restart(true, 4.0, 0.1),
            ],
            ..ScaleReport::default()
        };
        assert_eq!(report.priority_medians(true), (4.0, 0.3));
        assert_eq!(report.priority_medians(false), (11.0, 7.0));
        assert!(ScaleReport::default().priority_medians(true).0.is_nan());
    }

    #[test]
    fn quantiles_interpolate_inside_their_bucket() {
        let buckets = [
            (0.01, 50.0),
            (0.1, 90.0),
            (1.0, 100.0),
            (f64::INFINITY, 100.0),
        ];
        assert!((quantile(&buckets, 100.0, 0.5) - 0.01).abs() < 1e-9);
        assert!((quantile(&buckets, 100.0, 0.99) - 0.91).abs() < 1e-9);
        assert_eq!(quantile(&[], 0.0, 0.5), 0.0);
    }

    #[test]
    fn the_exposition_is_read_with_its_labels() {
        let text = "# HELP x y\nreqs{controller=\"a\",result=\"success\"} 3\nreqs{controller=\"b\",result=\"error\"} 4\nup 1\n";
        let parsed = samples(text);
        assert_eq!(sum(&parsed, "reqs", None), 7.0);
        assert_eq!(sum(&parsed, "reqs", Some(("controller", "b"))), 4.0);
        assert_eq!(sum(&parsed, "up", None), 1.0);
    }

    #[test]
    fn a_window_over_the_token_bucket_is_counted() {
        let steady = BTreeMap::from([(0, 30), (1, 10), (2, 10)]);
        assert_eq!(windows_over_budget(&steady, 10, 20), 0);
        let burst = BTreeMap::from([(0, 41), (1, 10)]);
        assert_eq!(windows_over_budget(&burst, 10, 20), 2);
    }
}
