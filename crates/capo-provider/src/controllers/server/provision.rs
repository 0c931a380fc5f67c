//! Creating a server: look at what exists (by recorded ID, else by name, so a restart or a
//! lost status write adopts instead of duplicating), then take the plan's steps one at a time,
//! recording each new object in the status before the next call.

use super::floating_address;
use super::orc::{self, OrcImage};
use capo_api::OpenStackServerSpec;
use std::time::Duration;

use base64::Engine as _;
use capo_api::OpenStackServer;
use capo_api::common::{
    Initialization, InstanceStatus, MachineResources, PortStatus, ResolvedServerSpec, VolumeStatus,
};
use capo_api::conditions::{self, Desired, Status, finalizers, reasons, types};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};

use super::ServerError;
use super::plan::{self, Next, Observed, ServerState, SpecProblem, VolumeWant};
use super::resolve;
use crate::cloud::cinder::Volume;
use crate::cloud::neutron::{Filter, TRUNK_EXTENSION};
use crate::cloud::nova::Server;
use crate::cloud::{CloudClient, CloudError, Owner};
use crate::controllers::identity;
use crate::controllers::{Context, Outcome, writes};

/// How a port create's failure begins (a 404 there may be a network found by filter gone).
const CREATING_PORT: &str = "creating port";

/// The Secret key holding user data, as Cluster API's bootstrap providers write it.
pub const USER_DATA_KEY: &str = "value";

/// Everything one provisioning pass works with.
struct Pass<'a> {
    ctx: &'a Context,
    object: &'a OpenStackServer,
    cloud: CloudClient,
    name: String,
    resolved: ResolvedServerSpec,
    wants_trunk: Vec<bool>,
    volumes: Vec<VolumeWant>,
    /// The mark on what this server's pass creates, and on what it finds by name.
    owner: Owner,
    observed: Observed,
    /// The address `floatingIPPoolRef`'s pool gave, to attach once the server runs.
    floating: Option<String>,
}

pub(super) async fn run(
    object: &OpenStackServer,
    ctx: &Context,
    api: &Api<OpenStackServer>,
    status: &mut InstanceStatus,
    cluster: Option<&str>,
) -> Result<Outcome, ServerError> {
    let spec = &object.spec;
    if let Err(SpecProblem::Invalid(message)) = plan::validate(spec) {
        return Err(ServerError::InvalidSpec(message));
    }
    let name = object.name_any();
    let namespace = object.namespace().unwrap_or_default();
    let cloud = identity::cloud_client(ctx, &namespace, &spec.identity_ref).await?;
    let resolved = match status
        .resolved
        .clone()
        .filter(|r| plan::is_complete(spec, r))
    {
        Some(resolved) => resolved,
        None => {
            let spec = &with_orc_image(ctx, &namespace, spec).await?;
            let resolved = resolve::resolve(&cloud, &name, spec, cluster).await?;
            status.resolved = Some(resolved.clone());
            resolved
        }
    };
    // As CAPO: nothing is created before the finalizer is on, so nothing can leak.
    writes::add_finalizer(api, object, finalizers::SERVER)
        .await
        .map_err(ServerError::kube("adding the finalizer"))?;
    let wants_trunk: Vec<bool> = resolved
        .ports
        .iter()
        .map(|p| p.trunk == Some(true))
        .collect();
    if wants_trunk.iter().any(|w| *w) {
        require_trunks(&cloud).await?;
    }
    // As CAPO: the pool's address is had before any port is made.
    let floating = floating_address::claimed(object, ctx, status).await?;
    let volumes = plan::wanted_volumes(&name, spec, resolved.image_id.as_deref());
    let owner = plan::owner(&namespace, &name);
    let mut pass = Pass {
        ctx,
        object,
        cloud,
        name,
        resolved,
        wants_trunk,
        volumes,
        owner,
        observed: Observed {
            ports: Vec::new(),
            trunks: Vec::new(),
            volumes: Vec::new(),
            server: ServerState::Absent,
        },
        floating,
    };
    pass.observe(status).await?;
    let cloud = pass.cloud.clone();
    pass.apply(status)
        .await
        .map_err(|error| look_up_again(&cloud, spec, error, status))
}

