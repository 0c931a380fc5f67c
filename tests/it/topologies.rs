//! CAPO's network topologies end to end, on the real OpenStack tier and on the simulator
//! (see [`crate::real_provider`]): the API without a load balancer, whose floating IP follows
//! the control plane through a rollout.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use capo_api::capo_conditions::capo_types;
use capo_provider::cloud::CloudClient;
use capo_provider::cloud::neutron::{FloatingIp, NetworkSpec, SubnetSpec};
use kube::api::ListParams;
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::real_cloud::{PASSWORD_CLOUD, REAL, census, fault, real_cloud};
use crate::real_provider::{
    E2e, TENANT_NETWORK, WAIT, actor, assert_nothing_left, both, cluster_spec, create_cluster_with,
    delete_cluster, on_real, on_sim, plane, spent, unique_cluster_name, wait_for, wait_provisioned,
};

/// CAPO's `cluster-template-without-lb.yaml` as a user fills it in: `apiServer: {}` (no load
/// balancer, a floating IP), no bastion.
fn without_lb_spec(e2e: &E2e) -> Value {
    let mut spec = cluster_spec(e2e.cloud_name, &e2e.external_network);
    let spec_map = spec.as_object_mut().expect("an object");
    spec_map.insert("apiServer".into(), json!({}));
    spec_map.remove("bastion");
    spec
}

pub(crate) async fn floating_ip(tenant: &CloudClient, address: &str) -> Option<FloatingIp> {
    tenant.neutron().find_floating_ip(address).await.ok()?
}

/// What the endpoint watcher saw.
#[derive(Debug, Default)]
struct Reach {
    samples: u64,
    /// Moments the floating IP pointed at nothing, or at a server not ACTIVE.
    unreachable: Vec<String>,
    /// The servers it pointed at, in order, each once.
    holders: Vec<String>,
}

/// Samples the API floating IP until `stop`: from the first time it is attached, it must
/// always point at a port of an ACTIVE server.
fn watch_endpoint(
    tenant: CloudClient,
    address: String,
    stop: CancellationToken,
) -> (Arc<Mutex<Reach>>, JoinHandle<()>) {
    let reach = Arc::new(Mutex::new(Reach::default()));
    let record = reach.clone();
    let task = tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        let mut attached_once = false;
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            let Some(ip) = floating_ip(&tenant, &address).await else {
                if attached_once {
                    let mut seen = record.lock().unwrap_or_else(|e| e.into_inner());
                    seen.unreachable.push("the address is gone".into());
                }
                continue;
            };
            let server = match ip.port_id.as_deref() {
                Some(port) => match tenant.neutron().get_port(port).await {
                    Ok(port) => tenant.nova().get_server(&port.device_id).await.ok(),
                    Err(_) => None,
                },
                None => None,
            };
            let mut seen = record.lock().unwrap_or_else(|e| e.into_inner());
            seen.samples += 1;
            match server {
                Some(server) if server.status == "ACTIVE" => {
                    attached_once = true;
                    if seen.holders.last() != Some(&server.id) {
                        seen.holders.push(server.id);
                    }
                }
                other if attached_once => {
                    let state = other.map_or("no server".to_owned(), |s| s.status);
                    seen.unreachable.push(format!("{:?}: {state}", ip.port_id));
                }
                _ => {}
            }
        }
    });
    (reach, task)
}

