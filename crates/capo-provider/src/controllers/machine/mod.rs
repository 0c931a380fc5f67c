//! The OpenStackMachine reconciler: Cluster API's InfraMachine, and the rollout gate.
//!
//! observe (the Machine, the Cluster, the OpenStackCluster, the machine's OpenStackServer,
//! the engine's snapshot) -> plan ([`plan`]: pure) -> apply (the server object; one member
//! change per pass) -> status (one patch).
//!
//! A machine waits for its Machine owner, the cluster's infrastructure and its bootstrap
//! data, then gets an OpenStackServer (the server controller builds it). A control-plane
//! machine of a cluster with an API load balancer then joins every pool, and only once the
//! engine sees its member ACTIVE in each is it released: `spec.providerID` and
//! `status.initialization.provisioned`. That is what holds Cluster API's rollout back. On
//! the way out (capo-rs's pre-terminate hook on the Machine, or the machine's own deletion)
//! its members are removed and seen gone before anything else goes.

mod address_pairs;
mod api_address;
mod members;

pub use address_pairs::APPLIED_ANNOTATION as ADDRESS_PAIRS_ANNOTATION;

pub use members::REPAIRS_ANNOTATION;
pub mod plan;

use std::sync::Arc;

use capo_api::capi::{self, Cluster, Machine};
use capo_api::capo_conditions::{self, Owner};
use capo_api::common::{Initialization, InstanceStatus};
use capo_api::conditions::{self, Desired, Status, owned, reasons, types};
use capo_api::{OpenStackCluster, OpenStackMachine, OpenStackServer};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};

use super::packed::Packed;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::error::{Categorized, ErrorCategory, FromPanic};
use super::identity::IdentityError;
use super::outcome::Outcome;
use super::server::resolve::ResolveError;
use super::{Context, writes};
use crate::cloud::CloudError;

/// The `controller` label of metrics and the span name.
pub const CONTROLLER: &str = "openstackmachine";

/// What the watch hands us: the object, or why it could not be read.
pub type Watched = Packed<OpenStackMachine>;

/// The status fields this controller writes (and so removes when it no longer has them).
const STATUS_FIELDS: &[&str] = &[
    "initialization",
    "instanceID",
    "instanceState",
    "failureDomain",
    "addresses",
    "resolved",
    "resources",
    "conditions",
    "observedGeneration",
];

/// Why a reconcile of an OpenStackMachine failed; its category says what happens next.
#[derive(Debug, thiserror::Error)]
pub enum MachineError {
    /// The reconcile panicked: a bug in capo-rs, caught and retried with backoff.
    #[error("the reconcile panicked (a bug in capo-rs; please report it): {0}")]
    Panicked(String),
    /// A read or write through the Kubernetes API failed.
    #[error("{what}: {source}")]
    Kubernetes {
        /// What was being done (`creating the OpenStackServer`, `writing status`).
        what: String,
        /// The Kubernetes client's error.
        #[source]
        source: kube::Error,
    },
    /// No OpenStack client could be had from the `identityRef`.
    #[error(transparent)]
    Identity(#[from] IdentityError),
    /// Finding the subnet of a load balancer member failed: none or several match, or
    /// the lookup itself failed in the cloud.
    #[error(transparent)]
    Resolve(#[from] ResolveError),
    /// The spec cannot work as written; the message says why.
    #[error("{0}")]
    InvalidSpec(String),
    /// An OpenStack request failed.
    #[error("{action}: {source}")]
    Cloud {
        /// What was being done (`deleting the member`).
        action: String,
        /// The cloud's error; its category is the error's.
        #[source]
        source: CloudError,
    },
}

impl FromPanic for MachineError {
    fn from_panic(message: String) -> Self {
        MachineError::Panicked(message)
    }
}

impl Categorized for MachineError {
    fn category(&self) -> ErrorCategory {
        match self {
            MachineError::Kubernetes { .. } => ErrorCategory::Kubernetes,
            MachineError::Panicked(_) => ErrorCategory::Internal,
            MachineError::Identity(error) => error.category(),
            MachineError::Resolve(ResolveError::Spec(_)) => ErrorCategory::InvalidSpec,
            MachineError::Resolve(ResolveError::Cloud { source, .. }) => source.category(),
            MachineError::InvalidSpec(_) => ErrorCategory::InvalidSpec,
            MachineError::Cloud { source, .. } => source.category(),
        }
    }
}

impl MachineError {
    pub(crate) fn kube(what: impl Into<String>) -> impl FnOnce(kube::Error) -> MachineError {
        let what = what.into();
        move |source| MachineError::Kubernetes { what, source }
    }

    pub(crate) fn cloud(action: impl Into<String>) -> impl FnOnce(CloudError) -> MachineError {
        let action = action.into();
        move |source| MachineError::Cloud { action, source }
    }
}

/// The key of an OpenStackMachine in the context's per-object state.
pub fn object_key(namespace: &str, name: &str) -> String {
    format!("{CONTROLLER}/{namespace}/{name}")
}

/// One reconcile, as kube-runtime's `Controller` calls it.
pub async fn reconcile(object: Arc<Watched>, ctx: Arc<Context>) -> Result<Action, MachineError> {
    super::reconcile_watched(
        CONTROLLER,
        object,
        ctx,
        reconcile_machine,
        MachineError::kube("writing status"),
    )
    .await
}

/// After a failed reconcile: back off, or wait.
pub fn error_policy(object: Arc<Watched>, error: &MachineError, ctx: Arc<Context>) -> Action {
    super::back_off(CONTROLLER, object.as_ref(), error, &ctx)
}

/// The objects a machine hangs from, as far as they exist.
struct Owners {
    machine: Option<Machine>,
    cluster: Option<Cluster>,
    infra: Option<OpenStackCluster>,
}

/// Everything one pass knows.
struct Pass<'a> {
    osm: &'a OpenStackMachine,
    ctx: &'a Context,
    key: &'a str,
    namespace: String,
    name: String,
    generation: Option<i64>,
    now: Timestamp,
    /// The generation our own spec write (the providerID) moved the object to, when nothing
    /// else moved it.
    own_write: std::sync::OnceLock<i64>,
}

impl Pass<'_> {
    fn set(&self, status: &mut InstanceStatus, condition: &Desired<'_>) {
        conditions::set(&mut status.conditions, condition, self.generation, self.now);
    }

