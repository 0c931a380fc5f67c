//! Deleting a cluster, in order: wait for its machines; the bastion; the load balancer
//! (cascade), then its floating IP; the router; leftover ports, the subnets and the network;
//! the security groups. One step per pass where the cloud needs time; what is already gone
//! is not an error; what existed before the cluster (a given network or router, a floating
//! IP the user named) is never touched.

use capo_api::cluster::OpenStackClusterStatus;
use capo_api::conditions::{self, Desired, Status, reasons, types};
use capo_api::{OpenStackCluster, OpenStackMachine, OpenStackServer, capi};
use kube::ResourceExt;
use kube::api::{Api, ListParams};

use super::load_balancer::{self, find_floating_ip};
use super::network::is_managed;
use super::rules::Role;
use super::{ClusterError, Failure, Pass, at, bastion};
use crate::cloud::neutron::{Filter, FloatingIp};
use crate::cloud::octavia::ProvisioningStatus;
use crate::cloud::{CloudClient, CloudError};
use crate::controllers::outcome::Outcome;
use crate::controllers::{identity, writes};

pub async fn run(
    pass: &Pass<'_>,
    api: &Api<OpenStackCluster>,
    status: &mut OpenStackClusterStatus,
) -> Result<Outcome, Failure> {
    let waiting = Outcome::Poll(pass.ctx.config.poll_max);
    let remaining = machines(pass).await.map_err(at(types::READY))?;
    if remaining > 0 {
        deleting(
            pass,
            status,
            format!("waiting for {remaining} OpenStackMachines to be deleted"),
        );
        return Ok(waiting);
    }
    let namespace = pass.cluster.namespace().unwrap_or_default();
    let cloud = identity::cleanup_client(pass.ctx, &namespace, &pass.cluster.spec.identity_ref)
        .await
        .map_err(ClusterError::from)
        .map_err(at(types::READY))?;
    let steps = async {
        if bastion_remains(pass, &cloud, status).await? {
            return Ok(Some("waiting for the bastion to be deleted"));
        }
        if load_balancer_remains(pass, &cloud, status).await? {
            return Ok(Some("waiting for the API load balancer to be deleted"));
        }
        release_api_floating_ip(pass, &cloud, status).await?;
        release_forgotten_floating_ips(pass, &cloud, status).await?;
        if is_managed(&pass.cluster.spec) {
            delete_router(pass, &cloud, status).await?;
            delete_network(pass, &cloud, status).await?;
        }
        if groups_remain(pass, &cloud, status).await? {
            return Ok(Some("waiting for the security groups to be free"));
        }
        Ok::<_, ClusterError>(None)
    };
    match steps.await {
        Ok(Some(what)) => {
            deleting(pass, status, what.into());
            return Ok(waiting);
        }
        Ok(None) => {}
        Err(e) if e.is_busy() => {
            deleting(
                pass,
                status,
                "the load balancer is busy; trying again".into(),
            );
            return Ok(waiting);
        }
        Err(e) => return Err(at(types::READY)(e)),
    }
    writes::remove_finalizer(api, pass.cluster, conditions::finalizers::CLUSTER)
        .await
        .map_err(ClusterError::kube("removing the finalizer"))
        .map_err(at(types::READY))?;
    tracing::info!("cluster resources deleted; finalizer removed");
    Ok(Outcome::Deleted)
}

fn deleting(pass: &Pass<'_>, status: &mut OpenStackClusterStatus, message: String) {
    tracing::debug!(%message, "deleting");
    let condition = Desired::new(types::READY, Status::False, reasons::DELETING, message);
    conditions::set(
        &mut status.conditions,
        &condition,
        pass.generation,
        pass.now,
    );
}

/// OpenStackMachines of the cluster still there.
async fn machines(pass: &Pass<'_>) -> Result<usize, ClusterError> {
    let namespace = pass.cluster.namespace().unwrap_or_default();
    let machines: Api<OpenStackMachine> = Api::namespaced(pass.ctx.client.clone(), &namespace);
    let selector = format!("{}={}", capi::labels::CLUSTER_NAME, pass.capi_name);
    let list = machines
        .list_metadata(&ListParams::default().labels(&selector))
        .await
        .map_err(ClusterError::kube(
            "listing the cluster's OpenStackMachines",
        ))?;
    Ok(list.items.len())
}

async fn bastion_remains(
    pass: &Pass<'_>,
    cloud: &CloudClient,
    status: &mut OpenStackClusterStatus,
) -> Result<bool, ClusterError> {
    let namespace = pass.cluster.namespace().unwrap_or_default();
    let servers: Api<OpenStackServer> = Api::namespaced(pass.ctx.client.clone(), &namespace);
    let Some(server) = servers
        .get_opt(&pass.names.bastion)
        .await
        .map_err(ClusterError::kube("reading the bastion OpenStackServer"))?
    else {
        status.bastion = None;
        return Ok(false);
    };
    bastion::remove(pass, cloud, &servers, &server, status).await?;
    Ok(true)
}

