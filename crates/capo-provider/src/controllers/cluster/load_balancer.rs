//! The API server load balancer: the LB, a listener, pool and health monitor per port, the
//! allowed CIDRs, and the floating IP of the endpoint. A new LB is made whole in one request
//! (Octavia's fully populated create: its listeners and pools, and their monitors where the
//! provider makes those). After that, and for an LB adopted half-built, one change per LB per
//! pass: a change locks the LB (PENDING_UPDATE), and the engine's observation of it unlocking
//! wakes the cluster for the next one. Nothing here waits.

use capo_api::OpenStackClusterSpec;
use capo_api::cluster::{
    LoadBalancerPoolStatus, LoadBalancerStatus, ManagedLoadBalancer, OpenStackClusterStatus,
};
use capo_api::common::{IdOrFilter, NetworkStatusWithSubnets, Subnet};

use super::ClusterError;
use super::plan::{self, Names};
use crate::cloud::neutron::{Filter, FloatingIp};
use crate::cloud::octavia::{
    HealthMonitorSpec, Listener, ListenerSpec, LoadBalancer, LoadBalancerFilter, LoadBalancerSpec,
    Pool, PoolSpec, ProvisioningStatus,
};
use crate::cloud::{CloudClient, CloudError};
use crate::controllers::gate::MonitorKind;
use crate::controllers::server::resolve::{
    exactly_one, neutron_filter, primary_subnet, subnet_filter,
};

/// Where the load balancer stands after a pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LbProgress {
    /// ACTIVE, with every listener, pool and monitor; the VIP's port.
    Ready {
        vip_port: Option<String>,
        /// The spec restricts the listeners, and this Octavia (its API version) cannot.
        old_octavia: Option<String>,
        /// The provider implements no health monitors: the pools have none (Octavia's word).
        monitor_skipped: Option<String>,
    },
    /// Being created or changed: look again when it unlocks. `by_us`: this pass's own change
    /// (the create, or a listener, pool or monitor) locked it a moment ago.
    Pending {
        state: ProvisioningStatus,
        by_us: bool,
    },
    /// In ERROR: a person must look; the gate says so.
    Failed,
}

/// The Octavia API version whose listeners take `allowed_cidrs`.
const ALLOWED_CIDRS_SINCE: (u32, u32) = (2, 12);

/// Health monitor defaults, as CAPO's.
const MONITOR_DELAY: u32 = 10;
const MONITOR_TIMEOUT: u32 = 5;
const MONITOR_MAX_RETRIES: u32 = 5;
const MONITOR_MAX_RETRIES_DOWN: u32 = 3;

/// The monitor a port's pool should have: CAPO's timings (or the spec's), of `kind`.
fn wanted_monitor(
    lb_spec: &ManagedLoadBalancer,
    kind: MonitorKind,
    name: &str,
    pool_id: &str,
) -> HealthMonitorSpec {
    let settings = lb_spec.monitor.clone().unwrap_or_default();
    let value =
        |v: Option<i32>, default: u32| v.and_then(|v| u32::try_from(v).ok()).unwrap_or(default);
    let https = kind == MonitorKind::Https;
    HealthMonitorSpec {
        name: name.to_owned(),
        pool_id: pool_id.to_owned(),
        kind: kind.octavia_type().into(),
        delay: value(settings.delay, MONITOR_DELAY),
        timeout: value(settings.timeout, MONITOR_TIMEOUT),
        max_retries: value(settings.max_retries, MONITOR_MAX_RETRIES),
        max_retries_down: Some(value(settings.max_retries_down, MONITOR_MAX_RETRIES_DOWN)),
        http_method: https.then(|| "GET".into()),
        url_path: https.then(|| "/readyz".into()),
        expected_codes: https.then(|| "200".into()),
        tags: Vec::new(),
    }
}

