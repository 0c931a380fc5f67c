//! A small Cluster API actor: just enough of Cluster API's Cluster and Machine controllers and
//! of a KubeadmControlPlane to drive capo-rs in tests and the demo. It talks to Kubernetes
//! only through a [`kube::Client`], so it runs against the simulated API server
//! ([`crate::kube`]) and against a real one alike.
//!
//! [`CapiActor::start`] spawns one loop that, every [`CapiActorConfig::tick`], lists the
//! namespace's Clusters and Machines and plays:
//!
//! - **the Cluster controller**: for a Cluster whose `spec.infrastructureRef` names an
//!   OpenStackCluster, the ownerReference Cluster → OpenStackCluster and the cluster-name
//!   label on it; the OpenStackCluster's `status.initialization.provisioned` copied to the
//!   Cluster's `status.initialization.infrastructureProvisioned`, its
//!   `spec.controlPlaneEndpoint` to the Cluster's;
//! - **the Machine controller**: its finalizer, a bootstrap Secret (`<machine>-bootstrap`, key
//!   `value`) named by `spec.bootstrap.dataSecretName`, the ownerReference Machine →
//!   OpenStackMachine and the labels on it; the OpenStackMachine's `spec.providerID` copied to
//!   the Machine, then, after [`CapiActorConfig::join_delay`], `status.nodeRef` and
//!   `status.initialization.infrastructureProvisioned`. A deleting Machine waits while any
//!   pre-terminate hook annotation remains (condition `Deleting`, reason
//!   `WaitingForPreTerminateHook`), then deletes its OpenStackMachine, waits until it is gone
//!   and removes its finalizer;
//! - **KubeadmControlPlane's hook**: on a deleting control-plane Machine, `kcp-cleanup` is
//!   removed once it is the only pre-terminate hook left (KCP's order for Kubernetes >= 1.31).
//!
//! The control plane and workers are driven by calls: [`CapiActor::scale_control_plane`],
//! [`CapiActor::rollout`] and [`CapiActor::create_workers`]. Their waits re-read the API on the
//! actor's tick and are bounded by [`CapiActorConfig::wait_timeout`] each.
//!
//! Where it differs from the real Cluster API:
//! - no MachineSets, MachineDeployments or MachineHealthChecks: workers are plain Machines
//!   created at once; the control plane is a plain Rust value ([`ControlPlane`]), no CRD;
//! - no drain, no volume detach wait, no Node objects, no etcd: a Machine "joins" (gets
//!   `status.nodeRef`, named after the Machine) a fixed delay after its providerID appears,
//!   rather than when a kubelet registers;
//! - no bootstrap provider: the bootstrap Secret holds a fixed cloud-init stub;
//! - the rollout is explicit, max-surge 1, oldest first; scaling and placement over failure
//!   domains are KCP's in spirit only (fewest machines first, oldest deleted first);
//! - no paused handling, no Cluster deletion, no conditions other than the Machine's
//!   `Deleting`; status is written by merge patches.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use capo_api::capi::{
    self, Cluster, ContractReference, Machine, MachineSpec, deleting, labels, pre_terminate_hooks,
};
use capo_api::{OpenStackCluster, OpenStackMachine, OpenStackMachineSpec};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Client, Resource, ResourceExt};
use serde_json::{Value, json};
use tokio::sync::broadcast;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The Machine controller's finalizer.
pub const MACHINE_FINALIZER: &str = "machine.cluster.x-k8s.io";
/// Cluster API's apiVersion, for ownerReferences.
const CAPI_API_VERSION: &str = "cluster.x-k8s.io/v1beta2";
/// The `Deleting` reason once the hooks are gone and the infrastructure goes.
const WAITING_FOR_INFRASTRUCTURE_DELETION: &str = "WaitingForInfrastructureDeletion";

/// How the actor runs.
#[derive(Clone, Debug)]
pub struct CapiActorConfig {
    /// The namespace it plays Cluster API in.
    pub namespace: String,
    /// How often the loop lists and reconciles, and how often waits re-read the API.
    pub tick: Duration,
    /// How long after a Machine's providerID first appears its nodeRef is set.
    pub join_delay: Duration,
    /// The bound of each single wait of a driving call (one machine joining, one going).
    pub wait_timeout: Duration,
}

impl Default for CapiActorConfig {
    fn default() -> Self {
        Self {
            namespace: "default".into(),
            tick: Duration::from_millis(100),
            join_delay: Duration::from_millis(500),
            wait_timeout: Duration::from_secs(120),
        }
    }
}

/// A KubeadmControlPlane-like control plane: the actor keeps `replicas` control-plane
/// Machines of `cluster`, each with an OpenStackMachine from `template`.
#[derive(Clone, Debug)]
pub struct ControlPlane {
    /// The Cluster's name.
    pub cluster: String,
    /// How many control-plane Machines.
    pub replicas: usize,
    /// The spec of each new OpenStackMachine.
    pub template: OpenStackMachineSpec,
    /// The Kubernetes version written to each new Machine's `spec.version`.
    pub version: String,
    /// Failure domains to spread new Machines over (the one with fewest Machines first);
    /// empty: no `spec.failureDomain`.
    pub failure_domains: Vec<String>,
}

