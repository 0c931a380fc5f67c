//! The OpenStackCluster reconciler: what a cluster needs before any machine exists (network,
//! security groups, the API load balancer and endpoint, failure domains, the bastion), and
//! the gate (`APIServerLoadBalancerReady`) from the membership engine's verdict.
//!
//! observe (Kubernetes, then the cloud) -> plan ([`plan`], [`rules`], `gate`: pure) ->
//! apply (one change per load balancer per pass) -> status (one patch).
//!
//! Two kinds of pass: a *complete* one walks every cloud resource (on a spec change, until
//! everything is in place, and once per sync period for drift); between those, a wake-up from
//! the engine only refreshes the gate, with no OpenStack request at all.

mod bastion;
mod delete;
mod load_balancer;
mod network;
pub mod plan;
pub mod rules;
mod security_groups;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use capo_api::capi::{self, Cluster};
use capo_api::capo_conditions::{self, Owner};
use capo_api::cluster::{ApiEndpoint, OpenStackClusterStatus};
use capo_api::common::Initialization;
use capo_api::conditions::{self, Desired, Status, owned, reasons, types};
use capo_api::{OpenStackCluster, OpenStackMachine};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};

use super::packed::Packed;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::context::HeldStamp;
use super::error::{Categorized, ErrorCategory, FromPanic};
use super::identity::IdentityError;
use super::outcome::Outcome;
use super::server::resolve::ResolveError;
use super::{Context, gate, writes};
use crate::cloud::{CloudClient, CloudError};
use crate::membership::{DesiredLb, ObjectName};
use load_balancer::LbProgress;
use plan::Names;

/// The `controller` label of metrics and the span name.
pub const CONTROLLER: &str = "openstackcluster";

/// What the watch hands us: the object, or why it could not be read.
pub type Watched = Packed<OpenStackCluster>;

/// The status fields this controller writes (and so removes when it no longer has them).
const STATUS_FIELDS: &[&str] = &[
    "network",
    "externalNetwork",
    "router",
    "apiServerManagedLoadBalancer",
    "apiServerManagedLoadBalancer/members",
    "apiServerManagedLoadBalancer/pools",
    "apiServerManagedLoadBalancer/allowedCIDRs",
    "failureDomains",
    "controlPlaneSecurityGroup",
    "workerSecurityGroup",
    "bastionSecurityGroup",
    "bastion",
    "conditions",
    "observedGeneration",
];

/// Why a reconcile of an OpenStackCluster failed; its category says what happens next.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The reconcile panicked: a bug in capo-rs, caught and retried with backoff.
    #[error("the reconcile panicked (a bug in capo-rs; please report it): {0}")]
    Panicked(String),
    /// A read or write through the Kubernetes API failed.
    #[error("{what}: {source}")]
    Kubernetes {
        /// What was being done (`reading the OpenStackCluster`, `writing status`).
        what: String,
        /// The Kubernetes client's error.
        #[source]
        source: kube::Error,
    },
    /// No OpenStack client could be had from the `identityRef`.
    #[error(transparent)]
    Identity(#[from] IdentityError),
    /// The spec cannot work as written (it names something missing, or asks for what
    /// the cloud cannot do); the message says why.
    #[error("{0}")]
    InvalidSpec(String),
    /// Finding what the spec names by filter (a network, a subnet) failed: none or
    /// several match, or the lookup itself failed in the cloud.
    #[error(transparent)]
    Resolve(#[from] ResolveError),
    /// An OpenStack request failed.
    #[error("{action}: {source}")]
    Cloud {
        /// What was being done (`creating the load balancer`).
        action: String,
        /// The cloud's error; its category is the error's.
        #[source]
        source: CloudError,
    },
}

impl FromPanic for ClusterError {
    fn from_panic(message: String) -> Self {
        ClusterError::Panicked(message)
    }
}

impl Categorized for ClusterError {
    fn category(&self) -> ErrorCategory {
        match self {
            ClusterError::Kubernetes { .. } => ErrorCategory::Kubernetes,
            ClusterError::Panicked(_) => ErrorCategory::Internal,
            ClusterError::Identity(error) => error.category(),
            ClusterError::InvalidSpec(_) | ClusterError::Resolve(ResolveError::Spec(_)) => {
                ErrorCategory::InvalidSpec
            }
            ClusterError::Resolve(ResolveError::Cloud { source, .. })
            | ClusterError::Cloud { source, .. } => source.category(),
        }
    }
}

impl ClusterError {
    pub(crate) fn kube(what: impl Into<String>) -> impl FnOnce(kube::Error) -> ClusterError {
        let what = what.into();
        move |source| ClusterError::Kubernetes { what, source }
    }

    pub(crate) fn cloud(action: impl Into<String>) -> impl FnOnce(CloudError) -> ClusterError {
        let action = action.into();
        move |source| ClusterError::Cloud { action, source }
    }

    /// A lookup by the ID the spec gives: a 404 means the spec names something missing.
    pub(crate) fn missing_or_cloud(what: &'static str) -> impl FnOnce(CloudError) -> ClusterError {
        move |source| match source {
            CloudError::NotFound(_) => {
                ClusterError::InvalidSpec(format!("{what} the spec names does not exist"))
            }
            source => ClusterError::Cloud {
                action: format!("reading {what}"),
                source,
            },
        }
    }

    /// The load balancer is locked (409): come back when it settles.
    fn is_busy(&self) -> bool {
        matches!(
            self,
            ClusterError::Cloud {
                source: CloudError::Busy(_),
                ..
            }
        )
    }
}

/// A failed step: the condition that reports it, and why.
struct Failure {
    condition: &'static str,
    error: ClusterError,
}

fn at(condition: &'static str) -> impl FnOnce(ClusterError) -> Failure {
    move |error| Failure { condition, error }
}

/// The key of an OpenStackCluster in the context's per-object state.
pub fn object_key(namespace: &str, name: &str) -> String {
    format!("{CONTROLLER}/{namespace}/{name}")
}

/// One reconcile, as kube-runtime's `Controller` calls it.
pub async fn reconcile(object: Arc<Watched>, ctx: Arc<Context>) -> Result<Action, ClusterError> {
    super::reconcile_watched(
        CONTROLLER,
        object,
        ctx,
        reconcile_cluster,
        ClusterError::kube("writing status"),
    )
    .await
}

/// After a failed reconcile: back off, or wait; the next pass is a complete one.
pub fn error_policy(object: Arc<Watched>, error: &ClusterError, ctx: Arc<Context>) -> Action {
    ctx.steps_needed(&super::object_key(CONTROLLER, object.as_ref()));
    super::back_off(CONTROLLER, object.as_ref(), error, &ctx)
}

/// The steps of a complete pass that are skipped while fresh (see `Context::step_due`).
const COMPLETE: &str = "complete";
const NETWORK: &str = "network";
const SECURITY_GROUPS: &str = "security-groups";
const FAILURE_DOMAINS: &str = "failure-domains";
const COMPLETE_PASS: &[&str] = &[COMPLETE, NETWORK, SECURITY_GROUPS, FAILURE_DOMAINS];

/// Whether the status says a complete pass at the current generation found everything in
/// place: provisioned and Ready, the bastion as wanted, nothing being deleted. (Ready does not
/// wait for the bastion, which comes last: a restart while it builds must not take the cluster
/// for settled, or its floating IP would wait a whole sync period.)
fn settled_at_its_generation(cluster: &OpenStackCluster) -> bool {
    let Some(status) = &cluster.status else {
        return false;
    };
    cluster.meta().deletion_timestamp.is_none()
        && status.observed_generation.is_some()
        && status.observed_generation == cluster.meta().generation
        && Initialization::is_provisioned(status.initialization.as_ref())
        && conditions::status_of(&status.conditions, types::READY) == Status::True
        && bastion::in_place(&cluster.spec, status)
}

/// Everything one pass knows.
struct Pass<'a> {
    cluster: &'a OpenStackCluster,
    ctx: &'a Context,
    key: &'a str,
    names: Names,
    /// The Cluster API Cluster's name (machines carry it as their label).
    capi_name: String,
    generation: Option<i64>,
    now: Timestamp,
    /// The generation our own spec write (the control-plane endpoint) moved the object to,
    /// when nothing else moved it.
    own_write: std::sync::OnceLock<i64>,
    /// The API load balancer this pass changed (made it, or something under it): the engine
    /// is told once the gate has given it the LB, since it does not know a new one before.
    lb_changed: std::sync::OnceLock<String>,
}