/// Brings the API load balancer toward the spec, recording it in `status`.
pub async fn reconcile(
    spec: &OpenStackClusterSpec,
    lb_spec: &ManagedLoadBalancer,
    names: &Names,
    cloud: &CloudClient,
    status: &mut OpenStackClusterStatus,
    monitor: MonitorKind,
) -> Result<LbProgress, ClusterError> {
    let vip_network = vip_network(lb_spec, cloud, status).await?;
    let mut created = false;
    let lb = match find(names, cloud, status).await? {
        Some(lb) => lb,
        None => {
            created = true;
            let children = Children {
                ports: plan::lb_ports(spec, lb_spec),
                allowed: allowed_cidrs(lb_spec, cloud, status).await?.0,
                monitor,
            };
            create(spec, lb_spec, names, cloud, &vip_network, &children).await?
        }
    };
    let known = status
        .api_server_managed_load_balancer
        .clone()
        .filter(|known| known.id == lb.id)
        .unwrap_or_default();
    let vip = lb.vip_address.clone().unwrap_or_default();
    let recorded = LoadBalancerStatus {
        name: lb.name.clone(),
        id: lb.id.clone(),
        // The floating IP, once known, stays the public address.
        ip: Some(known.ip.clone())
            .filter(|ip| !ip.is_empty())
            .unwrap_or_else(|| vip.clone()),
        internal_ip: vip,
        tags: lb.tags.clone(),
        load_balancer_network: vip_network.clone(),
        ..known
    };
    status.api_server_managed_load_balancer = Some(recorded);
    match lb.provisioning_status {
        ProvisioningStatus::Active => {}
        ProvisioningStatus::Error => return Ok(LbProgress::Failed),
        state => {
            return Ok(LbProgress::Pending {
                state,
                by_us: created,
            });
        }
    }
    let listeners = cloud
        .octavia()
        .list_listeners(&lb.id, None)
        .await
        .map_err(ClusterError::cloud("listing the load balancer's listeners"))?;
    let pools = cloud
        .octavia()
        .list_pools(&lb.id, None)
        .await
        .map_err(ClusterError::cloud("listing the load balancer's pools"))?;
    let (allowed, old_octavia) = allowed_cidrs(lb_spec, cloud, status).await?;
    let mut recorded_pools = Vec::new();
    let mut monitor_skipped = None;
    for port in plan::lb_ports(spec, lb_spec) {
        let step = ensure_port(
            names, lb_spec, cloud, &lb, port, &listeners, &pools, &allowed, monitor,
        )
        .await?;
        match step {
            PortStep::Done(pool) => recorded_pools.push(pool),
            PortStep::WithoutMonitor(pool, why) => {
                recorded_pools.push(pool);
                monitor_skipped = Some(why);
            }
            PortStep::Changed => {
                record_pools(status, recorded_pools);
                return Ok(LbProgress::Pending {
                    state: ProvisioningStatus::PendingUpdate,
                    by_us: true,
                });
            }
        }
    }
    record_pools(status, recorded_pools);
    if let Some(lb_status) = status.api_server_managed_load_balancer.as_mut() {
        lb_status.allowed_cidrs = allowed.unwrap_or_default();
    }
    Ok(LbProgress::Ready {
        vip_port: lb.vip_port_id.clone(),
        old_octavia,
        monitor_skipped,
    })
}

/// The listeners' allowed CIDRs (None: open), and the Octavia version that cannot take them.
async fn allowed_cidrs(
    lb_spec: &ManagedLoadBalancer,
    cloud: &CloudClient,
    status: &OpenStackClusterStatus,
) -> Result<(Option<Vec<String>>, Option<String>), ClusterError> {
    let router_ips = status
        .router
        .as_ref()
        .map(|r| r.ips.clone())
        .unwrap_or_default();
    let allowed = plan::allowed_cidrs(
        lb_spec,
        &subnet_cidrs(status),
        &router_ips,
        &bastion_ips(status),
    );
    if allowed.is_none() {
        return Ok((None, None));
    }
    // As CAPO: listeners take allowed CIDRs from Octavia API 2.12 on; before that they are
    // left open and the endpoint condition says so.
    let version = cloud
        .octavia()
        .api_version()
        .await
        .map_err(ClusterError::cloud("reading Octavia's API version"))?;
    // A version document we cannot read is no reason to open the listeners: the CIDRs are
    // sent, and an Octavia that cannot take them refuses them.
    match version.filter(|v| *v < ALLOWED_CIDRS_SINCE) {
        Some(version) => {
            tracing::warn!(
                ?version,
                "Octavia predates allowed CIDRs: the listeners stay open"
            );
            Ok((None, Some(format!("{}.{}", version.0, version.1))))
        }
        None => Ok((allowed, None)),
    }
}