/// CAPO's without-lb template: the API floating IP is published, attached to the control
/// plane's machine, moved to the new machine in a rollout before the old one goes (the
/// endpoint never points at nothing), and released with the cluster.
async fn api_without_load_balancer(e2e: &mut E2e) {
    let name = unique_cluster_name("nolb");
    let before = census(&e2e.tenant).await;
    let started = Instant::now();
    create_cluster_with(e2e, &name, &name, without_lb_spec(e2e)).await;
    let cluster = wait_provisioned(e2e, &name).await;
    let to_provisioned = started.elapsed();
    let address = cluster
        .spec
        .control_plane_endpoint
        .as_ref()
        .and_then(|e| e.host.clone())
        .expect("an endpoint");
    let ip = floating_ip(&e2e.tenant, &address)
        .await
        .expect("the endpoint is a floating IP");
    assert_eq!(ip.port_id, None, "{}: no machine yet", e2e.label);

    let stop = CancellationToken::new();
    let (reach, watcher) = watch_endpoint(e2e.tenant.clone(), address.clone(), stop.clone());
    let actor = actor(e2e);
    let plane = plane(&name, 1);
    actor
        .scale_control_plane(&plane)
        .await
        .expect("a control-plane machine");
    let first = held_by(e2e, &address).await;
    let cluster_requests = e2e.requests();
    let rollout = actor.rollout(&plane, |_| {}).await.expect("the rollout");
    let after = held_by(e2e, &address).await;
    assert_eq!(rollout.replaced.len(), 1, "{}", e2e.label);
    assert_ne!(first, after, "{}: the address moved", e2e.label);
    assert_eq!(
        Some(&after),
        rollout.created.first(),
        "{}: onto the new machine",
        e2e.label
    );
    stop.cancel();
    watcher.await.expect("the watcher");
    let reach = std::mem::take(&mut *reach.lock().unwrap_or_else(|e| e.into_inner()));
    assert!(reach.samples > 5, "{}: sampled throughout", e2e.label);
    assert_eq!(
        reach.unreachable,
        Vec::<String>::new(),
        "{}: the endpoint always pointed at an ACTIVE server",
        e2e.label
    );
    assert_eq!(reach.holders.len(), 2, "{}: {:?}", e2e.label, reach.holders);
    if let Some(sim) = &e2e.sim {
        // Every transition, not a sample: no port was ever deleted under the address.
        assert_eq!(sim.orphaned_floating_ips(), Vec::<String>::new());
    }
    let rollout_requests = e2e.requests();
    delete_cluster(e2e, Some(&actor), &name).await;
    actor.stop().await;
    assert_nothing_left(e2e, &before).await;
    eprintln!(
        "FIGURES e2e {} without a load balancer: provisioned in {:.1} s; rollout of 1 in {:.1} s, requests {}; endpoint samples {}",
        e2e.label,
        to_provisioned.as_secs_f64(),
        rollout.elapsed.as_secs_f64(),
        spent(&cluster_requests, &rollout_requests),
        reach.samples,
    );
}

/// The control-plane machine whose port the floating IP points at, as its ingress condition
/// says and the cloud shows.
async fn held_by(e2e: &E2e, address: &str) -> String {
    let ip = floating_ip(&e2e.tenant, address)
        .await
        .expect("the address");
    let port = ip.port_id.expect("attached");
    let machines = e2e
        .machines()
        .list(&ListParams::default())
        .await
        .expect("machines");
    let holder = machines
        .items
        .iter()
        .find(|m| {
            m.status
                .as_ref()
                .and_then(|s| s.resources.as_ref())
                .is_some_and(|r| r.ports.iter().any(|p| p.id == port))
        })
        .expect("a machine holds the address");
    let ingress = holder
        .status
        .as_ref()
        .and_then(|s| {
            s.conditions
                .iter()
                .find(|c| c.type_ == capo_types::API_SERVER_INGRESS_READY)
        })
        .map(|c| c.status.clone());
    assert_eq!(ingress.as_deref(), Some("True"), "{}", e2e.label);
    kube::ResourceExt::name_any(holder)
}

both!(
    api_without_load_balancer,
    PASSWORD_CLOUD,
    false,
    real_without_a_load_balancer_the_api_address_follows_the_control_plane,
    sim_without_a_load_balancer_the_api_address_follows_the_control_plane
);

