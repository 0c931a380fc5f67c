//! The API floating IP of a cluster without a load balancer: it points at one control-plane
//! machine's port on the cluster network, as CAPO's machine controller attaches it
//! (`reconcileAPIServerLoadBalancer`).
//!
//! Where CAPO leaves a gap, capo-rs goes further. CAPO leaves the address on whichever
//! machine took it first, and when that machine is deleted it deletes the address (or
//! Neutron detaches it with the port). The endpoint then answers nothing until another
//! machine happens to be reconciled. Here a leaving machine hands the address to the
//! fittest other control-plane machine inside capo-rs's pre-terminate hook, before its
//! server goes; the address itself belongs to the cluster, which releases it on deletion.

use capo_api::capi::{self, Machine};
use capo_api::common::{IdentityRef, InstanceStatus};
use capo_api::conditions::{self, Status, reasons, types};
use capo_api::{OpenStackCluster, OpenStackMachine};
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};

use super::members::{self, Left};
use super::plan::{self, AddressStep, Holder};
use super::{MachineError, Owners, Pass};
use crate::cloud::CloudClient;
use crate::cloud::neutron::FloatingIp;
use crate::controllers::cluster::plan::{self as cluster_plan, Names};
use crate::controllers::gate;
use crate::controllers::outcome::Outcome;
use crate::controllers::packed::Packed;

/// How often a leaving machine that carries the address looks for a successor.
const SUCCESSOR_RECHECK: std::time::Duration = std::time::Duration::from_secs(10);
/// How often a running machine looks at the address: one freed behind capo-rs's back (its
/// holder's port deleted without the hook) is taken again within this.
const ORPHAN_RECHECK: std::time::Duration = std::time::Duration::from_secs(60);

/// What a control-plane machine needs to know of its cluster's API floating IP.
pub struct ApiAddress {
    pub address: String,
    pub external_network: String,
    /// The cluster network, where the address's port must be.
    pub network: String,
    pub cluster: String,
    pub names: Names,
    pub tags: Vec<String>,
    pub identity: IdentityRef,
    pub cluster_deleting: bool,
}

/// The API floating IP a control-plane machine carries: only without a load balancer, with
/// a floating IP wanted, and once the cluster knows its address and network.
pub fn wanted(pass: &Pass<'_>, owners: &Owners, infra: &OpenStackCluster) -> Option<ApiAddress> {
    if !capi::is_control_plane(pass.osm.labels())
        || cluster_plan::load_balancer(&infra.spec).is_some()
    {
        return None;
    }
    let status = infra.status.as_ref()?;
    let external_network = status.external_network.as_ref()?.id.clone();
    if !cluster_plan::api_floating_ip_wanted(&infra.spec, true) {
        return None;
    }
    let endpoint = infra
        .spec
        .control_plane_endpoint
        .as_ref()
        .and_then(|e| e.host.clone());
    let given = infra
        .spec
        .api_server
        .as_ref()
        .and_then(|a| a.floating_ip.clone());
    // Only an address can be a floating IP (a DNS name the user gave is theirs to point).
    let address = endpoint
        .or(given)
        .filter(|a| a.parse::<std::net::IpAddr>().is_ok())?;
    let cluster = members::capi_cluster_name(owners, infra);
    let cluster_deleting = members::cluster_deleting(owners, infra);
    Some(ApiAddress {
        address,
        external_network,
        network: status.network.as_ref()?.id.clone(),
        names: Names::new(&infra.namespace().unwrap_or_default(), &cluster),
        cluster,
        tags: cluster_plan::tags(&infra.spec),
        identity: infra.spec.identity_ref.clone(),
        cluster_deleting,
    })
}