/// One step of a [`CapiActor::rollout`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RolloutStep {
    /// A new Machine (and its OpenStackMachine) was created.
    Created {
        /// Its name.
        name: String,
    },
    /// The new Machine has a nodeRef.
    Joined {
        /// Its name.
        name: String,
    },
    /// The old Machine was asked to go.
    Deleting {
        /// Its name.
        name: String,
    },
    /// The old Machine is gone from the API.
    Deleted {
        /// Its name.
        name: String,
    },
}

/// What a rollout did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RolloutReport {
    /// The Machines replaced, in the order they went.
    pub replaced: Vec<String>,
    /// The Machines created, in order.
    pub created: Vec<String>,
    /// Wall time of the whole rollout.
    pub elapsed: Duration,
}

/// What the actor's loop did, for a test or a demo to watch ([`CapiActor::events`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ActorEvent {
    /// A Machine got its nodeRef.
    MachineJoined {
        /// The Machine.
        name: String,
    },
    /// A deleting Machine waits for these pre-terminate hooks (sent when they change).
    WaitingForHooks {
        /// The Machine.
        name: String,
        /// The hook annotations left.
        hooks: Vec<String>,
    },
    /// KCP's hook was removed from a deleting control-plane Machine.
    KcpHookRemoved {
        /// The Machine.
        name: String,
    },
    /// A deleting Machine's OpenStackMachine was deleted.
    InfrastructureDeleting {
        /// The Machine.
        name: String,
    },
    /// A deleting Machine's finalizer was removed: it goes.
    MachineReleased {
        /// The Machine.
        name: String,
    },
}

/// Why a driving call failed.
#[derive(Debug, thiserror::Error)]
pub enum ActorError {
    /// A wait ran out of time.
    #[error("timed out after {after:?} waiting for {what}{}", last_error.as_ref().map(|e| format!(" (last error: {e})")).unwrap_or_default())]
    Timeout {
        /// What it waited for.
        what: String,
        /// The bound.
        after: Duration,
        /// The last API error seen while waiting, if any.
        last_error: Option<String>,
    },
    /// The actor was stopped during a wait.
    #[error("the actor was stopped while waiting for {what}")]
    Cancelled {
        /// What it waited for.
        what: String,
    },
}

/// The running actor. Dropping it stops its loop; [`CapiActor::stop`] also waits for it.
pub struct CapiActor {
    inner: Arc<Inner>,
    cancel: CancellationToken,
    task: Option<JoinHandle<()>>,
}

struct Inner {
    client: Client,
    config: CapiActorConfig,
    events: broadcast::Sender<ActorEvent>,
    /// Creation order of the Machines this actor made: `creationTimestamp` has seconds only.
    created: Mutex<HashMap<String, u64>>,
    sequence: AtomicU64,
}

impl CapiActor {
    /// Spawns the Cluster and Machine loop on the current Tokio runtime. It stops when
    /// `cancel` is cancelled, on [`CapiActor::stop`], or when the actor is dropped.
    pub fn start(client: Client, config: CapiActorConfig, cancel: CancellationToken) -> CapiActor {
        let cancel = cancel.child_token();
        let (events, _) = broadcast::channel(256);
        let inner = Arc::new(Inner {
            client,
            config,
            events,
            created: Mutex::new(HashMap::new()),
            sequence: AtomicU64::new(0),
        });
        let task = tokio::spawn(run(inner.clone(), cancel.clone()));
        CapiActor {
            inner,
            cancel,
            task: Some(task),
        }
    }

    /// Stops the loop and waits for it to end.
    pub async fn stop(mut self) {
        self.cancel.cancel();
        if let Some(task) = self.task.take()
            && let Err(error) = task.await
        {
            tracing::error!(%error, "the Cluster API actor's loop failed");
        }
    }

    /// What the loop does from now on.
    pub fn events(&self) -> broadcast::Receiver<ActorEvent> {
        self.inner.events.subscribe()
    }

    /// The control-plane Machines of `cluster`, oldest first (deleting ones included).
    pub async fn control_plane_machines(&self, cluster: &str) -> Result<Vec<Machine>, ActorError> {
        let what = format!("the control-plane Machines of {cluster}");
        self.wait_until(&what, async || {
            self.inner.list_control_plane(cluster).await.map(Some)
        })
        .await
    }

    /// Scales the control plane to `plane.replicas` as KCP does: one Machine at a time, each
    /// after every existing one has a nodeRef and no Machine is deleting; scaling down
    /// deletes the oldest. Returns the Machines' names, oldest first, once they all have a
    /// nodeRef.
    pub async fn scale_control_plane(
        &self,
        plane: &ControlPlane,
    ) -> Result<Vec<String>, ActorError> {
        loop {
            let machines = self.control_plane_machines(&plane.cluster).await?;
            if let Some(going) = machines.iter().find(|m| is_deleting(m)) {
                self.wait_gone(&going.name_any()).await?;
                continue;
            }
            if let Some(pending) = machines.iter().find(|m| !has_node_ref(m)) {
                self.wait_joined(&pending.name_any()).await?;
                continue;
            }
            match machines.len().cmp(&plane.replicas) {
                std::cmp::Ordering::Less => {
                    let name = self.create_control_plane_machine(plane, &machines).await?;
                    self.wait_joined(&name).await?;
                }
                std::cmp::Ordering::Greater => {
                    if let Some(oldest) = machines.first() {
                        let name = oldest.name_any();
                        self.delete_machine(&name).await?;
                        self.wait_gone(&name).await?;
                    }
                }
                std::cmp::Ordering::Equal => {
                    return Ok(machines.iter().map(ResourceExt::name_any).collect());
                }
            }
        }
    }

