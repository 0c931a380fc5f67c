//! The OpenStackServer reconciler: one Nova server with its ports, trunks and volumes, for a
//! machine or a bastion. observe (Kubernetes, then the cloud) -> plan (`plan`, pure) ->
//! apply (one step at a time, recording what it created as it goes) -> status (one patch).
//!
//! Nothing here waits on OpenStack: a server building, a volume being created or a server
//! being deleted ends the reconcile with a requeue, sooner while the wait is young.

mod delete;
mod floating_address;
pub mod orc;
pub mod plan;
mod provision;
pub mod resolve;

use capo_api::capo_conditions::{self, Owner};
use std::sync::Arc;

use capo_api::OpenStackServer;
use capo_api::capi::{self, Cluster};
use capo_api::common::InstanceStatus;
use capo_api::conditions::{self, Desired, Status, owned, reasons, types};
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};

use super::error::{Categorized, ErrorCategory, FromPanic};
use super::identity::IdentityError;
use super::outcome::Outcome;
use super::packed::Packed;
use super::{Context, writes};
use crate::cloud::CloudError;
use resolve::ResolveError;

/// The `controller` label of metrics and the span name.
pub const CONTROLLER: &str = "openstackserver";

/// What the watch hands us: the object, or why it could not be read.
pub type Watched = Packed<OpenStackServer>;

/// The status fields this controller writes (and so removes when it no longer has them).
const STATUS_FIELDS: &[&str] = &[
    "initialization",
    "instanceID",
    "instanceState",
    "addresses",
    "resolved",
    "resources",
    "resources/ports",
    "resources/volumes",
    "conditions",
    "observedGeneration",
];

/// Why a reconcile of an OpenStackServer failed; its category (and [`ServerError::reason`])
/// say what happens next and what the conditions and events show.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The reconcile panicked: a bug in capo-rs, caught and retried with backoff.
    #[error("the reconcile panicked (a bug in capo-rs; please report it): {0}")]
    Panicked(String),
    /// A read or write through the Kubernetes API failed.
    #[error("{what}: {source}")]
    Kubernetes {
        /// What was being done (`adding the finalizer`, `writing status`).
        what: String,
        /// The Kubernetes client's error.
        #[source]
        source: kube::Error,
    },
    /// No OpenStack client could be had from the `identityRef`.
    #[error(transparent)]
    Identity(#[from] IdentityError),
    /// The spec cannot work as written (it fails validation, or asks for trunk ports on a
    /// Neutron without the trunk extension); the message says why.
    #[error("{0}")]
    InvalidSpec(String),
    /// The floating IP from `floatingIPPoolRef` cannot be had or attached.
    #[error("{0}")]
    FloatingIp(String),
    /// The pool has not answered the server's IPAddressClaim yet: its watch wakes us.
    #[error("{0}")]
    WaitingForAddress(String),
    /// Turning what the spec names (image, flavor, networks, subnets, security groups)
    /// into IDs failed: none or several match, or the lookup itself failed in the cloud.
    #[error(transparent)]
    Resolve(#[from] ResolveError),
    /// The user-data Secret (or its `value` key) is missing.
    #[error("{0}")]
    UserData(String),
    /// An OpenStack request failed (a 404 here came from a create naming something missing,
    /// a spec error).
    #[error("{action}: {source}")]
    Cloud {
        /// What was being done (`asking Neutron for its trunk extension`).
        action: String,
        /// The cloud's error.
        #[source]
        source: CloudError,
    },
    /// The cloud refused a create because an image, flavor or network this server found by
    /// name is gone: it is looked up again on the next pass.
    #[error("{0}; looking it up again")]
    LookupGone(String),
    /// The named Cinder volume went to status `error`; someone must delete it (reason
    /// VolumeError).
    #[error("volume {0} is in ERROR: delete it, and capo-rs creates it again")]
    VolumeFailed(String),
    /// Several servers carry our server's name: which one is ours cannot be told.
    #[error("{0}")]
    Duplicates(String),
    /// The ORC Image `spec.image.imageRef` names is not available yet: its watch wakes us.
    #[error("{0}")]
    ImageNotReady(String),
    /// ORC gave up on the Image.
    #[error("{0}")]
    ImageFailed(String),
}

impl FromPanic for ServerError {
    fn from_panic(message: String) -> Self {
        ServerError::Panicked(message)
    }
}

impl Categorized for ServerError {
    fn category(&self) -> ErrorCategory {
        match self {
            ServerError::Kubernetes { .. } => ErrorCategory::Kubernetes,
            ServerError::Panicked(_) => ErrorCategory::Internal,
            ServerError::Identity(error) => error.category(),
            ServerError::InvalidSpec(_)
            | ServerError::FloatingIp(_)
            | ServerError::VolumeFailed(_)
            | ServerError::Duplicates(_)
            | ServerError::ImageFailed(_)
            | ServerError::Resolve(ResolveError::Spec(_)) => ErrorCategory::InvalidSpec,
            // Every lookup handles its own 404; one that reaches here came from a create
            // naming something that does not exist (a network ID, a flavor ID).
            ServerError::Cloud {
                source: CloudError::NotFound(_),
                ..
            } => ErrorCategory::InvalidSpec,
            ServerError::Resolve(ResolveError::Cloud { source, .. })
            | ServerError::Cloud { source, .. } => source.category(),
            ServerError::LookupGone(_) => ErrorCategory::Transient,
            ServerError::UserData(_)
            | ServerError::ImageNotReady(_)
            | ServerError::WaitingForAddress(_) => ErrorCategory::Dependency,
        }
    }
}

impl ServerError {
    /// The condition and Event reason.
    pub fn reason(&self) -> &'static str {
        match self {
            ServerError::FloatingIp(_) => capo_conditions::capo_reasons::FLOATING_IP_ERROR,
            ServerError::VolumeFailed(_) => reasons::VOLUME_ERROR,
            ServerError::Cloud { source, .. } if source.is_quota() => reasons::QUOTA_EXCEEDED,
            _ => self.category().reason(),
        }
    }

    pub(crate) fn kube(what: impl Into<String>) -> impl FnOnce(kube::Error) -> ServerError {
        let what = what.into();
        move |source| ServerError::Kubernetes { what, source }
    }

    pub(crate) fn cloud(action: impl Into<String>) -> impl FnOnce(CloudError) -> ServerError {
        let action = action.into();
        move |source| ServerError::Cloud { action, source }
    }
}