/// A running control-plane machine: the address goes to it when nobody fit carries it, and
/// it is released once the address points at a fit machine.
pub async fn join(
    pass: &Pass<'_>,
    machine: &Machine,
    api: &ApiAddress,
    status: &mut InstanceStatus,
) -> Result<Outcome, MachineError> {
    if machine.metadata.deletion_timestamp.is_some() {
        return members::leave_at_hook(pass, machine, leave(pass, api, status)).await;
    }
    if api.cluster_deleting {
        // The cluster releases the address; allocating it again here could leak it.
        return Ok(Outcome::Settled);
    }
    members::ensure_hook(pass, machine).await?;
    let cloud = cloud(pass, api).await?;
    let ip = find_or_allocate(&cloud, api).await?;
    let own_port = plan::port_on_network(status, &api.network);
    let others = holders(pass, api);
    let step = plan::joining_address_step(
        ip.port_id.as_deref(),
        own_port.as_deref(),
        &pass.name,
        &others,
    );
    let (state, reason, message) = match &step {
        AddressStep::Attach { port, .. } => {
            attach(&cloud, &ip, port).await?;
            tracing::info!(address = %api.address, port, "API floating IP attached to this machine");
            let note = format!(
                "the API floating IP {} now points at this machine",
                api.address
            );
            pass.event(EventType::Normal, "FloatingIPAttached", note.clone())
                .await;
            (Status::True, reasons::FLOATING_IP_ATTACHED, note)
        }
        AddressStep::Keep {
            holder: Some(holder),
        } => (
            Status::True,
            reasons::FLOATING_IP_ATTACHED,
            format!("the API floating IP {} points at {holder}", api.address),
        ),
        AddressStep::Keep { holder: None } => (
            Status::True,
            reasons::FLOATING_IP_ATTACHED,
            format!(
                "the API floating IP {} points at a port capo-rs does not manage; left there",
                api.address
            ),
        ),
        AddressStep::NoPort | AddressStep::NoSuccessor => (
            Status::False,
            capo_api::capo_conditions::capo_reasons::FLOATING_IP_ERROR,
            format!(
                "the API floating IP {} is free and this machine has no port on the cluster network {}",
                api.address, api.network
            ),
        ),
    };
    members::set(pass, status, reason, state, message);
    if state == Status::True {
        super::release(pass, status).await?;
        return Ok(Outcome::Poll(ORPHAN_RECHECK));
    }
    Ok(Outcome::Poll(SUCCESSOR_RECHECK))
}

/// A machine on its way out: when it carries the address, it hands it over first; held while
/// no other machine can take it (unless the cluster goes too).
pub async fn leave(
    pass: &Pass<'_>,
    api: &ApiAddress,
    status: &mut InstanceStatus,
) -> Result<Left, MachineError> {
    if api.cluster_deleting {
        return Ok(Left::Done);
    }
    // A machine whose server no longer runs (a failed node) serves nothing: it hands the
    // address over all the same, but is never held for want of a successor.
    let running = conditions::status_of(&status.conditions, types::INSTANCE_READY) == Status::True;
    let Some(own_port) = plan::port_on_network(status, &api.network) else {
        return Ok(Left::Done);
    };
    let cloud = cloud(pass, api).await?;
    let Some(ip) = find(&cloud, &api.address).await? else {
        return Ok(Left::Done);
    };
    let others = holders(pass, api);
    match plan::leaving_address_step(ip.port_id.as_deref(), Some(&own_port), &others) {
        AddressStep::Attach { machine, port } => {
            attach(&cloud, &ip, &port).await?;
            tracing::info!(address = %api.address, successor = %machine, "API floating IP handed over");
            let note = format!(
                "the API floating IP {} handed over to {machine} before this machine goes",
                api.address
            );
            pass.event(EventType::Normal, "FloatingIPMoved", note.clone())
                .await;
            members::set(
                pass,
                status,
                reasons::FLOATING_IP_MOVED,
                Status::False,
                note,
            );
            Ok(Left::Done)
        }
        AddressStep::NoSuccessor if !running => Ok(Left::Done),
        AddressStep::NoSuccessor => {
            let message = format!(
                "removal held: this machine carries the API floating IP {} and no other control-plane machine runs to take it",
                api.address
            );
            members::set(
                pass,
                status,
                reasons::LAST_ACTIVE_MEMBER,
                Status::True,
                message,
            );
            Ok(Left::Waiting(Outcome::Poll(SUCCESSOR_RECHECK)))
        }
        AddressStep::Keep { .. } | AddressStep::NoPort => Ok(Left::Done),
    }
}