    async fn event(&self, type_: EventType, reason: &str, note: String) {
        let regarding = self.osm.object_ref(&());
        self.ctx
            .event(&regarding, type_, reason, "LoadBalancerMember", note)
            .await;
    }
}

async fn reconcile_machine(
    osm: &OpenStackMachine,
    ctx: &Context,
    key: &str,
) -> Result<Outcome, MachineError> {
    let namespace = osm.namespace().unwrap_or_default();
    if super::waits_for_its_cluster(ctx, &namespace, osm.meta()) {
        return Ok(Outcome::Paused);
    }
    let api: Api<OpenStackMachine> = Api::namespaced(ctx.client.clone(), &namespace);
    let owners = observe(ctx, osm, &namespace);
    let before = osm.status.clone();
    let mut status = before.clone().unwrap_or_default();
    let generation = osm.meta().generation;
    let now = Timestamp::now();
    conditions::initialize(&mut status.conditions, owned::MACHINE, generation, now);
    let paused = capi::is_paused(owners.cluster.as_ref(), osm.annotations());
    conditions::set(
        &mut status.conditions,
        &conditions::paused(paused),
        generation,
        now,
    );
    if paused {
        write_status(ctx, key, &api, osm, before.as_ref(), &status).await?;
        return Ok(Outcome::Paused);
    }
    let pass = Pass {
        osm,
        ctx,
        key,
        name: osm.name_any(),
        namespace,
        generation,
        now,
        own_write: std::sync::OnceLock::new(),
    };
    let deleting = osm.meta().deletion_timestamp.is_some();
    let result = if deleting {
        delete(&pass, &api, &owners, &mut status).await
    } else {
        provision(&pass, &api, &owners, &mut status).await
    };
    if let Err(error) = &result {
        report_error(&pass, &mut status, error).await;
    }
    if matches!(result, Ok(Outcome::Deleted)) {
        return result;
    }
    status.observed_generation = generation;
    super::set_ready(
        &mut status.conditions,
        owned::MACHINE_READY_FROM,
        generation,
        now,
    );
    let control_plane = capi::is_control_plane(osm.labels());
    capo_conditions::derive(
        &mut status.conditions,
        Owner::Machine { control_plane },
        generation,
        now,
    );
    let own_write = pass.own_write.get().copied();
    let observed = &mut status.observed_generation;
    conditions::advance_generation(&mut status.conditions, observed, generation, own_write);
    members::announce(&pass, before.as_ref(), &status).await;
    write_status(ctx, key, &api, osm, before.as_ref(), &status).await?;
    result
}