    /// Replaces every control-plane Machine that exists now, oldest first, max surge 1:
    /// create one, wait for its nodeRef, delete the oldest old one, wait until it is gone.
    pub async fn rollout(
        &self,
        plane: &ControlPlane,
        progress: impl FnMut(RolloutStep),
    ) -> Result<RolloutReport, ActorError> {
        self.replace_oldest(plane, usize::MAX, progress).await
    }

    /// Replaces the `count` oldest control-plane Machines (all of them at most), as
    /// [`CapiActor::rollout`] does.
    pub async fn replace_oldest(
        &self,
        plane: &ControlPlane,
        count: usize,
        mut progress: impl FnMut(RolloutStep),
    ) -> Result<RolloutReport, ActorError> {
        let started = Instant::now();
        let old: Vec<String> = self
            .control_plane_machines(&plane.cluster)
            .await?
            .iter()
            .filter(|m| !is_deleting(m))
            .map(ResourceExt::name_any)
            .take(count)
            .collect();
        let mut report = RolloutReport::default();
        for (round, old_name) in old.iter().enumerate() {
            // Placement counts the up-to-date Machines only, as KCP's does.
            let machines = self.control_plane_machines(&plane.cluster).await?;
            let up_to_date: Vec<Machine> = machines
                .into_iter()
                .filter(|m| !old[round..].contains(&m.name_any()))
                .collect();
            let name = self
                .create_control_plane_machine(plane, &up_to_date)
                .await?;
            progress(RolloutStep::Created { name: name.clone() });
            report.created.push(name.clone());
            self.wait_joined(&name).await?;
            progress(RolloutStep::Joined { name });
            self.delete_machine(old_name).await?;
            progress(RolloutStep::Deleting {
                name: old_name.clone(),
            });
            self.wait_gone(old_name).await?;
            progress(RolloutStep::Deleted {
                name: old_name.clone(),
            });
            report.replaced.push(old_name.clone());
        }
        report.elapsed = started.elapsed();
        Ok(report)
    }

    /// Creates `count` worker Machines of `cluster` (no control-plane label), each with an
    /// OpenStackMachine from `template`, at once, as a MachineDeployment would. Returns their
    /// names without waiting for them to join ([`CapiActor::wait_joined`]).
    pub async fn create_workers(
        &self,
        cluster: &str,
        count: usize,
        template: OpenStackMachineSpec,
    ) -> Result<Vec<String>, ActorError> {
        let mut names = Vec::with_capacity(count);
        let watch_filter = self.watch_filter_of(cluster).await?;
        for _ in 0..count {
            let new = NewMachine {
                cluster,
                prefix: format!("{cluster}-md-0"),
                control_plane: false,
                template: &template,
                version: None,
                failure_domain: None,
                watch_filter: watch_filter.clone(),
            };
            names.push(self.create_machine(&new).await?);
        }
        Ok(names)
    }

    /// Waits until the Machine has a nodeRef.
    pub async fn wait_joined(&self, name: &str) -> Result<(), ActorError> {
        let what = format!("Machine {name} to get a nodeRef");
        self.wait_until(&what, async || {
            let machine = self.inner.machines().get_opt(name).await?;
            Ok(machine.filter(has_node_ref).map(|_| ()))
        })
        .await
    }

    /// Waits until the Machine is gone from the API.
    pub async fn wait_gone(&self, name: &str) -> Result<(), ActorError> {
        let what = format!("Machine {name} to be gone");
        self.wait_until(&what, async || {
            let machine = self.inner.machines().get_opt(name).await?;
            Ok(machine.is_none().then_some(()))
        })
        .await
    }

    /// Asks the API to delete the Machine (a missing one is fine); returns without waiting.
    pub async fn delete_machine(&self, name: &str) -> Result<(), ActorError> {
        let what = format!("Machine {name} to be deleted");
        self.wait_until(&what, async || {
            match self
                .inner
                .machines()
                .delete(name, &DeleteParams::default())
                .await
            {
                Ok(_) => Ok(Some(())),
                Err(error) if is_status(&error, 404) => Ok(Some(())),
                Err(error) => Err(error),
            }
        })
        .await
    }

    /// A new control-plane Machine in the failure domain with fewest `existing` Machines.
    async fn create_control_plane_machine(
        &self,
        plane: &ControlPlane,
        existing: &[Machine],
    ) -> Result<String, ActorError> {
        let failure_domain = plane
            .failure_domains
            .iter()
            .min_by_key(|domain| {
                existing
                    .iter()
                    .filter(|m| !is_deleting(m))
                    .filter(|m| m.spec.failure_domain.as_ref() == Some(*domain))
                    .count()
            })
            .cloned();
        let new = NewMachine {
            cluster: &plane.cluster,
            prefix: format!("{}-control-plane", plane.cluster),
            control_plane: true,
            template: &plane.template,
            version: Some(plane.version.clone()),
            failure_domain,
            watch_filter: self.watch_filter_of(&plane.cluster).await?,
        };
        self.create_machine(&new).await
    }

