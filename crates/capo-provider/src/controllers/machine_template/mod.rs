//! The OpenStackMachineTemplate reconciler, for scaling from zero: `status.capacity` (cpu,
//! memory, ephemeral-storage, storage) from the template's flavor and `status.nodeInfo`
//! from its image, as CAPO's template controller writes them (behind its AutoScaleFromZero
//! gate; always here, since it costs two reads per template change). Cluster API's
//! autoscaler reads them to scale a MachineDeployment up from 0.
//!
//! observe (the template, its Cluster, the OpenStackCluster's identity) -> read the flavor
//! and the image -> plan ([`plan`]: pure) -> status (one patch). A template is read from
//! the cloud once per generation: a template whose status already describes its current
//! generation costs nothing on a resync.

pub mod plan;

use std::sync::Arc;

use capo_api::OpenStackMachineTemplate;
use capo_api::capi;
use capo_api::capo_conditions::{self, Owner};
use capo_api::common::IdentityRef;
use capo_api::conditions::{self, Desired, Status, reasons, types};
use capo_api::machine::OpenStackMachineTemplateStatus;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::core::DeserializeGuard;
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};

use super::error::{Categorized, ErrorCategory, FromPanic};
use super::identity::IdentityError;
use super::outcome::Outcome;
use super::server::orc::{self, OrcImage};
use super::server::resolve::{self, ResolveError};
use super::{Context, writes};
use crate::cloud::{CloudClient, CloudError};

/// The `controller` label of metrics and the span name.
pub const CONTROLLER: &str = "openstackmachinetemplate";

/// What the watch hands us: the object, or why it could not be read.
pub type Watched = DeserializeGuard<OpenStackMachineTemplate>;

/// The status fields this controller writes.
const STATUS_FIELDS: &[&str] = &["capacity", "nodeInfo", "conditions", "observedGeneration"];