/// A create the cloud refused because something this server found by name is gone (an image
/// re-published, a network replaced): the shared lookups forget what it was resolved to, and
/// the server resolves again on its next pass instead of failing on a stale ID. What the spec
/// names by ID stays the spec's problem.
fn look_up_again(
    cloud: &CloudClient,
    spec: &OpenStackServerSpec,
    error: ServerError,
    status: &mut InstanceStatus,
) -> ServerError {
    if !is_stale_lookup(spec, &error) {
        return error;
    }
    let Some(resolved) = status.resolved.take() else {
        return error;
    };
    let mut ids: Vec<&str> = [&resolved.image_id, &resolved.flavor_id]
        .into_iter()
        .flatten()
        .map(String::as_str)
        .collect();
    ids.extend(resolved.ports.iter().map(|p| p.network_id.as_str()));
    let forgotten = cloud.path().lookups().forget_ids(&ids);
    tracing::info!(forgotten, %error, "the cloud lost something this server was resolved to");
    ServerError::LookupGone(error.to_string())
}

/// Whether the cloud refused a create for want of something the spec names by filter or
/// name: Neutron's 404 for a port's network, Nova's 400 for the image or the flavor.
fn is_stale_lookup(spec: &OpenStackServerSpec, error: &ServerError) -> bool {
    let ServerError::Cloud { action, source } = error else {
        return false;
    };
    match source {
        CloudError::NotFound(_) if action.starts_with(CREATING_PORT) => spec
            .ports
            .iter()
            .any(|p| p.network.as_ref().is_some_and(|n| n.id.is_none())),
        CloudError::BadRequest(context)
            if context.message.contains("Can not find requested image") =>
        {
            spec.image.id.is_none()
        }
        CloudError::BadRequest(context)
            if context.message.contains("Flavor ")
                && context.message.contains("could not be found") =>
        {
            spec.flavor_id.is_none()
        }
        _ => false,
    }
}

/// A trunk is asked for only where Neutron has the extension, as CAPO checks: a clear
/// refusal before any port is made, not a failed create halfway.
async fn require_trunks(cloud: &CloudClient) -> Result<(), ServerError> {
    let offered = cloud
        .neutron()
        .has_extension(TRUNK_EXTENSION)
        .await
        .map_err(ServerError::cloud("asking Neutron for its trunk extension"))?;
    if offered {
        return Ok(());
    }
    Err(ServerError::InvalidSpec(
        "a port asks for a trunk, and this cloud's Neutron has no trunk extension: enable it, or drop `trunk` from the ports".into(),
    ))
}

/// The spec with an ORC Image (`imageRef`) replaced by the Glance ID ORC found for it;
/// an error while the Image is not available (its watch wakes the server) or failed.
async fn with_orc_image(
    ctx: &Context,
    namespace: &str,
    spec: &OpenStackServerSpec,
) -> Result<OpenStackServerSpec, ServerError> {
    let mut spec = spec.clone();
    let Some(reference) = spec.image.image_ref.take() else {
        return Ok(spec);
    };
    let image = orc::image(&ctx.client, namespace, &reference.name)
        .await
        .map_err(ServerError::kube(format!(
            "reading ORC Image {namespace}/{}",
            reference.name
        )))?;
    match image {
        OrcImage::Ready(id) => {
            spec.image.id = Some(id);
            Ok(spec)
        }
        OrcImage::Waiting(why) => Err(ServerError::ImageNotReady(why)),
        OrcImage::Failed(why) => Err(ServerError::ImageFailed(why)),
    }
}