    /// The Cluster's `cluster.x-k8s.io/watch-filter` label, which its machines carry too (as
    /// a user's templates set it for a sharded provider).
    async fn watch_filter_of(&self, cluster: &str) -> Result<Option<String>, ActorError> {
        let clusters: Api<Cluster> =
            Api::namespaced(self.inner.client.clone(), &self.inner.config.namespace);
        let what = format!("Cluster {cluster} to be read");
        self.wait_until(&what, async || match clusters.get_opt(cluster).await {
            Ok(found) => Ok(Some(found.and_then(|c| {
                c.metadata
                    .labels
                    .and_then(|l| l.get(labels::WATCH_FILTER).cloned())
            }))),
            Err(error) => Err(error),
        })
        .await
    }

    /// Creates an OpenStackMachine and then its Machine under a fresh name, retrying on the
    /// tick until both exist.
    async fn create_machine(&self, new: &NewMachine<'_>) -> Result<String, ActorError> {
        let name = self
            .wait_until(
                &format!("an OpenStackMachine named {}-* to be created", new.prefix),
                async || {
                    let name = format!("{}-{}", new.prefix, random_suffix());
                    let infra = new.infra_machine(&name, &self.inner.config.namespace);
                    match self
                        .inner
                        .infra_machines()
                        .create(&PostParams::default(), &infra)
                        .await
                    {
                        Ok(_) => Ok(Some(name)),
                        // Taken: another name on the next round.
                        Err(error) if is_status(&error, 409) => Ok(None),
                        Err(error) => Err(error),
                    }
                },
            )
            .await?;
        let sequence = self.inner.sequence.fetch_add(1, Ordering::Relaxed);
        self.inner
            .created
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(name.clone(), sequence);
        let machine = new.machine(&name, &self.inner.config.namespace);
        self.wait_until(
            &format!("Machine {name} to be created"),
            async || match self
                .inner
                .machines()
                .create(&PostParams::default(), &machine)
                .await
            {
                Ok(_) => Ok(Some(())),
                Err(error) if is_status(&error, 409) => Ok(Some(())),
                Err(error) => Err(error),
            },
        )
        .await?;
        tracing::info!(machine = %name, "created a Machine");
        Ok(name)
    }

    /// Runs `probe` on the tick until it answers, the wait times out or the actor stops.
    /// API errors are logged and retried.
    async fn wait_until<T>(
        &self,
        what: &str,
        mut probe: impl AsyncFnMut() -> Result<Option<T>, kube::Error>,
    ) -> Result<T, ActorError> {
        let after = self.inner.config.wait_timeout;
        let deadline = Instant::now() + after;
        let mut last_error = None;
        loop {
            if self.cancel.is_cancelled() {
                return Err(ActorError::Cancelled { what: what.into() });
            }
            match tokio::time::timeout_at(deadline, probe()).await {
                Ok(Ok(Some(value))) => return Ok(value),
                // The API answered: an error from earlier no longer explains the wait.
                Ok(Ok(None)) => last_error = None,
                Err(_) => {}
                Ok(Err(error)) => {
                    tracing::debug!(%error, "waiting for {what}");
                    last_error = Some(error.to_string());
                }
            }
            if Instant::now() >= deadline {
                return Err(ActorError::Timeout {
                    what: what.into(),
                    after,
                    last_error,
                });
            }
            tokio::select! {
                () = self.cancel.cancelled() => {}
                () = tokio::time::sleep(self.inner.config.tick) => {}
            }
        }
    }
}

impl Drop for CapiActor {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// A Machine and OpenStackMachine to create.
struct NewMachine<'a> {
    cluster: &'a str,
    prefix: String,
    control_plane: bool,
    template: &'a OpenStackMachineSpec,
    version: Option<String>,
    failure_domain: Option<String>,
    watch_filter: Option<String>,
}

impl NewMachine<'_> {
    fn labels(&self) -> BTreeMap<String, String> {
        let mut labels =
            BTreeMap::from([(labels::CLUSTER_NAME.to_owned(), self.cluster.to_owned())]);
        if self.control_plane {
            labels.insert(labels::CONTROL_PLANE.to_owned(), String::new());
        }
        if let Some(filter) = &self.watch_filter {
            labels.insert(labels::WATCH_FILTER.to_owned(), filter.clone());
        }
        labels
    }

    fn infra_machine(&self, name: &str, namespace: &str) -> OpenStackMachine {
        let mut spec = self.template.clone();
        spec.provider_id = None;
        let mut infra = OpenStackMachine::new(name, spec);
        infra.metadata.namespace = Some(namespace.to_owned());
        infra.metadata.labels = Some(self.labels());
        infra
    }

    fn machine(&self, name: &str, namespace: &str) -> Machine {
        let annotations = self
            .control_plane
            .then(|| BTreeMap::from([(labels::KCP_HOOK.to_owned(), String::new())]));
        Machine {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some(namespace.to_owned()),
                labels: Some(self.labels()),
                annotations,
                ..ObjectMeta::default()
            },
            spec: MachineSpec {
                cluster_name: self.cluster.to_owned(),
                infrastructure_ref: Some(ContractReference {
                    api_group: capo_api::GROUP.into(),
                    kind: "OpenStackMachine".into(),
                    name: name.to_owned(),
                }),
                failure_domain: self.failure_domain.clone(),
                version: self.version.clone(),
                ..MachineSpec::default()
            },
            status: None,
        }
    }
}