/// Why a reconcile of an OpenStackMachineTemplate failed; its category says what happens
/// next (a flavor Nova does not have is a spec error).
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    /// The reconcile panicked: a bug in capo-rs, caught and retried with backoff.
    #[error("the reconcile panicked (a bug in capo-rs; please report it): {0}")]
    Panicked(String),
    /// A read or write through the Kubernetes API failed.
    #[error("{what}: {source}")]
    Kubernetes {
        /// What was being done (`writing status`).
        what: String,
        /// The Kubernetes client's error.
        #[source]
        source: kube::Error,
    },
    /// No OpenStack client could be had from the `identityRef`.
    #[error(transparent)]
    Identity(#[from] IdentityError),
    /// The template's flavor or image names nothing, or not exactly one, or the lookup itself
    /// failed in the cloud.
    #[error(transparent)]
    Resolve(#[from] ResolveError),
    /// An OpenStack request failed.
    #[error("{action}: {source}")]
    Cloud {
        /// What was being done (`reading the flavor`).
        action: String,
        /// The cloud's error; a 404 counts as a spec error, others by their category.
        #[source]
        source: CloudError,
    },
}

impl FromPanic for TemplateError {
    fn from_panic(message: String) -> Self {
        TemplateError::Panicked(message)
    }
}

impl Categorized for TemplateError {
    fn category(&self) -> ErrorCategory {
        match self {
            TemplateError::Kubernetes { .. } => ErrorCategory::Kubernetes,
            TemplateError::Panicked(_) => ErrorCategory::Internal,
            TemplateError::Identity(error) => error.category(),
            TemplateError::Resolve(ResolveError::Spec(_))
            | TemplateError::Cloud {
                source: CloudError::NotFound(_),
                ..
            } => ErrorCategory::InvalidSpec,
            TemplateError::Resolve(ResolveError::Cloud { source, .. })
            | TemplateError::Cloud { source, .. } => source.category(),
        }
    }
}

/// One reconcile, as kube-runtime's `Controller` calls it.
pub async fn reconcile(object: Arc<Watched>, ctx: Arc<Context>) -> Result<Action, TemplateError> {
    super::reconcile_watched(
        CONTROLLER,
        object,
        ctx,
        async |template, ctx, _key| reconcile_template(template, ctx).await,
        |source| TemplateError::Kubernetes {
            what: "writing status".into(),
            source,
        },
    )
    .await
}

/// After a failed reconcile: back off, or wait.
pub fn error_policy(object: Arc<Watched>, error: &TemplateError, ctx: Arc<Context>) -> Action {
    super::back_off(CONTROLLER, object.as_ref(), error, &ctx)
}

async fn reconcile_template(
    template: &OpenStackMachineTemplate,
    ctx: &Context,
) -> Result<Outcome, TemplateError> {
    let namespace = template.namespace().unwrap_or_default();
    let generation = template.meta().generation;
    let before = template.status.clone();
    let described = before
        .as_ref()
        .is_some_and(|s| s.observed_generation == generation && !s.capacity.is_empty());
    if template.meta().deletion_timestamp.is_some() || described {
        return Ok(Outcome::Settled);
    }
    let cluster = super::owning_cluster(ctx, &namespace, template.labels());
    if capi::is_paused(cluster.as_ref(), template.annotations()) {
        return Ok(Outcome::Paused);
    }
    if !ctx.config.scale_from_zero {
        // Without CAPO's AutoScaleFromZero gate, no status: the template is not described
        // (no cloud read), and its ports' address pairs still reach its machines.
        propagate_address_pairs(ctx, template, &namespace).await?;
        return Ok(Outcome::Settled);
    }
    let Some(identity) = identity(ctx, template, cluster.as_ref(), &namespace) else {
        tracing::debug!("no identityRef yet (the template's or its cluster's)");
        return Ok(Outcome::Poll(ctx.config.poll_max));
    };
    let api: Api<OpenStackMachineTemplate> = Api::namespaced(ctx.client.clone(), &namespace);
    let mut status = before.clone().unwrap_or_default();
    let now = Timestamp::now();
    let result = match describe(ctx, template, &namespace, &identity, &mut status).await {
        Ok(()) => propagate_address_pairs(ctx, template, &namespace).await,
        Err(error) => Err(error),
    };
    let condition = match &result {
        Ok(()) => Desired::new(types::READY, Status::True, reasons::READY, ""),
        Err(error) => Desired::new(
            types::READY,
            Status::False,
            error.category().reason(),
            error.to_string(),
        ),
    };
    conditions::set(&mut status.conditions, &condition, generation, now);
    capo_conditions::derive(
        &mut status.conditions,
        Owner::MachineTemplate,
        generation,
        now,
    );
    if result.is_ok() {
        status.observed_generation = generation;
    }
    writes::patch_status(
        &api,
        &template.name_any(),
        before.as_ref(),
        &status,
        STATUS_FIELDS,
    )
    .await
    .map_err(|source| TemplateError::Kubernetes {
        what: "writing status".into(),
        source,
    })?;
    result.map(|()| Outcome::Settled)
}

/// The template's identity, else its cluster's (as CAPO picks the first that has one).
fn identity(
    ctx: &Context,
    template: &OpenStackMachineTemplate,
    cluster: Option<&capi::Cluster>,
    namespace: &str,
) -> Option<IdentityRef> {
    if let Some(identity) = &template.spec.template.spec.identity_ref {
        return Some(identity.clone());
    }
    let infra = cluster?
        .spec
        .infrastructure_ref
        .as_ref()
        .filter(|r| r.kind == "OpenStackCluster")?;
    let infra = ctx.caches.infra_cluster(namespace, &infra.name)?;
    Some(infra.spec.identity_ref.clone())
}

/// Reads the flavor and the image, and writes what they say into `status`.
async fn describe(
    ctx: &Context,
    template: &OpenStackMachineTemplate,
    namespace: &str,
    identity: &IdentityRef,
    status: &mut OpenStackMachineTemplateStatus,
) -> Result<(), TemplateError> {
    let spec = &template.spec.template.spec;
    let cloud = super::identity::cloud_client(ctx, namespace, identity).await?;
    let flavor = flavor(&cloud, &spec.flavor).await?;
    status.capacity = plan::capacity(&flavor, spec);
    let mut image = spec.image.clone();
    if let Some(reference) = image.image_ref.take() {
        let orc = orc::image(&ctx.client, namespace, &reference.name)
            .await
            .map_err(|source| TemplateError::Kubernetes {
                what: format!("reading ORC Image {namespace}/{}", reference.name),
                source,
            })?;
        // Not available yet: the capacity stands without nodeInfo until the next generation.
        let OrcImage::Ready(id) = orc else {
            return Ok(());
        };
        image.id = Some(id);
    }
    let image = resolve::find_image(&cloud, &image).await?;
    status.node_info = plan::node_info(&image);
    Ok(())
}

/// Gives the machines cloned from the template its ports' `allowedAddressPairs`.
async fn propagate_address_pairs(
    ctx: &Context,
    template: &OpenStackMachineTemplate,
    namespace: &str,
) -> Result<(), TemplateError> {
    let name = template.name_any();
    let machines = ctx.caches.infra_machines(namespace, |stored| {
        plan::cloned_from(stored.annotations(), &name)
    });
    let api: Api<capo_api::OpenStackMachine> = Api::namespaced(ctx.client.clone(), namespace);
    for machine in machines {
        let Some(operations) = plan::address_pairs_patch(&template.spec.template.spec, &machine)
        else {
            continue;
        };
        let patch: json_patch::Patch =
            serde_json::from_value(operations).map_err(|e| TemplateError::Kubernetes {
                what: "building the address pairs patch".into(),
                source: kube::Error::SerdeError(e),
            })?;
        api.patch(
            &machine.name_any(),
            &PatchParams::default(),
            &Patch::Json::<()>(patch),
        )
        .await
        .map_err(|source| TemplateError::Kubernetes {
            what: format!(
                "giving {} the template's allowed address pairs",
                machine.name_any()
            ),
            source,
        })?;
        tracing::info!(machine = %machine.name_any(), "the template's allowed address pairs given to a machine cloned from it");
    }
    Ok(())
}

async fn flavor(
    cloud: &CloudClient,
    param: &capo_api::common::FlavorParam,
) -> Result<crate::cloud::nova::Flavor, TemplateError> {
    let nova = cloud.nova();
    let found = match (
        &param.id,
        param.filter.as_ref().and_then(|f| f.name.as_ref()),
    ) {
        (Some(id), _) => nova.get_flavor(id).await,
        (None, Some(name)) => nova.flavor_by_name(name).await,
        (None, None) => {
            return Err(
                ResolveError::Spec("the flavor names neither an id nor a name".into()).into(),
            );
        }
    };
    found.map_err(|source| match source {
        CloudError::NotFound(_) => ResolveError::Spec(format!("no such flavor: {param:?}")).into(),
        source => TemplateError::Cloud {
            action: "reading the flavor".into(),
            source,
        },
    })
}