/// The Machine that owns the OpenStackMachine, its Cluster and the OpenStackCluster, as the
/// caches hold them.
fn observe(ctx: &Context, osm: &OpenStackMachine, namespace: &str) -> Owners {
    let machine = osm
        .owner_references()
        .iter()
        .find(|o| o.kind == "Machine" && o.api_version.starts_with(capi::GROUP))
        .and_then(|owner| ctx.caches.machine(namespace, &owner.name));
    let cluster = super::owning_cluster(ctx, namespace, osm.labels());
    let infra_name = cluster
        .as_ref()
        .and_then(|c| c.spec.infrastructure_ref.as_ref())
        .filter(|r| r.kind == "OpenStackCluster")
        .map(|r| r.name.clone())
        .or_else(|| cluster.as_ref().map(ResourceExt::name_any));
    let infra = infra_name.and_then(|name| ctx.caches.infra_cluster(namespace, &name));
    Owners {
        machine,
        cluster,
        infra,
    }
}

/// Waiting for something Cluster API provides: said on InstanceReady (`reason`), nothing
/// touched.
fn waiting(pass: &Pass<'_>, status: &mut InstanceStatus, reason: &str, message: &str) -> Outcome {
    let condition = Desired::new(types::INSTANCE_READY, Status::False, reason, message);
    pass.set(status, &condition);
    tracing::debug!(message, "waiting");
    Outcome::Settled
}

async fn provision(
    pass: &Pass<'_>,
    api: &Api<OpenStackMachine>,
    owners: &Owners,
    status: &mut InstanceStatus,
) -> Result<Outcome, MachineError> {
    // As Cluster API's contract says: nothing before a Machine owns us.
    let Some(machine) = &owners.machine else {
        return Ok(waiting(
            pass,
            status,
            reasons::DEPENDENCY_MISSING,
            "waiting for Cluster API: no Machine owns this OpenStackMachine yet",
        ));
    };
    writes::add_finalizer(api, pass.osm, conditions::finalizers::MACHINE)
        .await
        .map_err(MachineError::kube("adding the finalizer"))?;
    if let Some((label, value)) =
        plan::missing_control_plane_label(pass.osm.labels(), machine.labels())
    {
        let patch = Patch::Merge(json!({ "metadata": { "labels": { label: value } } }));
        api.patch(&pass.name, &PatchParams::default(), &patch)
            .await
            .map_err(MachineError::kube(
                "copying the Machine's control-plane label",
            ))?;
        tracing::info!(
            label,
            "a control-plane Machine: its label copied to the OpenStackMachine"
        );
        // Nothing joins or is released on this pass's view, which took it for a worker.
        return Ok(Outcome::Poll(pass.ctx.config.poll_min));
    }
    let Some(infra) = owners.infra.as_ref().filter(|c| {
        Initialization::is_provisioned(c.status.as_ref().and_then(|s| s.initialization.as_ref()))
    }) else {
        return Ok(waiting(
            pass,
            status,
            reasons::WAITING_FOR_CLUSTER_INFRASTRUCTURE,
            "waiting for the cluster's infrastructure to be provisioned",
        ));
    };
    let Some(user_data) = machine.spec.bootstrap.data_secret_name.clone() else {
        return Ok(waiting(
            pass,
            status,
            reasons::WAITING_FOR_BOOTSTRAP_DATA,
            "waiting for bootstrap data (Machine spec.bootstrap.dataSecretName)",
        ));
    };
    status.failure_domain = machine.spec.failure_domain.clone();
    let Some(server) = ensure_server(pass, machine, infra, user_data).await? else {
        return Ok(Outcome::Poll(pass.ctx.config.poll_max));
    };
    copy_server_status(&server, status);
    let instance_ready =
        conditions::status_of(&status.conditions, types::INSTANCE_READY) == Status::True;
    // A Machine deleted while its server does not run (a failed node) still leaves at
    // capo-rs's hook: the address moves on without it, or its members go (never the pool's
    // last ready one), and the hook is removed.
    if !instance_ready && machine.metadata.deletion_timestamp.is_some() {
        if let Some(address) = api_address::wanted(pass, owners, infra) {
            return api_address::join(pass, machine, &address, status).await;
        }
        if let Some(lb) = members::load_balancer(pass, owners, infra) {
            return members::reconcile(pass, machine, &lb, status).await;
        }
    }
    if !instance_ready {
        // The server controller writes its status as it builds: its watch wakes us.
        return Ok(Outcome::Poll(pass.ctx.config.poll_max));
    }
    let applied = pass
        .osm
        .annotations()
        .get(address_pairs::APPLIED_ANNOTATION);
    if let Some(push) = address_pairs::plan(&pass.osm.spec, &server, applied.map(String::as_str)) {
        address_pairs::apply(pass, api, &server, push).await?;
    }
    if let Some(address) = api_address::wanted(pass, owners, infra) {
        return api_address::join(pass, machine, &address, status).await;
    }
    match members::load_balancer(pass, owners, infra) {
        Some(lb) => members::reconcile(pass, machine, &lb, status).await,
        None => {
            let reason = if capi::is_control_plane(pass.osm.labels()) {
                (
                    reasons::LOAD_BALANCER_DISABLED,
                    "the cluster has no API load balancer",
                )
            } else {
                (
                    reasons::NOT_CONTROL_PLANE,
                    "a worker: only control-plane machines join the API load balancer",
                )
            };
            let condition = Desired::new(
                types::API_SERVER_LOAD_BALANCER_MEMBER_READY,
                Status::True,
                reason.0,
                reason.1,
            );
            pass.set(status, &condition);
            release(pass, status).await?;
            Ok(Outcome::Settled)
        }
    }
}