impl Pass<'_> {
    async fn observe(&mut self, status: &InstanceStatus) -> Result<(), ServerError> {
        self.observed.server = self.find_server(status.instance_id.as_deref()).await?;
        let server_exists = matches!(self.observed.server, ServerState::Found(_));
        let recorded = status
            .resources
            .as_ref()
            .map(|r| r.ports.as_slice())
            .unwrap_or(&[]);
        self.observed.ports = if recorded.len() == self.resolved.ports.len() && server_exists {
            // Attached to a running server: trust what we recorded.
            recorded.iter().map(|p| Some(p.id.clone())).collect()
        } else if recorded.len() == self.resolved.ports.len() {
            self.check_ports(recorded).await?
        } else {
            self.find_ports().await?
        };
        if server_exists {
            return Ok(());
        }
        self.observed.trunks = self.find_trunks().await?;
        let recorded = status
            .resources
            .as_ref()
            .map(|r| r.volumes.as_slice())
            .unwrap_or(&[]);
        self.observed.volumes = self.find_volumes(recorded).await?;
        Ok(())
    }

    /// By recorded ID; else by name, the spec's tags and our owner tag (Nova's name filter is
    /// a regex, the client anchors and escapes it).
    async fn find_server(&self, recorded: Option<&str>) -> Result<ServerState, ServerError> {
        let nova = self.cloud.nova();
        if let Some(id) = recorded {
            return match nova.get_server(id).await {
                Ok(server) => Ok(ServerState::Found(Box::new(server))),
                Err(CloudError::NotFound(_)) => Ok(ServerState::Lost(id.to_owned())),
                Err(error) => Err(ServerError::cloud(format!("reading server {id}"))(error)),
            };
        }
        let mut servers = nova
            .list_servers_by_name(&self.name, &self.owner.with_tag(&self.object.spec.tags))
            .await
            .map_err(ServerError::cloud("looking up the server by name"))?;
        match servers.len() {
            0 => Ok(ServerState::Absent),
            1 => Ok(ServerState::Found(Box::new(servers.remove(0)))),
            n => {
                let ids: Vec<&str> = servers.iter().map(|s| s.id.as_str()).collect();
                Err(ServerError::Duplicates(format!(
                    "{n} servers are named {}: {}; delete the ones that are not this object's",
                    self.name,
                    ids.join(", ")
                )))
            }
        }
    }

    /// Recorded ports, checked before a server is created on them.
    async fn check_ports(
        &self,
        recorded: &[PortStatus],
    ) -> Result<Vec<Option<String>>, ServerError> {
        let mut ports = Vec::with_capacity(recorded.len());
        for port in recorded {
            match self.cloud.neutron().get_port(&port.id).await {
                Ok(found) => ports.push(Some(found.id)),
                Err(CloudError::NotFound(_)) => ports.push(None),
                Err(error) => {
                    return Err(ServerError::cloud(format!("reading port {}", port.id))(
                        error,
                    ));
                }
            }
        }
        Ok(ports)
    }

    /// Ports by name, tags and our owner tag on their network.
    async fn find_ports(&self) -> Result<Vec<Option<String>>, ServerError> {
        let mut ports = Vec::with_capacity(self.resolved.ports.len());
        for port in &self.resolved.ports {
            let filter = Filter {
                tags: self.owner.with_tag(&port.tags),
                ..Filter::by_name(&port.name)
            }
            .with("network_id", port.network_id.clone());
            let found = self
                .cloud
                .neutron()
                .list_ports(&filter)
                .await
                .map_err(ServerError::cloud(format!("looking up port {}", port.name)))?;
            ports.push(only_one("ports", &port.name, found, |p| &p.id)?.map(|p| p.id));
        }
        Ok(ports)
    }

    async fn find_trunks(&self) -> Result<Vec<Option<String>>, ServerError> {
        let mut trunks = vec![None; self.wants_trunk.len()];
        for (index, wants) in self.wants_trunk.iter().enumerate() {
            let Some(port) = self
                .observed
                .ports
                .get(index)
                .cloned()
                .flatten()
                .filter(|_| *wants)
            else {
                continue;
            };
            let filter = Filter::default().with("port_id", port.clone());
            let found =
                self.cloud
                    .neutron()
                    .list_trunks(&filter)
                    .await
                    .map_err(ServerError::cloud(format!(
                        "looking up the trunk of port {port}"
                    )))?;
            trunks[index] = found.into_iter().next().map(|t| t.id);
        }
        Ok(trunks)
    }

    async fn find_volumes(
        &self,
        recorded: &[VolumeStatus],
    ) -> Result<Vec<Option<Volume>>, ServerError> {
        let cinder = self.cloud.cinder();
        let mut volumes = Vec::with_capacity(self.volumes.len());
        for want in &self.volumes {
            let known = recorded.iter().find(|v| v.name == want.name());
            let found = match known {
                Some(known) => match cinder.get_volume(&known.id).await {
                    Ok(volume) => Some(volume),
                    Err(CloudError::NotFound(_)) => None,
                    Err(error) => {
                        return Err(ServerError::cloud(format!("reading volume {}", known.id))(
                            error,
                        ));
                    }
                },
                None => {
                    let found = cinder.list_volumes_by_name(want.name()).await.map_err(
                        ServerError::cloud(format!("looking up volume {}", want.name())),
                    )?;
                    let ours = found
                        .into_iter()
                        .filter(|v| self.owner.marks_metadata(&v.metadata))
                        .collect();
                    only_one("volumes", want.name(), ours, |v| &v.id)?
                }
            };
            volumes.push(found);
        }
        Ok(volumes)
    }

    /// The plan's steps until one has to wait or the server is reported.
    async fn apply(&mut self, status: &mut InstanceStatus) -> Result<Outcome, ServerError> {
        loop {
            match plan::next_step(&self.wants_trunk, &self.observed) {
                Next::CreatePorts(indices) => self.create_ports(&indices, status).await?,
                Next::CreateTrunks(indices) => self.create_trunks(&indices).await?,
                Next::CreateVolumes(indices) => self.create_volumes(&indices, status).await?,
                Next::WaitForVolumes(waiting) => {
                    let message = format!("waiting for volumes: {}", waiting.join(", "));
                    set_instance(
                        status,
                        self.object,
                        Status::False,
                        reasons::INSTANCE_BUILDING,
                        message,
                    );
                    let oldest = self
                        .observed
                        .volumes
                        .iter()
                        .flatten()
                        .map(|v| plan::age(v.created_at.as_deref(), chrono::Utc::now()));
                    let waited = oldest.max().unwrap_or(Duration::ZERO);
                    return Ok(Outcome::Poll(self.ctx.config.poll_after(waited)));
                }
                Next::VolumeFailed(name) => return Err(ServerError::VolumeFailed(name)),
                Next::CreateServer => return self.create_server(status).await,
                Next::Report => {
                    self.attach_floating(status).await?;
                    return Ok(self.report(status).await);
                }
                Next::Lost(id) => return Ok(self.lost(&id, status).await),
            }
        }
    }

    async fn create_ports(
        &mut self,
        indices: &[usize],
        status: &mut InstanceStatus,
    ) -> Result<(), ServerError> {
        let trusted_vif_attribute = self.trusted_vif_attribute(indices).await?;
        for &index in indices {
            let Some(want) = self.resolved.ports.get(index) else {
                continue;
            };
            let port = self
                .cloud
                .neutron()
                .create_port(&plan::port_request(
                    want,
                    &self.owner,
                    trusted_vif_attribute,
                ))
                .await
                .map_err(ServerError::cloud(format!("{CREATING_PORT} {}", want.name)))?;
            tracing::info!(port = %port.id, name = %want.name, "created port");
            self.observed.ports[index] = Some(port.id.clone());
            record_ports(status, &self.observed.ports);
            let note = format!("Created port {} ({})", want.name, port.id);
            self.event(EventType::Normal, "SuccessfulCreatePort", note)
                .await;
        }
        Ok(())
    }

    /// Whether Neutron takes a trusted VF as the port's own attribute: asked (once per cloud,
    /// then remembered) only when a port to create asks for one.
    async fn trusted_vif_attribute(&self, indices: &[usize]) -> Result<bool, ServerError> {
        let asked = (indices.iter())
            .filter_map(|&index| self.resolved.ports.get(index))
            .any(plan::asks_trusted_vf);
        if !asked {
            return Ok(false);
        }
        self.cloud
            .neutron()
            .has_extension(plan::PORT_TRUSTED_VIF)
            .await
            .map_err(ServerError::cloud(format!(
                "asking Neutron for {}",
                plan::PORT_TRUSTED_VIF
            )))
    }

    async fn create_trunks(&mut self, indices: &[usize]) -> Result<(), ServerError> {
        for &index in indices {
            let (Some(want), Some(Some(port))) = (
                self.resolved.ports.get(index),
                self.observed.ports.get(index),
            ) else {
                continue;
            };
            let description = want.description.clone().unwrap_or_default();
            let trunk = self
                .cloud
                .neutron()
                .create_trunk(&want.name, port, &description, &want.tags)
                .await
                .map_err(ServerError::cloud(format!(
                    "creating the trunk of port {}",
                    want.name
                )))?;
            tracing::info!(trunk = %trunk.id, port = %port, "created trunk");
            if let Some(slot) = self.observed.trunks.get_mut(index) {
                *slot = Some(trunk.id);
            }
        }
        Ok(())
    }

    async fn create_volumes(
        &mut self,
        indices: &[usize],
        status: &mut InstanceStatus,
    ) -> Result<(), ServerError> {
        for &index in indices {
            let Some(want) = self.volumes.get(index) else {
                continue;
            };
            let volume = self
                .cloud
                .cinder()
                .create_volume(&plan::volume_request(want, &self.owner))
                .await
                .map_err(ServerError::cloud(format!(
                    "creating volume {}",
                    want.name()
                )))?;
            tracing::info!(volume = %volume.id, name = %want.name(), "created volume");
            let note = format!("Created volume {} ({})", want.name(), volume.id);
            self.observed.volumes[index] = Some(volume);
            record_volumes(status, &self.volumes, &self.observed.volumes);
            self.event(EventType::Normal, "SuccessfulCreateVolume", note)
                .await;
        }
        Ok(())
    }

    async fn create_server(&mut self, status: &mut InstanceStatus) -> Result<Outcome, ServerError> {
        let spec = &self.object.spec;
        let user_data = self.user_data().await?;
        let port_ids: Vec<String> = self.observed.ports.iter().flatten().cloned().collect();
        let volumes: Vec<(VolumeWant, String)> = self
            .volumes
            .iter()
            .zip(&self.observed.volumes)
            .filter_map(|(want, found)| found.as_ref().map(|v| (want.clone(), v.id.clone())))
            .collect();
        let image = self.resolved.image_id.clone().unwrap_or_default();
        let devices = plan::block_devices(spec, &image, &volumes);
        let mut request = plan::server_request(
            &self.name,
            spec,
            &self.resolved,
            &port_ids,
            devices,
            user_data,
            &self.owner,
        );
        request.multiattach = self
            .observed
            .volumes
            .iter()
            .flatten()
            .any(|v| v.multiattach);
        let created = self
            .cloud
            .nova()
            .create_server(&request)
            .await
            .map_err(ServerError::cloud("creating the server"))?;
        tracing::info!(server = %created.id, "created server");
        status.instance_id = Some(created.id.clone());
        status.instance_state = Some("BUILD".into());
        let message = format!("Nova is building server {}", created.id);
        set_instance(
            status,
            self.object,
            Status::False,
            reasons::INSTANCE_BUILDING,
            message,
        );
        let note = format!("Created server {} ({})", self.name, created.id);
        self.event(EventType::Normal, "SuccessfulCreateServer", note)
            .await;
        Ok(Outcome::Poll(self.ctx.config.poll_min))
    }

    /// The pool's floating IP onto a running server, before the server is reported
    /// provisioned: a machine is not ready until its address is.
    async fn attach_floating(&self, status: &mut InstanceStatus) -> Result<(), ServerError> {
        let (Some(address), ServerState::Found(server)) = (&self.floating, &self.observed.server)
        else {
            return Ok(());
        };
        if server.status != "ACTIVE" {
            return Ok(());
        }
        // Nova lists a floating IP among the server's addresses once it is attached: nothing to
        // ask Neutron on every look at a settled server (CAPO checks the same way).
        if plan::addresses(server)
            .iter()
            .any(|a| &a.address == address)
        {
            floating_address::attached(self.object, status);
            return Ok(());
        }
        let ports: Vec<String> = self.observed.ports.iter().flatten().cloned().collect();
        floating_address::attach(&self.cloud, self.object, status, address, &ports).await
    }

    /// The user data from `userDataRef`'s Secret, base64 as Nova wants it.
    async fn user_data(&self) -> Result<Option<String>, ServerError> {
        let spec = &self.object.spec;
        let Some(name) = spec
            .user_data_ref
            .as_ref()
            .and_then(|r| r.name.clone())
            .filter(|n| !n.is_empty())
        else {
            return Ok(None);
        };
        let namespace = self.object.namespace().unwrap_or_default();
        let secrets: Api<Secret> = Api::namespaced(self.ctx.client.clone(), &namespace);
        let secret = secrets
            .get_opt(&name)
            .await
            .map_err(ServerError::kube(format!(
                "reading user-data Secret {namespace}/{name}"
            )))?
            .ok_or_else(|| {
                ServerError::UserData(format!("user-data Secret {namespace}/{name} not found"))
            })?;
        let value = secret
            .data
            .as_ref()
            .and_then(|data| data.get(USER_DATA_KEY))
            .ok_or_else(|| {
                ServerError::UserData(format!(
                    "user-data Secret {namespace}/{name} has no {USER_DATA_KEY:?} key"
                ))
            })?;
        Ok(Some(
            base64::engine::general_purpose::STANDARD.encode(&value.0),
        ))
    }

    /// The server exists: its state becomes the status.
    async fn report(&mut self, status: &mut InstanceStatus) -> Outcome {
        let ServerState::Found(server) = &self.observed.server else {
            return Outcome::Settled;
        };
        let server: &Server = server;
        record_ports(status, &self.observed.ports);
        status.instance_id = Some(server.id.clone());
        status.instance_state = Some(server.status.clone()).filter(|s| !s.is_empty());
        // Nova lists a building server's addresses as soon as its ports are bound; they go out
        // with the server's first state past BUILD, in the write that says so, as CAPO gives a
        // machine its addresses only once its server is ACTIVE. Nothing waits on them earlier:
        // a machine joins its load balancer only once its server is ready.
        if !plan::is_building(server) {
            status.addresses = plan::addresses(server);
        }
        let age = plan::age(server.created.as_deref(), chrono::Utc::now());
        let view = plan::instance_view(server, age, |waited| self.ctx.config.poll_after(waited));
        let was_provisioned = Initialization::is_provisioned(status.initialization.as_ref());
        if view.provisioned && !was_provisioned {
            status.initialization = Some(Initialization {
                provisioned: Some(true),
            });
            tracing::info!(server = %server.id, "server ACTIVE: provisioned");
        }
        let changed = set_instance_condition(status, self.object, &view.condition);
        if view.needs_attention && changed {
            self.event(
                EventType::Warning,
                view.condition.reason,
                view.condition.message.clone(),
            )
            .await;
        }
        view.poll_after.map_or(Outcome::Settled, Outcome::Poll)
    }

    /// The server we recorded is gone, and not by our hand: say so, do not recreate it
    /// (Cluster API replaces machines; a person decides for a bastion).
    async fn lost(&mut self, id: &str, status: &mut InstanceStatus) -> Outcome {
        status.instance_state = Some("DELETED".into());
        status.addresses.clear();
        let message = format!("server {id} was deleted outside capo-rs");
        let condition = Desired::new(
            types::INSTANCE_READY,
            Status::False,
            reasons::INSTANCE_NOT_FOUND,
            message.clone(),
        );
        if set_instance_condition(status, self.object, &condition) {
            self.event(EventType::Warning, reasons::INSTANCE_NOT_FOUND, message)
                .await;
        }
        Outcome::Settled
    }

    async fn event(&self, type_: EventType, reason: &str, note: String) {
        let regarding = self.object.object_ref(&());
        self.ctx
            .event(&regarding, type_, reason, "Reconcile", note)
            .await;
    }
}