/// `apiServer.enableFloatingIP: false` with a fixed IP (CAPO's `disableAPIServerFloatingIP`):
/// the endpoint is the fixed IP, no floating IP is allocated, and a control-plane machine is
/// released without one.
async fn api_on_a_fixed_ip(e2e: &mut E2e) {
    let name = unique_cluster_name("fixed");
    let before = census(&e2e.tenant).await;
    let mut spec = without_lb_spec(e2e);
    spec["apiServer"] = json!({"enableFloatingIP": false, "fixedIP": "10.6.0.10"});
    create_cluster_with(e2e, &name, &name, spec).await;
    let cluster = wait_provisioned(e2e, &name).await;
    let endpoint = cluster.spec.control_plane_endpoint.expect("an endpoint");
    assert_eq!(endpoint.host.as_deref(), Some("10.6.0.10"), "{}", e2e.label);
    let actor = actor(e2e);
    actor
        .scale_control_plane(&plane(&name, 1))
        .await
        .expect("a control-plane machine, released");
    let during = census(&e2e.tenant).await;
    assert_eq!(
        during.get("floatingips").map(BTreeMap::len),
        before.get("floatingips").map(BTreeMap::len),
        "{}: no floating IP",
        e2e.label
    );
    delete_cluster(e2e, Some(&actor), &name).await;
    actor.stop().await;
    assert_nothing_left(e2e, &before).await;
}

both!(
    api_on_a_fixed_ip,
    PASSWORD_CLOUD,
    false,
    real_without_a_floating_ip_the_api_is_the_fixed_ip,
    sim_without_a_floating_ip_the_api_is_the_fixed_ip
);

/// A load balancer on the tenant's own network, apart from the machines' cluster network:
/// its VIP is there, and each member names the cluster's primary subnet (or Octavia could not
/// reach it) and carries the cluster's tags, as CAPO's do.
async fn load_balancer_on_another_network(e2e: &mut E2e) {
    let before = census(&e2e.tenant).await;
    let spec = |floating: bool| {
        let mut spec = cluster_spec(e2e.cloud_name, &e2e.external_network);
        spec["apiServer"] = json!({"enableFloatingIP": floating, "managedLoadBalancer": {
            "enabled": true,
            "network": {"filter": {"name": TENANT_NETWORK}},
        }});
        spec.as_object_mut().expect("an object").remove("bastion");
        spec
    };
    // The tenant network has no router: Neutron refuses a floating IP there. The address
    // allocated for it is given back each time, never piled up.
    let name = unique_cluster_name("unrouted");
    create_cluster_with(e2e, &name, &name, spec(true)).await;
    wait_for(
        &e2e.clusters(),
        &name,
        "saying the VIP is unreachable",
        WAIT,
        |c| {
            c.status.as_ref().is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.message.contains("is not reachable from subnet"))
            })
        },
    )
    .await;
    let floating_ips =
        |census: &crate::real_cloud::Census| census.get("floatingips").map(BTreeMap::len);
    assert_eq!(
        floating_ips(&census(&e2e.tenant).await),
        floating_ips(&before),
        "{}: the refused floating IP was given back",
        e2e.label
    );
    delete_cluster(e2e, None, &name).await;
    assert_nothing_left(e2e, &before).await;

    let name = unique_cluster_name("lbnet");
    create_cluster_with(e2e, &name, &name, spec(false)).await;
    let cluster = wait_provisioned(e2e, &name).await;
    let status = cluster.status.expect("status");
    let cluster_subnet = status
        .network
        .as_ref()
        .and_then(|n| n.subnets.first())
        .map(|s| s.id.clone())
        .expect("the cluster subnet");
    let lb = status
        .api_server_managed_load_balancer
        .expect("the load balancer");
    let lb_network = lb.load_balancer_network.as_ref().expect("its network");
    assert_eq!(lb_network.name, TENANT_NETWORK, "{}", e2e.label);
    let cluster_cidr = status
        .network
        .as_ref()
        .and_then(|n| n.subnets.first())
        .map(|s| s.cidr.clone())
        .expect("the cluster subnet's CIDR");
    let actor = actor(e2e);
    // Two ports: the cluster network's, and one on the tenant network, whose name Nova lists
    // first (`capo-rs-...` before `k8s-clusterapi-...`).
    let mut plane = plane(&name, 1);
    plane.template.ports = serde_json::from_value(json!([
        {}, {"network": {"filter": {"name": TENANT_NETWORK}}, "nameSuffix": "tenant"}
    ]))
    .expect("ports");
    let machines = actor
        .scale_control_plane(&plane)
        .await
        .expect("a control-plane machine, released");
    let machine = e2e.machines().get(&machines[0]).await.expect("the machine");
    let addresses: Vec<String> = machine
        .status
        .as_ref()
        .map(|s| s.addresses.iter().map(|a| a.address.clone()).collect())
        .unwrap_or_default();
    assert!(
        addresses.len() >= 2,
        "{}: an address on each network: {addresses:?}",
        e2e.label
    );
    let pool = lb.pools.first().expect("a pool").pool_id.clone();
    let members = e2e
        .tenant
        .octavia()
        .list_members(&pool)
        .await
        .expect("members");
    assert_eq!(members.len(), 1, "{}", e2e.label);
    let member = &members[0];
    assert_eq!(
        member.subnet_id.as_deref(),
        Some(cluster_subnet.as_str()),
        "{}: the member names the cluster subnet",
        e2e.label
    );
    assert_eq!(
        member.tags,
        ["capo-rs-e2e"],
        "{}: CAPO's member tags",
        e2e.label
    );
    let prefix = cluster_cidr
        .rsplit_once('.')
        .map(|(head, _)| format!("{head}."))
        .expect("an IPv4 /24");
    assert!(
        member.address.starts_with(&prefix) && addresses.contains(&member.address),
        "{}: the member is the machine's address on the cluster network {cluster_cidr}, not {} of {addresses:?}",
        e2e.label,
        member.address
    );
    delete_cluster(e2e, Some(&actor), &name).await;
    actor.stop().await;
    assert_nothing_left(e2e, &before).await;
}