/// The machine's OpenStackServer: created (owned by the machine) when missing; `None` while
/// it is being replaced.
async fn ensure_server(
    pass: &Pass<'_>,
    machine: &Machine,
    infra: &OpenStackCluster,
    user_data: String,
) -> Result<Option<OpenStackServer>, MachineError> {
    if let Some(server) = pass.ctx.caches.server(&pass.namespace, &pass.name) {
        return Ok(Some(server));
    }
    let servers: Api<OpenStackServer> = Api::namespaced(pass.ctx.client.clone(), &pass.namespace);
    let infra_status = infra.status.clone().unwrap_or_default();
    let control_plane = capi::is_control_plane(pass.osm.labels());
    let placement = plan::Placement {
        cluster: &infra.spec,
        status: &infra_status,
        role_security_group: plan::role_security_group(&infra.spec, &infra_status, control_plane),
        availability_zone: machine.spec.failure_domain.clone(),
        user_data: Some(user_data),
    };
    let mut server =
        OpenStackServer::new(&pass.name, plan::server_spec(&pass.osm.spec, &placement));
    server.metadata.namespace = Some(pass.namespace.clone());
    server.metadata.labels = Some(pass.osm.labels().clone());
    server.metadata.owner_references = Some(vec![OwnerReference {
        api_version: OpenStackMachine::api_version(&()).into_owned(),
        kind: "OpenStackMachine".into(),
        name: pass.name.clone(),
        uid: pass.osm.uid().unwrap_or_default(),
        block_owner_deletion: Some(true),
        controller: Some(true),
    }]);
    match servers.create(&PostParams::default(), &server).await {
        Ok(created) => {
            tracing::info!("created the OpenStackServer");
            Ok(Some(created))
        }
        // Made by an earlier pass a moment ago: the next pass reads it.
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(None),
        Err(e) => Err(MachineError::kube("creating the OpenStackServer")(e)),
    }
}

/// What the server controller found out, as the machine's status.
fn copy_server_status(server: &OpenStackServer, status: &mut InstanceStatus) {
    let Some(server_status) = server.status.as_ref() else {
        return;
    };
    status.instance_id.clone_from(&server_status.instance_id);
    status
        .instance_state
        .clone_from(&server_status.instance_state);
    status.addresses = plan::machine_addresses(&server_status.addresses, &server.name_any());
    status.resolved.clone_from(&server_status.resolved);
    status.resources.clone_from(&server_status.resources);
    if let Some(ready) = conditions::find(&server_status.conditions, types::INSTANCE_READY) {
        let condition = Desired::new(
            types::INSTANCE_READY,
            Status::parse(&ready.status),
            &ready.reason,
            ready.message.clone(),
        );
        conditions::set(&mut status.conditions, &condition, None, Timestamp::now());
        if let Some(copied) = status
            .conditions
            .iter_mut()
            .find(|c| c.type_ == types::INSTANCE_READY)
        {
            copied.last_transition_time = ready.last_transition_time.clone();
        }
    }
}

/// Tells Cluster API the machine is ready: `spec.providerID` and `provisioned` (write-once).
async fn release(pass: &Pass<'_>, status: &mut InstanceStatus) -> Result<bool, MachineError> {
    let Some(instance) = status.instance_id.clone() else {
        return Ok(false);
    };
    status.initialization = Some(Initialization {
        provisioned: Some(true),
    });
    // Set once (the CRD refuses a change): one already there, CAPO's included, stays.
    if pass
        .osm
        .spec
        .provider_id
        .as_deref()
        .is_some_and(|id| !id.is_empty())
    {
        return Ok(false);
    }
    let region = pass
        .osm
        .spec
        .identity_ref
        .as_ref()
        .and_then(|i| i.region.as_deref());
    let provider_id = plan::provider_id(region, &instance);
    let api: Api<OpenStackMachine> = Api::namespaced(pass.ctx.client.clone(), &pass.namespace);
    let patch = Patch::Merge(json!({ "spec": { "providerID": provider_id } }));
    let written = api
        .patch(&pass.name, &PatchParams::default(), &patch)
        .await
        .map_err(MachineError::kube("setting spec.providerID"))?;
    // Only our write moved the generation: what this pass observed holds at the next one.
    if let Some(next) = writes::moved_only_by_us(pass.generation, written.metadata.generation) {
        let _ = pass.own_write.set(next);
    }
    tracing::info!(%provider_id, "machine released to Cluster API");
    Ok(true)
}

