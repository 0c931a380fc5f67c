//! Deleting a server: the server first, coming back until Nova has let it go; then the
//! trunks and ports we created; then any volume Nova did not take with it; then the
//! finalizer. Every lookup is by recorded ID and by name too, so what a lost status write
//! forgot is still found; by name, only what carries this object's owner mark, so a
//! same-named resource of another namespace or a person is never deleted. Already gone is not
//! an error.

use capo_api::OpenStackServer;
use capo_api::common::InstanceStatus;
use capo_api::conditions::{self, Desired, Status, finalizers, reasons, types};
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};

use super::ServerError;
use super::plan;
use crate::cloud::cinder::Volume;
use crate::cloud::neutron::Filter;
use crate::cloud::nova::Server;
use crate::cloud::{CloudClient, CloudError};
use crate::controllers::identity;
use crate::controllers::{Context, Outcome, writes};

pub(super) async fn run(
    object: &OpenStackServer,
    ctx: &Context,
    api: &Api<OpenStackServer>,
    status: &mut InstanceStatus,
) -> Result<Outcome, ServerError> {
    if !object.finalizers().iter().any(|f| f == finalizers::SERVER) {
        // Nothing was created before our finalizer went on.
        return Ok(Outcome::Deleted);
    }
    let deleting = Desired::new(
        types::INSTANCE_READY,
        Status::False,
        reasons::DELETING,
        "deleting the server, then its ports and volumes",
    );
    conditions::set(
        &mut status.conditions,
        &deleting,
        object.meta().generation,
        Timestamp::now(),
    );
    let namespace = object.namespace().unwrap_or_default();
    let cloud = identity::cleanup_client(ctx, &namespace, &object.spec.identity_ref).await?;
    let waited = object
        .meta()
        .deletion_timestamp
        .as_ref()
        .and_then(|t| std::time::Duration::try_from(Timestamp::now().duration_since(t.0)).ok())
        .unwrap_or_default();
    let poll = Outcome::Poll(ctx.config.poll_after(waited));

    let servers = find_servers(&cloud, object, status.instance_id.as_deref()).await?;
    let mut going = false;
    let mut left_to_reclaim = Vec::new();
    for server in &servers {
        match delete_server(ctx, object, &cloud, server).await? {
            Leaving::Going => going = true,
            Leaving::Gone => {}
            Leaving::LeftToReclaim => left_to_reclaim.push(server.id.clone()),
        }
    }
    if going {
        status.instance_state = Some("DELETING".into());
        return Ok(poll);
    }
    status.instance_state = Some("DELETED".into());
    status.addresses.clear();

    delete_ports(ctx, object, &cloud, status).await?;
    if !delete_volumes(&cloud, object, status, &left_to_reclaim).await? {
        return Ok(poll);
    }
    super::floating_address::release(object, ctx).await?;
    writes::remove_finalizer(api, object, finalizers::SERVER)
        .await
        .map_err(ServerError::kube("removing the finalizer"))?;
    tracing::info!("deleted; finalizer removed");
    Ok(Outcome::Deleted)
}

/// The recorded server while it exists. With none recorded, every server with the object's
/// name, tags and owner mark, so that one a lost status write forgot is found too. A recorded
/// server that
/// is gone leaves nothing of ours to find: a server is never created again once one was
/// recorded, so another server of that name belongs to someone else (another namespace's
/// object of the same name, or a person's) and is not ours to delete.
async fn find_servers(
    cloud: &CloudClient,
    object: &OpenStackServer,
    recorded: Option<&str>,
) -> Result<Vec<Server>, ServerError> {
    let nova = cloud.nova();
    if let Some(id) = recorded {
        return match nova.get_server(id).await {
            Ok(server) => Ok(vec![server]),
            Err(CloudError::NotFound(_)) => Ok(Vec::new()),
            Err(error) => Err(ServerError::cloud(format!("reading server {id}"))(error)),
        };
    }
    let owner = plan::owner(&object.namespace().unwrap_or_default(), &object.name_any());
    nova.list_servers_by_name(&object.name_any(), &owner.with_tag(&object.spec.tags))
        .await
        .map_err(ServerError::cloud("looking up the server by name"))
}