async fn load_balancer_remains(
    pass: &Pass<'_>,
    cloud: &CloudClient,
    status: &mut OpenStackClusterStatus,
) -> Result<bool, ClusterError> {
    let Some(lb) = load_balancer::find(&pass.names, cloud, status).await? else {
        if let Some(known) = &status.api_server_managed_load_balancer {
            pass.ctx.engine.forget(&known.id);
        }
        return Ok(false);
    };
    pass.ctx.engine.forget(&lb.id);
    if lb.provisioning_status != ProvisioningStatus::PendingDelete {
        match cloud.octavia().delete_load_balancer(&lb.id, true).await {
            Ok(()) | Err(CloudError::NotFound(_)) => {
                tracing::info!(lb = %lb.id, "deleting the API load balancer");
            }
            Err(e) => return Err(ClusterError::cloud("deleting the load balancer")(e)),
        }
    }
    Ok(true)
}

/// The API floating IP, if capo-rs (or CAPO) allocated it: its description says so. One
/// the user named in `apiServer.floatingIP` is only detached.
async fn release_api_floating_ip(
    pass: &Pass<'_>,
    cloud: &CloudClient,
    status: &mut OpenStackClusterStatus,
) -> Result<(), ClusterError> {
    let spec = &pass.cluster.spec;
    let lb_ip = status
        .api_server_managed_load_balancer
        .as_ref()
        .map(|lb| lb.ip.clone())
        .filter(|ip| !ip.is_empty());
    let endpoint = spec
        .control_plane_endpoint
        .as_ref()
        .and_then(|e| e.host.clone());
    let given = spec.api_server.as_ref().and_then(|a| a.floating_ip.clone());
    for address in [lb_ip, endpoint].into_iter().flatten() {
        let Some(ip) = find_floating_ip(cloud, &address).await? else {
            continue;
        };
        if given.as_deref() == Some(address.as_str()) {
            if ip.port_id.is_some() {
                detach(cloud, &ip).await?;
            }
        } else if ip.description == pass.names.description() {
            match cloud.neutron().delete_floating_ip(&ip.id).await {
                Ok(()) | Err(CloudError::NotFound(_)) => {}
                Err(e) => return Err(ClusterError::cloud("deleting the API floating IP")(e)),
            }
        }
    }
    status.api_server_managed_load_balancer = None;
    Ok(())
}

/// Floating IPs made for this cluster that nothing recorded (a restart between their create
/// and their attach): with the bastion and the load balancer gone, each one of ours that
/// points at nothing goes, except an address the spec names (the user's own).
async fn release_forgotten_floating_ips(
    pass: &Pass<'_>,
    cloud: &CloudClient,
    status: &OpenStackClusterStatus,
) -> Result<(), ClusterError> {
    let Some(external) = status.external_network.as_ref() else {
        return Ok(());
    };
    let spec = &pass.cluster.spec;
    let given: Vec<&str> = [
        spec.api_server
            .as_ref()
            .and_then(|a| a.floating_ip.as_deref()),
        spec.bastion.as_ref().and_then(|b| b.floating_ip.as_deref()),
    ]
    .into_iter()
    .flatten()
    .collect();
    let forgotten = load_balancer::forgotten_floating_ips(cloud, &pass.names, &external.id).await?;
    for ip in forgotten {
        if given.contains(&ip.floating_ip_address.as_str()) {
            continue;
        }
        match cloud.neutron().delete_floating_ip(&ip.id).await {
            Ok(()) | Err(CloudError::NotFound(_)) => {
                tracing::info!(address = %ip.floating_ip_address, "deleted a floating IP made for this cluster and never recorded");
            }
            Err(e) => return Err(ClusterError::cloud("deleting a forgotten floating IP")(e)),
        }
    }
    Ok(())
}

async fn detach(cloud: &CloudClient, ip: &FloatingIp) -> Result<(), ClusterError> {
    match cloud.neutron().associate_floating_ip(&ip.id, None).await {
        Ok(_) | Err(CloudError::NotFound(_)) => Ok(()),
        Err(e) => Err(ClusterError::cloud("detaching the API floating IP")(e)),
    }
}