fn record_pools(status: &mut OpenStackClusterStatus, pools: Vec<LoadBalancerPoolStatus>) {
    if let Some(lb) = status.api_server_managed_load_balancer.as_mut() {
        // Pools found so far replace what was known of them; the rest stay until seen.
        let mut merged = pools;
        for known in &lb.pools {
            if !merged.iter().any(|p| p.port == known.port) {
                merged.push(known.clone());
            }
        }
        merged.sort_by_key(|p| p.port);
        lb.pools = merged;
    }
}

fn subnet_cidrs(status: &OpenStackClusterStatus) -> Vec<String> {
    status
        .network
        .iter()
        .flat_map(|n| &n.subnets)
        .map(|s| s.cidr.clone())
        .collect()
}

fn bastion_ips(status: &OpenStackClusterStatus) -> Vec<String> {
    status
        .bastion
        .iter()
        .flat_map(|b| [b.floating_ip.clone(), b.ip.clone()])
        .flatten()
        .collect()
}

enum PortStep {
    Done(LoadBalancerPoolStatus),
    /// Done, with no health monitor: the provider implements none (Octavia's message).
    WithoutMonitor(LoadBalancerPoolStatus, String),
    /// One change made: the LB is locked until it settles.
    Changed,
}

/// The listener, pool and monitor of one port, and the listener's allowed CIDRs.
#[allow(
    clippy::too_many_arguments,
    reason = "one port's whole state, read once per pass"
)]
async fn ensure_port(
    names: &Names,
    lb_spec: &ManagedLoadBalancer,
    cloud: &CloudClient,
    lb: &LoadBalancer,
    port: u16,
    listeners: &[Listener],
    pools: &[Pool],
    allowed: &Option<Vec<String>>,
    monitor: MonitorKind,
) -> Result<PortStep, ClusterError> {
    let name = names.lb_child(port);
    let tags = lb.tags.clone();
    let Some(listener) = listeners.iter().find(|l| l.name == name) else {
        let listener = ListenerSpec {
            loadbalancer_id: lb.id.clone(),
            ..listener_spec(&name, port, allowed, tags)
        };
        cloud
            .octavia()
            .create_listener(&listener)
            .await
            .map_err(ClusterError::cloud(format!(
                "creating the listener for port {port}"
            )))?;
        tracing::info!(port, "created a listener");
        return Ok(PortStep::Changed);
    };
    if let Some(wanted) = allowed {
        let mut have = listener.allowed_cidrs.clone().unwrap_or_default();
        have.sort();
        if &have != wanted {
            cloud
                .octavia()
                .update_listener_allowed_cidrs(&listener.id, wanted)
                .await
                .map_err(ClusterError::cloud("updating the listener's allowed CIDRs"))?;
            return Ok(PortStep::Changed);
        }
    }
    let Some(pool) = pools.iter().find(|p| p.name == name) else {
        let pool = PoolSpec {
            listener_id: Some(listener.id.clone()),
            ..pool_spec(lb_spec, &name, tags)
        };
        cloud
            .octavia()
            .create_pool(&pool)
            .await
            .map_err(ClusterError::cloud(format!(
                "creating the pool for port {port}"
            )))?;
        tracing::info!(port, "created a pool");
        return Ok(PortStep::Changed);
    };
    let wanted = wanted_monitor(lb_spec, monitor, &name, &pool.id);
    let Some(monitor_id) = pool.healthmonitor_id.clone() else {
        return match cloud.octavia().create_health_monitor(&wanted).await {
            Ok(_) => {
                tracing::info!(port, kind = wanted.kind, "created a health monitor");
                Ok(PortStep::Changed)
            }
            // As CAPO: a provider without health monitors serves the port without one; the
            // gate then reads the members' provisioning status alone (they report
            // NO_MONITOR). Asked again on the next pass, as CAPO does: a provider may gain them.
            Err(CloudError::NotImplemented(ctx)) => {
                tracing::warn!(port, message = %ctx.message, "the provider has no health monitors: the pool goes without one");
                Ok(PortStep::WithoutMonitor(
                    pool_status(port, listener, pool, None),
                    ctx.message,
                ))
            }
            Err(error) => Err(ClusterError::cloud(format!(
                "creating the health monitor for port {port}"
            ))(error)),
        };
    };
    // `monitor` may change (the only LB setting that may, with allowedCIDRs), and so may the
    // monitor's kind (the controller's flag, the cluster's annotation).
    let have = cloud
        .octavia()
        .get_health_monitor(&monitor_id)
        .await
        .map_err(ClusterError::cloud("reading the health monitor"))?;
    match plan::monitor_change(&have, &wanted) {
        plan::MonitorChange::None => {}
        plan::MonitorChange::Update => {
            cloud
                .octavia()
                .update_health_monitor(&monitor_id, &wanted)
                .await
                .map_err(ClusterError::cloud("updating the health monitor"))?;
            tracing::info!(port, "updated the health monitor in place");
            return Ok(PortStep::Changed);
        }
        plan::MonitorChange::Replace => {
            // Octavia cannot change a monitor's type in place. Until the new one exists the
            // members read NO_MONITOR, and the serving gate falls back to provisioning status
            // for them: nothing is held, nothing stops serving.
            cloud
                .octavia()
                .delete_health_monitor(&monitor_id)
                .await
                .map_err(ClusterError::cloud(
                    "deleting the health monitor to change its type",
                ))?;
            tracing::info!(
                port,
                from = have.kind,
                to = wanted.kind,
                "replacing the health monitor"
            );
            return Ok(PortStep::Changed);
        }
    }
    Ok(PortStep::Done(pool_status(
        port,
        listener,
        pool,
        Some(monitor_id),
    )))
}