impl Pass<'_> {
    fn due(&self, step: &'static str) -> bool {
        self.ctx.step_due(self.key, step, self.generation)
    }

    fn done(&self, step: &'static str) {
        self.ctx.step_done(self.key, step, self.generation);
    }
}

/// An OpenStackCluster annotated `cluster.x-k8s.io/managed-by` belongs to another manager,
/// as CAPO leaves it: no cloud call and no status write. Only our finalizer, if it was put
/// on before the annotation, is taken off on deletion, so that we never hold the object.
async fn leave_to_its_manager(
    api: &Api<OpenStackCluster>,
    cluster: &OpenStackCluster,
) -> Result<Outcome, ClusterError> {
    tracing::debug!("externally managed (cluster.x-k8s.io/managed-by): left alone");
    if cluster.meta().deletion_timestamp.is_some() {
        writes::remove_finalizer(api, cluster, conditions::finalizers::CLUSTER)
            .await
            .map_err(ClusterError::kube("removing the finalizer"))?;
    }
    Ok(Outcome::Settled)
}

async fn reconcile_cluster(
    cluster: &OpenStackCluster,
    ctx: &Context,
    key: &str,
) -> Result<Outcome, ClusterError> {
    let namespace = cluster.namespace().unwrap_or_default();
    let api: Api<OpenStackCluster> = Api::namespaced(ctx.client.clone(), &namespace);
    if capi::is_externally_managed(cluster.annotations()) {
        return leave_to_its_manager(&api, cluster).await;
    }
    if super::waits_for_its_cluster(ctx, &namespace, cluster.meta()) {
        return Ok(Outcome::Paused);
    }
    // The cache may not hold our own last status write yet (the watch lags behind it, most
    // often right after we changed the spec). A pass that skips the steps done before would
    // write that stale status back over the good one, so unless the cached copy holds this
    // process's own last write (`Context::cache_holds_own_writes`), it starts from the
    // object as the API server holds it.
    let fresh;
    let cluster = if ctx.cache_holds_own_writes(key, cluster.resource_version().as_deref()) {
        cluster
    } else {
        let Some(read) = api
            .get_opt(&cluster.name_any())
            .await
            .map_err(ClusterError::kube("reading the OpenStackCluster"))?
        else {
            return Ok(Outcome::Settled);
        };
        ctx.note_version(key, read.resource_version());
        fresh = read;
        &fresh
    };
    let owner = owner_cluster(ctx, cluster, &namespace);
    let woke = ctx.take_wake(key);
    if settled_at_its_generation(cluster) {
        ctx.steps_settled_before(key, COMPLETE_PASS, cluster.meta().generation);
    }
    let kind = if ctx.step_due(key, COMPLETE, cluster.meta().generation) {
        "complete"
    } else {
        "gate"
    };
    let before = cluster.status.clone();
    let mut status = before.clone().unwrap_or_default();
    let generation = cluster.meta().generation;
    let now = Timestamp::now();
    conditions::initialize(&mut status.conditions, owned::CLUSTER, generation, now);
    let paused = capi::is_paused(owner.as_ref(), cluster.annotations());
    conditions::set(
        &mut status.conditions,
        &conditions::paused(paused),
        generation,
        now,
    );
    if paused {
        write_status(ctx, key, &api, cluster, before.as_ref(), &status).await?;
        return Ok(Outcome::Paused);
    }
    let capi_name = owner
        .as_ref()
        .map(ResourceExt::name_any)
        .or_else(|| capi::cluster_name(cluster.labels()).map(str::to_owned));
    let deleting = cluster.meta().deletion_timestamp.is_some();
    let Some(capi_name) = capi_name.filter(|_| owner.is_some() || deleting) else {
        // As CAPO: nothing is built before Cluster API owns the object.
        let waiting = Desired::new(
            types::READY,
            Status::False,
            reasons::DEPENDENCY_MISSING,
            "waiting for Cluster API: no Cluster owns this OpenStackCluster yet (label cluster.x-k8s.io/cluster-name)",
        );
        conditions::set(&mut status.conditions, &waiting, generation, now);
        write_status(ctx, key, &api, cluster, before.as_ref(), &status).await?;
        return Ok(Outcome::Settled);
    };
    let pass = Pass {
        cluster,
        ctx,
        key,
        // CAPO names everything after the Cluster API Cluster, not the OpenStackCluster (they
        // differ under ClusterClass): a cluster CAPO built is found under the same names.
        names: Names::new(&namespace, &capi_name),
        capi_name,
        generation,
        now,
        own_write: std::sync::OnceLock::new(),
        lb_changed: std::sync::OnceLock::new(),
    };
    let result = if deleting {
        delete::run(&pass, &api, &mut status).await
    } else {
        provision(&pass, &api, &mut status).await
    };
    let result = match result {
        Ok(outcome) => Ok(outcome),
        Err(failure) => {
            report_error(&pass, &mut status, &failure).await;
            Err(failure.error)
        }
    };
    if matches!(result, Ok(Outcome::Deleted)) {
        return result;
    }
    status.observed_generation = generation;
    // While deleting, Ready says what the deletion waits for.
    if !deleting {
        set_cluster_ready(&mut status, generation, now);
    }
    capo_conditions::derive(&mut status.conditions, Owner::Cluster, generation, now);
    let own_write = pass.own_write.get().copied();
    let observed = &mut status.observed_generation;
    conditions::advance_generation(&mut status.conditions, observed, generation, own_write);
    let stamp_due = hold_lone_stamp(ctx, key, cluster, before.as_ref(), &mut status);
    write_status(ctx, key, &api, cluster, before.as_ref(), &status).await?;
    if let Some(observed) = woke {
        ctx.metrics.gate_written(observed, kind);
    }
    result.map(|outcome| match (outcome, stamp_due) {
        (Outcome::Settled, Some(due)) => Outcome::Poll(due),
        (Outcome::Poll(after), Some(due)) => Outcome::Poll(after.min(due)),
        (outcome, _) => outcome,
    })
}