async fn cloud(pass: &Pass<'_>, api: &ApiAddress) -> Result<CloudClient, MachineError> {
    Ok(
        crate::controllers::identity::cloud_client(pass.ctx, &pass.namespace, &api.identity)
            .await?,
    )
}

async fn find(cloud: &CloudClient, address: &str) -> Result<Option<FloatingIp>, MachineError> {
    cloud
        .neutron()
        .find_floating_ip(address)
        .await
        .map_err(MachineError::cloud("finding the API floating IP"))
}

/// The cluster allocated it; one lost since (deleted by hand, or by CAPO's machine
/// controller before a takeover) is allocated again at the same address.
async fn find_or_allocate(
    cloud: &CloudClient,
    api: &ApiAddress,
) -> Result<FloatingIp, MachineError> {
    if let Some(ip) = find(cloud, &api.address).await? {
        return Ok(ip);
    }
    let ip = cloud
        .neutron()
        .create_tagged_floating_ip(
            &api.external_network,
            Some(&api.address),
            None,
            &api.names.description(),
            &api.tags,
        )
        .await
        .map_err(MachineError::cloud("allocating the API floating IP again"))?;
    tracing::info!(address = %ip.floating_ip_address, "allocated the API floating IP again");
    Ok(ip)
}

/// Every refusal is an error, a 404 included: Neutron answers 404 for an unrouted port
/// (`ExternalGatewayForFloatingIPNotFound`) and for a port gone, and neither attached it.
async fn attach(cloud: &CloudClient, ip: &FloatingIp, port: &str) -> Result<(), MachineError> {
    cloud
        .neutron()
        .associate_floating_ip(&ip.id, Some(port))
        .await
        .map(|_| ())
        .map_err(MachineError::cloud("attaching the API floating IP"))
}

/// The cluster's other control-plane machines that have a port on its network.
fn holders(pass: &Pass<'_>, api: &ApiAddress) -> Vec<Holder> {
    let same_cluster = |stored: &Packed<OpenStackMachine>| {
        let labels = stored.labels();
        capi::is_control_plane(labels)
            && capi::cluster_name(labels) == Some(api.cluster.as_str())
            && stored.meta().name.as_deref() != Some(pass.name.as_str())
    };
    pass.ctx
        .caches
        .infra_machines(&pass.namespace, same_cluster)
        .iter()
        .filter_map(|osm| holder(pass, osm, &api.network))
        .collect()
}

fn holder(pass: &Pass<'_>, osm: &OpenStackMachine, network: &str) -> Option<Holder> {
    let status = osm.status.as_ref()?;
    let port = plan::port_on_network(status, network)?;
    let owner = osm
        .owner_references()
        .iter()
        .find(|o| o.kind == "Machine" && o.api_version.starts_with(capi::GROUP))
        .and_then(|o| pass.ctx.caches.machine(&pass.namespace, &o.name));
    let running = conditions::status_of(&status.conditions, types::INSTANCE_READY) == Status::True;
    let fit = running
        && osm.metadata.deletion_timestamp.is_none()
        && !gate::is_leaving(osm)
        && owner
            .as_ref()
            .is_some_and(|m| m.metadata.deletion_timestamp.is_none());
    Some(Holder {
        machine: osm.name_any(),
        port,
        fit,
        joined: owner
            .as_ref()
            .and_then(|m| m.status.as_ref())
            .is_some_and(|s| s.node_ref.is_some()),
        released: osm
            .spec
            .provider_id
            .as_deref()
            .is_some_and(|p| !p.is_empty()),
        created: osm
            .metadata
            .creation_timestamp
            .as_ref()
            .map_or(0, |t| t.0.as_second()),
    })
}