/// Where a server stands after [`delete_server`].
enum Leaving {
    /// On its way out: waited for.
    Going,
    /// Gone already.
    Gone,
    /// SOFT_DELETED, and Nova refused to force its deletion: the cloud's reclaim takes it,
    /// with the volumes attached to it.
    LeftToReclaim,
}

/// Deletes a server, and says where it stands. A SOFT_DELETED
/// server (a cloud that defers deletes: `reclaim_instance_interval`) is force-deleted, since
/// deleting it again only soft-deletes it again and it would be waited for until reclaimed,
/// holding its ports, volumes and quota. If Nova refuses the force (policy, a lock), it is
/// left to the cloud's reclaim, as CAPO leaves every SOFT_DELETED server, and the deletion
/// goes on.
async fn delete_server(
    ctx: &Context,
    object: &OpenStackServer,
    cloud: &CloudClient,
    server: &Server,
) -> Result<Leaving, ServerError> {
    if server.status == "SOFT_DELETED" {
        // Nova reads SOFT_DELETED until a forced delete finishes, with a task under way: the
        // force already sent is waited for, not sent again on every pass.
        if server.task_state.is_some() {
            return Ok(Leaving::Going);
        }
        return force_delete_server(ctx, object, cloud, server).await;
    }
    match cloud.nova().delete_server(&server.id).await {
        Ok(()) | Err(CloudError::NotFound(_)) => {}
        Err(error) => {
            return Err(ServerError::cloud(format!("deleting server {}", server.id))(error));
        }
    }
    tracing::info!(server = %server.id, "deleting server");
    let note = format!("Deleting server {} ({})", server.name, server.id);
    ctx.event(
        &object.object_ref(&()),
        EventType::Normal,
        "SuccessfulDeleteServer",
        "Delete",
        note,
    )
    .await;
    Ok(Leaving::Going)
}

async fn force_delete_server(
    ctx: &Context,
    object: &OpenStackServer,
    cloud: &CloudClient,
    server: &Server,
) -> Result<Leaving, ServerError> {
    match cloud.nova().force_delete_server(&server.id).await {
        Ok(()) => {
            tracing::info!(server = %server.id, "force-deleting a SOFT_DELETED server");
            Ok(Leaving::Going)
        }
        Err(CloudError::NotFound(_)) => Ok(Leaving::Gone),
        Err(refused @ (CloudError::Forbidden(_) | CloudError::Conflict(_))) => {
            tracing::warn!(server = %server.id, error = %refused, "a SOFT_DELETED server is left to the cloud's reclaim");
            let note = format!(
                "Server {} ({}) is SOFT_DELETED and Nova refused to force its deletion ({refused}): it stays until the cloud reclaims it",
                server.name, server.id
            );
            ctx.event(
                &object.object_ref(&()),
                EventType::Warning,
                "SoftDeletedServerLeft",
                "Delete",
                note,
            )
            .await;
            Ok(Leaving::LeftToReclaim)
        }
        Err(error) => Err(ServerError::cloud(format!(
            "force-deleting SOFT_DELETED server {}",
            server.id
        ))(error)),
    }
}