/// The loop: one pass over Clusters and Machines per tick until cancelled.
async fn run(inner: Arc<Inner>, cancel: CancellationToken) {
    let mut first_seen: HashMap<String, Instant> = HashMap::new();
    let mut waiting_for: HashMap<String, Vec<String>> = HashMap::new();
    let mut ticker = tokio::time::interval(inner.config.tick);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = cancel.cancelled() => break,
            _ = ticker.tick() => {}
        }
        let pass = async {
            inner.reconcile_clusters().await;
            inner
                .reconcile_machines(&mut first_seen, &mut waiting_for)
                .await;
        };
        tokio::select! {
            () = cancel.cancelled() => break,
            () = pass => {}
        }
    }
    tracing::debug!("the Cluster API actor stopped");
}

impl Inner {
    fn machines(&self) -> Api<Machine> {
        Api::namespaced(self.client.clone(), &self.config.namespace)
    }

    fn infra_machines(&self) -> Api<OpenStackMachine> {
        Api::namespaced(self.client.clone(), &self.config.namespace)
    }

    fn send(&self, event: ActorEvent) {
        // No receiver is fine.
        let _ = self.events.send(event);
    }

    async fn list_control_plane(&self, cluster: &str) -> Result<Vec<Machine>, kube::Error> {
        let selector = format!(
            "{}={cluster},{}",
            labels::CLUSTER_NAME,
            labels::CONTROL_PLANE
        );
        let mut machines = self
            .machines()
            .list(&ListParams::default().labels(&selector))
            .await?
            .items;
        let created = self
            .created
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        machines.sort_by_key(|m| {
            (
                m.metadata.creation_timestamp.as_ref().map(|t| t.0),
                created.get(&m.name_any()).copied(),
                m.name_any(),
            )
        });
        Ok(machines)
    }

    // ---- Cluster controller ----

    async fn reconcile_clusters(&self) {
        let clusters: Api<Cluster> = Api::namespaced(self.client.clone(), &self.config.namespace);
        let list = match clusters.list(&ListParams::default()).await {
            Ok(list) => list.items,
            Err(error) => {
                tracing::warn!(%error, "listing Clusters");
                return;
            }
        };
        // One list of the infrastructure per pass, not a GET per Cluster: a pass over a
        // thousand clusters must not take longer than the tick.
        let Some(infra) = self.listed(self.infra_clusters()).await else {
            return;
        };
        for cluster in list {
            if let Err(error) = self.reconcile_cluster(&clusters, &cluster, &infra).await {
                log_api_error(&error, "Cluster", &cluster.name_any());
            }
        }
    }