/// The recorded `membersAsOf` when a new (not cleared) one is all that differs from it.
fn lone_stamp(
    before: Option<&OpenStackClusterStatus>,
    status: &OpenStackClusterStatus,
) -> Option<Option<String>> {
    let stamp = |s: &OpenStackClusterStatus| {
        s.api_server_managed_load_balancer
            .as_ref()
            .and_then(|lb| lb.members_as_of.clone())
    };
    let before = before?;
    let recorded = stamp(before);
    let new = stamp(status);
    if new.is_none() || new == recorded {
        return None;
    }
    let mut without = status.clone();
    if let Some(lb) = without.api_server_managed_load_balancer.as_mut() {
        lb.members_as_of.clone_from(&recorded);
    }
    (*before == without).then_some(recorded)
}

/// How long a new `membersAsOf` that is the only news waits to be written. It only spares a
/// restarted engine a tree for this LB, and each member change brings a new one a moment
/// after its own write: held, the stamps of a join, or of a whole rollout, go out as one.
const LONE_STAMP_QUIET: Duration = Duration::from_secs(60);
const LONE_STAMP: &str = "lone-members-as-of";

/// Keeps the recorded `membersAsOf` when a new stamp is all that changed and it has not been
/// the only news for [`LONE_STAMP_QUIET`]; says when it is due. A stamp cleared, or one that
/// comes with any other change, goes out at once: a recorded stamp must never vouch for
/// members other than the recorded ones, and those are written as soon as they change. A
/// held stamp is also kept in `ctx` for [`write_held_stamps`].
fn hold_lone_stamp(
    ctx: &Context,
    key: &str,
    cluster: &OpenStackCluster,
    before: Option<&OpenStackClusterStatus>,
    status: &mut OpenStackClusterStatus,
) -> Option<Duration> {
    let Some(recorded) = lone_stamp(before, status) else {
        ctx.unnote(key, LONE_STAMP);
        ctx.release_stamp(key);
        return None;
    };
    let now = tokio::time::Instant::now();
    ctx.note(key, LONE_STAMP, now);
    let waited = ctx
        .noted(key, LONE_STAMP)
        .map_or(Duration::ZERO, |since| now.saturating_duration_since(since));
    if waited >= LONE_STAMP_QUIET {
        ctx.unnote(key, LONE_STAMP);
        ctx.release_stamp(key);
        return None;
    }
    let lb = status.api_server_managed_load_balancer.as_mut()?;
    let new = std::mem::replace(&mut lb.members_as_of, recorded);
    match (new, cluster.resource_version()) {
        (Some(stamp), Some(version)) => ctx.hold_stamp(
            key,
            HeldStamp {
                namespace: cluster.namespace().unwrap_or_default(),
                name: cluster.name_any(),
                version,
                stamp,
            },
        ),
        _ => ctx.release_stamp(key),
    }
    Some(LONE_STAMP_QUIET - waited)
}

