//! The cluster's network: the external network, the cluster network and its subnets (made
//! from `managedSubnets`, or given), and the router. Everything is looked up first (status
//! ID, then CAPO's name with our owner mark), so what CAPO made is taken over through the IDs
//! its status recorded, and what an earlier pass made but did not record is found by its mark.
//! The subnet is found inside the network, by CIDR, as CAPO does.

use capo_api::OpenStackClusterSpec;
use capo_api::cluster::{OpenStackClusterStatus, RouterStatus, SubnetSpec as ApiSubnet};
use capo_api::common::{IdOrFilter, NetworkStatus, NetworkStatusWithSubnets, Subnet};

use super::ClusterError;
use super::plan::{Names, owned_tags, tags};
use crate::cloud::neutron::{
    AllocationPool, Filter, FixedIp, GatewayInfo, Network, NetworkSpec, Router, RouterSpec,
    SubnetSpec,
};
use crate::cloud::{CloudClient, CloudError};
use crate::controllers::server::resolve::{exactly_one, neutron_filter, subnet_filter};

/// Whether the spec has capo-rs create the network (as opposed to using a given one).
pub fn is_managed(spec: &OpenStackClusterSpec) -> bool {
    !spec.managed_subnets.is_empty()
}

/// Brings the network up to the spec, recording it in `status`.
pub async fn reconcile(
    spec: &OpenStackClusterSpec,
    names: &Names,
    cloud: &CloudClient,
    status: &mut OpenStackClusterStatus,
) -> Result<(), ClusterError> {
    status.external_network = external_network(spec, cloud, status).await?;
    if is_managed(spec) {
        let network = managed_network(spec, names, cloud, status).await?;
        let subnet = managed_subnet(spec, names, cloud, &network.id).await?;
        status.network = Some(NetworkStatusWithSubnets {
            name: network.name,
            id: network.id,
            tags: network.tags,
            subnets: vec![subnet],
        });
        status.router = router(spec, names, cloud, status).await?;
    } else {
        status.network = given_network(spec, cloud).await?;
        status.router = given_router(spec, cloud).await?;
    }
    Ok(())
}

fn cloud_error(action: impl Into<String>) -> impl FnOnce(CloudError) -> ClusterError {
    ClusterError::cloud(action)
}

/// The external network: the one named, or the only one there is; none when turned off.
async fn external_network(
    spec: &OpenStackClusterSpec,
    cloud: &CloudClient,
    status: &OpenStackClusterStatus,
) -> Result<Option<NetworkStatus>, ClusterError> {
    if spec.enable_external_network == Some(false) {
        return Ok(None);
    }
    let found: Vec<Network> = match &spec.external_network {
        Some(IdOrFilter { id: Some(id), .. }) => {
            if let Some(known) = status.external_network.as_ref().filter(|n| &n.id == id) {
                return Ok(Some(known.clone()));
            }
            match cloud.neutron().get_network(id).await {
                Ok(network) => vec![network],
                Err(CloudError::NotFound(_)) => Vec::new(),
                Err(e) => return Err(cloud_error("reading the external network")(e)),
            }
        }
        Some(IdOrFilter { filter, .. }) => {
            let filter = neutron_filter(filter.as_ref()).with("router:external", "true");
            cloud
                .neutron()
                .list_networks(&filter)
                .await
                .map_err(cloud_error("finding the external network"))?
        }
        None => {
            if let Some(known) = &status.external_network {
                return Ok(Some(known.clone()));
            }
            let filter = Filter::default().with("router:external", "true");
            let all = cloud
                .neutron()
                .list_networks(&filter)
                .await
                .map_err(cloud_error("listing external networks"))?;
            match all.len() {
                0 => return Ok(None),
                1 => all,
                n => {
                    return Err(ClusterError::InvalidSpec(format!(
                        "{n} external networks exist: name one in externalNetwork, or set enableExternalNetwork: false"
                    )));
                }
            }
        }
    };
    let network = exactly_one("external network", found, |n| &n.id)?;
    Ok(Some(NetworkStatus {
        name: network.name,
        id: network.id,
        tags: network.tags,
    }))
}