    /// Every object of a kind in the namespace, by name; `None` (logged) when the list fails.
    async fn listed<K>(&self, api: Api<K>) -> Option<HashMap<String, K>>
    where
        K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        match api.list(&ListParams::default()).await {
            Ok(list) => Some(
                list.items
                    .into_iter()
                    .map(|object| (object.name_any(), object))
                    .collect(),
            ),
            Err(error) => {
                tracing::warn!(%error, "listing {}", K::kind(&()));
                None
            }
        }
    }

    fn infra_clusters(&self) -> Api<OpenStackCluster> {
        Api::namespaced(self.client.clone(), &self.config.namespace)
    }

    async fn reconcile_cluster(
        &self,
        clusters: &Api<Cluster>,
        cluster: &Cluster,
        infra_listed: &HashMap<String, OpenStackCluster>,
    ) -> Result<(), kube::Error> {
        let Some(reference) = cluster
            .spec
            .infrastructure_ref
            .as_ref()
            .filter(|r| r.kind == "OpenStackCluster" && !r.name.is_empty())
        else {
            return Ok(());
        };
        let name = cluster.name_any();
        let infra_clusters = self.infra_clusters();
        let Some(infra) = infra_listed.get(&reference.name) else {
            return Ok(());
        };
        if let Some(patch) = ownership_patch(&infra.metadata, cluster, &name, false) {
            infra_clusters
                .patch(
                    &reference.name,
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await?;
        }
        let provisioned = infra
            .status
            .as_ref()
            .and_then(|s| s.initialization.as_ref())
            .and_then(|i| i.provisioned)
            == Some(true);
        let recorded = cluster
            .status
            .as_ref()
            .and_then(|s| s.initialization.as_ref())
            .and_then(|i| i.infrastructure_provisioned)
            == Some(true);
        if provisioned && !recorded {
            let status = json!({"status": {"initialization": {"infrastructureProvisioned": true}}});
            clusters
                .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                .await?;
            tracing::info!(cluster = %name, "the Cluster's infrastructure is provisioned");
        }
        let endpoint = infra
            .spec
            .control_plane_endpoint
            .as_ref()
            .filter(|e| e.host.as_deref().is_some_and(|h| !h.is_empty()) && e.port.is_some())
            .map(|e| capi::Endpoint {
                host: e.host.clone(),
                port: e.port,
            });
        if let Some(endpoint) = endpoint
            && cluster.spec.control_plane_endpoint.as_ref() != Some(&endpoint)
        {
            let patch = json!({"spec": {"controlPlaneEndpoint": endpoint}});
            clusters
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
        }
        Ok(())
    }

    // ---- Machine controller ----

    async fn reconcile_machines(
        &self,
        first_seen: &mut HashMap<String, Instant>,
        waiting_for: &mut HashMap<String, Vec<String>>,
    ) {
        let list = ListParams::default().labels(labels::CLUSTER_NAME);
        let machines = match self.machines().list(&list).await {
            Ok(list) => list.items,
            Err(error) => {
                tracing::warn!(%error, "listing Machines");
                return;
            }
        };
        let Some(infra) = self.listed(self.infra_machines()).await else {
            return;
        };
        let uids: HashSet<String> = machines.iter().filter_map(|m| m.uid()).collect();
        first_seen.retain(|uid, _| uids.contains(uid));
        waiting_for.retain(|uid, _| uids.contains(uid));
        for machine in machines {
            let name = machine.name_any();
            let result = if is_deleting(&machine) {
                self.reconcile_deleting(machine, &infra, waiting_for).await
            } else {
                self.reconcile_machine(machine, &infra, first_seen).await
            };
            if let Err(error) = result {
                log_api_error(&error, "Machine", &name);
            }
        }
    }

    async fn reconcile_machine(
        &self,
        mut machine: Machine,
        infra_listed: &HashMap<String, OpenStackMachine>,
        first_seen: &mut HashMap<String, Instant>,
    ) -> Result<(), kube::Error> {
        let name = machine.name_any();
        let machines = self.machines();
        let finalizers = machine.finalizers().to_vec();
        if !finalizers.iter().any(|f| f == MACHINE_FINALIZER) {
            let mut with = finalizers;
            with.push(MACHINE_FINALIZER.to_owned());
            machine = patch_finalizers(&machines, &machine, with).await?;
        }
        if machine.spec.bootstrap.data_secret_name.is_none() {
            let secret = self.bootstrap_secret(&machine);
            let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &self.config.namespace);
            match secrets.create(&PostParams::default(), &secret).await {
                Ok(_) => {}
                Err(error) if is_status(&error, 409) => {}
                Err(error) => return Err(error),
            }
            let patch = json!({"spec": {"bootstrap": {"dataSecretName": secret.name_any()}}});
            machines
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            let status =
                json!({"status": {"initialization": {"bootstrapDataSecretCreated": true}}});
            machine = machines
                .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                .await?;
        }
        let Some(reference) = machine
            .spec
            .infrastructure_ref
            .clone()
            .filter(|r| r.kind == "OpenStackMachine" && !r.name.is_empty())
        else {
            return Ok(());
        };
        let infra_machines = self.infra_machines();
        let Some(infra) = infra_listed.get(&reference.name) else {
            return Ok(());
        };
        let control_plane = capi::is_control_plane(machine.labels());
        if let Some(patch) = ownership_patch(
            &infra.metadata,
            &machine,
            &machine.spec.cluster_name,
            control_plane,
        ) {
            infra_machines
                .patch(
                    &reference.name,
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await?;
        }
        let Some(provider_id) = infra.spec.provider_id.clone().filter(|id| !id.is_empty()) else {
            return Ok(());
        };
        let Some(uid) = machine.uid() else {
            return Ok(());
        };
        // The wire field is `spec.providerID`. `capi::MachineSpec::provider_id` may not read
        // it back (its serde name has been `providerId`), so the copy is also made once per
        // Machine the loop sees, rather than only when the typed field differs.
        let stale = machine
            .spec
            .provider_id
            .as_ref()
            .is_some_and(|id| *id != provider_id);
        let seen = match first_seen.get(&uid) {
            Some(seen) if !stale => *seen,
            _ => {
                let patch = json!({"spec": {"providerID": provider_id}});
                machines
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await?;
                *first_seen.entry(uid).or_insert_with(Instant::now)
            }
        };
        if has_node_ref(&machine) || seen.elapsed() < self.config.join_delay {
            return Ok(());
        }
        let status = json!({"status": {
            "nodeRef": {"name": name},
            "initialization": {"infrastructureProvisioned": true},
            "phase": "Running",
        }});
        machines
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
            .await?;
        tracing::info!(machine = %name, "the Machine joined");
        self.send(ActorEvent::MachineJoined { name });
        Ok(())
    }

    fn bootstrap_secret(&self, machine: &Machine) -> Secret {
        let name = format!("{}-bootstrap", machine.name_any());
        let cloud_init = format!(
            "#cloud-config\n# capo-sim's stand-in for kubeadm's bootstrap data\nhostname: {}\nruncmd:\n  - echo joined\n",
            machine.name_any()
        );
        Secret {
            metadata: ObjectMeta {
                name: Some(name),
                namespace: Some(self.config.namespace.clone()),
                labels: Some(BTreeMap::from([(
                    labels::CLUSTER_NAME.to_owned(),
                    machine.spec.cluster_name.clone(),
                )])),
                owner_references: owner_reference(machine).map(|r| vec![r]),
                ..ObjectMeta::default()
            },
            type_: Some("cluster.x-k8s.io/secret".into()),
            data: Some(BTreeMap::from([
                ("value".to_owned(), ByteString(cloud_init.into_bytes())),
                ("format".to_owned(), ByteString(b"cloud-config".to_vec())),
            ])),
            ..Secret::default()
        }
    }

    async fn reconcile_deleting(
        &self,
        mut machine: Machine,
        infra_listed: &HashMap<String, OpenStackMachine>,
        waiting_for: &mut HashMap<String, Vec<String>>,
    ) -> Result<(), kube::Error> {
        if !machine.finalizers().iter().any(|f| f == MACHINE_FINALIZER) {
            return Ok(());
        }
        let name = machine.name_any();
        let machines = self.machines();
        let mut hooks: Vec<String> = pre_terminate_hooks(machine.annotations())
            .into_iter()
            .map(str::to_owned)
            .collect();
        // KubeadmControlPlane: its hook goes last (etcd member removal, Kubernetes >= 1.31).
        if capi::is_control_plane(machine.labels()) && hooks == [labels::KCP_HOOK] {
            let patch = json!({"metadata": {"annotations": {labels::KCP_HOOK: null}}});
            machine = machines
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            tracing::info!(machine = %name, "KubeadmControlPlane removed its pre-terminate hook");
            self.send(ActorEvent::KcpHookRemoved { name: name.clone() });
            hooks = pre_terminate_hooks(machine.annotations())
                .into_iter()
                .map(str::to_owned)
                .collect();
        }
        if !hooks.is_empty() {
            let message = format!("Waiting for pre-terminate hooks: {}", hooks.join(", "));
            self.set_deleting(&machine, deleting::WAITING_FOR_PRE_TERMINATE_HOOK, &message)
                .await?;
            if let Some(uid) = machine.uid()
                && waiting_for.get(&uid) != Some(&hooks)
            {
                waiting_for.insert(uid, hooks.clone());
                self.send(ActorEvent::WaitingForHooks { name, hooks });
            }
            return Ok(());
        }
        self.set_deleting(
            &machine,
            WAITING_FOR_INFRASTRUCTURE_DELETION,
            "Waiting for the infrastructure machine to be deleted",
        )
        .await?;
        if let Some(reference) = machine
            .spec
            .infrastructure_ref
            .as_ref()
            .filter(|r| r.kind == "OpenStackMachine" && !r.name.is_empty())
        {
            let infra_machines = self.infra_machines();
            match infra_listed.get(&reference.name) {
                Some(infra) if infra.metadata.deletion_timestamp.is_none() => {
                    match infra_machines
                        .delete(&reference.name, &DeleteParams::default())
                        .await
                    {
                        Ok(_) => {}
                        Err(error) if is_status(&error, 404) => {}
                        Err(error) => return Err(error),
                    }
                    tracing::info!(machine = %name, "deleting the OpenStackMachine");
                    self.send(ActorEvent::InfrastructureDeleting { name });
                    return Ok(());
                }
                // Going: wait for the next tick.
                Some(_) => return Ok(()),
                None => {}
            }
        }
        let without: Vec<String> = machine
            .finalizers()
            .iter()
            .filter(|f| *f != MACHINE_FINALIZER)
            .cloned()
            .collect();
        patch_finalizers(&machines, &machine, without).await?;
        tracing::info!(machine = %name, "removed the Machine's finalizer");
        self.send(ActorEvent::MachineReleased { name });
        Ok(())
    }

    /// Sets the Machine's `Deleting` condition (True, `reason`, `message`) unless it says so.
    async fn set_deleting(
        &self,
        machine: &Machine,
        reason: &str,
        message: &str,
    ) -> Result<(), kube::Error> {
        let mut conditions = machine
            .status
            .as_ref()
            .map(|s| s.conditions.clone())
            .unwrap_or_default();
        let previous = conditions
            .iter()
            .position(|c| c.type_ == deleting::CONDITION);
        let last_transition_time = match previous.map(|i| &conditions[i]) {
            Some(c) if c.reason == reason && c.message == message && c.status == "True" => {
                return Ok(());
            }
            Some(c) if c.status == "True" => c.last_transition_time.clone(),
            _ => Time(Timestamp::now()),
        };
        let condition = Condition {
            type_: deleting::CONDITION.into(),
            status: "True".into(),
            reason: reason.into(),
            message: message.into(),
            last_transition_time,
            observed_generation: machine.metadata.generation,
        };
        match previous {
            Some(i) => conditions[i] = condition,
            None => conditions.push(condition),
        }
        let status = json!({"status": {"conditions": conditions, "phase": "Deleting"}});
        self.machines()
            .patch_status(
                &machine.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&status),
            )
            .await?;
        Ok(())
    }
}