/// How long a graceful stop may spend writing held stamps: well inside a pod's 30 s grace.
const HELD_STAMPS_WITHIN: Duration = Duration::from_secs(5);

/// Writes every `membersAsOf` held back, on a graceful stop while this process still leads: a
/// restarted replica then trusts those load balancers' recorded members from one list instead
/// of reading each one's tree. Each write is conditional on the version the stamp was computed
/// over; an object changed since keeps what it records (its next leader reads its tree).
/// Returns how many were written.
pub async fn write_held_stamps(ctx: &Context) -> usize {
    let held = ctx.take_held_stamps();
    if held.is_empty() {
        return 0;
    }
    let asked = held.len();
    use futures::StreamExt;
    let writes = futures::stream::iter(held)
        .map(|held| write_held_stamp(ctx, held))
        .buffer_unordered(16)
        .filter(|written| std::future::ready(*written));
    let written = tokio::time::timeout(HELD_STAMPS_WITHIN, writes.count()).await;
    let written = written.unwrap_or_else(|_| {
        tracing::warn!(
            asked,
            "stopping: not every held membersAsOf was written in time"
        );
        0
    });
    tracing::info!(asked, written, "stopping: held membersAsOf stamps written");
    written
}

async fn write_held_stamp(ctx: &Context, held: HeldStamp) -> bool {
    let api: Api<OpenStackCluster> = Api::namespaced(ctx.client.clone(), &held.namespace);
    // A resourceVersion in a merge patch makes it conditional: 409 if the object moved.
    let patch = json!({
        "metadata": { "resourceVersion": held.version },
        "status": { "apiServerManagedLoadBalancer": { "membersAsOf": held.stamp } },
    });
    match api
        .patch_status(&held.name, &writes::params(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => true,
        Err(error) => {
            tracing::debug!(name = held.name, %error, "held membersAsOf not written");
            false
        }
    }
}

/// The Cluster API Cluster: by label, else by owner reference.
fn owner_cluster(ctx: &Context, cluster: &OpenStackCluster, namespace: &str) -> Option<Cluster> {
    super::owning_cluster(ctx, namespace, cluster.labels()).or_else(|| {
        let owner = cluster
            .owner_references()
            .iter()
            .find(|o| o.kind == "Cluster" && o.api_version.starts_with(capi::GROUP))?;
        ctx.caches.cluster(namespace, &owner.name)
    })
}

async fn provision(
    pass: &Pass<'_>,
    api: &Api<OpenStackCluster>,
    status: &mut OpenStackClusterStatus,
) -> Result<Outcome, Failure> {
    let cluster = pass.cluster;
    writes::add_finalizer(api, cluster, conditions::finalizers::CLUSTER)
        .await
        .map_err(ClusterError::kube("adding the finalizer"))
        .map_err(at(types::READY))?;
    let namespace = cluster.namespace().unwrap_or_default();
    let cloud = super::identity::cloud_client(pass.ctx, &namespace, &cluster.spec.identity_ref)
        .await
        .map_err(ClusterError::from)
        .map_err(at(types::NETWORK_READY))?;
    let mut outcome = Outcome::Settled;
    if pass.due(COMPLETE) {
        outcome = build(pass, api, &cloud, status).await?;
        if outcome == Outcome::Settled {
            pass.done(COMPLETE);
        }
    }
    let gate = publish_gate(pass, &cloud, status).await;
    if let Some(lb) = pass.lb_changed.get() {
        pass.ctx.engine.changed_lb(lb);
    }
    gate.map_err(at(types::API_SERVER_LOAD_BALANCER_READY))?;
    Ok(outcome)
}

/// A complete pass over the cloud: every step in order, each reporting its condition.
async fn build(
    pass: &Pass<'_>,
    api: &Api<OpenStackCluster>,
    cloud: &CloudClient,
    status: &mut OpenStackClusterStatus,
) -> Result<Outcome, Failure> {
    let spec = &pass.cluster.spec;
    let set = |status: &mut OpenStackClusterStatus, condition: Desired<'_>| {
        conditions::set(
            &mut status.conditions,
            &condition,
            pass.generation,
            pass.now,
        );
    };
    if pass.due(NETWORK) {
        network::reconcile(spec, &pass.names, cloud, status)
            .await
            .map_err(at(types::NETWORK_READY))?;
        set(status, network_condition(status));
        pass.done(NETWORK);
    }
    let lb_spec = plan::load_balancer(spec);
    let additional: Vec<u16> = lb_spec
        .map(|lb| plan::lb_ports(spec, lb).into_iter().skip(1).collect())
        .unwrap_or_default();
    let bastion_enabled = bastion::enabled(spec);
    if pass.due(SECURITY_GROUPS) {
        security_groups::reconcile(
            spec,
            &pass.names,
            cloud,
            bastion_enabled,
            &additional,
            status,
        )
        .await
        .map_err(at(types::SECURITY_GROUPS_READY))?;
        set(status, security_groups_condition(spec));
        pass.done(SECURITY_GROUPS);
    }
    let mut outcome = Outcome::Settled;
    let mut endpoint_note = None;
    let endpoint = match lb_spec {
        Some(lb_spec) => {
            let progress = match load_balancer::reconcile(
                spec,
                lb_spec,
                &pass.names,
                cloud,
                status,
                monitor_choice(pass, lb_spec).kind,
            )
            .await
            {
                Err(e) if e.is_busy() => LbProgress::Pending {
                    state: crate::cloud::octavia::ProvisioningStatus::PendingUpdate,
                    by_us: false,
                },
                other => other.map_err(at(types::API_ENDPOINT_READY))?,
            };
            match progress {
                LbProgress::Ready {
                    vip_port,
                    old_octavia,
                    monitor_skipped,
                } => {
                    endpoint_note = old_octavia.map(|version| {
                        format!("; allowedCIDRs not enforced: this Octavia's API is {version}, and listeners take them from 2.12")
                    });
                    if let Some(why) = monitor_skipped {
                        warn_monitor_skipped(pass, &why).await;
                    }
                    lb_endpoint(pass, cloud, vip_port, status)
                        .await
                        .map_err(at(types::API_ENDPOINT_READY))?
                }
                LbProgress::Pending { state, by_us } => {
                    // The engine wakes us when the LB settles; this is the safety net.
                    if let Some(lb) = &status.api_server_managed_load_balancer {
                        match by_us {
                            true => _ = pass.lb_changed.set(lb.id.clone()),
                            false => pass.ctx.engine.changed_under(&lb.id),
                        }
                    }
                    outcome = Outcome::Poll(pass.ctx.config.poll_max);
                    // A working endpoint stays Ready while the LB is busy (a member being
                    // added during a rollout locks it for a moment).
                    let endpoint_ready =
                        conditions::status_of(&status.conditions, types::API_ENDPOINT_READY)
                            == Status::True;
                    if !endpoint_ready {
                        set(
                            status,
                            Desired::new(
                                types::API_ENDPOINT_READY,
                                Status::False,
                                reasons::LOAD_BALANCER_PENDING,
                                format!("the API load balancer is {}", state.as_str()),
                            ),
                        );
                    }
                    None
                }
                LbProgress::Failed => {
                    set(
                        status,
                        Desired::new(
                            types::API_ENDPOINT_READY,
                            Status::False,
                            reasons::LOAD_BALANCER_ERROR,
                            "the API load balancer is in ERROR: delete it, and capo-rs creates it again",
                        ),
                    );
                    None
                }
            }
        }
        None => Some(
            direct_endpoint(pass, cloud, status)
                .await
                .map_err(at(types::API_ENDPOINT_READY))?,
        ),
    };
    if let Some(endpoint) = endpoint {
        set_endpoint(pass, api, &endpoint)
            .await
            .map_err(at(types::API_ENDPOINT_READY))?;
        let host = endpoint.host.clone().unwrap_or_default();
        let port = endpoint.port.unwrap_or_default();
        set(
            status,
            Desired::new(
                types::API_ENDPOINT_READY,
                Status::True,
                reasons::READY,
                format!("{host}:{port}{}", endpoint_note.unwrap_or_default()),
            ),
        );
    }
    if pass.due(FAILURE_DOMAINS) {
        let zones = match plan::known_zones(&status.failure_domains) {
            Some(zones) => zones,
            None => cloud
                .nova()
                .list_availability_zones()
                .await
                .map_err(ClusterError::cloud("listing availability zones"))
                .map_err(at(types::READY))?,
        };
        status.failure_domains = plan::failure_domains(spec, &zones);
        pass.done(FAILURE_DOMAINS);
    }
    if is_provisioned(status, lb_spec.is_some()) {
        status.initialization = Some(Initialization {
            provisioned: Some(true),
        });
    }
    // The bastion comes once the rest is in place, as in CAPO.
    if Initialization::is_provisioned(status.initialization.as_ref()) {
        let bastion = bastion::reconcile(pass, cloud, status)
            .await
            .map_err(at(types::READY))?;
        if let Outcome::Poll(after) = bastion
            && outcome == Outcome::Settled
        {
            outcome = Outcome::Poll(after);
        }
    }
    Ok(outcome)
}