/// The ports we recorded and every port with one of our port names and our owner mark, with
/// their trunks.
async fn delete_ports(
    ctx: &Context,
    object: &OpenStackServer,
    cloud: &CloudClient,
    status: &mut InstanceStatus,
) -> Result<(), ServerError> {
    let neutron = cloud.neutron();
    let mut ids: Vec<String> = status
        .resources
        .as_ref()
        .map(|r| r.ports.iter().map(|p| p.id.clone()).collect())
        .unwrap_or_default();
    let resolved = status
        .resolved
        .as_ref()
        .map(|r| r.ports.as_slice())
        .unwrap_or(&[]);
    let owner = plan::owner(&object.namespace().unwrap_or_default(), &object.name_any());
    for (index, port_name) in plan::port_names(&object.name_any(), &object.spec)
        .iter()
        .enumerate()
    {
        let mut filter = Filter {
            tags: owner.with_tag(&plan::port_tags(&object.spec, index)),
            ..Filter::by_name(port_name)
        };
        if let Some(port) = resolved.get(index) {
            filter = filter.with("network_id", port.network_id.clone());
        }
        let found = neutron
            .list_ports(&filter)
            .await
            .map_err(ServerError::cloud(format!("looking up port {port_name}")))?;
        ids.extend(found.into_iter().map(|p| p.id));
    }
    ids.sort();
    ids.dedup();
    let trunked =
        object.spec.trunk == Some(true) || object.spec.ports.iter().any(|p| p.trunk == Some(true));
    for id in &ids {
        if trunked {
            let trunks = neutron
                .list_trunks(&Filter::default().with("port_id", id.clone()))
                .await
                .map_err(ServerError::cloud(format!(
                    "looking up the trunk of port {id}"
                )))?;
            for trunk in trunks {
                match neutron.delete_trunk(&trunk.id).await {
                    Ok(()) | Err(CloudError::NotFound(_)) => {}
                    Err(error) => {
                        return Err(ServerError::cloud(format!("deleting trunk {}", trunk.id))(
                            error,
                        ));
                    }
                }
            }
        }
        match neutron.delete_port(id).await {
            Ok(()) | Err(CloudError::NotFound(_)) => {}
            Err(error) => return Err(ServerError::cloud(format!("deleting port {id}"))(error)),
        }
        tracing::info!(port = %id, "deleted port");
        if let Some(resources) = status.resources.as_mut() {
            resources.ports.retain(|p| &p.id != id);
        }
    }
    if !ids.is_empty() {
        let note = format!("Deleted ports {}", ids.join(", "));
        ctx.event(
            &object.object_ref(&()),
            EventType::Normal,
            "SuccessfulDeletePort",
            "Delete",
            note,
        )
        .await;
    }
    Ok(())
}

/// The volumes we recorded and those with our names and owner mark, that Nova did not delete
/// with the server (it was never created, or their delete is late). Whether all are gone.
async fn delete_volumes(
    cloud: &CloudClient,
    object: &OpenStackServer,
    status: &mut InstanceStatus,
    left_to_reclaim: &[String],
) -> Result<bool, ServerError> {
    let mut remaining = Vec::new();
    for volume in our_volumes(cloud, object, status).await? {
        if plan::attached_to_any(&volume.attachments, left_to_reclaim) {
            // Nova deletes it with its server when the cloud reclaims it.
            continue;
        }
        remaining.push(volume.name.clone());
        if volume.is_deleting() {
            continue;
        }
        match cloud.cinder().delete_volume(&volume.id).await {
            // Still attached while Nova lets go of it: next time.
            Ok(()) | Err(CloudError::NotFound(_) | CloudError::BadRequest(_)) => {}
            Err(error) => {
                return Err(ServerError::cloud(format!("deleting volume {}", volume.id))(error));
            }
        }
        tracing::info!(volume = %volume.id, "deleting volume");
    }
    if let Some(resources) = status.resources.as_mut() {
        resources.volumes.retain(|v| remaining.contains(&v.name));
    }
    Ok(remaining.is_empty())
}

/// What is left of the recorded volumes (CAPO's among them: it marks nothing), and every
/// volume with one of our names and our owner mark.
async fn our_volumes(
    cloud: &CloudClient,
    object: &OpenStackServer,
    status: &InstanceStatus,
) -> Result<Vec<Volume>, ServerError> {
    let cinder = cloud.cinder();
    let mut ours = Vec::new();
    let recorded = status.resources.iter().flat_map(|r| &r.volumes);
    for known in recorded {
        match cinder.get_volume(&known.id).await {
            Ok(volume) => ours.push(volume),
            Err(CloudError::NotFound(_)) => {}
            Err(error) => {
                return Err(ServerError::cloud(format!("reading volume {}", known.id))(
                    error,
                ));
            }
        }
    }
    let owner = plan::owner(&object.namespace().unwrap_or_default(), &object.name_any());
    for volume_name in plan::volume_names(&object.name_any(), &object.spec) {
        let found = cinder
            .list_volumes_by_name(&volume_name)
            .await
            .map_err(ServerError::cloud(format!(
                "looking up volume {volume_name}"
            )))?;
        ours.extend(
            found
                .into_iter()
                .filter(|v| owner.marks_metadata(&v.metadata)),
        );
    }
    ours.sort_by(|a, b| a.id.cmp(&b.id));
    ours.dedup_by(|a, b| a.id == b.id);
    Ok(ours)
}