async fn managed_network(
    spec: &OpenStackClusterSpec,
    names: &Names,
    cloud: &CloudClient,
    status: &OpenStackClusterStatus,
) -> Result<Network, ClusterError> {
    if let Some(known) = &status.network {
        match cloud.neutron().get_network(&known.id).await {
            Ok(network) => return Ok(network),
            Err(CloudError::NotFound(_)) => {}
            Err(e) => return Err(cloud_error("reading the cluster network")(e)),
        }
    }
    let existing: Vec<Network> = cloud
        .neutron()
        .list_networks(&Filter::by_name(&names.network))
        .await
        .map_err(cloud_error("finding the cluster network"))?
        .into_iter()
        .filter(|n| names.owner.owns(&n.tags, &n.description))
        .collect();
    if !existing.is_empty() {
        return Ok(exactly_one(
            &format!("network named {}", names.network),
            existing,
            |n| &n.id,
        )?);
    }
    let managed = spec.managed_network.as_ref();
    let network = NetworkSpec {
        name: names.network.clone(),
        admin_state_up: true,
        mtu: managed
            .and_then(|m| m.mtu)
            .and_then(|m| u32::try_from(m).ok()),
        port_security_enabled: managed
            .and_then(|m| m.enable_port_security)
            .filter(|enabled| !enabled),
        description: names.owned_description(),
        tags: owned_tags(spec, names),
    };
    let created = cloud
        .neutron()
        .create_network(&network)
        .await
        .map_err(cloud_error("creating the cluster network"))?;
    tracing::info!(network = %created.id, "created the cluster network");
    Ok(created)
}

/// The managed subnet, found by network and CIDR as CAPO does, its DNS servers kept current.
async fn managed_subnet(
    spec: &OpenStackClusterSpec,
    names: &Names,
    cloud: &CloudClient,
    network_id: &str,
) -> Result<Subnet, ClusterError> {
    let Some(wanted) = spec.managed_subnets.first() else {
        return Err(ClusterError::InvalidSpec("managedSubnets is empty".into()));
    };
    validate_cidr(&wanted.cidr)?;
    let filter = Filter::default()
        .with("network_id", network_id)
        .with("cidr", wanted.cidr.clone());
    let existing = cloud
        .neutron()
        .list_subnets(&filter)
        .await
        .map_err(cloud_error("finding the cluster subnet"))?;
    let subnet = if existing.is_empty() {
        let created = cloud
            .neutron()
            .create_subnet(&subnet_spec(spec, names, wanted, network_id))
            .await
            .map_err(cloud_error("creating the cluster subnet"))?;
        tracing::info!(subnet = %created.id, cidr = %created.cidr, "created the cluster subnet");
        created
    } else {
        let subnet = exactly_one(
            &format!("subnet with CIDR {}", wanted.cidr),
            existing,
            |s| &s.id,
        )?;
        if !wanted.dns_nameservers.is_empty() && subnet.dns_nameservers != wanted.dns_nameservers {
            cloud
                .neutron()
                .update_subnet_dns(&subnet.id, &wanted.dns_nameservers)
                .await
                .map_err(cloud_error("updating the subnet's DNS servers"))?;
        }
        subnet
    };
    Ok(Subnet {
        name: subnet.name,
        id: subnet.id,
        cidr: subnet.cidr,
        tags: subnet.tags,
    })
}

fn validate_cidr(cidr: &str) -> Result<(), ClusterError> {
    let valid = cidr.split_once('/').is_some_and(|(address, prefix)| {
        let max = if address.contains(':') { 128 } else { 32 };
        address.parse::<std::net::IpAddr>().is_ok() && prefix.parse::<u8>().is_ok_and(|p| p <= max)
    });
    if valid {
        Ok(())
    } else {
        Err(ClusterError::InvalidSpec(format!(
            "managedSubnets: {cidr:?} is not a CIDR"
        )))
    }
}

fn subnet_spec(
    spec: &OpenStackClusterSpec,
    names: &Names,
    wanted: &ApiSubnet,
    network_id: &str,
) -> SubnetSpec {
    SubnetSpec {
        name: names.network.clone(),
        network_id: network_id.to_owned(),
        cidr: wanted.cidr.clone(),
        ip_version: if wanted.cidr.contains(':') { 6 } else { 4 },
        description: names.description(),
        dns_nameservers: wanted.dns_nameservers.clone(),
        allocation_pools: wanted
            .allocation_pools
            .iter()
            .map(|p| AllocationPool {
                start: p.start.clone(),
                end: p.end.clone(),
            })
            .collect(),
        tags: tags(spec),
    }
}