/// One reconcile, as kube-runtime's `Controller` calls it.
pub async fn reconcile(object: Arc<Watched>, ctx: Arc<Context>) -> Result<Action, ServerError> {
    super::reconcile_watched(
        CONTROLLER,
        object,
        ctx,
        async |server, ctx, _key| reconcile_server(server, ctx).await,
        ServerError::kube("writing status"),
    )
    .await
}

/// After a failed reconcile: back off, or wait.
pub fn error_policy(object: Arc<Watched>, error: &ServerError, ctx: Arc<Context>) -> Action {
    super::back_off(CONTROLLER, object.as_ref(), error, &ctx)
}

async fn reconcile_server(server: &OpenStackServer, ctx: &Context) -> Result<Outcome, ServerError> {
    let namespace = server.namespace().unwrap_or_default();
    if super::waits_for_its_cluster(ctx, &namespace, server.meta()) {
        return Ok(Outcome::Paused);
    }
    let api: Api<OpenStackServer> = Api::namespaced(ctx.client.clone(), &namespace);
    let cluster = super::owning_cluster(ctx, &namespace, server.labels());
    let before = server.status.clone();
    let mut status = before.clone().unwrap_or_default();
    let generation = server.meta().generation;
    let now = Timestamp::now();
    conditions::initialize(&mut status.conditions, owned::SERVER, generation, now);
    let paused = capi::is_paused(cluster.as_ref(), server.annotations());
    conditions::set(
        &mut status.conditions,
        &conditions::paused(paused),
        generation,
        now,
    );
    if paused {
        write_status(ctx, &api, server, before.as_ref(), &status).await?;
        tracing::debug!("paused: nothing else touched");
        return Ok(Outcome::Paused);
    }
    let deleting = server.meta().deletion_timestamp.is_some();
    let result = if deleting {
        delete::run(server, ctx, &api, &mut status).await
    } else {
        let cluster_name = cluster_label(server, cluster.as_ref());
        provision::run(server, ctx, &api, &mut status, cluster_name.as_deref()).await
    };
    if let Err(error) = &result {
        report_error(server, ctx, &mut status, error, generation, now).await;
    }
    if matches!(result, Ok(Outcome::Deleted)) {
        // The finalizer is gone, and with it the object.
        return result;
    }
    status.observed_generation = generation;
    super::set_ready(
        &mut status.conditions,
        owned::SERVER_READY_FROM,
        generation,
        now,
    );
    capo_conditions::derive(&mut status.conditions, Owner::Server, generation, now);
    write_status(ctx, &api, server, before.as_ref(), &status).await?;
    result
}

/// The Cluster's name, from the object's label.
fn cluster_label(server: &OpenStackServer, cluster: Option<&Cluster>) -> Option<String> {
    cluster
        .map(ResourceExt::name_any)
        .or_else(|| capi::cluster_name(server.labels()).map(str::to_owned))
}

async fn write_status(
    ctx: &Context,
    api: &Api<OpenStackServer>,
    server: &OpenStackServer,
    before: Option<&InstanceStatus>,
    status: &InstanceStatus,
) -> Result<(), ServerError> {
    let key = super::object_key(CONTROLLER, server);
    let name = server.name_any();
    writes::patch_status_once(
        &ctx.last_writes,
        &key,
        api,
        &name,
        before,
        status,
        STATUS_FIELDS,
    )
    .await
    .map(|_| ())
    .map_err(ServerError::kube("writing status"))
}

/// The condition says what went wrong, unless InstanceReady is True: a failure while looking
/// again at a running server (a 503, a Secret being replaced) says nothing about the server,
/// so it stays True and the failure shows in the log and, when terminal, in a Warning event.
async fn report_error(
    server: &OpenStackServer,
    ctx: &Context,
    status: &mut InstanceStatus,
    error: &ServerError,
    generation: Option<i64>,
    now: Timestamp,
) {
    let category = error.category();
    let message = error.to_string();
    let was_ready =
        conditions::status_of(&status.conditions, types::INSTANCE_READY) == Status::True;
    if !was_ready {
        let condition = Desired::new(
            types::INSTANCE_READY,
            Status::False,
            error.reason(),
            message.clone(),
        );
        conditions::set(&mut status.conditions, &condition, generation, now);
    }
    if category.is_terminal() {
        tracing::warn!(reason = error.reason(), %message, "reconcile needs a change to go on");
        let regarding = server.object_ref(&());
        ctx.event(
            &regarding,
            EventType::Warning,
            error.reason(),
            "Reconcile",
            message,
        )
        .await;
    } else {
        tracing::info!(category = category.label(), %message, "reconcile failed; retrying with backoff");
    }
}