/// A port's listener, without its load balancer or pool.
fn listener_spec(
    name: &str,
    port: u16,
    allowed: &Option<Vec<String>>,
    tags: Vec<String>,
) -> ListenerSpec {
    ListenerSpec {
        name: name.to_owned(),
        protocol: "TCP".into(),
        protocol_port: port,
        allowed_cidrs: allowed.clone(),
        tags,
        ..ListenerSpec::default()
    }
}

/// A port's pool, without its listener or monitor.
fn pool_spec(lb_spec: &ManagedLoadBalancer, name: &str, tags: Vec<String>) -> PoolSpec {
    let algorithm = if lb_spec.provider.as_deref() == Some("ovn") {
        "SOURCE_IP_PORT"
    } else {
        "ROUND_ROBIN"
    };
    PoolSpec {
        name: name.to_owned(),
        protocol: "TCP".into(),
        lb_algorithm: algorithm.into(),
        tags,
        ..PoolSpec::default()
    }
}

fn pool_status(
    port: u16,
    listener: &Listener,
    pool: &Pool,
    monitor_id: Option<String>,
) -> LoadBalancerPoolStatus {
    LoadBalancerPoolStatus {
        port: i32::from(port),
        listener_id: listener.id.clone(),
        pool_id: pool.id.clone(),
        monitor_id,
    }
}

/// The VIP's network and subnets: `managedLoadBalancer.network`/`subnets`, else the cluster's.
async fn vip_network(
    lb_spec: &ManagedLoadBalancer,
    cloud: &CloudClient,
    status: &OpenStackClusterStatus,
) -> Result<Option<NetworkStatusWithSubnets>, ClusterError> {
    let Some(given) = &lb_spec.network else {
        return Ok(status.network.clone());
    };
    if let Some(known) = status
        .api_server_managed_load_balancer
        .as_ref()
        .and_then(|lb| lb.load_balancer_network.clone())
        .filter(|n| given.id.as_ref().is_none_or(|id| id == &n.id))
    {
        return Ok(Some(known));
    }
    let network = match given {
        IdOrFilter { id: Some(id), .. } => cloud
            .neutron()
            .get_network(id)
            .await
            .map_err(ClusterError::missing_or_cloud("the load balancer network"))?,
        IdOrFilter { filter, .. } => {
            let found = cloud
                .neutron()
                .list_networks(&neutron_filter(filter.as_ref()))
                .await
                .map_err(ClusterError::cloud("finding the load balancer network"))?;
            exactly_one("load balancer network", found, |n| &n.id)?
        }
    };
    let mut subnets = Vec::new();
    for given in &lb_spec.subnets {
        let subnet = match given {
            IdOrFilter { id: Some(id), .. } => cloud
                .neutron()
                .get_subnet(id)
                .await
                .map_err(ClusterError::missing_or_cloud("a load balancer subnet"))?,
            IdOrFilter { filter, .. } => {
                let filter = subnet_filter(filter.as_ref()).with("network_id", network.id.clone());
                let found = cloud
                    .neutron()
                    .list_subnets(&filter)
                    .await
                    .map_err(ClusterError::cloud("finding a load balancer subnet"))?;
                exactly_one("load balancer subnet", found, |s| &s.id)?
            }
        };
        subnets.push(Subnet {
            name: subnet.name,
            id: subnet.id,
            cidr: subnet.cidr,
            tags: subnet.tags,
        });
    }
    Ok(Some(NetworkStatusWithSubnets {
        name: network.name,
        id: network.id,
        tags: network.tags,
        subnets,
    }))
}