/// The router of a managed network, with its gateway on the external network and an
/// interface on the cluster subnet. None without an external network.
async fn router(
    spec: &OpenStackClusterSpec,
    names: &Names,
    cloud: &CloudClient,
    status: &OpenStackClusterStatus,
) -> Result<Option<RouterStatus>, ClusterError> {
    let (Some(external), Some(network)) = (&status.external_network, &status.network) else {
        return Ok(None);
    };
    let gateway = gateway(spec, cloud, &external.id).await?;
    let router = match find_router(spec, names, cloud, status).await? {
        Some(router) => router,
        None => {
            let router = RouterSpec {
                name: names.network.clone(),
                description: names.owned_description(),
                external_gateway_info: Some(gateway.clone()),
                tags: owned_tags(spec, names),
            };
            let created = cloud
                .neutron()
                .create_router(&router)
                .await
                .map_err(cloud_error("creating the router"))?;
            tracing::info!(router = %created.id, "created the router");
            created
        }
    };
    let router = if needs_gateway(&router, &gateway) {
        cloud
            .neutron()
            .set_router_gateway(&router.id, &gateway)
            .await
            .map_err(cloud_error("setting the router's gateway"))?
    } else {
        router
    };
    add_interfaces(cloud, &router, network).await?;
    Ok(Some(RouterStatus {
        ips: router.external_ips(),
        name: router.name,
        id: router.id,
        tags: router.tags,
    }))
}

/// The gateway the spec asks for: on the external network, at `managedRouter.externalIPs`.
async fn gateway(
    spec: &OpenStackClusterSpec,
    cloud: &CloudClient,
    external: &str,
) -> Result<GatewayInfo, ClusterError> {
    let mut fixed = Vec::new();
    for ip in spec.managed_router.iter().flat_map(|r| &r.external_ips) {
        let subnet = match &ip.subnet {
            IdOrFilter { id: Some(id), .. } => id.clone(),
            IdOrFilter { filter, .. } => {
                let filter = subnet_filter(filter.as_ref()).with("network_id", external);
                let found = cloud
                    .neutron()
                    .list_subnets(&filter)
                    .await
                    .map_err(cloud_error("finding a router external subnet"))?;
                exactly_one("external subnet for the router", found, |s| &s.id)?.id
            }
        };
        fixed.push(FixedIp {
            subnet_id: Some(subnet),
            ip_address: ip.fixed_ip.clone(),
        });
    }
    Ok(GatewayInfo {
        network_id: external.to_owned(),
        external_fixed_ips: fixed,
    })
}

/// Whether the router's gateway differs from what is wanted (network, or a requested IP).
fn needs_gateway(router: &Router, wanted: &GatewayInfo) -> bool {
    let Some(current) = &router.external_gateway_info else {
        return true;
    };
    if current["network_id"].as_str() != Some(wanted.network_id.as_str()) {
        return true;
    }
    let have = router.external_ips();
    wanted
        .external_fixed_ips
        .iter()
        .filter_map(|ip| ip.ip_address.as_ref())
        .any(|ip| !have.contains(ip))
}

async fn find_router(
    spec: &OpenStackClusterSpec,
    names: &Names,
    cloud: &CloudClient,
    status: &OpenStackClusterStatus,
) -> Result<Option<Router>, ClusterError> {
    if let Some(given) = &spec.router {
        return resolve_router(cloud, given).await.map(Some);
    }
    if let Some(known) = &status.router {
        let by_id = Filter {
            id: Some(known.id.clone()),
            ..Filter::default()
        };
        let found = cloud
            .neutron()
            .list_routers(&by_id)
            .await
            .map_err(cloud_error("reading the router"))?;
        if let Some(router) = found.into_iter().next() {
            return Ok(Some(router));
        }
    }
    let found: Vec<Router> = cloud
        .neutron()
        .list_routers(&Filter::by_name(&names.network))
        .await
        .map_err(cloud_error("finding the router"))?
        .into_iter()
        .filter(|r| names.owner.owns(&r.tags, &r.description))
        .collect();
    match found.len() {
        0 => Ok(None),
        _ => Ok(Some(exactly_one(
            &format!("router named {}", names.network),
            found,
            |r| &r.id,
        )?)),
    }
}

async fn resolve_router(
    cloud: &CloudClient,
    given: &capo_api::common::RouterParam,
) -> Result<Router, ClusterError> {
    let filter = match given {
        IdOrFilter { id: Some(id), .. } => Filter {
            id: Some(id.clone()),
            ..Filter::default()
        },
        IdOrFilter { filter, .. } => neutron_filter(filter.as_ref()),
    };
    let found = cloud
        .neutron()
        .list_routers(&filter)
        .await
        .map_err(cloud_error("finding the router"))?;
    Ok(exactly_one("router", found, |r| &r.id)?)
}