both!(
    load_balancer_on_another_network,
    PASSWORD_CLOUD,
    false,
    real_a_load_balancer_on_another_network_reaches_its_members_by_subnet,
    sim_a_load_balancer_on_another_network_reaches_its_members_by_subnet
);

/// A dual-stack cluster on the user's network, with an IPv4 and an IPv6 subnet: each machine's
/// default port has an address in both (CAPO pins a fixed IP in every cluster subnet), and the
/// load balancer's VIP and members are on the primary (first) subnet, IPv4.
async fn dual_stack(e2e: &mut E2e) {
    let name = unique_cluster_name("dual");
    let before = census(&e2e.tenant).await;
    let neutron = e2e.tenant.neutron();
    let network = neutron
        .create_network(&NetworkSpec {
            name: format!("{name}-net"),
            admin_state_up: true,
            ..NetworkSpec::default()
        })
        .await
        .expect("a network");
    let mut subnet_ids = Vec::new();
    for (version, cidr) in [(4, "10.78.0.0/24"), (6, "fd00:78::/64")] {
        let subnet = neutron
            .create_subnet(&SubnetSpec {
                name: format!("{name}-v{version}"),
                network_id: network.id.clone(),
                cidr: cidr.into(),
                ip_version: version,
                ..SubnetSpec::default()
            })
            .await
            .expect("a subnet");
        subnet_ids.push(subnet.id);
    }
    let mut spec = cluster_spec(e2e.cloud_name, &e2e.external_network);
    let spec_map = spec.as_object_mut().expect("an object");
    for field in ["managedSubnets", "bastion", "externalNetwork"] {
        spec_map.remove(field);
    }
    spec_map.insert("enableExternalNetwork".into(), json!(false));
    spec_map.insert("network".into(), json!({"id": network.id}));
    spec_map.insert(
        "subnets".into(),
        json!([{"id": subnet_ids[0]}, {"id": subnet_ids[1]}]),
    );
    spec_map.insert(
        "apiServer".into(),
        json!({"enableFloatingIP": false, "managedLoadBalancer": {"enabled": true}}),
    );
    create_cluster_with(e2e, &name, &name, spec).await;
    let cluster = wait_provisioned(e2e, &name).await;
    let vip = cluster
        .status
        .and_then(|s| s.api_server_managed_load_balancer)
        .map(|lb| lb.internal_ip)
        .unwrap_or_default();
    assert!(
        vip.starts_with("10.78.0."),
        "{}: the VIP on the primary subnet: {vip}",
        e2e.label
    );
    let actor = actor(e2e);
    actor
        .scale_control_plane(&plane(&name, 1))
        .await
        .expect("a control-plane machine, released");
    let machines = e2e
        .machines()
        .list(&ListParams::default())
        .await
        .expect("machines");
    let machine = machines.items.first().expect("a machine");
    let port_id = machine
        .status
        .as_ref()
        .and_then(|s| s.resources.as_ref())
        .and_then(|r| r.ports.first())
        .map(|p| p.id.clone())
        .expect("a port");
    let port = neutron.get_port(&port_id).await.expect("the port");
    let subnets: Vec<&str> = port
        .fixed_ips
        .iter()
        .filter_map(|f| f.subnet_id.as_deref())
        .collect();
    assert_eq!(
        subnets,
        [subnet_ids[0].as_str(), subnet_ids[1].as_str()],
        "{}: one address in each subnet",
        e2e.label
    );
    let v6 = port
        .fixed_ips
        .iter()
        .find(|f| f.subnet_id.as_deref() == Some(subnet_ids[1].as_str()))
        .and_then(|f| f.ip_address.clone())
        .expect("an IPv6 address");
    assert!(v6.starts_with("fd00:78::"), "{}: {v6}", e2e.label);
    let address =
        capo_provider::controllers::gate::member_address(machine, &[]).expect("an address");
    assert!(
        address.starts_with("10.78.0."),
        "{}: the member is IPv4: {address}",
        e2e.label
    );
    delete_cluster(e2e, Some(&actor), &name).await;
    actor.stop().await;
    e2e.tenant
        .neutron()
        .delete_network(&network.id)
        .await
        .expect("the network deleted");
    assert_nothing_left(e2e, &before).await;
}