/// The router capo-rs made (never one the spec names): interfaces, then the router.
async fn delete_router(
    pass: &Pass<'_>,
    cloud: &CloudClient,
    status: &mut OpenStackClusterStatus,
) -> Result<(), ClusterError> {
    if pass.cluster.spec.router.is_some() {
        return Ok(());
    }
    let mut routers: Vec<_> = cloud
        .neutron()
        .list_routers(&Filter::by_name(&pass.names.network))
        .await
        .map_err(ClusterError::cloud("finding the router"))?
        .into_iter()
        .filter(|r| pass.names.owner.owns(&r.tags, &r.description))
        .collect();
    if let Some(known) = &status.router
        && !routers.iter().any(|r| r.id == known.id)
    {
        let by_id = Filter {
            id: Some(known.id.clone()),
            ..Filter::default()
        };
        routers.extend(
            cloud
                .neutron()
                .list_routers(&by_id)
                .await
                .map_err(ClusterError::cloud("reading the router"))?,
        );
    }
    for router in routers {
        let ports = cloud
            .neutron()
            .list_ports(&Filter::default().with("device_id", router.id.clone()))
            .await
            .map_err(ClusterError::cloud("listing the router's ports"))?;
        let mut subnets: Vec<String> = Vec::new();
        for port in ports
            .iter()
            .filter(|p| p.device_owner == "network:router_interface")
        {
            subnets.extend(port.fixed_ips.iter().filter_map(|ip| ip.subnet_id.clone()));
        }
        for subnet in subnets {
            match cloud
                .neutron()
                .remove_router_interface(&router.id, &subnet)
                .await
            {
                Ok(()) | Err(CloudError::NotFound(_)) => {}
                Err(e) => return Err(ClusterError::cloud("detaching the router")(e)),
            }
        }
        match cloud.neutron().delete_router(&router.id).await {
            Ok(()) | Err(CloudError::NotFound(_)) => {
                tracing::info!(router = %router.id, "deleted the router");
            }
            Err(e) => return Err(ClusterError::cloud("deleting the router")(e)),
        }
    }
    status.router = None;
    Ok(())
}

/// The recorded network and ours by name: ports left on it that carry the cluster's name (as
/// CAPO finds them), the subnets, then the network.
async fn delete_network(
    pass: &Pass<'_>,
    cloud: &CloudClient,
    status: &mut OpenStackClusterStatus,
) -> Result<(), ClusterError> {
    let mut networks: Vec<_> = cloud
        .neutron()
        .list_networks(&Filter::by_name(&pass.names.network))
        .await
        .map_err(ClusterError::cloud("finding the cluster network"))?
        .into_iter()
        .filter(|n| pass.names.owner.owns(&n.tags, &n.description))
        .collect();
    if let Some(known) = &status.network
        && !networks.iter().any(|n| n.id == known.id)
    {
        match cloud.neutron().get_network(&known.id).await {
            Ok(network) => networks.push(network),
            Err(CloudError::NotFound(_)) => {}
            Err(e) => return Err(ClusterError::cloud("reading the cluster network")(e)),
        }
    }
    let cluster_name = pass.cluster.name_any();
    for network in networks {
        let ports = cloud
            .neutron()
            .list_ports(&Filter::default().with("network_id", network.id.clone()))
            .await
            .map_err(ClusterError::cloud("listing the network's ports"))?;
        let leftovers = ports.iter().filter(|p| {
            p.name.starts_with(&cluster_name) || p.name.starts_with(&pass.names.resource)
        });
        for port in leftovers {
            match cloud.neutron().delete_port(&port.id).await {
                Ok(()) | Err(CloudError::NotFound(_)) => {
                    tracing::info!(port = %port.id, name = %port.name, "deleted a leftover port");
                }
                Err(e) => return Err(ClusterError::cloud("deleting a leftover port")(e)),
            }
        }
        for subnet in &network.subnets {
            match cloud.neutron().delete_subnet(subnet).await {
                Ok(()) | Err(CloudError::NotFound(_)) => {}
                Err(e) => return Err(ClusterError::cloud("deleting a subnet")(e)),
            }
        }
        match cloud.neutron().delete_network(&network.id).await {
            Ok(()) | Err(CloudError::NotFound(_)) => {
                tracing::info!(network = %network.id, "deleted the cluster network");
            }
            Err(e) => return Err(ClusterError::cloud("deleting the cluster network")(e)),
        }
    }
    status.network = None;
    Ok(())
}

/// The managed groups, once no port uses them.
async fn groups_remain(
    pass: &Pass<'_>,
    cloud: &CloudClient,
    status: &mut OpenStackClusterStatus,
) -> Result<bool, ClusterError> {
    let mut remain = false;
    let recorded: Vec<String> = [
        &status.control_plane_security_group,
        &status.worker_security_group,
        &status.bastion_security_group,
    ]
    .into_iter()
    .flatten()
    .map(|group| group.id.clone())
    .collect();
    for role in Role::ALL {
        let name = super::security_groups::group_name(&pass.names, role);
        let groups = cloud
            .neutron()
            .list_security_groups(&Filter::by_name(name))
            .await
            .map_err(ClusterError::cloud("finding a security group"))?;
        let ours = groups
            .into_iter()
            .filter(|g| pass.names.owner.owns(&g.tags, &g.description) || recorded.contains(&g.id));
        for group in ours {
            match cloud.neutron().delete_security_group(&group.id).await {
                Ok(()) | Err(CloudError::NotFound(_)) => {}
                Err(CloudError::Conflict(_)) => remain = true,
                Err(e) => return Err(ClusterError::cloud("deleting a security group")(e)),
            }
        }
    }
    if !remain {
        status.control_plane_security_group = None;
        status.worker_security_group = None;
        status.bastion_security_group = None;
    }
    Ok(remain)
}