fn network_condition(status: &OpenStackClusterStatus) -> Desired<'static> {
    let message = match &status.network {
        Some(network) => {
            let subnets: Vec<&str> = network.subnets.iter().map(|s| s.cidr.as_str()).collect();
            format!("network {} ({})", network.name, subnets.join(", "))
        }
        None => "no cluster network: machines name their own".into(),
    };
    Desired::new(types::NETWORK_READY, Status::True, reasons::READY, message)
}

fn security_groups_condition(spec: &capo_api::OpenStackClusterSpec) -> Desired<'static> {
    let message = if spec.managed_security_groups.is_some() {
        "managed security groups and their rules in place"
    } else {
        "security groups are not managed"
    };
    Desired::new(
        types::SECURITY_GROUPS_READY,
        Status::True,
        reasons::READY,
        message,
    )
}

fn is_provisioned(status: &OpenStackClusterStatus, with_lb: bool) -> bool {
    let ready = |type_| conditions::status_of(&status.conditions, type_) == Status::True;
    let lb_ready = !with_lb
        || status
            .api_server_managed_load_balancer
            .as_ref()
            .is_some_and(|lb| !lb.pools.is_empty());
    ready(types::NETWORK_READY)
        && ready(types::SECURITY_GROUPS_READY)
        && ready(types::API_ENDPOINT_READY)
        && lb_ready
}