/// The LB by its recorded ID, else by CAPO's name and our owner mark.
pub async fn find(
    names: &Names,
    cloud: &CloudClient,
    status: &OpenStackClusterStatus,
) -> Result<Option<LoadBalancer>, ClusterError> {
    if let Some(known) = &status.api_server_managed_load_balancer {
        match cloud.octavia().get_load_balancer(&known.id).await {
            Ok(lb) if lb.provisioning_status != ProvisioningStatus::Deleted => return Ok(Some(lb)),
            Ok(_) | Err(CloudError::NotFound(_)) => {}
            Err(e) => return Err(ClusterError::cloud("reading the load balancer")(e)),
        }
    }
    let filter = LoadBalancerFilter {
        name: Some(names.load_balancer.clone()),
        tags: vec![names.owner.tag().to_owned()],
    };
    let found: Vec<LoadBalancer> = cloud
        .octavia()
        .list_load_balancers(&filter)
        .await
        .map_err(ClusterError::cloud("finding the load balancer"))?
        .into_iter()
        .filter(|lb| lb.provisioning_status != ProvisioningStatus::Deleted)
        .filter(|lb| names.owner.marks(&lb.tags))
        .collect();
    match found.len() {
        0 => Ok(None),
        _ => exactly_one(
            &format!("load balancer named {}", names.load_balancer),
            found,
            |lb| &lb.id,
        )
        .map(Some)
        .map_err(Into::into),
    }
}

/// What a new load balancer is made with, in the same request.
struct Children {
    ports: Vec<u16>,
    allowed: Option<Vec<String>>,
    monitor: MonitorKind,
}

/// Providers whose fully populated create makes health monitors too. ovn-octavia-provider's
/// makes the listeners, pools and members of such a request but passes over their monitors
/// (`driver.py` `loadbalancer_create`, at `4d92b2c`), and other providers may refuse one:
/// there, and where the provider is Octavia's default (whatever the cloud made it), the
/// monitor is made on its own afterwards, as before.
const MONITORS_IN_ONE_CREATE: &[&str] = &["amphora", "amphorav2", "octavia"];

/// The listener, pool and (where the provider makes it) monitor of each port, for the
/// load balancer's own create: one request and one wait for all of them.
fn graph(
    lb_spec: &ManagedLoadBalancer,
    names: &Names,
    tags: &[String],
    children: &Children,
) -> Vec<ListenerSpec> {
    let with_monitor = lb_spec
        .provider
        .as_deref()
        .is_some_and(|p| MONITORS_IN_ONE_CREATE.contains(&p));
    children
        .ports
        .iter()
        .map(|&port| {
            let name = names.lb_child(port);
            let monitor =
                with_monitor.then(|| wanted_monitor(lb_spec, children.monitor, &name, ""));
            ListenerSpec {
                default_pool: Some(PoolSpec {
                    healthmonitor: monitor,
                    ..pool_spec(lb_spec, &name, tags.to_vec())
                }),
                ..listener_spec(&name, port, &children.allowed, tags.to_vec())
            }
        })
        .collect()
}