/// An interface on every cluster subnet the router is not on yet.
async fn add_interfaces(
    cloud: &CloudClient,
    router: &Router,
    network: &NetworkStatusWithSubnets,
) -> Result<(), ClusterError> {
    let ports = cloud
        .neutron()
        .list_ports(&Filter::default().with("device_id", router.id.clone()))
        .await
        .map_err(cloud_error("listing the router's ports"))?;
    for subnet in &network.subnets {
        let attached = ports.iter().any(|p| {
            p.fixed_ips
                .iter()
                .any(|ip| ip.subnet_id.as_deref() == Some(subnet.id.as_str()))
        });
        if !attached {
            cloud
                .neutron()
                .add_router_interface(&router.id, &subnet.id)
                .await
                .map_err(cloud_error("attaching the router to the subnet"))?;
        }
    }
    Ok(())
}

/// A given network (by ID or filter) and its subnets: the ones named, or all of them.
async fn given_network(
    spec: &OpenStackClusterSpec,
    cloud: &CloudClient,
) -> Result<Option<NetworkStatusWithSubnets>, ClusterError> {
    let network = match &spec.network {
        None if spec.subnets.is_empty() => return Ok(None),
        None => None,
        Some(IdOrFilter { id: Some(id), .. }) => Some(
            cloud
                .neutron()
                .get_network(id)
                .await
                .map_err(ClusterError::missing_or_cloud("the network"))?,
        ),
        Some(IdOrFilter { filter, .. }) => {
            let found = cloud
                .neutron()
                .list_networks(&neutron_filter(filter.as_ref()))
                .await
                .map_err(cloud_error("finding the network"))?;
            Some(exactly_one("network", found, |n| &n.id)?)
        }
    };
    let mut subnets = Vec::new();
    let mut network_id = network.as_ref().map(|n| n.id.clone());
    for given in &spec.subnets {
        let subnet = match given {
            IdOrFilter { id: Some(id), .. } => cloud
                .neutron()
                .get_subnet(id)
                .await
                .map_err(ClusterError::missing_or_cloud("a subnet"))?,
            IdOrFilter { filter, .. } => {
                let mut filter = subnet_filter(filter.as_ref());
                if let Some(network) = &network_id {
                    filter = filter.with("network_id", network.clone());
                }
                let found = cloud
                    .neutron()
                    .list_subnets(&filter)
                    .await
                    .map_err(cloud_error("finding a subnet"))?;
                exactly_one("subnet", found, |s| &s.id)?
            }
        };
        network_id.get_or_insert_with(|| subnet.network_id.clone());
        subnets.push(subnet);
    }
    let Some(network_id) = network_id else {
        return Ok(None);
    };
    let network = match network {
        Some(network) => network,
        None => cloud
            .neutron()
            .get_network(&network_id)
            .await
            .map_err(cloud_error("reading the subnets' network"))?,
    };
    if subnets.is_empty() {
        subnets = cloud
            .neutron()
            .list_subnets(&Filter::default().with("network_id", network.id.clone()))
            .await
            .map_err(cloud_error("listing the network's subnets"))?;
    }
    Ok(Some(NetworkStatusWithSubnets {
        name: network.name,
        id: network.id,
        tags: network.tags,
        subnets: subnets
            .into_iter()
            .map(|s| Subnet {
                name: s.name,
                id: s.id,
                cidr: s.cidr,
                tags: s.tags,
            })
            .collect(),
    }))
}

/// A given router, recorded but never changed.
async fn given_router(
    spec: &OpenStackClusterSpec,
    cloud: &CloudClient,
) -> Result<Option<RouterStatus>, ClusterError> {
    let Some(given) = &spec.router else {
        return Ok(None);
    };
    let router = resolve_router(cloud, given).await?;
    Ok(Some(RouterStatus {
        ips: router.external_ips(),
        name: router.name,
        id: router.id,
        tags: router.tags,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidrs_are_checked_before_neutron_sees_them() {
        assert!(validate_cidr("10.6.0.0/24").is_ok());
        assert!(validate_cidr("fd00::/64").is_ok());
        assert!(validate_cidr("10.6.0.0").is_err());
        assert!(validate_cidr("10.6.0.0/33").is_err());
        assert!(validate_cidr("ten/8").is_err());
    }
}