/// Whether the Machine is being deleted.
fn is_deleting(machine: &Machine) -> bool {
    machine.metadata.deletion_timestamp.is_some()
}

/// Whether the Machine has a nodeRef.
fn has_node_ref(machine: &Machine) -> bool {
    machine
        .status
        .as_ref()
        .is_some_and(|s| s.node_ref.is_some())
}

/// A controller ownerReference to `owner`, if it has a name and uid.
fn owner_reference<K: Resource<DynamicType = ()>>(owner: &K) -> Option<OwnerReference> {
    let meta = owner.meta();
    Some(OwnerReference {
        api_version: CAPI_API_VERSION.into(),
        kind: K::kind(&()).into_owned(),
        name: meta.name.clone()?,
        uid: meta.uid.clone()?,
        controller: Some(true),
        block_owner_deletion: Some(true),
    })
}

/// The merge patch that gives `object` the ownerReference to `owner` and the cluster-name
/// (and, for control-plane machines, control-plane) labels, or `None` when it has them.
/// The ownerReferences list is replaced whole, so the patch carries the resourceVersion it
/// was computed from: a concurrent change makes it a 409, retried next tick.
fn ownership_patch<K: Resource<DynamicType = ()>>(
    object: &ObjectMeta,
    owner: &K,
    cluster: &str,
    control_plane: bool,
) -> Option<Value> {
    let reference = owner_reference(owner)?;
    let mut references = object.owner_references.clone().unwrap_or_default();
    let owned = references.iter().any(|r| r.uid == reference.uid);
    let labels = object.labels.clone().unwrap_or_default();
    let mut wanted = BTreeMap::new();
    if !cluster.is_empty() && labels.get(labels::CLUSTER_NAME).map(String::as_str) != Some(cluster)
    {
        wanted.insert(labels::CLUSTER_NAME, cluster.to_owned());
    }
    if control_plane && !labels.contains_key(labels::CONTROL_PLANE) {
        wanted.insert(labels::CONTROL_PLANE, String::new());
    }
    if owned && wanted.is_empty() {
        return None;
    }
    let mut metadata = json!({"resourceVersion": object.resource_version});
    if !owned {
        references.push(reference);
        metadata["ownerReferences"] = json!(references);
    }
    if !wanted.is_empty() {
        metadata["labels"] = json!(wanted);
    }
    Some(json!({ "metadata": metadata }))
}