async fn create(
    spec: &OpenStackClusterSpec,
    lb_spec: &ManagedLoadBalancer,
    names: &Names,
    cloud: &CloudClient,
    vip_network: &Option<NetworkStatusWithSubnets>,
    children: &Children,
) -> Result<LoadBalancer, ClusterError> {
    let Some(network) = vip_network else {
        return Err(ClusterError::InvalidSpec(
            "the load balancer needs a network: set managedSubnets, network, or managedLoadBalancer.network".into(),
        ));
    };
    if let Some(provider) = &lb_spec.provider {
        offered_provider(cloud, provider).await?;
    }
    let flavor_id = match &lb_spec.flavor {
        Some(name) => Some(flavor(cloud, name).await?),
        None => None,
    };
    // On the cluster network, the primary subnet (CAPO #3210); on its own network, the
    // first subnet the spec names there.
    let vip_subnet_id = if lb_spec.network.is_none() {
        primary_subnet(cloud, spec.primary_subnet.as_ref(), network).await?
    } else {
        network.subnets.first().map(|s| s.id.clone())
    };
    let request = LoadBalancerSpec {
        name: names.load_balancer.clone(),
        description: names.description(),
        vip_network_id: Some(network.id.clone()),
        vip_subnet_id,
        vip_address: spec.api_server.as_ref().and_then(|a| a.fixed_ip.clone()),
        provider: lb_spec.provider.clone(),
        flavor_id,
        availability_zone: lb_spec.availability_zone.clone(),
        tags: plan::owned_tags(spec, names),
        listeners: Vec::new(),
    };
    let whole = LoadBalancerSpec {
        listeners: graph(lb_spec, names, &request.tags, children),
        ..request.clone()
    };
    let lb = match cloud.octavia().create_load_balancer(&whole).await {
        Ok(lb) => lb,
        // A provider that cannot make some of it refuses the whole request, and nothing is
        // made (Octavia rolls its records back): the load balancer alone, and the rest pass
        // by pass, as for one adopted half-built.
        Err(CloudError::NotImplemented(ctx)) => {
            tracing::warn!(message = %ctx.message, "the provider cannot make the load balancer in one request: making it part by part");
            cloud
                .octavia()
                .create_load_balancer(&request)
                .await
                .map_err(ClusterError::cloud("creating the load balancer"))?
        }
        Err(error) => return Err(ClusterError::cloud("creating the load balancer")(error)),
    };
    tracing::info!(lb = %lb.id, listeners = whole.listeners.len(), "created the API load balancer");
    Ok(lb)
}

/// An unknown provider or flavor is refused before anything is made, where CAPO warns and
/// makes the load balancer with Octavia's defaults. The load balancer cannot be changed once
/// made, and a default stands in silently for what was asked (a SINGLE amphora for an
/// ACTIVE_STANDBY flavor: the API's one point of failure); refused, the mistake shows at
/// once, when recreating the cluster costs nothing. An adopted load balancer is not checked.
async fn offered_provider(cloud: &CloudClient, provider: &str) -> Result<(), ClusterError> {
    let providers = cloud
        .octavia()
        .list_providers()
        .await
        .map_err(ClusterError::cloud("listing the Octavia providers"))?;
    if providers.iter().any(|p| p.name == provider) {
        return Ok(());
    }
    let offered: Vec<&str> = providers.iter().map(|p| p.name.as_str()).collect();
    Err(ClusterError::InvalidSpec(format!(
        "Octavia has no provider {provider:?} (it offers: {}); nothing was made, as a load \
         balancer cannot change provider later",
        offered.join(", ")
    )))
}

async fn flavor(cloud: &CloudClient, name: &str) -> Result<String, ClusterError> {
    let flavors = cloud
        .octavia()
        .list_flavors(None)
        .await
        .map_err(ClusterError::cloud("finding the load balancer flavor"))?;
    let (named, others): (Vec<_>, Vec<_>) = flavors
        .into_iter()
        .filter(|f| f.enabled)
        .partition(|f| f.name == name);
    if named.is_empty() {
        let offered: Vec<&str> = others.iter().map(|f| f.name.as_str()).collect();
        return Err(ClusterError::InvalidSpec(format!(
            "Octavia has no enabled flavor {name:?} (it offers: {}); nothing was made, as a \
             load balancer cannot change flavor later",
            if offered.is_empty() {
                "none".to_owned()
            } else {
                offered.join(", ")
            }
        )));
    }
    exactly_one(
        &format!("enabled Octavia flavor named {name:?}"),
        named,
        |f| &f.id,
    )
    .map(|f| f.id)
    .map_err(Into::into)
}