/// At most one of `found`, or a conflict a person must resolve.
fn only_one<T>(
    what: &str,
    name: &str,
    mut found: Vec<T>,
    id: impl Fn(&T) -> &str,
) -> Result<Option<T>, ServerError> {
    match found.len() {
        0 => Ok(None),
        1 => Ok(Some(found.remove(0))),
        n => {
            let ids: Vec<&str> = found.iter().map(id).collect();
            Err(ServerError::Duplicates(format!(
                "{n} {what} are named {name}: {}; delete the ones that are not this object's",
                ids.join(", ")
            )))
        }
    }
}

fn record_ports(status: &mut InstanceStatus, ports: &[Option<String>]) {
    let resources = status
        .resources
        .get_or_insert_with(MachineResources::default);
    resources.ports = ports
        .iter()
        .flatten()
        .map(|id| PortStatus { id: id.clone() })
        .collect();
}

fn record_volumes(status: &mut InstanceStatus, wanted: &[VolumeWant], found: &[Option<Volume>]) {
    let resources = status
        .resources
        .get_or_insert_with(MachineResources::default);
    resources.volumes = wanted
        .iter()
        .zip(found)
        .filter_map(|(want, volume)| {
            volume.as_ref().map(|v| VolumeStatus {
                name: want.name().to_owned(),
                id: v.id.clone(),
            })
        })
        .collect();
}

fn set_instance(
    status: &mut InstanceStatus,
    object: &OpenStackServer,
    state: Status,
    reason: &str,
    message: String,
) {
    let condition = Desired::new(types::INSTANCE_READY, state, reason, message);
    set_instance_condition(status, object, &condition);
}

/// Sets InstanceReady; whether its reason or status changed (a new situation, worth an event).
fn set_instance_condition(
    status: &mut InstanceStatus,
    object: &OpenStackServer,
    condition: &Desired<'_>,
) -> bool {
    let before = conditions::find(&status.conditions, types::INSTANCE_READY)
        .map(|c| (c.status.clone(), c.reason.clone()));
    conditions::set(
        &mut status.conditions,
        condition,
        object.meta().generation,
        Timestamp::now(),
    );
    before
        != Some((
            condition.status.as_str().to_owned(),
            condition.reason.to_owned(),
        ))
}