/// Replaces the Machine's finalizers, guarded by its resourceVersion.
async fn patch_finalizers(
    machines: &Api<Machine>,
    machine: &Machine,
    finalizers: Vec<String>,
) -> Result<Machine, kube::Error> {
    let patch = json!({"metadata": {
        "finalizers": finalizers,
        "resourceVersion": machine.metadata.resource_version,
    }});
    machines
        .patch(
            &machine.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
}

/// Whether the API answered with this HTTP status.
fn is_status(error: &kube::Error, code: u16) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == code)
}

/// Logs an API error of a reconcile: 404 and 409 are the normal races of a loop that lists.
fn log_api_error(error: &kube::Error, kind: &str, name: &str) {
    if is_status(error, 404) || is_status(error, 409) {
        tracing::debug!(%error, "{kind} {name}: retrying next tick");
    } else {
        tracing::warn!(%error, "{kind} {name}: retrying next tick");
    }
}

/// Five random lowercase letters, as generated names have.
fn random_suffix() -> String {
    (0..5).map(|_| fastrand::lowercase()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn machine(name: &str, uid: &str) -> Machine {
        let mut machine = Machine::new(name, MachineSpec::default());
        machine.metadata.uid = Some(uid.into());
        machine.metadata.resource_version = Some("7".into());
        machine
    }

    #[test]
    fn ownership_is_added_once_with_the_labels() {
        let owner = machine("m1", "u1");
        let mut object = ObjectMeta {
            resource_version: Some("3".into()),
            ..ObjectMeta::default()
        };
        let patch = ownership_patch(&object, &owner, "c1", true).unwrap();
        assert_eq!(patch["metadata"]["resourceVersion"], "3");
        assert_eq!(patch["metadata"]["ownerReferences"][0]["kind"], "Machine");
        assert_eq!(patch["metadata"]["ownerReferences"][0]["controller"], true);
        assert_eq!(patch["metadata"]["labels"][labels::CLUSTER_NAME], "c1");
        assert_eq!(patch["metadata"]["labels"][labels::CONTROL_PLANE], "");
        object.owner_references = owner_reference(&owner).map(|r| vec![r]);
        object.labels = Some(BTreeMap::from([
            (labels::CLUSTER_NAME.to_owned(), "c1".to_owned()),
            (labels::CONTROL_PLANE.to_owned(), String::new()),
        ]));
        assert_eq!(ownership_patch(&object, &owner, "c1", true), None);
    }

    #[test]
    fn suffixes_are_five_lowercase_letters() {
        let suffix = random_suffix();
        assert_eq!(suffix.len(), 5);
        assert!(suffix.chars().all(|c| c.is_ascii_lowercase()));
    }
}