/// The endpoint's floating IP: the one recorded or asked for, else a new one; attached to
/// `port` (the VIP's port) when given.
pub async fn floating_ip(
    spec: &OpenStackClusterSpec,
    names: &Names,
    cloud: &CloudClient,
    external_network: &str,
    known: Option<&str>,
    port: Option<&str>,
) -> Result<FloatingIp, ClusterError> {
    let wanted = known.or_else(|| {
        spec.api_server
            .as_ref()
            .and_then(|a| a.floating_ip.as_deref())
    });
    let existing = match wanted {
        Some(address) => match find_floating_ip(cloud, address).await? {
            None => on_port(cloud, port).await?,
            found => found,
        },
        // Ours, found by the description both providers give it: on the port (a status
        // write lost), or pointing at nothing (a restart between CAPO's create and its
        // attach, or the floating IP of a cluster without a load balancer).
        None => made_for_cluster(cloud, names, external_network)
            .await?
            .into_iter()
            .filter(|ip| ip.port_id.is_none() || ip.port_id.as_deref() == port)
            .min_by_key(|ip| ip.port_id.is_none()),
    };
    let Some(ip) = existing else {
        return allocate(spec, names, cloud, external_network, wanted, port).await;
    };
    let Some(port) = port.filter(|port| ip.port_id.as_deref() != Some(*port)) else {
        return Ok(ip);
    };
    cloud
        .neutron()
        .associate_floating_ip(&ip.id, Some(port))
        .await
        .map_err(ClusterError::cloud("attaching the API floating IP"))
}

/// A new floating IP, made on `port` when given: one request, and a refused attach allocates
/// nothing. A port that already has one (made by hand, without our description) refuses with
/// a conflict, and that one is adopted.
async fn allocate(
    spec: &OpenStackClusterSpec,
    names: &Names,
    cloud: &CloudClient,
    external_network: &str,
    wanted: Option<&str>,
    port: Option<&str>,
) -> Result<FloatingIp, ClusterError> {
    let created = cloud
        .neutron()
        .create_tagged_floating_ip(
            external_network,
            wanted,
            port,
            &names.description(),
            &plan::tags(spec),
        )
        .await;
    match created {
        Ok(ip) => {
            tracing::info!(address = %ip.floating_ip_address, "allocated the API floating IP");
            Ok(ip)
        }
        Err(CloudError::Conflict(ctx)) => match on_port(cloud, port).await? {
            Some(ip) => Ok(ip),
            None => Err(ClusterError::cloud("allocating the API floating IP")(
                CloudError::Conflict(ctx),
            )),
        },
        Err(error) => Err(ClusterError::cloud("allocating the API floating IP")(error)),
    }
}

/// The floating IP already on `port`, whoever made it.
async fn on_port(
    cloud: &CloudClient,
    port: Option<&str>,
) -> Result<Option<FloatingIp>, ClusterError> {
    let Some(port) = port else {
        return Ok(None);
    };
    let filter = Filter::default().with("port_id", port);
    Ok(cloud
        .neutron()
        .list_floating_ips(&filter)
        .await
        .map_err(ClusterError::cloud("finding the API floating IP"))?
        .into_iter()
        .next())
}

/// The floating IPs on `external_network` that carry this cluster's description: made by
/// capo-rs or CAPO for this cluster.
async fn made_for_cluster(
    cloud: &CloudClient,
    names: &Names,
    external_network: &str,
) -> Result<Vec<FloatingIp>, ClusterError> {
    let description = names.description();
    let filter = Filter {
        description: Some(description.clone()),
        ..Filter::default()
    }
    .with("floating_network_id", external_network.to_owned());
    let found = cloud
        .neutron()
        .list_floating_ips(&filter)
        .await
        .map_err(ClusterError::cloud(
            "finding floating IPs made for this cluster",
        ))?;
    Ok(found
        .into_iter()
        .filter(|ip| ip.description == description)
        .collect())
}

/// The floating IPs made for this cluster that point at nothing, and are recorded nowhere: a
/// restart came between their create and their attach or status write.
pub async fn forgotten_floating_ips(
    cloud: &CloudClient,
    names: &Names,
    external_network: &str,
) -> Result<Vec<FloatingIp>, ClusterError> {
    let mut found = made_for_cluster(cloud, names, external_network).await?;
    found.retain(|ip| ip.port_id.is_none());
    Ok(found)
}

pub async fn find_floating_ip(
    cloud: &CloudClient,
    address: &str,
) -> Result<Option<FloatingIp>, ClusterError> {
    cloud
        .neutron()
        .find_floating_ip(address)
        .await
        .map_err(ClusterError::cloud("finding a floating IP"))
}