both!(
    dual_stack,
    PASSWORD_CLOUD,
    false,
    real_a_dual_stack_machine_has_an_address_in_each_subnet,
    sim_a_dual_stack_machine_has_an_address_in_each_subnet
);

/// The control-plane machine that carries the API address fails (its server deleted behind
/// capo-rs's back) and Cluster API deletes it: its pre-terminate hook still goes, after the
/// address has moved to the machine that runs, never left on the dead machine's port.
async fn a_failed_holder_hands_over(e2e: &mut E2e) {
    let name = unique_cluster_name("failed");
    let before = census(&e2e.tenant).await;
    create_cluster_with(e2e, &name, &name, without_lb_spec(e2e)).await;
    let cluster = wait_provisioned(e2e, &name).await;
    let address = cluster
        .spec
        .control_plane_endpoint
        .and_then(|e| e.host)
        .expect("an endpoint");
    let actor = actor(e2e);
    actor
        .scale_control_plane(&plane(&name, 2))
        .await
        .expect("two control-plane machines");
    let holder = held_by(e2e, &address).await;
    let dead = e2e.machines().get(&holder).await.expect("the holder");
    let server = dead
        .status
        .as_ref()
        .and_then(|s| s.instance_id.clone())
        .expect("its server");
    e2e.tenant
        .nova()
        .delete_server(&server)
        .await
        .expect("the server deleted out of band");
    actor
        .delete_machine(&holder)
        .await
        .expect("Cluster API deletes the failed machine");
    actor
        .wait_gone(&holder)
        .await
        .expect("the failed machine goes");
    let survivor = held_by(e2e, &address).await;
    assert_ne!(survivor, holder, "{}", e2e.label);
    if let Some(sim) = &e2e.sim {
        assert_eq!(sim.orphaned_floating_ips(), Vec::<String>::new());
    }
    delete_cluster(e2e, Some(&actor), &name).await;
    actor.stop().await;
    assert_nothing_left(e2e, &before).await;
}

both!(
    a_failed_holder_hands_over,
    PASSWORD_CLOUD,
    false,
    real_a_failed_control_plane_machine_hands_the_api_address_over_and_goes,
    sim_a_failed_control_plane_machine_hands_the_api_address_over_and_goes
);