async fn delete(
    pass: &Pass<'_>,
    api: &Api<OpenStackMachine>,
    owners: &Owners,
    status: &mut InstanceStatus,
) -> Result<Outcome, MachineError> {
    if !pass
        .osm
        .finalizers()
        .iter()
        .any(|f| f == conditions::finalizers::MACHINE)
    {
        return Ok(Outcome::Deleted);
    }
    let deleting = Desired::new(
        types::READY,
        Status::False,
        reasons::DELETING,
        "deleting: load balancer members, then the server",
    );
    pass.set(status, &deleting);
    if let Some(address) = owners
        .infra
        .as_ref()
        .and_then(|infra| api_address::wanted(pass, owners, infra))
    {
        match api_address::leave(pass, &address, status).await? {
            members::Left::Done => {}
            members::Left::Waiting(outcome) => return Ok(outcome),
        }
        if let Some(machine) = &owners.machine {
            members::drop_hook(pass, machine).await?;
        }
    }
    if let Some(lb) = owners
        .infra
        .as_ref()
        .and_then(|infra| members::load_balancer(pass, owners, infra))
    {
        match members::leave(pass, &lb, status).await? {
            members::Left::Done => {}
            members::Left::Waiting(outcome) => return Ok(outcome),
        }
        if let Some(machine) = &owners.machine {
            members::drop_hook(pass, machine).await?;
        }
    }
    let servers: Api<OpenStackServer> = Api::namespaced(pass.ctx.client.clone(), &pass.namespace);
    // The cache says whether it is there; only "gone", which lets the finalizer go, is
    // confirmed with the API server.
    let server = match pass.ctx.caches.server(&pass.namespace, &pass.name) {
        Some(server) => Some(server),
        None => servers
            .get_opt(&pass.name)
            .await
            .map_err(MachineError::kube("reading the OpenStackServer"))?,
    };
    if let Some(server) = server {
        if server.meta().deletion_timestamp.is_none() {
            match servers.delete(&pass.name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(MachineError::kube("deleting the OpenStackServer")(e)),
            }
        }
        // The server's own deletion wakes us through its watch.
        return Ok(Outcome::Poll(pass.ctx.config.poll_max));
    }
    writes::remove_finalizer(api, pass.osm, conditions::finalizers::MACHINE)
        .await
        .map_err(MachineError::kube("removing the finalizer"))?;
    tracing::info!("deleted");
    Ok(Outcome::Deleted)
}

async fn write_status(
    ctx: &Context,
    key: &str,
    api: &Api<OpenStackMachine>,
    osm: &OpenStackMachine,
    before: Option<&InstanceStatus>,
    status: &InstanceStatus,
) -> Result<(), MachineError> {
    let name = osm.name_any();
    writes::patch_status_once(
        &ctx.last_writes,
        key,
        api,
        &name,
        before,
        status,
        STATUS_FIELDS,
    )
    .await
    .map(|_| ())
    .map_err(MachineError::kube("writing status"))
}

/// The condition of the failing part says what went wrong, unless it is True; terminal
/// errors also get a Warning event.
async fn report_error(pass: &Pass<'_>, status: &mut InstanceStatus, error: &MachineError) {
    let category = error.category();
    let message = error.to_string();
    let reason = category.reason();
    let condition_type = match error {
        MachineError::Cloud { .. } => types::API_SERVER_LOAD_BALANCER_MEMBER_READY,
        _ => types::INSTANCE_READY,
    };
    if conditions::status_of(&status.conditions, condition_type) != Status::True {
        pass.set(
            status,
            &Desired::new(condition_type, Status::False, reason, message.clone()),
        );
    }
    if category.is_terminal() {
        tracing::warn!(reason, %message, "reconcile needs a change to go on");
        pass.event(EventType::Warning, reason, message).await;
    } else {
        tracing::info!(category = category.label(), %message, "reconcile failed; retrying with backoff");
    }
}