/// The endpoint of a cluster with a load balancer: its floating IP, else its VIP.
async fn lb_endpoint(
    pass: &Pass<'_>,
    cloud: &CloudClient,
    vip_port: Option<String>,
    status: &mut OpenStackClusterStatus,
) -> Result<Option<ApiEndpoint>, ClusterError> {
    let spec = &pass.cluster.spec;
    let Some(lb) = status.api_server_managed_load_balancer.clone() else {
        return Ok(None);
    };
    let external = status.external_network.as_ref().map(|n| n.id.clone());
    let mut floating = None;
    if let Some(external) = external.filter(|_| plan::api_floating_ip_wanted(spec, true)) {
        let known = Some(lb.ip.as_str()).filter(|ip| !ip.is_empty() && *ip != lb.internal_ip);

        let ip = load_balancer::floating_ip(
            spec,
            &pass.names,
            cloud,
            &external,
            known,
            vip_port.as_deref(),
        )
        .await?;
        floating = Some(ip.floating_ip_address);
    }
    if let Some(recorded) = status.api_server_managed_load_balancer.as_mut() {
        recorded.ip = floating.clone().unwrap_or_else(|| lb.internal_ip.clone());
    }
    Ok(plan::endpoint(
        spec,
        floating.as_deref(),
        Some(lb.internal_ip.as_str()).filter(|ip| !ip.is_empty()),
    ))
}

/// The endpoint of a cluster without a load balancer: the spec's, else a floating IP (the
/// machine controller attaches it to a control-plane machine), else `apiServer.fixedIP`.
async fn direct_endpoint(
    pass: &Pass<'_>,
    cloud: &CloudClient,
    status: &OpenStackClusterStatus,
) -> Result<ApiEndpoint, ClusterError> {
    let spec = &pass.cluster.spec;
    if let Some(endpoint) =
        plan::endpoint(spec, None, None).filter(|_| spec.control_plane_endpoint.is_some())
    {
        return Ok(endpoint);
    }
    let external = status.external_network.as_ref().map(|n| n.id.clone());
    if let Some(external) = external.filter(|_| plan::api_floating_ip_wanted(spec, true)) {
        let ip =
            load_balancer::floating_ip(spec, &pass.names, cloud, &external, None, None).await?;
        if let Some(endpoint) = plan::endpoint(spec, Some(&ip.floating_ip_address), None) {
            return Ok(endpoint);
        }
    }
    plan::endpoint(spec, None, None).ok_or_else(|| {
        ClusterError::InvalidSpec(
            "unable to determine the control plane endpoint: without a load balancer, set controlPlaneEndpoint, apiServer.floatingIP with an external network, or apiServer.fixedIP".into(),
        )
    })
}

/// Writes `spec.controlPlaneEndpoint` when it differs (a spec write: Cluster API reads it).
async fn set_endpoint(
    pass: &Pass<'_>,
    api: &Api<OpenStackCluster>,
    endpoint: &ApiEndpoint,
) -> Result<(), ClusterError> {
    if pass.cluster.spec.control_plane_endpoint.as_ref() == Some(endpoint) {
        return Ok(());
    }
    let patch = Patch::Merge(json!({ "spec": { "controlPlaneEndpoint": endpoint } }));
    let written = api
        .patch(&pass.cluster.name_any(), &PatchParams::default(), &patch)
        .await
        .map_err(ClusterError::kube("setting spec.controlPlaneEndpoint"))?;
    // Only our write moved the generation: the steps done stay done.
    if let Some(next) = writes::moved_only_by_us(pass.generation, written.metadata.generation) {
        pass.ctx
            .steps_carried(pass.key, pass.generation, Some(next));
        let _ = pass.own_write.set(next);
    }
    tracing::info!(host = ?endpoint.host, port = ?endpoint.port, "control plane endpoint set");
    Ok(())
}

/// The pools of the recorded load balancer, by port.
fn pools(status: &OpenStackClusterStatus) -> BTreeMap<u16, String> {
    status
        .api_server_managed_load_balancer
        .iter()
        .flat_map(|lb| &lb.pools)
        .filter_map(|p| {
            u16::try_from(p.port)
                .ok()
                .map(|port| (port, p.pool_id.clone()))
        })
        .collect()
}