/// Floating IPs a restart left behind: made for this cluster (its description), never
/// attached, never recorded, as when a manager dies between a create and its attach or
/// status write. The cluster adopts one for its API address instead of making another, and
/// deleting the cluster deletes the rest. (A clean-clone CI run caught such a leak in the
/// restart scenario: one address left after deletion.)
async fn floating_ips_a_restart_left_behind(e2e: &mut E2e) {
    let name = unique_cluster_name("leftips");
    let before = census(&e2e.tenant).await;
    let description = format!(
        "Created by cluster-api-provider-openstack cluster {}-{name}",
        e2e.ns()
    );
    let mut left = Vec::new();
    for _ in 0..2 {
        let ip = e2e
            .tenant
            .neutron()
            .create_floating_ip(&e2e.external_network, None, &description)
            .await
            .expect("a floating IP left behind");
        left.push(ip.floating_ip_address);
    }
    create_cluster_with(e2e, &name, &name, without_lb_spec(e2e)).await;
    let cluster = wait_provisioned(e2e, &name).await;
    let endpoint = cluster
        .spec
        .control_plane_endpoint
        .and_then(|e| e.host)
        .expect("an endpoint");
    assert!(
        left.contains(&endpoint),
        "{}: the API address {endpoint} is one left behind: {left:?}",
        e2e.label
    );
    let created = e2e
        .request_counts()
        .get("floating_ip_create")
        .copied()
        .unwrap_or_default();
    assert_eq!(created, 0, "{}: no new floating IP", e2e.label);
    delete_cluster(e2e, None, &name).await;
    assert_nothing_left(e2e, &before).await;
}

both!(
    floating_ips_a_restart_left_behind,
    PASSWORD_CLOUD,
    false,
    real_floating_ips_a_restart_left_behind_are_adopted_then_deleted_with_the_cluster,
    sim_floating_ips_a_restart_left_behind_are_adopted_then_deleted_with_the_cluster
);

/// A control-plane machine of a cluster with a load balancer fails (its server deleted behind
/// capo-rs's back) and Cluster API deletes it: its member leaves the pool and capo-rs's hook
/// goes, so the Machine is not held behind a server that will never run again. The other
/// machine's member stays.
async fn a_failed_member_machine_leaves(e2e: &mut E2e) {
    let name = unique_cluster_name("lbfail");
    let before = census(&e2e.tenant).await;
    let mut spec = cluster_spec(e2e.cloud_name, &e2e.external_network);
    if let Some(spec) = spec.as_object_mut() {
        spec.remove("bastion");
    }
    create_cluster_with(e2e, &name, &name, spec).await;
    let cluster = wait_provisioned(e2e, &name).await;
    let lb = cluster
        .status
        .and_then(|s| s.api_server_managed_load_balancer)
        .expect("a load balancer");
    let actor = actor(e2e);
    let machines = actor
        .scale_control_plane(&plane(&name, 2))
        .await
        .expect("two control-plane machines");
    let failed = e2e.machines().get(&machines[0]).await.expect("a machine");
    let status = failed.status.as_ref().expect("a status");
    let server = status.instance_id.clone().expect("its server");
    let address = capo_provider::controllers::gate::member_address(&failed, &[])
        .expect("its address")
        .to_owned();
    e2e.tenant
        .nova()
        .delete_server(&server)
        .await
        .expect("the server deleted out of band");
    actor
        .delete_machine(&machines[0])
        .await
        .expect("Cluster API deletes the failed machine");
    actor
        .wait_gone(&machines[0])
        .await
        .expect("the failed machine goes: its hook is not held by its dead server");
    let pool = lb.pools.first().expect("a pool").pool_id.clone();
    let members = e2e
        .tenant
        .octavia()
        .list_members(&pool)
        .await
        .expect("members");
    assert!(
        !members.iter().any(|m| m.address == address),
        "{}: the failed machine's member is gone: {members:?}",
        e2e.label
    );
    assert_eq!(members.len(), 1, "{}: the other member stays", e2e.label);
    delete_cluster(e2e, Some(&actor), &name).await;
    actor.stop().await;
    assert_nothing_left(e2e, &before).await;
}

both!(
    a_failed_member_machine_leaves,
    PASSWORD_CLOUD,
    false,
    real_a_failed_control_plane_machine_leaves_the_api_pool_and_goes,
    sim_a_failed_control_plane_machine_leaves_the_api_pool_and_goes
);