/// The gate: the desired members to the engine, its verdict to the conditions and status.
async fn publish_gate(
    pass: &Pass<'_>,
    cloud: &CloudClient,
    status: &mut OpenStackClusterStatus,
) -> Result<(), ClusterError> {
    let set = |status: &mut OpenStackClusterStatus, condition: Desired<'_>| {
        conditions::set(
            &mut status.conditions,
            &condition,
            pass.generation,
            pass.now,
        );
    };
    let lb_enabled = plan::load_balancer(&pass.cluster.spec).is_some();
    let Some(lb) = status
        .api_server_managed_load_balancer
        .clone()
        .filter(|_| lb_enabled)
    else {
        if !lb_enabled {
            for type_ in [
                types::API_SERVER_LOAD_BALANCER_READY,
                types::API_SERVER_LOAD_BALANCER_HEALTHY,
            ] {
                set(
                    status,
                    Desired::new(
                        type_,
                        Status::True,
                        reasons::LOAD_BALANCER_DISABLED,
                        "no API load balancer",
                    ),
                );
            }
        }
        return Ok(());
    };
    let pools = pools(status);
    let machines = control_plane_machines(pass);
    let ports: Vec<u16> = pools.keys().copied().collect();
    let now = tokio::time::Instant::now();
    let cidrs = gate::cluster_cidrs(status.network.as_ref());
    let members = gate::desired_members(&pass.capi_name, &cidrs, &machines, &ports, now);
    let rollout_waiting = machines
        .iter()
        .filter(|m| gate::wants_member(m, &pass.capi_name))
        .any(|m| m.spec.provider_id.is_none());
    let namespace = pass.cluster.namespace().unwrap_or_default();
    let desired = DesiredLb {
        lb_id: lb.id.clone(),
        cluster: ObjectName::new(namespace, pass.cluster.name_any()),
        pools: pools.clone(),
        members,
        rollout_waiting,
        leaving: gate::leaving_machines(&pass.capi_name, &machines),
    };
    // After a restart, what the status recorded stands if the LB's row is unchanged.
    let recalled = match pass.ctx.engine.snapshot(&lb.id) {
        None => gate::recalled(&lb),
        Some(_) => None,
    };
    let wish = pass.ctx.engine.ensure_recalled(desired, cloud, recalled);
    let Some(snapshot) = pass.ctx.engine.snapshot(&lb.id) else {
        return Ok(());
    };
    // After a restart, what was recorded stands until the engine has looked: Unknown and
    // no members, then the same again a moment later, would be two writes saying nothing.
    let recorded = conditions::find(&status.conditions, types::API_SERVER_LOAD_BALANCER_READY);
    if snapshot.verdict.reason == crate::membership::Reason::NotObserved && recorded.is_some() {
        return Ok(());
    }
    set(status, gate::gate_condition(&snapshot.verdict, now));
    let monitor_note = plan::load_balancer(&pass.cluster.spec)
        .and_then(|lb_spec| monitor_choice(pass, lb_spec).note);
    set(
        status,
        gate::health_condition(&snapshot.health, &snapshot.verdict, monitor_note.as_ref()),
    );
    // A new wish's members are a look away from their verdict, and that look's change wakes
    // this cluster: the recorded members and their stamp stand until then, so the members
    // a machine's join or removal changes go out with what the engine saw of them, in one
    // write, not two.
    if snapshot.generation < wish {
        return Ok(());
    }
    if let Some(recorded) = status.api_server_managed_load_balancer.as_mut() {
        let members = gate::member_statuses(&snapshot.members, &pools, now, pass.now);
        recorded.members = gate::keep_recorded_since(members, &snapshot.members, &recorded.members);
        recorded.members_as_of = snapshot.members_as_of.clone();
    }
    Ok(())
}

/// The cluster's control-plane OpenStackMachines, as the cache holds them (a machine that
/// does not decode is skipped). The cache may lag a machine's change by a moment; that change
/// wakes this cluster again once it is in.
/// The API pools' monitor: the cluster's annotation over the controller's flag, TCP on ovn.
fn monitor_choice(
    pass: &Pass<'_>,
    lb_spec: &capo_api::cluster::ManagedLoadBalancer,
) -> gate::MonitorChoice {
    gate::monitor_choice(
        pass.ctx.config.api_monitor,
        pass.cluster
            .annotations()
            .get(gate::MONITOR_ANNOTATION)
            .map(String::as_str),
        lb_spec.provider.as_deref(),
    )
}

fn control_plane_machines(pass: &Pass<'_>) -> Vec<OpenStackMachine> {
    let namespace = pass.cluster.namespace().unwrap_or_default();
    pass.ctx.caches.infra_machines(&namespace, |stored| {
        let labels = stored.labels();
        capi::cluster_name(labels) == Some(pass.capi_name.as_str())
            && capi::is_control_plane(labels)
    })
}

/// `Ready` from the other conditions, except that routine gate progress (members on their
/// way during a rollout) does not turn a provisioned cluster un-Ready: only what a person
/// must look at does (LoadBalancerError, MemberError, MemberStuck).
fn set_cluster_ready(status: &mut OpenStackClusterStatus, generation: Option<i64>, now: Timestamp) {
    let provisioned = Initialization::is_provisioned(status.initialization.as_ref());
    let mut view = status.conditions.clone();
    if provisioned
        && let Some(gate_condition) = view
            .iter_mut()
            .find(|c| c.type_ == types::API_SERVER_LOAD_BALANCER_READY)
        && gate_condition.status != "True"
        && crate::membership::Reason::ALL
            .iter()
            .any(|r| r.as_str() == gate_condition.reason && gate::is_routine(*r))
    {
        gate_condition.status = "True".into();
    }
    let summary = conditions::summarize_ready(&view, owned::CLUSTER_READY_FROM);
    let (ready_status, reason, message) =
        (summary.status, summary.reason.to_owned(), summary.message);
    let ready = Desired::new(types::READY, ready_status, &reason, message);
    conditions::set(&mut status.conditions, &ready, generation, now);
}

async fn write_status(
    ctx: &Context,
    key: &str,
    api: &Api<OpenStackCluster>,
    cluster: &OpenStackCluster,
    before: Option<&OpenStackClusterStatus>,
    status: &OpenStackClusterStatus,
) -> Result<(), ClusterError> {
    let name = cluster.name_any();
    let last = &ctx.last_writes;
    let written = writes::patch_status_once(last, key, api, &name, before, status, STATUS_FIELDS)
        .await
        .map_err(ClusterError::kube("writing status"))?;
    ctx.note_version(key, written);
    Ok(())
}

/// CAPO's `SkippedCreateMonitor`: the API pools serve without a health monitor because the
/// load balancer's provider implements none, and the gate reads provisioning status alone.
async fn warn_monitor_skipped(pass: &Pass<'_>, octavia_says: &str) {
    let regarding = pass.cluster.object_ref(&());
    let note = format!(
        "the API load balancer's pools have no health monitor: its provider implements none ({octavia_says}); the gate reads the members' provisioning status alone"
    );
    pass.ctx
        .event(
            &regarding,
            EventType::Warning,
            "SkippedCreateMonitor",
            "Reconcile",
            note,
        )
        .await;
}

/// The failed step's condition says what went wrong, unless it is True: a failure while
/// looking again at something in place (a 503 during a drift check) says nothing about it,
/// and shows in the log and, when terminal, in a Warning event.
async fn report_error(pass: &Pass<'_>, status: &mut OpenStackClusterStatus, failure: &Failure) {
    let error = &failure.error;
    let category = error.category();
    let message = error.to_string();
    let reason = category.reason();
    let was_true = conditions::status_of(&status.conditions, failure.condition) == Status::True;
    if !was_true {
        let condition = Desired::new(failure.condition, Status::False, reason, message.clone());
        conditions::set(
            &mut status.conditions,
            &condition,
            pass.generation,
            pass.now,
        );
    }
    if category.is_terminal() {
        tracing::warn!(reason, %message, "reconcile needs a change to go on");
        let regarding = pass.cluster.object_ref(&());
        pass.ctx
            .event(&regarding, EventType::Warning, reason, "Reconcile", message)
            .await;
    } else {
        tracing::info!(category = category.label(), %message, "reconcile failed; retrying with backoff");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_stamp(stamp: Option<&str>, members: usize) -> OpenStackClusterStatus {
        let member = capo_api::cluster::LoadBalancerMemberStatus::default();
        OpenStackClusterStatus {
            api_server_managed_load_balancer: Some(capo_api::cluster::LoadBalancerStatus {
                members_as_of: stamp.map(str::to_owned),
                members: vec![member; members],
                ..Default::default()
            }),
            ..OpenStackClusterStatus::default()
        }
    }

    #[test]
    fn only_a_new_stamp_with_nothing_else_new_is_held() {
        let recorded = with_stamp(Some("2026-11-25T10:00:00"), 2);
        let newer = with_stamp(Some("2026-11-25T10:00:09"), 2);
        assert_eq!(
            lone_stamp(Some(&recorded), &newer),
            Some(Some("2026-11-25T10:00:00".into()))
        );
        let first = with_stamp(None, 2);
        assert_eq!(lone_stamp(Some(&first), &newer), Some(None));
        // With the members it vouches for, or cleared, or unchanged: written as it is.
        assert_eq!(lone_stamp(Some(&recorded), &with_stamp(Some("x"), 3)), None);
        assert_eq!(lone_stamp(Some(&recorded), &with_stamp(None, 2)), None);
        assert_eq!(lone_stamp(Some(&recorded), &recorded.clone()), None);
        assert_eq!(lone_stamp(None, &newer), None);
    }

    fn status_with_gate(provisioned: bool, gate: (&str, &str)) -> OpenStackClusterStatus {
        let mut status = OpenStackClusterStatus {
            initialization: provisioned.then_some(Initialization {
                provisioned: Some(true),
            }),
            ..OpenStackClusterStatus::default()
        };
        let now = Timestamp::now();
        for type_ in [
            types::NETWORK_READY,
            types::SECURITY_GROUPS_READY,
            types::API_ENDPOINT_READY,
        ] {
            let ok = Desired::new(type_, Status::True, reasons::READY, "");
            conditions::set(&mut status.conditions, &ok, Some(1), now);
        }
        let (state, reason) = gate;
        let gate = Desired::new(
            types::API_SERVER_LOAD_BALANCER_READY,
            Status::parse(state),
            reason,
            "cp-1:6443",
        );
        conditions::set(&mut status.conditions, &gate, Some(1), now);
        set_cluster_ready(&mut status, Some(1), now);
        status
    }

    fn ready_of(status: &OpenStackClusterStatus) -> (String, String) {
        let ready = conditions::find(&status.conditions, types::READY).unwrap();
        (ready.status.clone(), ready.reason.clone())
    }

    #[test]
    fn routine_rollout_progress_keeps_a_provisioned_cluster_ready() {
        for routine in [
            reasons::MEMBERS_PENDING,
            reasons::MEMBERS_MISSING,
            reasons::MEMBERS_NOT_YET_SERVING,
            reasons::LOAD_BALANCER_PENDING,
        ] {
            let status = status_with_gate(true, ("False", routine));
            assert_eq!(
                ready_of(&status),
                ("True".into(), reasons::READY.into()),
                "{routine}"
            );
        }
    }

    #[test]
    fn what_needs_a_person_turns_ready_false() {
        for serious in [
            reasons::MEMBER_STUCK,
            reasons::MEMBER_ERROR,
            reasons::MEMBER_NOT_SERVING,
            reasons::LOAD_BALANCER_ERROR,
        ] {
            let status = status_with_gate(true, ("False", serious));
            assert_eq!(ready_of(&status), ("False".into(), serious.into()));
        }
    }

    #[test]
    fn before_provisioning_a_pending_load_balancer_is_not_ready() {
        let status = status_with_gate(false, ("False", reasons::LOAD_BALANCER_PENDING));
        assert_eq!(ready_of(&status).0, "False");
    }
}
